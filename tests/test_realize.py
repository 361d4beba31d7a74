"""Realize decisions of the scheduler for reductions, and the recompute factor (tgc/engine/flops.py).

The rule under test (tgc/engine/schedule.py): a reduction (a matmul, a norm's statistics) is never recomputed in a
consumer: read at an index other than its own (shifted, sliced, concatenated, flipped, strided, padded) or at
more than one index per output element, it gets a buffer of its own; the per-row fusions (softmax, layernorm in
one kernel on the CPU) and fused attention stay. Counts are compared with exact expectations, values with numpy.
"""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest

import tgc
from tgc.engine.flops import executed_flops, written_flops
from tgc.engine.inputs import random_inputs
from tgc.ir.uop import Ops

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = [ROOT / "bench" / "models" / name for name in ("gpt2_block.tg", "llama_block.tg")]  # the rest: test_corpus.py
MM = "x: f32[M, K]\nw: f32[K, N]\ny = x @ w\nreturn {expr}\n"
DIMS = {"M": 6, "K": 5, "N": 8}


def _reduces(item) -> int:
    return sum(1 for u in item.ast.toposort() if u.op is Ops.REDUCE)


def _mm_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((6, 5)).astype(np.float32), "w": rng.standard_normal((5, 8)).astype(np.float32)}


# a consumer reading the matmul y (6 x 8) at an index other than its own, or at two indices per element
READS = {
    "rotated halves": ("cat(-y[:, N // 2:], y[:, :N // 2], axis=1) * 2 + y",
                       lambda y: np.concatenate([-y[:, 4:], y[:, :4]], 1) * 2 + y),
    "shifted": ("y[1:] - y[:-1]", lambda y: y[1:] - y[:-1]),
    "sliced": ("y[:, 2:5] * 3", lambda y: y[:, 2:5] * 3),
    "padded": ("pad(y, ((1, 0), (0, 2)))", lambda y: np.pad(y, ((1, 0), (0, 2)))),
    "flipped": ("y[::-1] + 1", lambda y: y[::-1] + 1),
    "strided": ("y[:, ::2] + 1", lambda y: y[:, ::2] + 1),
    "twice, relabelled": ("reshape(y, (N, M)) + permute(y, (1, 0))", lambda y: y.reshape(8, 6) + y.T),
}


@pytest.mark.parametrize("read", list(READS), ids=list(READS))
@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_matmul_read_elsewhere_is_realized_once(read, device):
    """The matmul is its own kernel, computed once; the consumer reads it from memory and computes no REDUCE."""
    expr, want = READS[read]
    prog = tgc.loads(MM.format(expr=expr))
    items = [i for i in prog.schedule(DIMS, device=device) if i.ast.src]
    assert len(items) == 2
    assert [_reduces(i) for i in items] == [1, 0]
    assert items[0].output in items[1].bufs
    inputs = _mm_inputs()
    got = prog.run(device=device, **inputs)["out0"]
    np.testing.assert_allclose(got, want(inputs["x"].astype(np.float64) @ inputs["w"]), rtol=1e-5, atol=1e-5)


def test_matmul_read_at_its_own_index_stays_fused():
    """An epilogue at the matmul's own index (bias, activation, a reshape or transpose of it) is one kernel."""
    prog = tgc.loads(MM.format(expr="permute(relu(y + 1), (1, 0)) * 2"))
    items = prog.schedule(DIMS, device="CPU")
    assert len(items) == 1 and _reduces(items[0]) == 1


def test_norm_statistics_read_shifted_are_realized():
    """A row statistic read at a shifted row is computed once per row in a kernel of its own."""
    src = "x: f32[N, D]\nm = x.mean(axis=1, keepdim=True)\nreturn x[1:] - m[:-1]\n"
    prog = tgc.loads(src)
    items = prog.schedule({"N": 5, "D": 7}, device="CPU")
    assert [_reduces(i) for i in items] == [1, 0]
    x = np.random.default_rng(3).standard_normal((5, 7)).astype(np.float32)
    np.testing.assert_allclose(prog.run(x=x)["out0"], x[1:] - x[:-1].mean(1, keepdims=True), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["softmax.tg", "layernorm.tg"])
def test_softmax_and_layernorm_stay_one_kernel(name):
    prog = tgc.load(ROOT / "kernels" / name)
    items = prog.schedule({"N": 16, "D": 64}, device="CPU")
    assert len(items) == 1
    assert _reduces(items[0]) >= 2  # the row statistics are computed inside the one kernel


