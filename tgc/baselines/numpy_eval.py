"""A `.tg` program computed by plain numpy: the baseline that `tgc bench --vs numpy` times tgc against.

`numpy_program(prog, dims)` walks the already-checked syntax tree once and turns every statement into a small
Python closure; the callable it returns evaluates those closures on numpy arrays, in the inputs' own dtypes.
Each construct maps to what a numpy user would write for it, so the comparison is fair:

- `a @ b` is `np.matmul` (BLAS for float32/float64), reductions are `np.sum(x, axis, keepdims=...)` and friends;
- `softmax`, `log_softmax`, `logsumexp`, `layernorm`, `var`, `std` are the usual max-shifted / `np.var`
  expressions;
- `conv2d` is im2col: `sliding_window_view` over the padded input, one copy into columns, then a single
  `np.matmul` (one GEMM per group); pooling combines the kernel's shifted strided views with `np.maximum` /
  `np.add` (large windows reduce a `sliding_window_view` instead);
- elementwise functions are ufuncs, indexing is numpy basic indexing, casts are `astype`.

Values follow DSL.md; dtypes follow numpy where it differs from tgc's lattice (`i32 / i32` is float64 here,
`sum` of i32 is int64, ...), which does not matter for a speed baseline. Deliberate departures from the most
literal numpy, each to keep values right:

- transcendentals on int or bool inputs compute in float32, as tgc does (numpy would pick float16 for i8 and
  bool, which is too coarse);
- `erf` and `gelu` use numpy-only approximations (no scipy): the Chebyshev fit of erfc from Numerical
  Recipes (`erfcc`, fractional error below 1.2e-7 everywhere), and for `erf` of |x| < 0.5 its Taylor series;
  `gelu(x) = 0.5 x erfc(-x / sqrt(2))`, which stays accurate in relative terms for large negative x;
- bf16 has no numpy type: it is held as float32, and `cast(x, bf16)` rounds to bf16 precision;
- a Python int literal that does not fit a small int array's dtype wraps (numpy 2 would raise);
- an int raised to negative int powers gives the integer part (1, +-1 or 0), as tgc does (numpy raises).

Float `//` and `%` are numpy's `floor_divide` and `remainder`; they can differ from `floor(a / b)` by one where
`a / b` rounds onto an integer. All floating-point warnings are silenced: overflow and division by zero give
IEEE results, integer division by zero gives 0.
"""

from __future__ import annotations

import ast
import math
import operator
import statistics
import time
from collections import ChainMap
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tgc.baselines import numpy_nnlib
from tgc.dsl.frontend import DimExpr, Parsed, concrete_shape, dim_names, function_body, solve_dim
from tgc.dsl.functions import FUNCTIONS as DSL_FUNCTIONS
from tgc.dtype import DType, bf16_to_f32, dtypes, f32_to_bf16

__all__ = ["numpy_program", "NumpyProgram"]

Env = dict[str, Any]
Thunk = Callable[[Env], Any]
Scalar = bool | int | float

# --------------------------------------------------------------------------------------------------------------
# dtypes and values


def _np_dtype(d: Any) -> np.dtype:
    """A dtype value (a tgc DType from a name like `f16`, or a numpy dtype from `x.dtype`) as a numpy dtype."""
    if isinstance(d, DType):
        return np.dtype(np.float32) if d == dtypes.bf16 else d.np
    return np.dtype(d)


def _literal_dtype(v: Scalar) -> np.dtype:
    """The dtype of a literal on its own (DSL.md): bool, i32 or f32."""
    if isinstance(v, bool):
        return np.dtype(np.bool_)
    return np.dtype(np.int32) if isinstance(v, int) else np.dtype(np.float32)


_PY_SCALARS = (bool, int, float)


def _is_scalar(v: Any) -> bool:
    return type(v) in _PY_SCALARS


def _float(x: Any) -> Any:
    """Transcendentals of ints and bools work in float32 (numpy would use float16 for i8/u8/bool)."""
    if isinstance(x, (np.ndarray, np.generic)):
        return x if x.dtype.kind in "fc" else x.astype(np.float32)
    return float(x)


def _axes(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        return tuple(sorted(a % ndim for a in axis))
    return (axis % ndim,)


def _axis_arg(axis: Any) -> Any:
    """numpy wants a tuple (not a list) of axes."""
    return tuple(axis) if isinstance(axis, list) else axis


def _shape_arg(args: tuple) -> tuple[int, ...]:
    """`f(x, (2, 3))`, `f(x, 2, 3)` and `f(x, 6)` all name a shape, as in tgc's function table."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def _pair2(v: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        return int(v[0]), int(v[1])
    return int(v), int(v)


# --------------------------------------------------------------------------------------------------------------
# operators


def _wrap_literal(lit: Any, other: Any) -> Any:
    """A Python int that does not fit `other`'s int dtype, wrapped two's-complement style into it."""
    if type(lit) is int and isinstance(other, (np.ndarray, np.generic)) and other.dtype.kind in "iu":
        return np.array(lit & ((1 << (8 * other.dtype.itemsize)) - 1), np.uint64).astype(other.dtype)
    return lit


_INT_EXACT = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod}


def _binary(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """`fn` on evaluated operands, with the language's rules for two Python numbers and oversized int literals."""

    def apply(a: Any, b: Any) -> Any:
        if type(a) in _PY_SCALARS and type(b) in _PY_SCALARS:
            if fn in _INT_EXACT and type(a) is int and type(b) is int:  # size arithmetic, e.g. x.shape[0] // 2
                return 0 if fn in (operator.floordiv, operator.mod) and b == 0 else fn(a, b)
            a = np.asarray(a, _literal_dtype(a))  # otherwise a literal alone is an i32/f32/bool value
        try:
            return fn(a, b)
        except OverflowError:
            return fn(_wrap_literal(a, b), _wrap_literal(b, a))

    return apply


def _power(a: Any, b: Any) -> Any:
    try:
        return a ** b
    except ValueError:  # numpy refuses ints to negative int powers; the language gives the integer part
        a, b = np.asarray(a), np.asarray(b)
        positive = a ** np.maximum(b, 0)
        odd = (b & 1) != 0
        negative = np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0)).astype(positive.dtype)
        return np.where(b < 0, negative, positive)


