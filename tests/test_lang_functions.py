"""Elementwise functions and reductions of the `.tg` language against numpy (float64 references)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from langkit import (
    ALL,
    FLOATS,
    INTS,
    NP,
    SIGNED,
    assert_close,
    assert_exact,
    assert_result,
    int_range,
    is_float,
    rand,
    run,
    run1,
    to_dtype,
    wrap,
)

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


# name -> (numpy reference, input range)
UNARY = {
    "exp": (np.exp, (-4, 4)),
    "log": (np.log, (0.1, 8)),
    "exp2": (np.exp2, (-4, 4)),
    "log2": (np.log2, (0.1, 8)),
    "sqrt": (np.sqrt, (0, 8)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), (0.1, 8)),
    "sin": (np.sin, (-6, 6)),
    "cos": (np.cos, (-6, 6)),
    "tan": (np.tan, (-1.4, 1.4)),
    "tanh": (np.tanh, (-5, 5)),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), (-8, 8)),
    "relu": (lambda x: np.maximum(x, 0), (-4, 4)),
    "gelu": (_gelu, (-5, 5)),
    "abs": (np.abs, (-4, 4)),
    "sign": (np.sign, (-4, 4)),
    "recip": (lambda x: 1 / x, (0.25, 4)),
    "floor": (np.floor, (-4, 4)),
    "ceil": (np.ceil, (-4, 4)),
    "trunc": (np.trunc, (-4, 4)),
    "round": (np.round, (-4, 4)),
    "square": (np.square, (-4, 4)),
}


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("fn", list(UNARY))
def test_elementwise_functions(device, fn, dt):
    ref, (lo, hi) = UNARY[fn]
    rng = np.random.default_rng(12)
    x = rand(rng, (3, 7), dt, lo, hi)
    if fn in ("floor", "ceil", "trunc", "round"):  # exact halves and integers too
        x[0, :] = to_dtype([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -3.0], dt)
    if fn == "sign":
        x[0, :3] = 0
    out = run(f"x: {dt}[3, 7]\nreturn {fn}(x), x.{fn}()", device, x=x)
    want = ref(x.astype(np.float64))
    assert_close(out["out0"], want, dt)
    assert_close(out["out1"], want, dt)


@pytest.mark.parametrize("fn", ["exp", "log", "sqrt", "sin", "cos", "sigmoid", "tanh", "gelu", "exp2", "recip"])
@pytest.mark.parametrize("dt", ["i32", "u8", "bool", "i64"])
def test_transcendentals_of_ints_give_f32(device, fn, dt):
    x = np.array([True, False, True]) if dt == "bool" else to_dtype([1, 2, 3, 5], dt)
    out = run1(f"x: {dt}[{len(x)}]\nreturn {fn}(x)", device, x=x)
    with np.errstate(divide="ignore"):
        assert_close(out, UNARY[fn][0](x.astype(np.float64)), "f32")


@pytest.mark.parametrize("dt", SIGNED + ["u8", "u32"])
def test_int_preserving_functions(device, dt):
    lo, hi = int_range(dt)
    x = wrap([lo, -3, -1, 0, 1, 5, hi] if lo < 0 else [0, 1, 5, 200, hi], dt)
    out = run(f"x: {dt}[{len(x)}]\nreturn abs(x), sign(x), relu(x), square(x), floor(x), ceil(x), trunc(x), round(x)",
              device, x=x)
    v = [int(a) for a in x.tolist()]
    assert_exact(out["out0"], wrap([abs(a) for a in v], dt), dt)  # abs of the smallest int wraps
    assert_exact(out["out1"], np.sign(x), dt)
    assert_exact(out["out2"], np.maximum(x, 0), dt)
    assert_exact(out["out3"], wrap([a * a for a in v], dt), dt)
    for name in ("out4", "out5", "out6", "out7"):
        assert_exact(out[name], x, dt)


def test_special_float_values(device):
    x = np.array([0.0, -1.0, np.inf, -np.inf, 100.0, -100.0, np.nan], np.float32)
    out = run("x: f32[7]\nreturn exp(x), log(x), sqrt(x), recip(x), sigmoid(x), tanh(x), relu(x), abs(x)",
              device, x=x)
    v = x.astype(np.float64)
    with np.errstate(all="ignore"):
        assert_close(out["out0"], [1, np.exp(-1), np.inf, 0, np.inf, 0, np.nan], "f32")
        assert_close(out["out1"], [-np.inf, np.nan, np.inf, np.nan, np.log(100), np.nan, np.nan], "f32")
        assert_close(out["out2"], [0, np.nan, np.inf, np.nan, 10, np.nan, np.nan], "f32")
        assert_close(out["out3"], [np.inf, -1, 0, -0.0, 0.01, -0.01, np.nan], "f32")
        assert_close(out["out4"], 1 / (1 + np.exp(-v)), "f32")
        assert_close(out["out5"], np.tanh(v), "f32")
    assert_close(out["out6"][[0, 1, 2, 3, 4, 5]], [0, 0, np.inf, 0, 100, 0], "f32")
    assert_close(out["out7"], np.abs(v), "f32")


@pytest.mark.parametrize("dt", ["f32", "i32", "u8", "i8", "f16", "bool"])
def test_maximum_minimum_clip(device, dt):
    rng = np.random.default_rng(13)
    a = rand(rng, (3, 5), dt, -9, 9)
    b = rand(rng, 5, dt, -9, 9)
    src = f"a: {dt}[3, 5]\nb: {dt}[5]\nreturn maximum(a, b), minimum(a, b), a.maximum(b), minimum(b, a)"
    if dt != "bool":
        src += ", clip(a, 1, 3), a.clip(b, 5)"
    out = run(src, device, a=a, b=b)
    assert_result(out["out0"], np.maximum(a, b), dt)
    assert_result(out["out1"], np.minimum(a, b), dt)
    assert_result(out["out2"], np.maximum(a, b), dt)
    assert_result(out["out3"], np.minimum(a, b), dt)
    if dt != "bool":
        assert_result(out["out4"], np.clip(a, 1, 3), dt)
        assert_result(out["out5"], np.minimum(np.maximum(a, b), 5), dt)


def test_maximum_minimum_promote_and_take_literals(device):
    a = np.array([-2, 0, 7], np.int8)
    u = np.array([3, 200, 1], np.uint8)
    out = run("a: i8[3]\nu: u8[3]\nreturn maximum(a, u), minimum(a, 0.5), maximum(2, a), relu(a - 1)", device,
              a=a, u=u)
    assert_exact(out["out0"], np.maximum(a.astype(np.int16), u), "i16")
    assert_close(out["out1"], np.minimum(a, 0.5), "f32")
    assert_exact(out["out2"], np.maximum(a, 2), "i8")
    assert_exact(out["out3"], np.maximum(a - 1, 0), "i8")


def test_gelu_is_the_exact_erf_form(device):
    x = np.linspace(-6, 6, 49).astype(np.float32)
    out = run1("x: f32[49]\nreturn gelu(x)", device, x=x)
    # the tanh approximation is off by up to 5e-4, 3% of |gelu| + 1e-2
    assert_close(out, _gelu(x.astype(np.float64)), "f32", scale=1e-2)


# --- reductions

AXES = [None, 0, 1, 2, -1, (0, 2), (-1, -3), (0, 1, 2), (1,)]


def _axis_src(axis) -> str:
    return "None" if axis is None else str(axis)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=[_axis_src(a) for a in AXES])
def test_float_reductions(device, axis, keepdim):
    rng = np.random.default_rng(14)
    x = (rng.uniform(0.5, 1.5, (3, 4, 5)) * rng.choice([-1, 1], (3, 4, 5))).astype(np.float32)
    a, k = _axis_src(axis), keepdim
    src = (f"x: f32[3, 4, 5]\nreturn sum(x, axis={a}, keepdim={k}), x.max(axis={a}, keepdim={k}), "
           f"min(x, {a}, {k}), prod(x, axis={a}, keepdim={k}), x.mean({a}, keepdim={k})")
    out = run(src, device, x=x)
    v = x.astype(np.float64)
    np_axis = tuple(axis) if isinstance(axis, tuple) else axis
    mag = np.abs(v).sum(axis=np_axis, keepdims=keepdim)
    assert_close(out["out0"], v.sum(axis=np_axis, keepdims=keepdim), "f32", scale=mag)
    assert_close(out["out1"], v.max(axis=np_axis, keepdims=keepdim), "f32")
    assert_close(out["out2"], v.min(axis=np_axis, keepdims=keepdim), "f32")
    assert_close(out["out3"], v.prod(axis=np_axis, keepdims=keepdim), "f32",
                 scale=np.abs(v).prod(axis=np_axis, keepdims=keepdim))
    assert_close(out["out4"], v.mean(axis=np_axis, keepdims=keepdim), "f32",
                 scale=np.abs(v).mean(axis=np_axis, keepdims=keepdim))


SUM_DTYPE = {"bool": "i32", "i8": "i32", "i16": "i32", "u8": "u32", "u16": "u32", "i32": "i32", "u32": "u32",
             "i64": "i64", "u64": "u64", "f16": "f16", "bf16": "bf16", "f32": "f32", "f64": "f64"}


@pytest.mark.parametrize("dt", ALL)
def test_sum_and_prod_dtypes(device, dt):
    rng = np.random.default_rng(15)
    if dt == "bool":
        x = rng.random((4, 40)) < 0.7
    elif is_float(dt):
        x = rand(rng, (4, 40), dt, 0.9, 1.1)
    else:  # large values, so that summing in the input dtype would overflow
        lo, hi = int_range(dt)
        x = wrap(rng.integers(max(lo, -(2**40)), min(hi, 2**40), (4, 40), endpoint=True), dt)
    out = run(f"x: {dt}[4, 40]\nreturn sum(x, 1), x.prod(axis=1), x.sum()", device, x=x)
    want_dt = SUM_DTYPE[dt]
    if is_float(dt):
        v = x.astype(np.float64)
        assert_close(out["out0"], v.sum(1), want_dt)
        assert_close(out["out1"], v.prod(1), want_dt)
        assert_close(out["out2"], v.sum(), want_dt)
    else:
        rows = [[int(a) for a in row] for row in x.tolist()]
        assert_exact(out["out0"], wrap([sum(r) for r in rows], want_dt), want_dt)
        assert_exact(out["out1"], wrap([math.prod(r) for r in rows], want_dt), want_dt)
        assert_exact(out["out2"], wrap(sum(sum(r) for r in rows), want_dt), want_dt)


@pytest.mark.parametrize("dt, n", [("f16", 3000), ("bf16", 300)])
def test_half_sums_accumulate_in_f32(device, dt, n):
    # accumulating in f16 (bf16) would stop growing at 2048 (256)
    out = run1(f"x: {dt}[{n}]\nreturn sum(x)", device, x=np.ones(n, np.float32 if dt == "bf16" else np.float16))
    assert_exact(out, np.array(n), dt)


@pytest.mark.parametrize("dt", ["i32", "u8", "bool", "f16", "i64"])
def test_mean_dtype(device, dt):
    x = np.array([[True, False, True], [True, True, True]]) if dt == "bool" else to_dtype([[1, 2, 4], [5, 3, 9]], dt)
    out = run(f"x: {dt}[2, 3]\nreturn mean(x), x.mean(1), x.mean(axis=0, keepdim=True)", device, x=x)
    want_dt = "f16" if dt == "f16" else "f32"
    v = x.astype(np.float64)
    assert_close(out["out0"], v.mean(), want_dt)
    assert_close(out["out1"], v.mean(1), want_dt)
    assert_close(out["out2"], v.mean(0, keepdims=True), want_dt)


@pytest.mark.parametrize("dt", ALL)
def test_max_min_keep_the_dtype(device, dt):
    rng = np.random.default_rng(16)
    if dt == "bool":
        x = np.array([[True, False, True], [False, False, False], [True, True, True]])
    elif is_float(dt):
        x = rand(rng, (3, 3), dt)
    else:
        lo, hi = int_range(dt)
        x = wrap([[lo, 0, hi], [lo, lo + 1, 5], [hi, hi - 1, 3]], dt)
    out = run(f"x: {dt}[3, 3]\nreturn max(x, 1), min(x, 1), x.max(), x.min(0)", device, x=x)
    assert_result(out["out0"], x.max(1), dt)
    assert_result(out["out1"], x.min(1), dt)
    assert_result(out["out2"], x.max(), dt)
    assert_result(out["out3"], x.min(0), dt)


@pytest.mark.parametrize("dt", ["f32", "i32", "u8", "bool", "f16", "i8", "u64"])
def test_argmax_argmin_first_index_of_ties(device, dt):
    rows = [[1, 3, 3, 0, 3], [2, 2, 2, 2, 2], [0, 1, 0, 1, 0], [5, 0, 5, 0, 0]]
    x = np.array(rows, bool) if dt == "bool" else to_dtype(rows, dt)
    src = (f"x: {dt}[4, 5]\nreturn argmax(x, 1), x.argmin(axis=1), argmax(x), argmin(x), argmax(x, 0), "
           f"argmin(x, -1, keepdim=True), argmax(x, axis=None, keepdim=True)")
    out = run(src, device, x=x)
    assert_exact(out["out0"], np.argmax(x, 1), "i32")
    assert_exact(out["out1"], np.argmin(x, 1), "i32")
    assert_exact(out["out2"], np.argmax(x), "i32")
    assert_exact(out["out3"], np.argmin(x), "i32")
    assert_exact(out["out4"], np.argmax(x, 0), "i32")
    assert_exact(out["out5"], np.argmin(x, -1)[:, None], "i32")
    assert_exact(out["out6"], np.array(np.argmax(x)).reshape(1, 1), "i32")


def test_argmax_argmin_of_extreme_ints(device):
    x = np.array([[-128, 127, -128, 127], [0, -128, 5, -128]], np.int8)
    out = run("x: i8[2, 4]\nreturn argmax(x, 1), argmin(x, 1)", device, x=x)
    assert_exact(out["out0"], [1, 2], "i32")
    assert_exact(out["out1"], [0, 1], "i32")


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("axis", [None, 1, -1, 0, (0, 1)], ids=str)
def test_logsumexp(device, axis, keepdim):
    x = np.array([[0.5, -1.0, 2.0], [1000.0, 1000.5, 999.0], [-1000.0, -999.0, -1001.0], [1.0, 1.0, 1.0]],
                 np.float32)
    out = run1(f"x: f32[4, 3]\nreturn logsumexp(x, {_axis_src(axis)}, keepdim={keepdim})", device, x=x)
    v = x.astype(np.float64)
    m = v.max(axis=axis, keepdims=True)
    want = np.log(np.exp(v - m).sum(axis=axis, keepdims=True)) + m
    if not keepdim:
        want = want.reshape(out.shape) if axis is not None else want.reshape(())
    assert_close(out, want, "f32", scale=np.abs(want))


@pytest.mark.parametrize("axis", [0, 1, -1, -2])
def test_softmax_and_log_softmax(device, axis):
    rng = np.random.default_rng(17)
    x = rng.uniform(-5, 5, (3, 6)).astype(np.float32)
    x[0] += 500  # large values must not overflow
    out = run(f"x: f32[3, 6]\nreturn softmax(x, {axis}), log_softmax(x, axis={axis}), x.softmax({axis})",
              device, x=x)
    v = x.astype(np.float64)
    e = np.exp(v - v.max(axis, keepdims=True))
    sm = e / e.sum(axis, keepdims=True)
    assert_close(out["out0"], sm, "f32")
    assert_close(out["out1"], np.log(sm), "f32", scale=np.abs(np.log(sm)))
    assert_close(out["out2"], sm, "f32")


def test_softmax_default_axis_is_last_and_ints_give_f32(device):
    x = np.array([[1, 2, 3], [0, 0, 0]], np.int32)
    out = run("x: i32[2, 3]\nreturn softmax(x), log_softmax(x)", device, x=x)
    v = x.astype(np.float64)
    sm = np.exp(v) / np.exp(v).sum(-1, keepdims=True)
    assert_close(out["out0"], sm, "f32")
    assert_close(out["out1"], np.log(sm), "f32")


@pytest.mark.parametrize("correction", [0, 1, 2])
@pytest.mark.parametrize("axis, keepdim", [(None, False), (1, False), (-1, True), ((0, 2), False), (0, True)])
def test_var_and_std(device, axis, keepdim, correction):
    rng = np.random.default_rng(18)
    x = rng.uniform(-3, 3, (3, 4, 5)).astype(np.float32)
    a = _axis_src(axis)
    out = run(f"x: f32[3, 4, 5]\nreturn var(x, {a}, {keepdim}, correction={correction}), "
              f"x.std(axis={a}, keepdim={keepdim}, correction={correction})", device, x=x)
    v = x.astype(np.float64)
    want_var = v.var(axis=axis, ddof=correction, keepdims=keepdim)
    scale = (v**2).mean(axis=axis, keepdims=keepdim)
    assert_close(out["out0"], want_var, "f32", scale=scale)
    assert_close(out["out1"], np.sqrt(want_var), "f32", scale=np.sqrt(scale))


def test_var_std_default_is_numpys_ddof_zero(device):
    x = np.array([1.0, 2.0, 4.0, 7.0], np.float32)
    out = run("x: f32[4]\nreturn var(x), std(x), x.var()", device, x=x)
    assert_close(out["out0"], np.var(x.astype(np.float64)), "f32")  # 5.6875, not 7.5833 (ddof=1)
    assert_close(out["out1"], np.std(x.astype(np.float64)), "f32")
    assert_close(out["out2"], np.var(x.astype(np.float64)), "f32")


@pytest.mark.parametrize("dt", INTS + ["bool"])
def test_sum_of_ints_over_several_axes(device, dt):
    rng = np.random.default_rng(19)
    x = rand(rng, (2, 3, 4), dt, 0, 100)
    out = run(f"x: {dt}[2, 3, 4]\nreturn sum(x, (0, 2)), sum(x, -2, keepdim=True)", device, x=x)
    want_dt = SUM_DTYPE[dt]
    assert_exact(out["out0"], x.astype(np.int64).sum((0, 2)), want_dt)
    assert_exact(out["out1"], x.astype(np.int64).sum(-2, keepdims=True), want_dt)


def test_reductions_of_f64_and_half_types(device):
    rng = np.random.default_rng(20)
    for dt in ("f64", "f16", "bf16"):
        x = rand(rng, (5, 6), dt, -2, 2)
        out = run(f"x: {dt}[5, 6]\nreturn sum(x, 0), x.mean(1), max(x), softmax(x, 1)", device, x=x)
        v = x.astype(np.float64)
        assert_close(out["out0"], v.sum(0), dt, scale=np.abs(v).sum(0))
        assert_close(out["out1"], v.mean(1), dt, scale=np.abs(v).mean(1))
        assert_close(out["out2"], v.max(), dt)
        e = np.exp(v - v.max(1, keepdims=True))
        assert_close(out["out3"], e / e.sum(1, keepdims=True), dt)
    assert NP["bf16"] is np.float32


def test_method_forms_of_functions(device):
    rng = np.random.default_rng(27)
    x = rng.uniform(0.5, 2, (1, 2, 4, 4)).astype(np.float32)
    v = x.astype(np.float64)
    out = run("x: f32[1, 2, 4, 4]\nreturn x.pow(2), x.logsumexp(3), x.log_softmax(), x.avg_pool2d(2), "
              "x.exp2().log2(), x.where(1, 0), x.rsqrt().square(), x.argmin(-1), x.prod((2, 3))", device, x=x)
    assert_close(out["out0"], v**2, "f32")
    assert_close(out["out1"], np.log(np.exp(v).sum(3)), "f32")
    assert_close(out["out2"], v - np.log(np.exp(v).sum(-1, keepdims=True)), "f32")
    assert_close(out["out3"], v.reshape(1, 2, 2, 2, 2, 2).mean((3, 5)), "f32")
    assert_close(out["out4"], v, "f32")
    assert_exact(out["out5"], np.ones(x.shape), "i32")
    assert_close(out["out6"], 1 / v, "f32")
    assert_exact(out["out7"], v.argmin(-1), "i32")
    assert_close(out["out8"], v.prod((2, 3)), "f32", scale=np.abs(v).prod((2, 3)))
