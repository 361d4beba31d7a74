"""The operations of docs/LANGUAGE.md against numpy (or torch's semantics written out in numpy), per
device of TGC_TEST_DEVICES, every dtype each takes, at odd sizes: indexing by integer tensors (take,
take_along_axis, x[idx], scatter_add), elementwise functions, *_like/astype, tril/triu, split/chunk/repeat/
tile, any/all, cumsum/cumprod, einsum, sort/argsort/topk; their errors; and a fuzzer over them.

The index rule checked throughout (written here from docs/LANGUAGE.md): a negative index wraps once
(i + n), then every index is clamped into [0, n).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from langkit import (
    ALL,
    FLOATS,
    NP,
    assert_close,
    assert_exact,
    assert_result,
    is_float,
    rand,
    run,
    run1,
    source_error,
    to_dtype,
)

import tgc
from tgc.baselines.numpy_eval import numpy_program
from tgc.codegen import verify
from tgc.ir.uop import Ops

NUMERIC = [d for d in ALL if d != "bool"]


def clamp_index(idx, n: int) -> np.ndarray:
    i = np.asarray(idx)
    if i.dtype.kind == "i":
        i = np.where(i < 0, i.astype(np.int64) + n, i)
    return np.clip(i, 0, n - 1).astype(np.int64)


def want_dtype(name: str) -> type:
    return NP[name]


# ------------------------------------------------------------------------------------------------ gathers

GATHER_SRC = """x: {d}[V, D]
ids: i32[B, T]
c: {d}[V, D, E]
col: i32[V, K]
return x[ids], take_along_axis(x, col, axis=1), c[ids, :, ids]{more}
"""
GATHER_MORE = """, take(x, ids, axis=0), take(x, ids), x[ids, 1:4], x[:, ids], x[[0, 6, -1]], c[ids, 2], \
    c[1, :, ids], take(x, 3, axis=1), c[..., ids], gather(x, 0, ids[:, :2])"""


@pytest.mark.parametrize("dt", ALL)
def test_gather_forms_every_dtype(device, dt):
    """Three forms for every dtype, every form for three dtypes (kernels compile per dtype: kept few)."""
    rng = np.random.default_rng(10)
    v, d, e = 7, 5, 3
    x, c = rand(rng, (v, d), dt), rand(rng, (v, d, e), dt)
    ids = rng.integers(-10, 12, (2, 3)).astype(np.int32)  # in range, negative, and past either end
    col = rng.integers(-7, 8, (v, 4)).astype(np.int32)
    full = dt in ("f32", "i8", "bool")
    out = run(GATHER_SRC.format(d=dt, more=GATHER_MORE if full else ""), device, x=x, ids=ids, c=c, col=col)
    r, rd = clamp_index(ids, v), clamp_index(ids, d)
    re = clamp_index(ids, e)
    want = [x[r], np.take_along_axis(x, clamp_index(col, d), axis=1), c[r, :, re]]
    if full:
        want += [x[r], x.reshape(-1)[clamp_index(ids, v * d)], x[r, 1:4], x[:, rd], x[[0, 6, 6]], c[r, 2],
                 c[1, :, re], x[:, 3], c[..., re], np.take_along_axis(x[:, :2], r[:, :2], axis=0)]
    assert list(out) == [f"out{i}" for i in range(len(want))]
    for (_name, got), w in zip(out.items(), want):
        assert_exact(got, w, dt) if not is_float(dt) else assert_close(got, w, dt)


@pytest.mark.parametrize("it", ["i8", "u8", "u16", "i64", "u64"])
def test_gather_index_dtypes(device, it):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((9, 4)).astype(np.float32)
    lo = -12 if it[0] == "i" else 0
    hi = 127 if it in ("i8",) else 200
    ids = rng.integers(lo, hi, (13,)).astype(NP[it])
    if it == "u64":
        ids[0] = np.uint64(2**63 + 5)  # above i64: clamps to the last row
    if it == "i64":
        ids[0] = np.int64(-2**62)  # wraps once, still negative: clamps to 0
    got = run1(f"x: f32[N, D]\nids: {it}[K]\nreturn x[ids]", device, x=x, ids=ids)
    assert_close(got, x[clamp_index(ids, 9)], "f32")


def test_gather_is_an_indexed_load_proven_in_bounds():
    """An embedding lookup is one kernel with no reduction (O(output) work, not a one-hot matmul), and the
    bounds verifier proves its data-dependent load in bounds from the clamp (none left unverified)."""
    prog = tgc.loads("emb: f32[V, D]\nids: i64[B, T]\nreturn emb[ids]")
    items = prog.schedule({"V": 50000, "D": 64, "B": 4, "T": 9})
    assert len(items) == 1
    assert not any(u.op is Ops.REDUCE for u in items[0].ast.toposort())
    loads = [u for u in items[0].ast.toposort() if u.op is Ops.LOAD]
    assert any(any(s.op is Ops.LOAD for s in u.src[1].toposort()) for u in loads)  # an index read from memory
    before = dict(verify.STATS)
    emb = np.random.default_rng(1).standard_normal((300, 8)).astype(np.float32)
    ids = np.array([[-1, 0, 299, 300], [5, -301, 7, 1 << 40]], np.int64)
    got = prog.run(device="CPU", emb=emb, ids=ids)["out0"]
    np.testing.assert_array_equal(got, emb[clamp_index(ids, 300)])
    assert verify.STATS["unverified"] == before["unverified"]
    assert verify.STATS["by_bounds"] > before["by_bounds"]


def test_gather_of_computed_values_and_reference(device):
    """Gathering from a reduction's result (softmax rows) and from a broadcast; the float64 reference
    (`tgc run --check`) applies the same index rule."""
    rng = np.random.default_rng(12)
    logits = rng.standard_normal((5, 11)).astype(np.float32)
    labels = np.array([0, 10, -1, 3, 99], np.int32)
    src = """logits: f32[B, C]
