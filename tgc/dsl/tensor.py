"""Typed tensor values the front end computes with. Each wraps a tensor-level UOp.

Every library function of DSL.md is written here once, in terms of the core ops (elementwise ALU ops,
REDUCE_AXIS and movement ops), never as a special kernel. Errors raise `DslError`; the front end adds
the source position.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tgc.dtype import DType, PromotionError, dtypes, min_max, promote, sum_dtype
from tgc.ir.shapes import prod, shape_of
from tgc.ir.symsize import SymSize
from tgc.ir.uop import COMPARE, Ops, UOp

LOG2_E = 1.4426950408889634
LN_2 = 0.6931471805599453
# erf(x) = x P(x^2) / Q(x^2) on [-4, 4], lowest power first (Eigen's generic_fast_erf_float, as XLA's)
ERF_NUMERATOR = (-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04, -5.69250639462346e-05,
                 -2.10102402082508e-06, 2.77068142495902e-08, -2.72614225801306e-10)
ERF_DENOMINATOR = (-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03, -2.13374055278905e-04,
                   -1.45660718464996e-05)


class DslError(Exception):
    """A language-level error; `shape_dependent` marks errors that depend on dim sizes."""

    def __init__(self, msg: str, hint: str | None = None, shape_dependent: bool = False):
        super().__init__(msg)
        self.msg, self.hint, self.shape_dependent = msg, hint, shape_dependent


def _size(s: int) -> int:
    """A size as an int, a size of the dims (`SymSize`, traced once) kept as such."""
    return s if isinstance(s, SymSize) else int(s)


def _uncommon(have: Sequence[int], want: Sequence[int]) -> tuple[list[int], list[int]]:
    """`have` and `want` less the sizes they share (the same int, or the same product of dims): where the shared
    product g is not 0 (`want`'s product is not), prod(have) = g * prod(rest) is a multiple of prod(want) = g *
    prod(rest') exactly where the rests' are, with the same quotient. A -1 reshape of [T, C] to (T, -1, D) then
    divides C by D, a division of dims the trace records (`symsize._want`), not T*C by T*D."""
    rest = list(want)
    kept = []
    for s in have:
        same = next((i for i, w in enumerate(rest) if type(w) is type(s) and (
            w.terms == s.terms and w.value == s.value if isinstance(s, SymSize) else w == s)), None)
        if same is None:
            kept.append(s)
        else:
            del rest[same]
    return kept, rest


def _reciprocal(n: int) -> float:
    """1.0 / n; of a size of the dims, the `SymFloat` that remembers them (`1.0 / n` alone is a plain float:
    Python asks float's division first)."""
    return n.__rtruediv__(1.0) if isinstance(n, SymSize) else 1.0 / n


def _shape_error(msg: str) -> DslError:
    return DslError(msg, shape_dependent=True)


def fmt_type(dtype: DType, shape: tuple[int, ...]) -> str:
    return f"{dtype.name}[{', '.join(map(str, shape))}]" if shape else dtype.name


Scalar = int | float | bool


# tanh x = x * sum(c_k x^(2k)): the Taylor coefficients 2^(2k+2) (2^(2k+2) - 1) B_(2k+2) / (2k+2)!
_TANH_TAYLOR = (1.0, -1 / 3, 2 / 15, -17 / 315, 62 / 2835, -1382 / 155925, 21844 / 6081075, -929569 / 638512875,
                6404582 / 10854718875, -443861162 / 1856156927625, 18888466084 / 194896477400625)


class Tensor:
    __slots__ = ("uop",)

    def __init__(self, uop: UOp):
        self.uop = uop

    # --- basic facts
    @property
    def shape(self) -> tuple[int, ...]:
        return shape_of(self.uop)

    @property
    def dtype(self) -> DType:
        return self.uop.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return prod(self.shape)

    def __repr__(self) -> str:
        return fmt_type(self.dtype, self.shape)

    # --- construction
    @staticmethod
    def const(value: Scalar, dtype: DType, shape: tuple[int, ...] = ()) -> Tensor:
        t = Tensor(UOp.const(dtype, value))
        return t.broadcast_to(shape) if shape else t

    @staticmethod
    def literal_dtype(value: Scalar) -> DType:
        if isinstance(value, bool):
            return dtypes.bool
        return dtypes.i32 if isinstance(value, int) else dtypes.f32

    # --- movement
    def reshape(self, shape: Sequence[int]) -> Tensor:
        shape = tuple(_size(s) for s in shape)
        if shape.count(-1) > 1:
            raise DslError("reshape allows at most one -1")
        if -1 in shape:
            known = prod(s for s in shape if s != -1)
            if known == 0:
                raise _shape_error(f"cannot reshape {self} into {shape}")
            have, want = _uncommon(self.shape, [s for s in shape if s != -1])
            missing = prod(have) // prod(want)  # (`(T, -1, D)` of [T, C]: the program's `C // D`, whose class
            if prod(have) % prod(want):         # is narrowed as the spelled one's, `symsize._want`)
                raise _shape_error(f"cannot reshape {self} into {shape}")
            shape = tuple(missing if s == -1 else s for s in shape)
        if any(s < 0 for s in shape):
            raise DslError(f"negative size in reshape {shape}")
        if prod(shape) != self.numel:
            raise _shape_error(f"cannot reshape {self} ({self.numel} elements) into {list(shape)} "
                               f"({prod(shape)} elements)")
        return self if shape == self.shape else Tensor(UOp(Ops.RESHAPE, self.dtype, (self.uop,), shape))

    def permute(self, order: Sequence[int]) -> Tensor:
        order = tuple(self._axis(a) for a in order)
        if sorted(order) != list(range(self.ndim)):
            raise DslError(f"permute order {list(order)} is not a permutation of {self.ndim} axes")
        if order == tuple(range(self.ndim)):
            return self
        return Tensor(UOp(Ops.PERMUTE, self.dtype, (self.uop,), order))

    def expand(self, shape: Sequence[int]) -> Tensor:
        shape = tuple(_size(s) for s in shape)
        if len(shape) < self.ndim:
            raise _shape_error(f"cannot expand {self} to {list(shape)}")
        t = self.reshape((1,) * (len(shape) - self.ndim) + self.shape) if len(shape) > self.ndim else self
        shape = tuple(t.shape[i] if s == -1 else s for i, s in enumerate(shape))
        for have, want in zip(t.shape, shape):
            if have != want and have != 1:
                raise _shape_error(f"cannot expand {self} to {list(shape)}")
        return t if shape == t.shape else Tensor(UOp(Ops.EXPAND, t.dtype, (t.uop,), shape))

    def broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
        return self.expand(shape)

    def pad(self, pads: Sequence[tuple[int, int]], value: Scalar = 0) -> Tensor:
        pads = tuple((_size(b), _size(a)) for b, a in pads)
        if len(pads) != self.ndim:
            raise DslError(f"pad needs one (before, after) pair per axis: {self.ndim} axes, got {len(pads)}")
        t = self
        if any(b < 0 or a < 0 for b, a in pads):  # negative padding crops
            t = t.shrink(tuple((max(-b, 0), s - max(-a, 0)) for (b, a), s in zip(pads, self.shape)))
            pads = tuple((max(b, 0), max(a, 0)) for b, a in pads)
        if all(p == (0, 0) for p in pads):
            return t
        value = _as_dtype_value(value, t.dtype)
        return Tensor(UOp(Ops.PAD, t.dtype, (t.uop,), (pads, value)))

    def shrink(self, bounds: Sequence[tuple[int, int]]) -> Tensor:
        bounds = tuple((_size(b), _size(e)) for b, e in bounds)
        if bounds == tuple((0, s) for s in self.shape):
            return self
        return Tensor(UOp(Ops.SHRINK, self.dtype, (self.uop,), bounds))

    def flip(self, axis: int | Sequence[int] | None = None) -> Tensor:
        axes = range(self.ndim) if axis is None else ([axis] if isinstance(axis, int) else axis)
        axes = {self._axis(a) for a in axes}
        flags = tuple(i in axes and self.shape[i] > 1 for i in range(self.ndim))
        return Tensor(UOp(Ops.FLIP, self.dtype, (self.uop,), flags)) if any(flags) else self

    def stride(self, steps: Sequence[int]) -> Tensor:
        steps = tuple(_size(s) for s in steps)
        if all(s == 1 for s in steps):
            return self
        return Tensor(UOp(Ops.STRIDE, self.dtype, (self.uop,), steps))

    def window(self, axis: int, kernel: int, stride: int, dilation: int) -> Tensor:
        return Tensor(UOp(Ops.WINDOW, self.dtype, (self.uop,), (axis, kernel, stride, dilation)))

    def _axis(self, a: int, ndim: int | None = None) -> int:
        n = self.ndim if ndim is None else ndim
        if not isinstance(a, int) or isinstance(a, bool):
            raise DslError(f"axis must be an integer, got {a!r}")
        if not -n <= a < n:
            raise DslError(f"axis {a} is out of range for a tensor with {n} dims" if n else
                           f"axis {a} is out of range for a 0-d tensor")
        return a % n

    def squeeze(self, axis: int | Sequence[int] | None = None) -> Tensor:
        if axis is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        axes = {self._axis(a) for a in ([axis] if isinstance(axis, int) else axis)}
        for a in axes:
            if self.shape[a] != 1:
                raise _shape_error(f"cannot squeeze axis {a} of size {self.shape[a]}")
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def unsqueeze(self, axis: int) -> Tensor:
        a = self._axis(axis, self.ndim + 1)
        return self.reshape(self.shape[:a] + (1,) + self.shape[a:])

    def flatten(self, start: int = 0, end: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape((1,))
        s, e = self._axis(start), self._axis(end)
        return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])

    def transpose(self, a: int = -2, b: int = -1) -> Tensor:
        order = list(range(self.ndim))
        a, b = self._axis(a), self._axis(b)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> Tensor:
        return self.permute(tuple(reversed(range(self.ndim))))

    # --- casting and promotion
    def cast(self, dtype: DType) -> Tensor:
        if dtype == self.dtype:
            return self
        return Tensor(UOp(Ops.CAST, dtype, (self.uop,)))

    def bitcast(self, dtype: DType) -> Tensor:
        if dtype.itemsize != self.dtype.itemsize:
            raise DslError(f"bitcast needs the same item size: {self.dtype.name} is {self.dtype.itemsize} bytes, "
                           f"{dtype.name} is {dtype.itemsize}")
        if dtype == self.dtype:
            return self
        return Tensor(UOp(Ops.BITCAST, dtype, (self.uop,)))

    def float(self) -> Tensor:
        return self if self.dtype.is_float else self.cast(dtypes.f32)

    # --- elementwise core
    def _unary(self, op: Ops) -> Tensor:
        return Tensor(UOp(op, self.dtype, (self.uop,)))

    def _fcast(self) -> Tensor:
        """Transcendentals work on floats: ints and bools become f32."""
        return self.float()

    def exp2(self) -> Tensor:
        return self._fcast()._unary(Ops.EXP2)

    def log2(self) -> Tensor:
        return self._fcast()._unary(Ops.LOG2)

    def exp(self) -> Tensor:
        x = self._fcast()
        if x.dtype.itemsize < 4:  # log2(e) rounded to f16/bf16 would scale the argument: work in f32
            return x.cast(dtypes.f32).exp().cast(x.dtype)
        return (x * LOG2_E).exp2()

    def log(self) -> Tensor:
        x = self._fcast()
        if x.dtype.itemsize < 4:  # ln(2) rounded to f16/bf16 would scale the result: work in f32
            return x.cast(dtypes.f32).log().cast(x.dtype)
        return x.log2() * LN_2

    def sin(self) -> Tensor:
        return self._fcast()._unary(Ops.SIN)

    def cos(self) -> Tensor:
        x = self._fcast()
        if x.dtype.itemsize < 4:  # pi/2 rounded to f16/bf16 would shift the argument: work in f32
            return x.cast(dtypes.f32).cos().cast(x.dtype)
        return (x + math.pi / 2).sin()  # backends see sin(x + pi/2) and may reduce it exactly

    def tan(self) -> Tensor:
        x = self._fcast()
        if x.dtype.itemsize < 4:  # ill-conditioned near the poles: round to f16/bf16 once, at the end
            return x.cast(dtypes.f32).tan().cast(x.dtype)
        return x.sin() / x.cos()

    def sqrt(self) -> Tensor:
        return self._fcast()._unary(Ops.SQRT)

    def rsqrt(self) -> Tensor:
        return self.sqrt().recip()

    def recip(self) -> Tensor:
        return self._fcast()._unary(Ops.RECIP)

    def sigmoid(self) -> Tensor:
        x = self._fcast()
        e = (-x).exp()
        if x.dtype != dtypes.f32:
            return (1 + e).recip()
        # a result below f32's smallest normal 2^-126 is 0, as exp2 flushes its own (x in about [-88.7, -87.3]):
        # the division stays at 2^-126, since a denormal quotient costs the CPU ~20x (1 Mi of -88)
        big = e > 2.0 ** 126
        return big.where(0.0, (1 + big.where(2.0 ** 126, e)).recip())

    def tanh(self) -> Tensor:
        x = self._fcast()
        big = 2 * (2 * x).sigmoid() - 1
        # |x| < 0.25: 2 sigmoid(2x) - 1 cancels (tanh(1e-3) was 7e-5 off, tanh(3e-8) was 0); tanh's Taylor series
        # does not: its terms shrink by (x / (pi/2))^2 < 0.026, 6 terms reach f32's precision, 11 f64's
        z = x * x
        terms = _TANH_TAYLOR if x.dtype == dtypes.f64 else _TANH_TAYLOR[:6]
        poly = Tensor.const(terms[-1], x.dtype)
        for c in reversed(terms[:-1]):
            poly = poly * z + c
        return (x.abs() < 0.25).where(x * poly, big)

    def relu(self) -> Tensor:
        return self.maximum(0)

    def erf(self) -> Tensor:
        # Eigen's (and XLA's) rational form: erf(x) = x P(x^2) / Q(x^2) with x clamped to [-4, 4] (erf(4) is 1
        # in f32); |error| < 5e-7, relative too. No exp and one division: about a third of the vector
        # operations of Abramowitz & Stegun 7.1.26 (which needs exp(-x^2) and the sign), so a GELU epilogue
        # of a matmul tile costs little. The clamp is two compares, so nan stays nan. Halves compute in f32
        # (their coefficients and quotient need its range and precision).
        x = self._fcast()
        if x.dtype.itemsize < 4:
            return x.cast(dtypes.f32).erf().cast(x.dtype)
        x = (x < -4.0).where(-4.0, (x > 4.0).where(4.0, x))
        x2 = x * x
        p = _horner(x2, ERF_NUMERATOR)
        q = _horner(x2, ERF_DENOMINATOR)
        return x * p / q

    def gelu(self) -> Tensor:
        x = self._fcast()
        return 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf())

    def abs(self) -> Tensor:
        if self.dtype.is_bool or self.dtype.is_unsigned:
            return self
        return (self < 0).where(-self, self)

    def sign(self) -> Tensor:
        if self.dtype.is_bool:
            return self
        one, zero = Tensor.const(1, self.dtype), Tensor.const(0, self.dtype)
        if self.dtype.is_float:  # numpy: sign(nan) is nan
            zero = (self != self).where(self, zero)
        return (self < 0).where(-one, (self > 0).where(one, zero)) if not self.dtype.is_unsigned else \
            (self > 0).where(one, zero)

    def trunc(self) -> Tensor:
        return self._unary(Ops.TRUNC) if self.dtype.is_float else self

    def floor(self) -> Tensor:
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (self < t).where(t - 1, t)

    def ceil(self) -> Tensor:
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (self > t).where(t + 1, t)

    def round(self) -> Tensor:
        """Round half to even, as numpy does."""
        if not self.dtype.is_float:
            return self
        f = self.floor()
        diff = self - f
        f_is_odd = (f - 2 * (f * 0.5).floor()) != 0
        up = (diff > 0.5) | ((diff == 0.5) & f_is_odd)
        return up.where(f + 1, f)

    def square(self) -> Tensor:
        return self * self

    def maximum(self, other) -> Tensor:
        a, b = _pair(self, other)
        if a.dtype.is_bool:
            return a | b
        return Tensor(UOp(Ops.MAX, a.dtype, (a.uop, b.uop)))

    def minimum(self, other) -> Tensor:
        a, b = _pair(self, other)
        if a.dtype.is_bool:
            return a & b
        if a.dtype.is_float:  # numpy's minimum: a nan on either side wins (b < a alone gave a where b is nan)
            return ((b < a) | (b != b)).where(b, a)
        return (b < a).where(b, a)

    def clip(self, lo, hi) -> Tensor:
        return self.maximum(lo).minimum(hi)  # nan stays nan, as numpy's clip (maximum and minimum propagate it)

    def where(self, a, b) -> Tensor:
        """`self` is the condition."""
        cond = self if self.dtype.is_bool else self != 0
        x, y = _pair(a, b)
        shape = broadcast_shapes(cond.shape, x.shape, y.shape)
        cond, x, y = cond.broadcast_to(shape), x.broadcast_to(shape), y.broadcast_to(shape)
        return Tensor(UOp(Ops.WHERE, x.dtype, (cond.uop, x.uop, y.uop)))

    def pow(self, other) -> Tensor:
        if isinstance(other, (int, float)) and not isinstance(other, bool) and float(other).is_integer() \
                and abs(other) <= 64:
            # a float literal makes an int or bool base f32 (weak literals)
            base = self.float() if isinstance(other, float) else self
            return base._int_pow(int(other))
        base, exp = _pair(self, other)
        if base.dtype.is_int:
            return base._int_pow_tensor(exp)
        if not base.dtype.is_float:
            base, exp = base.float(), exp.float() if not exp.dtype.is_float else exp
            return base._float_pow(exp).cast(promote(self.dtype, _dtype_of(other)))
        return base._float_pow(exp.cast(base.dtype))

    def _int_pow(self, n: int) -> Tensor:
        """x ** n by repeated squaring: exact in sign for negative x."""
        if n < 0:
            if not self.dtype.is_float:
                raise DslError("integers to negative integer powers are not allowed",
                               hint="cast the base to a float first: cast(x, f32) ** -n")
            return self._int_pow(-n).recip()
        if n == 0:
            return Tensor.const(1, self.dtype if not self.dtype.is_bool else dtypes.i32, self.shape)
        x = self if not self.dtype.is_bool else self.cast(dtypes.i32)
        result: Tensor | None = None
        base = x
        while n:
            if n & 1:
                result = base if result is None else result * base
            n >>= 1
            if n:
                base = base * base
        assert result is not None
        return result

    def _int_pow_tensor(self, exp: Tensor) -> Tensor:
        """Integer x ** y by square-and-multiply over every bit of y: exact, wrapping like numpy's int powers.

        A negative y gives the integer part of x ** y: 1 for x == 1, +-1 for x == -1, else 0."""
        one, zero = Tensor.const(1, self.dtype, self.shape), Tensor.const(0, self.dtype, self.shape)
        result, base, e = one, self, exp
        for _ in range(exp.dtype.bits):
            result = ((e & 1) != 0).where(result * base, result)
            base, e = base * base, e >> 1
        if exp.dtype.is_unsigned:
            return result
        neg = (self == 1).where(one, (self == -1).where(((exp & 1) != 0).where(-one, one), zero))
        return (exp < 0).where(neg, result)

    def _float_pow(self, exp: Tensor) -> Tensor:
        """C pow: a negative base with an integer exponent keeps the sign, with a non-integer one gives nan."""
        shape = broadcast_shapes(self.shape, exp.shape)
        a, b = self.broadcast_to(shape), exp.broadcast_to(shape)
        mag = (b * a.abs().log2()).exp2()
        b_is_int = b.trunc() == b
        b_is_odd = b_is_int & ((b * 0.5).trunc() != b * 0.5)
        neg = (a < 0).where(b_is_int.where(b_is_odd.where(-mag, mag), Tensor.const(math.nan, a.dtype)), mag)
        return (b == 0).where(Tensor.const(1.0, a.dtype), neg)

    # --- reductions
    def _reduce(self, op: Ops, axis, keepdim: bool) -> Tensor:
        axes = self._axes(axis)
        if op is Ops.MAX and any(self.shape[a] == 0 for a in axes):
            raise _shape_error("max/min over an axis of size 0 has no identity")
        if not axes:
            return self
        out = Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (op, axes)))
        if keepdim:
            return out
        return out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def _axes(self, axis) -> tuple[int, ...]:
        if axis is None:
            return tuple(range(self.ndim))
        if isinstance(axis, (list, tuple)):
            axes = tuple(sorted({self._axis(a) for a in axis}))
            if len(axes) != len(axis):
                raise DslError("repeated axis in reduction")
            return axes
        return (self._axis(axis),)

    def sum(self, axis=None, keepdim: bool = False) -> Tensor:
        out_dtype = sum_dtype(self.dtype)
        acc_dtype = dtypes.f32 if self.dtype in (dtypes.f16, dtypes.bf16) else out_dtype
        return self.cast(acc_dtype)._reduce(Ops.ADD, axis, keepdim).cast(out_dtype)

    def prod(self, axis=None, keepdim: bool = False) -> Tensor:
        out_dtype = sum_dtype(self.dtype)
        acc_dtype = dtypes.f32 if self.dtype in (dtypes.f16, dtypes.bf16) else out_dtype
        return self.cast(acc_dtype)._reduce(Ops.MUL, axis, keepdim).cast(out_dtype)

    def max(self, axis=None, keepdim: bool = False) -> Tensor:
        if self.dtype.is_bool:
            return self.cast(dtypes.u8)._reduce(Ops.MAX, axis, keepdim).cast(dtypes.bool)
        return self._reduce(Ops.MAX, axis, keepdim)

    def min(self, axis=None, keepdim: bool = False) -> Tensor:
        if self.dtype.is_bool:
            return (~self).max(axis, keepdim).logical_not()
        if self.dtype.is_unsigned:
            top = Tensor.const((1 << self.dtype.bits) - 1, self.dtype)
            return top - (top - self).max(axis, keepdim)
        if self.dtype.is_int:  # -x overflows for the smallest int; ~x = -x-1 does not
            return ~((~self).max(axis, keepdim))
        return -((-self).max(axis, keepdim))

    def mean(self, axis=None, keepdim: bool = False) -> Tensor:
        if self.dtype in (dtypes.f16, dtypes.bf16):  # numpy's mean of f16: sum and divide in f32, round once
            return self.cast(dtypes.f32).mean(axis, keepdim).cast(self.dtype)
        x = self if self.dtype.is_float else self.cast(dtypes.f32)
        n = prod(self.shape[a] for a in self._axes(axis))
        s = x.sum(axis, keepdim)
        return s * _reciprocal(n) if n else s * math.nan

    def var(self, axis=None, keepdim: bool = False, correction: int = 0) -> Tensor:
        """numpy's var: the mean squared deviation divided by n - correction (numpy's `ddof`; 0 by default).

        f16/bf16 compute in f32 and round once (numpy's f16 sums of squares overflow to inf from ~65504)."""
        if self.dtype in (dtypes.f16, dtypes.bf16):
            return self.cast(dtypes.f32).var(axis, keepdim, correction).cast(self.dtype)
        x = self if self.dtype.is_float else self.cast(dtypes.f32)
        n = prod(self.shape[a] for a in self._axes(axis))
        dev = x - x.mean(axis, keepdim=True)
        scale = _reciprocal(n - correction) if n - correction > 0 else math.inf
        return (dev * dev).sum(axis, keepdim) * scale

    def std(self, axis=None, keepdim: bool = False, correction: int = 0) -> Tensor:
        return self.var(axis, keepdim, correction).sqrt()

    def argmax(self, axis=None, keepdim: bool = False) -> Tensor:
        if axis is None:
            return self.flatten().argmax(0, keepdim=False) if not keepdim else \
                self.flatten().argmax(0).reshape((1,) * self.ndim)
        a = self._axis(axis)
        n = self.shape[a]
        if n == 0:
            raise _shape_error("argmax over an axis of size 0")
        x = self if not self.dtype.is_bool else self.cast(dtypes.i32)
        # first index of ties: the largest (n - i) among the maxima, in the result's type: i32, or i64 for an
        # axis whose indices do not fit i32 (`argmax_dtype`); every value n - i lies in 1..n
        index = argmax_dtype(n)
        countdown = Tensor(UOp(Ops.CONST, index, (), 0)).arange_like(n, a, self.ndim, index)
        if not x.dtype.is_float:
            best = (x == x.max(a, keepdim=True)).where(countdown, Tensor.const(0, index)).max(a, keepdim)
            return n - best
        # numpy: the first nan wins. The max is taken with nan as -inf (no nan reaches the reduction, whose
        # accumulate LLVM may compile assuming none); a nan scores n - i in 1..n, a maximum -i in 1-n..0, any
        # other element the index type's minimum, so one max finds the first nan, else the first maximum.
        nan = x != x
        m = nan.where(-math.inf, x).max(a, keepdim=True)
        score = nan.where(countdown, (x == m).where(countdown - n, Tensor.const(min_max(index)[0], index)))
        best = score.max(a, keepdim)
        return (best > 0).where(n - best, -best)

    def argmin(self, axis=None, keepdim: bool = False) -> Tensor:
        if self.dtype.is_bool:
            return (~self).argmax(axis, keepdim)
        if self.dtype.is_int:
            return (~self).argmax(axis, keepdim)
        return (-self).argmax(axis, keepdim)

    def arange_like(self, n: int, axis: int, ndim: int, dtype: DType = dtypes.i32) -> Tensor:
        """n, n-1, ..., 1 along `axis` of an ndim-d tensor (size 1 elsewhere), of `dtype`."""
        r = n - arange(0, n, 1, dtype)
        return r.reshape(tuple(n if i == axis else 1 for i in range(ndim)))

    def logsumexp(self, axis=None, keepdim: bool = False) -> Tensor:
        x = self._fcast()
        m = x.max(axis, keepdim=True)
        m_safe = (m == m).where(m, Tensor.const(0.0, m.dtype))  # keep nan out of the shift
        m_safe = (m_safe.abs() == math.inf).where(Tensor.const(0.0, m.dtype), m_safe)
        s = (x - m_safe).exp().sum(axis, keepdim=True).log() + m_safe
        return s if keepdim else s.squeeze(self._axes(axis)) if self.ndim else s

    def softmax(self, axis: int = -1) -> Tensor:
        x = self._fcast()
        e = (x - x.max(axis, keepdim=True)).exp()
        return e / e.sum(axis, keepdim=True)

    def log_softmax(self, axis: int = -1) -> Tensor:
        x = self._fcast()
        m = x - x.max(axis, keepdim=True)
        return m - m.exp().sum(axis, keepdim=True).log()

    # --- matmul
    def matmul(self, other: Tensor) -> Tensor:
        a, b = self, other
        if a.ndim == 0 or b.ndim == 0:
            raise DslError("matmul needs tensors with at least 1 dim", hint="use * for scalars")
        dtype = promote(a.dtype, b.dtype)
        if not dtype.is_float:  # numpy: products in the result type (i8 @ i8 gives i32 and multiplies in i32)
            dtype = sum_dtype(dtype)
        a, b = a.cast(dtype), b.cast(dtype)
        squeeze_a, squeeze_b = a.ndim == 1, b.ndim == 1
        if squeeze_a:
            a = a.reshape((1, a.shape[0]))
        if squeeze_b:
            b = b.reshape((b.shape[0], 1))
        if a.shape[-1] != b.shape[-2]:
            raise _shape_error(f"matmul: inner dims differ: {self} @ {other} ({a.shape[-1]} != {b.shape[-2]})")
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        a3 = a.broadcast_to(batch + (m, k)).reshape(batch + (m, k, 1)).expand(batch + (m, k, n))
        b3 = b.broadcast_to(batch + (k, n)).reshape(batch + (1, k, n)).expand(batch + (m, k, n))
        out = (a3 * b3).sum(axis=len(batch) + 1)
        if squeeze_a and squeeze_b:
            return out.reshape(batch)
        if squeeze_a:
            return out.reshape(batch + (n,))
        if squeeze_b:
            return out.reshape(batch + (m,))
        return out

    def contiguous(self) -> Tensor:
        return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

    # --- NN helpers
    def layernorm(self, axis=-1, eps: float = 1e-5) -> Tensor:
        x = self._fcast()
        axes = axis if isinstance(axis, (list, tuple)) else (axis,)
        mu = x.mean(axes, keepdim=True)
        d = x - mu
        var = (d * d).mean(axes, keepdim=True)
        return d * (var + eps).rsqrt()

    def _pool_windows(self, kernel, stride, dilation=(1, 1)) -> Tensor:
        """(N.., H, W) -> (N.., OH, OW, KH, KW) windows as index math."""
        kh, kw = kernel
        sh, sw = stride
        dh, dw = dilation
        h_axis = self.ndim - 2
        t = self.window(h_axis, kh, sh, dh)  # (.., OH, KH, W)
        t = t.window(h_axis + 2, kw, sw, dw)  # (.., OH, KH, OW, KW)
        order = list(range(h_axis)) + [h_axis, h_axis + 2, h_axis + 1, h_axis + 3]
        return t.permute(order)

    def max_pool2d(self, kernel, stride=None) -> Tensor:
        k, s = _pair2(kernel), _pair2(stride if stride is not None else kernel)
        self._check_pool(k)
        return self._pool_windows(k, s).max(axis=(-2, -1))

    def avg_pool2d(self, kernel, stride=None) -> Tensor:
        k, s = _pair2(kernel), _pair2(stride if stride is not None else kernel)
        self._check_pool(k)
        return self._pool_windows(k, s).mean(axis=(-2, -1))

    def _check_pool(self, k) -> None:
        if self.ndim < 2:
            raise DslError(f"pooling needs at least 2 dims, got {self}")
        if k[0] > self.shape[-2] or k[1] > self.shape[-1]:
            raise _shape_error(f"pooling window {list(k)} is larger than the input {list(self.shape[-2:])}")

    def conv2d(self, weight: Tensor, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
        if self.ndim != 4 or weight.ndim != 4:
            raise DslError(f"conv2d needs an NCHW input and an OIHW weight, got {self} and {weight}")
        n, c, h, w = self.shape
        o, ci, kh, kw = weight.shape
        if c != ci * groups:
            raise _shape_error(f"conv2d: input has {c} channels, weight expects {ci} x {groups} groups")
        if o % groups:
            raise _shape_error(f"conv2d: {o} output channels do not split into {groups} groups")
        ph, pw = _pair2(padding)
        dtype = promote(self.dtype, weight.dtype)
        x = self.cast(dtype).pad(((0, 0), (0, 0), (ph, ph), (pw, pw)))
        wt = weight.cast(dtype)
        dh, dw = _pair2(dilation)
        sh, sw = _pair2(stride)
        if isinstance(sh, SymSize) or isinstance(sw, SymSize):
            # (traced once: the windows' count first, `(IMG - P) // P`, so a class where it is exact is asked for,
            # `symsize.wanted_multiples`, before the kernel's size is compared with the input's)
            _ = (x.shape[2] - dh * (kh - 1) - 1) // sh, (x.shape[3] - dw * (kw - 1) - 1) // sw
        if dh * (kh - 1) + 1 > x.shape[2] or dw * (kw - 1) + 1 > x.shape[3]:
            raise _shape_error("conv2d: the kernel is larger than the padded input")
        win = x._pool_windows((kh, kw), _pair2(stride), (dh, dw))  # (N, C, OH, OW, KH, KW)
        oh, ow = win.shape[2], win.shape[3]
        g, og = groups, o // groups
        # (N, G, 1, Ci, OH, OW, KH, KW) * (1, G, Og, Ci, 1, 1, KH, KW), summed over Ci, KH, KW
        xw = win.reshape((n, g, 1, ci, oh, ow, kh, kw))
        ww = wt.reshape((1, g, og, ci, 1, 1, kh, kw))
        full = (n, g, og, ci, oh, ow, kh, kw)
        out = (xw.expand(full) * ww.expand(full)).sum(axis=(3, 6, 7))
        return out.reshape((n, o, oh, ow))

    # --- operators
    def __add__(self, o): return _binop(Ops.ADD, self, o)
    def __radd__(self, o): return _binop(Ops.ADD, o, self)
    def __sub__(self, o): return _sub(self, o)
    def __rsub__(self, o): return _sub(o, self)
    def __mul__(self, o): return _binop(Ops.MUL, self, o)
    def __rmul__(self, o): return _binop(Ops.MUL, o, self)
    def __truediv__(self, o): return _truediv(self, o)
    def __rtruediv__(self, o): return _truediv(o, self)
    def __floordiv__(self, o): return _floordiv(self, o)
    def __rfloordiv__(self, o): return _floordiv(o, self)
    def __mod__(self, o): return _mod(self, o)
    def __rmod__(self, o): return _mod(o, self)
    def __pow__(self, o): return self.pow(o)
    def __rpow__(self, o): return _as_tensor(o, self).pow(self)
    def __matmul__(self, o): return self.matmul(o)
    def __lt__(self, o): return _cmp(Ops.CMPLT, self, o)
    def __gt__(self, o): return _cmp(Ops.CMPLT, o, self)
    def __le__(self, o): return _cmp_or_equal(o, self)
    def __ge__(self, o): return _cmp_or_equal(self, o)
    def __eq__(self, o): return _cmp(Ops.CMPEQ, self, o)  # type: ignore[override]
    def __ne__(self, o): return _cmp(Ops.CMPNE, self, o)  # type: ignore[override]
    def __and__(self, o): return _bitwise(Ops.AND, self, o)
    def __rand__(self, o): return _bitwise(Ops.AND, o, self)
    def __or__(self, o): return _bitwise(Ops.OR, self, o)
    def __ror__(self, o): return _bitwise(Ops.OR, o, self)
    def __xor__(self, o): return _bitwise(Ops.XOR, self, o)
    def __rxor__(self, o): return _bitwise(Ops.XOR, o, self)
    def __lshift__(self, o): return _shift(Ops.SHL, self, o)
    def __rlshift__(self, o): return _shift(Ops.SHL, o, self)
    def __rshift__(self, o): return _shift(Ops.SHR, self, o)
    def __rrshift__(self, o): return _shift(Ops.SHR, o, self)

    def __neg__(self) -> Tensor:
        if self.dtype.is_bool:
            raise DslError("unary - is not defined for bool", hint="use ~x for logical not")
        return self._unary(Ops.NEG)

    def __pos__(self) -> Tensor:
        return self

    def __invert__(self) -> Tensor:
        if self.dtype.is_float:
            raise DslError(f"~ needs an int or bool tensor, got {self.dtype.name}")
        return self._unary(Ops.NOT)

    def logical_not(self) -> Tensor:
        return self._unary(Ops.NOT) if self.dtype.is_bool else self == 0

    __hash__ = object.__hash__


# ---------------------------------------------------------------------------------------------------------------
# helpers


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    n = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(n):
        sizes = {s[len(s) - n + i] for s in shapes if len(s) - n + i >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise BroadcastError(shapes)
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


class BroadcastError(DslError):
    def __init__(self, shapes):
        super().__init__("cannot broadcast " + " with ".join(f"[{', '.join(map(str, s))}]" for s in shapes),
                         shape_dependent=True)
        self.shapes = shapes


def _dtype_of(x) -> DType:
    return x.dtype if isinstance(x, Tensor) else Tensor.literal_dtype(x)


def _as_dtype_value(value: Scalar, dtype: DType) -> Scalar:
    if dtype.is_bool:
        return bool(value)
    if dtype.is_int:
        if isinstance(value, float) and not value.is_integer():
            raise DslError(f"cannot use {value} as a {dtype.name} value")
        return int(value)
    return float(value)


def _weak_dtype(t: DType, lit: Scalar) -> DType:
    """The result dtype of `tensor op literal` (DSL.md 'Literals are weak')."""
    if isinstance(lit, bool):
        return t
    if isinstance(lit, float):
        return t if t.is_float else dtypes.f32
    return dtypes.i32 if t.is_bool else t


def _as_tensor(x, like: Tensor | None = None) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float)):
        dtype = _weak_dtype(like.dtype, x) if like is not None else Tensor.literal_dtype(x)
        return Tensor.const(x, dtype)
    raise DslError(f"expected a tensor or a number, got {type(x).__name__}")


