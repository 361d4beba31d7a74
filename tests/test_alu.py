"""The one ALU table (tgc.ir.alu), op by op and dtype by dtype, against numpy; and its three users agree."""

from __future__ import annotations

import numpy as np
import pytest

from tgc.dtype import bf16_to_f32, dtypes, f32_to_bf16, truncate
from tgc.ir import alu
from tgc.ir.symbolic import simplify
from tgc.ir.uop import Ops, UOp

INTS = [d for d in dtypes.all if d.is_int]
FLOATS = [dtypes.f16, dtypes.f32, dtypes.f64]


def _ints(d, n=64, seed=0):
    info = np.iinfo(d.np)
    rng = np.random.default_rng(seed)
    edge = np.array([info.min, info.max, 0, 1, -1 if not d.is_unsigned else 2, 7], dtype=object)
    vals = np.concatenate([edge, rng.integers(info.min, info.max, size=n, endpoint=True, dtype=np.int64
                                              if not d.is_unsigned else np.uint64).astype(object)])
    return np.array([truncate(int(v), d) for v in vals], d.np)


def _c_div(a: int, b: int) -> int:
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


@pytest.mark.parametrize("d", INTS, ids=lambda d: d.name)
def test_int_ops_wrap_and_divide_like_c(d):
    a, b = _ints(d, seed=1), _ints(d, seed=2)
    with np.errstate(all="ignore"):
        for op, ref in [(Ops.ADD, lambda x, y: x + y), (Ops.SUB, lambda x, y: x - y), (Ops.MUL, lambda x, y: x * y),
                        (Ops.IDIV, _c_div), (Ops.MOD, lambda x, y: 0 if y == 0 else x - y * _c_div(x, y)),
                        (Ops.MAX, max), (Ops.AND, lambda x, y: x & y), (Ops.OR, lambda x, y: x | y),
                        (Ops.XOR, lambda x, y: x ^ y)]:
            got = alu.exec_alu(op, d, [a, b])
            want = np.array([truncate(ref(int(x), int(y)), d) for x, y in zip(a, b)], d.np)
            assert got.dtype == d.np and np.array_equal(got, want), op
        for op, ref in [(Ops.CMPLT, lambda x, y: x < y), (Ops.CMPNE, lambda x, y: x != y),
                        (Ops.CMPEQ, lambda x, y: x == y)]:
            got = alu.exec_alu(op, d, [a, b])
            assert got.dtype == np.bool_ and np.array_equal(got, [ref(int(x), int(y)) for x, y in zip(a, b)])
        assert np.array_equal(alu.exec_alu(Ops.NEG, d, [a]), [truncate(-int(x), d) for x in a])
        assert np.array_equal(alu.exec_alu(Ops.NOT, d, [a]), [truncate(~int(x), d) for x in a])


@pytest.mark.parametrize("d", INTS, ids=lambda d: d.name)
def test_shifts_by_the_width_or_more_give_zero_or_the_sign(d):
    a = _ints(d, seed=3)
    for amount in (0, 1, d.bits - 1, d.bits, d.bits + 5):
        b = np.full(a.shape, amount, d.np)
        shl = alu.exec_alu(Ops.SHL, d, [a, b])
        shr = alu.exec_alu(Ops.SHR, d, [a, b])
        want_shl = [truncate(int(x) << amount, d) if amount < d.bits else 0 for x in a]
        sign = [(-1 if int(x) < 0 else 0) for x in a]
        want_shr = [int(x) >> amount if amount < d.bits else s for x, s in zip(a, sign)]
        assert np.array_equal(shl, want_shl) and np.array_equal(shr, want_shr), amount


