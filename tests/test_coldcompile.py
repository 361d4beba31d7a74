"""Cold compiles (issue 21 item 2, issue 23's first call): what keeps LLVM's work small.

- Kernels equal but for their names (ResNet's repeated blocks) compile once and share one binary
  (`Device.canonical_source`, `build_kernels`), serially and on the workers alike, byte for byte.
- A CPU object of one function loads under any kernel's name; one of several functions only under its own.
- LLVM's SLP vectorizer is skipped only on bodies tgc wrote in whole vectors (`needs_slp`).
- A long elementwise body is written as vectors by the heuristic (`long_body`, a compile-size cap), through a
  vectorizer that does not recurse per level of the graph.
- A chunked run compiles only the program it runs, not the whole program whose memory plan chose the chunking.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import tgc
from tgc.backends import get_device
from tgc.codegen import kernel
from tgc.engine import chunk

LAYERS = """x: f32[N, N]
y: f32[N, N]
z: f32[N, N]
w: f32[N, N]
return relu(x @ w), relu(y @ w), relu(z @ w)
"""
DIMS = {"N": 32}


def _arrays(prog: tgc.Program, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {d.name: rng.standard_normal([dims[s] for s in d.shape]).astype(np.float32) for d in prog.inputs}


def _layers_want(a: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [np.maximum(a[k].astype(np.float64) @ a["w"], 0) for k in ("x", "y", "z")]


def _matmul_kernels(kernels: list) -> list:
    return [k for k in kernels if k.name.startswith("r_")]


def test_identical_kernels_compile_once_and_share_a_binary_serially_and_on_the_workers(monkeypatch):
    monkeypatch.setenv("DISABLE_COMPILER_CACHE", "1")  # every distinct source is compiled, none found on disk
    monkeypatch.setenv("TGC_JOBS", "1")
    before = kernel.COMPILE_COUNTER["compiles"]
    prog = tgc.loads(LAYERS)
    serial = prog.compile("CPU", DIMS)
    compiled = kernel.COMPILE_COUNTER["compiles"] - before
    cpu = get_device("CPU")
    # the kernels lowered once and renamed are what lowering each one gives
    for item, k in zip(prog.schedule(DIMS, "CPU"), serial):
        ref = kernel.build_kernel(item, cpu, name=k.name)
        assert (ref.src, ref.bufs, ref.uops, ref.global_size, ref.flops, ref.bytes_moved) == \
            (k.src, k.bufs, k.uops, k.global_size, k.flops, k.bytes_moved)
    layers = _matmul_kernels(serial)
    assert len(layers) == 3 and len({k.name for k in layers}) == 3
    assert len({k.src for k in layers}) == 3  # their sources differ (names, lines) ...
    assert len({cpu.canonical_source(k.src) for k in layers}) == 1  # ... but not in what the binary depends on
    assert len({k.binary for k in layers}) == 1 and layers[0].binary
    assert compiled == len({cpu.canonical_source(k.src) for k in serial}) < len(serial)

    kernel._shutdown_pools()  # (workers are kept per process: start this test's own)
    monkeypatch.setattr(kernel, "PARALLEL_MIN_SOURCE", 0)  # these kernels are small: send them all
    monkeypatch.setenv("TGC_JOBS", "2")
    parallel = tgc.loads(LAYERS).compile("CPU", DIMS)
    assert [k.src for k in parallel] == [k.src for k in serial]
    assert [k.binary for k in parallel] == [k.binary for k in serial]

    arrays = _arrays(prog, DIMS)
    got = prog.run(device="CPU", **arrays)
    for out, want in zip(prog.output_names, _layers_want(arrays)):
        np.testing.assert_allclose(got[out], want, rtol=1e-4, atol=1e-4)


def test_the_compile_cache_serves_an_identical_kernel_of_another_program(tmp_path, monkeypatch):
    """The disk cache is keyed by the canonical source: a kernel met again under another name (here the second
    program's first layer is named as the first program's third) is a cache hit, not a compile."""
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DISABLE_COMPILER_CACHE", raising=False)
    monkeypatch.setenv("TGC_JOBS", "1")
    tgc.loads(LAYERS).compile("CPU", DIMS)
    before = kernel.COMPILE_COUNTER["compiles"]
    other = tgc.loads("# another file\n\ny: f32[N, N]\nw: f32[N, N]\nreturn relu(y @ w)\n")
    ks = other.compile("CPU", DIMS)
    assert kernel.COMPILE_COUNTER["compiles"] == before
    assert all(k.cache_key is not None for k in ks)
    arrays = _arrays(other, DIMS, seed=1)
    got = other.run(device="CPU", **arrays)
    want = np.maximum(arrays["y"].astype(np.float64) @ arrays["w"], 0)
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-4, atol=1e-4)


IR = """; kernel {name} (f.tg:{line})
define void @{name}(ptr noalias align 16 %data0, i32 %core_id) #0 {{
entry:
  store float {value}, ptr %data0
  ret void
}}
attributes #0 = {{ nounwind }}
"""


def test_canonical_sources_drop_names_and_comments_but_not_the_body():
    cpu = get_device("CPU")
    a = IR.format(name="E_4", line=3, value="1.0")
    b = IR.format(name="E_4n7", line=90, value="1.0")
    c = IR.format(name="E_4", line=3, value="2.0")
    assert cpu.canonical_source(a) == cpu.canonical_source(b) != cpu.canonical_source(c)
    two = a + IR.format(name="E_5", line=4, value="1.0").split("\n", 1)[1].replace("attributes #0 = { nounwind }\n", "")
    assert cpu.canonical_source(two) == two  # not one function: kept as it is (no sharing)
    assert get_device("PYTHON").canonical_source(a) == a  # other devices load kernels by their own names


def test_a_cpu_object_of_one_function_loads_under_any_name_and_one_of_two_only_under_its_own():
    cpu = get_device("CPU")
    one = cpu.compiler.compile(IR.format(name="E_4", line=1, value="3.0"))
    prog = cpu.program("E_4n2", one)  # the name of an identical kernel compiled second
    out = np.zeros(4, np.float32)
    prog(out)
    assert out[0] == 3.0
    two_src = IR.format(name="E_4", line=1, value="3.0").replace("attributes #0 = { nounwind }\n", "") + \
        IR.format(name="E_5", line=1, value="5.0").split("\n", 1)[1]
    two = cpu.compiler.compile(two_src)
    cpu.program("E_5", two)(out)
    assert out[0] == 5.0
    with pytest.raises(KeyError, match="E_6"):
        cpu.program("E_6", two)


def test_slp_runs_except_on_bodies_written_in_whole_vectors():
    from tgc.backends.cpu import needs_slp

    scalar = IR.format(name="E_4", line=1, value="1.0")
    assert needs_slp(scalar)
    vector = scalar.replace("store float 1.0", "store <4 x float> splat (float 1.0)")
    assert not needs_slp(vector)
    lane = "  %e = extractelement <4 x float> splat (float 1.0), i32 3\n  store float %e, ptr %data0\n"
    assert needs_slp(vector.replace("  ret void", lane + "  ret void"))  # a lane stored on its own
    math = "  %m = fmul contract float 2.0, 3.0\n  store float %m, ptr %data0\n"
    assert needs_slp(vector.replace("  ret void", math + "  ret void"))  # scalar math beside the vectors
    # a tile's lanes stored one by one after its loop ends (a convolution's epilogue into NCHW): no SLP; the same
    # moves inside the loop's body: SLP
    loop = ("  br label %loop0_head\nloop0_head:\n  %r0 = phi i32 [ 0, %entry ], [ %n, %loop0_body ]\n"
            "  %c = icmp slt i32 %r0, 4\n  br i1 %c, label %loop0_body, label %loop0_exit\nloop0_body:\n"
            "{body}  %n = add i32 %r0, 1\n  br label %loop0_head\nloop0_exit:\n{exit}  ret void")
    epilogue = vector.replace("  ret void", loop.format(body="", exit=lane))
    assert not needs_slp(epilogue)
    get_device("CPU").compiler.compile(epilogue)  # valid IR: the rule reads real block labels
    assert needs_slp(vector.replace("  ret void", loop.format(body=lane, exit="")))


def _chain(n: int) -> str:
    return "\n".join(["x: f32[N]", "y0 = x", *(f"y{i} = y{i - 1} * 1.0001 + 1" for i in range(1, n + 1)),
                      f"return y{n}"]) + "\n"


def _chain_want(x: np.ndarray, n: int) -> np.ndarray:
    want = x.astype(np.float64)
    for _ in range(n):
        want = want * 1.0001 + 1
    return want


def _frames() -> int:
    depth, f = 0, sys._getframe()
    while f is not None:
        depth, f = depth + 1, f.f_back
    return depth


def test_a_long_elementwise_body_is_written_as_vectors_without_recursion():
    """600 statements (1200 ALU ops, over `LONG_BODY`) at N=64: one kernel in 16-wide vectors, built under a
    recursion limit ~300 frames above this test's (the vectorizer once recursed per level), equal to numpy; 20
    statements stay scalar for LLVM's own loop vectorizer."""
    from tgc.codegen.heuristic import LONG_BODY

    n = 600
    assert 2 * n > LONG_BODY > 2 * 20
    prog = tgc.loads(_chain(n))
    x = np.linspace(-1, 1, 64).astype(np.float32)
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(_frames() + 300)
    try:
        (k,) = prog.compile("CPU", {"N": 64})
        out = next(iter(prog.run(x=x, device="CPU").values()))
    finally:
        sys.setrecursionlimit(old)
    assert "<16 x float>" in k.src and any(o.op.name == "UPCAST" for o in k.opts)
    np.testing.assert_allclose(out, _chain_want(x, n), rtol=1e-4)
    (short,) = tgc.loads(_chain(20)).compile("CPU", {"N": 64})
    assert "<16 x float>" not in short.src and not short.opts


