"""Symbolic simplification of index arithmetic and constant folding, as pattern-matcher rules.

Movement ops become index expressions full of `//` and `%`; these rules use the value bounds of each
expression (`UOp.bounds`) to fold them back into plain loop variables where possible.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tgc.dtype import DType, dtypes, truncate
from tgc.ir.alu import AluError, const, exec_alu
from tgc.ir.symsize import SymSize, gcd
from tgc.ir.uop import BINARY, COMPARE, UNARY, Ops, PatternMatcher, UOp, UPat, graph_rewrite

# every unary and binary op on constants except FDIV and the float transcendentals (floats are left to the backend)
_FOLDABLE = (BINARY | UNARY) - {Ops.FDIV, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.TRUNC}


def fold_constants(x: UOp) -> UOp | None:
    """Evaluate an integer or bool ALU op whose sources are all constants, with the one ALU table
    (`tgc.ir.alu`); floats are left to the backend, whose rounding we would otherwise have to imitate."""
    if x.op not in _FOLDABLE or not all(s.op is Ops.CONST for s in x.src) or x.dtype is None:
        return None
    if not all(s.dtype is not None and s.dtype.count == 1 and (s.dtype.is_int or s.dtype.is_bool) for s in x.src):
        return None
    if any(isinstance(s.arg, SymSize) for s in x.src):
        return _fold_sizes(x)
    d = x.src[0].dtype if x.op in COMPARE else x.dtype  # the dtype the op computes in
    args = [const(s.arg, d) for s in x.src]
    try:
        with np.errstate(all="ignore"):
            value = exec_alu(x.op, d, args)
    except AluError:
        return None
    return UOp.const(x.dtype, truncate(value.item(), x.dtype))


def _fold_sizes(x: UOp) -> UOp | None:
    """`fold_constants` where a source is a size of the dims (`SymSize`, traced once): its own arithmetic and
    comparisons (which the size class answers), for non-negative operands of a division; else not folded."""
    a = [s.arg for s in x.src]
    if x.op in (Ops.IDIV, Ops.MOD) and not (a[0] >= 0 and a[1] > 0):
        return None
    ops = {Ops.ADD: lambda: a[0] + a[1], Ops.SUB: lambda: a[0] - a[1], Ops.MUL: lambda: a[0] * a[1],
           Ops.IDIV: lambda: a[0] // a[1], Ops.MOD: lambda: a[0] % a[1], Ops.MAX: lambda: max(a[0], a[1]),
           Ops.NEG: lambda: -a[0], Ops.CMPLT: lambda: a[0] < a[1], Ops.CMPNE: lambda: a[0] != a[1],
           Ops.CMPEQ: lambda: a[0] == a[1]}
    f = ops.get(x.op)
    return None if f is None else UOp.const(x.dtype, f())


def _terms(u: UOp) -> tuple[list[tuple[UOp, int]], int]:
    """An integer expression as sum(coef * node) + const, looking through ADD and MUL-by-constant (terms in
    the order of a left-to-right walk; an explicit stack, so a sum of any length)."""
    terms: list[tuple[UOp, int]] = []
    const = 0
    stack: list[tuple[UOp, int]] = [(u, 1)]
    while stack:
        n, coef = stack.pop()
        if n.op is Ops.CONST:
            const += _n(n.arg) * coef
        elif n.op is Ops.ADD:
            stack.append((n.src[1], coef))
            stack.append((n.src[0], coef))
        elif n.op is Ops.MUL and n.src[1].op is Ops.CONST:
            stack.append((n.src[0], coef * _n(n.src[1].arg)))
        elif n.op is Ops.MUL and n.src[0].op is Ops.CONST:
            stack.append((n.src[1], coef * _n(n.src[0].arg)))
        else:
            terms.append((n, coef))
    return terms, const


def _n(v: Any) -> int:
    """A constant's value as an int; a size of the dims (`tgc.ir.symsize.SymSize`, traced once) kept as such."""
    return v if isinstance(v, SymSize) else int(v)


def _build(terms: list[tuple[UOp, int]], const: int, dtype: DType) -> UOp:
    merged: dict[UOp, int] = {}
    for n, c in terms:
        merged[n] = merged.get(n, 0) + c
    out: UOp | None = None
    for n, c in merged.items():
        if c == 0:
            continue
        t = n if c == 1 else n * UOp.const(dtype, c)
        out = t if out is None else out + t
    if out is None:
        return UOp.const(dtype, const)
    return out if const == 0 else out + UOp.const(dtype, const)


