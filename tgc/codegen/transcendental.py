"""exp2, log2 and sin for f32 written as plain arithmetic UOps, so every backend can vectorize them.

LLVM turns `llvm.exp2` on a vector into one libm call per lane; these polynomial forms stay in vector
registers. Accuracy (float32): exp2 and log2 within ~2e-7 relative, sin within ~2e-7 absolute for
|x| < 1e9 (range reduction in f64), all well inside DSL.md's 1e-4. Special values (inf, nan, 0, negatives
for log2, denormal inputs) follow IEEE/libm, except that exp2 flushes results below 2**-126 (f32's smallest
normal) to 0 on every device: `tgc.ir.alu` (PYTHON, constant folding) and the C-style dialects
(`cstyle.exp2_flushed`) compute the same.
"""

from __future__ import annotations

import math
import struct

from tgc.dtype import dtypes
from tgc.ir.uop import Ops, PatternMatcher, UOp, UPat, graph_rewrite

F32, F64, I32, I64 = dtypes.f32, dtypes.f64, dtypes.i32, dtypes.i64

# 2**f on [0, 1], degree 6 (fit on Chebyshev nodes; max relative error 8e-8 in float32)
EXP2_POLY = [1.0000000025791755, 0.6931469288712472, 0.24023050092107232, 0.05548042914449793,
             0.00968457747901214, 0.0012387831469106215, 0.00021877516481703623]


def _c(v: float, d=F32) -> UOp:
    return UOp.const(d, v)


def _alu(op: Ops, *srcs: UOp) -> UOp:
    dtype = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else srcs[-1].dtype
    return UOp(op, dtype, srcs)


def _add(a, b): return _alu(Ops.ADD, a, b)
def _sub(a, b): return _alu(Ops.SUB, a, b)
def _mul(a, b): return _alu(Ops.MUL, a, b)
def _lt(a, b): return _alu(Ops.CMPLT, a, b)
def _where(c, a, b): return UOp(Ops.WHERE, a.dtype, (c, a, b))
def _bitcast(x, d): return UOp(Ops.BITCAST, d, (x,))
def _cast(x, d): return UOp(Ops.CAST, d, (x,))


def _floor(x: UOp) -> UOp:
    t = UOp(Ops.TRUNC, F32, (x,))
    return _where(_lt(x, t), _sub(t, _c(1.0)), t)


def _float_to_int(x: UOp) -> UOp:
    """An integral f32 in (-2**22, 2**22) as i32, through the bits of x + 1.5 * 2**23: unlike a cast, this
    stays in vector registers (x86 has no saturating vector conversion, so LLVM would scalarize it)."""
    return _sub(_bitcast(_add(x, _c(12582912.0)), I32), _c(0x4B400000, I32))


def _poly(x: UOp, coefs: list[float]) -> UOp:
    """Horner's rule, highest coefficient first in the loop."""
    acc = _c(coefs[-1])
    for c in reversed(coefs[:-1]):
        acc = _add(_mul(acc, x), _c(c))
    return acc


def _pow2i(e: UOp) -> UOp:
    """2**e for an i32 e in [-126, 127], built from the exponent bits (e = -127 gives 0, e = 128 +inf)."""
    return _bitcast(_alu(Ops.SHL, _add(e, _c(127, I32)), _c(23, I32)), F32)


def exp2_f32(x: UOp) -> UOp:
    """2**x in f32 with results below 2**-126 flushed to 0 (as XLA/Eigen's fast exp): a denormal result is
    slow on x86 cores without flush-to-zero and makes every later operation on it slow too. Normal results
    are p * 2**floor(x), exact in the power of two; x < -126 gives 0, x >= 128 +inf, nan stays nan."""
    clamped = _alu(Ops.MAX, _c(-127.0), x)  # floor -127 builds exponent bits 0: the product is 0
    clamped = _where(_lt(_c(128.0), clamped), _c(128.0), clamped)  # floor 128 builds the bits of +inf
    xi = _floor(clamped)
    frac = _sub(clamped, xi)
    p = _poly(frac, EXP2_POLY)
    out = _mul(p, _pow2i(_float_to_int(xi)))
    return _where(_alu(Ops.CMPNE, x, x), x, out)  # nan stays nan