def _invert(v: Any) -> Any:
    return (not v) if isinstance(v, bool) else ~v


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: _binary(operator.add), ast.Sub: _binary(operator.sub), ast.Mult: _binary(operator.mul),
    ast.Div: _binary(operator.truediv), ast.FloorDiv: _binary(operator.floordiv), ast.Mod: _binary(operator.mod),
    ast.Pow: _binary(_power), ast.MatMult: lambda a, b: _matmul(a, b), ast.BitAnd: _binary(operator.and_),
    ast.BitOr: _binary(operator.or_), ast.BitXor: _binary(operator.xor), ast.LShift: _binary(operator.lshift),
    ast.RShift: _binary(operator.rshift),
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Lt: _binary(operator.lt), ast.LtE: _binary(operator.le), ast.Gt: _binary(operator.gt),
    ast.GtE: _binary(operator.ge), ast.Eq: _binary(operator.eq), ast.NotEq: _binary(operator.ne),
}
_PLAIN_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: _invert}

# --------------------------------------------------------------------------------------------------------------
# elementwise functions


def _ufunc(fn: np.ufunc) -> Callable[[Any], Any]:
    def apply(x: Any) -> Any:
        return fn(_float(x))

    apply.__name__ = fn.__name__
    return apply


def _exact_for_ints(fn: np.ufunc) -> Callable[[Any], Any]:
    """floor, ceil, trunc and round leave ints and bools as they are."""

    def apply(x: Any) -> Any:
        return fn(x) if np.asarray(x).dtype.kind == "f" else x

    apply.__name__ = fn.__name__
    return apply


def _rsqrt(x: Any) -> Any:
    return 1 / np.sqrt(_float(x))


def _recip(x: Any) -> Any:
    return 1 / _float(x)


def _sigmoid(x: Any) -> Any:
    return 1 / (1 + np.exp(-_float(x)))


def _relu(x: Any) -> Any:
    return np.maximum(x, 0)


def _abs(x: Any) -> Any:
    return np.abs(x)


def _sign(x: Any) -> Any:
    return x if np.asarray(x).dtype == np.bool_ else np.sign(x)


def _square(x: Any) -> Any:
    return x if np.asarray(x).dtype == np.bool_ else np.square(x)


# Numerical Recipes' Chebyshev fit of erfc(z) for z >= 0: t * exp(-z^2 + P(t)) with t = 1 / (1 + z / 2);
# the fractional error is below 1.2e-7 for every z. Coefficients of P from the constant term up.
_ERFC_COEFFS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
                1.48851587, -0.82215223, 0.17087277)
# erf(x) = 2/sqrt(pi) * sum((-1)^n x^(2n+1) / (n! (2n+1))): for |x| < 0.5 the terms below reach 4e-10
_ERF_TAYLOR = tuple(2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(7))


def _work_dtype(x: np.ndarray) -> np.dtype:
    """At least float32: the approximations' coefficients need more than float16."""
    return np.result_type(x.dtype, np.float32)


def _erfc_nonneg(z: np.ndarray) -> np.ndarray:
    t = 1 / (1 + 0.5 * z)
    poly = _ERFC_COEFFS[-1]
    for c in reversed(_ERFC_COEFFS[:-1]):
        poly = c + t * poly
    return t * np.exp(poly - z * z)


def _erfc(x: np.ndarray) -> np.ndarray:
    tail = _erfc_nonneg(np.abs(x))
    return np.where(x < 0, 2 - tail, tail)


def _erf(x: Any) -> Any:
    x = np.asarray(_float(x))
    w = x.astype(_work_dtype(x), copy=False)
    x2 = w * w
    series = _ERF_TAYLOR[-1]
    for c in reversed(_ERF_TAYLOR[:-1]):
        series = c + x2 * series
    big = np.copysign(1 - _erfc_nonneg(np.abs(w)), w)
    return np.where(np.abs(w) < 0.5, w * series, big).astype(x.dtype, copy=False)


def _gelu(x: Any, approximate: str = "none") -> Any:
    """The exact form 0.5 x (1 + erf(x / sqrt 2)), written as 0.5 x erfc(-x / sqrt 2); or torch's tanh form."""
    x = np.asarray(_float(x))
    w = x.astype(_work_dtype(x), copy=False)
    if approximate == "tanh":
        return (0.5 * w * (1 + np.tanh(math.sqrt(2 / math.pi) * (w + 0.044715 * w ** 3)))).astype(x.dtype)
    return (0.5 * w * _erfc(w * -(1 / math.sqrt(2)))).astype(x.dtype, copy=False)


def _maximum(a: Any, b: Any) -> Any:
    return np.maximum(a, b)


def _minimum(a: Any, b: Any) -> Any:
    return np.minimum(a, b)