labels: i32[B]
lp = log_softmax(logits, axis=1)
picked = take_along_axis(lp, labels[:, None], axis=1)
return -mean(picked), (logits * 2)[labels]"""
    out = run(src, device, logits=logits, labels=labels)
    m = logits.astype(np.float64).max(1, keepdims=True)
    lp = logits - m - np.log(np.exp(logits - m).sum(1, keepdims=True))
    li = clamp_index(labels, 11)
    assert_close(out["out0"], -lp[np.arange(5), li].mean(), "f32")
    assert_close(out["out1"], (logits * 2)[clamp_index(labels, 5)], "f32")
    ref = tgc.loads(src).reference(logits=logits, labels=labels)
    assert_close(ref["out1"].astype(np.float32), (logits * 2)[clamp_index(labels, 5)], "f32")


@pytest.mark.parametrize("dt", ALL)
def test_scatter_add_every_dtype(device, dt):
    rng = np.random.default_rng(13)
    x, src = rand(rng, (5, 3), dt, 0, 3), rand(rng, (7, 3), dt, 0, 3)
    idx = rng.integers(-6, 7, (7, 3)).astype(np.int32)
    got = run1(f"x: {dt}[N, M]\nidx: i32[K, M]\ns: {dt}[K, M]\nreturn scatter_add(x, 0, idx, s)", device,
               x=x, idx=idx, s=src)
    if dt == "bool":
        want = x.copy()
        for i in range(7):
            for j in range(3):
                want[clamp_index(idx[i, j], 5), j] |= src[i, j]
    else:
        acc = x.astype(np.float64 if is_float(dt) else object).copy()
        for i in range(7):
            for j in range(3):
                acc[clamp_index(idx[i, j], 5), j] += src[i, j]
        want = acc.astype(np.float64) if is_float(dt) else acc.astype(NP[dt])
    assert_result(got, want, dt, scale=10.0)


# ------------------------------------------------------------------------------------------------ elementwise

EDGES = [0.0, -0.0, 1e-7, -1e-7, 1e-3, -0.5, 0.5, 1.0, -1.0, 2.5, -2.5, 0.66, 2.42, -3.0, 10.0, -10.0, 25.0,
         -25.0, 80.0, -80.0, math.inf, -math.inf, math.nan]


def _np_elementwise(x: np.ndarray) -> list[np.ndarray]:
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        return [np.log1p(x), np.expm1(x), x / (1 + np.exp(-x)), np.where(x > 20, x, np.log1p(np.exp(x))),
                np.where(2 * x > 3, x, np.log1p(np.exp(2 * x)) / 2), np.where(x > 0, x, np.expm1(x)),
                np.where(x > 0, x, 0.5 * np.expm1(x)), np.where(x < 0, 0.2 * x, x), np.arctan(x),
                0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))), np.isnan(x),
                np.isinf(x), np.isfinite(x)]


ELEMENTWISE_SRC = """x: {d}[N]
return stack(log1p(x), expm1(x), silu(x), softplus(x), softplus(x, beta=2, threshold=3), elu(x), \
    elu(x, alpha=0.5), leaky_relu(x, 0.2), atan(x), gelu(x, approximate="tanh")), \
    stack(isnan(x), isinf(x), isfinite(x))"""


def _unstacked(out: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [*out["out0"], *out["out1"]]


@pytest.mark.parametrize("dt", FLOATS)
def test_float_elementwise(device, dt):
    rng = np.random.default_rng(14)
    x = to_dtype(np.concatenate([EDGES, rng.uniform(-6, 6, 40)]), dt)
    if dt == "f16":
        x = x.astype(np.float16)
    out = _unstacked(run(ELEMENTWISE_SRC.format(d=dt), device, x=x))
    want = _np_elementwise(np.asarray(x, np.float64))
    for got, w in zip(out, want):
        if w.dtype == np.bool_:
            assert_exact(got, w, "bool")
        else:  # a result past the dtype's range is its infinity (f16: expm1(25))
            with np.errstate(all="ignore"):
                w = np.where(np.isinf(w.astype(NP[dt] if dt != "bf16" else np.float32)), w * np.inf, w)
            assert_close(got, w, dt)


@pytest.mark.parametrize("dt", ["bool", "u8", "i64"])
def test_elementwise_of_ints_is_f32(device, dt):
    rng = np.random.default_rng(15)
    x = rand(rng, (9,), dt, -5, 5)
    out = _unstacked(run(ELEMENTWISE_SRC.format(d=dt), device, x=x))
    want = _np_elementwise(x.astype(np.float64))
    for got, w in zip(out, want):
        assert_exact(got, w, "bool") if w.dtype == np.bool_ else assert_close(got, w, "f32")


@pytest.mark.parametrize("dt", FLOATS + ["i32", "u8"])
def test_atan2_quadrants_and_zeros(device, dt):
    vals = [0.0, -0.0, 1.0, -1.0, 2.5, -0.3, math.inf, -math.inf, math.nan] if is_float(dt) else [0, 1, 3, 7]
    y, x = np.meshgrid(vals, vals, indexing="ij")
    y, x = to_dtype(y.reshape(-1), dt), to_dtype(x.reshape(-1), dt)
    got = run1(f"y: {dt}[N]\nx: {dt}[N]\nreturn atan2(y, x)", device, y=y, x=x)
    want = np.arctan2(y.astype(np.float64), x.astype(np.float64))
    assert_close(got, want, dt if is_float(dt) else "f32")


@pytest.mark.parametrize("dt", ALL)
def test_like_astype_clamp(device, dt):
    rng = np.random.default_rng(16)
    x = rand(rng, (3, 5), dt)
    clamps = "clamp(x, min=1), clamp(x, max=2), clamp(x, 0, 2)" if dt != "bool" else "x, x, x"
    full = dt in ("f32", "i8", "bool")  # casts to other dtypes: for three dtypes (cast is tested everywhere)
    more = ", full_like(x, 2.75, dtype=f32), zeros_like(x, dtype=i8), x.astype(f32), astype(x, i16), x.astype(bool)"
    src = f"""x: {dt}[N, M]