@pytest.mark.parametrize("d", FLOATS, ids=lambda d: d.name)
def test_float_ops_are_ieee_in_their_dtype(d):
    rng = np.random.default_rng(4)
    a = np.concatenate([rng.standard_normal(32), [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0]]).astype(d.np)
    b = np.concatenate([rng.standard_normal(32), [0.0, 0.0, 1.0, np.nan, 2.0, 0.0]]).astype(d.np)
    with np.errstate(all="ignore"):
        for op, fn in [(Ops.ADD, np.add), (Ops.SUB, np.subtract), (Ops.MUL, np.multiply), (Ops.FDIV, np.divide),
                       (Ops.MAX, np.maximum), (Ops.MOD, np.fmod)]:
            got = alu.exec_alu(op, d, [a, b])
            assert got.dtype == d.np and np.array_equal(got, fn(a, b), equal_nan=True), op
        for op, fn in [(Ops.SQRT, np.sqrt), (Ops.EXP2, np.exp2), (Ops.LOG2, np.log2), (Ops.SIN, np.sin),
                       (Ops.TRUNC, np.trunc), (Ops.NEG, np.negative), (Ops.RECIP, lambda x: d.np.type(1) / x)]:
            got = alu.exec_alu(op, d, [a])
            assert got.dtype == d.np and np.array_equal(got, fn(a), equal_nan=True), op
        assert np.array_equal(alu.exec_alu(Ops.CMPLT, d, [a, b]), a < b)
        assert np.array_equal(alu.exec_alu(Ops.CMPNE, d, [a, b]), a != b)
    for op in (Ops.IDIV, Ops.AND, Ops.SHL):
        with pytest.raises(alu.AluError):
            alu.exec_alu(op, d, [a, b])


def test_bool_ops_are_i1_arithmetic():
    a = np.array([False, False, True, True])
    b = np.array([False, True, False, True])
    for op, want in [(Ops.ADD, a | b), (Ops.MAX, a | b), (Ops.OR, a | b), (Ops.MUL, a & b), (Ops.AND, a & b),
                     (Ops.SUB, a ^ b), (Ops.XOR, a ^ b), (Ops.CMPLT, a < b), (Ops.CMPNE, a != b)]:
        got = alu.exec_alu(op, dtypes.bool, [a, b])
        assert got.dtype == np.bool_ and np.array_equal(got, want), op
    assert np.array_equal(alu.exec_alu(Ops.NOT, dtypes.bool, [a]), ~a)
    assert np.array_equal(alu.exec_alu(Ops.NEG, dtypes.bool, [a]), a)
    assert np.array_equal(alu.exec_alu(Ops.WHERE, dtypes.i32, [a, np.int32(1), np.int32(2)]), [2, 2, 1, 1])


def test_bf16_arithmetic_is_refused_and_conversion_rounds_to_nearest_even():
    with pytest.raises(alu.AluError):
        alu.exec_alu(Ops.ADD, dtypes.bf16, [np.uint16(1), np.uint16(2)])
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.inf, 3.4e38, 1e-40], np.float32)
    bits = f32_to_bf16(x)
    assert bits.dtype == np.uint16
    # 1 + 2^-8 is a tie: rounds to even (1.0); 1 + 3 * 2^-8 rounds up; the largest f32 rounds to inf
    assert list(bf16_to_f32(bits)[:5]) == [1.0, 1.0, 1.015625, -2.5, np.inf] and np.isinf(bf16_to_f32(bits)[5])
    assert f32_to_bf16(np.float32(np.nan)) == 0x7FC0 and f32_to_bf16(np.float32(2.0)).shape == ()
    assert bf16_to_f32(np.uint16(0x3F80)) == 1.0


@pytest.mark.parametrize("d", INTS + [dtypes.bool], ids=lambda d: d.name)
def test_float_to_int_casts_saturate_and_int_casts_wrap(d):
    x = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 2.9, -2.9, 0.5], np.float64)
    got = alu.cast(x, dtypes.f64, d)
    if d.is_bool:
        assert np.array_equal(got, x != 0)
        return
    info = np.iinfo(d.np)
    assert got.dtype == d.np
    assert list(got) == [0, info.max, info.min, info.max, info.min, 2, -2 if not d.is_unsigned else 0, 0]
    i = np.array([-1, 300, 70000, 2 ** 40], np.int64)
    assert np.array_equal(alu.cast(i, dtypes.i64, d), [truncate(int(v), d) for v in i])
    assert np.array_equal(alu.cast(np.array([1.5], np.float32), dtypes.f32, dtypes.bf16), f32_to_bf16([1.5]))


@pytest.mark.parametrize("op", [Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.SHL, Ops.SHR,
                                Ops.CMPLT, Ops.XOR])
