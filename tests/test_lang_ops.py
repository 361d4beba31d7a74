"""Operators of the `.tg` language against numpy: arithmetic, division semantics, overflow, powers,
comparisons, bitwise ops, unary ops, conditionals and matrix products, across every dtype."""

from __future__ import annotations

import math
import operator

import numpy as np
import pytest
from langkit import (
    ALL,
    FLOATS,
    INTS,
    SIGNED,
    UNSIGNED,
    assert_close,
    assert_dtype,
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

NUMERIC = [d for d in ALL if d != "bool"]


def _int_operands(rng: np.random.Generator, name: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Edge values (0, 1, -1, min, max) crossed with each other, plus random values over the full range."""
    lo, hi = int_range(name)
    edge = [v for v in (0, 1, -1, 2, -2, 7, -7, lo, hi, lo + 1, hi - 1) if lo <= v <= hi]
    a = [x for x in edge for _ in edge] + [int(v) for v in rng.integers(lo, hi, n, endpoint=True, dtype=np.int64
                                                                         if hi < 2**63 else np.uint64)]
    b = [y for _ in edge for y in edge] + [int(v) for v in rng.integers(lo, hi, n, endpoint=True, dtype=np.int64
                                                                         if hi < 2**63 else np.uint64)]
    return wrap(a, name), wrap(b, name)


def _floor_div(x: int, y: int) -> int:
    return 0 if y == 0 else x // y


def _floor_mod(x: int, y: int) -> int:
    return 0 if y == 0 else x % y


def _elementwise(fn, a: np.ndarray, b: np.ndarray) -> list[int]:
    return [fn(int(x), int(y)) for x, y in zip(a.tolist(), b.tolist())]


ARITH_SRC = """a: {d}[N]
b: {d}[N]
return a + b, a - b, a * b, a // b, a % b, a / b
"""


@pytest.mark.parametrize("dt", INTS)
def test_int_arithmetic_wraps_and_floors(device, dt):
    rng = np.random.default_rng(1)
    a, b = _int_operands(rng, dt, 40)
    out = run(ARITH_SRC.format(d=dt), device, a=a, b=b)
    assert list(out) == ["out0", "out1", "out2", "out3", "out4", "out5"]
    assert_exact(out["out0"], wrap(_elementwise(operator.add, a, b), dt), dt)
    assert_exact(out["out1"], wrap(_elementwise(operator.sub, a, b), dt), dt)
    assert_exact(out["out2"], wrap(_elementwise(operator.mul, a, b), dt), dt)
    assert_exact(out["out3"], wrap(_elementwise(_floor_div, a, b), dt), dt)
    assert_exact(out["out4"], wrap(_elementwise(_floor_mod, a, b), dt), dt)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = a.astype(np.float64) / b.astype(np.float64)
    assert_close(out["out5"], want, "f32")


@pytest.mark.parametrize("dt", FLOATS)
def test_float_arithmetic(device, dt):
    rng = np.random.default_rng(2)
    # quarter steps keep a / b well away from integers, so floor(a / b) is the same in every precision
    a = to_dtype(rng.integers(-16, 17, 30) / 4, dt)
    b = to_dtype(rng.choice([-1, 1], 30) * rng.integers(1, 17, 30) / 4, dt)
    out = run(ARITH_SRC.format(d=dt), device, a=a, b=b)
    x, y = a.astype(np.float64), b.astype(np.float64)
    assert_close(out["out0"], x + y, dt)
    assert_close(out["out1"], x - y, dt)
    assert_close(out["out2"], x * y, dt, scale=np.abs(x * y))
    assert_close(out["out3"], np.floor(x / y), dt)
    assert_close(out["out4"], np.mod(x, y), dt, scale=np.abs(y))
    assert_close(out["out5"], x / y, dt)


def test_bool_arithmetic_is_logical(device):
    a = np.array([False, False, True, True])
    b = np.array([False, True, False, True])
    out = run("a: bool[4]\nb: bool[4]\nreturn a + b, a * b, a / b", device, a=a, b=b)
    assert_exact(out["out0"], a | b, "bool")
    assert_exact(out["out1"], a & b, "bool")
    assert_close(out["out2"], [np.nan, 0.0, np.inf, 1.0], "f32")


@pytest.mark.parametrize("dt", SIGNED)
def test_floor_division_and_modulo_of_negative_ints(device, dt):
    lo, hi = int_range(dt)
    a = wrap([-7, 7, -7, 7, -8, 8, 0, -1, 5, lo, lo, hi, lo, 3, -3], dt)
    b = wrap([2, -2, -2, 0, 4, -3, 3, 4, -1, -1, 1, -1, 0, 0, -1], dt)
    out = run(f"a: {dt}[15]\nb: {dt}[15]\nreturn a // b, a % b", device, a=a, b=b)
    # Python semantics, with x // 0 == x % 0 == 0 and the smallest int // -1 wrapping to itself
    assert_exact(out["out0"], wrap([-4, -4, 3, 0, -2, -3, 0, -1, -5, lo, lo, -hi, 0, 0, 3], dt), dt)
    assert_exact(out["out1"], wrap([1, -1, -1, 0, 0, -1, 0, 3, 0, 0, 0, 0, 0, 0, 0], dt), dt)


@pytest.mark.parametrize("dt", UNSIGNED)
def test_unsigned_division_by_zero_gives_zero(device, dt):
    hi = int_range(dt)[1]
    a = wrap([7, 0, hi, 5, hi, 9], dt)
    b = wrap([2, 0, 3, 0, hi, 10], dt)
    out = run(f"a: {dt}[6]\nb: {dt}[6]\nreturn a // b, a % b", device, a=a, b=b)
    assert_exact(out["out0"], wrap([3, 0, hi // 3, 0, 1, 0], dt), dt)
    assert_exact(out["out1"], wrap([1, 0, hi % 3, 0, 0, 9], dt), dt)


@pytest.mark.parametrize("dt", FLOATS)
def test_floor_division_and_modulo_of_negative_floats(device, dt):
    a = to_dtype([-7.0, 7.0, -7.0, 7.5, -7.5, -0.5, 6.0, 0.0], dt)
    b = to_dtype([2.0, -2.0, -2.0, 2.0, 2.0, 1.0, 3.0, 5.0], dt)
    out = run(f"a: {dt}[8]\nb: {dt}[8]\nreturn a // b, a % b", device, a=a, b=b)
    assert_close(out["out0"], [-4, -4, 3, 3, -4, -1, 2, 0], dt)
    assert_close(out["out1"], [1, -1, -1, 1.5, 0.5, 0.5, 0, 0], dt)


@pytest.mark.parametrize("dt", ["f32", "f64", "f16"])
def test_float_division_by_zero_is_ieee(device, dt):
    a = to_dtype([1.0, -1.0, 0.0, 3.0], dt)
    out = run(f"a: {dt}[4]\nreturn a / 0.0, a // 0.0, a % 0.0", device, a=a)
    assert_close(out["out0"], [np.inf, -np.inf, np.nan, np.inf], dt)
    assert_close(out["out1"], [np.inf, -np.inf, np.nan, np.inf], dt)  # numpy: floor(a / 0)
    assert_close(out["out2"], [np.nan] * 4, dt)


def test_integer_true_division_gives_f32(device):
    out = run(
        "a: i32[4]\nb: u8[4]\nc: bool[4]\nreturn a / 2, b / a, c / 2, 7 / 2",
        device,
        a=np.array([1, -3, 8, 0], np.int32), b=np.array([1, 200, 4, 0], np.uint8),
        c=np.array([True, False, True, False]),
    )
    assert_close(out["out0"], [0.5, -1.5, 4.0, 0.0], "f32")
    assert_close(out["out1"], [1.0, 200 / -3, 0.5, np.nan], "f32")
    assert_close(out["out2"], [0.5, 0.0, 0.5, 0.0], "f32")
    assert_close(out["out3"], np.float64(3.5), "f32")


@pytest.mark.parametrize(
    "src, dt, values, want",
    [
        ("a + 1", "i32", [2**31 - 1, 0], [-(2**31), 1]),
        ("a * 2", "i32", [2**30, -(2**30) - 1], [-(2**31), 2**31 - 2]),
        ("a + 1", "u8", [255, 3], [0, 4]),
        ("a - 1", "u32", [0, 7], [2**32 - 1, 6]),
        ("a * 3", "i8", [100, -100], [44, -44]),
        ("a + a", "i16", [-(2**15), 2**14], [0, -(2**15)]),
        ("a * 2", "i64", [2**63 - 1, 5], [-2, 10]),
        ("a + 1", "u64", [2**64 - 1, 0], [0, 1]),
        ("-a", "i8", [-128, 5], [-128, -5]),
        ("-a", "i32", [-(2**31), -3], [-(2**31), 3]),
        ("-a", "u8", [1, 0], [255, 0]),
        ("a // -1", "i8", [-128, 7], [-128, -7]),
        ("a // -1", "i32", [-(2**31), 7], [-(2**31), -7]),
        ("a // -1", "i64", [-(2**63), -7], [-(2**63), 7]),
        ("a % -1", "i64", [-(2**63), 9], [0, 0]),
    ],
)
def test_integer_overflow_wraps(device, src, dt, values, want):
    out = run1(f"a: {dt}[2]\nreturn {src}", device, a=wrap(values, dt))
    assert_exact(out, wrap(want, dt), dt)


# --- powers


@pytest.mark.parametrize("dt", ["f32", "f64", "f16", "bf16"])
def test_power_with_literal_int_exponent_is_exact_in_sign(device, dt):
    x = to_dtype([-2.0, -1.5, 0.5, 3.0, 0.0], dt)
    out = run(f"x: {dt}[5]\nreturn x ** 3, x ** 2, x ** 1, x ** -1, x ** 8.0", device, x=x)
    v = x.astype(np.float64)
    assert_close(out["out0"], v**3, dt)
    assert_close(out["out1"], v**2, dt)
    assert_close(out["out2"], v, dt)
    with np.errstate(divide="ignore"):
        assert_close(out["out3"], 1 / v, dt)
    assert_close(out["out4"], v**8, dt)
    assert out["out0"][0] == -8 and out["out4"][1] == to_dtype(1.5**8, dt)  # (-1.5) ** 8.0


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16", "i32", "u8"])
def test_power_zero_is_one(device, dt):
    out = run1(f"x: {dt}[3]\nreturn x ** 0", device, x=to_dtype([-2, 0, 3], dt))
    assert_result(out, [1, 1, 1], dt)


@pytest.mark.parametrize("dt", ["i32", "u8", "bool"])
def test_power_with_float_literal_makes_ints_f32(device, dt):
    x = to_dtype([0, 1, 3], dt)
    out = run(f"x: {dt}[3]\nreturn x ** 2.0, x ** 0.5, x ** 2", device, x=x)
    v = x.astype(np.float64)
    assert_close(out["out0"], v**2, "f32")
    assert_close(out["out1"], np.sqrt(v), "f32")
    assert_exact(out["out2"], v.astype(np.int64) ** 2, "i32" if dt == "bool" else dt)


def test_power_with_tensor_exponent_follows_c_pow(device):
    x = np.array([-1.5, 0.0, -2.0, 2.0, -2.0, 4.0, 0.0, 1.7, -8.0], np.float32)
    y = np.array([8.0, -2.0, 3.0, 0.5, 0.5, -0.5, 0.0, 2.3, 0.0], np.float32)
    out = run1("x: f32[9]\ny: f32[9]\nreturn x ** y", device, x=x, y=y)
    want = [1.5**8, np.inf, -8.0, math.sqrt(2), np.nan, 0.5, 1.0, 1.7**2.3, 1.0]
    assert_close(out, want, "f32")
    out = run1("x: f32[9]\ny: f32[9]\nreturn pow(x, y)", device, x=x, y=y)
    assert_close(out, want, "f32")


def test_power_with_literal_base(device):
    x = np.array([0.0, 1.0, -1.0, 2.5], np.float32)
    out = run("x: f32[4]\nreturn 2 ** x, 2.0 ** x, pow(3, x)", device, x=x)
    assert_close(out["out0"], 2.0 ** x.astype(np.float64), "f32")
    assert_close(out["out1"], 2.0 ** x.astype(np.float64), "f32")
    assert_close(out["out2"], 3.0 ** x.astype(np.float64), "f32")


@pytest.mark.parametrize("dt", ["i32", "i64", "u8", "i8"])
def test_integer_powers_are_exact(device, dt):
    lo, hi = int_range(dt)
    base = wrap([-5, -3, 0, 1, 2, 3, 5, 7, 3, -1, 2] if lo < 0 else [0, 1, 2, 3, 5, 7, 9, 4, 3, 1, 2], dt)
    exp = wrap([6, 3, 4, 9, 7, 5, 6, 2, 0, 7, hi], dt)
    out = run(f"x: {dt}[11]\ny: {dt}[11]\nreturn x ** y, x ** 2, x ** 3", device, x=base, y=exp)
    mod = 1 << int(dt[1:])
    assert_exact(out["out0"], wrap(_elementwise(lambda x, y: pow(x, y, mod), base, exp), dt), dt)
    assert_exact(out["out1"], wrap([int(v) ** 2 for v in base.tolist()], dt), dt)
    assert_exact(out["out2"], wrap([int(v) ** 3 for v in base.tolist()], dt), dt)


# --- unary operators


@pytest.mark.parametrize("dt", SIGNED + UNSIGNED)
def test_unary_int_ops(device, dt):
    rng = np.random.default_rng(3)
    a, _ = _int_operands(rng, dt, 8)
    out = run(f"a: {dt}[N]\nreturn -a, +a, ~a", device, a=a)
    assert_exact(out["out0"], wrap([-v for v in a.tolist()], dt), dt)
    assert_exact(out["out1"], a, dt)
    assert_exact(out["out2"], wrap([~v for v in a.tolist()], dt), dt)


@pytest.mark.parametrize("dt", FLOATS)
def test_unary_float_ops(device, dt):
    a = to_dtype([-2.5, 0.0, 1.25, 3.0], dt)
    out = run(f"a: {dt}[4]\nreturn -a, +a, -(-a)", device, a=a)
    assert_close(out["out0"], -a.astype(np.float64), dt)
    assert_close(out["out1"], a, dt)
    assert_close(out["out2"], a, dt)


def test_invert_of_bool_is_logical_not(device):
    out = run1("a: bool[3]\nreturn ~a", device, a=np.array([True, False, True]))
    assert_exact(out, [False, True, False], "bool")


# --- comparisons, bitwise ops, shifts

CMP_SRC = "a: {d}[N]\nb: {d}[N]\nreturn a < b, a <= b, a > b, a >= b, a == b, a != b"
CMP_OPS = [np.less, np.less_equal, np.greater, np.greater_equal, np.equal, np.not_equal]


@pytest.mark.parametrize("dt", ALL)
def test_comparisons(device, dt):
    rng = np.random.default_rng(4)
    a = rand(rng, 24, dt, -3, 3)
    b = rand(rng, 24, dt, -3, 3)
    b[::3] = a[::3]  # some equal pairs
    out = run(CMP_SRC.format(d=dt), device, a=a, b=b)
    for got, fn in zip(out.values(), CMP_OPS):
        assert_exact(got, fn(a, b), "bool")


def test_comparisons_with_literals_and_mixed_dtypes(device):
    a = np.array([1, 2, 3, -1], np.int32)
    f = np.array([1.5, 2.0, 2.5, -1.0], np.float32)
    u = np.array([0, 200, 255, 1], np.uint8)
    out = run("a: i32[4]\nf: f32[4]\nu: u8[4]\nreturn a < 2.5, 2 <= a, a == f, u > a, 1.5 > a, a != 3",
              device, a=a, f=f, u=u)
    assert_exact(out["out0"], [True, True, False, True], "bool")
    assert_exact(out["out1"], [False, True, True, False], "bool")
    assert_exact(out["out2"], [False, True, False, True], "bool")
    assert_exact(out["out3"], [False, True, True, True], "bool")
    assert_exact(out["out4"], [True, False, False, True], "bool")
    assert_exact(out["out5"], [True, True, False, True], "bool")


@pytest.mark.parametrize("dt", ["bool", *INTS])
def test_bitwise_ops(device, dt):
    rng = np.random.default_rng(5)
    if dt == "bool":
        a, b = rand(rng, 16, dt), rand(rng, 16, dt)
    else:
        a, b = _int_operands(rng, dt, 8)
    out = run(f"a: {dt}[N]\nb: {dt}[N]\nreturn a & b, a | b, a ^ b", device, a=a, b=b)
    assert_exact(out["out0"], a & b, dt)
    assert_exact(out["out1"], a | b, dt)
    assert_exact(out["out2"], a ^ b, dt)


@pytest.mark.parametrize("dt", INTS)
def test_shifts(device, dt):
    rng = np.random.default_rng(6)
    bits = int(dt[1:])
    a, _ = _int_operands(rng, dt, 8)
    s = wrap(rng.integers(0, bits, len(a)), dt)
    out = run(f"a: {dt}[N]\ns: {dt}[N]\nreturn a << s, a >> s, a << 1, a >> 2", device, a=a, s=s)
    assert_exact(out["out0"], wrap(_elementwise(operator.lshift, a, s), dt), dt)
    assert_exact(out["out1"], wrap(_elementwise(operator.rshift, a, s), dt), dt)  # arithmetic for signed
    assert_exact(out["out2"], wrap([v << 1 for v in a.tolist()], dt), dt)
    assert_exact(out["out3"], wrap([v >> 2 for v in a.tolist()], dt), dt)


def test_bitwise_with_literals_and_mixed_dtypes(device):
    a = np.array([0b1100, -1, 7, 0], np.int32)
    u = np.array([0b1010, 255, 1, 128], np.uint8)
    m = np.array([True, False, True, False])
    out = run("a: i32[4]\nu: u8[4]\nm: bool[4]\nreturn a & 6, u | a, m ^ True, m & (a > 0), u ^ m",
              device, a=a, u=u, m=m)
    assert_exact(out["out0"], a & 6, "i32")
    assert_exact(out["out1"], a | u.astype(np.int32), "i32")
    assert_exact(out["out2"], ~m, "bool")
    assert_exact(out["out3"], m & (a > 0), "bool")
    assert_exact(out["out4"], u ^ m.astype(np.uint8), "u8")


# --- conditionals


def test_where_and_conditional_expression(device):
    rng = np.random.default_rng(7)
    c = rng.random((3, 4)) < 0.5
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    src = "c: bool[3, 4]\na: f32[3, 4]\nb: f32[4]\nreturn where(c, a, b), a if c else b, c.where(a, 0), where(c, 1, 2)"
    out = run(src, device, c=c, a=a, b=b)
    assert_close(out["out0"], np.where(c, a, b), "f32")
    assert_close(out["out1"], np.where(c, a, b), "f32")
    assert_close(out["out2"], np.where(c, a, 0), "f32")
    assert_exact(out["out3"], np.where(c, 1, 2), "i32")


def test_where_promotes_and_broadcasts(device):
    c = np.array([True, False, True])
    i = np.array([[1], [-2]], np.int8)
    u = np.array([200, 7, 9], np.uint8)
    h = np.array([0.5, 1.5, -2.0], np.float16)
    n = np.array([0, 3, -1], np.int32)
    out = run("c: bool[3]\ni: i8[2, 1]\nu: u8[3]\nh: f16[3]\nn: i32[3]\n"
              "return where(c, i, u), where(c, u, h), where(c, i, 2.5), where(n, 1, 0), 1.5 if c else u",
              device, c=c, i=i, u=u, h=h, n=n)
    assert_exact(out["out0"], np.where(c, i.astype(np.int16), u.astype(np.int16)), "i16")
    assert_close(out["out1"], np.where(c, u, h.astype(np.float64)), "f16")
    assert_close(out["out2"], np.where(c, i.astype(np.float64), 2.5), "f32")
    assert_exact(out["out3"], [0, 1, 1], "i32")
    assert_close(out["out4"], np.where(c, 1.5, u.astype(np.float64)), "f32")


# --- matrix products

MATMUL_SHAPES = [
    ((4,), (4,)),
    ((3,), (3, 5)),
    ((4, 3), (3,)),
    ((2, 3), (3, 4)),
    ((2, 2, 3), (3, 4)),
    ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((5,), (2, 5, 3)),
    ((2, 3, 5), (5,)),
]


def _decl(name: str, dt: str, shape: tuple[int, ...]) -> str:
    return f"{name}: {dt}[{', '.join(map(str, shape))}]"


@pytest.mark.parametrize("sa, sb", MATMUL_SHAPES)
@pytest.mark.parametrize("dt", ["f32", "i32"])
def test_matmul_forms(device, dt, sa, sb):
    rng = np.random.default_rng(8)
    a, b = rand(rng, sa, dt, -3, 3), rand(rng, sb, dt, -3, 3)
    out = run1(f"{_decl('a', dt, sa)}\n{_decl('b', dt, sb)}\nreturn a @ b", device, a=a, b=b)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
    assert_result(out, want, dt, scale=scale)


@pytest.mark.parametrize("dt", ["f16", "bf16", "f64"])
def test_matmul_float_dtypes(device, dt):
    rng = np.random.default_rng(9)
    a, b = rand(rng, (3, 8), dt, -2, 2), rand(rng, (8, 5), dt, -2, 2)
    out = run1(f"a: {dt}[3, 8]\nb: {dt}[8, 5]\nreturn a @ b", device, a=a, b=b)
    x, y = a.astype(np.float64), b.astype(np.float64)
    assert_close(out, x @ y, dt, scale=np.abs(x) @ np.abs(y))


def test_matmul_promotes_and_matmul_function(device):
    rng = np.random.default_rng(10)
    a = rng.integers(-3, 4, (2, 3)).astype(np.int32)
    b = rng.standard_normal((3, 2)).astype(np.float32)
    out = run("a: i32[2, 3]\nb: f32[3, 2]\nreturn a @ b, matmul(b, a), a.matmul(b)", device, a=a, b=b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a) @ np.abs(b.astype(np.float64))
    assert_close(out["out0"], want, "f32", scale=scale)
    assert_close(out["out1"], b.astype(np.float64) @ a, "f32", scale=np.abs(b.astype(np.float64)) @ np.abs(a))
    assert_close(out["out2"], want, "f32", scale=scale)


def test_operator_precedence_and_parentheses(device):
    a = np.array([1.0, 2.0, -3.0], np.float32)
    out = run("a: f32[3]\nreturn a + 2 * a ** 2 - -a / 4, (a + 2) * a, -a ** 2", device, a=a)
    x = a.astype(np.float64)
    assert_close(out["out0"], x + 2 * x**2 - -x / 4, "f32")
    assert_close(out["out1"], (x + 2) * x, "f32")
    assert_close(out["out2"], -(x**2), "f32")


def test_augmented_assignment(device):
    a = np.array([1, 2, 3], np.int32)
    out = run1("a: i32[3]\ny = a\ny += 5\ny *= 2\ny //= 3\nreturn y", device, a=a)
    assert_exact(out, (a + 5) * 2 // 3, "i32")


@pytest.mark.parametrize("dt", NUMERIC)
def test_output_dtype_of_same_dtype_ops(device, dt):
    a = to_dtype([1, 2], dt)
    out = run(f"a: {dt}[2]\nreturn a + a, a * a, a - a, a / a", device, a=a)
    for name in ("out0", "out1", "out2"):
        assert_dtype(out[name], dt)
    assert_dtype(out["out3"], dt if is_float(dt) else "f32")
