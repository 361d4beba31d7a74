"""Attention fusion, scheduler side: find `softmax(X) @ v` where X holds the scores `q @ k^T` (scaled, masked:
any elementwise expression of one or more matmuls and index math or other inputs), and cut it as ONE kernel.

The kernel's AST (`ScheduleItem.ast`) is the plain lowering of the chain (the row max and sum as nested
reductions): a correct reference that `--emit schedule` shows. Its `meta["attention"]` (an `AttentionSpec`)
holds the pieces `tgc.codegen.attention` lowers instead, as an online softmax over blocks of keys (a running
max, sum and output accumulator per query row; the scores are never stored).

What is fused: the last axis of X is the softmax axis and the contraction axis of the matmul with v; the batch
axes of X equal the output's. What is not: anything else (a softmax over another axis, `log_softmax`, a
softmax not followed by a matmul, a head dimension above `MAX_HEAD_DIM`, non-float results) keeps the
ordinary schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tgc.dtype import DType, dtypes
from tgc.ir.kernel import INDEX, flat_index
from tgc.ir.shapes import shape_of
from tgc.ir.uop import Ops, RangeKind, UOp

MAX_HEAD_DIM = 256  # the output row (Dv accumulators) is held in registers
_LOG2E = 1 / math.log(2)


@dataclass
class Match:
    """One fused attention: `p` the `weights @ v` reduction, `x` the softmax input (..., Tq, Tk), `v` the
    broadcast right-hand side (..., Tq, Tk, Dv), `inline` the matmuls inside X computed per score, and
    `operands` what the fused kernel reads (the scheduler walks these instead of the chain)."""

    p: UOp
    x: UOp
    v: UOp
    inline: frozenset[UOp]
    operands: tuple[UOp, ...]


@dataclass
class AttentionSpec:
    """What `tgc.codegen.attention` needs. Expressions are kernel-AST UOps over the ranges given: `loops`
    (batch axes, then the query row `ri`), `rj` (the key) and `rdv` (the output column), which the lowering
    replaces. `x` is the score at (loops, rj) (its inner products are REDUCEs), `v` the value at (rj, rdv),
    `out_index` the output element at (loops, rdv)."""

    loops: tuple[UOp, ...]
    rj: UOp
    rdv: UOp
    x: UOp
    v: UOp
    out: UOp
    out_index: UOp
    tk: int
    dv: int
    dtype: DType


def _strip(u: UOp) -> UOp:
    while u.op in (Ops.EXPAND, Ops.RESHAPE):
        u = u.src[0]
    return u


def _is_row_reduce(r: UOp, op: Ops, of: UOp) -> bool:
    """`r` is EXPAND(REDUCE_AXIS(op, last axis) of `of`) back to `of`'s shape."""
    if r.op is not Ops.EXPAND or tuple(r.arg) != shape_of(of):
        return False
    red = r.src[0].src[0] if r.src[0].op is Ops.CAST else r.src[0]  # half values are reduced in f32
    n = len(shape_of(of))
    if red.op is not Ops.REDUCE_AXIS or red.arg != (op, (n - 1,)):
        return False
    return red.src[0] is of or (red.src[0].op is Ops.CAST and red.src[0].src[0] is of)


def _softmax_input(w: UOp) -> UOp | None:
    """X where w = exp(X - max(X)) / sum(exp(X - max(X))) over the last axis (as `Tensor.softmax` builds it)."""
    if w.op is not Ops.FDIV or not _is_row_reduce(w.src[1], Ops.ADD, w.src[0]):
        return None
    e = w.src[0]
    if e.op is not Ops.EXP2 or e.src[0].op is not Ops.MUL:
        return None
    a, b = e.src[0].src
    sub, c = (a, b) if a.op is Ops.SUB else (b, a)
    c = _strip(c)
    if sub.op is not Ops.SUB or c.op is not Ops.CONST or abs(float(c.arg) - _LOG2E) > 1e-12:
        return None
    x = sub.src[0]
    return x if _is_row_reduce(sub.src[1], Ops.MAX, x) else None