return stack(zeros_like(x), ones_like(x), full_like(x, 3), {clamps}){more if full else ""}"""
    out = run(src, device, x=x)
    same = out["out0"]
    assert_result(same[0], np.zeros((3, 5)), dt)
    assert_result(same[1], np.ones((3, 5)), dt)
    assert_result(same[2], np.full((3, 5), True if dt == "bool" else 3), dt)
    if dt != "bool":
        assert_result(same[3], np.maximum(x, 1), dt)
        assert_result(same[4], np.minimum(x, 2), dt)
        assert_result(same[5], np.clip(x, 0, 2), dt)
    if not full:
        return
    assert_close(out["out1"], np.full((3, 5), 2.75), "f32")
    assert_exact(out["out2"], np.zeros((3, 5)), "i8")
    assert_close(out["out3"], x.astype(np.float64), "f32")
    assert_exact(out["out4"], x.astype(np.int16), "i16")
    assert_exact(out["out5"], x != 0, "bool")


def test_clamp_keeps_nan(device):
    x = np.array([math.nan, -3, 0.5, 9], np.float32)
    got = run1("x: f32[N]\nreturn clamp(x, -1, 1)", device, x=x)
    assert_close(got, [math.nan, -1, 0.5, 1], "f32")


# ------------------------------------------------------------------------------------------------ shapes


@pytest.mark.parametrize("dt", ["bool", "f16", "f32"])
def test_tri_split_chunk_repeat_tile(device, dt):
    """Every form for three dtypes (movement ops are index math, the same for every dtype); the rest of the
    dtypes in test_tri_repeat_tile_other_dtypes."""
    rng = np.random.default_rng(17)
    x = rand(rng, (2, 5, 7), dt)
    src = f"""x: {dt}[A, B, C]