def _split_low(terms: list[tuple[UOp, int]], const: int, d: int, dtype: DType) -> tuple[UOp, UOp, int] | None:
    """x = g*high + low with g > 1 dividing d, high >= 0 and 0 <= low < g (from x's affine terms), or None: a
    16-lane split (16*a + i) of a channel read as (channel // 32, channel % 32) becomes (a // 2, 16*(a % 2) + i),
    where i stays a lane of stride 1."""
    for g in sorted({gcd(d, abs(coef)) for _, coef in terms} - {1}, reverse=True):
        high = [(n, coef // g) for n, coef in terms if coef % g == 0]
        low = [(n, coef) for n, coef in terms if coef % g != 0]
        if not high:
            continue
        lo, hi = _build(low, const, dtype), _build(high, 0, dtype)
        if lo.vmin >= 0 and lo.vmax < g and hi.vmin >= 0:
            return hi, lo, g
    return None


def div_rule(x: UOp, c: UOp) -> UOp | None:
    d = _n(c.arg)
    if d == 1:
        return x
    if d <= 0 or x.vmin < 0:
        return None
    if x.vmax < d:
        return UOp.const(x.dtype, 0)
    terms, const = _terms(x)
    outer = [(n, coef // d) for n, coef in terms if coef % d == 0]
    rest = [(n, coef) for n, coef in terms if coef % d != 0]
    outer_const, rest_const = divmod(const, d)
    rest_expr = _build(rest, rest_const, x.dtype)
    if rest_expr.vmin < 0:
        return None
    if not outer and outer_const == 0:
        if x.op is Ops.IDIV and x.src[1].op is Ops.CONST and x.src[0].vmin >= 0:  # (a // b) // d -> a // (b*d)
            return x.src[0] // UOp.const(x.dtype, _n(x.src[1].arg) * d)
        g = gcd(d, *[coef for _, coef in rest], rest_const) if rest else d
        if g > 1 and rest_const % g == 0 and all(coef % g == 0 for _, coef in rest):
            return _build([(n, coef // g) for n, coef in rest], rest_const // g, x.dtype) // UOp.const(x.dtype, d // g)
        split = _split_low(terms, const, d, x.dtype)
        if split is not None:  # (g*b + s) // (g*m) with 0 <= s < g: s never carries into the quotient
            high, _, g = split
            return high // UOp.const(x.dtype, d // g) if d // g > 1 else high
        return None
    quotient = _build(outer, outer_const, x.dtype)
    if rest_expr.vmax < d:
        return quotient
    return quotient + rest_expr // c


def mod_rule(x: UOp, c: UOp) -> UOp | None:
    d = _n(c.arg)
    if d == 1:
        return UOp.const(x.dtype, 0)
    if d <= 0 or x.vmin < 0:
        return None
    if x.vmax < d:
        return x
    terms, const = _terms(x)
    rest = [(n, coef % d) for n, coef in terms if coef % d != 0]
    if len(rest) == len(terms) and 0 <= const < d and all(coef < d for _, coef in rest):
        if x.op is Ops.MOD and x.src[1].op is Ops.CONST and _n(x.src[1].arg) % d == 0:  # (a % (k*d)) % d
            return x.src[0] % c
        split = _split_low(terms, const, d, x.dtype)
        if split is not None and d // split[2] > 1:  # (g*b + s) % (g*m) with 0 <= s < g: g*(b % m) + s
            high, low, g = split
            return (high % UOp.const(x.dtype, d // g)) * UOp.const(x.dtype, g) + low
        return None
    rest_expr = _build(rest, const % d, x.dtype)
    if rest_expr.vmin < 0:
        return None
    return rest_expr if rest_expr.vmax < d else rest_expr % c


def _is_mod_term(u: UOp) -> bool:
    return u.op is Ops.MOD or (u.op is Ops.MUL and u.src[1].op is Ops.CONST and u.src[0].op is Ops.MOD)


def div_mod_sum_rule(x: UOp) -> UOp | None:
    """A sum that rebuilds a remainder or its dividend from digits (a flatten of a reshaped index: c*36 + h*6 + w
    read as (k // 36)*36 + ((k // 6) % 6)*6 + k % 6), for a dividend v >= 0 and constants a, b:
    ((v // a) % b)*a + v % a -> v % (a*b), and (v // a)*a + v % a -> v, each with any common coefficient, until
    neither applies. The index is then affine in v again (a matmul reading a flattened image as a vector)."""
    if not (_is_mod_term(x.src[0]) or _is_mod_term(x.src[1])):
        return None
    terms, const = _terms(x)
    changed, again = False, True
    while again:
        again = False
        for i, (low, k) in enumerate(terms):
            if low.op is not Ops.MOD or low.src[1].op is not Ops.CONST or low.src[1].arg <= 0 or low.src[0].vmin < 0:
                continue
            v, a = low.src[0], _n(low.src[1].arg)
            for j, (high, k2) in enumerate(terms):
                if j == i or k2 != k * a:
                    continue
                if high.op is Ops.IDIV and high.src[0] is v and high.src[1].op is Ops.CONST and high.src[1].arg == a:
                    new = v
                elif high.op is Ops.MOD and high.src[1].op is Ops.CONST and high.src[1].arg > 0 and \
                        high.src[0].op is Ops.IDIV and \
                        high.src[0].src[0] is v and high.src[0].src[1].op is Ops.CONST and high.src[0].src[1].arg == a:
                    new = v % UOp.const(v.dtype, a * _n(high.src[1].arg))
                else:
                    continue
                terms = [t for n, t in enumerate(terms) if n not in (i, j)] + [(new, k)]
                changed = again = True
                break
            if again:
                break
    return _build(terms, const, x.dtype) if changed else None


def lt_rule(x: UOp, c: UOp) -> UOp | None:
    if x.vmax < c.arg:
        return UOp.const(dtypes.bool, True)
    if x.vmin >= c.arg:
        return UOp.const(dtypes.bool, False)
    return None


def load_gate_rule(x: UOp) -> UOp | None:
    """A LOAD whose gate is a constant: true drops the gate; false makes the LOAD its else value (0), never an
    ungated load (its index is out of range exactly where the gate is false). A third source that is not a
    bool (a BARRIER on a shared-memory load) is an ordering edge, not a gate."""
    if len(x.src) != 3 or x.src[2].op is not Ops.CONST or not x.src[2].dtype.is_bool:
        return None
    if x.src[2].arg:
        return x.replace(src=x.src[:2])
    zero = UOp.const(x.dtype.scalar(), 0)
    return zero if x.dtype.count == 1 else UOp(Ops.VECTORIZE, x.dtype, (zero,) * x.dtype.count)


def _is_int(u: UOp) -> bool:
    return u.dtype is not None and (u.dtype.is_int)


symbolic = PatternMatcher([
    (UPat(set(_FOLDABLE), name="x"), fold_constants),
    # identities
    (UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: x if c.arg == 0 and _is_int(x) else None),
    (UPat(Ops.SUB, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: x if c.arg == 0 and _is_int(x) else None),
    (UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("c"))),
     lambda x, c: x if c.arg == 1 else (c if c.arg == 0 and _is_int(x) else None)),
    (UPat(Ops.ADD, src=(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c1"))), UPat.cvar("c2"))),
     lambda x, c1, c2: x + UOp.const(x.dtype, c1.arg + c2.arg) if _is_int(x) else None),
    (UPat(Ops.MUL, src=(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("c1"))), UPat.cvar("c2"))),
     lambda x, c1, c2: x * UOp.const(x.dtype, c1.arg * c2.arg) if _is_int(x) else None),
    # (x // c) * c + x % c -> x
    (UPat(Ops.ADD, src=(UPat(Ops.MUL, src=(UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("c"))), UPat.cvar("c2"))),
                        UPat(Ops.MOD, src=(UPat.var("x"), UPat.cvar("c3"))))),
     lambda x, c, c2, c3: x if c.arg == c2.arg == c3.arg and x.vmin >= 0 else None),
    (UPat(Ops.ADD, name="x", dtype="int"), div_mod_sum_rule),
    # index division and remainder by constants
    (UPat(Ops.IDIV, src=(UPat.var("x", "int"), UPat.cvar("c"))), div_rule),
    (UPat(Ops.MOD, src=(UPat.var("x", "int"), UPat.cvar("c"))), mod_rule),
    # comparisons decided by bounds
    (UPat(Ops.CMPLT, src=(UPat.var("x", "int"), UPat.cvar("c"))), lt_rule),
    # where with a known condition, logical and with a known side
    (UPat(Ops.WHERE, src=(UPat.cvar("c"), UPat.var("a"), UPat.var("b"))), lambda c, a, b: a if c.arg else b),
    (UPat(Ops.WHERE, src=(UPat.var("c"), UPat.var("a"), UPat.var("a"))), lambda c, a: a),
    (UPat(Ops.AND, src=(UPat.var("x", "bool"), UPat.cvar("c", "bool"))), lambda x, c: x if c.arg else c),
    # a gated LOAD whose gate is known
    (UPat(Ops.LOAD, name="x"), load_gate_rule),
])


def simplify(u: UOp, memo: dict[UOp, UOp] | None = None) -> UOp:
    """`u` at the fixed point of the `symbolic` rules. `memo` (node -> its fixed point) may be shared by calls: the
    rules look only at a node and its sources, so a subtree's fixed point does not depend on the graph it is met in,
    and a subtree simplified by an earlier call is not walked again (the result is the same node either way)."""
    return graph_rewrite(u, symbolic, memo=memo)
