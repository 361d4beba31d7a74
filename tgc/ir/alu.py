"""The one ALU table: what each elementwise op computes, per dtype, on numpy values.

Constant folding (`tgc.ir.symbolic`), the float64 reference (`tgc.engine.reference`) and the PYTHON device's
interpreter (`tgc.backends.python`) all evaluate ops here, so the three cannot disagree. The semantics are the
LLVM renderer's (`tgc.backends.llvmir`), which DSL.md fixes for every device:

- ints wrap; IDIV/MOD are C's (truncate toward zero; a zero divisor gives 0);
- shifts by the width or more (or by a negative amount, read as unsigned) give 0, or the sign for a signed SHR;
- floats are IEEE in the value's dtype; float MAX is numpy's maximum (a nan on either side wins, as
  `llvm.maximum`; which zero max(-0.0, 0.0) gives is unspecified); RECIP is `1 / x`; float MOD is C's
  fmod (exact; the front end builds numpy's floor `%` and `//` from it);
- float -> int casts truncate and saturate to the type's range, nan -> 0; int -> int casts wrap;
- bools: ADD/MAX/OR are `or`, MUL/AND `and`, SUB/XOR `xor` (i1 arithmetic); NEG is the identity;
- bf16 values are their uint16 bits (`tgc.dtype.f32_to_bf16` / `bf16_to_f32`); arithmetic on them has been
  legalized to f32 and is refused here.

Every function takes numpy arrays (or scalars) and broadcasts; callers hold `np.errstate(all="ignore")` where
overflow or nan warnings would be noise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tgc.dtype import DType, bf16_to_f32, dtypes, f32_to_bf16, min_max, truncate
from tgc.ir.uop import BINARY, COMPARE, UNARY, Ops


class AluError(Exception):
    """An op on a dtype it is not defined for (a lowering bug, not a user error)."""


def reg_dtype(d: DType) -> np.dtype:
    """The numpy dtype of a value of `d`: bool as bool, bf16 as its uint16 bits."""
    return np.dtype(np.bool_) if d.is_bool else d.np


def const(value: Any, d: DType) -> np.ndarray:
    """A constant as a 0-d value of `d` (ints wrap, floats round; bf16 as its bits)."""
    if d.name == "bf16":
        return f32_to_bf16(np.array(value, np.float32))
    if d.is_bool:
        return np.array(bool(value))
    if d.is_int:
        return np.array(truncate(value, d), d.np)
    with np.errstate(over="ignore"):  # a literal past the dtype's range rounds to +-inf (IEEE), without a warning
        return np.array(float(value), d.np)


_BOOL_BINARY: dict[Ops, Callable[[Any, Any], Any]] = {
    Ops.ADD: np.logical_or, Ops.MAX: np.logical_or, Ops.OR: np.logical_or,
    Ops.MUL: np.logical_and, Ops.AND: np.logical_and, Ops.IDIV: np.logical_and,  # udiv i1: the divisor is 1
    Ops.SUB: np.logical_xor, Ops.XOR: np.logical_xor,
    Ops.MOD: lambda a, b: np.zeros(np.broadcast(a, b).shape, np.bool_),
    Ops.SHL: lambda a, b: np.logical_and(a, np.logical_not(b)),  # shifting by 1 (>= the width) gives 0
    Ops.SHR: lambda a, b: np.broadcast_to(a, np.broadcast(a, b).shape).copy(),  # ashr by min(b, 0)
}
_COMPARE = {Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal}
_BITWISE = {Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor}
F32_SMALLEST_NORMAL = np.float32(2.0 ** -126)  # f32 exp2 flushes results below it to 0 (transcendental.py)
_FLOAT_UNARY = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt, Ops.TRUNC: np.trunc}


def _binary(op: Ops, d: DType, a: Any, b: Any) -> Any:
    if op in _COMPARE:
        return _COMPARE[op](a, b)
    if d.name == "bf16":
        raise AluError(f"{op.name} on bf16 bits (it is computed in f32)")
    if d.is_bool:
        if op not in _BOOL_BINARY:
            raise AluError(f"{op.name} on bool")
        return _BOOL_BINARY[op](a, b)
    if op is Ops.ADD:
        return np.add(a, b)
    if op is Ops.SUB:
        return np.subtract(a, b)
    if op is Ops.MUL:
        return np.multiply(a, b)
    if op is Ops.MAX:
        return np.maximum(a, b)  # floats: a nan on either side wins (numpy's maximum, LLVM's llvm.maximum)
    if d.is_float:
        if op is Ops.FDIV:
            return np.divide(a, b)
        if op is Ops.MOD:
            return np.fmod(a, b)  # C's fmod (LLVM's frem): exact, the dividend's sign; nan for a zero divisor
        raise AluError(f"{op.name} on {d.name}")
    if op in (Ops.IDIV, Ops.MOD):
        rem = np.fmod(a, b)  # C's remainder, 0 for a zero divisor
        return rem if op is Ops.MOD else np.floor_divide(np.subtract(a, rem), b)  # exact, so floor == trunc
    if op in _BITWISE:
        return _BITWISE[op](a, b)
    if op in (Ops.SHL, Ops.SHR):
        big = np.asarray(b, d.np).view(np.dtype(f"u{d.itemsize}")) >= d.bits  # `icmp uge`
        amount = np.where(big, d.np.type(d.bits - 1), b).astype(d.np)
        if op is Ops.SHR:
            raw = np.right_shift(a, amount)  # arithmetic for signed ints, logical for unsigned
            return raw if not d.is_unsigned else np.where(big, d.np.type(0), raw)
        return np.where(big, d.np.type(0), np.left_shift(a, amount))
    raise AluError(f"{op.name} on {d.name}")


def _unary(op: Ops, d: DType, x: Any) -> Any:
    if d.name == "bf16":
        raise AluError(f"{op.name} on bf16 bits (it is computed in f32)")
    if op is Ops.NEG:
        return x if d.is_bool else np.negative(x)  # `sub i1 0, x` is x
    if op is Ops.NOT:
        if d.is_float:
            raise AluError(f"NOT on {d.name}")
        return np.logical_not(x) if d.is_bool else np.invert(x)
    if not d.is_float:
        raise AluError(f"{op.name} on {d.name}")
    if op is Ops.RECIP:
        return np.divide(d.np.type(1), x)
    out = _FLOAT_UNARY[op](x)
    if op is Ops.EXP2 and d.name == "f32":  # results below f32's smallest normal are 0 on every device
        out = np.where(np.less(out, F32_SMALLEST_NORMAL), np.float32(0), out)
    return out


def exec_alu(op: Ops, d: DType, srcs: list[Any] | tuple[Any, ...]) -> np.ndarray:
    """`op` on `srcs`, computed in `d` (the operands' dtype: for a comparison that is not its bool result; for
    WHERE the dtype of its two values). The result has `d`'s numpy dtype (bool for comparisons)."""
    if op is Ops.WHERE:
        out = np.where(srcs[0], srcs[1], srcs[2])
    elif op in BINARY:
        out = _binary(op, d, srcs[0], srcs[1])
    elif op in UNARY:
        out = _unary(op, d, srcs[0])
    else:
        raise AluError(f"{op.name} is not an ALU op")
    want = np.dtype(np.bool_) if op in COMPARE else reg_dtype(d)
    out = np.asarray(out)
    return out if out.dtype == want else out.astype(want)


