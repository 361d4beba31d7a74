"""Attention fusion, scheduler side: find `w @ v` where the weights `w` are a softmax of scores over their last
axis, whatever way the softmax is written, and cut the chain as ONE kernel.

The rule (structural; no constant is compared to a special value):

- the exponent. `w` is `exp2(a) / sum(exp2(a'))` or `exp2(a)` alone. Each exponent is read as a linear form
  (`_linear`): a sum of terms `coef * node` through ADD, SUB, NEG, multiplication and division by constants;
  a term is a *row constant* when its node does not vary along the last axis (broadcast along it: the row
  max, a log of a row sum, a scalar), else a *score term*. The score terms, summed, are the scores X (in
  log2 units); the row constants cancel in a softmax and are dropped (the online softmax subtracts its own
  running max instead).
- the normalizer. With a division (`n / d`, or `n * (1 / d)`), the sum is a sum over the last axis of an
  `exp2(a')` whose score terms equal `a`'s (`softmax`, exp/sum by hand, any shift). Without one
  (`exp(log_softmax(x))`), `a` holds a row constant `-log2(sum(exp2(a')))` (coefficient -1 up to rounding:
  the weights sum to one) and the rest of `a` equals `a'`.
- the matmul. `w` is the left operand of a matmul reducing its last axis (`w @ v`), the batch axes of X equal
  the output's, every size is a constant and the head dimension is at most `MAX_HEAD_DIM`.

So `softmax`, exp/sum by hand, `log_softmax` then `exp`, a scale before or after, a mask by `where` or by
addition (an input or an iota comparison) and q/k/v as slices of one projection are all one rule. The score
terms' matmuls whose output is one score per element (q @ k^T) are computed per score inside the kernel
(`inline`); anything else they read (a projection q and k are slices of, a mask) is an operand the scheduler
realizes or reads as usual.

The kernel's AST (`ScheduleItem.ast`, `kernel_ast`) is an ordinary kernel AST like any reduce's: one STORE per
output element of a REDUCE(ONLINE_SOFTMAX) over the key range of (score, value) pairs,

    STORE(out, out_index(loops, rdv), [CAST] REDUCE(VECTORIZE(x(loops, rj), f32(v(rj, rdv))), rj, ONLINE_SOFTMAX))

with the batch axes, the query row and the output column `rdv` LOOP ranges (the column: the one the scores do not
vary by) and the score's inner products REDUCEs over the head dimension. `tgc.codegen.attention` reads the
pieces back from it (`spec_of`) and
chooses its forms (blocks of keys, rows per vector, shared-memory staging) by rules over it. `meta["unfused_ast"]`
keeps the plain lowering of the chain (the row max and sum as nested reductions) for symbolic-size plans whose
head dims are dims (`tgc.api`: `spec_of` reads a kernel whose batch axes, query rows or keys are dims, not one
whose head dims are).

What is not fused: a softmax over another axis, `log_softmax` itself (not followed by exp), weights not
followed by a matmul over their last axis, a head dimension above `MAX_HEAD_DIM`, `SymSize` sizes (a symbolic
plan's one trace; its probes, at constant sizes, fuse), non-float
results: those keep the ordinary schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tgc.dtype import DType, dtypes
from tgc.ir.kernel import INDEX, flat_index
from tgc.ir.shapes import prod, shape_of
from tgc.ir.uop import Ops, RangeKind, UOp, substitute

MAX_HEAD_DIM = 256  # the output row (Dv accumulators) is held in registers
_LN2 = math.log(2)
# the normalizer's coefficient (-1 in exact arithmetic: log(s) is written as log2(s) * ln2, exp(x) as
# exp2(x * log2(e))) is accepted within this relative rounding
_COEF_RTOL = 1e-6

Terms = dict[UOp, float]


@dataclass
class Match:
    """One fused attention: `p` the `w @ v` reduction, `scores` the score terms ((node, coefficient): X is
    their sum, in natural-log units), `v` the broadcast right-hand side (..., Tq, Tk, Dv), `inline` the
    matmuls inside the scores computed per score, and `operands` what the fused kernel reads (the scheduler
    walks these instead of the chain)."""

    p: UOp
    scores: tuple[tuple[UOp, float], ...]
    v: UOp
    inline: frozenset[UOp]
    operands: tuple[UOp, ...]

    @property
    def score_nodes(self) -> tuple[UOp, ...]:
        return tuple(n for n, _ in self.scores)


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
    tk: int | None  # the key count; None where it is a dim (`rj.src[0]` its expression)
    dv: int
    dtype: DType
    row_loop: bool = True  # loops[-1] is the query row (False for one query row, a decoding step: every loop is
    # a batch axis, and nothing may be shared across loops[-1] as rows of one batch share their keys)


def _strip(u: UOp) -> UOp:
    while u.op in (Ops.EXPAND, Ops.RESHAPE):
        u = u.src[0]
    return u


def _const(u: UOp) -> float | None:
    """The value of a (broadcast) float or int constant, else None."""
    s = _strip(u)
    while s.op is Ops.CAST and s.src[0].dtype is not None and not s.src[0].dtype.is_bool:
        s = _strip(s.src[0])
    return float(s.arg) if s.op is Ops.CONST and not isinstance(s.arg, bool) else None


def _row_broadcast(u: UOp) -> bool:
    """`u` is a broadcast along the last axis (its source has one element there)."""
    if u.op is not Ops.EXPAND:
        return False
    src = shape_of(u.src[0])
    return not src or src[-1] == 1


def _linear(u: UOp, row: bool = False, out: dict | None = None, coef: float = 1.0) -> dict[tuple[UOp, bool], float]:
    """`u` as a sum of terms: {(node, row constant?): coefficient}."""
    out = {} if out is None else out
    c = _const(u)
    if c is not None:
        return out  # a constant shift: a row constant that cancels, not kept
    if u.op is Ops.ADD:
        _linear(u.src[0], row, out, coef)
        _linear(u.src[1], row, out, coef)
    elif u.op is Ops.SUB:
        _linear(u.src[0], row, out, coef)
        _linear(u.src[1], row, out, -coef)
    elif u.op is Ops.NEG:
        _linear(u.src[0], row, out, -coef)
    elif u.op is Ops.MUL and (_const(u.src[1]) is not None or _const(u.src[0]) is not None):
        k, x = (_const(u.src[1]), u.src[0]) if _const(u.src[1]) is not None else (_const(u.src[0]), u.src[1])
        _linear(x, row, out, coef * k)
    elif u.op is Ops.FDIV and _const(u.src[1]) not in (None, 0.0):
        _linear(u.src[0], row, out, coef / _const(u.src[1]))
    elif u.op is Ops.CAST and u.dtype == dtypes.f32 and u.src[0].dtype in (dtypes.f16, dtypes.bf16):
        _linear(u.src[0], row, out, coef)  # a half exp computes in f32: the widening is exact
    elif _row_broadcast(u):
        _linear(u.src[0], True, out, coef)
    elif u.op is Ops.RESHAPE and row:
        _linear(u.src[0], True, out, coef)
    else:
        out[(u, row)] = out.get((u, row), 0.0) + coef
    return out


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(math.isclose(a[t], b[t], rel_tol=_COEF_RTOL) for t in a)


def _exponent(e: UOp) -> UOp | None:
    """`a` where e = exp2(a) (an f32 exp, or a cast of one)."""
    while e.op is Ops.CAST:  # (a half exp is a cast of an f32 one, and a sum of it casts it back to f32)
        e = e.src[0]
    return e.src[0] if e.op is Ops.EXP2 else None


def _row_sum_of(u: UOp, shape: tuple) -> UOp | None:
    """What a sum over the last axis reduces, where `u` is that sum (through casts and reshapes adding or
    dropping the reduced unit axis) of a tensor of `shape`."""
    u = _strip(u)
    while u.op in (Ops.CAST, Ops.RESHAPE, Ops.EXPAND):
        u = u.src[0]
    if u.op is not Ops.REDUCE_AXIS or u.arg != (Ops.ADD, (len(shape) - 1,)):
        return None
    src = u.src[0].src[0] if u.src[0].op is Ops.CAST else u.src[0]
    return src if shape_of(src) == shape else None


def _quotient(w: UOp) -> tuple[UOp, UOp | None]:
    """(numerator, row-broadcast denominator) of `w` = n / d or n * (1 / d) with d broadcast along the last
    axis; (w, None) otherwise."""
    if w.op is Ops.FDIV and _row_broadcast(w.src[1]):
        return w.src[0], w.src[1]
    if w.op is Ops.MUL:
        for n, r in (w.src, w.src[::-1]):
            inv = _strip(r) if _row_broadcast(r) else None
            if inv is not None and inv.op is Ops.FDIV and _const(inv.src[0]) == 1.0:
                return n, inv.src[1]
    return w, None


def softmax_scores(w: UOp) -> tuple[tuple[UOp, float], ...] | None:
    """The score terms (node, coefficient in natural-log units) of the weights `w`, where `w` is a softmax of
    their sum over the last axis (the module's rule), else None."""
    shape = shape_of(w)
    if len(shape) < 1:
        return None
    num, den = _quotient(w)
    if den is not None:
        a = _exponent(num)
        summed = _row_sum_of(den, shape)
        a2 = _exponent(summed) if summed is not None else None
        if a is None or a2 is None:
            return None
        lin, lin2 = _linear(a), _linear(a2)
        core = {t: c for t, c in lin.items() if not t[1]}
        if not core or not _same(core, {t: c for t, c in lin2.items() if not t[1]}):
            return None
    else:
        a = _exponent(w)
        if a is None:
            return None
        lin = _linear(a)
        core = {t: c for t, c in lin.items() if not t[1]}
        for (node, row), c in lin.items():  # the normalizer: -log2(sum(exp2(a'))) with a' the rest of a
            if not row or node.op is not Ops.LOG2 or not math.isclose(c, -1.0, rel_tol=_COEF_RTOL):
                continue
            summed = _row_sum_of(node.src[0], shape)
            a2 = _exponent(summed) if summed is not None else None
            rest = {t: k for t, k in lin.items() if t != (node, row)}
            if a2 is not None and core and _same(rest, _linear(a2)):
                break
        else:
            return None
    if any(shape_of(node) != shape for node, _ in core):
        return None
    return tuple((node, c * _LN2) for (node, _), c in core.items())


def _matmul_operands(r: UOp) -> tuple[UOp, UOp] | None:
    """The two broadcast operands of a matmul reduction (sum over the axis before last of a product of two
    EXPAND(RESHAPE) / RESHAPE operands), or None."""
    if r.op is not Ops.REDUCE_AXIS or r.arg[0] is not Ops.ADD:
        return None
    prod_ = r.src[0].src[0] if r.src[0].op is Ops.CAST else r.src[0]  # half inputs: products summed in f32
    shape = shape_of(prod_)
    if prod_.op is not Ops.MUL or len(shape) < 3 or r.arg[1] != (len(shape) - 2,):
        return None
    a, b = prod_.src
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
    pshape, wshape = shape_of(p), shape_of(w)
    if not wshape or shape_of(wb.src[0]) != wshape + (1,) or wshape[:-1] != pshape[:-2]:
        return None
    if not all(isinstance(n, int) for n in pshape + wshape):  # symbolic sizes: not fused (yet)
        return None
    scores = softmax_scores(w)  # (first: a matmul of no softmax makes no size decision, `tgc.ir.symsize`)
    if scores is None or pshape[-1] > MAX_HEAD_DIM or wshape[-1] < 1:
        return None
    inline: set[UOp] = set()
    operands: list[UOp] = [vb]
    seen: set[UOp] = set()
    stack = [n for n, _ in scores]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op in (Ops.BUFFER, Ops.CONST, Ops.IOTA):
            continue
        if n.op is Ops.REDUCE_AXIS:
            mm = _matmul_operands(n)
            # one score per element of the matmul (q @ k^T), over a head dimension the kernel holds: computed per
            # score; any other reduction (a projection, a statistic) is realized and read
            if mm is None or prod(shape_of(n)) != prod(wshape) or shape_of(n.src[0])[-2] > 4 * MAX_HEAD_DIM:
                operands.append(n)
            else:
                inline.add(n)
                operands.extend(mm)
            continue
        stack.extend(n.src)
    return Match(p, scores, vb, frozenset(inline), tuple(operands))


def find(outputs: list[UOp]) -> dict[UOp, Match]:
    """Every fused attention of the graph, keyed by its `w @ v` reduction."""
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


def _f32(u: UOp) -> UOp:
    return u if u.dtype == dtypes.f32 else UOp(Ops.CAST, dtypes.f32, (u,))


def kernel_ast(sp: AttentionSpec) -> UOp:
    """The fused kernel's AST (the module docstring's form) of the pieces `sp`; `spec_of` reads them back."""
    col = UOp(Ops.RANGE, INDEX, sp.rdv.src, (sp.rdv.arg[0], RangeKind.LOOP))  # an ordinary output loop
    v, out_index = substitute(sp.v, {sp.rdv: col}), substitute(sp.out_index, {sp.rdv: col})
    pairs = UOp(Ops.VECTORIZE, dtypes.f32.vec(2), (_f32(sp.x), _f32(v)))
    out = UOp(Ops.REDUCE, dtypes.f32, (pairs, sp.rj), Ops.ONLINE_SOFTMAX)
    if sp.dtype != dtypes.f32:
        out = UOp(Ops.CAST, sp.dtype, (out,))
    return UOp(Ops.SINK, None, (UOp(Ops.STORE, None, (sp.out, out_index, out)),))


def online_softmax_of(ast: UOp) -> UOp | None:
    """The REDUCE(ONLINE_SOFTMAX) of a fused attention kernel's AST (`kernel_ast`'s form: a SINK of one STORE of
    it, through at most one CAST, over one REDUCE range of (score, value) pairs), else None."""
    if ast.op is not Ops.SINK or len(ast.src) != 1 or ast.src[0].op is not Ops.STORE or len(ast.src[0].src) != 3:
        return None
    red = ast.src[0].src[2]
    red = red.src[0] if red.op is Ops.CAST else red
    if red.op is not Ops.REDUCE or red.arg is not Ops.ONLINE_SOFTMAX or len(red.src) != 2:
        return None
    rj = red.src[1]
    if rj.op is not Ops.RANGE or rj.arg[1] is not RangeKind.REDUCE or red.src[0].op is not Ops.VECTORIZE:
        return None
    return red


def spec_of(ast: UOp) -> AttentionSpec | None:
    """The pieces of a fused attention kernel's AST (`kernel_ast`'s form), else None. Read by rules over the AST:
    the loops are the ranges of the output index (in range order) but the last, the output column, which the
    scores do not vary by; the key is the REDUCE's range; the last loop is the query row (`row_loop`) where the
    values do not vary by it (rows share their keys and values; one query row, a decoding step: the last loop
    is a batch axis the values vary by)."""
    red = online_softmax_of(ast)
    if red is None:
        return None
    store = ast.src[0]
    out, out_index, value = store.src
    ranges = sorted({u for u in out_index.toposort() if u.op is Ops.RANGE}, key=lambda r: r.arg[0])
    rj, (x, v) = red.src[1], red.src[0].src
    x_ranges = {u for u in x.toposort() if u.op is Ops.RANGE}
    if not ranges or ranges[-1] in x_ranges or any(r.arg[1] is not RangeKind.LOOP for r in ranges):
        return None
    loops, rdv = tuple(ranges[:-1]), ranges[-1]  # the output column: the last range, which the scores do not vary by
    # the head dims (the output columns, the inner products' lengths) constants; the batch axes, the query rows and
    # the keys may be dims (a symbolic plan's kernel: `tgc.codegen.sizes`)
    heads = [u for u in x_ranges if u.arg[1] is RangeKind.REDUCE and u is not rj]
    if any(r.src[0].op is not Ops.CONST for r in (rdv, *heads)):
        return None
    v_ranges = {u for u in v.toposort() if u.op is Ops.RANGE}
    row_loop = bool(loops) and loops[-1] not in v_ranges
    tk = rj.src[0].arg if rj.src[0].op is Ops.CONST else None
    return AttentionSpec(loops, rj, rdv, x, v, out, out_index, tk, rdv.src[0].arg, value.dtype, row_loop=row_loop)


def spec(low, root: UOp, m: Match) -> AttentionSpec:
    """The fused kernel's pieces, written by the scheduler's lowerer `low` (which already lowered the plain AST
    of `root`, so the buffers are numbered alike)."""
    pshape = shape_of(m.p)
    batch = pshape[:-3]
    tq, tk, dv = pshape[-3], shape_of(m.scores[0][0])[-1], pshape[-1]
    zero = UOp.const(INDEX, 0)
    b = tuple(low.new_range(s, RangeKind.LOOP) if s != 1 else zero for s in batch)
    ri = low.new_range(tq, RangeKind.LOOP) if tq != 1 else zero
    rj = low.new_range(tk, RangeKind.REDUCE)
    rdv = low.new_range(dv, RangeKind.UPCAST)
    true = UOp.const(dtypes.bool, True)
    x = None
    for node, c in m.scores:
        term = _f32(low.value(node, (*b, ri, rj), true))
        k = UOp.const(dtypes.f32, c)
        if k.arg != 1.0:  # (a softmax's ln2 * log2(e) rounds to 1 in f32: no multiplication)
            term = term * k
        x = term if x is None else x + term
    v = low.value(m.v, (*b, ri, rj, rdv), true)
    out = low.buffer(root)
    loops = tuple(r for r in (*b, ri) if r.op is Ops.RANGE)
    return AttentionSpec(loops, rj, rdv, x, v, out, flat_index((*b, ri, zero, rdv), pshape), tk, dv, root.dtype,
                         row_loop=ri.op is Ops.RANGE)


__all__ = ["AttentionSpec", "Match", "find", "kernel_ast", "match", "online_softmax_of", "output_of", "softmax_scores",
           "spec", "spec_of"]
