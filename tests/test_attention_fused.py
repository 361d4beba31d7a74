"""Fused attention (issue 14, item 3): `softmax(q @ k^T * s) @ v`, with or without a causal mask written as
`where`, is ONE kernel (an online softmax over blocks of keys, tgc/codegen/attention.py), checked against numpy
at sequence lengths around and between the block size, in f32 and f16, on the CPU and the PYTHON device (which
checks bounds), and rendered for CUDA, OpenCL and Metal."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.backends import get_device
from tgc.codegen.attention import BLOCK, is_fused_attention
from tgc.dsl.frontend import concrete_shape
from tgc.errors import CompileError

SRC = """q: {t}[B, T, D]
k: {t}[B, T, D]
v: {t}[B, T, E]
scores = q @ k.transpose(-2, -1) * 0.7
{mask}weights = softmax({x}, axis=-1)
return weights @ v
"""
CAUSAL = "causal = arange(q.shape[1])[:, None] >= arange(q.shape[1])[None, :]\n"


def program(masked: bool, dtype: str = "f32") -> tgc.Program:
    return tgc.loads(SRC.format(t=dtype, mask=CAUSAL if masked else "",
                                x="where(causal, scores, -1e30)" if masked else "scores"))


def reference(q, k, v, masked: bool) -> np.ndarray:
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = q @ k.swapaxes(-1, -2) * 0.7
    if masked:
        t = s.shape[-1]
        s = np.where(np.arange(t)[:, None] >= np.arange(t)[None, :], s, -1e30)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def inputs(b: int, t: int, d: int, e: int, dtype=np.float32, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) * 1.5).astype(dtype) for shape in ((b, t, d), (b, t, d), (b, t, e))]


def check(p: tgc.Program, masked: bool, device: str, b: int, t: int, d: int, e: int, dtype=np.float32,
          tol: float = 1e-5) -> None:
    q, k, v = inputs(b, t, d, e, dtype)
    dims = {"B": b, "T": t, "D": d, "E": e}
    kernels = p.compile(device, dims=dims)
    if t == 1:  # one key: the front end folds the reductions of one element away, nothing is left to fuse
        assert not any(kk.name.startswith("attn_") for kk in kernels)
    else:
        assert len(kernels) == 1 and kernels[0].name.startswith("attn_"), [kk.name for kk in kernels]
    out = p.run(device, dims=dims, q=q, k=k, v=v)["output_0" if "output_0" in p.output_names else p.output_names[0]]
    np.testing.assert_allclose(out.astype(np.float64), reference(q, k, v, masked), rtol=tol, atol=tol,
                               err_msg=f"T={t} masked={masked} {device}")


# every length up to 1.3 blocks, then a sample up to 300 around block multiples and between them: each
# length is one compilation (no symbolic sizes), so the range 1..300 is sampled, not swept
LENGTHS = [t for t in list(range(1, BLOCK + 6)) + [2 * BLOCK - 1, 2 * BLOCK + 1, 47, 63, 65, 100, 129, 200, 255, 257,
                                                   299, 300] if t % BLOCK]


@pytest.mark.parametrize("masked", [False, True])
def test_fused_attention_every_ragged_length_matches_numpy(masked):
    p = program(masked)
    for t in LENGTHS:
        check(p, masked, "CPU", 2, t, 5, 3, tol=2e-5)


@pytest.mark.parametrize("masked", [False, True])
def test_fused_attention_whole_blocks_and_wide_heads(masked):
    p = program(masked)
    for t, d in ((BLOCK, 32), (4 * BLOCK, 16), (3 * BLOCK + 1, 24)):
        check(p, masked, "CPU", 2, t, d, d, tol=2e-5)


@pytest.mark.parametrize("masked", [False, True])
def test_fused_attention_f16_inputs(masked):
    """Half inputs take the per-row form (inner products 16 lanes of the head dimension at a time when it is a
    multiple of 16, scalar otherwise), computed in f32."""
    p = program(masked, "f16")
    for t, d in ((7, 8), (BLOCK + 3, 16), (50, 8)):
        check(p, masked, "CPU", 2, t, d, d, dtype=np.float16, tol=2e-2)


@pytest.mark.parametrize("masked", [False, True])
def test_fused_attention_runs_on_the_python_device(masked, monkeypatch):
    monkeypatch.setenv("TGC_VERIFY_BOUNDS", "1")
    p = program(masked)
    for t in (1, 5, BLOCK + 1, 2 * BLOCK + 7):
        check(p, masked, "PYTHON", 2, t, 3, 4, tol=2e-5)


def test_python_device_steps_the_key_loop_one_block_at_a_time(monkeypatch):
    """The key-block loop carries the running max: vectorizing it in chunks would multiply the rescale factor."""
    from tgc.backends import python as pydev
    monkeypatch.setattr(pydev, "BLOCK_ELEMENTS", 8)  # tiny vector blocks: a vectorized key loop would be chunked
    check(program(False), False, "PYTHON", 1, 5 * BLOCK + 3, 2, 2, tol=2e-5)


def test_a_masked_row_of_minus_infinity_scores_still_normalizes():
    p = tgc.loads(SRC.format(t="f32", mask=CAUSAL, x="where(causal, scores, -inf)"))
    q, k, v = inputs(1, BLOCK + 5, 4, 4)
    out = p.run("CPU", q=q, k=k, v=v)[p.output_names[0]]
    np.testing.assert_allclose(out, reference(q, k, v, True), rtol=2e-5, atol=2e-5)


def test_transformer_block_uses_the_fused_kernel():
    p = tgc.load("kernels/transformer_block.tg")
    dims = {"B": 2, "T": 21, "C": 16}
    names = [kk.name for kk in p.compile("CPU", dims=dims)]
    assert sum(n.startswith("attn_") for n in names) == 1, names
    rng = np.random.default_rng(1)
    ins = {d.name: (rng.standard_normal(concrete_shape(d, dims)) * 0.3)
           .astype(np.float32) for d in p.inputs}
    out = p.run("CPU", dims=dims, **ins)
    ref = p.reference(dims=dims, **ins)
    for name in out:
        np.testing.assert_allclose(out[name], ref[name], rtol=1e-4, atol=1e-4)


def test_softmax_over_another_axis_is_not_fused():
    src = SRC.format(t="f32", mask="", x="scores").replace("axis=-1", "axis=-2")
    p = tgc.loads(src)
    names = [kk.name for kk in p.compile("CPU", dims={"B": 1, "T": 8, "D": 4, "E": 4})]
    assert not any(n.startswith("attn_") for n in names) and len(names) > 1


@pytest.mark.parametrize("src", [
    SRC.format(t="f32", mask="", x="scores").replace("softmax(", "log_softmax("),  # not a softmax
    SRC.format(t="f32", mask="", x="scores").replace("return weights @ v", "return weights"),  # no matmul after
    SRC.format(t="f32", mask="", x="scores").replace("return weights @ v", "return weights.transpose(-2, -1) @ v"),
])
def test_other_chains_keep_the_ordinary_schedule(src):
    items = tgc.loads(src).schedule({"B": 1, "T": 8, "D": 4, "E": 4})
    assert not any(is_fused_attention(it.ast) for it in items)


def test_a_head_dimension_past_the_register_limit_is_not_fused():
    from tgc.engine.attention import MAX_HEAD_DIM
    p = program(False)
    assert is_fused_attention(p.schedule({"B": 1, "T": 8, "D": 4, "E": MAX_HEAD_DIM})[-1].ast)
    assert not any(is_fused_attention(it.ast) for it in p.schedule({"B": 1, "T": 8, "D": 4, "E": MAX_HEAD_DIM + 1}))


def test_the_plain_ast_of_the_fused_kernel_is_kept_for_symbolic_plans():
    """The item's AST (`--emit schedule`) is the online softmax; the chain's plain lowering (max and sum as nested
    reductions) is kept in `meta["unfused_ast"]` for symbolic-size plans."""
    from tgc.ir.uop import Ops
    p = program(True)
    items = p.schedule({"B": 1, "T": 9, "D": 4, "E": 4})
    assert len(items) == 1 and is_fused_attention(items[0].ast)
    assert {u.arg for u in items[0].ast.toposort() if u.op is Ops.REDUCE} == {Ops.ONLINE_SOFTMAX, Ops.ADD}
    reduces = [u.arg for u in items[0].meta["unfused_ast"].toposort() if u.op is Ops.REDUCE]
    assert Ops.MAX in reduces and Ops.ADD in reduces and Ops.ONLINE_SOFTMAX not in reduces


@pytest.mark.parametrize("target", ["CUDA", "OPENCL", "METAL"])
@pytest.mark.parametrize("masked", [False, True])
def test_fused_attention_renders_for_gpu_dialects(target, masked):
    p = program(masked)
    kernels = p.compile(target, dims={"B": 2, "T": BLOCK + 5, "D": 8, "E": 8})
    assert len(kernels) == 1 and kernels[0].name.startswith("attn_")
    k = kernels[0]
    assert k.local_size is not None and k.global_size[0] >= 1
    if target != "CUDA":
        get_device(target).lint(k.src)  # clang type-checks the source (a no-op without libclang)
    elif k.compile_error is not None:
        assert "nvrtc" in k.compile_error.lower() or "cuda" in k.compile_error.lower(), k.compile_error


def test_lint_catches_a_broken_fused_kernel():
    p = program(False)
    k = p.compile("OPENCL", dims={"B": 1, "T": 5, "D": 4, "E": 4})[0]
    from tgc.backends.clang_lint import libclang_error
    if libclang_error() is not None:
        pytest.skip(libclang_error())
    with pytest.raises(CompileError):
        get_device("OPENCL").lint(k.src.replace("exp2(", "exp3("))


CUDA_RUN = '''
import json
import numpy as np
import tgc
from test_attention_fused import SRC, CAUSAL, inputs, reference
out = []
for masked, t, dt in ((False, 21, "f32"), (True, 21, "f32"), (False, 70, "f32"), (True, 70, "f32"),
                      (True, 37, "f16")):
    p = tgc.loads(SRC.format(t=dt, mask=CAUSAL if masked else "",
                             x="where(causal, scores, -1e30)" if masked else "scores"))
    q, k, v = inputs(2, t, 8, 5, np.float16 if dt == "f16" else np.float32)
    kernels = p.compile("CUDA", dims={"B": 2, "T": t, "D": 8, "E": 5})
    names = [kk.name for kk in kernels]
    shared = sum(kk.src.count("__shared__") for kk in kernels)
    got = p.run("CUDA", q=q, k=k, v=v)[p.output_names[0]]
    out.append([masked, names, shared, float(np.abs(got - reference(q, k, v, masked)).max())])
from tgc.dsl.frontend import concrete_shape
blk = tgc.load("kernels/transformer_block.tg")
dims = {"B": 2, "T": 21, "C": 16}
rng = np.random.default_rng(1)
ins = {d.name: (rng.standard_normal(concrete_shape(d, dims)) * 0.3)
       .astype(np.float32) for d in blk.inputs}
got, want = blk.run("CUDA", dims=dims, **ins), blk.reference(dims=dims, **ins)
names = [kk.name for kk in blk.compile("CUDA", dims=dims)]
out.append(["block", names, 2, max(float(np.abs(got[n] - want[n]).max()) for n in got)])
print(json.dumps(out))
'''


def test_fused_attention_runs_on_cuda_through_the_cpu_stand_in():
    """The CUDA kernel (one thread per query row, a work-group's rows sharing each block of k and v through shared
    memory) compiled by NVRTC and run by the stand-in's host build: one and two row tiles, ragged blocks."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import cuda_standin
    if cuda_standin.why_unavailable() is not None:
        pytest.skip(str(cuda_standin.why_unavailable()))
    root = Path(__file__).resolve().parent.parent
    env = cuda_standin.env()
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "tests")])
    r = subprocess.run([sys.executable, "-c", "import cuda_standin; cuda_standin.install()\n" + CUDA_RUN], env=env,
                       cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(rows) == 6
    for i, (masked, names, shared, err) in enumerate(rows[:5]):
        assert len(names) == 1 and names[0].startswith("attn_"), names
        assert shared == 2, shared  # k and v blocks staged in shared memory
        assert err < (2e-2 if i == 4 else 2e-5), (masked, err)  # the last one has f16 inputs and output
    _, names, _, err = rows[5]  # the transformer block, its causal attention one fused kernel
    assert sum(n.startswith("attn_") for n in names) == 1 and err < 1e-4, (names, err)


@pytest.mark.parametrize("device", ["CPU", "OPENCL", "PYTHON"])
def test_one_query_row_per_batch_matches_numpy(device, monkeypatch):
    # a decoding step (one query row against many keys): the CPU's row-vector form took the batch axis for the
    # query rows and shared one batch's values across batches (errors ~0.5 for every batch but the last)
    from langkit import device_skip_reason
    why = device_skip_reason(device)
    if why is not None:
        pytest.skip(why)
    monkeypatch.setenv("DISABLE_COMPILER_CACHE", "1")
    src = ("q: f32[B, 1, D]\nk: f32[B, T, D]\nv: f32[B, T, D]\n"
           "return softmax(q @ transpose(k, 1, 2) / 8, axis=-1) @ v")
    prog = tgc.loads(src)
    r = np.random.default_rng(0)
    b, t, d = 4, 37, 32
    q, k, v = (r.standard_normal(s).astype(np.float32) for s in ((b, 1, d), (b, t, d), (b, t, d)))
    assert [kk.name for kk in prog.compile(device=device, dims={"B": b, "T": t, "D": d})][0].startswith("attn_")
    s = q.astype(np.float64) @ k.transpose(0, 2, 1) / 8
    e = np.exp(s - s.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(prog.run(q=q, k=k, v=v, device=device)["out0"], want, rtol=1e-4, atol=1e-5)
