"""Rewrites that make a kernel AST easy for every backend to print.

- Half floats: arithmetic on f16 and bf16 runs in f32 and rounds back after each op (what numpy does);
  only loads, stores and casts ever see a half type. A cast between bf16 and anything but f32 goes
  through f32, so renderers need just two bf16 conversions.
"""

from __future__ import annotations

from tgc.dtype import dtypes
from tgc.ir.uop import ALU, COMPARE, Ops, PatternMatcher, UOp, UPat, graph_rewrite

HALF = (dtypes.f16, dtypes.bf16)


def _f32(u: UOp) -> UOp:
    if u.dtype == dtypes.f32:
        return u
    if u.op is Ops.CONST:
        return UOp.const(dtypes.f32, u.arg)
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