def test_fused_attention_is_still_one_kernel():
    prog = tgc.load(ROOT / "kernels" / "attention.tg")
    items = prog.schedule({"B": 1, "H": 2, "T": 16, "D": 8}, device="CPU")
    assert [i.name.startswith("attn_") for i in items] == [True]


# --- operation counts


def test_written_and_executed_counts_of_a_matmul_are_exact():
    prog = tgc.loads("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b\n")
    dims = {"M": 3, "K": 7, "N": 5}
    outs, _ = prog._trace(dims)
    assert written_flops(outs) == 2 * 3 * 7 * 5  # a multiply per product, an add per reduced element
    (item,) = prog.schedule(dims, device="CPU")
    assert executed_flops(item.ast) == 2 * 3 * 7 * 5


def test_index_arithmetic_counts_nothing_whichever_index_dtype_object_made_it():
    """Index math (strides, offsets, padding gates) is not the graph's ops. It was told by `dtype is INDEX`, but
    a node is hash-consed by an equal dtype: one made first with a derived INDEX (`INDEX.vec(1)`, equal, another
    object) is what every later construction with INDEX gets, and its index math counted (30, not 10)."""
    from tgc.dtype import dtypes
    from tgc.ir.kernel import INDEX
    from tgc.ir.uop import RangeKind, UOp

    def kernel(idx):  # out[r] = where(r < 3, x[r * 7907 + 13], 0) * 3 + 1 over r < 5: 2 float ops a row
        f32 = dtypes.f32
        out, x = UOp(Ops.DEFINE_GLOBAL, f32.as_ptr(), (), 0), UOp(Ops.DEFINE_GLOBAL, f32.as_ptr(), (), 1)
        r = UOp(Ops.RANGE, idx, (UOp.const(idx, 5),), (0, RangeKind.LOOP))
        i = UOp(Ops.ADD, idx, (UOp(Ops.MUL, idx, (r, UOp.const(idx, 7907))), UOp.const(idx, 13)))
        v = UOp(Ops.WHERE, f32, (UOp(Ops.CMPLT, dtypes.bool, (r, UOp.const(idx, 3))),
                                 UOp(Ops.LOAD, f32, (x, i)), UOp.const(f32, 0.0)))
        y = UOp(Ops.ADD, f32, (UOp(Ops.MUL, f32, (v, UOp.const(f32, 3.0))), UOp.const(f32, 1.0)))
        return UOp(Ops.SINK, None, (UOp(Ops.STORE, None, (out, r, y)),))

    derived = INDEX.vec(1)
    assert derived == INDEX and derived is not INDEX
    assert executed_flops(kernel(derived)) == executed_flops(kernel(INDEX)) == 5 * 2
    # a strided, offset, gated program: the float ops per output element alone (a multiply and an add)
    prog = tgc.loads("x: f32[N, M]\nreturn x[1::2, ::3] * 2.0 + x[::2, 1::3]\n")
    dims = {"N": 8, "M": 9}
    assert sum(executed_flops(item.ast) for item in prog.schedule(dims, device="CPU")) == 4 * 3 * 2
    assert prog.recompute("CPU", dims) == {"written": 24, "executed": 24, "factor": 1.0}


def test_executed_count_sees_a_broadcast_recomputation():
    """y = x * 2 is fused into both reads of an outer sum: computed once per element of the output."""
    prog = tgc.loads("x: f32[N]\ny = x * 2\nreturn y[:, None] + y[None, :]\n")
    n = 6
    outs, _ = prog._trace({"N": n})
    assert written_flops(outs) == n + n * n
    (item,) = prog.schedule({"N": n}, device="CPU")
    # y at the row index: once per row (outer loop); at the column index: once per (row, column); the add
    assert executed_flops(item.ast) == n + n * n + n * n
    rec = prog.recompute("CPU", {"N": n})
    assert rec["written"] == n + n * n and rec["executed"] == n + 2 * n * n
    assert rec["factor"] == pytest.approx((n + 2 * n * n) / (n + n * n))


def test_row_statistics_are_counted_once_per_row():
    """A softmax in one CPU kernel: the row max and sum once per row; `exp(x - max)` is stored by the row pass and
    read back (tgc.codegen.rowreuse), so the program executes exactly what it writes."""
    prog = tgc.load(ROOT / "kernels" / "softmax.tg")
    n, d = 4, 8
    rec = prog.recompute("CPU", {"N": n, "D": d})
    assert rec["written"] == 6 * n * d  # max, subtract, scale by log2(e), exp2, sum, divide
    assert rec["executed"] == rec["written"] and rec["factor"] == 1.0