def _pair(a, b) -> tuple[Tensor, Tensor]:
    """Two operands at one dtype (promotion with weak literals) and one broadcast shape."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        a = Tensor.const(a, Tensor.literal_dtype(a)) if not isinstance(a, Tensor) else a
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        try:
            dtype = promote(a.dtype, b.dtype)
        except PromotionError as e:
            raise DslError(str(e), hint="cast one side explicitly, e.g. cast(x, i64)") from None
    elif isinstance(a, Tensor):
        dtype = _weak_dtype(a.dtype, b)
    else:
        dtype = _weak_dtype(b.dtype, a)
    ta = _as_tensor(a, b if isinstance(b, Tensor) else None).cast(dtype) if not isinstance(a, Tensor) else a.cast(dtype)
    tb = _as_tensor(b, a if isinstance(a, Tensor) else None).cast(dtype) if not isinstance(b, Tensor) else b.cast(dtype)
    try:
        shape = broadcast_shapes(ta.shape, tb.shape)
    except BroadcastError:
        raise _shape_error(f"cannot broadcast {ta} with {tb}") from None
    return ta.broadcast_to(shape), tb.broadcast_to(shape)


def _binop(op: Ops, a, b) -> Tensor:
    x, y = _pair(a, b)
    if x.dtype.is_bool and op in (Ops.ADD, Ops.MUL):
        # numpy: bool + bool is logical or, bool * bool is logical and
        return x | y if op is Ops.ADD else x & y
    return Tensor(UOp(op, x.dtype, (x.uop, y.uop)))


def _sub(a, b) -> Tensor:
    x, y = _pair(a, b)
    if x.dtype.is_bool:
        raise DslError("subtracting bools is not allowed (numpy forbids it too)", hint="use ^ or cast to i32")
    return Tensor(UOp(Ops.SUB, x.dtype, (x.uop, y.uop)))


def _truediv(a, b) -> Tensor:
    x, y = _pair(a, b)
    if not x.dtype.is_float:
        x, y = x.cast(dtypes.f32), y.cast(dtypes.f32)
    return Tensor(UOp(Ops.FDIV, x.dtype, (x.uop, y.uop)))


def _int_divmod(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Floor division and modulo for ints; division by zero gives 0 and the smallest int // -1 wraps."""
    dt = x.dtype
    zero, one = Tensor.const(0, dt, x.shape), Tensor.const(1, dt, x.shape)
    y_zero = y == 0
    safe_y = y_zero.where(one, y)
    if not dt.is_unsigned:
        y_neg1 = y == -1
        safe_y = y_neg1.where(one, safe_y)  # x / -1 would trap on the smallest int
    q = Tensor(UOp(Ops.IDIV, dt, (x.uop, safe_y.uop)))
    r = Tensor(UOp(Ops.MOD, dt, (x.uop, safe_y.uop)))
    if not dt.is_unsigned:
        adjust = (r != 0) & ((r < 0) != (safe_y < 0))
        q = adjust.where(q - 1, q)
        r = adjust.where(r + safe_y, r)
        q = y_neg1.where(-x, q)
        r = y_neg1.where(zero, r)
    return y_zero.where(zero, q), y_zero.where(zero, r)


