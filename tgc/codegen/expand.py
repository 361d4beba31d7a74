"""Unrolling: UPCAST ranges become copies of the stores, UNROLL ranges copies of the reduced values.

`vectorize` (devices with vectors) makes one UPCAST range of each store the lanes of vector values; a store of
REDUCE(ONLINE_SOFTMAX) (`_vectorize_online`) also gets its inner products as vectors over their own range, a
block's scores as one vector (`tgc.codegen.lanes.lane_sums` of the inner products) and its columns as the reduce's
lanes. After these passes no UPCAST or UNROLL range is left; the copies differ only in constants, so the backend
compiler (LLVM's SLP vectorizer, a GPU compiler) keeps them in registers and vectorizes them.
"""

from __future__ import annotations

import itertools
from typing import Any

from tgc.codegen.lanes import hsum, lane_sums, splat
from tgc.codegen.opt import _stride
from tgc.dtype import dtypes
from tgc.ir.symbolic import simplify, symbolic
from tgc.ir.uop import Ops, PatternMatcher, RangeKind, UOp, UPat, graph_rewrite, rebuild, rewrite_step, substitute


def _ranges_of(u: UOp, kinds: tuple[RangeKind, ...]) -> list[UOp]:
    return sorted({n for n in u.toposort() if n.op is Ops.RANGE and n.arg[1] in kinds}, key=lambda r: r.arg[0])


def _copies(u: UOp, ranges: list[UOp]) -> list[UOp]:
    """`u` with each combination of the ranges' values substituted, simplified. Only the nodes that depend on the
    ranges are rebuilt per copy, and one simplify memo serves every copy: the parts they share (the other
    operand's loads, the loops) are simplified once."""
    rs = set(ranges)
    depends: set[UOp] = set()
    order = []
    for n in u.toposort():
        if n in rs or any(s in depends for s in n.src):
            depends.add(n)
            order.append(n)
    memo: dict[UOp, UOp] = {}
    step = rewrite_step(symbolic, None, memo)

    def simplified(s: UOp) -> UOp:  # a node the ranges do not reach: its fixed point, once for every copy
        return rebuild(s, memo, step)

    out = []
    for values in itertools.product(*(range(r.src[0].arg) for r in ranges)):
        # each copy built on its sources' fixed points and simplified node by node, as `graph_rewrite` would
        # rebuild it (the same nodes come out), without first building the copy unsimplified and walking it again
        sub: dict[UOp, UOp] = {r: step(UOp.const(r.dtype, v)) for r, v in zip(ranges, values)}
        for n in order:
            if n not in sub:
                new = UOp(n.op, n.dtype, tuple(sub[s] if s in sub else simplified(s) for s in n.src), n.arg)
                sub[n] = result = step(new)
                memo.setdefault(new, result)  # (a node of some of the ranges recurs in the copies of the others)
        out.append(sub[u] if u in sub else simplified(u))
    return out


def _combine(op: Ops, values: list[UOp]) -> UOp:
    """A balanced tree of `op` over the values (shorter dependency chains than a left fold)."""
    while len(values) > 1:
        nxt = [UOp(op, values[i].dtype, (values[i], values[i + 1])) for i in range(0, len(values) - 1, 2)]
        if len(values) % 2:
            nxt.append(values[-1])
        values = nxt
    return values[0]


def _unroll_reduce(x: UOp) -> UOp | None:
    unrolls = [r for r in x.src[1:] if r.arg[1] is RangeKind.UNROLL]
    if not unrolls:
        return None
    rest = tuple(r for r in x.src[1:] if r.arg[1] is not RangeKind.UNROLL)
    if x.arg is Ops.ONLINE_SOFTMAX:  # a block: every copy's (score, value) pairs in one iteration (one rescale)
        return UOp(Ops.REDUCE, x.dtype, (_block(_copies(x.src[0], unrolls)), *rest), x.arg)
    combined = _combine(x.arg, _copies(x.src[0], unrolls))
    return UOp(Ops.REDUCE, x.dtype, (combined, *rest), x.arg) if rest else combined