s = split(x, 7, axis=2)
p = split(x, (1, 3, 10), axis=1)
h0, h1, h2 = chunk(x, 3, axis=1)
return stack(tril(x), triu(x, 2), tril(x, -1)), s[6], p[1], p[3], h0, h2, repeat(x, 3, axis=1), repeat(x, 2), \
    repeat(x, (2, 0, 1, 3, 1), axis=1), tile(x, 2), tile(x, (2, 1, 1, 3)), x.repeat(2, axis=-1)"""
    out = run(src, device, x=x)
    want = [np.stack([np.tril(x), np.triu(x, 2), np.tril(x, -1)]), np.split(x, 7, axis=2)[6],
            np.split(x, [1, 3, 10], axis=1)[1], np.split(x, [1, 3, 10], axis=1)[3], x[:, 0:2], x[:, 4:5],
            np.repeat(x, 3, axis=1), np.repeat(x, 2), np.repeat(x, (2, 0, 1, 3, 1), axis=1), np.tile(x, 2),
            np.tile(x, (2, 1, 1, 3)), np.repeat(x, 2, axis=-1)]
    for (_name, got), w in zip(out.items(), want):
        assert_exact(got, w, dt) if not is_float(dt) else assert_close(got, w, dt)


@pytest.mark.parametrize("dt", ["i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "bf16", "f64"])
def test_tri_repeat_tile_other_dtypes(device, dt):
    rng = np.random.default_rng(24)
    x = rand(rng, (3, 4), dt)
    out = run(f"x: {dt}[A, B]\nreturn stack(tril(x), triu(x, 1)), repeat(x, (1, 0, 2), axis=0), tile(x, (2, 1)), \
    split(x, (3, 1, -1), axis=1)[2]", device, x=x)
    assert_result(out["out0"], np.stack([np.tril(x), np.triu(x, 1)]), dt)
    assert_result(out["out1"], np.repeat(x, (1, 0, 2), axis=0), dt)
    assert_result(out["out2"], np.tile(x, (2, 1)), dt)
    assert_result(out["out3"], np.split(x, [3, 1, -1], axis=1)[2], dt)  # unsorted points: numpy's slices


@pytest.mark.parametrize("dt", ALL)
def test_any_all(device, dt):
    rng = np.random.default_rng(18)
    x = rand(rng, (4, 9), dt, -1, 1)
    if is_float(dt):
        x[0, 0] = np.nan
    out = run(f"x: {dt}[N, M]\nreturn all(x, axis=1), x.any(axis=0, keepdim=True)", device, x=x)
    assert_exact(out["out0"], np.all(x, axis=1), "bool")
    assert_exact(out["out1"], np.any(x, axis=0, keepdims=True), "bool")
    if dt == "f32":
        out = run(f"x: {dt}[N, M]\nreturn any(x), any(x < 5), all(x)", device, x=x)
        assert_exact(out["out0"], np.any(x), "bool")
        assert_exact(out["out1"], np.any(x < 5), "bool")
        assert_exact(out["out2"], np.all(x), "bool")


# ------------------------------------------------------------------------------------------------ scans


def _scan_dtype(dt: str) -> str:
    return {"bool": "i32", "i8": "i32", "i16": "i32", "u8": "u32", "u16": "u32"}.get(dt, dt)


@pytest.mark.parametrize("dt", ALL)
def test_cumsum_cumprod_every_dtype(device, dt):
    rng = np.random.default_rng(19)
    full = dt in ("i8", "f32", "bool")  # rows of 37 (two levels of blocks) and every axis for three dtypes
    x = rand(rng, (3, 37 if full else 19), dt, -3, 3)
    more = ", cumsum(x), cumsum(x, axis=0)" if full else ""
    out = run(f"x: {dt}[N, M]\nreturn cumsum(x, axis=1), cumprod(x[:, :9], axis=1){more}", device, x=x)
    od = _scan_dtype(dt)
    acc = np.float64 if is_float(dt) else NP[od]
    xs = x.astype(acc)
    want = [np.cumsum(xs, axis=1), np.cumprod(xs[:, :9], axis=1)]
    want += [np.cumsum(xs), np.cumsum(xs, axis=0)] if full else []
    for (name, got), w in zip(out.items(), want):
        scale = np.cumsum(np.abs(xs), axis=1)[:, :w.shape[-1]] if name == "out0" else 40.0
        assert_result(got, w, od, scale=scale if name == "out0" else (np.max(np.abs(w)) + 1 if is_float(dt) else 1))


@pytest.mark.parametrize("n", [1, 33, 1100])
def test_cumsum_sizes(device, n):
    x = np.random.default_rng(n).integers(-50, 50, (2, n)).astype(np.int32)
    got = run1("x: i32[N, M]\nreturn cumsum(x, axis=1)", device, x=x)
    assert_exact(got, np.cumsum(x, axis=1), "i32")


def test_cumsum_work_is_not_quadratic():
    """DESIGN.md's rule: rows up to SCAN_BLOCK are one masked reduction; longer rows are blocked, so the total
    loop work stays within a small multiple of n * SCAN_BLOCK (n^2 would be 64x that here)."""
    from tgc.dsl.library import SCAN_BLOCK
    n = 1 << 16
    items = tgc.loads("x: f32[N]\nreturn cumsum(x)").schedule({"N": n})
    work = 0
    for item in items:
        ranges = {u for u in item.ast.toposort() if u.op is Ops.RANGE}
        size = 1
        for r in ranges:
            size *= r.src[0].arg
        work += size
    assert work <= 4 * n * SCAN_BLOCK, work
    small = tgc.loads("x: f32[N]\nreturn cumsum(x)").schedule({"N": 20})
    assert len(small) == 1  # one masked reduction


# ------------------------------------------------------------------------------------------------ einsum

EINSUM = [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("ij,jk", [(3, 4), (4, 5)]), ("i,i->", [(7,), (7,)]), ("ii->i", [(4, 4)]),
    ("ii", [(5, 5)]), ("ij->ji", [(3, 6)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 3)]), ("i,j->ij", [(3,), (5,)]),
    ("...ij,jk->...ik", [(2, 3, 4), (4, 2)]), ("ijk->", [(2, 3, 4)]), ("ij,ij,ij->i", [(3, 4)] * 3),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 5), (1, 2, 4, 5)]), ("i...->...", [(3, 2, 2)]), ("ab,cd", [(1, 2), (3, 1)]),
]


EINSUM_CORE = [EINSUM[0], EINSUM[3], EINSUM[8], EINSUM[10]]


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16", "f64", "i32", "i8", "u16", "u64", "bool"])
def test_einsum(device, dt):
    """Every form for f32, four (a matmul, a diagonal, an ellipsis, three operands) for other dtypes."""
    rng = np.random.default_rng(20)
    decls, lines, inputs, want = [], [], {}, []
    k = 0
    for spec, shapes in EINSUM if dt == "f32" else EINSUM_CORE:
        names = []
        for shp in shapes:
            name = f"a{k}"
            k += 1
            inputs[name] = rand(rng, shp, dt, -3, 3)
            decls.append(f"{name}: {dt}[{', '.join(map(str, shp))}]")
            names.append(name)
        ops = [inputs[n] for n in names]
        with np.errstate(all="ignore"):
            want.append(np.einsum(spec, *[o.astype(np.float64) if is_float(dt) else o for o in ops]))
        lines.append(f"r{len(want) - 1} = einsum('{spec}', {', '.join(names)})")
    src = "\n".join(decls + lines) + "\nreturn " + ", ".join(f"r{i}" for i in range(len(want)))
    out = run(src, device, **inputs)
    for got, w in zip(out.values(), want):
        assert_result(got, np.asarray(w), dt, scale=np.max(np.abs(np.asarray(w, np.float64))) + 10)


# ------------------------------------------------------------------------------------------------ sorting


def _np_argsort(x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """Stable; ascending puts nan last, descending puts nan first (torch.topk treats nan as the largest)."""
    if not descending:
        return np.argsort(x, axis=axis, kind="stable")
    if x.dtype.kind == "f":
        return np.lexsort((-x, ~np.isnan(x)), axis=axis)
    return np.argsort(~x, axis=axis, kind="stable")


@pytest.mark.parametrize("dt", ALL)
def test_sort_argsort_topk_every_dtype(device, dt):
    rng = np.random.default_rng(21)
    x = rand(rng, (3, 13), dt, -4, 4)  # small range: many ties
    if is_float(dt):
        x[0, [2, 7]] = np.nan
        x[1, 3], x[1, 4] = np.inf, -np.inf
    full = dt in ("f32", "i32", "bool")  # every form; the other dtypes: sort and topk (values and indices)
    more = """, argsort(x, axis=0, descending=True), argsort(x), sort(x, axis=0), argsort(x, axis=None), \
    sort(x, descending=True), b[0], b[1]"""
    src = f"""x: {dt}[N, M]
