"""The numpy baseline of `tgc bench --vs numpy` (tgc/engine/numpy_eval.py) against tgc's own CPU results.

Dtypes may differ (numpy's promotion, not tgc's), values may not: ints and bools exactly, floats within the
tolerances of DSL.md (relative to the largest magnitude of the result, which covers reductions).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tgc
from tgc.dtype import bf16_to_f32, f32_to_bf16
from tgc.engine.numpy_eval import numpy_program

RNG = np.random.default_rng(1234)


def normal(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def ints(*shape: int, lo: int = -8, hi: int = 9, dtype: type = np.int32) -> np.ndarray:
    return RNG.integers(lo, hi, shape).astype(dtype)


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 values that bf16 holds exactly, so tgc's rounding of bf16 inputs changes nothing."""
    return bf16_to_f32(f32_to_bf16(x))


def assert_matches(got: np.ndarray, want: np.ndarray, rtol: float | None = None, what: str = "") -> None:
    assert isinstance(got, np.ndarray), f"{what}: {type(got)}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if want.dtype.kind in "biu" and got.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    if rtol is None:
        rtol = 1e-2 if np.float16 in (got.dtype, want.dtype) else 1e-4
    w = want.astype(np.float64)
    finite = np.abs(w[np.isfinite(w)])
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    np.testing.assert_allclose(got.astype(np.float64), w, rtol=rtol, atol=rtol * scale, err_msg=what)


def check(src: str, rtol: float | None = None, **inputs: np.ndarray) -> dict[str, np.ndarray]:
    """Run `src` through tgc on the CPU and through numpy_program; every output must agree."""
    prog = tgc.loads(src)
    want = prog.run(device="CPU", **inputs)
    dims, _ = prog.bind(inputs)
    got = numpy_program(prog, dims)(inputs)
    assert list(got) == list(want)
    for name in want:
        assert_matches(got[name], want[name], rtol, f"output {name} of\n{src}")
    return got


# --------------------------------------------------------------------------------------------------------------
# elementwise


def test_float_elementwise_functions():
    x = normal(5, 7)
    src = """x: f32[N, M]
p = abs(x) + 0.1
return exp(x), log(p), exp2(x), log2(p), sqrt(p), rsqrt(p), sin(x), cos(x), tan(x), tanh(x), sigmoid(x), \
    relu(x), gelu(x), erf(x), abs(x), sign(x), recip(p), floor(3 * x), ceil(3 * x), trunc(3 * x), round(3 * x), \
    square(x), x.exp(), x.relu(), x.sigmoid(), x.round()"""
    check(src, x=x)


def test_elementwise_at_edges():
    x = np.array([0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1e-6, -1e-6, 20.0, -20.0, 100.0, -100.0, np.inf, -np.inf],
                 np.float32)
    check("x: f32[N]\nreturn sigmoid(x), gelu(x), erf(x), tanh(x), exp(x), relu(x), round(x), sign(x), floor(x)",
          x=x)


@pytest.mark.parametrize("dt, np_dt", [("f16", np.float16), ("f64", np.float64)])
def test_other_float_dtypes(dt, np_dt):
    x = normal(4, 6, dtype=np_dt)
    check(f"x: {dt}[N, M]\nreturn exp(x), gelu(x), sigmoid(x), x * 2 + 1, x.sum(axis=1), softmax(x), x @ x.T", x=x)


def test_bf16_inputs_and_casts():
    x = bf16(normal(4, 6))
    src = """x: bf16[N, M]
y: f32[N, M]
return x * 2, exp(x), x + y, cast(y, bf16), cast(x, f32) * 3, x.sum(axis=1), bitcast(x, i16), \
    bitcast(bitcast(cast(y, bf16), i16), bf16), bitcast(bitcast(x, u16), bf16)"""
    check(src, rtol=1e-2, x=x, y=normal(4, 6))


def test_int_elementwise_functions():
    a = ints(12)
    src = """a: i32[N]
return exp(a), sqrt(abs(a)), abs(a), sign(a), floor(a), ceil(a), trunc(a), round(a), square(a), relu(a), \
    sigmoid(a), recip(a + 100), log(abs(a) + 1)"""
    check(src, a=a)


def test_bool_elementwise_and_logic():
    m = RNG.random(10) < 0.5
    n = RNG.random(10) < 0.5
    check("m: bool[N]\nn: bool[N]\nreturn sign(m), abs(m), exp(m), square(m), ~m, m & n, m | n, m ^ n, m + n, m * n, "
          "m == n, where(m, 1.5, 2), max(m), min(m), sum(m), m * 2", m=m, n=n)