def _pow(a: Any, b: Any) -> Any:
    return _BINARY[ast.Pow](a, b)


def _clip(x: Any, lo: Any, hi: Any) -> Any:
    return np.clip(x, lo, hi)


def _where(cond: Any, a: Any, b: Any) -> Any:
    return np.where(cond, a, b)


def _round_to_bf16(x: np.ndarray) -> np.ndarray:
    return bf16_to_f32(f32_to_bf16(x))


def _is_bf16(dtype: Any) -> bool:
    return isinstance(dtype, DType) and dtype == dtypes.bf16


def _cast(x: Any, dtype: Any) -> Any:
    out = np.asarray(x).astype(_np_dtype(dtype))
    return _round_to_bf16(out) if _is_bf16(dtype) else out


def _bitcast(x: Any, dtype: Any) -> Any:
    x = np.asarray(x)
    if _is_bf16(dtype):  # bf16 values are held as float32: reinterpret the 16 bits, then widen
        return bf16_to_f32(np.ascontiguousarray(x).view(np.uint16))
    if x.dtype == np.float32 and _np_dtype(dtype).itemsize == 2:  # from bf16 (held as float32) to 16 bits
        return f32_to_bf16(x).view(_np_dtype(dtype))
    return x.view(_np_dtype(dtype))


# --------------------------------------------------------------------------------------------------------------
# reductions


def _sum(x: Any, axis: Any = None, keepdim: bool = False) -> Any:
    return np.sum(x, axis=_axis_arg(axis), keepdims=keepdim)


def _max(x: Any, axis: Any = None, keepdim: bool = False) -> Any:
    return np.max(x, axis=_axis_arg(axis), keepdims=keepdim)


def _min(x: Any, axis: Any = None, keepdim: bool = False) -> Any:
    return np.min(x, axis=_axis_arg(axis), keepdims=keepdim)


def _prod(x: Any, axis: Any = None, keepdim: bool = False) -> Any:
    return np.prod(x, axis=_axis_arg(axis), keepdims=keepdim)


def _mean(x: Any, axis: Any = None, keepdim: bool = False) -> Any:
    return np.mean(x, axis=_axis_arg(axis), keepdims=keepdim)


def _argmax(x: Any, axis: int | None = None, keepdim: bool = False) -> Any:
    return np.argmax(x, axis=axis, keepdims=keepdim)


def _argmin(x: Any, axis: int | None = None, keepdim: bool = False) -> Any:
    return np.argmin(x, axis=axis, keepdims=keepdim)


def _var(x: Any, axis: Any = None, keepdim: bool = False, ddof: int | None = None,
         correction: int | None = None) -> Any:
    return np.var(x, axis=_axis_arg(axis), ddof=ddof if ddof is not None else correction or 0, keepdims=keepdim)


def _std(x: Any, axis: Any = None, keepdim: bool = False, ddof: int | None = None,
         correction: int | None = None) -> Any:
    return np.std(x, axis=_axis_arg(axis), ddof=ddof if ddof is not None else correction or 0, keepdims=keepdim)


def _logsumexp(x: Any, axis: Any = None, keepdim: bool = False) -> Any:
    x = np.asarray(_float(x))
    axes = _axes(axis, x.ndim)
    m = np.max(x, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)  # an all -inf (or inf, nan) slice must not poison the shift
    out = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return out if keepdim else out.reshape([s for i, s in enumerate(out.shape) if i not in axes])


def _softmax(x: Any, axis: int = -1) -> Any:
    e = np.asarray(_float(x))
    e = e - e.max(axis=axis, keepdims=True)
    np.exp(e, out=e)
    e /= e.sum(axis=axis, keepdims=True)
    return e


def _log_softmax(x: Any, axis: int = -1) -> Any:
    z = np.asarray(_float(x))
    z = z - z.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


# --------------------------------------------------------------------------------------------------------------
# shapes


def _reshape(x: Any, *shape: Any) -> Any:
    return np.reshape(x, _shape_arg(shape))


def _permute(x: Any, *order: Any) -> Any:
    return np.transpose(x, _shape_arg(order))


def _transpose(x: Any, a: int = -2, b: int = -1) -> Any:
    return np.swapaxes(x, a, b) if np.ndim(x) >= 2 else x


def _expand(x: Any, *shape: Any) -> Any:
    x = np.asarray(x)
    want = _shape_arg(shape)
    have = (1,) * (len(want) - x.ndim) + x.shape
    return np.broadcast_to(x, tuple(h if w == -1 else w for h, w in zip(have, want)))


def _squeeze(x: Any, axis: Any = None) -> Any:
    return np.squeeze(x, axis=_axis_arg(axis))


def _unsqueeze(x: Any, axis: int) -> Any:
    return np.expand_dims(x, axis)


def _flatten(x: Any, start: int = 0, end: int = -1) -> Any:
    x = np.asarray(x)
    if x.ndim == 0:
        return x.reshape(1)
    s, e = start % x.ndim, end % x.ndim
    return x.reshape(x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:])


def _pad(x: Any, pads: Sequence[tuple[int, int]], value: Scalar = 0) -> Any:
    x = np.asarray(x)
    if any(b < 0 or a < 0 for b, a in pads):  # negative padding crops
        x = x[tuple(slice(max(-b, 0), s - max(-a, 0)) for (b, a), s in zip(pads, x.shape))]
        pads = [(max(b, 0), max(a, 0)) for b, a in pads]
    if all(b == 0 and a == 0 for b, a in pads):
        return x
    return np.pad(x, pads, constant_values=value)