def _block(pairs: list[UOp]) -> UOp:
    """Copies of an ONLINE_SOFTMAX value, VECTORIZE(scores..., values...) each, as one: all the scores, then all
    the values, in copy order (a REDUCE over no range left is kept: its linearized update is the block's)."""
    halves = [(p.src[:len(p.src) // 2], p.src[len(p.src) // 2:]) for p in pairs]
    scores = tuple(s for h in halves for s in h[0])
    values = tuple(v for h in halves for v in h[1])
    return UOp(Ops.VECTORIZE, pairs[0].dtype.scalar().vec(len(scores) + len(values)), scores + values)


_unroll_rules = PatternMatcher([(UPat(Ops.REDUCE, name="x"), _unroll_reduce)])


def unroll_reduces(ast: UOp) -> UOp:
    """UNROLL ranges -> a balanced tree of copies of the reduced value (a rewrite pass)."""
    return graph_rewrite(ast, _unroll_rules)


def _upcasts_below(ast: UOp) -> list[frozenset[UOp]]:
    """The UPCAST ranges each source of `ast` depends on (`_ranges_of` of each store), from one pass over `ast`'s
    order, sources first: not a walk per store (a convolution's register tile has 256 stores over most of it)."""
    none: frozenset[UOp] = frozenset()
    below: dict[UOp, frozenset[UOp]] = {}
    for u in ast.toposort():
        ups = none
        for s in u.src:
            if below[s]:
                ups = ups | below[s] if ups else below[s]
        if u.op is Ops.RANGE and u.arg[1] is RangeKind.UPCAST:
            ups = ups | {u}
        below[u] = ups
    return [below[st] for st in ast.src]


def upcast_stores(ast: UOp) -> UOp:
    """Each store with UPCAST ranges -> one copy per combination of their values. A function, not a rewrite:
    a store becomes several stores of the SINK, and the copies substitute constants into whole subgraphs."""
    ups_of = [tuple(sorted(ups, key=lambda r: r.arg[0])) for ups in _upcasts_below(ast)]
    # the stores of one set of ranges are copied together (one simplify memo): the lanes of a vector stored one by
    # one (a convolution's output channels) are 16 stores of one vector value, copied once rather than 16 times
    copies_of: dict[UOp, list[UOp]] = {}
    for ups in dict.fromkeys(u for u in ups_of if u):
        group = [st for st, u in zip(ast.src, ups_of) if u == ups and st not in copies_of]
        sinks = _copies(UOp(Ops.SINK, None, tuple(group)), list(ups))
        if all(c.op is Ops.SINK and len(c.src) == len(group) for c in sinks):
            for j, st in enumerate(group):
                copies_of[st] = [c.src[j] for c in sinks]
        else:  # (a rewrite changed the group's sink: each store on its own)
            for st in group:
                copies_of[st] = _copies(st, list(ups))
    stores = []
    for store, ups in zip(ast.src, ups_of):
        stores.extend(copies_of[store] if ups else [store])
    return UOp(Ops.SINK, None, tuple(stores))


# ----------------------------------------------------------------------------------------------------------------
# explicit vectors: one UPCAST range on a contiguous axis becomes the lanes of vector values


def _lane_cost(store: UOp, lane: UOp) -> tuple[int, int, int]:
    """What taking `lane` as the vector lanes costs: (loads inside a reduction loop that become gathers, other
    gathered loads plus a scattered store, minus the vector loads inside reduction loops). A load that does
    not depend on the lane is a broadcast (free); one whose index steps by 1 along it, with a gate that does
    not, is one vector load."""
    inner = outer = vectors = 0
    for u in store.toposort():
        if u.op is not Ops.LOAD or lane not in u.toposort():
            continue
        in_loop = any(r.op is Ops.RANGE and r.arg[1] in (RangeKind.REDUCE, RangeKind.UNROLL) for r in u.toposort())
        gate = u.src[2] if len(u.src) > 2 else None
        if _stride(u.src[1], lane) == 1 and (gate is None or lane not in gate.toposort()):
            vectors += in_loop
        elif in_loop:
            inner += 1
        else:
            outer += 1
    return inner, outer + (_stride(store.src[1], lane) != 1), -vectors


def pick_vector_range(store: UOp, widths: tuple[int, ...]) -> UOp | None:
    """The UPCAST range that becomes the vector lanes: of those of a vector width, the one that gathers the
    fewest loads inside the reduction loops, then the widest, then the one with the fewest other scalar
    accesses, then the first contiguous for the store (a matmul's columns, an elementwise kernel's rows). A
    convolution over packed weights takes 16 output channels as lanes (input values are broadcast, weights one
    vector load) rather than 8 or 4 image columns, and stores the lanes one by one, once per output."""
    cands = [r for r in _ranges_of(store, (RangeKind.UPCAST,)) if r.src[0].arg in widths]
    contiguous = [r for r in cands if _stride(store.src[1], r) == 1]
    if len(cands) <= 1 and contiguous:
        return contiguous[0]
    costs = {r: _lane_cost(store, r) for r in cands}
    # a lane the store is not contiguous for only where it gathers nothing in the loops and loads vectors there
    cands = [r for r in cands if r in contiguous or (costs[r][0] == 0 and costs[r][2] < 0)]
    if not cands:
        return None
    order = {r: i for i, r in enumerate(contiguous)}
    return min(cands, key=lambda r: (costs[r][0], -r.src[0].arg, costs[r][1], r not in order, order.get(r, 0)))


class _Vectorizer:
    def __init__(self, lane: UOp):
        self.lane, self.width = lane, lane.src[0].arg
        self.memo: dict[UOp, UOp] = {}
        self.depends: set[UOp] = set()
        # one simplify memo for every lane's copy (`at`): what the lanes share is simplified once (a node's fixed
        # point under the context-free `symbolic` rules is the same whichever graph it is met in)
        self.simplified: dict[UOp, UOp] = {}

    def analyze(self, root: UOp) -> None:
        for u in root.toposort():
            if u is self.lane or any(s in self.depends for s in u.src):
                self.depends.add(u)

    def at(self, u: UOp, j: int) -> UOp:
        return graph_rewrite(substitute(u, {self.lane: UOp.const(self.lane.dtype, j)}), symbolic,
                             memo=self.simplified)

    def contiguous_base(self, idx: UOp) -> UOp | None:
        """The index at lane 0 when the lanes of `idx` are consecutive, else None."""
        return self.at(idx, 0) if _stride(idx, self.lane) == 1 else None

    def masked_base(self, idx: UOp) -> UOp | None:
        """`contiguous_base`, also through subtractions (a padded image's `column - pad`): for a load whose
        lanes are gated one by one, so it becomes one masked vector load instead of a branch per lane."""
        neg = rebuild(idx, {}, lambda u: UOp(Ops.ADD, u.dtype, (u.src[0], UOp(Ops.MUL, u.dtype, (
            u.src[1], UOp.const(u.dtype, -1))))) if u.op is Ops.SUB else u)
        return self.at(idx, 0) if _stride(neg, self.lane) == 1 else None

    def broadcast(self, u: UOp) -> UOp:
        if u in self.depends or u.dtype is None or u.dtype.count > 1:
            return self.vec(u)
        return UOp(Ops.VECTORIZE, u.dtype.vec(self.width), (u,) * self.width)

    def vec(self, u: UOp) -> UOp:
        if u not in self.depends:
            return u
        if u in self.memo:
            return self.memo[u]
        w = self.width
        if u is self.lane:
            out = UOp(Ops.VECTORIZE, u.dtype.vec(w), tuple(UOp.const(u.dtype, j) for j in range(w)))
        elif u.op is Ops.LOAD:
            base = self.contiguous_base(u.src[1])
            gate_ok = len(u.src) == 2 or u.src[2] not in self.depends
            if base is not None and gate_ok:
                out = UOp(Ops.LOAD, u.dtype.vec(w), (u.src[0], base, *u.src[2:]))
            elif (masked := self.masked_base(u.src[1])) is not None and u.dtype.count == 1:
                # a gate of each lane's own (a padded row's border): one masked vector load
                out = UOp(Ops.LOAD, u.dtype.vec(w), (u.src[0], masked, self.vec(u.src[2])))
            else:  # a gather: one scalar load per lane
                out = UOp(Ops.VECTORIZE, u.dtype.vec(w), tuple(self.at(u, j) for j in range(w)))
        elif u.op is Ops.REDUCE:
            out = UOp(Ops.REDUCE, u.dtype.vec(w), (self.broadcast(u.src[0]), *u.src[1:]), u.arg)
        else:
            out = UOp(u.op, u.dtype.vec(w), tuple(self.broadcast(s) for s in u.src), u.arg)
        self.memo[u] = out
        return out

    def store(self, st: UOp) -> list[UOp]:
        """One vector store, or one scalar store per lane; a store's gate (fourth source) is kept: whole on a
        vector store when it does not vary with the lane, else each lane's own."""
        buf, idx, val = st.src[:3]
        gate = st.src[3:]
        base = self.contiguous_base(idx)
        value = self.broadcast(val)
        if base is not None and not (gate and gate[0] in self.depends):
            return [UOp(Ops.STORE, None, (buf, base, value, *gate))]
        if base is not None and len(gate) == 1 and val.dtype.count == 1:  # a gate per lane: one masked store
            return [UOp(Ops.STORE, None, (buf, base, value, self.vec(gate[0])))]
        return [UOp(Ops.STORE, None, (buf, self.at(idx, j), UOp(Ops.GEP, val.dtype, (value,), j),
                                      *(self.at(g, j) for g in gate)))
                for j in range(self.width)]


def vectorize(ast: UOp, widths: tuple[int, ...] = (16, 8, 4)) -> UOp:
    """Turn the contiguous UPCAST range of each store into vector lanes (the other UPCASTs become copies)."""
    stores: list[UOp] = []
    for st in ast.src:
        if any(u.op is Ops.REDUCE and u.arg is Ops.ONLINE_SOFTMAX for u in st.toposort()):
            stores.extend(_vectorize_online(st, widths))
            continue
        lane = pick_vector_range(st, widths)
        if lane is None:
            stores.append(st)
            continue
        vz = _Vectorizer(lane)
        vz.analyze(st)
        for u in st.toposort():  # sources first: `vec` then finds every source in its memo (no recursion)
            if u in vz.depends and u.op is not Ops.STORE:
                vz.vec(u)
        stores.extend(vz.store(st))
    return UOp(Ops.SINK, None, tuple(stores))


# ----------------------------------------------------------------------------------------------------------------
# an ONLINE_SOFTMAX store: inner products over their own range, a block's scores as lanes, the values' columns


def _split_lanes(u: UOp, r: UOp, w: int, lane_id: Any) -> UOp | None:
    """`u` with range `r` split as r = r' * w + lane and the lane made vector lanes (contiguous loads become
    vector loads), or None where `u` does not come out as `w` lanes."""
    d = r.dtype  # (the pass runs after `narrow_index`: the range's own integer type)
    lane = UOp(Ops.RANGE, d, (UOp.const(d, w),), (lane_id, RangeKind.UPCAST))
    outer = UOp(Ops.RANGE, d, (UOp.const(d, r.src[0].arg // w),), r.arg)
    inner = simplify(substitute(u, {r: outer * UOp.const(d, w) + lane}))
    vz = _Vectorizer(lane)
    vz.analyze(inner)
    out = vz.vec(inner)
    return out if out.dtype is not None and out.dtype.count == w else None


def _vector_inner_products(x: UOp, w: int, lane_id: Any) -> dict[UOp, UOp]:
    """Each f32 REDUCE(ADD) in `x` over one range of a constant multiple of `w` -> the REDUCE of `w`-lane vectors
    over a `w`-th of it (its lanes' sum is the inner product; LLVM does not reorder a float sum by itself)."""
    out: dict[UOp, UOp] = {}
    for red in (u for u in x.toposort() if u.op is Ops.REDUCE):
        if (red.arg is not Ops.ADD or red.dtype != dtypes.f32 or len(red.src) != 2
                or red.src[1].src[0].op is not Ops.CONST or red.src[1].src[0].arg % w):
            continue
        vin = _split_lanes(red.src[0], red.src[1], w, lane_id)
        if vin is not None:
            r = next(u for u in vin.toposort() if u.op is Ops.RANGE and u.arg == red.src[1].arg)
            out[red] = UOp(Ops.REDUCE, vin.dtype, (vin, r), Ops.ADD)
    return out


_LIFTED = (Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.FDIV, Ops.NEG, Ops.WHERE, Ops.CAST, Ops.EXP2, Ops.SQRT)


def _lift(values: list[UOp], sums: dict[UOp, UOp]) -> UOp:
    """One vector whose lane k is `values[k]`: float arithmetic of the same shape in every lane becomes vector
    arithmetic (top down; a lane without the others' select gets one of true), lanes that are sums of n-lane
    vectors (`sums`: scalar -> its vector) one `lane_sums`; integer and bool values (index math, a mask's
    comparison) stay scalars per lane, with their bounds."""
    n = len(values)
    memo: dict[tuple[UOp, ...], UOp] = {}

    def srcs(v: UOp) -> tuple[UOp, ...]:
        """A commutative op's sources with a constant last (`simplify` orders them by node, not by kind)."""
        if v.op in (Ops.ADD, Ops.MUL, Ops.MAX) and len(v.src) == 2 and v.src[0].op is Ops.CONST:
            return (v.src[1], v.src[0])
        return v.src

    def go(key: tuple[UOp, ...]) -> UOp:
        if key in memo:
            return memo[key]
        vs = key
        wheres = [v for v in vs if v.op is Ops.WHERE]
        if wheres and len(wheres) < n and all(u.src[2] is wheres[0].src[2] for u in wheres):
            # lanes whose select folded away (the keys of a ragged block that are always in range): a select of
            # true there, so the lanes keep one shape
            yes = UOp.const(dtypes.bool, True)
            vs = tuple(v if v.op is Ops.WHERE else UOp(Ops.WHERE, v.dtype, (yes, v, wheres[0].src[2])) for v in vs)
        f = vs[0]
        if all(v is f for v in vs):
            out = splat(f, n)
        elif all(v in sums and sums[v].dtype.count == n for v in vs):
            out = lane_sums([sums[v] for v in vs])
        elif (f.dtype is not None and f.dtype.count == 1 and f.dtype.is_float and f.op in _LIFTED
              and all(v.op is f.op and v.arg == f.arg and v.dtype == f.dtype and len(v.src) == len(f.src)
                      for v in vs)):
            out = UOp(f.op, f.dtype.vec(n), tuple(go(tuple(srcs(v)[i] for v in vs)) for i in range(len(f.src))),
                      f.arg)
        else:
            out = UOp(Ops.VECTORIZE, f.dtype.vec(n), vs)
        memo[key] = out
        return out

    return go(tuple(values))


class _LaneScalars(_Vectorizer):
    """The vectorizer, except that integer and bool values varying by lane (index math, a causal mask's comparison)
    are computed lane by lane as scalars: index math stays scalar, with its bounds (a clamped row's index)."""

    def vec(self, u: UOp) -> UOp:
        if (u in self.depends and u.op is not Ops.LOAD and u.dtype is not None and u.dtype.count == 1
                and not u.dtype.is_float):
            if u not in self.memo:
                lanes = tuple(self.at(u, j) for j in range(self.width))
                self.memo[u] = UOp(Ops.VECTORIZE, u.dtype.vec(self.width), lanes)
            return self.memo[u]
        return super().vec(u)


def _score_lane(st: UOp, onlines: list[UOp], widths: tuple[int, ...]) -> UOp | None:
    """The widest UPCAST range of a vector width that the scores of the store's ONLINE_SOFTMAX REDUCEs vary by (the
    rows form's query rows), or None."""
    in_scores: set[UOp] = set()
    for red in onlines:
        pairs = red.src[0]
        for s in pairs.src[:len(pairs.src) // 2]:
            in_scores.update(u for u in s.toposort() if u.op is Ops.RANGE and u.arg[1] is RangeKind.UPCAST)
    cands = [r for r in in_scores if r.src[0].op is Ops.CONST and r.src[0].arg in widths]
    return max(cands, key=lambda r: (r.src[0].arg, -r.arg[0])) if cands else None


STAGED = "staged"  # a BARRIER's arg[0] whose STOREs run in loops of their own before first use (one thread: no wait)


def _row_side(body: UOp, lane: UOp, r: UOp, keys: set[UOp], shared: set[UOp]) -> list[UOp]:
    """The largest float subexpressions of an inner product's `body` that vary with the row (`lane`) and the reduced
    index `r` but not with the keys (`keys`: the online softmax's ranges) and are in `shared` (what every score of
    a block holds: with one block there is no key range to tell the row side by): q's element, or what it is
    computed from. Each is staged once per tile of rows instead of gathered for every block of keys."""
    nodes = body.toposort()
    dep: dict[UOp, int] = {}  # bit 1: varies with the row, 2: with r, 4: with a key
    for u in nodes:
        bits = 1 if u is lane else 2 if u is r else 4 if u in keys else 0
        for x in u.src:
            bits |= dep.get(x, 0)
        dep[u] = bits

    def wanted(u: UOp) -> bool:
        return dep[u] == 3 and u.dtype is not None and u.dtype.count == 1 and u.dtype.is_float and u in shared

    users: dict[UOp, list[UOp]] = {}
    for u in nodes:
        for x in u.src:
            users.setdefault(x, []).append(u)
    return [u for u in nodes if wanted(u) and (u is body or any(not wanted(p) for p in users.get(u, [])))]


def _stage_row_side(st: UOp, lane: UOp, onlines: list[UOp]) -> UOp:
    """The rows form's row side staged: in each inner product (an f32 REDUCE(ADD) over one constant range r in the
    scores), the largest float subexpressions varying with the row and r but not the keys (`_row_side`: q's
    elements, gathered one lane at a time; shared by every score of a block) are stored once per tile, for every
    r, into a DEFINE_LOCAL of r x w floats (one vector store per r, a loop of its own) and read back as one vector
    load per r. The loads take the BARRIER(STAGED) of the staging stores as their ordering source: the linearizer
    writes the staging loop before the first use of the loads outside the keys' loops (`tgc.codegen.linearize`)."""
    keys = {r for red in onlines for r in red.src[1:]}
    w = lane.src[0].arg
    ids = [u.arg[0] for u in st.toposort() if u.op is Ops.RANGE]
    next_id = max(ids, default=0) + 1
    staged: dict[UOp, UOp] = {}
    for red in onlines:
        # what every score of a block shares (the row side; with one block there is no key range to tell it by)
        n = len(red.src[0].src) // 2
        shared = set.intersection(*(set(sc.toposort()) for sc in red.src[0].src[:n]))
        for inner in (u for u in red.src[0].toposort() if u.op is Ops.REDUCE and u.arg is Ops.ADD):
            if len(inner.src) != 2 or inner.src[1].src[0].op is not Ops.CONST or inner.dtype != dtypes.f32:
                continue
            r = inner.src[1]
            d = r.dtype
            for u in _row_side(inner.src[0], lane, r, keys, shared):
                if u in staged:
                    continue
                rs = UOp(Ops.RANGE, d, r.src, (next_id, RangeKind.LOOP))
                next_id += 1
                local = UOp(Ops.DEFINE_LOCAL, u.dtype.as_ptr(), (), (f"rows{len(staged)}", r.src[0].arg * w))
                store = UOp(Ops.STORE, None, (local, simplify(rs * UOp.const(d, w) + lane),
                                              simplify(substitute(u, {r: rs}))))
                vz = _LaneScalars(lane)
                vz.analyze(store)
                barrier = UOp(Ops.BARRIER, None, tuple(vz.store(store)), (STAGED, (rs.arg,)))
                staged[u] = UOp(Ops.LOAD, u.dtype, (local, simplify(r * UOp.const(d, w) + lane), barrier))
    return substitute(st, staged) if staged else st


def _vectorize_online_rows(st: UOp, lane: UOp) -> list[UOp]:
    """The rows form: `lane`, a range the scores vary by, becomes the lanes of everything (m and l per lane). Each
    ONLINE_SOFTMAX REDUCE's (n scores, n values) become n score vectors then n value vectors of `lane`'s width, the
    inner products w-lane REDUCEs (one row per lane), integer and bool values per lane as scalars, and the output
    stored lane by lane where its index is not contiguous along the lane."""
    vz = _LaneScalars(lane)
    vz.analyze(st)
    w = vz.width
    containers = {u.src[0] for u in st.toposort() if u.op is Ops.REDUCE and u.arg is Ops.ONLINE_SOFTMAX}
    for u in st.toposort():  # sources first: `vec` then finds every source in its memo (no recursion)
        if u in vz.depends and u.op is not Ops.STORE and u not in containers:
            if u.op is Ops.REDUCE and u.arg is Ops.ONLINE_SOFTMAX:
                pairs = u.src[0]
                srcs = tuple(vz.broadcast(s) for s in pairs.src)
                vz.memo[u] = UOp(Ops.REDUCE, u.dtype.vec(w),
                                 (UOp(Ops.VECTORIZE, dtypes.f32.vec(len(srcs) * w), srcs), *u.src[1:]), u.arg)
            else:
                vz.vec(u)
    return vz.store(st)


def _vectorize_online(st: UOp, widths: tuple[int, ...]) -> list[UOp]:
    """A store of ONLINE_SOFTMAX REDUCEs with vectors. Where the scores vary by an UPCAST range of a vector width (the
    rows form's query rows: `_vectorize_online_rows`), that range becomes the lanes of everything. Else: (1) the
    inner products in the scores `w` lanes of their
    range at a time; (2) a block of n scores (n a vector width, after `unroll_reduce`) as one n-lane vector, the
    pairs' VECTORIZE then (scores vector, values...), whose exps the linearizer computes at once; (3) the store's
    contiguous UPCAST range (an output column) as lanes through the reduce: its values become vectors, the REDUCE a
    vector of as many o accumulators sharing one m and l (the scores must not vary with that range)."""
    ids = [u.arg[0] for u in st.toposort() if u.op is Ops.RANGE]
    next_id = max(ids, default=0) + 1
    w = max(widths)
    onlines = [u for u in st.toposort() if u.op is Ops.REDUCE and u.arg is Ops.ONLINE_SOFTMAX]
    row_lane = _score_lane(st, onlines, widths)
    if row_lane is not None:
        if st.src[2].dtype != dtypes.f32 or any(r.dtype != dtypes.f32 for r in onlines):
            return [st]  # (not f32: the rows stay copies, `upcast_stores`)
        return _vectorize_online_rows(_stage_row_side(st, row_lane, onlines), row_lane)
    mapping: dict[UOp, UOp] = {}
    for red in onlines:
        pairs = red.src[0]
        n = len(pairs.src) // 2
        scores, values = pairs.src[:n], pairs.src[n:]
        inner: dict[UOp, UOp] = {}
        for s in scores:
            inner.update(_vector_inner_products(s, w, (next_id, RangeKind.UPCAST)))
        # each vectorized inner product a placeholder while the scores are simplified and lifted (a sum's tree of
        # lanes would be reassociated by `simplify`), then its lanes' sum
        holders = {r: UOp(Ops.READ_ACC, dtypes.f32, (), ("lane sum", i)) for i, r in enumerate(inner)}
        sums = {holders[r]: v for r, v in inner.items()}
        if holders:
            scores = tuple(simplify(substitute(s, holders)) for s in scores)
        if n in widths and n & (n - 1) == 0:
            head: tuple[UOp, ...] = (_lift(list(scores), sums),)
        else:
            head = scores
        if holders:
            head = tuple(substitute(h, {ph: hsum(v) for ph, v in sums.items()}) for h in head)
        mapping[red] = UOp(Ops.REDUCE, red.dtype, (UOp(Ops.VECTORIZE, pairs.dtype, head + values), *red.src[1:]),
                           red.arg)
    st = substitute(st, mapping) if mapping else st
    lane = pick_vector_range(st, widths)
    if lane is None or st.src[2].dtype != dtypes.f32:
        return [st]
    vz = _Vectorizer(lane)
    vz.analyze(st)
    for red in (u for u in st.toposort() if u.op is Ops.REDUCE and u.arg is Ops.ONLINE_SOFTMAX):
        pairs = red.src[0]
        k = 1 if pairs.src[0].dtype.count > 1 else len(pairs.src) // 2
        if any(s in vz.depends for s in pairs.src[:k]):
            return [st]  # scores that vary by lane: m and l would be per lane (the rows form)
    containers = {u.src[0] for u in st.toposort() if u.op is Ops.REDUCE and u.arg is Ops.ONLINE_SOFTMAX}
    for u in st.toposort():  # sources first: `vec` then finds every source in its memo (no recursion)
        if u in vz.depends and u.op is not Ops.STORE and u not in containers:
            if u.op is Ops.REDUCE and u.arg is Ops.ONLINE_SOFTMAX:
                pairs = u.src[0]
                k = 1 if pairs.src[0].dtype.count > 1 else len(pairs.src) // 2
                vals = tuple(vz.broadcast(v) for v in pairs.src[k:])
                vz.memo[u] = UOp(Ops.REDUCE, u.dtype.vec(vz.width),
                                 (UOp(Ops.VECTORIZE, pairs.dtype, pairs.src[:k] + vals), *u.src[1:]), u.arg)
            else:
                vz.vec(u)
    return vz.store(st)