def test_float_arithmetic_and_broadcasting():
    a, b = normal(3, 4), normal(4)
    src = """a: f32[M, N]
b: f32[N]
return a + b, a - b, a * b, a / b, -a, +a, 2 - a, 1 / b, a * 2.5, a ** 2, a ** 3, a ** -2, abs(a) ** b, \
    2 ** b, pow(abs(a), 0.5), pow(2.0, b), maximum(a, b), minimum(a, 0), clip(a, -0.5, 0.5), a.clip(-1, 1), \
    where(a > 0, a, b), where(a > 0, a, 0), a if a > b else b, (a < b) & (b >= 0), a == b, a != 0, 0 < a, a <= b"""
    check(src, a=a, b=b)


def test_float_floor_division_and_modulo():
    a = np.array([-7.5, -7.0, -1.0, 0.0, 1.0, 3.25, 7.0, 7.5, 5.0, -5.0], np.float32)
    b = np.array([2.0, 2.0, 3.0, 2.0, -3.0, 0.5, -2.0, 2.0, 0.0, 0.0], np.float32)
    check("a: f32[N]\nb: f32[N]\nreturn a // b, a % b, a // 2, a % 2, -a % 3", a=a, b=b)


def test_int_arithmetic_division_by_zero_and_shifts():
    a = ints(40, lo=-50, hi=50)
    b = ints(40, lo=-3, hi=4)  # holds zeros: int // 0 and % 0 give 0
    src = """a: i32[N]
b: i32[N]
return a + b, a - b, a * b, a / b, a // b, a % b, a // 3, a % -3, -a, ~a, a << 2, a >> 1, a & b, a | b, a ^ b, \
    a ** 2, (-a) ** 3, a ** b, a * 3 - 1, a < b, a >= 0, maximum(a, b), minimum(a, b), clip(a, -5, 5), \
    where(b != 0, a // b, -1)"""
    check(src, a=a, b=b)


def test_int_overflow_and_mixed_dtypes():
    u = RNG.integers(0, 256, 16).astype(np.uint8)
    i = RNG.integers(-128, 128, 16).astype(np.int8)
    h = normal(16, dtype=np.float16)
    src = """u: u8[N]
i: i8[N]
h: f16[N]
return u * 300, u + 200, i + u, i * h, u + 1.5, i * i, cast(i, i32) * 1000, -u, u - i"""
    check(src, u=u, i=i, h=h)


# --------------------------------------------------------------------------------------------------------------
# reductions


def test_reductions():
    x = normal(3, 4, 5)
    src = """x: f32[A, B, C]
return sum(x), x.sum(axis=1), x.sum(axis=(0, 2), keepdim=True), x.sum(-1, True), max(x, axis=0), \
    x.min(axis=(1, 2)), x.prod(axis=2), mean(x), x.mean(axis=-2, keepdim=True), x.max(), \
    logsumexp(x, axis=2), logsumexp(x), x.logsumexp(axis=(0, 1), keepdim=True), softmax(x), softmax(x, axis=0), \
    log_softmax(x, axis=1), x.var(), var(x, axis=1), std(x, axis=(0, 2), keepdim=True), var(x, axis=2, correction=0), \
    x.std(axis=-1, correction=0)"""
    check(src, x=x)


def test_arg_reductions_first_index_of_ties():
    a = ints(4, 6, lo=-2, hi=3)
    src = """a: i32[N, M]
return argmax(a), argmax(a, axis=1), a.argmin(axis=0), argmin(a, axis=-1, keepdim=True), \
    argmax(a, keepdim=True), argmax(cast(a, f32) * 0.5, axis=0)"""
    check(src, a=a)


def test_int_reductions_and_means():
    a = ints(5, 7)
    s = RNG.integers(-100, 100, (5, 7)).astype(np.int8)
    check("a: i32[N, M]\ns: i8[N, M]\nreturn a.sum(axis=0), a.prod(axis=1), a.max(), a.mean(axis=1), s.sum(axis=1), "
          "s.sum(), var(a, axis=0), softmax(a)", a=a, s=s)


def test_reductions_over_zero_sized_dims():
    x = np.zeros((0, 3), np.float32)
    check("x: f32[N, M]\nreturn x.sum(axis=0), x.prod(axis=0), x.sum(), x.max(axis=1)", x=x)


# --------------------------------------------------------------------------------------------------------------
# matmul