def _matmul_operands(r: UOp) -> tuple[UOp, UOp] | None:
    """The two broadcast operands of a matmul reduction (sum over the axis before last of a product of two
    EXPAND(RESHAPE) / RESHAPE operands), or None."""
    if r.op is not Ops.REDUCE_AXIS or r.arg[0] is not Ops.ADD:
        return None
    prod = r.src[0].src[0] if r.src[0].op is Ops.CAST else r.src[0]  # half inputs: products summed in f32
    shape = shape_of(prod)
    if prod.op is not Ops.MUL or len(shape) < 3 or r.arg[1] != (len(shape) - 2,):
        return None
    a, b = prod.src
    if _strip(a) is a or _strip(b) is b:
        return None
    return a, b


def match(p: UOp) -> Match | None:
    """The fused attention rooted at the matmul `p`, or None."""
    ops = _matmul_operands(p)
    if ops is None or p.dtype is None or not p.dtype.is_float:
        return None
    wb, vb = ops
    if wb.op is not Ops.EXPAND or wb.src[0].op is not Ops.RESHAPE:
        return None
    w = wb.src[0].src[0]
    x = _softmax_input(w)
    pshape = shape_of(p)
    if x is None or shape_of(x) != pshape[:-2] + (shape_of(x)[-1],) or shape_of(wb.src[0]) != shape_of(w) + (1,):
        return None
    if not all(isinstance(n, int) for n in pshape + shape_of(x)):  # symbolic sizes: not fused (yet)
        return None
    if pshape[-1] > MAX_HEAD_DIM or shape_of(x)[-1] < 1:
        return None
    inline: set[UOp] = set()
    operands: list[UOp] = [vb]
    seen: set[UOp] = set()
    stack = [x]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op in (Ops.BUFFER, Ops.CONST, Ops.IOTA):
            continue
        if n.op is Ops.REDUCE_AXIS:
            mm = _matmul_operands(n)
            if mm is None or shape_of(n.src[0])[-2] > 4 * MAX_HEAD_DIM:
                operands.append(n)  # another reduction: realized, read as an input
            else:
                inline.add(n)
                operands.extend(mm)
            continue
        stack.extend(n.src)
    return Match(p, x, vb, frozenset(inline), tuple(operands))


def find(outputs: list[UOp]) -> dict[UOp, Match]:
    """Every fused attention of the graph, keyed by its `weights @ v` reduction."""
    found: dict[UOp, Match] = {}
    for node in UOp(Ops.SINK, None, tuple(outputs)).toposort():
        if node.op is Ops.REDUCE_AXIS:
            m = match(node)
            if m is not None:
                found[node] = m
    return found


def output_of(root: UOp, found: dict[UOp, Match]) -> UOp | None:
    """The attention a kernel root computes: the root itself, or a reshape (keeping the element order) or cast of it."""
    p = root
    while p.op in (Ops.RESHAPE, Ops.CAST) and p not in found:
        p = p.src[0]
    return p if p in found else None


def spec(low, root: UOp, m: Match) -> AttentionSpec:
    """The fused kernel's pieces, written by the scheduler's lowerer `low` (which already lowered the plain AST
    of `root`, so the buffers are numbered alike)."""
    pshape = shape_of(m.p)
    batch = pshape[:-3]
    tq, tk, dv = pshape[-3], shape_of(m.x)[-1], pshape[-1]
    zero = UOp.const(INDEX, 0)
    b = tuple(low.new_range(s, RangeKind.LOOP) if s != 1 else zero for s in batch)
    ri = low.new_range(tq, RangeKind.LOOP) if tq != 1 else zero
    rj = low.new_range(tk, RangeKind.REDUCE)
    rdv = low.new_range(dv, RangeKind.UPCAST)
    true = UOp.const(dtypes.bool, True)
    x = low.value(m.x, (*b, ri, rj), true)
    v = low.value(m.v, (*b, ri, rj, rdv), true)
    out = low.buffer(root)
    loops = tuple(r for r in (*b, ri) if r.op is Ops.RANGE)
    return AttentionSpec(loops, rj, rdv, x, v, out, flat_index((*b, ri, zero, rdv), pshape), tk, dv, root.dtype)


__all__ = ["AttentionSpec", "Match", "find", "match", "output_of", "spec"]