def test_recompute_factor_is_one_after_realizing_the_rotary_matmul():
    """The matmul read at two positions by a rotary embedding is computed once, where fusing it would have computed
    it three times (its own index and both rotated halves): the kernels execute what is written, but for the
    negation of one half, which the concatenation computes under its padding gate at every element (M * N / 2), and
    cat's comparison, written along the columns alone (N) and computed at every element (M * N)."""
    prog = tgc.loads(MM.format(expr=READS["rotated halves"][0]))
    rec = prog.recompute("PYTHON", DIMS)
    m, k, n = DIMS["M"], DIMS["K"], DIMS["N"]
    # the matmul, the negation, cat's comparison (one row: `tgc.dsl.functions.cat`) and select, * 2, + y
    assert rec["written"] == 2 * m * k * n + m * n // 2 + n + 3 * m * n
    assert rec["executed"] == rec["written"] + m * n // 2 + (m * n - n)


# --- the model corpus (bench/models)


def _rms(x, g):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layernorm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b


def _gelu(x):  # (float64 numpy)
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def llama_block(x, attn_norm, wq, wk, wv, wo, cos, sin, mlp_norm, w_gate, w_up, w_down):
    b, t, c = x.shape
    d = cos.shape[1]

    def heads(u):
        return u.reshape(b, t, c // d, d).transpose(0, 2, 1, 3)

    def rotary(u):
        return u * cos + np.concatenate([-u[..., d // 2:], u[..., :d // 2]], -1) * sin

    h = _rms(x, attn_norm)
    q, k, v = rotary(heads(h @ wq)), rotary(heads(h @ wk)), heads(h @ wv)
    s = np.where(np.tril(np.ones((t, t), bool)), q @ k.swapaxes(-1, -2) / math.sqrt(d), -1e30)
    y = x + (_softmax(s) @ v).transpose(0, 2, 1, 3).reshape(b, t, c) @ wo
    h2 = _rms(y, mlp_norm)
    gate = h2 @ w_gate
    return y + (gate / (1 + np.exp(-gate)) * (h2 @ w_up)) @ w_down


def gpt2_block(x, mask, ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj, heads=12):
    b, t, c = x.shape
    qkv = _layernorm(x, ln1_g, ln1_b) @ w_qkv + b_qkv
    q, k, v = (qkv[..., i * c:(i + 1) * c].reshape(b, t, heads, c // heads).transpose(0, 2, 1, 3) for i in range(3))
    s = q @ k.swapaxes(-1, -2) / math.sqrt(c // heads) + mask
    y = x + (_softmax(s) @ v).transpose(0, 2, 1, 3).reshape(b, t, c) @ w_o + b_o
    return y + _gelu(_layernorm(y, ln2_g, ln2_b) @ w_fc + b_fc) @ w_proj + b_proj


def _model_inputs(prog, dims, seed):
    """Random inputs, the weight matrices scaled by 1/sqrt(fan-in) as an initialization would."""
    out = random_inputs(prog, dims, seed=seed)
    return {k: (v / math.sqrt(v.shape[0]) if v.ndim == 2 else v).astype(np.float32) for k, v in out.items()}


def _small(path):
    if path.name == "llama_block.tg":
        dims = {"B": 2, "T": 6, "C": 16, "D": 4, "F": 13}
        t = np.arange(6)[:, None] / 10000 ** (np.arange(0, 4, 2) / 4)[None, :]
        tables = {"cos": np.cos(np.concatenate([t, t], 1)), "sin": np.sin(np.concatenate([t, t], 1))}
        return dims, tables, llama_block
    dims = {"B": 2, "T": 6, "C": 24}
    return dims, {"mask": np.where(np.tril(np.ones((6, 6), bool)), 0.0, -1e9)}, gpt2_block


def test_the_corpus_has_the_models():
    assert {p.name for p in MODELS} >= {"llama_block.tg", "gpt2_block.tg"}


@pytest.mark.parametrize("path", MODELS, ids=[p.name for p in MODELS])
def test_model_matches_numpy(path, device):
    """Each model of bench/models at a small size, against the same block written with numpy (float64)."""
    prog = tgc.load(path)
    dims, fixed, model = _small(path)
    inputs = _model_inputs(prog, dims, seed=len(path.name))
    inputs.update({k: v.astype(np.float32) for k, v in fixed.items()})
    got = prog.run(device=device, **inputs)
    want = model(*(inputs[d.name].astype(np.float64) for d in prog.inputs))
    (out,) = got.values()
    np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


@pytest.mark.parametrize("path", MODELS, ids=[p.name for p in MODELS])
@pytest.mark.parametrize("device", ["CPU", "OPENCL"])
def test_model_recompute_factor(path, device):
    """At a model's size (T=128, C=512 or 768), the kernels execute at most 5% more ops than the program as written
    (counted from the schedule: no compile)."""
    prog = tgc.load(path)
    dims = {"B": 1, "T": 128, "C": 768} if path.name == "gpt2_block.tg" else \
        {"B": 1, "T": 128, "C": 512, "D": 64, "F": 1365}
    outs, _ = prog._trace(prog.resolve_dims(dims))
    items = prog.schedule(dims, device=device)
    executed = sum(i.meta["graph_flops"] for i in items if i.ast.src)
    assert executed <= 1.05 * written_flops(outs)
    assert any(i.name.startswith("attn_") for i in items)  # the attention stays fused


# --- odd sizes (item 2): a matmul's columns with no multiple of 32 are split into a main part and the rest
# (rows and the reduction too: tests/test_oddsizes.py)

ODD = "x: f32[M, K]\nw: f32[K, N]\nb: f32[N]\nreturn gelu(x @ w + b)\n"


def _columns(item) -> int:
    """The output columns a matmul kernel computes (its innermost output loop)."""
    loops = [u for u in item.ast.toposort() if u.op is Ops.RANGE and u.arg[1].name == "LOOP"]
    return max(loops, key=lambda r: r.arg[0]).src[0].arg


def test_odd_columns_are_split_into_a_main_part_and_the_rest(whole_copies):
    prog = tgc.loads(ODD)
    dims = {"M": 64, "K": 256, "N": 1365}
    items = prog.schedule(dims, device="CPU")
    matmuls = [i for i in items if _reduces(i)]
    # 1344 = 42 * 32 columns, and the last 32 (the 21 left and 11 of the main part's: a vector's worth)
    assert sorted(_columns(i) for i in matmuls) == [32, 1344]
    assert all(i.line == 4 for i in matmuls)  # each part reports the matmul's line
    assert [_reduces(i) for i in items if i not in matmuls] == [0, 0]  # the packed right-hand side, the GELU
    inputs = random_inputs(prog, dims, seed=5)
    x, w, b = (inputs[n].astype(np.float64) for n in ("x", "w", "b"))
    want = _gelu(x @ w + b)
    np.testing.assert_allclose(prog.run(**inputs)["out0"], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # every device splits (a rule over sizes), without the CPU's packed copy
    assert sorted(_columns(i) for i in prog.schedule(dims, device="PYTHON") if _reduces(i)) == [32, 1344]


def test_the_main_part_takes_the_tile_of_a_multiple_of_32(whole_copies):
    """The heuristic gives the 1344 columns of a 1365-column matmul the opts it gives a 1344-column matmul."""
    def main_opts(n: int) -> list:
        ks = tgc.loads("x: f32[M, K]\nw: f32[K, N]\nreturn x @ w\n").compile("CPU", dims={"M": 64, "K": 256, "N": n},
                                                                              tuned=False)
        return [k.opts for k in ks if "1344" in k.name]
    odd, even = main_opts(1365), main_opts(1344)
    assert len(odd) == 1 and odd[0] and odd == even


def test_batched_and_sliced_odd_matmuls_match_numpy():
    cases = [("x: f32[B, M, K]\nw: f32[B, K, N]\nreturn x @ w\n", {"B": 2, "M": 32, "K": 128, "N": 600},
              lambda x, w: x @ w),
             ("x: f32[M, K]\nw: f32[K, N]\nreturn (x @ w)[:, 5:] * 2\n", {"M": 64, "K": 256, "N": 1000},
              lambda x, w: (x @ w)[:, 5:] * 2)]
    for src, dims, model in cases:
        prog = tgc.loads(src)
        assert sum(1 for i in prog.schedule(dims, device="CPU") if _reduces(i)) == 2
        inputs = random_inputs(prog, dims, seed=2)
        want = model(inputs["x"].astype(np.float64), inputs["w"])
        np.testing.assert_allclose(prog.run(**inputs)["out0"], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_attention_with_odd_keys_stays_fused():
    """197 keys (a ViT's tokens): the scores' matmul belongs to the fused attention and is not split."""
    prog = tgc.load(ROOT / "kernels" / "attention.tg")
    items = prog.schedule({"B": 1, "H": 2, "T": 197, "D": 64}, device="CPU")
    assert [i.name.startswith("attn_") for i in items] == [True]