@pytest.mark.parametrize("sa, sb", [((5,), (5,)), ((3, 5), (5,)), ((5,), (5, 4)), ((3, 5), (5, 4)),
                                    ((2, 3, 5), (5, 4)), ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 4, 5))])
def test_matmul_forms(sa, sb):
    decl = lambda name, s: f"{name}: f32[{', '.join(map(str, s))}]"  # noqa: E731
    check(f"{decl('a', sa)}\n{decl('b', sb)}\nreturn a @ b, matmul(a, b), a.matmul(b)", a=normal(*sa), b=normal(*sb))


def test_matmul_ints_and_mixed_dtypes():
    a, b, f = ints(3, 4), ints(4, 2), normal(4, 2)
    check("a: i32[M, K]\nb: i32[K, N]\nf: f32[K, N]\nreturn a @ b, a @ f, a.T @ a", a=a, b=b, f=f)


# --------------------------------------------------------------------------------------------------------------
# neural-net helpers


CONV_CASES = [
    # (x shape, w shape, keyword arguments)
    ((2, 3, 8, 8), (4, 3, 3, 3), ""),
    ((1, 3, 9, 7), (5, 3, 3, 2), "stride=2"),
    ((2, 2, 6, 6), (3, 2, 3, 3), "padding=1"),
    ((1, 2, 9, 9), (2, 2, 3, 3), "dilation=2"),
    ((2, 4, 7, 7), (6, 2, 3, 3), "groups=2"),
    ((1, 6, 10, 9), (6, 1, 3, 2), "stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=6"),
    ((2, 6, 11, 10), (4, 3, 2, 3), "stride=3, padding=2, dilation=2, groups=2"),
    ((1, 3, 5, 5), (2, 3, 1, 1), "stride=2"),
]


@pytest.mark.parametrize("xs, ws, kwargs", CONV_CASES)
def test_conv2d(xs, ws, kwargs):
    shape = lambda s: ", ".join(map(str, s))  # noqa: E731
    args = f", {kwargs}" if kwargs else ""
    src = f"x: f32[{shape(xs)}]\nw: f32[{shape(ws)}]\nreturn conv2d(x, w{args}), x.conv2d(w{args})"
    check(src, x=normal(*xs), w=normal(*ws))


def test_conv2d_ints():
    x, w = ints(1, 2, 5, 5), ints(3, 2, 2, 2)
    check("x: i32[1, 2, 5, 5]\nw: i32[3, 2, 2, 2]\nreturn conv2d(x, w, padding=1)", x=x, w=w)


def test_pooling():
    x = normal(2, 3, 7, 9)
    src = """x: f32[2, 3, 7, 9]
return max_pool2d(x, 2), avg_pool2d(x, 2), max_pool2d(x, 3, 2), avg_pool2d(x, (2, 3), (1, 2)), \
    max_pool2d(x, (3, 2), stride=(2, 3)), x.avg_pool2d(3), max_pool2d(x[0], 2), avg_pool2d(x[0, 0], (7, 9))"""
    check(src, x=x)


def test_layernorm():
    x = normal(3, 4, 6)
    check("x: f32[A, B, C]\nreturn layernorm(x), x.layernorm(axis=1), layernorm(x, axis=(1, 2), eps=1e-3)", x=x)


# --------------------------------------------------------------------------------------------------------------
# shapes, indexing, creation, casts


def test_shape_functions():
    x, y = normal(2, 3, 4), normal(2, 3, 4)
    src = """x: f32[A, B, C]
y: f32[A, B, C]
return x.reshape(6, 4), reshape(x, (4, -1)), x.reshape(24), permute(x, 2, 0, 1), x.permute((1, 2, 0)), \
    transpose(x), x.transpose(0, 2), x.T, expand(x[:, :1], 2, 3, 4), x[0, :, :1].expand(2, -1, 4), \
    squeeze(x[:, :1]), x[None].squeeze(0), unsqueeze(x, -1), x.unsqueeze(1), flatten(x), x.flatten(1), \
    flatten(x, 0, 1), pad(x, ((0, 0), (1, 2), (0, 1))), x.pad(((1, 1), (-1, 0), (2, -2)), value=7), flip(x), \
    x.flip(1), flip(x, (0, 2)), cat(x, y, axis=1), cat((x, y)), cat(x, y, x, axis=-1), stack(x, y), \
    stack(x, y, axis=-1)"""
    check(src, x=x, y=y)


def test_indexing():
    x = normal(5, 6, 4)
    src = """x: f32[5, 6, 4]
return x[1:-1], x[::2], x[::-1], x[3], x[-1, None, ..., ::-2], x[..., 0], x[None], x[1:100, -100:2], \
    x[:, 4:1:-1, 1], x[2, 3, 1], x[::-2, ::3], x.shape[0] * x[0]"""
    check(src, x=x)