def _float_divmod(x: Tensor, y: Tensor, want_div: bool) -> Tensor:
    """numpy's float floor_divide (`want_div`) or remainder, as numpy's npy_divmod computes them: from the
    exact C fmod (float MOD), moved to the divisor's sign, so `123456.7 % 0.1` is fmod's 0.00128..., not the
    0 of `x - floor(x / y) * y`; a zero divisor gives `x / y` and nan. Halves compute in f32, as numpy's do."""
    if x.dtype.itemsize < 4:
        return _float_divmod(x.cast(dtypes.f32), y.cast(dtypes.f32), want_div).cast(x.dtype)
    zero = Tensor.const(0.0, x.dtype)
    neg_zero = Tensor.const(-0.0, x.dtype)
    r = Tensor(UOp(Ops.MOD, x.dtype, (x.uop, y.uop)))
    move = (r != 0) & ((y < 0) != (r < 0))
    if not want_div:
        r = move.where(r + y, r)
        return (r == 0).where((y < 0).where(neg_zero, zero), r)  # a zero remainder takes the divisor's sign
    div = (x - r) / y
    div = move.where(div - 1, div)
    f = div.floor()
    f = (div - f > 0.5).where(f + 1, f)  # (x - r) / y is within rounding of an integer: the nearest one
    q = x / y
    return (y == 0).where(q, (div == 0).where(q * 0, f))  # a zero quotient takes the sign of x / y


