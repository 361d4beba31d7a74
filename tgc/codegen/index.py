"""The width of a kernel's index arithmetic: i32 where it provably fits, i64 where it may not.

Scheduling and optimization write loop variables, addresses and launch indices in `dtypes.index`
(64-bit, never printed). Before linearizing, `narrow_index` gives the whole kernel one width:

- i32 when every index value in the kernel (each loop bound, constant and intermediate of the address
  math, by its symbolic `vmin`/`vmax`) lies in the i32 range: the common case, and the faster code;
- i64 otherwise (a buffer of more than 2^31 - 1 elements, or index math that passes through such values).

Launch values stay 32-bit in either case: the CPU's `core_id` and the other kernel arguments
(`DEFINE_VAR`), and GPU work-group and work-item indices (`SPECIAL`) are i32 and cast to i64 where the
kernel is wide, so the launch ABI does not change with the width.
"""

from __future__ import annotations

from tgc.dtype import DType, dtypes
from tgc.errors import CompileError
from tgc.ir.uop import Ops, PatternMatcher, UOp, UPat, graph_rewrite

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
_LEAVES = (Ops.DEFINE_VAR, Ops.SPECIAL)  # values the launch supplies: always i32


def is_index(d: DType | None) -> bool:
    return d is not None and d.scalar() == dtypes.index


def _fits(lo, hi, low: int, high: int) -> bool:
    return low <= lo and hi <= high


def index_width(ast: UOp) -> DType:
    """i32 when every index value of the kernel provably fits in i32, else i64 (CompileError past 64 bits)."""
    wide = False
    for u in ast.toposort():
        if not is_index(u.dtype):
            continue
        lo, hi = u.bounds
        if _fits(lo, hi, I32_MIN, I32_MAX):
            continue
        if u.op in _LEAVES:
            what = f"GPU index {u.arg[0]}" if u.op is Ops.SPECIAL else f"kernel argument {u.arg[0]}"
            raise CompileError(f"{what} ranges over [{lo}, {hi}], past what a 32-bit launch value holds")
        if not _fits(lo, hi, I64_MIN, I64_MAX):
            raise CompileError(f"an index of this kernel ranges over [{lo}, {hi}], past 64 bits",
                               hint="the tensors are too large to address")
        wide = True
    return dtypes.i64 if wide else dtypes.i32


def _narrow(width: DType, u: UOp) -> UOp | None:
    if is_index(u.dtype):
        if u.op in _LEAVES:
            leaf = UOp(u.op, dtypes.i32, u.src, u.arg)
            return leaf if width == dtypes.i32 else UOp(Ops.CAST, width, (leaf,))
        return UOp(u.op, width.vec(u.dtype.count), u.src, u.arg)
    if u.op is Ops.CAST and u.src[0].dtype == u.dtype and u.dtype.is_int:  # IOTA (an index cast) in an i32 kernel
        return u.src[0]
    return None


_narrow_rules = PatternMatcher([(UPat(name="u"), _narrow)])


def narrow_index(ast: UOp) -> UOp:
    """`ast` with every `dtypes.index` value in the kernel's index width (see the module docstring); a rewrite."""
    return graph_rewrite(ast, _narrow_rules, index_width(ast))
