"""Wider memory ops in tile epilogues (`tgc/codegen/widen.py`): scalar stores and loads of one buffer at consecutive
indices become vector ones. The pass on hand-built ASTs (what merges and what must not), the convolution tiles it
changes (16 output channels as lanes, 7 or 8 image columns as copies) against numpy with residual adds, padding,
odd sizes and gated columns, and the LLVM source those tiles get."""

from __future__ import annotations

import numpy as np
import pytest
from convkit import conv_np

import tgc
from tgc.codegen.widen import widen_memory
from tgc.dtype import dtypes
from tgc.engine import schedule
from tgc.ir.uop import Ops, RangeKind, UOp

I32, F32 = dtypes.i32, dtypes.f32


def _c(v: int) -> UOp:
    return UOp.const(I32, v)


def _buf(i: int) -> UOp:
    return UOp(Ops.DEFINE_GLOBAL, F32.as_ptr(), (), i)


def _range(i: int, n: int, kind: RangeKind = RangeKind.LOOP) -> UOp:
    return UOp(Ops.RANGE, I32, (_c(n),), (i, kind))


def _add(a: UOp, b: UOp) -> UOp:
    return UOp(Ops.ADD, a.dtype, (a, b))


def _stores(sink: UOp) -> list[UOp]:
    return [s for s in sink.src if s.op is Ops.STORE]


def test_consecutive_stores_become_one_vector_store_of_any_width():
    out = _buf(0)
    base = UOp(Ops.MUL, I32, (_range(0, 4), _c(16)))
    vals = [UOp.const(F32, float(k)) for k in range(8)]
    # columns 0..6 (a run of 7, listed out of order) and column 9 (apart)
    offsets = [3, 0, 1, 2, 6, 4, 5, 9]
    sink = UOp(Ops.SINK, None, tuple(UOp(Ops.STORE, None, (out, _add(base, _c(o)), vals[k]))
                                     for k, o in enumerate(offsets)))
    got = _stores(widen_memory(sink, (16, 8, 4), any_width=True))
    assert [s.src[2].dtype.count for s in got] == [7, 1]
    wide = got[0]
    assert wide.src[1] is _add(base, _c(0))  # the run's first index
    by_offset = dict(zip(offsets, vals))
    assert list(wide.src[2].src) == [by_offset[o] for o in range(7)]  # lanes in index order
    # a renderer of fixed widths: 4 lanes, the other 3 (and the one apart) scalar
    got = _stores(widen_memory(sink, (16, 8, 4), any_width=False))
    assert sorted(s.src[2].dtype.count for s in got) == [1, 1, 1, 1, 4]


def test_stores_of_other_buffers_gates_or_strides_stay_apart():
    out, other = _buf(0), _buf(1)
    r = _range(0, 8)
    gate = UOp(Ops.CMPLT, dtypes.bool, (r, _c(5)))
    v = UOp.const(F32, 1.0)
    stores = [UOp(Ops.STORE, None, (out, _add(r, _c(0)), v)),  # ungated
              UOp(Ops.STORE, None, (out, _add(r, _c(1)), v, gate)),  # gated: not with the one before
              UOp(Ops.STORE, None, (other, _add(r, _c(2)), v)),  # another buffer
              UOp(Ops.STORE, None, (out, _add(r, _c(3)), v)),  # stride 3 from the first: not consecutive
              UOp(Ops.STORE, None, (out, UOp(Ops.MUL, I32, (r, _c(2))), v))]  # another base
    sink = UOp(Ops.SINK, None, tuple(stores))
    assert widen_memory(sink, (16, 8, 4), any_width=True) is sink


def test_epilogue_loads_merge_and_reduction_loads_stay_scalar():
    out, res, x = _buf(0), _buf(1), _buf(2)
    r, k = _range(0, 4), _range(1, 32, RangeKind.REDUCE)
    base = UOp(Ops.MUL, I32, (r, _c(8)))
    acc = UOp(Ops.REDUCE, F32, (UOp(Ops.LOAD, F32, (x, _add(k, _c(0)))), k), Ops.ADD)  # inside the reduction
    loads = [UOp(Ops.LOAD, F32, (res, _add(base, _c(j)))) for j in range(4)]
    inner = [UOp(Ops.REDUCE, F32, (UOp(Ops.LOAD, F32, (x, _add(k, _c(j)))), k), Ops.ADD) for j in range(4)]
    sink = UOp(Ops.SINK, None, tuple(
        UOp(Ops.STORE, None, (out, UOp(Ops.MUL, I32, (_add(base, _c(j)), _c(3))),
                              _add(_add(loads[j], inner[j]), acc)))
        for j in range(4)))
    got = widen_memory(sink, (16, 8, 4), any_width=True)
    all_loads = [u for u in got.toposort() if u.op is Ops.LOAD]
    wide = [u for u in all_loads if u.src[0] is res]
    assert len(wide) == 1 and wide[0].dtype.count == 4 and wide[0].src[1] is _add(base, _c(0))
    geps = sorted(u.arg for u in got.toposort() if u.op is Ops.GEP)
    assert geps == [0, 1, 2, 3]
    assert all(u.dtype.count == 1 for u in all_loads if u.src[0] is x)  # a reduction's loads: untouched
    # the stores are 3 apart: not merged
    assert [s.src[2].dtype.count for s in _stores(got)] == [1, 1, 1, 1]