def _floordiv(a, b) -> Tensor:
    x, y = _pair(a, b)
    if x.dtype.is_bool:
        x, y = x.cast(dtypes.i8), y.cast(dtypes.i8)
    if x.dtype.is_float:
        return _float_divmod(x, y, True)
    return _int_divmod(x, y)[0]


def _mod(a, b) -> Tensor:
    x, y = _pair(a, b)
    if x.dtype.is_bool:
        x, y = x.cast(dtypes.i8), y.cast(dtypes.i8)
    if x.dtype.is_float:
        return _float_divmod(x, y, False)
    return _int_divmod(x, y)[1]


def _horner(x: Tensor, coefs: tuple[float, ...]) -> Tensor:
    """sum(coefs[i] * x**i) by Horner's rule."""
    acc = x * coefs[-1] + coefs[-2]
    for c in reversed(coefs[:-2]):
        acc = acc * x + c
    return acc


def _cmp(op: Ops, a, b) -> Tensor:
    x, y = _pair(a, b)
    assert op in COMPARE
    return Tensor(UOp(op, dtypes.bool, (x.uop, y.uop)))


def _cmp_or_equal(big, small) -> Tensor:
    """`small <= big`: not (big < small) for ints and bools; for floats (small < big) | (small == big), so that a
    NaN on either side gives False (IEEE, numpy), where the negation would give True."""
    x, y = _pair(big, small)
    if x.dtype.is_float:
        return Tensor(UOp(Ops.OR, dtypes.bool, (UOp(Ops.CMPLT, dtypes.bool, (y.uop, x.uop)),
                                                UOp(Ops.CMPEQ, dtypes.bool, (y.uop, x.uop)))))
    return _cmp(Ops.CMPLT, big, small).logical_not()


