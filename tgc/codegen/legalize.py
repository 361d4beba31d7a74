"""Rewrites that make a kernel AST easy for every backend to print.

- Half floats: arithmetic on f16 and bf16 runs in f32 and rounds back after each op (what numpy does);
  a half constant is rounded to its own type before it becomes f32;
  only loads, stores and casts ever see a half type. A cast between bf16 and anything but f32 goes
  through f32, so renderers need just two bf16 conversions.
"""

from __future__ import annotations

import numpy as np

from tgc.dtype import DType, bf16_to_f32, dtypes, f32_to_bf16
from tgc.ir.uop import ALU, COMPARE, Ops, PatternMatcher, UOp, UPat, graph_rewrite

HALF = (dtypes.f16, dtypes.bf16)


def _round_half(d: DType, v: object) -> object:
    """A half constant's value as its own type holds it (f16: numpy's rounding; bf16: `f32_to_bf16`, nearest
    even), so `x_f16 * 0.1` multiplies by f16's 0.1 as numpy's `x16 * np.float16(0.1)` does, not f32's."""
    if d not in HALF or not isinstance(v, float):
        return v
    with np.errstate(over="ignore"):  # a constant past the type's range is its inf
        return float(np.float16(v)) if d == dtypes.f16 else float(bf16_to_f32(f32_to_bf16(np.float32(v))))


def _f32(u: UOp) -> UOp:
    if u.dtype == dtypes.f32:
        return u
    if u.op is Ops.CONST:
        return UOp.const(dtypes.f32, _round_half(u.dtype, u.arg))
    return UOp(Ops.CAST, dtypes.f32, (u,))


def _promote_alu(x: UOp) -> UOp | None:
    if x.op in COMPARE:
        if not any(s.dtype in HALF for s in x.src):
            return None
        return x.replace(src=tuple(_f32(s) for s in x.src))
    if x.dtype not in HALF:
        return None
    if x.op is Ops.WHERE:
        return UOp(Ops.CAST, x.dtype, (UOp(Ops.WHERE, dtypes.f32, (x.src[0], _f32(x.src[1]), _f32(x.src[2]))),)) \
            if x.src[1].dtype in HALF else None
    return UOp(Ops.CAST, x.dtype, (UOp(x.op, dtypes.f32, tuple(_f32(s) for s in x.src), x.arg),))


def _split_bf16_cast(x: UOp) -> UOp | None:
    src = x.src[0]
    if src.dtype == dtypes.bf16 and x.dtype not in (dtypes.f32, dtypes.bf16):
        return UOp(Ops.CAST, x.dtype, (_f32(src),))
    if x.dtype == dtypes.bf16 and src.dtype not in (dtypes.f32, dtypes.bf16):
        return UOp(Ops.CAST, x.dtype, (UOp(Ops.CAST, dtypes.f32, (src,)),))
    return None


def _fold_cast_cast(x: UOp) -> UOp | None:
    inner = x.src[0]
    if inner.op is Ops.CAST and inner.src[0].dtype == x.dtype and x.dtype == dtypes.f32 and inner.dtype == dtypes.f32:
        return inner.src[0]
    if x.dtype == x.src[0].dtype:
        return x.src[0]
    return None


def _accumulate_half(x: UOp) -> UOp | None:
    if x.dtype not in HALF:
        return None
    return UOp(Ops.CAST, x.dtype, (UOp(Ops.REDUCE, dtypes.f32, (_f32(x.src[0]), *x.src[1:]), x.arg),))


half_rules = PatternMatcher([
    (UPat(ALU, name="x"), _promote_alu),
    (UPat(Ops.REDUCE, name="x"), _accumulate_half),
    (UPat(Ops.CAST, name="x"), _split_bf16_cast),
    (UPat(Ops.CAST, name="x"), _fold_cast_cast),
])


def legalize(ast: UOp) -> UOp:
    return graph_rewrite(ast, half_rules)