def test_loads_of_a_buffer_the_kernel_writes_stay_scalar():
    buf = _buf(0)
    r = _range(0, 4)
    base = UOp(Ops.MUL, I32, (r, _c(8)))
    stores = [UOp(Ops.STORE, None, (buf, _add(base, _c(j + 4)), UOp(Ops.LOAD, F32, (buf, _add(base, _c(j))))))
              for j in range(2)]
    sink = UOp(Ops.SINK, None, tuple(stores))
    got = widen_memory(sink, (16, 8, 4), any_width=True)
    assert all(u.dtype.count == 1 for u in got.toposort() if u.op is Ops.LOAD)
    assert [s.src[2].dtype.count for s in _stores(got)] == [2]


# ------------------------------------------------------------------------------ the convolution tiles it changes


CASES = [  # (N, C, H, W, O, K, stride, padding, residual)
    (1, 16, 14, 14, 32, 3, 1, 1, True),  # ResNet's 3x3 at 14x14: 7 columns a tile, a residual read
    (2, 5, 9, 11, 32, 3, 1, 1, False),  # odd sizes, 3 images' worth of padding
    (1, 8, 13, 13, 32, 3, 1, 1, True),  # 13 columns padded to 14: the extra column's store gated off
    (1, 24, 8, 8, 48, 1, 1, 0, True),  # 1x1 at 8 columns, 3 vectors of channels
    (1, 4, 15, 15, 16, 3, 2, 1, False),  # stride 2, 8 output columns
]


@pytest.fixture
def pack_small(monkeypatch):
    """Pack convolutions of every size (these shapes are below the size where packing pays)."""
    monkeypatch.setattr(schedule, "CONV_MIN_FLOPS", 0)