def _flip(x: Any, axis: Any = None) -> Any:
    return np.flip(x, axis=_axis_arg(axis))


def _items(tensors: tuple) -> list[Any]:
    return list(tensors[0]) if len(tensors) == 1 and isinstance(tensors[0], (tuple, list)) else list(tensors)


def _cat(*tensors: Any, axis: int = 0) -> Any:
    return np.concatenate(_items(tensors), axis=axis)


def _stack(*tensors: Any, axis: int = 0) -> Any:
    return np.stack(_items(tensors), axis=axis)


# --------------------------------------------------------------------------------------------------------------
# creation


def _zeros(*shape: Any, dtype: Any = dtypes.f32) -> Any:
    return np.zeros(_shape_arg(shape), _np_dtype(dtype))


def _ones(*shape: Any, dtype: Any = dtypes.f32) -> Any:
    return np.ones(_shape_arg(shape), _np_dtype(dtype))


def _full(shape: Any, value: Scalar, dtype: Any = None) -> Any:
    return np.full(_shape_arg((shape,)), value, _literal_dtype(value) if dtype is None else _np_dtype(dtype))


def _arange(start: Scalar, stop: Scalar | None = None, step: Scalar = 1, dtype: Any = None) -> Any:
    if dtype is None:
        dtype = dtypes.f32 if any(isinstance(v, float) for v in (start, stop, step)) else dtypes.i32
    if stop is None:
        start, stop = 0, start
    return np.arange(start, stop, step, dtype=_np_dtype(dtype))


def _eye(n: int, m: int | None = None, dtype: Any = dtypes.f32) -> Any:
    return np.eye(n, m, dtype=_np_dtype(dtype))


# --------------------------------------------------------------------------------------------------------------
# neural-net helpers


def _matmul(a: Any, b: Any) -> Any:
    """np.matmul, with integer products in tgc's result type (i8 @ i8 multiplies and sums in int32)."""
    a, b = np.asarray(a), np.asarray(b)
    kind = np.result_type(a, b).kind
    if kind in "biu" and np.result_type(a, b).itemsize < 4:
        wide = np.uint32 if kind == "u" else np.int32
        a, b = a.astype(wide), b.astype(wide)
    return np.matmul(a, b)