def test_a_long_body_whose_axis_takes_no_vector_stays_scalar_and_correct():
    prog = tgc.loads(_chain(200))
    x = np.linspace(-1, 1, 7).astype(np.float32)
    (k,) = prog.compile("CPU", {"N": 7})
    assert " x float>" not in k.src
    np.testing.assert_allclose(next(iter(prog.run(x=x, device="CPU").values())), _chain_want(x, 200), rtol=1e-4)


def test_a_chunked_run_compiles_only_the_chunk_it_runs(monkeypatch):
    """The whole program's kernels (whose memory plan chose the chunking) stay `deferred`: never compiled unless
    asked for. The program: x[B, N] -> three realized steps t = exp(flip(t) / 2) / 2 - 1/4 -> row sums (as in
    tests/test_chunk.py: separable along B, its intermediates 2x its inputs)."""
    from tgc.dsl.tensor import Tensor

    monkeypatch.setattr(chunk, "MIN_CHUNK_BYTES", 0)
    monkeypatch.delenv("TGC_CHUNK", raising=False)
    monkeypatch.setenv("DISABLE_COMPILER_CACHE", "1")
    monkeypatch.setenv("TGC_JOBS", "1")
    dims = {"B": 8, "N": 256}
    prog = tgc.loads("x: f32[B, N]\nreturn x * 2.0\n")
    _, bufs = prog._trace(dims)
    t = Tensor(bufs[0])
    for _ in range(3):
        t = ((t.flip(1) * 0.5).exp() * 0.5 - 0.25).contiguous()
    prog._traces[tuple(sorted(dims.items()))] = ([t.sum(1).uop], bufs)
    before = kernel.COMPILE_COUNTER["compiles"]
    ch = prog.chunking("CPU", dims)
    assert ch is not None and ch.count > 1
    whole = prog.compile("CPU", dims, defer=True)
    assert all(k.deferred and k.binary is None for k in whole)
    cpu = get_device("CPU")
    assert kernel.COMPILE_COUNTER["compiles"] - before == len({cpu.canonical_source(k.src) for k in ch.low.kernels})
    assert all(k.binary and not k.deferred for k in ch.low.kernels)
    x = np.random.default_rng(2).standard_normal((8, 256)).astype(np.float32)
    want = x.astype(np.float64)
    for _ in range(3):
        want = np.exp(want[:, ::-1] * 0.5) * 0.5 - 0.25
    np.testing.assert_allclose(next(iter(prog.run(x=x, device="CPU", dims=dims).values())), want.sum(1), rtol=1e-4)
    assert prog.last_chunking is ch
    prog.compile("CPU", dims)  # asked for without `defer`: the whole program's kernels are compiled now
    assert all(k.binary and not k.deferred for k in whole)