@pytest.mark.parametrize("d", [dtypes.i8, dtypes.u8, dtypes.i32, dtypes.u64], ids=lambda d: d.name)
def test_constant_folding_uses_the_table(op, d):
    for x, y in [(100, 3), (-7, 2), (127, 0), (5, 9), (-128, -1)]:
        x, y = truncate(x, d), truncate(y, d)
        out = simplify(UOp.const(d, x).alu(op, UOp.const(d, y)))
        assert out.op is Ops.CONST
        with np.errstate(all="ignore"):
            want = alu.exec_alu(op, d, [np.array(x, d.np), np.array(y, d.np)]).item()
        assert out.arg == want, (x, y)


def test_float_casts_round_to_nearest_even_and_bitcasts_keep_the_bits():
    x = np.array([1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 70000.0, -np.inf, np.nan], np.float64)
    with np.errstate(all="ignore"):
        f16, want = alu.cast(x, dtypes.f64, dtypes.f16), x.astype(np.float16)
    assert f16.dtype == np.float16 and np.array_equal(f16, want, equal_nan=True)
    assert list(f16[:3]) == [1.0, 1.001953125, np.inf]
    assert np.array_equal(alu.cast(np.array([True, False]), dtypes.bool, dtypes.f32), [1.0, 0.0])
    bits = alu.bitcast(np.array([1.0, -2.0], np.float32), dtypes.f32, dtypes.i32)
    assert bits.dtype == np.int32 and list(bits) == [0x3F800000, -0x40000000]
    assert np.array_equal(alu.bitcast(bits, dtypes.i32, dtypes.f32), [1.0, -2.0])
    assert alu.bitcast(np.uint16(0x3F80), dtypes.bf16, dtypes.u16) == 0x3F80
    assert alu.cast(np.uint16(0x3F80), dtypes.bf16, dtypes.f32) == 1.0


@pytest.mark.parametrize("d", INTS + FLOATS + [dtypes.bool], ids=lambda d: d.name)
def test_reductions_use_the_binary_op_and_its_identity(d):
    x = (_ints(d, 16) if d.is_int else np.array([True, False, True]) if d.is_bool
         else np.array([1.5, np.nan, -3.0], d.np))
    for op in (Ops.ADD, Ops.MUL, Ops.MAX):
        fn, ident = alu.reducer(op, d)
        with np.errstate(all="ignore"):
            got = fn.reduce(x, initial=ident, **({} if d.is_bool else {"dtype": x.dtype}))  # as the callers do
            want = x[0]
            for v in x[1:]:
                want = alu.exec_alu(op, d, [want, v])
        assert got == want or (np.isnan(got) and np.isnan(want)), op
        assert fn.reduce(x[:0], initial=ident) == ident
    with pytest.raises(alu.AluError):
        alu.reducer(Ops.ADD, dtypes.bf16)


def test_the_reference_evaluates_with_the_table():
    import tgc

    prog = tgc.loads("x: f32[4]\ny: f32[4]\nreturn maximum(x, y), x.max(), cast(x, i32), cast(x, u8)")
    x = np.array([np.nan, 1.0, np.inf, -np.inf], np.float32)
    y = np.array([2.0, np.nan, 0.0, 0.0], np.float32)
    ref = prog.reference(x=x, y=y)
    got = prog.run(device="PYTHON", x=x, y=y)
    mx, top, i32, u8 = (ref[n] for n in prog.output_names)
    np.testing.assert_array_equal(mx, [np.nan, np.nan, np.inf, 0.0])  # numpy's maximum: a nan wins
    assert np.isnan(top)  # as numpy's max
    assert list(i32) == [0, 1, 2 ** 31 - 1, -2 ** 31] and list(u8) == [0, 1, 255, 0]  # saturating casts
    for name in prog.output_names:
        assert np.array_equal(np.asarray(got[name], np.float64), np.asarray(ref[name], np.float64),
                              equal_nan=True), name


def test_a_float_literal_past_the_dtypes_range_rounds_to_inf_without_a_warning():
    """IEEE rounding: -1e300 as f32 is -inf (ONNX's masks pad with it); numpy's overflow warning is not the
    user's business."""
    import warnings

    from tgc.dtype import dtypes
    from tgc.ir import alu

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert alu.const(-1e300, dtypes.f32) == -np.inf and alu.const(1e300, dtypes.f16) == np.inf
        assert alu.const(1e300, dtypes.f64) == 1e300
