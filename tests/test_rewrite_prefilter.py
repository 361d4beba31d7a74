"""The pattern matcher's source pre-check (`PatternMatcher.rewrite` skips a pattern whose sources' count or ops
cannot match) and `expand._copies` built on `rewrite_step`: both must give what the plain definitions give."""

from __future__ import annotations

import itertools

from tgc.codegen.expand import _copies
from tgc.dtype import dtypes
from tgc.ir.symbolic import symbolic
from tgc.ir.uop import Ops, PatternMatcher, RangeKind, UOp, UPat, graph_rewrite, substitute

I = dtypes.i32
F = dtypes.f32


def rng(i: int, n: int, kind: RangeKind = RangeKind.LOOP) -> UOp:
    return UOp(Ops.RANGE, I, (UOp.const(I, n),), (i, kind))


def c(v: int) -> UOp:
    return UOp.const(I, v)


def _marking_matcher(calls: list) -> PatternMatcher:
    def fire(name):
        def fn(x, k):
            calls.append(name)
            return x
        return fn
    return PatternMatcher([
        (UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("k"))), fire("add")),
        (UPat(Ops.SUB, src=(UPat.var("x"), UPat.cvar("k"))), fire("sub")),
        (UPat(Ops.WHERE, src=(UPat.cvar("k"), UPat.var("x"), UPat.var("y"))), lambda k, x, y: x),
    ])


def test_prefilter_keeps_both_orders_of_a_commutative_op():
    calls: list = []
    pm = _marking_matcher(calls)
    x = rng(0, 8)
    assert pm.rewrite(x + c(3)) is x  # constant second
    assert pm.rewrite(c(3) + x) is x  # constant first: ADD is commutative, the other order matches
    assert calls == ["add", "add"]


def test_prefilter_skips_only_what_cannot_match():
    calls: list = []
    pm = _marking_matcher(calls)
    x, y = rng(0, 8), rng(1, 8)
    assert pm.rewrite(x + y) is None  # no constant source: not matched
    assert pm.rewrite(c(3) - x) is None  # SUB is not commutative: the constant must be second
    assert pm.rewrite(x - c(3)) is x
    assert calls == ["sub"]
    cond = UOp(Ops.CMPLT, dtypes.bool, (x, c(4)))
    assert pm.rewrite(UOp(Ops.WHERE, I, (cond, x, y))) is None  # the condition is not a constant
    assert pm.rewrite(UOp(Ops.WHERE, I, (UOp.const(dtypes.bool, True), x, y))) is x


def test_prefilter_gives_the_symbolic_fixed_points():
    # a rule set without the pre-check (every pattern tried: `match` alone decides) against the one with it
    plain = PatternMatcher(symbolic.rules)
    for op in plain._tried:
        plain._tried[op] = [(pat, fn, None) for pat, fn, _ in plain._tried[op]]
    a, b = rng(0, 12), rng(1, 5)
    exprs = [(a // c(4)) * c(4) + a % c(4), (c(2) + a) + c(3), c(1) * (b * c(6)), (a * c(5) + b) // c(5),
             ((a // c(3)) % c(4)) * c(3) + a % c(3), UOp(Ops.CMPLT, dtypes.bool, (b, c(9)))]
    for e in exprs:
        assert graph_rewrite(e, symbolic) is graph_rewrite(e, plain)
    assert graph_rewrite(exprs[0], symbolic) is a  # (the rules did fire)


def test_copies_equal_substitute_then_simplify():
    # two UPCAST ranges, a node of one range only (it recurs in the other range's copies), a gate, shared loads
    j, k, r = rng(1, 3, RangeKind.UPCAST), rng(2, 4, RangeKind.UPCAST), rng(0, 16, RangeKind.LOOP)
    buf = UOp(Ops.DEFINE_GLOBAL, F.as_ptr(), (), 0)
    out = UOp(Ops.DEFINE_GLOBAL, F.as_ptr(), (), 1)
    shared = UOp(Ops.LOAD, F, (buf, (r * c(14)) // c(2)))  # no range reaches it; simplifies to r*7
    idx_j = (r * c(12) + j * c(4)) // c(4)  # simplifies to r*3 + j
    gate = UOp(Ops.CMPLT, dtypes.bool, (k + j, c(4)))
    val = UOp(Ops.ADD, F, (UOp(Ops.LOAD, F, (buf, idx_j + k, gate)), shared))
    store = UOp(Ops.STORE, None, (out, (r * c(3) + j) * c(4) + k % c(4), val))
    sink = UOp(Ops.SINK, None, (store,))
    got = _copies(sink, [j, k])
    want = [graph_rewrite(substitute(sink, {j: c(vj), k: c(vk)}), symbolic)
            for vj, vk in itertools.product(range(3), range(4))]
    assert len(got) == 12 and all(g is w for g, w in zip(got, want))
    assert got[0] is not got[5]  # (the copies differ)
    # a node no range reaches comes back simplified
    assert _copies((r * c(8) + c(0)) // c(8), [j]) == [r] * 3