def cast(x: Any, s: DType, d: DType) -> np.ndarray:
    """A value of dtype `s` converted to `d` (numeric conversion; bf16 through f32)."""
    x = np.asarray(x)
    if s == d:
        return x
    if d.is_bool:
        return x != 0
    if s.name == "bf16":
        return cast(bf16_to_f32(x), dtypes.f32, d)
    if d.name == "bf16":
        return f32_to_bf16(cast(x, s, dtypes.f32))
    if s.is_float and not d.is_float:
        return _float_to_int(x, d)
    return x.astype(d.np)  # bool -> 0/1, float <-> float (RNE), int -> float, int -> int (wraps)


def _float_to_int(x: np.ndarray, d: DType) -> np.ndarray:
    """fptosi/fptoui.sat: truncate toward zero, clamp to the type's range, nan -> 0."""
    lo, hi = min_max(d)
    f = x.astype(np.float64)  # exact for every float dtype
    nan, small, big = np.isnan(f), f <= float(lo), f >= float(hi)
    inside = np.trunc(np.where(nan | small | big, 0.0, f)).astype(d.np)
    return np.where(nan, d.np.type(0), np.where(big, d.np.type(hi), np.where(small, d.np.type(lo), inside)))


def bitcast(x: Any, s: DType, d: DType) -> np.ndarray:
    """The bits of a value of `s` read as `d` (same size; a bool is a byte 0 or 1)."""
    if s.is_bool or d.is_bool:
        return cast(x, s, d)
    return np.asarray(x, reg_dtype(s)).view(reg_dtype(d))


_REDUCERS: dict[tuple[Ops, str], tuple[np.ufunc, Callable[[DType], Any]]] = {
    (Ops.ADD, "bool"): (np.logical_or, lambda d: False),
    (Ops.MUL, "bool"): (np.logical_and, lambda d: True),
    (Ops.MAX, "bool"): (np.logical_or, lambda d: False),
    (Ops.ADD, "num"): (np.add, lambda d: d.np.type(0)),
    (Ops.MUL, "num"): (np.multiply, lambda d: d.np.type(1)),
    (Ops.MAX, "float"): (np.maximum, lambda d: d.np.type(-np.inf)),  # a nan anywhere gives nan
    (Ops.MAX, "int"): (np.maximum, lambda d: d.np.type(min_max(d)[0])),
}


def reducer(op: Ops, d: DType) -> tuple[np.ufunc, Any]:
    """(ufunc, identity) of a reduction by `op` (ADD, MUL or MAX) in `d`: the binary op above, so bool ADD/MAX
    are `or`, MUL `and`; float MAX propagates nan (numpy's max)."""
    if d.name == "bf16":
        raise AluError("a reduction on bf16 bits (it is computed in f32)")
    if op not in (Ops.ADD, Ops.MUL, Ops.MAX):
        raise AluError(f"no reduction by {op.name}")
    kind = "bool" if d.is_bool else ("num" if op is not Ops.MAX else ("float" if d.is_float else "int"))
    fn, ident = _REDUCERS[(op, kind)]
    return fn, ident(d)