t = topk(x, 4)
b = topk(x, 2, axis=0, largest=False)
return sort(x), t[0], t[1]{more if full else ""}"""
    out = run(src, device, x=x)
    asc1, asc0 = _np_argsort(x, 1, False), _np_argsort(x, 0, False)
    desc1 = _np_argsort(x, 1, True)
    want = [np.take_along_axis(x, asc1, 1), np.take_along_axis(x, desc1[:, :4], 1), desc1[:, :4]]
    if full:
        want += [_np_argsort(x, 0, True), asc1, np.take_along_axis(x, asc0, 0), _np_argsort(x.reshape(-1), 0, False),
                 np.take_along_axis(x, desc1, 1), np.take_along_axis(x, asc0[:2], 0), asc0[:2]]
    index_outputs = {"out2", "out3", "out4", "out6", "out9"}
    for (name, got), w in zip(out.items(), want):
        if name in index_outputs:
            assert_exact(got, w, "i32")
        else:
            assert_exact(got, w, dt) if not is_float(dt) else assert_close(got, w, dt)


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("src, message", [
    ("x: f32[N]\ni: f32[N]\nreturn x[i]", "must be integers"),
    ("x: f32[N]\nm: bool[N]\nreturn x[m]", "mask"),
    ("x: f32[4, 3]\ni: i32[2]\nreturn x[i, 5]", "out of range"),
    ("x: f32[4, 3]\nreturn take(x, 12)", "out of range"),
    ("x: f32[4, 3]\nreturn x[[0, -5]]", "index -5 is out of range"),
    ("x: f32[4, 3]\ni: i32[2, 4]\nreturn gather(x, 0, i)", "larger than input"),
    ("x: f32[4, 3]\ni: i32[2]\nreturn take_along_axis(x, i, axis=0)", "same number of dims"),
    ("x: f32[4, 3]\ni: i32[2]\nj: i32[3]\nreturn x[i, j]", "cannot be broadcast"),
    ("x: f32[0, 3]\ni: i32[2]\nreturn x[i]", "size 0"),
    ("x: f32[6]\nreturn split(x, 4)[0]", "equal sections"),
    ("x: f32[6]\nreturn topk(x, 7)[0]", "out of range"),
    ("x: f32[6]\nreturn gelu(x, approximate='fast')", "approximate"),
    ("x: f32[6]\nreturn einsum('ij->i', x)", "einsum"),
    ("x: f32[6]\nreturn einsum('i->j', x)", "output letter"),
    ("x: f32[6]\ny: f32[5]\nreturn einsum('i,i', x, y)", "sizes"),
    ("x: f32[6]\nreturn einsum(x)", "subscripts first"),
    ("x: f32[6]\nreturn clamp(x)", "min or max"),
    ("x: f32[6]\nreturn tril(x)", "at least 2 dims"),
    ("x: f32[6]\nreturn repeat(x, (1, 2))", "repeats"),
    ("x: f32[6]\ny = 'abc'\nreturn x", "strings are not part"),
    ("x: f32[6]\ni: i32[6]\ns: f32[5]\nreturn scatter_add(x, 0, i, s)", "broadcast"),
    ("x: f32[6]\nreturn cumsum(x, axis=1)", "out of range"),
    ("x: f32[6]\na, b = split(x, 3)\nreturn a", "cannot unpack 3 values into 2 names"),
    ("x: f32[6]\na, b = x\nreturn a", "cannot unpack a tensor"),
    ("x: f32[6]\na, a = split(x, 2)\nreturn a", "appears twice"),
    ("x: f32[6]\nx, b = split(x, 2)\nreturn b", "cannot assign to input"),
])
def test_errors(src, message):
    e = source_error(src)
    assert message in str(e), str(e)
    assert e.line is not None


# ------------------------------------------------------------------------------------------------ baselines

ALL_OPS_SRC = """x: f32[N, M]
i: i32[K]
y = x * 2
return x[i], take(x, i, axis=1), take_along_axis(x, i[None, :] % M, axis=1), \
    scatter_add(x, 1, i[None, :] % M, y[:, :K]), log1p(abs(x)), expm1(x), silu(x), softplus(x), elu(x), \
    leaky_relu(x), atan(x), atan2(x, y + 1), \
    gelu(x, approximate="tanh"), isnan(x), isinf(x), isfinite(x), clamp(x, min=0), zeros_like(x), ones_like(x), \
    full_like(x, 2), x.astype(i32), any(x > 0, axis=1), all(x > -9), tril(x), triu(x, 1), split(x, 2, axis=0)[1], \
    chunk(x, 3, axis=1)[2], repeat(x, 2, axis=1), tile(x, (2, 1)), cumsum(x, axis=1), cumprod(x, axis=0), \
    einsum('ij,kj->ik', x, y), sort(x), argsort(x, axis=0), topk(x, 2)[0], topk(x, 2)[1], x[[1, -1]], \
    gather(x, 1, i[None, :2] + 0 * i[:3, None])"""


def test_numpy_baseline_matches():
    """tgc/baselines/numpy_eval.py (the `--vs numpy` baseline) computes every new function like tgc does."""
    rng = np.random.default_rng(22)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    i = np.array([0, -1, 3, 9], np.int32)
    prog = tgc.loads(ALL_OPS_SRC)
    want = prog.run(device="CPU", x=x, i=i)
    got = numpy_program(prog, {})({"x": x, "i": i})
    assert list(got) == list(want)
    for name in want:
        g = np.asarray(got[name])
        assert g.shape == want[name].shape, name
        if want[name].dtype.kind in "biu":
            np.testing.assert_array_equal(g, want[name], err_msg=name)
        else:
            np.testing.assert_allclose(g, want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_reference_matches():
    """The float64 reference (`tgc run --check`) evaluates the GATHER node of every indexing form."""
    rng = np.random.default_rng(23)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    i = np.array([0, -1, 3, 9], np.int32)
    prog = tgc.loads(ALL_OPS_SRC)
    want = prog.run(device="CPU", x=x, i=i)
    ref = prog.reference(x=x, i=i)
    for name in want:
        r = np.asarray(ref[name], np.float64)
        np.testing.assert_allclose(r, want[name].astype(np.float64), rtol=1e-4, atol=1e-5, err_msg=name)


# ------------------------------------------------------------------------------------------------ fuzzer

FUZZ_OPS = {
    # name: (tgc expression of x (and i, an i32 index vector), numpy of x, i (with the index rule))
    "gather_rows": ("x[i]", lambda x, i: x[clamp_index(i, x.shape[0])]),
    "take_cols": ("take(x, i, axis=1)", lambda x, i: x[:, clamp_index(i, x.shape[1])]),
    "take_flat": ("take(x, i)", lambda x, i: x.reshape(-1)[clamp_index(i, x.size)]),
    "along": ("take_along_axis(x, i[None, :] + 0 * x[:, :1].astype(i32), axis=1)",
              lambda x, i: np.take_along_axis(x, np.broadcast_to(clamp_index(i, x.shape[1]), (x.shape[0], len(i))), 1)),
    "pair": ("x[i, i]", lambda x, i: x[clamp_index(i, x.shape[0]), clamp_index(i, x.shape[1])]),
    "cumsum0": ("cumsum(x, axis=0)", lambda x, i: np.cumsum(x, axis=0)),
    "cumsum1": ("cumsum(x, axis=1)", lambda x, i: np.cumsum(x, axis=1)),
    "sort1": ("sort(x, axis=1)", lambda x, i: np.sort(x, axis=1, kind="stable")),
    "argsort0": ("argsort(x, axis=0)", lambda x, i: np.argsort(x, axis=0, kind="stable")),
    "topk": ("topk(x, 1)[1]", lambda x, i: np.argsort(~x if x.dtype.kind != "f" else -x, axis=1, kind="stable")[:, :1]),
    "tril": ("tril(x, -1)", lambda x, i: np.tril(x, -1)),
    "tile": ("tile(x, (1, 2))", lambda x, i: np.tile(x, (1, 2))),
    "repeat": ("repeat(x, 2, axis=0)", lambda x, i: np.repeat(x, 2, axis=0)),
    "einsum": ("einsum('ij,ij->j', x, x)", lambda x, i: np.einsum("ij,ij->j", x, x)),
    "any": ("any(x > 1, axis=0)", lambda x, i: np.any(x > 1, axis=0)),
}


@pytest.mark.parametrize("seed", range(6))
def test_fuzz_new_ops(device, seed):
    """Random odd shapes, dtypes and index vectors; each case chains two of the new ops through a gather
    or a scan, and checks every op against its numpy twin above."""
    rng = np.random.default_rng(100 + seed)
    dt = ["i32", "i16", "f32", "f64", "u8", "i64"][seed]
    n, m, k = (int(v) for v in rng.integers(1, 12, 3))
    x = rand(rng, (n, m), dt, -20, 20)
    if is_float(dt):  # distinct values keep sorts exact under float ties
        x = (x + rng.permutation(n * m).reshape(n, m) * 1e-3).astype(NP[dt])
    i = rng.integers(-2 * max(n, m), 2 * max(n, m), k).astype(np.int32)
    names = list(FUZZ_OPS)
    picked = list(rng.choice(names, 6, replace=False))
    src = f"x: {dt}[N, M]\ni: i32[K]\nreturn " + ", ".join(FUZZ_OPS[nm][0] for nm in picked)
    out = run(src, device, x=x, i=i)
    for (_name, got), nm in zip(out.items(), picked):
        w = FUZZ_OPS[nm][1](x, i)
        if nm in ("cumsum0", "cumsum1") or nm == "einsum":
            w = np.asarray(w).astype(np.float64 if is_float(dt) else NP[_scan_dtype(dt)])
            assert_result(got, w, _scan_dtype(dt) if nm != "einsum" else dt,
                          scale=float(np.abs(x).sum(dtype=np.float64)) + 1)
        elif nm in ("argsort0", "topk"):
            assert_exact(got, w, "i32")
        elif nm == "any":
            assert_exact(got, w, "bool")
        else:
            assert_result(got, w, dt)


def test_sharded_gather_scan_and_sort():
    """On two CPU devices with the inputs split: a GATHER reads its values at data-dependent places, so the
    placement computes it whole on every device (tgc/engine/multi.py); scans and sorts along the split axis."""
    rng = np.random.default_rng(25)
    x = rng.standard_normal((7, 5)).astype(np.float32)
    ids = rng.integers(-9, 9, (4, 3)).astype(np.int32)
    src = "x: f32[V, D]\nids: i32[B, T]\nreturn x[ids], cumsum(x, axis=0), sort(x, axis=0), take(x, ids, axis=1)"
    out = tgc.loads(src).run(device="CPU:0,CPU:1", x=x, ids=ids, shard={"x": 0, "ids": 0})
    assert_close(out["out0"], x[clamp_index(ids, 7)], "f32")
    assert_close(out["out1"], np.cumsum(x.astype(np.float64), axis=0), "f32", scale=10.0)
    assert_close(out["out2"], np.sort(x, axis=0), "f32")
    assert_close(out["out3"], x[:, clamp_index(ids, 5)], "f32")