def log2_f32(x: UOp) -> UOp:
    tiny = _lt(x, _c(1.1754943508222875e-38))
    scaled = _where(tiny, _mul(x, _c(8388608.0)), x)  # lift denormals by 2**23
    bits = _bitcast(scaled, I32)
    e = _sub(_alu(Ops.AND, _alu(Ops.SHR, bits, _c(23, I32)), _c(255, I32)), _c(127, I32))
    m = _bitcast(_alu(Ops.OR, _alu(Ops.AND, bits, _c(0x7FFFFF, I32)), _c(0x3F800000, I32)), F32)  # [1, 2)
    big = _lt(_c(1.4142135623730951), m)
    m = _where(big, _mul(m, _c(0.5)), m)
    ef = _add(_cast(e, F32), _where(big, _c(1.0), _c(0.0)))
    ef = _where(tiny, _sub(ef, _c(23.0)), ef)
    s = UOp(Ops.FDIV, F32, (_sub(m, _c(1.0)), _add(m, _c(1.0))))
    s2 = _mul(s, s)
    # log2(m) = 2/ln2 * atanh(s) = 2/ln2 * (s + s^3/3 + s^5/5 + ...)
    series = _poly(s2, [1.0, 1 / 3, 1 / 5, 1 / 7, 1 / 9, 1 / 11])
    out = _add(ef, _mul(_mul(s, series), _c(2.0 / math.log(2.0))))
    out = _where(_alu(Ops.CMPEQ, x, _c(math.inf)), x, out)
    out = _where(_alu(Ops.CMPEQ, x, _c(0.0)), _c(-math.inf), out)
    out = _where(_lt(x, _c(0.0)), _c(math.nan), out)
    return _where(_alu(Ops.CMPNE, x, x), x, out)


_HALF_PI_F32 = float(struct.unpack("f", struct.pack("f", math.pi / 2))[0])


def sin_f32(x: UOp, quarter_turns: int = 0) -> UOp:
    """sin(x + quarter_turns * pi/2); cos(x) arrives as sin(x + pi/2) and is reduced exactly."""
    # reduce x - k*pi/2 in f64: exact enough for |x| up to ~1e9 with one multiply
    xd = _cast(x, F64)
    kd = UOp(Ops.TRUNC, F64, (_add(_mul(xd, _c(2.0 / math.pi, F64)), _c(0.5, F64)),))
    kd = _where(_lt(_add(_mul(xd, _c(2.0 / math.pi, F64)), _c(0.5, F64)), kd), _sub(kd, _c(1.0, F64)), kd)
    r = _cast(_sub(xd, _mul(kd, _c(math.pi / 2, F64))), F32)
    r2 = _mul(r, r)
    sin_r = _add(r, _mul(_mul(r, r2), _poly(r2, [-1 / 6, 1 / 120, -1 / 5040, 1 / 362880])))
    cos_r = _add(_sub(_c(1.0), _mul(r2, _c(0.5))), _mul(_mul(r2, r2), _poly(r2, [1 / 24, -1 / 720, 1 / 40320])))
    # the quadrant k mod 4 from the low mantissa bits of k + 1.5 * 2**52 (exact for |k| < 2**51)
    k_bits = _cast(_bitcast(_add(kd, _c(6755399441055744.0, F64)), I64), I32)
    q = _alu(Ops.AND, _add(k_bits, _c(quarter_turns, I32)), _c(3, I32))
    val = _where(_alu(Ops.CMPEQ, _alu(Ops.AND, q, _c(1, I32)), _c(1, I32)), cos_r, sin_r)
    neg = _alu(Ops.CMPEQ, _alu(Ops.AND, q, _c(2, I32)), _c(2, I32))
    out = _where(neg, UOp(Ops.NEG, F32, (val,)), val)
    finite = _lt(UOp(Ops.MAX, F32, (x, UOp(Ops.NEG, F32, (x,)))), _c(math.inf))
    return _where(finite, out, _c(math.nan))


transcendental_rules = PatternMatcher([
    (UPat(Ops.EXP2, src=(UPat.var("x", {F32}),)), exp2_f32),
    (UPat(Ops.LOG2, src=(UPat.var("x", {F32}),)), log2_f32),
    (UPat(Ops.SIN, src=(UPat(Ops.ADD, src=(UPat.var("x", {F32}), UPat.cvar("c"))),)),
     lambda x, c: sin_f32(x, 1) if abs(c.arg - _HALF_PI_F32) < 1e-6 else None),
    (UPat(Ops.SIN, src=(UPat.var("x", {F32}),)), sin_f32),
])


def decompose_transcendentals(ast: UOp) -> UOp:
    return graph_rewrite(ast, transcendental_rules)
