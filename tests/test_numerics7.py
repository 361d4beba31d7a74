"""numpy's results at the edges of the numerics (float % and //, signed zeros, nan and inf constants), on CPU,
OPENCL (PoCL) and PYTHON, each where it runs here. Expectations are numpy's own results, compared bit for bit
(signed zeros included)."""

from __future__ import annotations

import numpy as np
import pytest
from langkit import device_skip_reason

import tgc

NAN, INF = np.nan, np.inf
DEVICES = ["CPU", "OPENCL", "PYTHON"]


def _run(src: str, device: str, **inputs) -> dict[str, np.ndarray]:
    why = device_skip_reason(device)
    if why:
        pytest.skip(why)
    return tgc.loads(src).run(device, **inputs)


def _same(got, want) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_array_equal(got, want)
    real = ~np.isnan(want) if want.dtype.kind == "f" else np.ones(want.shape, bool)  # (a nan's sign is not numpy's)
    assert np.array_equal(np.signbit(got[real]), np.signbit(want[real])), (got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_f64_mod_by_infinite_and_nan_constants(device):
    """An f64 program with an inf or nan constant: OpenCL C's INFINITY and NAN are floats, so `fmod(x, INFINITY)`
    on a double did not compile on PoCL (call to fmod is ambiguous)."""
    a = np.array([1.0, -2.0, 5.0, -0.0, 0.0, INF, NAN], np.float64)
    out = _run("a: f64[7]\nreturn a % inf, a // -inf, a % nan, a % -inf", device, a=a)
    with np.errstate(all="ignore"):
        _same(out["out0"], np.mod(a, INF))
        _same(out["out1"], np.floor_divide(a, -INF))
        _same(out["out2"], np.mod(a, NAN))
        _same(out["out3"], np.mod(a, -INF))


@pytest.mark.parametrize("dt", ["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("device", DEVICES)
def test_where_with_a_negative_zero_arm(device, dt):
    """`where(x < 0, -0.0, x)` keeps x = +0.0 as +0.0 (numpy): PoCL compiled `x < 0 ? -0.0f : x` as a min that
    gave -0.0 there."""
    t = np.float16 if dt == "f16" else np.float64 if dt == "f64" else np.float32
    x = np.array([0.0, -0.0, 1.0, -1.0, 2.5, -2.5, INF, -INF], t)
    z = t(-0.0)
    out = _run(f"x: {dt}[8]\nreturn where(x < 0, -0.0, x), where(x > 0, -0.0, x), where(x < 0, x, -0.0), "
               "where(x > 0, 0.0, x)", device, x=x)
    _same(out["out0"], np.where(x < 0, z, x))
    _same(out["out1"], np.where(x > 0, z, x))
    _same(out["out2"], np.where(x < 0, x, z))
    _same(out["out3"], np.where(x > 0, t(0.0), x))


@pytest.mark.parametrize("device", DEVICES)
def test_arithmetic_of_literals_is_a_weak_literal(device):
    """`x * (0.1 + 0.2)` and `x * (1 / 3)` on f16 are numpy's `x16 * (0.1 + 0.2)`: Python's float, weak, so the
    result stays f16; they were f32 constants (strong), so the result was f32 and `x != 1/3` compared in f32."""
    x = np.array([0.333251953125, 0.1, -3.0, 65504.0, 0.0], np.float16)
    out = _run("x: f16[5]\nreturn x * (0.1 + 0.2), x * (1 / 3), x != 1 / 3, x - (2.5 - 0.4) * 2, x * (2 * 3)",
               device, x=x)
    with np.errstate(over="ignore"):
        _same(out["out0"], x * (0.1 + 0.2))
        _same(out["out1"], x * (1 / 3))
        _same(out["out2"], x != 1 / 3)
        _same(out["out3"], x - (2.5 - 0.4) * 2)
        _same(out["out4"], x * (2 * 3))


@pytest.mark.parametrize("device", DEVICES)
def test_clip_keeps_nan(device):
    """`clip(x, lo, hi)` of a nan is nan, as numpy's clip (and the library's clamp): on CPU the max against lo
    turned a nan into lo. Tensor bounds, broadcast ones and int inputs unchanged."""
    x = np.array([NAN, -5.0, 0.5, 7.0, -INF, INF, NAN, 1.0], np.float32)
    lo = np.array([-1.0, -2.0, 0.0, 2.0, -3.0, -1.0, 0.0, NAN], np.float32)
    i = np.array([-9, 0, 3, 9, 1, 2, -1, 5], np.int32)
    out = _run("x: f32[8]\nlo: f32[8]\ni: i32[8]\nreturn clip(x, -1, 1), clip(x, lo, 3.0), x.clip(0, 0), "
               "clip(i, -2, 4), clip(x[None, :], -1, 1)", device, x=x, lo=lo, i=i)
    _same(out["out0"], np.clip(x, -1, 1))
    want = np.clip(x, lo, np.float32(3.0))
    got = out["out1"]
    # numpy's clip against a nan bound is nan; only x's nans are promised here (maximum's nan is unspecified)
    real = ~np.isnan(lo)
    _same(got[real], want[real])
    _same(out["out2"], np.clip(x, 0, 0))
    _same(out["out3"], np.clip(i, -2, 4))
    _same(out["out4"], np.clip(x[None, :], -1, 1))


@pytest.mark.parametrize("device", DEVICES)
def test_literal_arithmetic_that_overflows_is_a_weak_inf(device):
    """`x_f16 * (1e300 * 1e300)` is numpy's `x16 * inf` (Python's float overflowed): f16, as `x * inf`; it was an
    f32 constant, so the result was f32."""
    x = np.array([1.0, -2.0, 0.0, NAN], np.float16)
    out = _run("x: f16[4]\nreturn x * (1e300 * 1e300), x + (-1e300 * 1e300), x * (1e300 * 1e300 - 1e300 * 1e300)",
               device, x=x)
    with np.errstate(all="ignore"):
        inf = 1e300 * 1e300
        _same(out["out0"], x * inf)
        _same(out["out1"], x + (-inf))
        _same(out["out2"], x * (inf - inf))