def test_a_group_of_identical_kernels_renders_once_and_each_source_is_its_own_render(monkeypatch):
    """`build_kernels` renders a group of identical kernels once (`pipeline.render_template`) and puts each one's
    name in: every renderer's source is then byte for byte its render under that name; a name that is not a plain
    identifier, or no template, is rendered."""
    from types import SimpleNamespace

    from tgc.backends.cstyle import CUDARenderer, MetalRenderer, OpenCLRenderer
    from tgc.backends.llvmir import LLVMRenderer
    from tgc.backends.python import PythonRenderer
    from tgc.codegen import pipeline

    renders: list[str] = []
    real = pipeline.render_kernel
    monkeypatch.setattr(pipeline, "render_kernel", lambda dev, name, *a: renders.append(name) or real(dev, name, *a))
    prog = tgc.loads(LAYERS)
    kernels = prog.compile("PYTHON", DIMS)
    layers = _matmul_kernels(kernels)
    assert len(layers) == 3 and len({k.name for k in layers}) == 3
    # the group is rendered once, as its template, when its first layer is lowered: no layer is rendered under its
    # own name
    assert renders.count(pipeline.NAME_SLOT) == 1 and not {k.name for k in layers} & set(renders)
    first = layers[0]
    launch = {"global_size": first.global_size, "vals": first.vals}
    for renderer in (LLVMRenderer(), OpenCLRenderer(), CUDARenderer(), MetalRenderer(), PythonRenderer()):
        dev = SimpleNamespace(renderer=renderer)
        template = pipeline.render_template(dev, first.uops, first.bufs, launch)
        assert template is not None
        for k in layers:
            want = real(dev, k.name, first.uops, k.bufs, launch)
            assert pipeline.render_renamed(dev, k.name, first.uops, k.bufs, launch, template) == want
            assert k.name in want and pipeline.NAME_SLOT not in want
        odd = "a kernel"  # not an identifier: rendered, never put into the template
        assert pipeline.render_renamed(dev, odd, first.uops, first.bufs, launch, template) == \
            real(dev, odd, first.uops, first.bufs, launch)
    for k in layers:  # the sources the program got are each kernel's own render
        assert k.src == real(k.device, k.name, k.uops, k.bufs, launch)


