"""Three GPU defects (issue 26, item 0), each checked where it showed: on OpenCL (PoCL runs kernels here) and in
the rendered CUDA, OpenCL and Metal C (NVRTC compiles, PoCL builds, clang type-checks Metal). The runs through
the hardened CUDA stand-in (guard pages, 0xFF-filled memory) are in tests/test_cuda_standin.py.

- A grid rounded up to whole work-groups gates the threads past the end (they neither load nor store), so a
  kernel whose output the memory plan puts over an input that dies there (an in-place pair) stays right.
- Negative literals render as valid C in every dialect (`(-5.5) ** x` rendered `(--5.5f)`, a decrement).
- Every kernel's shared memory stays within the device's limit (the renderer's declared one and, where the
  runtime answers, the queried one); the fused attention shrinks its key block, or stages nothing, to fit.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tgc
from tgc.backends import get_device
from tgc.codegen.attention import is_fused_attention
from tgc.dtype import dtypes
from tgc.errors import CompileError
from tgc.ir.uop import Ops, UOp


def _opencl_or_skip():
    ok, why = get_device("OPENCL").available
    if not ok:
        pytest.skip(why)


# ---------------------------------------------------------------- rounded-up grids: a gate, never a clamp

def test_variance_last_element_on_opencl_with_an_in_place_pair():
    """375 outputs on 2 x 256 threads; the variance kernel writes its output over the mean (an in-place pair):
    a thread past the end clamped onto output 374 read the mean after thread 374 overwrote it (inf there)."""
    _opencl_or_skip()
    p = tgc.loads("x: f32[15, 25, 35]\nreturn x.var(axis=2)")
    x = np.random.default_rng(0).standard_normal((15, 25, 35)).astype(np.float32)
    low = p.lower("OPENCL")
    assert low.memory_plan().inplace, "the plan should still write the variance over the mean in place"
    assert any(k.global_size[0] * k.local_size[0] > 375 for k in low.kernels)  # the grid is rounded up
    got = p.run("OPENCL", x=x)[p.output_names[0]]
    np.testing.assert_allclose(got, x.astype(np.float64).var(axis=2), rtol=1e-5, atol=1e-6)


def test_symbolic_argmax_probability_of_the_last_row_on_opencl():
    """kernels/argmax.tg compiled once for its size class (the grid an expression of N): 33 rows."""
    _opencl_or_skip()
    p = tgc.load("kernels/argmax.tg")
    x = np.random.default_rng(1).standard_normal((33, 1000)).astype(np.float32)
    out = p.run("OPENCL", symbolic=True, logits=x)
    assert p.last_run == "symbolic"
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    cls, prob = (out[n] for n in p.output_names)
    np.testing.assert_array_equal(cls, x.argmax(1))
    np.testing.assert_allclose(prob, (e / e.sum(1, keepdims=True)).max(1), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("target", ["CUDA", "OPENCL", "METAL"])
def test_symbolic_grid_gates_its_partial_work_group(target):
    kernels = tgc.loads("x: f32[N]\nreturn x * 2.0").compile_symbolic(target).kernels
    src = kernels[0].src
    body = src[src.index("{", src.index("E_")):]
    store = next(line for line in body.splitlines() if "data0[" in line and "=" in line)
    assert store.strip().startswith("if ("), store  # the store is gated
    assert re.search(r"\? data1\[", body), body  # and so is the load


def test_inplace_pairs_refuse_a_load_without_the_stores_gate():
    """The memory plan's rule: the input is read only under the same gate as the store (a thread the gate stops
    must not read an element another thread writes)."""
    from tgc.engine.realize import inplace_pairs

    i32, f32 = dtypes.i32, dtypes.f32
    out, inp = UOp(Ops.DEFINE_GLOBAL, f32.as_ptr(), (), 0), UOp(Ops.DEFINE_GLOBAL, f32.as_ptr(), (), 1)
    lidx = UOp(Ops.SPECIAL, i32, (), ("lidx0", 8))
    live = UOp(Ops.CMPLT, dtypes.bool, (lidx, UOp.const(i32, 5)))

    class Kernel:
        def __init__(self, uops):
            self.uops, self.bufs = uops, [object(), object()]

        def linear_uops(self) -> list:
            return self.uops

    for load_src, store_gate in (((inp, lidx), (live,)), ((inp, lidx, live), ()),
                                 ((inp, lidx, UOp(Ops.CMPLT, dtypes.bool, (lidx, UOp.const(i32, 6)))), (live,))):
        ld = UOp(Ops.LOAD, f32, load_src)
        st = UOp(Ops.STORE, None, (out, lidx, ld, *store_gate))
        assert inplace_pairs(Kernel([out, inp, lidx, live, ld, st])) == []


# ---------------------------------------------------------------- negative literals

NEGATIVE_LITERALS = [("f32", [-5.5, -0.0, -np.inf, -1e-40]), ("f64", [-5.5, -0.0, -np.inf]),
                     ("f16", [-5.5, -0.0, -np.inf]), ("bf16", [-2.0, -0.0]), ("i8", [-3, -128]),
                     ("i16", [-3, -32768]), ("i32", [-3, -(1 << 31)]), ("i64", [-3, -(1 << 63)])]


def negation_uops(dtype_name: str, values: list[float]) -> list[UOp]:
    """out[i] = -(values[i]) and out[n + i] = out[0] - values[i]: each negative literal after a minus sign."""
    d = getattr(dtypes, dtype_name)
    out = UOp(Ops.DEFINE_GLOBAL, d.as_ptr(), (), 0)
    uops = [out]
    first = None
    for i, v in enumerate(values):
        c = UOp.const(d, v)
        neg = UOp(Ops.NEG, d, (c,))
        uops += [c, neg, UOp(Ops.STORE, None, (out, UOp.const(dtypes.i32, i), neg))]
        first = neg if first is None else first
    for i, v in enumerate(values):
        sub = UOp(Ops.SUB, d, (first, UOp.const(d, v)))
        uops += [sub, UOp(Ops.STORE, None, (out, UOp.const(dtypes.i32, len(values) + i), sub))]
    return uops


@pytest.mark.parametrize("target", ["CUDA", "OPENCL", "METAL"])
@pytest.mark.parametrize("dtype_name, values", NEGATIVE_LITERALS, ids=[n for n, _ in NEGATIVE_LITERALS])
def test_negative_literals_render_as_valid_c(target, dtype_name, values):
    if target == "METAL" and dtype_name == "f64":
        pytest.skip("Metal has no f64")
    dev = get_device(target)
    src = dev.renderer.render("neg", negation_uops(dtype_name, values))
    body = src[src.index("neg("):]
    assert not re.search(r"-\s*-", body.replace("- (-", "")), body  # no `--x` and no `- -x`
    if target == "CUDA":
        if dev.compiler is None:
            pytest.skip(dev.compile_error)
        dev.compiler.compile(src)  # NVRTC refused `--5.5f`
    elif target == "OPENCL" and dev.compiler is not None:
        dev.compiler.compile(src)  # PoCL builds it
    else:
        from tgc.backends.clang_lint import libclang_error
        if libclang_error() is not None:
            pytest.skip(libclang_error())
        dev.lint(src)


def test_power_of_a_negative_constant_runs_on_opencl():
    _opencl_or_skip()
    x = np.arange(-3, 5, dtype=np.float32)
    x64 = x.astype(np.float64)
    for expr, want in (("(-5.5) ** x", (-5.5) ** x64), ("-5.5 ** x", -(5.5 ** x64)), ("x - (-2.5)", x64 + 2.5),
                       ("-(-x)", x64)):
        p = tgc.loads(f"x: f32[N]\nreturn {expr}")
        got = p.run("OPENCL", x=x)[p.output_names[0]]
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=expr)


# ---------------------------------------------------------------- shared memory within the device's limit

SHARED_DECL = re.compile(r"(?:__shared__|__local|threadgroup)\s+(float|double|int|half|unsigned short|ushort)\s+"
                         r"\w+\[(\d+)\]")
C_SIZES = {"float": 4, "double": 8, "int": 4, "half": 2, "unsigned short": 2, "ushort": 2}


# CUDA past 48 KiB (on a GPU that opts in to more): dynamic shared memory, its size in a module global
DYNAMIC_DECL = re.compile(r"__constant__ unsigned int tgc_dynamic_shared_\w+ = (\d+)u;")


def declared_shared_bytes(src: str) -> int:
    """The shared memory a rendered kernel declares, read from its source."""
    return (sum(C_SIZES[t] * int(n) for t, n in SHARED_DECL.findall(src))
            + sum(int(n) for n in DYNAMIC_DECL.findall(src)))


ATTENTION = """q: f32[T, D]
k: f32[T, D]
v: f32[T, E]
return softmax(q @ k.transpose(-2, -1) * 0.05, axis=-1) @ v
"""


def attention_reference(q, k, v) -> np.ndarray:
    s = q.astype(np.float64) @ k.astype(np.float64).T * 0.05
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True) @ v.astype(np.float64)


HEAD_DIMS = [64, 256, 768, 1024]


def attention_kernel(target: str, dims: dict[str, int]):
    """The fused attention kernel lowered for `target` (rendered, not compiled)."""
    from tgc.codegen.attention import lower_attention
    (item,) = tgc.loads(ATTENTION).schedule(dims, target)
    assert is_fused_attention(item.ast)
    return lower_attention(item, get_device(target), "attn")


@pytest.mark.parametrize("target", ["CUDA", "OPENCL", "METAL"])
def test_fused_attention_renders_within_shared_memory_at_head_dims_64_to_1024(target):
    """At a head dim of 768 or 1024 (64 value columns) the staged keys and values took 53-69 KB: ptxas refused
    ("too much shared data", 0x11000 bytes of 0xc000); OpenCL and Metal got more than their 32 KB. Every dialect
    now stays within its limit, still staging a block of keys."""
    limit = get_device(target).caps.max_shared_bytes
    for d in HEAD_DIMS:
        used = declared_shared_bytes(attention_kernel(target, {"T": 20, "D": d, "E": 64}).src)
        assert 0 < used <= limit, (d, used, limit)


def test_fused_attention_at_head_dim_1024_compiles_with_nvrtc():
    dev = get_device("CUDA")
    if dev.compiler is None:
        pytest.skip(dev.compile_error)
    dev.compiler.compile(attention_kernel("CUDA", {"T": 20, "D": 1024, "E": 64}).src)  # ptxas refused it before


@pytest.mark.parametrize("d", [64, 1024])
def test_fused_attention_at_head_dims_64_to_1024_matches_numpy_on_opencl(d):
    _opencl_or_skip()
    p = tgc.loads(ATTENTION)
    dims = {"T": 20, "D": d, "E": 16}
    (k,) = p.compile("OPENCL", dims=dims)
    assert k.name.startswith("attn_") and 0 < declared_shared_bytes(k.src) <= get_device("OPENCL").caps.max_shared_bytes
    rng = np.random.default_rng(d)
    q, kk = (rng.standard_normal((20, d)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((20, 16)).astype(np.float32)
    got = p.run("OPENCL", dims=dims, q=q, k=kk, v=v)[p.output_names[0]]
    np.testing.assert_allclose(got, attention_reference(q, kk, v), rtol=1e-4, atol=1e-4)


def test_opencl_device_reports_its_queried_shared_memory():
    _opencl_or_skip()
    import pyopencl as cl
    dev = get_device("OPENCL")
    queried = cl.get_platforms()[0].get_devices()[0].local_mem_size
    assert dev.max_shared_bytes == queried
    assert dev.caps.max_shared_bytes == min(queried, dev.renderer.max_shared_bytes)


@pytest.mark.parametrize("limit, staged", [(6000, True), (400, False)])
def test_fused_attention_follows_a_lower_device_limit(monkeypatch, limit, staged):
    """A device whose runtime reports less shared memory than the dialect declares (here: set on the device, as
    the OpenCL and CUDA devices set it from their query) gets a smaller key block; below one key's k and v, the
    kernel stages nothing. OpenCL results still match numpy."""
    _opencl_or_skip()
    dev = get_device("OPENCL")
    monkeypatch.setattr(dev, "max_shared_bytes", limit)
    p = tgc.loads(ATTENTION)
    dims = {"T": 70, "D": 100, "E": 24}  # one key's k and v: 496 bytes; 16 keys: 7936; 6000 holds 12 keys
    (k,) = p.compile("OPENCL", dims=dims)
    assert k.name.startswith("attn_")
    used = declared_shared_bytes(k.src)
    assert used <= limit and (used > 0) == staged, (used, limit)
    rng = np.random.default_rng(3)
    q, kk = (rng.standard_normal((70, 100)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((70, 24)).astype(np.float32)
    got = p.run("OPENCL", dims=dims, q=q, k=kk, v=v)[p.output_names[0]]
    np.testing.assert_allclose(got, attention_reference(q, kk, v), rtol=1e-4, atol=1e-5)


def test_a_kernel_past_the_shared_memory_limit_is_refused():
    """The last check before rendering (every kernel, whatever lowered it): a clear CompileError, not ptxas's."""
    from tgc.codegen.pipeline import check_shared_memory
    dev = get_device("CUDA")
    local = UOp(Ops.DEFINE_LOCAL, dtypes.f32.as_ptr(), (), ("temp0", 12289))  # 49156 bytes
    with pytest.raises(CompileError, match="49156 bytes of shared memory"):
        check_shared_memory(dev, "k", [local])
    check_shared_memory(dev, "k", [UOp(Ops.DEFINE_LOCAL, dtypes.f32.as_ptr(), (), ("temp0", 12288))])