def _bitwise(op: Ops, a, b) -> Tensor:
    x, y = _pair(a, b)
    if x.dtype.is_float:
        raise DslError(f"bitwise operators need int or bool operands, got {x.dtype.name}")
    return Tensor(UOp(op, x.dtype, (x.uop, y.uop)))


def _shift(op: Ops, a, b) -> Tensor:
    x, y = _pair(a, b)
    if not x.dtype.is_int:
        raise DslError(f"shifts need int operands, got {x.dtype.name}")
    return Tensor(UOp(op, x.dtype, (x.uop, y.uop)))


def _pair2(v) -> tuple[int, int]:
    if isinstance(v, (list, tuple)):
        if len(v) != 2:
            raise DslError(f"expected an int or a pair of ints, got {v!r}")
        return _size(v[0]), _size(v[1])
    return _size(v), _size(v)  # (a dim kept a size: vit's `conv2d(img, w, stride=P)`, traced once)


# --- creation


def arange(start, stop=None, step=1, dtype: DType | None = None) -> Tensor:
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise DslError("arange step must not be 0")
    is_float = any(isinstance(v, float) for v in (start, stop, step))
    dtype = dtype or (dtypes.f32 if is_float else dtypes.i32)
    if is_float:
        n = max(0, math.ceil((stop - start) / step))
    else:  # integer ceiling division: exact, and a size variable's (`SymSize`) length stays a polynomial
        n = max(0, -((start - stop) // step))
    idx = _iota(n)
    return (idx.cast(dtype) * step + start) if (step != 1 or start != 0) else idx.cast(dtype)


def _iota(n: int) -> Tensor:
    """0, 1, ..., n-1: a leaf that lowers to the loop index itself, never a buffer; i32, or i64 where n - 1 does
    not fit i32 (so the values are exact: a cast of it to i32 wraps as the cast says, not the index)."""
    return Tensor(UOp(Ops.IOTA, dtypes.i64 if n - 1 > I32_MAX else dtypes.i32, (), n))


I32_MAX = (1 << 31) - 1
# the longest axis whose argmax/argmin is i32; longer axes give i64. A module variable so that tests can
# lower it to run the i64 path (and a two-stage reduction of i64 indices) at small sizes.
ARGMAX_I32_LIMIT = I32_MAX


def argmax_dtype(n: int) -> DType:
    """The dtype of argmax/argmin over an axis of n elements: i32 (DSL.md), i64 where an index may not fit."""
    return dtypes.i32 if n <= ARGMAX_I32_LIMIT else dtypes.i64


def full(shape: Sequence[int], value: Scalar, dtype: DType | None = None) -> Tensor:
    shape = tuple(_size(s) for s in shape)
    if any(s < 0 for s in shape):
        raise DslError(f"negative size in shape {list(shape)}")
    dtype = dtype or Tensor.literal_dtype(value)
    return Tensor.const(_as_dtype_value(value, dtype) if not dtype.is_float else float(value), dtype, shape)


def eye(n: int, m: int | None = None, dtype: DType = dtypes.f32) -> Tensor:
    m = n if m is None else m
    rows = _iota(n).reshape((n, 1)).expand((n, m))
    cols = _iota(m).reshape((1, m)).expand((n, m))
    return (rows == cols).cast(dtype)
