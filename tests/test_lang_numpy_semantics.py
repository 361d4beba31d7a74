"""numpy's semantics where tgc used to differ (issue 22, item 4): integer matmul multiplies in its result type,
`var`/`std` default to numpy's ddof=0 and take `ddof=` (and torch's `correction=`), did-you-mean only for
close matches. Expectations are numpy's own results or exact values."""

from __future__ import annotations

import numpy as np
import pytest
from langkit import assert_close, assert_exact, run, source_error

from tgc.errors import close_match, edit_distance


@pytest.mark.parametrize("dt, wide", [("i8", np.int32), ("u8", np.uint32), ("i16", np.int32), ("bool", np.int32)])
def test_small_int_matmul_multiplies_in_its_result_type(device, dt, wide):
    np_dt = {"i8": np.int8, "u8": np.uint8, "i16": np.int16, "bool": np.bool_}[dt]
    a = np.full((3, 64), 1 if dt == "bool" else 100, np_dt)
    b = np.full((64, 2), 1 if dt == "bool" else 100, np_dt)
    out = run(f"a: {dt}[M, K]\nb: {dt}[K, N]\nreturn a @ b, matmul(a[0], b[:, 0])", device, a=a, b=b)
    want = np.matmul(a.astype(np.int64), b.astype(np.int64))
    assert want.max() == (640000 if dt != "bool" else 64)  # 100 * 100 * 64: far outside i8 (wrapped, 1024)
    assert_exact(out["out0"], want.astype(wide), "i32" if wide is np.int32 else "u32")
    assert_exact(out["out1"], want[0, 0].astype(wide), "i32" if wide is np.int32 else "u32")


def test_int_matmul_still_wraps_in_i32(device):
    a = np.full((1, 4), 1 << 30, np.int32)
    out = run("a: i32[1, 4]\nb: i32[4, 1]\nreturn a @ b", device, a=a, b=a.T.copy())
    assert_exact(out["out0"], np.matmul(a, a.T), "i32")  # numpy's wrapped int32 result


def test_var_std_take_ddof_and_correction(device):
    x = np.array([[1.0, 2.0, 4.0, 7.0], [0.5, -1.0, 3.0, 2.5]], np.float32)
    out = run("x: f32[2, 4]\nreturn var(x, axis=1), std(x, axis=1, ddof=1), x.var(ddof=2), "
              "x.std(axis=0, correction=1), var(x, 1, False, 1)", device, x=x)
    v = x.astype(np.float64)
    assert_close(out["out0"], np.var(v, axis=1), "f32")
    assert_close(out["out1"], np.std(v, axis=1, ddof=1), "f32")
    assert_close(out["out2"], np.var(v, ddof=2), "f32")
    assert_close(out["out3"], np.std(v, axis=0, ddof=1), "f32")
    assert_close(out["out4"], np.var(v, axis=1, ddof=1), "f32")


@pytest.mark.parametrize("call, msg", [
    ("var(x, ddof=1, correction=1)", "give ddof= or correction= (torch's name for it), not both"),
    ("var(x, ddof=-1)", "ddof must be a non-negative integer, got -1"),
    ("std(x, correction=0.5)", "correction must be a non-negative integer, got 0.5"),
    ("var(x, dof=1)", "var(): got an unexpected keyword argument 'dof'"),
])
def test_var_argument_errors(call, msg):
    e = source_error(f"x: f32[4]\nreturn {call}")
    assert e.msg == msg and e.line == 2 and e.exit_code == 2


def test_numpy_baseline_agrees_on_int_matmul_and_var():
    import tgc
    from tgc.baselines.numpy_eval import numpy_program
    prog = tgc.loads("a: i8[M, K]\nb: i8[K, N]\nx: f32[K]\nreturn a @ b, var(x), std(x, ddof=1)")
    a = np.full((2, 64), 100, np.int8)
    x = np.arange(64, dtype=np.float32)
    out = numpy_program(prog, {"M": 2, "K": 64, "N": 2})({"a": a, "b": a.T.copy(), "x": x})
    assert out["out0"].tolist() == [[640000, 640000], [640000, 640000]]
    assert out["out1"] == pytest.approx(np.var(x.astype(np.float64)))
    assert out["out2"] == pytest.approx(np.std(x.astype(np.float64), ddof=1))