def _conv2d(x: Any, w: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Any:
    """im2col: windows of the padded input copied once into columns, then one matmul per group (BLAS for floats)."""
    x, w = np.asarray(x), np.asarray(w)
    (sh, sw), (ph, pw), (dh, dw) = _pair2(stride), _pair2(padding), _pair2(dilation)
    if ph or pw:
        x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    n = x.shape[0]
    o, ci, kh, kw = w.shape
    g = groups
    # (N, C, OH, OW, KH, KW): every window, strided and dilated; windows that do not fit are dropped
    span = (dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    win = sliding_window_view(x, span, axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    oh, ow = win.shape[2:4]
    # columns (G, Ci*KH*KW, N*OH*OW): one wide GEMM per group, which OpenBLAS runs far faster than N narrow ones
    cols = win.reshape(n, g, ci, oh, ow, kh, kw).transpose(1, 2, 5, 6, 0, 3, 4).reshape(g, ci * kh * kw, -1)
    out = np.matmul(w.reshape(g, o // g, ci * kh * kw), cols)  # (G, O/G, N*OH*OW)
    return out.reshape(o, n, oh, ow).transpose(1, 0, 2, 3)


# up to this many window positions, pooling combines shifted strided views of the input elementwise (a few fast
# passes); a reduction over the small trailing axes of a window view is many times slower in numpy
_MAX_SHIFTED_VIEWS = 49


def _pool(x: np.ndarray, kernel: Any, stride: Any, combine: np.ufunc, reduce: Callable[..., Any]) -> Any:
    (kh, kw), (sh, sw) = _pair2(kernel), _pair2(kernel if stride is None else stride)
    if kh * kw > _MAX_SHIFTED_VIEWS:
        win = sliding_window_view(x, (kh, kw), axis=(-2, -1))[..., ::sh, ::sw, :, :]
        return reduce(win, axis=(-2, -1))
    h, w = x.shape[-2:]
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1  # windows that do not fit are dropped
    views = [x[..., i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw] for i in range(kh) for j in range(kw)]
    if len(views) == 1:
        return views[0].copy()
    out = combine(views[0], views[1])
    for v in views[2:]:
        combine(out, v, out=out)
    return out


def _max_pool2d(x: Any, kernel: Any, stride: Any = None) -> Any:
    return _pool(np.asarray(x), kernel, stride, np.maximum, np.max)


def _avg_pool2d(x: Any, kernel: Any, stride: Any = None) -> Any:
    kh, kw = _pair2(kernel)
    total = _pool(np.asarray(_float(x)), kernel, stride, np.add, np.sum)
    total /= kh * kw
    return total


def _layernorm(x: Any, axis: Any = -1, eps: float = 1e-5) -> Any:
    x = np.asarray(_float(x))
    axes = _axis_arg(axis)
    d = x - x.mean(axis=axes, keepdims=True)
    var = np.mean(d * d, axis=axes, keepdims=True)
    return d / np.sqrt(var + eps)


# --------------------------------------------------------------------------------------------------------------
# the operations of tgc/dsl/library.py and tgc/dsl/indexing.py (docs/LANGUAGE.md)


def _log1p(x: Any) -> Any:
    return np.log1p(_float(x))


def _expm1(x: Any) -> Any:
    return np.expm1(_float(x))


def _atan(x: Any) -> Any:
    return np.arctan(_float(x))


def _atan2(y: Any, x: Any) -> Any:
    return np.arctan2(_float(y), _float(x))


def _isnan(x: Any) -> Any:
    return np.isnan(x)


def _isinf(x: Any) -> Any:
    return np.isinf(x)


def _isfinite(x: Any) -> Any:
    return np.isfinite(x)


def _silu(x: Any) -> Any:
    x = _float(x)
    return x / (1 + np.exp(-x))


def _softplus(x: Any, beta: float = 1.0, threshold: float = 20.0) -> Any:
    x = _float(x)
    return np.where(x * beta > threshold, x, np.log1p(np.exp(x * beta)) / beta)


def _elu(x: Any, alpha: float = 1.0) -> Any:
    x = _float(x)
    return np.where(x > 0, x, alpha * np.expm1(x))


def _leaky_relu(x: Any, negative_slope: float = 0.01) -> Any:
    x = _float(x)
    return np.where(x < 0, x * negative_slope, x)


def _clamp(x: Any, min: Any = None, max: Any = None) -> Any:  # noqa: A002 - torch's names
    out = x if min is None else np.maximum(x, min)
    return out if max is None else np.minimum(out, max)


def _astype(x: Any, dtype: Any) -> Any:
    return _cast(x, dtype)


def _zeros_like(x: Any, dtype: Any = None) -> Any:
    return np.zeros_like(x, dtype=None if dtype is None else _np_dtype(dtype))


def _ones_like(x: Any, dtype: Any = None) -> Any:
    return np.ones_like(x, dtype=None if dtype is None else _np_dtype(dtype))


def _full_like(x: Any, fill_value: Scalar, dtype: Any = None) -> Any:
    return np.full_like(x, fill_value, dtype=None if dtype is None else _np_dtype(dtype))


def _any(x: Any, axis: Any = None, keepdim: bool = False) -> Any:
    return np.any(x, axis=_axis_arg(axis), keepdims=keepdim)


def _all(x: Any, axis: Any = None, keepdim: bool = False) -> Any:
    return np.all(x, axis=_axis_arg(axis), keepdims=keepdim)


def _tril(x: Any, k: int = 0) -> Any:
    return np.tril(x, k)


def _triu(x: Any, k: int = 0) -> Any:
    return np.triu(x, k)


def _split(x: Any, indices_or_sections: Any, axis: int = 0) -> Any:
    return tuple(np.split(x, list(indices_or_sections) if isinstance(indices_or_sections, tuple) else
                          indices_or_sections, axis=axis))


def _chunk(x: Any, chunks: int, axis: int = 0) -> Any:
    n = np.shape(x)[axis]
    size = max(1, -(-n // chunks))
    return tuple(np.split(x, list(range(size, n, size)), axis=axis))


def _repeat(x: Any, repeats: Any, axis: int | None = None) -> Any:
    return np.repeat(x, repeats, axis=axis)


def _tile(x: Any, reps: Any) -> Any:
    return np.tile(x, reps)


def _scan_dtype(x: np.ndarray) -> Any:
    """cumsum/cumprod keep tgc's sum dtype (small ints give 32 bits, as `sum` does)."""
    return {"b": np.int32, "i": np.int32 if x.dtype.itemsize < 4 else None,
            "u": np.uint32 if x.dtype.itemsize < 4 else None}.get(x.dtype.kind)


def _cumsum(x: Any, axis: int | None = None) -> Any:
    x = np.asarray(x)
    return np.cumsum(x, axis=axis, dtype=_scan_dtype(x))


def _cumprod(x: Any, axis: int | None = None) -> Any:
    x = np.asarray(x)
    return np.cumprod(x, axis=axis, dtype=_scan_dtype(x))


def _sort(x: Any, axis: int | None = -1, descending: bool = False) -> Any:
    x = np.asarray(x)
    if descending:
        return np.take_along_axis(x, _argsort(x, axis, True), axis=axis) if axis is not None else \
            x.reshape(-1)[_argsort(x, None, True)]
    return np.sort(x, axis=axis, kind="stable")


def _argsort(x: Any, axis: int | None = -1, descending: bool = False) -> Any:
    x = np.asarray(x)
    if axis is None:
        x, axis = x.reshape(-1), -1
    if not descending:
        return np.argsort(x, axis=axis, kind="stable").astype(np.int32)
    if x.dtype.kind == "f":  # stable, nan first: primary key "not nan", then -x
        return np.lexsort((-x, ~np.isnan(x)), axis=axis).astype(np.int32)
    return np.argsort(~x, axis=axis, kind="stable").astype(np.int32)  # ~ reverses the order of ints and bools


def _topk(x: Any, k: int, axis: int = -1, largest: bool = True, sorted: bool = True) -> Any:  # noqa: A002
    x = np.asarray(x)
    order = _argsort(x, axis, largest)
    idx = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx


def _einsum(subscripts: str, *operands: Any) -> Any:
    return np.einsum(subscripts, *operands)


def _clamp_index(idx: Any, n: int) -> Any:
    """tgc's index rule: a negative index wraps once, then every index is clamped into [0, n)."""
    i = np.asarray(idx)
    if i.dtype.kind == "i":
        i = np.where(i < 0, i.astype(np.int64) + n, i)
    return np.clip(i, 0, max(n - 1, 0)).astype(np.int64)


def _take(x: Any, indices: Any, axis: int | None = None) -> Any:
    x = np.asarray(x)
    n = x.size if axis is None else x.shape[axis]
    return np.take(x, _clamp_index(indices, n), axis=axis)


def _take_along_axis(x: Any, indices: Any, axis: int | None = -1) -> Any:
    x = np.asarray(x)
    n = x.size if axis is None else x.shape[axis]
    return np.take_along_axis(x, _clamp_index(indices, n), axis=axis)


def _gather(x: Any, axis: int, index: Any) -> Any:
    x, idx = np.asarray(x), np.asarray(index)
    part = x[tuple(slice(None) if d == axis % x.ndim else slice(0, n) for d, n in enumerate(idx.shape))]
    return np.take_along_axis(part, _clamp_index(idx, x.shape[axis]), axis=axis)


def _scatter_add(x: Any, axis: int, index: Any, src: Any) -> Any:
    x = np.array(x)
    idx = _clamp_index(index, x.shape[axis])
    src = np.asarray(src, x.dtype)
    shape = np.broadcast_shapes(idx.shape, src.shape)
    idx, src = np.broadcast_to(idx, shape), np.broadcast_to(src, shape)
    grid = list(np.indices(shape, sparse=True))
    grid[axis] = idx
    np.add.at(x, tuple(grid), src)
    return x


def _index_item(x: np.ndarray, key: Any) -> Any:
    """x[key] with tgc's index rule applied to index arrays (numpy would raise on an index out of range)."""
    if not isinstance(key, tuple):
        key = (key,)
    if not any(isinstance(k, np.ndarray) for k in key):
        return x[key if len(key) != 1 else key[0]]
    consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
    out, dim = [], 0
    for k in key:
        if k is Ellipsis:
            out.append(k)
            dim += x.ndim - consumed
        elif k is None:
            out.append(k)
        else:
            out.append(_clamp_index(k, x.shape[dim]) if isinstance(k, np.ndarray) else k)
            dim += 1
    return x[tuple(out)]


_UFUNCS = ("exp", "log", "exp2", "log2", "sqrt", "sin", "cos", "tan", "tanh")  # numpy's own, on floats
_INT_EXACT = ("floor", "ceil", "trunc", "round")  # numpy's own; ints and bools pass through


def _twin(name: str) -> Callable[..., Any]:
    """The numpy twin of tgc's function `name`: numpy's ufunc, or this module's `_name`, which takes the same
    parameter names, so positional and keyword calls bind alike."""
    if name in _UFUNCS:
        return _ufunc(getattr(np, name))
    if name in _INT_EXACT:
        return _exact_for_ints(getattr(np, name))
    if name in numpy_nnlib.FUNCTIONS:  # the ONNX-semantics operators (tgc/dsl/nnlib.py)
        return numpy_nnlib.FUNCTIONS[name]
    return globals()[f"_{name}"]


# every function of tgc's table (`tgc.dsl.functions.FUNCTIONS`, the one list of names), by its numpy twin
FUNCTIONS: dict[str, Callable[..., Any]] = {name: _twin(name) for name in DSL_FUNCTIONS}

_CONSTANTS: dict[str, Any] = {"True": True, "False": False, "inf": math.inf, "nan": math.nan, "pi": math.pi,
                              "e": math.e, **dtypes.by_name}
_ATTRIBUTES = ("T", "shape", "ndim", "dtype", "size")

# --------------------------------------------------------------------------------------------------------------
# compiling the syntax tree into closures


class _Const:
    """A thunk whose value is known when the program is compiled (literals, dtype names, constant indices)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __call__(self, env: Env) -> Any:
        return self.value


class _Compiler:
    """Turns checked expressions into `env -> value` closures; `defined` holds the names bound so far. In a
    function's body (`lenient`) other names are looked up when the function runs (the program's top level, which
    the front end has checked); `functions` are the program's `def`s."""

    def __init__(self, defined: set[str], functions: dict[str, ast.FunctionDef] | None = None,
                 lenient: bool = False, compiled: dict[str, Any] | None = None):
        self.defined, self.lenient = defined, lenient
        self.functions = functions or {}
        self.compiled = {} if compiled is None else compiled  # function name -> (params, steps, return thunk)

    def block(self, stmts: list[ast.stmt]) -> list[Callable[[Env], None]]:
        """Closures that run statements (assignments and unrolled `for` loops) on an environment."""
        steps: list[Callable[[Env], None]] = []
        for stmt in stmts:
            if isinstance(stmt, ast.For):
                call = stmt.iter
                assert isinstance(call, ast.Call) and isinstance(stmt.target, ast.Name)
                bounds = [self.expr(a) for a in call.args]
                var = stmt.target.id
                # a name the body assigns may be read before its assignment on later iterations (checked by
                # the front end when it unrolled the loop)
                self.defined.update(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)
                                    and isinstance(n.ctx, ast.Store))
                body = self.block(stmt.body)

                def loop(env: Env, bounds=bounds, var=var, body=body) -> None:
                    for i in range(*[int(b(env)) for b in bounds]):
                        env[var] = i
                        for step in body:
                            step(env)
                steps.append(loop)
                continue
            if isinstance(stmt, ast.Assign):
                target, value = stmt.targets[0], stmt.value
            else:  # name op= expr, never in place: the name may still alias an input or another value
                assert isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name)
                target = stmt.target
                value = ast.BinOp(left=ast.Name(stmt.target.id), op=stmt.op, right=stmt.value)
            thunk = self.expr(value)
            if isinstance(target, ast.Name):
                steps.append(lambda env, n=target.id, t=thunk: env.__setitem__(n, t(env)))
                self.defined.add(target.id)
            else:
                names = [e.id for e in target.elts]  # type: ignore[attr-defined]

                def unpack(env: Env, names=names, t=thunk) -> None:
                    for n, v in zip(names, t(env)):
                        env[n] = v
                steps.append(unpack)
                self.defined.update(names)
        return steps

    def _function(self, name: str) -> Any:
        if name not in self.compiled:
            fdef = self.functions[name]
            params = [p.arg for p in (*fdef.args.posonlyargs, *fdef.args.args)]
            body, ret = function_body(fdef)
            sub = _Compiler(set(params), self.functions, lenient=True, compiled=self.compiled)
            steps = sub.block(body)
            self.compiled[name] = (params, steps, sub.expr(ret))
        return self.compiled[name]

    def expr(self, node: ast.expr) -> Thunk:
        compile_node = {
            ast.Constant: self._constant, ast.Name: self._name, ast.Tuple: self._tuple, ast.List: self._tuple,
            ast.BinOp: self._binop, ast.Compare: self._compare, ast.UnaryOp: self._unaryop, ast.IfExp: self._ifexp,
            ast.Attribute: self._attribute, ast.Call: self._call, ast.Subscript: self._subscript,
            ast.Slice: self._index,
        }.get(type(node))
        if compile_node is None:
            raise NotImplementedError(f"numpy baseline: {type(node).__name__} expressions are not supported")
        return compile_node(node)  # type: ignore[operator]

    def _constant(self, node: ast.Constant) -> Thunk:
        return _Const(node.value)

    def _name(self, node: ast.Name) -> Thunk:
        if node.id in self.defined:
            return operator.itemgetter(node.id)
        if self.lenient:
            const = _CONSTANTS.get(node.id)
            return lambda env, n=node.id: env[n] if n in env else const
        if node.id in _CONSTANTS:
            return _Const(_CONSTANTS[node.id])
        raise NameError(f"numpy baseline: unknown name '{node.id}'")

    def _tuple(self, node: ast.Tuple | ast.List) -> Thunk:
        items = [self.expr(e) for e in node.elts]
        if all(isinstance(t, _Const) for t in items):
            return _Const(tuple(t.value for t in items))  # type: ignore[attr-defined]
        return lambda env: tuple(t(env) for t in items)

    def _binop(self, node: ast.BinOp) -> Thunk:
        fn, left, right = _BINARY[type(node.op)], self.expr(node.left), self.expr(node.right)
        return lambda env: fn(left(env), right(env))

    def _compare(self, node: ast.Compare) -> Thunk:
        fn, left, right = _COMPARE[type(node.ops[0])], self.expr(node.left), self.expr(node.comparators[0])
        plain = _PLAIN_COMPARE[type(node.ops[0])]

        def compare(env: Env) -> Any:
            a, b = left(env), right(env)
            if type(a) in _PY_SCALARS and type(b) in _PY_SCALARS:  # two numbers known when compiling (i == 0)
                return plain(a, b)
            return fn(a, b)
        return compare

    def _unaryop(self, node: ast.UnaryOp) -> Thunk:
        fn, operand = _UNARY[type(node.op)], self.expr(node.operand)
        return lambda env: fn(operand(env))

    def _ifexp(self, node: ast.IfExp) -> Thunk:
        cond, a, b = self.expr(node.test), self.expr(node.body), self.expr(node.orelse)

        def ifexp(env: Env) -> Any:
            c = cond(env)
            if isinstance(c, bool):  # known when compiling: one branch, as the front end does
                return a(env) if c else b(env)
            return np.where(c, a(env), b(env))
        return ifexp

    def _attribute(self, node: ast.Attribute) -> Thunk:
        if node.attr not in _ATTRIBUTES:
            raise NotImplementedError(f"numpy baseline: attribute '{node.attr}' is not supported")
        value, get = self.expr(node.value), operator.attrgetter(node.attr)
        return lambda env: get(value(env))

    def _call(self, node: ast.Call) -> Thunk:
        if isinstance(node.func, ast.Attribute):  # x.f(...) is f(x, ...)
            name, args = node.func.attr, [self.expr(node.func.value)]
        elif isinstance(node.func, ast.Name):
            name, args = node.func.id, []
            if name in self.functions:
                return self._user_call(node, name)
        else:
            raise NotImplementedError("numpy baseline: only named functions can be called")
        fn = FUNCTIONS.get(name)
        if fn is None:
            raise NotImplementedError(f"numpy baseline: function '{name}' is not supported")
        args += [self.expr(a) for a in node.args]
        kwargs = {kw.arg: self.expr(kw.value) for kw in node.keywords if kw.arg is not None}
        if not kwargs:
            return lambda env: fn(*[a(env) for a in args])
        return lambda env: fn(*[a(env) for a in args], **{k: v(env) for k, v in kwargs.items()})

    def _user_call(self, node: ast.Call, name: str) -> Thunk:
        """A call of the program's own function: its statements run in a scope of its own (in front of the
        program's top level, Python's rule)."""
        params, steps, ret = self._function(name)
        args = [self.expr(a) for a in node.args]
        kwargs = {kw.arg: self.expr(kw.value) for kw in node.keywords if kw.arg is not None}

        def call(env: Env) -> Any:
            local = dict(zip(params, (a(env) for a in args)))
            local.update((k, v(env)) for k, v in kwargs.items())
            top = env.maps[-1] if isinstance(env, ChainMap) else env
            scope: Any = ChainMap(local, top)
            for step in steps:
                step(scope)
            return ret(scope)
        return call

    def _subscript(self, node: ast.Subscript) -> Thunk:
        value, index = self.expr(node.value), self._index(node.slice)
        if isinstance(index, _Const) and not _has_array(index.value):
            key = index.value
            return lambda env: value(env)[key]
        return lambda env: _index_item(value(env), index(env))

    def _index(self, node: ast.expr) -> Thunk:
        if isinstance(node, ast.Slice):
            parts = [_Const(None) if p is None else self.expr(p) for p in (node.lower, node.upper, node.step)]
            if all(isinstance(p, _Const) for p in parts):
                return _Const(slice(*(p.value for p in parts)))  # type: ignore[attr-defined]
            return lambda env: slice(*(p(env) for p in parts))
        if isinstance(node, ast.List):  # x[[0, 2]]: an index array
            items = self.expr(node)
            if isinstance(items, _Const):
                return _Const(np.array(items.value, np.int64))
            return lambda env: np.array(items(env), np.int64)
        if isinstance(node, ast.Tuple):
            items = [self._index(e) for e in node.elts]
            if all(isinstance(t, _Const) for t in items):
                return _Const(tuple(t.value for t in items))  # type: ignore[attr-defined]
            return lambda env: tuple(t(env) for t in items)
        return self.expr(node)


def _has_array(key: Any) -> bool:
    return isinstance(key, np.ndarray) or (isinstance(key, tuple) and any(isinstance(k, np.ndarray) for k in key))


def _as_output(v: Any) -> np.ndarray:
    if _is_scalar(v):
        return np.asarray(v, _literal_dtype(v))
    return np.asarray(v)


class NumpyProgram:
    """A `.tg` program compiled to numpy closures; call it with {input name: array} to get {output name: array}."""

    def __init__(self, parsed: Parsed, dims: dict[str, int]):
        self.output_names = list(parsed.output_names)
        self._inputs: list[tuple[str, np.dtype, bool, tuple[int, ...] | None]] = []
        self._decls, self._dims = list(parsed.inputs), dict(dims)
        self._dim_names = dim_names(parsed)
        for decl in parsed.inputs:
            known = all(n in dims for d in decl.shape
                        for n in ([d] if isinstance(d, str) else d.names() if isinstance(d, DimExpr) else []))
            shape = concrete_shape(decl, dims) if known else None
            self._inputs.append((decl.name, _np_dtype(decl.dtype), decl.dtype == dtypes.bf16, shape))
        # dim names are integer values: read from the environment, where __call__ puts them
        compiler = _Compiler({decl.name for decl in parsed.inputs} | set(self._dim_names), parsed.functions)
        self._steps = compiler.block(parsed.body)
        self._outputs = [compiler.expr(r) for r in parsed.returns]

    def _input(self, name: str, value: Any, dtype: np.dtype, bf16: bool, shape: tuple[int, ...] | None) -> Any:
        arr = np.asarray(value)
        if bf16 and arr.dtype == np.uint16:  # bf16 given as its bits
            arr = bf16_to_f32(arr)
        elif arr.dtype != dtype:
            arr = arr.astype(dtype)
        if shape is not None and arr.shape != shape:
            raise ValueError(f"input '{name}' has shape {arr.shape}, expected {shape}")
        return arr

    def _dim_values(self, inputs: dict[str, Any]) -> dict[str, int]:
        """The dims given, then those the inputs' shapes bind (plain names, then simply solvable expressions)."""
        dims = dict(self._dims)
        for decl in self._decls:
            shape = np.shape(inputs[decl.name])
            for want, have in zip(decl.shape, shape):
                if isinstance(want, str):
                    dims.setdefault(want, int(have))
        for decl in self._decls:
            for want, have in zip(decl.shape, np.shape(inputs[decl.name])):
                if isinstance(want, DimExpr) and (solved := solve_dim(want, int(have), dims)) is not None:
                    dims[solved[0]] = solved[1]
        return dims

    def __call__(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        env: Env = {name: self._input(name, inputs[name], dt, bf16, shape) for name, dt, bf16, shape in self._inputs}
        if self._dim_names:
            dims = self._dim_values(inputs)
            env.update((n, dims[n]) for n in self._dim_names if n in dims)
        with np.errstate(all="ignore"):
            for step in self._steps:
                step(env)
            return {name: _as_output(out(env)) for name, out in zip(self.output_names, self._outputs)}


def numpy_program(prog: Any, dims: dict[str, int]) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """`prog` (a `tgc.Program` or its `Parsed`) as a numpy function of {input name: array}.

    The syntax tree is walked once, here; `dims` fixes the expected input shapes (dims it lacks are unchecked).
    """
    parsed = prog.parsed if hasattr(prog, "parsed") else prog
    return NumpyProgram(parsed, dict(dims or {}))


def time_numpy(prog: Any, dims: dict[str, int], inputs: dict[str, np.ndarray], repeat: int,
               tgc_median: float) -> dict[str, float]:
    """`tgc bench --vs numpy`: the program run by numpy (in the inputs' own dtypes) on the same inputs, and
    its median time over tgc's (`ratio`)."""
    fn = numpy_program(prog, dims)
    fn(inputs)
    times = []
    for _ in range(max(repeat, 1)):
        st = time.perf_counter()
        fn(inputs)
        times.append(time.perf_counter() - st)
    med = statistics.median(times)
    return {"median_s": med, "min_s": min(times), "ratio": med / tgc_median if tgc_median > 0 else 0.0}