def test_a_kernel_of_no_group_is_rendered_under_its_own_name_only(monkeypatch):
    """Only a kernel whose `_same_kernel` key recurs renders a template: a program of distinct kernels renders
    each once, under its own name."""
    from tgc.codegen import pipeline

    renders: list[str] = []
    real = pipeline.render_kernel
    monkeypatch.setattr(pipeline, "render_kernel", lambda dev, name, *a: renders.append(name) or real(dev, name, *a))
    prog = tgc.loads("x: f32[N, N]\nw: f32[N, N]\nreturn relu(x @ w), sum(x, axis=1)\n")
    kernels = prog.compile("PYTHON", DIMS)
    assert len(kernels) >= 2 and sorted(renders) == sorted(k.name for k in kernels)


def test_compile_key_with_the_canonical_source_given_is_the_same_key():
    """`_Compiles` passes the canonical source it has to `compile_key`: the key must be the one computed from the
    source alone (a cache written by either finds the other's binaries), and differ for another kernel."""
    from tgc.backends import get_device
    from tgc.codegen.binaries import compile_key

    dev = get_device("CPU")
    kernels = tgc.loads(LAYERS).compile("CPU", DIMS)
    srcs = [k.src for k in kernels]
    for src in srcs:
        assert compile_key(dev, src, dev.canonical_source(src)) == compile_key(dev, src)
    other = tgc.loads("x: f32[N, N]\nreturn x * 2.0\n").compile("CPU", DIMS)[0].src
    assert compile_key(dev, other, dev.canonical_source(other)) != compile_key(dev, srcs[0])
