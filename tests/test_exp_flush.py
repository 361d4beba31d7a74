"""f32 exp2 flushes results below 2**-126 to 0 on every device (tgc/codegen/transcendental.py, tgc/ir/alu.py,
cstyle's `exp2_flushed`), and exp, sigmoid, tanh, gelu and softmax built on it agree with numpy over the whole
f32 range: the denormal band of inputs and of results, +-inf, nan, the largest finite values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from langkit import run

from tgc.dtype import dtypes
from tgc.ir import alu
from tgc.ir.uop import Ops

TINY = 2.0 ** -126  # f32's smallest normal
LOG2E = np.float32(1 / math.log(2))
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _whole_range() -> np.ndarray:
    """Both signs of 0, denormals, normals up to the largest f32, the infinities and nan, and dense samples
    where exp's results cross into the denormal band (x near -87.3 .. -103.3) and where they overflow."""
    mags = np.logspace(-45, 38.5, 301).astype(np.float32)
    band = np.linspace(-104.0, -86.0, 400, dtype=np.float32)
    special = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, TINY, -TINY, 3.4028235e38, -3.4028235e38,
                        np.inf, -np.inf, np.nan, 88.0, 88.5, -126.0, -127.0, -149.0, -150.0], np.float32)
    x = np.concatenate([mags, -mags, band, special]).astype(np.float32)
    return x[~((np.abs(x) > 88.6) & (np.abs(x) < 88.8))]  # exp's f32 overflow edge: inf vs max by one ulp


def _check(got: np.ndarray, want: np.ndarray, rtol: float, atol: float, what: str) -> None:
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{what}: nan positions")
    inf = np.isinf(w)
    np.testing.assert_array_equal(g[inf], w[inf], err_msg=f"{what}: infinities")
    ok = ~np.isnan(w) & ~inf
    with np.errstate(invalid="ignore"):
        bad = ok & ~(np.abs(g - w) <= rtol * np.abs(w) + atol)
    assert not bad.any(), f"{what}: got {g[bad][:5]}, want {w[bad][:5]} at x index {np.argwhere(bad)[:5].ravel()}"


def _no_denormals(out: np.ndarray, what: str) -> None:
    a = np.abs(out.astype(np.float64))
    bad = (a > 0) & (a < TINY)
    assert not bad.any(), f"{what}: denormal results {out[bad][:5]}"


def test_alu_exp2_flushes_f32_only():
    x = np.array([-125.5, -126.0, -126.0001, -140.0, -149.0, -np.inf, np.nan, 0.0, 126.0, 128.0], np.float32)
    with np.errstate(over="ignore"):
        got = alu.exec_alu(Ops.EXP2, dtypes.f32, [x])
        want = np.exp2(x.astype(np.float64))
        want[want < TINY] = 0
        np.testing.assert_array_equal(got, want.astype(np.float32))  # (2**128: inf in f32)
    assert alu.exec_alu(Ops.EXP2, dtypes.f64, [np.array([-1070.0])])[0] == 2.0 ** -1070  # f64 keeps its denormals


def test_exp2_normal_results_exact_at_integers_and_close_between(device):
    ints = np.arange(-126, 127, dtype=np.float32)  # (numpy's f32 exp2(127), PYTHON's, is 1 ulp off)
    fracs = np.random.default_rng(3).uniform(-126, 128, 500).astype(np.float32)
    x = np.concatenate([ints, fracs, np.array([-126.5, -127.0, -200.0, 128.0, 1000.0, -np.inf, np.inf, np.nan],
                                              np.float32)])
    out = run(f"x: f32[{x.size}]\nreturn exp2(x)", device, x=x)["out0"]
    np.testing.assert_array_equal(out[:ints.size], np.exp2(ints.astype(np.float64)).astype(np.float32))
    _check(out[ints.size:ints.size + 500], np.exp2(fracs.astype(np.float64)), 4e-7, 0, "exp2 between integers")
    np.testing.assert_array_equal(out[-8:], np.array([0, 0, 0, np.inf, np.inf, 0, np.inf, np.nan], np.float32))


def test_exp_flushes_exactly_where_its_exp2_argument_is_below_minus_126(device):
    x = _whole_range()
    out = run(f"x: f32[{x.size}]\nreturn exp(x)", device, x=x)["out0"]
    with np.errstate(over="ignore", invalid="ignore"):
        arg = x * LOG2E  # the f32 product every device computes (exp(x) = exp2(x log2 e))
        want = np.exp(x.astype(np.float64)).astype(np.float32).astype(np.float64)  # past f32's range: inf
    finite = np.isfinite(arg)
    np.testing.assert_array_equal(out[finite & (arg < -126)], 0)
    assert (out[finite & (arg >= -126)] >= TINY).all()
    _no_denormals(out, "exp")
    want[want < TINY] = 0
    _check(out, want, 1e-5, TINY, "exp")


@pytest.mark.parametrize("fn", ["sigmoid", "tanh", "gelu", "erf"])
def test_activations_over_the_whole_range(device, fn):
    x = _whole_range()
    out = run(f"x: f32[{x.size}]\nreturn {fn}(x)", device, x=x)["out0"]
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        want = {"sigmoid": lambda: 1 / (1 + np.exp(-x64)), "tanh": lambda: np.tanh(x64),
                "gelu": lambda: 0.5 * x64 * (1 + _erf(x64 / math.sqrt(2))), "erf": lambda: _erf(x64)}[fn]()
    _check(out, want, 1e-4, 1e-6, fn)
    if fn == "erf":  # the rational form is accurate relatively too, down to tiny normal arguments
        small = np.abs(x) > 1e-30
        _check(out[small], want[small], 1e-6, 0, "erf, relative")
    if fn == "gelu":  # the erf's exp(-x^2/2) is 0, not a denormal, for |x| past ~13.2
        big = np.isfinite(x) & (x < -14)
        np.testing.assert_array_equal(out[big], 0)


def test_softmax_rows_with_wide_spreads(device):
    rows = np.array([[0.0, -50.0, -87.0, -87.5, -90.0, -103.0, -104.0, -200.0],
                     [10.0, 9.0, -80.0, -95.0, -1e30, -3e38, 0.0, 1.0],
                     [0.0, -np.inf, -np.inf, 5.0, -1e-40, 1e-40, -np.inf, -86.0]], np.float32)
    out = run("x: f32[3, 8]\nreturn softmax(x, -1)", device, x=rows)["out0"]
    x64 = rows.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    want = e / e.sum(-1, keepdims=True)
    _check(out, want, 1e-5, TINY, "softmax")
    with np.errstate(over="ignore"):
        flushed = np.float32(rows - rows.max(-1, keepdims=True)) * LOG2E < -126
        np.testing.assert_array_equal(out[flushed], 0)


@pytest.mark.parametrize("scale", [1.0, 20.0])
def test_gelu_epilogue_of_a_matmul(device, scale):
    """GELU as a matmul tile's epilogue (vectors over the tile on the CPU), at unit and 20x input scale (the
    erf's exp was in the denormal band there) against numpy."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((37, 64)) * scale).astype(np.float32)
    w = (rng.standard_normal((64, 48)) / 8).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    out = run("x: f32[37, 64]\nw: f32[64, 48]\nb: f32[48]\nreturn gelu(x @ w + b)", device, x=x, w=w, b=b)["out0"]
    y = x.astype(np.float64) @ w.astype(np.float64) + b
    _check(out, 0.5 * y * (1 + _erf(y / math.sqrt(2))), 1e-4, 1e-4 * scale, "gelu epilogue")
