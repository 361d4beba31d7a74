"""dtypes of the `.tg` language: the promotion lattice, weak literals, casts (truncation, wrapping, to bool)
and bitcasts, checked against numpy and against the rules of DSL.md written out in langkit.promote."""

from __future__ import annotations

import numpy as np
import pytest
from langkit import (
    ALL,
    FLOATS,
    INTS,
    NP,
    assert_close,
    assert_dtype,
    assert_exact,
    assert_result,
    bf16_round,
    is_float,
    promote,
    run,
    run1,
    source_error,
    to_dtype,
    wrap,
)

import tgc

NUMERIC = [d for d in ALL if d != "bool"]
NO_PROMOTION = [(a, b) for a in ("i8", "i16", "i32", "i64") for b in ("u64",)]
NO_PROMOTION += [(b, a) for a, b in NO_PROMOTION]
PAIRS = [(a, b) for a in ALL for b in ALL if (a, b) not in NO_PROMOTION]


def _small(name: str, values=(0, 1, 3)) -> np.ndarray:
    return np.array([bool(v) for v in values]) if name == "bool" else to_dtype(values, name)


@pytest.mark.parametrize("a, b", PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_promotion_lattice(device, a, b):
    x, y = _small(a), _small(b, (2, 0, 1))
    want_dt = promote(a, b)
    out = run1(f"a: {a}[3]\nb: {b}[3]\nreturn a + b", device, a=x, b=y)
    if want_dt == "bool":
        assert_exact(out, x | y, "bool")
    else:
        assert_result(out, x.astype(np.float64) + y.astype(np.float64), want_dt)


@pytest.mark.parametrize("a, b, want", [
    ("i8", "u8", "i16"), ("u8", "i8", "i16"), ("i32", "u32", "i64"), ("u16", "i16", "i32"), ("u8", "i32", "i32"),
    ("u32", "i8", "i64"), ("f16", "bf16", "f32"), ("bf16", "f16", "f32"), ("f16", "i64", "f16"),
    ("bf16", "u64", "bf16"), ("bool", "u16", "u16"), ("f16", "f64", "f64"), ("u8", "u64", "u64"),
])
def test_promotion_examples_from_the_spec(device, a, b, want):
    out = run(f"a: {a}[3]\nb: {b}[3]\nreturn a * b, where(a > b, a, b), maximum(a, b)", device,
              a=_small(a), b=_small(b, (2, 0, 1)))
    for got in out.values():
        assert_dtype(got, want)


@pytest.mark.parametrize("a, b", NO_PROMOTION)
def test_signed_with_u64_is_an_error(a, b):
    e = source_error(f"a: {a}[3]\nb: {b}[3]\nc = a * 2\nreturn c + (a - b)")
    assert (e.line, e.col, e.end_col) == (4, 13, 17)
    assert a in e.msg and b in e.msg


@pytest.mark.parametrize("dt", NUMERIC)
def test_int_literal_keeps_the_tensor_dtype(device, dt):
    x = to_dtype([1, 2, 5], dt)
    out = run(f"x: {dt}[3]\nreturn x * 2, 3 + x, x - 1, 7 // (x + 0)", device, x=x)
    v = x.astype(np.float64)
    assert_result(out["out0"], v * 2, dt)
    assert_result(out["out1"], v + 3, dt)
    assert_result(out["out2"], v - 1, dt)
    assert_result(out["out3"], np.floor(7 / v), dt)


@pytest.mark.parametrize("dt", NUMERIC)
def test_float_literal_with_ints_gives_f32_and_keeps_floats(device, dt):
    x = to_dtype([1, 2, 5], dt)
    out = run(f"x: {dt}[3]\nreturn x * 2.5, 0.5 + x", device, x=x)
    want_dt = dt if is_float(dt) else "f32"
    v = x.astype(np.float64)
    assert_close(out["out0"], v * 2.5, want_dt)
    assert_close(out["out1"], v + 0.5, want_dt)


def test_weak_literals_wrap_in_narrow_ints(device):
    x = np.array([100, -100, 7], np.int8)
    out = run1("x: i8[3]\nreturn x * 2", device, x=x)
    assert_exact(out, [-56, 56, 14], "i8")


def test_literals_with_bool_tensors(device):
    m = np.array([True, False, True])
    out = run("m: bool[3]\nreturn m + 1, m * 2.5, m & True, 3 * m, m | False", device, m=m)
    assert_exact(out["out0"], [2, 1, 2], "i32")
    assert_close(out["out1"], [2.5, 0, 2.5], "f32")
    assert_exact(out["out2"], m, "bool")
    assert_exact(out["out3"], [3, 0, 3], "i32")
    assert_exact(out["out4"], m, "bool")


@pytest.mark.parametrize("expr, dt, value", [
    ("3", "i32", 3), ("2.5", "f32", 2.5), ("True", "bool", True), ("1 + 2", "i32", 3), ("7 // 2", "i32", 3),
    ("-7 % 3", "i32", 2), ("1 / 2", "f32", 0.5), ("2 ** 10", "i32", 1024), ("False | True", "bool", True),
    ("-2.5 * 2", "f32", -5.0),
])
def test_literal_alone(device, expr, dt, value):
    out = run1(f"return {expr}", device)
    assert out.shape == ()
    assert_result(out, np.array(value), dt)


# --- casts


@pytest.mark.parametrize("src_dt", FLOATS)
@pytest.mark.parametrize("dst", ["i8", "i16", "i32", "i64"])
def test_float_to_int_casts_truncate(device, src_dt, dst):
    x = to_dtype([-3.75, -0.5, 0.5, 2.875, 100.5, -100.5, 0.0, 1.0], src_dt)
    out = run1(f"x: {src_dt}[8]\nreturn cast(x, {dst})", device, x=x)
    assert_exact(out, np.trunc(x.astype(np.float64)).astype(np.int64), dst)


@pytest.mark.parametrize("dst", ["u8", "u16", "u32", "u64"])
def test_float_to_unsigned_casts_truncate(device, dst):
    x = np.array([0.5, 2.875, 200.5, 0.0, 1.0, 9.99], np.float32)
    out = run1(f"x: f32[6]\nreturn x.cast({dst})", device, x=x)
    assert_exact(out, np.trunc(x).astype(np.int64), dst)


def test_out_of_range_float_to_int_cast_does_not_crash(device):
    x = np.array([1e20, -1e20, np.inf, -np.inf, np.nan, 3.5], np.float32)
    out = run1("x: f32[6]\nreturn cast(x, i32)", device, x=x)
    assert out.dtype == np.int32 and out[5] == 3


@pytest.mark.parametrize("src_dt", ALL)
def test_casts_to_bool_test_nonzero(device, src_dt):
    if is_float(src_dt):
        values = [0.0, -0.0, 0.5, -2.0, np.nan, np.inf, 256.0]
    elif src_dt == "bool":
        values = [False, True]
    else:
        values = [0, 1, 255, 256, 65536, 2**32, 2**63, 2**64 - 1]
    x = to_dtype(values, src_dt) if src_dt == "bool" or is_float(src_dt) else wrap(values, src_dt)
    out = run1(f"x: {src_dt}[{len(values)}]\nreturn cast(x, bool)", device, x=x)
    assert_exact(out, x != 0, "bool")


@pytest.mark.parametrize("src_dt", ["i8", "i16", "i32", "i64", "u8", "u32", "u64"])
@pytest.mark.parametrize("dst", INTS)
def test_int_to_int_casts_wrap(device, src_dt, dst):
    values = [0, 1, -1, 127, 128, -129, 255, 300, 65535, 65536 + 7, 2**31, -(2**31) - 1, 2**40 + 5, 2**63 + 3]
    x = wrap(values, src_dt)
    out = run1(f"x: {src_dt}[{len(values)}]\nreturn cast(x, {dst})", device, x=x)
    assert_exact(out, wrap([int(v) for v in x.tolist()], dst), dst)


@pytest.mark.parametrize("src_dt", ["bool", *INTS])
@pytest.mark.parametrize("dst", FLOATS)
def test_int_to_float_casts(device, src_dt, dst):
    values = [0, 1, -1, 100, -128, 255, 2**31 - 1, 2**63 + 5, 2**64 - 1]
    x = np.array([True, False, True]) if src_dt == "bool" else wrap(values, src_dt)
    out = run1(f"x: {src_dt}[{len(x)}]\nreturn cast(x, {dst})", device, x=x)
    want = np.array([float(int(v)) for v in x.tolist()])
    if dst == "f16":
        with np.errstate(over="ignore"):
            want = want.astype(np.float16)  # beyond 65504 is inf
    assert_close(out, want, dst)


@pytest.mark.parametrize("src_dt, dst", [("f32", "f16"), ("f32", "bf16"), ("f64", "f32"), ("f16", "bf16"),
                                         ("bf16", "f16"), ("f16", "f64"), ("bf16", "f32"), ("f64", "bf16")])
def test_float_to_float_casts(device, src_dt, dst):
    x = to_dtype([1 / 3, -2.71828, 1000.125, 0.0, -0.0, 1e-3, np.inf, -np.inf, np.nan], src_dt)
    out = run1(f"x: {src_dt}[9]\nreturn cast(x, {dst})", device, x=x)
    assert_close(out, x.astype(np.float64), dst)


def test_cast_to_bf16_rounds_to_nearest_even(device):
    # 1 + 2**-8 is a tie between two bf16 values; 1 + 3 * 2**-9 rounds up
    x = np.array([1 + 2**-8, 1 + 3 * 2**-9, 1 + 2**-7 + 2**-8, 3.14159, -1e-3], np.float32)
    out = run1("x: f32[5]\nreturn cast(x, bf16)", device, x=x)
    assert_exact(out, bf16_round(x), "bf16")


def test_cast_takes_dtype_names_and_dtype_attribute(device):
    x = np.array([1.9, -1.9], np.float32)
    n = np.array([3, 4], np.int16)
    out = run("x: f32[2]\nn: i16[2]\nreturn cast(x, n.dtype), n.cast(x.dtype), x.cast(i8) + n", device, x=x, n=n)
    assert_exact(out["out0"], [1, -1], "i16")
    assert_close(out["out1"], [3, 4], "f32")
    assert_exact(out["out2"], [4, 3], "i16")


# --- bitcasts


@pytest.mark.parametrize("src_dt, dst", [
    ("f32", "i32"), ("f32", "u32"), ("i32", "f32"), ("u32", "f32"), ("f16", "i16"), ("i16", "f16"),
    ("u16", "f16"), ("f64", "i64"), ("i64", "f64"), ("u64", "f64"), ("i8", "u8"), ("u8", "i8"),
    ("i32", "u32"), ("u64", "i64"), ("bool", "u8"),
])
def test_bitcast_reinterprets_bits(device, src_dt, dst):
    rng = np.random.default_rng(11)
    if is_float(src_dt) or is_float(dst):  # finite, non-nan floats on the float side
        fdt = src_dt if is_float(src_dt) else dst
        x = rng.uniform(-100, 100, 8).astype(NP[fdt]).view(NP[src_dt])
    elif src_dt == "bool":
        x = rng.random(8) < 0.5
    else:
        x = rng.integers(0, 256, 8 * np.dtype(NP[src_dt]).itemsize, dtype=np.uint8).view(NP[src_dt])
    out = run1(f"x: {src_dt}[8]\nreturn bitcast(x, {dst})", device, x=x)
    assert_dtype(out, dst)
    np.testing.assert_array_equal(out.view(np.uint8), x.view(np.uint8))  # the same bytes


def test_bitcast_bf16(device):
    x = bf16_round(np.array([1.5, -2.25, 3.0e10, 1e-5], np.float32))
    bits16 = (x.view(np.uint32) >> 16).astype(np.uint16)
    out = run("x: bf16[4]\nb: i16[4]\nreturn bitcast(x, u16), bitcast(b, bf16), x.bitcast(i16)", device,
              x=x, b=bits16.view(np.int16))
    assert_exact(out["out0"], bits16, "u16")
    assert_exact(out["out1"], x, "bf16")
    assert_exact(out["out2"], bits16.view(np.int16), "i16")


@pytest.mark.parametrize("src_dt, dst", [("f32", "i16"), ("i64", "f32"), ("u8", "f16"), ("bf16", "f32")])
def test_bitcast_needs_equal_item_sizes(src_dt, dst):
    e = source_error(f"x: {src_dt}[4]\ny = x\nreturn bitcast(y, {dst})")
    assert (e.line, e.col) == (3, 8)
    assert src_dt in e.msg and dst in e.msg


def test_unknown_dtype_in_a_declaration_and_in_cast():
    e = source_error("x: f33[4]\nreturn x")
    assert (e.line, e.col) == (1, 4) and "f33" in e.msg
    e = source_error("x: f32[4]\nreturn cast(x, float32)")
    assert (e.line, e.col) == (2, 16) and "float32" in e.msg


def test_inputs_must_have_the_declared_dtype(device):
    with pytest.raises(tgc.TgcError, match="f32"):
        run("x: f32[2]\nreturn x", device, x=np.zeros(2, np.int32))
