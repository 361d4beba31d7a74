"""numpy's results where nan, zero divisors, infinities or a large quotient decide them: argmax/argmin (the
first nan wins), sign(nan) = nan, float % and // (numpy's mod and floor_divide, from fmod). Expectations are
numpy's own results, on every device of TGC_TEST_DEVICES."""

from __future__ import annotations

import numpy as np
import pytest
from langkit import assert_exact, run

NAN, INF = np.nan, np.inf

ROWS = np.array([[1, NAN, 3, 2], [2, 1, 0, 2], [3, 1, NAN, NAN], [NAN, NAN, NAN, NAN], [-INF, -INF, -INF, -INF],
                 [INF, NAN, INF, 0], [0, -1, -1, 0], [-INF, 5, NAN, 5]], np.float32)


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_argmax_argmin_first_nan_wins(device, dt):
    x = ROWS.astype(np.float16 if dt == "f16" else np.float32)
    out = run(f"x: {dt}[8, 4]\nreturn x.argmax(axis=1), x.argmin(axis=1), argmax(x, axis=0), argmin(x, axis=0), "
              "argmax(x), argmin(x)", device, x=x)
    assert_exact(out["out0"], np.argmax(x, axis=1), "i32")
    assert_exact(out["out1"], np.argmin(x, axis=1), "i32")
    assert_exact(out["out2"], np.argmax(x, axis=0), "i32")
    assert_exact(out["out3"], np.argmin(x, axis=0), "i32")
    assert_exact(out["out4"], np.argmax(x), "i32")
    assert_exact(out["out5"], np.argmin(x), "i32")


def test_argmax_long_rows_with_nan(device):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 300)).astype(np.float32)
    x[0, 250] = NAN
    x[1, 7], x[1, 200] = NAN, NAN
    x[2, 299] = NAN
    x[3, :] = NAN
    x[4, 100] = INF  # no nan: the first maximum, as before
    out = run("x: f32[6, 300]\nreturn x.argmax(axis=1), x.argmin(axis=1)", device, x=x)
    assert_exact(out["out0"], np.argmax(x, axis=1), "i32")
    assert_exact(out["out1"], np.argmin(x, axis=1), "i32")


def test_argmax_of_ints_unchanged(device):
    x = np.array([[3, -1, 3], [-5, -5, -7]], np.int32)
    out = run("x: i32[2, 3]\nreturn x.argmax(axis=1), x.argmin(axis=1)", device, x=x)
    assert_exact(out["out0"], np.argmax(x, axis=1), "i32")
    assert_exact(out["out1"], np.argmin(x, axis=1), "i32")


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_sign_of_nan_is_nan(device, dt):
    x = np.array([NAN, -2, 0, 3, -0.0, INF, -INF, 1e-30], np.float16 if dt == "f16" else np.float32)
    out = run(f"x: {dt}[8]\nreturn sign(x)", device, x=x)
    assert_exact(out["out0"], np.sign(x), dt)


def _divmod_operands(np_dt):
    rng = np.random.default_rng(1)  # (1e30 is inf in f16, as numpy casts it)
    a = np.concatenate([[123456.7, -123456.7, 7.5, -7.5, 7.5, -7.5, 5, -5, 0, -0.0, 1, -1, INF, -INF, NAN, 3, 1e30,
                         -1e30, 6, -6, 0.3, 1e-3],
                        rng.uniform(-1e4, 1e4, 40), rng.uniform(-3, 3, 40)])
    b = np.concatenate([[0.1, 0.1, 2, 2, -2, -2, 0, 0, 3, 3, INF, INF, 1, 1, 2, NAN, 7e-3, 3.3, 3, -3, 0.1, -7],
                        rng.uniform(-3, 3, 40), rng.uniform(-1e4, 1e4, 40)])
    with np.errstate(over="ignore"):
        return a.astype(np_dt), b.astype(np_dt)


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_float_mod_and_floordiv_are_numpys(device, dt):
    np_dt = np.float16 if dt == "f16" else np.float32
    a, b = _divmod_operands(np_dt)
    if dt == "f16":
        a[0], a[1], a[16], a[17] = 12345.7, -12345.7, 6e4, -6e4  # within f16's range
    n = len(a)
    out = run(f"a: {dt}[{n}]\nb: {dt}[{n}]\nreturn a % b, a // b, a % 0.1, 123456.7 % b", device, a=a, b=b)
    with np.errstate(all="ignore"):
        assert_exact(out["out0"], np.mod(a, b), dt)
        assert_exact(out["out1"], np.floor_divide(a, b), dt)
        assert_exact(out["out2"], np.mod(a, np_dt(0.1)), dt)
        assert_exact(out["out3"], np.mod(np_dt(123456.7), b), dt)
    if dt == "f32":
        assert out["out0"][0] == np.float32(0.0012853518)  # the brief's case: x - floor(x / y) * y gave 0


def test_sigmoid_gives_no_denormal(device):
    x = np.array([-88, -87.5, -87.3, -88.7, -89, -100, -1e4, -87, -80, -5, 0, 5, 88, 1e4, NAN, -INF, INF],
                 np.float32)
    out = run("x: f32[17]\nreturn sigmoid(x), tanh(x), silu(x)", device, x=x)
    with np.errstate(over="ignore"):
        want = 1 / (1 + np.exp(-x.astype(np.float64)))
    got = out["out0"]
    tiny = np.abs(got) < 2.0 ** -126
    assert np.all(got[tiny] == 0), got  # results below f32's smallest normal are 0, as exp2's are
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=2.0 ** -126)
    assert got[7] >= 2.0 ** -126  # -87: 1.6e-38, a normal result, is kept
    np.testing.assert_allclose(out["out1"], np.tanh(x.astype(np.float64)), rtol=1e-6, atol=1e-6)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(out["out2"], x * want, rtol=1e-6, atol=1e-30)  # silu(-inf) = -inf * 0: nan


def test_a_nan_constant_keeps_the_graph_equal_to_itself():
    # (a symbolic run below the trusted size compares the graph traced there with the plan's: NaN == NaN is
    # False, so a NaN constant made every such graph "differ" and the check stopped before the kernels)
    import tgc
    from tgc.codegen import sizes

    prog = tgc.loads("x: f32[N, D]\nreturn where(x > 0, x, nan) * 2\n")
    sig = [sizes.graph_signature(prog._trace({"N": 5, "D": 7})[0]) for _ in range(2)]
    assert any(isinstance(a, float) and a != a for r in sig[0][:-1] for a in (r[2] if isinstance(r[2], tuple)
                                                                             else (r[2],)))
    assert sig[0] == sig[1] and sizes.same_graph(sig[0], sig[1])
    x = np.array([[1, -1, NAN, 0, 2, -3, 4]] * 5, np.float32)
    got = prog.run(x=x, symbolic=True)["out0"]
    np.testing.assert_array_equal(got, np.where(x > 0, x, NAN) * 2)
    assert "operations differ" not in prog.last_run