@pytest.mark.parametrize("a, b, d", [("maen", "mean", 1), ("cumsum", "sum", 3), ("foo", "floor", 2), ("", "ab", 2),
                                     ("BATHC", "batch", 1), ("kitten", "sitting", 3)])
def test_edit_distance(a, b, d):
    assert edit_distance(a, b) == d


def test_did_you_mean_only_for_close_matches():
    e = source_error("x: f32[4]\nreturn convolve(x)")
    assert e.msg == "unknown function 'convolve'" and e.hint is None  # no 'conv2d'
    e = source_error("x: f32[4]\nreturn foo(x)")
    assert e.msg == "unknown function 'foo'" and e.hint is None  # no 'floor'
    e = source_error("x: f32[4]\nreturn sofmax(x)")
    assert e.hint == "did you mean 'softmax'?"
    e = source_error("x: f32[4]\nreturn x.maen()")
    assert e.hint == "did you mean 'mean'?"
    e = source_error("x: f32[4]\ny = x + 1\nreturn yy")
    assert e.hint == "did you mean 'y'?"
    assert close_match("bar", ["floor", "foo"]) is None


def test_softmax_of_large_logits_keeps_its_largest_element(device):
    # `x * s - max(x * s)` at the largest element is 0 in numpy; fused into an fma on the CPU it was the product's
    # rounding error (~1e3 at 3e10), so every exp underflowed and the softmax was 0 / 0 = nan (SqueezeNet's logits)
    x = (np.random.default_rng(0).standard_normal((2, 1000)) * 10).astype(np.float32)
    out = run("x: f32[2, 1000]\nreturn softmax(x * 1e9, axis=1), exp(x * 3e9 - max(x * 3e9, axis=1, keepdim=True))",
              device, x=x)
    s = x.astype(np.float32) * np.float32(1e9)
    e = np.exp((s - s.max(axis=1, keepdims=True)).astype(np.float64))
    assert_close(out["out0"], e / e.sum(axis=1, keepdims=True), "f32")
    t = x.astype(np.float32) * np.float32(3e9)
    assert_close(out["out1"], np.exp((t - t.max(axis=1, keepdims=True)).astype(np.float64)), "f32")


def test_f16_mean_var_std_compute_in_f32(device):
    """numpy's mean of f16 sums and divides in f32: 4000 values near 20 sum past f16's 65504 but their mean is an
    ordinary f16 number (the f16 sum, numpy's too, is inf). var/std likewise in f32, rounded once."""
    x = (np.random.default_rng(3).standard_normal((2, 4000)) + 20).astype(np.float16)
    out = run("x: f16[2, 4000]\nreturn mean(x, axis=1), var(x, axis=1), std(x, axis=1, ddof=1), sum(x, axis=1), "
              "x.mean()", device, x=x)
    v = x.astype(np.float64)
    for k, want in [("out0", v.mean(1)), ("out1", v.var(1)), ("out2", v.std(1, ddof=1)), ("out4", v.mean())]:
        assert out[k].dtype == np.float16
        np.testing.assert_allclose(out[k].astype(np.float64), want, rtol=2e-3)
    assert np.array_equal(out["out3"], np.full(2, np.inf, np.float16))  # the sum: inf, as numpy's f16 sum


@pytest.mark.parametrize("dt, rtol", [("f32", 1e-6), ("f64", 2e-15)])
def test_tanh_keeps_relative_precision_near_zero(device, dt, rtol):
    """tanh(x) ~ x for small x: 2 sigmoid(2x) - 1 cancelled there (tanh(1e-3) 7e-5 off in f32, tanh(3e-8) = 0)."""
    np_dt = np.float32 if dt == "f32" else np.float64
    x = np.concatenate([np.logspace(-30, 1.3, 400), -np.logspace(-30, 1.3, 400), [0.0, 0.25, -0.25]]).astype(np_dt)
    out = run(f"x: {dt}[{x.size}]\nreturn tanh(x)", device, x=x)
    want = np.tanh(x.astype(np.float64)).astype(np_dt)
    np.testing.assert_allclose(out["out0"].astype(np.float64), want.astype(np.float64), rtol=rtol, atol=0)
