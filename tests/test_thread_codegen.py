"""The code of a CPU kernel split across threads: the thread index's range and index arithmetic that cannot wrap are
stated to LLVM (`tgc.backends.llvmir._core_mask`, `_no_signed_wrap`), so a split kernel compiles to the loop an
unsplit one does; integer arithmetic that may wrap keeps numpy's wrapping results."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tgc
from tgc.backends.llvmir import _core_mask, _no_signed_wrap
from tgc.dtype import dtypes
from tgc.ir.uop import Ops, RangeKind, UOp

RNG = np.random.default_rng(7)
F32 = np.float32

# a grouped 1x1 convolution (ShuffleNet's): the group of an output channel is a division of the split loop's index
GROUPED = "x: f32[N, C, H, W]\nw: f32[O, C // G, 1, 1]\nreturn relu(conv2d(x, w, groups=G))"


def _grouped_numpy(x: np.ndarray, w: np.ndarray, g: int) -> np.ndarray:
    n, c, h, wd = x.shape
    o = w.shape[0]
    xs = x.reshape(n, g, c // g, h * wd)
    ws = w.reshape(g, o // g, c // g)
    y = np.einsum("gok,ngkp->ngop", ws, xs).reshape(n, o, h, wd)
    return np.maximum(y, 0)


def _sources(src: str, dims: dict[str, int]) -> list:
    return tgc.loads(src).compile(device="CPU", dims=dims)


@pytest.mark.parametrize("threads", [2, 3])
def test_a_split_kernel_states_its_thread_index_range_and_index_math_that_cannot_wrap(threads, monkeypatch):
    monkeypatch.setenv("TGC_THREADS", str(threads))
    dims = {"N": 1, "C": 136, "H": 28, "W": 28, "O": 136, "G": 4}
    kernels = _sources(GROUPED, dims)
    split = [k for k in kernels if k.global_size[0] > 1]
    assert split, [k.global_size for k in kernels]
    mask = (1 << (threads - 1).bit_length()) - 1
    for k in split:
        assert re.search(rf"^  %core = and i32 %core_id, {mask}$", k.src, re.M), k.src[:2000]
        # the thread index itself is used only through %core (its only use is that AND)
        body = k.src.split("{", 1)[1]
        assert body.count("%core_id") == 1
        index_ops = re.findall(r"= (add|mul|sub)( nuw)?( nsw)? i32 ", body)
        assert index_ops and all(nsw for _, _, nsw in index_ops), "an i32 index op without nsw"


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_split_grouped_convolution_is_right(threads, monkeypatch):
    """17 rows of 8 channels over 2 or 3 threads: chunks of unequal length (the last thread's loop is shorter)."""
    monkeypatch.setenv("TGC_THREADS", str(threads))
    x = RNG.standard_normal((1, 136, 28, 28)).astype(F32)
    w = RNG.standard_normal((136, 34, 1, 1)).astype(F32)
    prog = tgc.loads(GROUPED)
    if threads > 1:
        assert max(k.global_size[0] for k in prog.lower("CPU", {"N": 1, "C": 136, "H": 28, "W": 28, "O": 136,
                                                                  "G": 4}).kernels) == threads
    for _ in range(2):  # once, then as a launch plan's graph
        out = prog.run(x=x, w=w, dims={"G": 4})
        np.testing.assert_allclose(out["out0"], _grouped_numpy(x, w, 4), rtol=1e-4, atol=1e-4)


def test_integer_arithmetic_that_may_wrap_wraps_as_numpy_does(monkeypatch):
    """Products and sums of loaded int32 values are not marked: they wrap, as numpy's do."""
    monkeypatch.setenv("TGC_THREADS", "2")
    a = RNG.integers(-2**31, 2**31 - 1, size=(4096, 64), dtype=np.int32)
    b = RNG.integers(-2**31, 2**31 - 1, size=(4096, 64), dtype=np.int32)
    src = "a: i32[N, D]\nb: i32[N, D]\nreturn a * b + a - b, a * 1000003 + 2147483000"
    kernels = _sources(src, {"N": 4096, "D": 64})
    assert max(k.global_size[0] for k in kernels) == 2
    # the products of loaded values stay unmarked (a scalar or vector multiply without nsw)
    assert all(re.search(r"= mul (<\d+ x i32>|i32) ", k.src) for k in kernels)
    out = tgc.loads(src).run(a=a, b=b)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out["out0"], a * b + a - b)
        np.testing.assert_array_equal(out["out1"], a * np.int32(1000003) + np.int32(2147483000))


def _range(n: int, i: int = 0) -> UOp:
    return UOp(Ops.RANGE, dtypes.i32, (UOp.const(dtypes.i32, n),), (i, RangeKind.LOOP))


def test_no_signed_wrap_follows_the_bounds():
    r = _range(1000)
    core = UOp(Ops.DEFINE_VAR, dtypes.i32, (), ("core_id", 0, 1))
    row = core * UOp.const(dtypes.i32, 500) + r
    assert _no_signed_wrap(row) and _no_signed_wrap(row * UOp.const(dtypes.i32, 4096))
    assert not _no_signed_wrap(row * UOp.const(dtypes.i32, 1 << 22))  # 1500 * 2^22 passes 2^31
    loaded = UOp(Ops.LOAD, dtypes.i32, (UOp(Ops.DEFINE_GLOBAL, dtypes.i32.as_ptr(), (), 0), r))
    assert not _no_signed_wrap(loaded + UOp.const(dtypes.i32, 1))  # a loaded value: its whole range
    assert not _no_signed_wrap(UOp(Ops.ADD, dtypes.u32, (UOp.const(dtypes.u32, 1), UOp.const(dtypes.u32, 2))))
    wide = UOp(Ops.ADD, dtypes.i64, (UOp(Ops.RANGE, dtypes.i64, (UOp.const(dtypes.i64, 1 << 40),), (0, RangeKind.LOOP)),
                                     UOp.const(dtypes.i64, 1)))
    assert _no_signed_wrap(wide)


def test_core_mask_covers_the_thread_indices_only():
    def var(name: str, lo: int, hi: int) -> UOp:
        return UOp(Ops.DEFINE_VAR, dtypes.i32, (), (name, lo, hi))
    assert [_core_mask(var("core_id", 0, hi)) for hi in (1, 2, 3, 4, 7, 8)] == [1, 3, 3, 7, 7, 15]
    assert all(c & m == c for hi in range(1, 70) for m in [_core_mask(var("core_id", 0, hi))]
               for c in range(hi + 1))
    assert _core_mask(var("N", 1, 64)) is None  # a dim's variable comes from the user's sizes: left as it is