def test_creation_functions():
    x = normal(2, 3)
    src = """x: f32[N, M]
return zeros((2, 3)), zeros(2, 3, dtype=i32), ones(4), ones((2, 2), dtype=f16), full((2, 2), 3.5), \
    full((3,), 7, dtype=i16), full(x.shape, True), arange(5), arange(1, 10, 3), arange(0.0, 1.0, 0.25), \
    arange(10, 0, -3), eye(3), eye(2, 4, dtype=i32), x + arange(x.shape[1]), zeros(x.shape, dtype=x.dtype) + x"""
    check(src, x=x)


def test_casts_and_bitcasts():
    x, a = normal(10) * 100, ints(10, lo=-300, hi=300)
    src = """x: f32[N]
a: i32[N]
return cast(x, i32), cast(x, bool), cast(a, f16), cast(a, u8), cast(a, i8), cast(x, f16), x.cast(i64), \
    cast(a, bool), bitcast(x, i32), bitcast(a, f32) * 0, bitcast(bitcast(x, u32), f32), cast(cast(x, f16), i16)"""
    check(src, x=x, a=a)


def test_python_scalars_attributes_and_shadowing():
    x = normal(4, 6)
    src = """x: f32[N, M]
n = x.shape[0]
m = x.shape[1] * 2 - 1
k = n // 2
y = x
y += 1
y *= k
t = x.T
return x, y, x[k:] * n + x.ndim, x.shape[0] / 2, m % 4, n // 0, x.size, t.shape[0] + 0 * t, 2, 2.5, True, \
    2 ** 3, -n, ~3, ~True, cast(y, x.dtype), pi * x, e + 0 * x"""
    got = check(src, x=x)
    assert got["x"] is not None and np.array_equal(got["x"], x)  # y += 1 never changed x


def test_no_inputs():
    check("return arange(6).reshape(2, 3) * 2, eye(2) + 1")


# --------------------------------------------------------------------------------------------------------------
# the module itself


def test_erf_and_gelu_accuracy():
    x = np.concatenate([np.linspace(-9, 9, 2001), [0.0, 1e-8, -1e-8, 0.4999, 0.5, -0.5, 30.0, -30.0]])
    prog = tgc.loads("x: f64[N]\nreturn erf(x), gelu(x)")
    out = numpy_program(prog, {"N": x.size})({"x": x})
    erf = np.array([math.erf(v) for v in x])
    gelu = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x])
    np.testing.assert_allclose(out["out0"], erf, rtol=1e-6, atol=1e-300)
    np.testing.assert_allclose(out["out1"], gelu, rtol=1e-6, atol=1e-300)


def test_inputs_are_cast_and_checked():
    prog = tgc.loads("x: f32[N, 3]\nb: bf16[N]\nreturn x * 2, b")
    fn = numpy_program(prog, {"N": 2})
    out = fn({"x": np.ones((2, 3), np.float64), "b": f32_to_bf16(np.array([1.5, -2.0], np.float32))})
    assert out["out0"].dtype == np.float32
    np.testing.assert_array_equal(out["b"], [1.5, -2.0])
    with pytest.raises(ValueError, match="shape"):
        fn({"x": np.ones((3, 3), np.float32), "b": np.ones(2, np.float32)})


def test_matmul_goes_to_blas():
    """`a @ b` is numpy's own matmul (BLAS): the result is bit-identical to `np.matmul`."""
    a, b = normal(64, 32), normal(32, 48)
    prog = tgc.loads("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b")
    out = numpy_program(prog, {"M": 64, "K": 32, "N": 48})({"a": a, "b": b})["out0"]
    np.testing.assert_array_equal(out, a @ b)


def test_bench_numpy_uses_it():
    from tgc.engine.bench import bench_numpy as _bench_numpy
    prog = tgc.loads("a: f32[N]\nb: f32[N]\nc: f32[N]\nreturn exp(a * b + c) * 0.5 - a")
    inputs = {k: normal(1000) for k in "abc"}
    res = _bench_numpy(prog, {"N": 1000}, inputs, 3, 1e-3)
    assert res["median_s"] > 0 and res["ratio"] > 0


def test_every_function_of_the_language_has_a_numpy_form():
    from tgc.dsl import functions
    from tgc.engine.numpy_eval import FUNCTIONS
    assert set(FUNCTIONS) == set(functions.FUNCTIONS)