def _case(case: tuple, seed: int = 0) -> tuple[str, dict[str, np.ndarray], np.ndarray]:
    n, c, h, w, o, k, stride, pad, residual = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((o, c, k, k)).astype(np.float32)
    want = conv_np(x, wt, stride, pad)
    src = f"x: f32[{n}, {c}, {h}, {w}]\nw: f32[{o}, {c}, {k}, {k}]\n"
    inputs = {"x": x, "w": wt}
    conv = f"conv2d(x, w, stride={stride}, padding={pad})"
    if residual:
        r = rng.standard_normal(want.shape).astype(np.float32)
        src += f"r: f32[{', '.join(map(str, want.shape))}]\nreturn relu({conv} + r)"
        inputs["r"] = r
        want = np.maximum(want + r, 0)
    else:
        src += f"return {conv}"
    return src, inputs, want


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:6])) + ("_res" if c[8] else ""))
def test_conv_tiles_against_numpy(case, device, pack_small):
    src, inputs, want = _case(case)
    got = tgc.loads(src).run(device=device, **inputs)["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_conv_tile_writes_each_channel_row_in_vectors(pack_small):
    """The 14x14 tile (2 vectors of 16 channels x 7 columns): each channel's 7 columns stored as 4 lanes and 3
    lanes (the pipeline merges at most `MERGE_MAX_LANES`; LLVM takes any lane count, `memory_any_width`: 3
    scalars per row before, which were half of LLVM's time on such a kernel), the residual read the same way."""
    src, inputs, want = _case(CASES[0])
    kernels = tgc.loads(src).compile(device="CPU", tuned=False)
    conv = kernels[-1].src
    assert conv.count("store <4 x float>") == 32  # once per channel row, once per tile
    assert conv.count("store <3 x float>") == 32
    assert conv.count("store float ") == 0  # was 32 * 7, then 32 * 3
    assert conv.count("load <4 x float>") == conv.count("load <3 x float>") == 32  # the residual
    got = tgc.loads(src).run(device="CPU", **inputs)["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_fixed_width_renderers_keep_the_rest_of_a_row_scalar(pack_small):
    """A renderer without `memory_any_width` (every one but LLVM's) merges only its own widths: rendered so, the
    same tile stores 4 lanes and 3 scalars per channel row, as before."""
    from dataclasses import replace

    from tgc.backends.llvmir import LLVMRenderer

    src, inputs, want = _case(CASES[0])
    fixed = replace(LLVMRenderer.caps, memory_any_width=False)
    renderer_caps = LLVMRenderer.caps
    try:
        LLVMRenderer.caps = fixed
        conv = tgc.loads(src).compile(device="CPU", tuned=False)[-1].src
    finally:
        LLVMRenderer.caps = renderer_caps
    assert conv.count("store <4 x float>") == 32 and conv.count("store float ") == 32 * 3
    assert "<3 x float>" not in conv


def test_a_residual_is_added_in_rows_not_gathered_into_the_columns(pack_small):
    """A residual read in channel rows (4 + 3 lanes) was gathered lane by lane into the tile's 16-lane columns,
    added there, and the sum scattered back into rows for the stores: two transposes. The store's value is now
    computed in the row's orientation (`_stores_in_rows`): the residual row is added as it was loaded, and only the
    accumulators are transposed. Same operations on the same values: the results equal the column form's bit
    for bit (the pass left out), and numpy's."""
    from tgc.codegen import widen

    src, inputs, want = _case(CASES[0])
    conv = tgc.loads(src).compile(device="CPU", tuned=False)[-1].src
    assert conv.count("fadd <4 x float>") == conv.count("fadd <3 x float>") == 32  # one a channel row, a tile
    assert conv.count("extractelement") == 32 * 7  # the accumulators' lanes only (was 32 * 7 twice)
    got = tgc.loads(src).run(device="CPU", **inputs)["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    rows = widen._stores_in_rows
    try:
        widen._stores_in_rows = lambda sink: sink
        columns = tgc.loads(src)
        assert "fadd <4 x float>" not in columns.compile(device="CPU", tuned=False)[-1].src
        np.testing.assert_array_equal(columns.run(device="CPU", **inputs)["out0"], got)
    finally:
        widen._stores_in_rows = rows


def test_rows_leave_stores_without_a_gathered_row_alone():
    """A store of lanes of column vectors with no whole row inside (no residual: the accumulators' lanes through
    lane-wise ops) is left as it is: computing it in rows would only add operations."""
    from tgc.codegen.widen import _stores_in_rows

    out = _buf(0)
    r = _range(0, 4)
    acc = [UOp(Ops.LOAD, F32.vec(16), (_buf(1), _add(UOp(Ops.MUL, I32, (r, _c(64))), _c(16 * j)))) for j in range(4)]
    zero = UOp.const(F32.vec(16), 0.0)
    cols = [UOp(Ops.MAX, F32.vec(16), (a, zero)) for a in acc]
    value = UOp(Ops.VECTORIZE, F32.vec(4), tuple(UOp(Ops.GEP, F32, (c,), 3) for c in cols))
    sink = UOp(Ops.SINK, None, (UOp(Ops.STORE, None, (out, r, value)),))
    assert _stores_in_rows(sink) is sink
    # with a row of 4 gathered from one vector load, the sum is computed in the row
    row = UOp(Ops.LOAD, F32.vec(4), (_buf(2), r))
    gathered = [UOp(Ops.VECTORIZE, F32.vec(16), tuple(UOp(Ops.GEP, F32, (row,), j) if c == 3 else UOp.const(F32, 1.0)
                                                       for c in range(16))) for j in range(4)]
    cols = [UOp(Ops.ADD, F32.vec(16), (a, g)) for a, g in zip(acc, gathered)]
    value = UOp(Ops.VECTORIZE, F32.vec(4), tuple(UOp(Ops.GEP, F32, (c,), 3) for c in cols))
    got = _stores_in_rows(UOp(Ops.SINK, None, (UOp(Ops.STORE, None, (out, r, value)),)))
    stored = got.src[0].src[2]
    assert stored.op is Ops.ADD and stored.dtype == F32.vec(4) and stored.src[1] is row
    assert stored.src[0].op is Ops.VECTORIZE and [g.src[0] for g in stored.src[0].src] == acc


def test_a_long_chain_after_the_residual_stays_in_the_columns(pack_small):
    """Where the row form would add more lane-wise ops than the lane moves it saves (a GELU after the residual:
    each of its ops once per 3-4-lane row instead of once per 16-lane column; the MLP-Mixer's matmul ran 1.3-1.6x
    slower so), the store keeps the column form, and is right."""
    import math

    src, inputs, _ = _case(CASES[0])
    src = src.replace("return relu(", "return gelu(")
    conv = tgc.loads(src).compile(device="CPU", tuned=False)[-1].src
    assert "fadd <4 x float>" not in conv and "fadd <3 x float>" not in conv
    pre = conv_np(inputs["x"], inputs["w"], 1, 1) + inputs["r"]
    want = 0.5 * pre * (1 + np.vectorize(math.erf)(pre / math.sqrt(2)))
    got = tgc.loads(src).run(device="CPU", **inputs)["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
