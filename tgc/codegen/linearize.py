"""Kernel AST -> a linear list of UOps that a renderer prints top to bottom.

Loops are explicit: RANGE opens one, ENDRANGE closes it. A REDUCE becomes DEFINE_ACC before its loops,
ACCUMULATE inside them and READ_ACC after. Values are computed in the innermost open loop that is
current when first needed; a value computed inside a loop is not reused after the loop closes. A TEE (a
value also stored into a buffer, `tgc.codegen.rowreuse`) becomes a STORE where the value is computed.

An ONLINE_SOFTMAX REDUCE (`tgc.ir.uop.Ops.ONLINE_SOFTMAX`) becomes its triple of accumulators: the running max
m (-inf) and sum l (0), shared by the group's REDUCEs of the same scores over the same loops, and one weighted
sum o (0) per REDUCE; per iteration (a block of n scores s_k and values v_k) m' = max(m, max_k s_k),
alpha = exp(m - m'), p_k = exp(s_k - m') (exp arguments clamped at -200, a max still -inf taken as 0, so
-inf - -inf never reaches exp), l = l * alpha + sum_k p_k, o = o * alpha + sum_k p_k v_k (ACCUMULATE MAX, MUL,
ADD: no new linear op); after the loops its value is o / l. Its exps are polynomials where the device asks.
After `vectorize` (`tgc.codegen.expand`) the pairs may be (one vector of the block's n scores, n values): their
max and sum are lane trees, their exps one vector polynomial; the values and the result may be w-lane vectors (w
output columns: one vector o, sharing m and l). Scores that vary by lane (a VECTORIZE of n score vectors then n
value vectors, all of the REDUCE's type f32 x w: w independent rows, the rows form's query rows) give w-lane m and l
accumulators, lane i the online softmax of lane i (`_emit_online_softmax_lanes`). Where an iteration stages values
in shared memory (a BARRIER inside its loop), a second BARRIER ends the iteration.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import Any

from tgc.codegen.lanes import hmax, hsum, splat, widen
from tgc.codegen.transcendental import decompose_transcendentals
from tgc.dtype import dtypes
from tgc.ir.kernel import identity
from tgc.ir.uop import Ops, RangeKind, UOp, postorder, substitute
from tgc.ir.walk import drive

_LOG2E = 1 / math.log(2)
_EXP_FLOOR = -200.0  # an online softmax's exp2 arguments are clamped here: exp2(-200) is 0 in f32


class _Linearizer:
    def __init__(self, reduce_groups: dict[tuple[UOp, ...], list[UOp]] | None = None,
                 decompose: bool = False) -> None:
        self.decompose = decompose  # the exps this linearizer writes (an online softmax's) as polynomials
        self.out: list[UOp] = []
        self.scopes: list[dict[UOp, UOp]] = [{}]
        self.open_ranges: list[UOp] = []
        self.acc_count = 0
        # reductions over the same loops share one loop nest (e.g. the accumulators of an upcast tile)
        self.reduce_groups = reduce_groups or {}
        self.free: dict[UOp, frozenset[UOp]] = {}  # free_ranges, per value

    def lookup(self, u: UOp) -> UOp | None:
        for scope in reversed(self.scopes):
            if u in scope:
                return scope[u]
        return None

    def push(self, u: UOp) -> UOp:
        self.out.append(u)
        return u

    def open_range(self, r: UOp) -> None:
        self._push_range(r, self.emit(r.src[0]))

    def _open_range(self, r: UOp) -> Generator[UOp, UOp, None]:
        self._push_range(r, self.lookup(r.src[0]) or (yield r.src[0]))

    def _push_range(self, r: UOp, end: UOp) -> None:
        lin = r.replace(src=(end,))
        self.push(lin)
        self.scopes.append({r: lin})
        self.open_ranges.append(r)

    def close_range(self) -> None:
        r = self.open_ranges.pop()
        scope = self.scopes.pop()
        self.push(UOp(Ops.ENDRANGE, None, (scope[r],)))

    def emit(self, u: UOp) -> UOp:
        """The linear node of `u`, emitting it (and what it needs) where it is not yet visible. A walk of any
        depth: `_emit` yields the sources it needs (`tgc.ir.walk.drive`)."""
        found = self.lookup(u)
        return found if found is not None else drive(u, self._emit)

    def _emit(self, u: UOp) -> Generator[UOp, UOp, UOp]:
        found = self.lookup(u)
        if found is not None:
            return found
        if u.op is Ops.RANGE:
            raise RuntimeError(f"range {u.arg} used outside its loop")
        if u.op is Ops.REDUCE:
            yield from self._emit_reduce_group(u)
            return self.scopes[-1][u]
        if u.op is Ops.BARRIER and _staged(u):
            # stores staged in loops of their own (`expand._stage_row_side`), here: one thread needs no wait
            own = set(u.arg[1])
            last = None
            for st in u.src:
                loops = sorted({r for r in st.toposort() if r.op is Ops.RANGE and r.arg in own}, key=lambda r: r.arg[0])
                for r in loops:
                    self.open_range(r)
                last = self.emit(st)
                for _ in loops:
                    self.close_range()
            self.scopes[-1][u] = last
            return last
        if u.op is Ops.LOAD and len(u.src) == 3 and u.src[2].op is Ops.BARRIER and _staged(u.src[2]):
            self.emit(u.src[2])  # (the staging loop, once; the load itself has no gate)
            u = u.replace(src=u.src[:2])
            found = self.lookup(u)
            if found is not None:
                return found
        if u.op is Ops.REREAD:
            raise RuntimeError("REREAD left in a kernel (resolve_row_values did not run)")
        srcs = []
        for s in u.src:
            found = self.lookup(s)
            srcs.append(found if found is not None else (yield s))
        if u.op is Ops.TEE:  # the value, stored where it is computed (`tgc.codegen.rowreuse`)
            self.push(UOp(Ops.STORE, None, tuple(srcs)))
            lin = srcs[2]
        else:
            lin = self.push(u.replace(src=tuple(srcs)))
        self.scopes[-1][u] = lin
        return lin

    def free_ranges(self, u: UOp) -> frozenset[UOp]:
        """The loop ranges a value depends on (a REDUCE binds its own)."""
        memo = self.free
        if u not in memo:
            for n in postorder(u, memo):
                if n.op is Ops.RANGE:
                    out = frozenset([n]) | memo[n.src[0]]
                else:
                    out = frozenset().union(*(memo[s] for s in n.src)) if n.src else frozenset()
                    if n.op is Ops.REDUCE:
                        out -= set(n.src[1:])
                    elif n.op is Ops.BARRIER and _staged(n):  # its stores' own loops
                        out = frozenset(r for r in out if r.arg not in n.arg[1])
                memo[n] = out
        return memo[u]

    def hoist(self, root: UOp) -> None:
        open_now = set(self.open_ranges)
        for n in root.toposort():
            if n.op is Ops.REDUCE and self.lookup(n) is None and self.free_ranges(n) <= open_now:
                self.emit(n)

    def _emit_reduce_group(self, first: UOp) -> Generator[UOp, UOp, None]:
        if first.arg is Ops.ONLINE_SOFTMAX:
            yield from self._emit_online_softmax(first)
            return
        ranges = first.src[1:]
        group = [r for r in self.reduce_groups.get(ranges, [first]) if self.lookup(r) is None]
        if first not in group:
            group = [first]
        # only members that need no loop besides the open ones may share this loop nest now (the copies of an
        # unrolled tile whose padding check folded differ in the loops they use: some are hoisted earlier)
        open_now = set(self.open_ranges)
        group = [r for r in group if r is first or self.free_ranges(r) <= open_now]
        # a member that needs another member's result cannot share its loop
        members = set(group)
        group = [r for r in group if r is first or not any(n in members for n in r.src[0].toposort() if n is not r)]
        # compute what does not depend on these loops before opening them (loop-invariant code, and the
        # shared-memory partials a grouped reduction reads after its barrier)
        open_now = set(self.open_ranges)
        for r in group:
            for n in r.src[0].toposort():
                if n.op not in (Ops.CONST, Ops.RANGE) and self.lookup(n) is None and self.free_ranges(n) <= open_now:
                    yield n
        accs = []
        for r in group:
            init_value = UOp.const(r.dtype, identity(r.arg, r.dtype))
            init = self.lookup(init_value) or (yield init_value)
            accs.append(self.push(UOp(Ops.DEFINE_ACC, r.dtype, (init,), self.acc_count)))
            self.acc_count += 1
        for rng in ranges:
            yield from self._open_range(rng)
        values = []
        for r in group:
            found = self.lookup(r.src[0])
            values.append(found if found is not None else (yield r.src[0]))
        for r, acc, v in zip(group, accs, values):
            self.push(UOp(Ops.ACCUMULATE, r.dtype, (acc, v), r.arg))
        for _ in ranges:
            self.close_range()
        for r, acc in zip(group, accs):
            self.scopes[-1][r] = self.push(UOp(Ops.READ_ACC, r.dtype, (acc,)))


    def _emit_online_softmax(self, first: UOp) -> Generator[UOp, UOp, None]:
        """An ONLINE_SOFTMAX REDUCE and the others of its group (same loops, same scores): the accumulators m, l and
        one o each, the loops, the update (see the module's docstring), then o / l per REDUCE."""
        pairs = first.src[0]
        f32 = dtypes.f32
        if first.dtype is not None and first.dtype.count > 1 and pairs.op is Ops.VECTORIZE and pairs.src and \
                len(pairs.src) % 2 == 0 and all(s.dtype == first.dtype for s in pairs.src):
            yield from self._emit_online_softmax_lanes(first)
            return
        # the scores: n scalars, or (after `vectorize`) one vector of the block's n scores
        k = 1 if pairs.op is Ops.VECTORIZE and pairs.src and pairs.src[0].dtype.count > 1 else len(pairs.src) // 2
        n = pairs.src[0].dtype.count if k == 1 else k
        w = first.dtype.count if first.dtype is not None else 0
        if pairs.op is not Ops.VECTORIZE or len(pairs.src) != k + n or first.dtype.scalar() != f32 or \
                any(s.dtype != f32 for s in pairs.src[:k] if k > 1) or \
                (k == 1 and pairs.src[0].dtype != f32.vec(n)) or any(v.dtype != f32.vec(w) for v in pairs.src[k:]):
            raise RuntimeError("an ONLINE_SOFTMAX REDUCE reduces an f32 VECTORIZE of (scores..., values...) to its "
                               "values' type")
        ranges = first.src[1:]
        scores = pairs.src[:k]
        group = [r for r in self.reduce_groups.get(ranges, [first]) if r.arg is Ops.ONLINE_SOFTMAX
                 and r.src[0].src[:k] == scores and len(r.src[0].src) == k + n and r.dtype == first.dtype
                 and self.lookup(r) is None]
        if first not in group:
            group = [first]
        open_now = set(self.open_ranges)
        group = [r for r in group if r is first or self.free_ranges(r) <= open_now]
        # what does not depend on these loops, before them (never the pairs' VECTORIZE itself). Each node is looked
        # at once: the members share their scores, and the sources' graphs overlap (a GPU block's scores are
        # inner products over the head dim), so a walk per source took time quadratic in the block. The order and
        # what is emitted are those of the walk per source (a node seen already was emitted or left out then).
        seen: set[UOp] = set()
        for r in group:
            for s in r.src[0].src:
                if s in seen:
                    continue
                for nd in postorder(s, seen):  # s's order without the nodes seen (their sources are seen too)
                    seen.add(nd)
                    if nd.op not in (Ops.CONST, Ops.RANGE) and self.lookup(nd) is None and \
                            self.free_ranges(nd) <= open_now:
                        yield nd
        tag = self.acc_count
        vt = f32.vec(w)

        def acc(init: float, d: Any = f32) -> Generator[UOp, UOp, UOp]:
            c = UOp.const(d, init)
            a = self.push(UOp(Ops.DEFINE_ACC, d, (self.lookup(c) or (yield c),), self.acc_count))
            self.acc_count += 1
            return a

        def read(a: UOp, name: str) -> UOp:
            """READ_ACC of `a` (its own node: the name keeps two reads apart), bound to a placeholder."""
            self.scopes[-1][placeholder(name)] = self.push(UOp(Ops.READ_ACC, f32, (a,), name))
            return placeholder(name)

        def placeholder(name: str) -> UOp:
            return UOp(Ops.READ_ACC, f32, (), ("online", tag, name))

        m = yield from acc(-math.inf)
        lacc = yield from acc(0.0)
        os_ = []
        for _ in group:
            os_.append((yield from acc(0.0, vt)))
        for rng in ranges:
            yield from self._open_range(rng)
        start = len(self.out)
        if k == 1:  # the block's scores as one vector: its max, its exps at once
            bm = hmax(scores[0])
        else:
            bm = scores[0]
            for sc in scores[1:]:
                bm = UOp(Ops.MAX, f32, (bm, sc))
        bm_l = self.lookup(bm) or (yield bm)
        m_old = read(m, "m_old")
        self.push(UOp(Ops.ACCUMULATE, f32, (m, bm_l), Ops.MAX))
        m_new = read(m, "m_new")
        m_safe = UOp(Ops.WHERE, f32, (UOp(Ops.CMPNE, dtypes.bool, (m_new, UOp.const(f32, -math.inf))), m_new,
                                      UOp.const(f32, 0.0)))
        alpha = self.exp(m_old - m_safe)
        if k == 1:
            z = UOp(Ops.READ_ACC, f32, (), ("online", tag, "z"))
            pz = self.exp(z)
            if self.decompose:
                pz = decompose_transcendentals(UOp(Ops.SINK, None, (pz,))).src[0]
            pv = widen(pz, z, scores[0] - splat(m_safe, n), n)
            ps = [UOp(Ops.GEP, f32, (pv,), i) for i in range(n)]
            lsum = hsum(pv)
        else:
            ps = [self.exp(sc - m_safe) for sc in scores]
            lsum = ps[0]
            for p in ps[1:]:
                lsum = lsum + p
        cols = []
        for r in group:
            c = None
            for p, v in zip(ps, r.src[0].src[k:]):
                c = splat(p, w) * v if c is None else c + splat(p, w) * v
            cols.append(c)
        if self.decompose:
            sink = decompose_transcendentals(UOp(Ops.SINK, None, (alpha, lsum, *cols)))
            alpha, lsum, cols = sink.src[0], sink.src[1], list(sink.src[2:])
        alpha_l = yield alpha
        lsum_l = yield lsum
        self.push(UOp(Ops.ACCUMULATE, f32, (lacc, alpha_l), Ops.MUL))
        self.push(UOp(Ops.ACCUMULATE, f32, (lacc, lsum_l), Ops.ADD))
        scale = alpha_l if w == 1 else (yield splat(alpha, w))
        for o, c in zip(os_, cols):  # each REDUCE's sum goes into its accumulator at once (few values live)
            c_l = yield c
            self.push(UOp(Ops.ACCUMULATE, vt, (o, scale), Ops.MUL))
            last = self.push(UOp(Ops.ACCUMULATE, vt, (o, c_l), Ops.ADD))
        if ranges and any(u.op is Ops.BARRIER for u in self.out[start:]):
            # values staged in shared memory this iteration (the GPU's k and v): the next iteration's staging must
            # not overwrite what slower threads of the work-group still read
            self.push(UOp(Ops.BARRIER, None, (last,)))
        for _ in ranges:
            self.close_range()
        l_l = self.lookup(read(lacc, "l"))
        if w > 1:
            l_l = self.push(UOp(Ops.VECTORIZE, vt, (l_l,) * w))
        for i, (r, o) in enumerate(zip(group, os_)):
            o_l = self.push(UOp(Ops.READ_ACC, vt, (o,), f"o{i}"))
            self.scopes[-1][r] = self.push(UOp(Ops.FDIV, vt, (o_l, l_l)))

    def _emit_online_softmax_lanes(self, first: UOp) -> Generator[UOp, UOp, None]:
        """An ONLINE_SOFTMAX REDUCE whose scores vary by lane (the rows form's query rows as lanes): its value is a
        VECTORIZE of n score vectors then n value vectors, all of the REDUCE's type f32 x w, and lane i of the result
        is the online softmax of lane i of every score and value. m and l are w-lane accumulators; per iteration
        m' = max(m, s_0, ..., s_{n-1}) lane by lane, alpha and p_k one vector polynomial each, l = l * alpha +
        sum_k p_k, o = o * alpha + sum_k p_k v_k; after the loops o / l. Each REDUCE has its own m and l (no group:
        the output columns of the rows form are not copies sharing scores here)."""
        f32 = dtypes.f32
        vt = first.dtype
        w = vt.count
        pairs = first.src[0]
        if vt.scalar() != f32:
            raise RuntimeError("an ONLINE_SOFTMAX REDUCE reduces an f32 VECTORIZE of (scores..., values...) to its "
                               "values' type")
        n = len(pairs.src) // 2
        scores, values = pairs.src[:n], pairs.src[n:]
        ranges = first.src[1:]
        open_now = set(self.open_ranges)
        for s in pairs.src:  # what does not depend on these loops, before them
            for nd in s.toposort():
                if nd.op not in (Ops.CONST, Ops.RANGE) and self.lookup(nd) is None and self.free_ranges(nd) <= open_now:
                    yield nd
        tag = self.acc_count

        def acc(init: float) -> Generator[UOp, UOp, UOp]:
            c = splat(UOp.const(f32, init), w)
            a = self.push(UOp(Ops.DEFINE_ACC, vt, (self.lookup(c) or (yield c),), self.acc_count))
            self.acc_count += 1
            return a

        def read(a: UOp, name: str) -> UOp:
            return self._read_online_acc(a, name, tag)

        m = yield from acc(-math.inf)
        lacc = yield from acc(0.0)
        o = yield from acc(0.0)
        for rng in ranges:
            yield from self._open_range(rng)
        bm = scores[0]
        for sc in scores[1:]:
            bm = UOp(Ops.MAX, vt, (bm, sc))
        bm_l = self.lookup(bm) or (yield bm)
        m_old = read(m, "m_old")
        self.push(UOp(Ops.ACCUMULATE, vt, (m, bm_l), Ops.MAX))
        m_new = read(m, "m_new")
        alpha, ps = self._lane_rescale(m_old, m_new, scores, tag)
        lsum, col = ps[0], ps[0] * values[0]
        for p, v in zip(ps[1:], values[1:]):
            lsum, col = lsum + p, col + p * v
        alpha_l = yield alpha
        lsum_l = yield lsum
        col_l = yield col
        self.push(UOp(Ops.ACCUMULATE, vt, (lacc, alpha_l), Ops.MUL))
        self.push(UOp(Ops.ACCUMULATE, vt, (lacc, lsum_l), Ops.ADD))
        self.push(UOp(Ops.ACCUMULATE, vt, (o, alpha_l), Ops.MUL))
        self.push(UOp(Ops.ACCUMULATE, vt, (o, col_l), Ops.ADD))
        for _ in ranges:
            self.close_range()
        l_l = self.push(UOp(Ops.READ_ACC, vt, (lacc,), "l"))
        o_l = self.push(UOp(Ops.READ_ACC, vt, (o,), "o"))
        self.scopes[-1][first] = self.push(UOp(Ops.FDIV, vt, (o_l, l_l)))

    def _read_online_acc(self, acc: UOp, name: str, tag: int) -> UOp:
        """A read of an online softmax's accumulator `acc` emitted now, returned as a placeholder (`("online", tag,
        name)`) that the step's expressions use and this scope resolves to that read."""
        ph = UOp(Ops.READ_ACC, acc.dtype, (), ("online", tag, name))
        self.scopes[-1][ph] = self.push(UOp(Ops.READ_ACC, acc.dtype, (acc,), name))
        return ph

    def _lane_rescale(self, m_old: UOp, m_new: UOp, scores: list[UOp] | tuple[UOp, ...], tag: int
                      ) -> tuple[UOp, list[UOp]]:
        """One step of a per-lane online softmax: the rescale of the old sums alpha = exp(m_old - m) and each score's
        p_k = exp(s_k - m), lane by lane, as vector polynomials (`lanes.widen`), with m the new running max (a max
        still -inf taken as 0, so a lane masked so far gives 0, not NaN)."""
        f32, vt = dtypes.f32, m_new.dtype
        w = vt.count
        m_safe = UOp(Ops.WHERE, vt, (UOp(Ops.CMPNE, dtypes.bool.vec(w), (m_new, splat(UOp.const(f32, -math.inf), w))),
                                     m_new, splat(UOp.const(f32, 0.0), w)))
        z = UOp(Ops.READ_ACC, f32, (), ("online", tag, "z"))
        pz = self.exp(z)
        if self.decompose:
            pz = decompose_transcendentals(UOp(Ops.SINK, None, (pz,))).src[0]
        return widen(pz, z, m_old - m_safe, w), [widen(pz, z, sc - m_safe, w) for sc in scores]

    def emit_online_rows(self, red: UOp, cols: list[UOp], local: UOp, stores: list[UOp]) -> None:
        """The stores of a per-lane ONLINE_SOFTMAX REDUCE `red` (`_emit_online_softmax_lanes`' form) whose values vary
        by the loops `cols` (the output columns) but whose scores do not, with those loops interchanged into the key
        loop: the REDUCE's o accumulators are the local array `local` (one w-lane vector per column), zeroed by a
        loop over the columns before the key loop, updated by one inside each iteration (o[c] = o[c] * alpha +
        sum_k p_k v_k[c]) and stored by one after it (o[c] / l): the scores, m, l and the rescale are computed
        once per iteration for every column. The three loops are fresh ranges over the columns' sizes."""
        f32 = dtypes.f32
        vt = red.dtype
        w = vt.count
        pairs = red.src[0]
        n = len(pairs.src) // 2
        scores, values = pairs.src[:n], pairs.src[n:]
        ranges = red.src[1:]
        ids = max(u.arg[0] for st in stores for u in st.toposort() if u.op is Ops.RANGE) + 1

        def fresh(k: int) -> list[UOp]:
            return [c.replace(arg=(ids + k * len(cols) + i, c.arg[1])) for i, c in enumerate(cols)]

        def at(cs: list[UOp]) -> UOp:
            flat = UOp.const(cols[0].dtype, 0)
            for c in cs:
                flat = flat * c.src[0] + c
            return flat * UOp.const(cols[0].dtype, w)

        def loop(cs: list[UOp], body: Any) -> None:
            for c in cs:
                self.open_range(c)
            body()
            for _ in cs:
                self.close_range()

        open_now = set(self.open_ranges)
        for s in pairs.src:  # what does not depend on the key loop or the columns, before them
            for nd in s.toposort():
                if nd.op not in (Ops.CONST, Ops.RANGE) and self.lookup(nd) is None and self.free_ranges(nd) <= open_now:
                    self.emit(nd)
        zero_cs, update_cs, final_cs = fresh(0), fresh(1), fresh(2)
        zero = splat(UOp.const(f32, 0.0), w)
        loop(zero_cs, lambda: self.emit(UOp(Ops.STORE, None, (local, at(zero_cs), zero))))
        tag = self.acc_count

        def acc(init: float) -> UOp:
            a = self.push(UOp(Ops.DEFINE_ACC, vt, (self.emit(splat(UOp.const(f32, init), w)),), self.acc_count))
            self.acc_count += 1
            return a

        def read(a: UOp, name: str) -> UOp:
            return self._read_online_acc(a, name, tag)

        m, lacc = acc(-math.inf), acc(0.0)
        for rng in ranges:
            self.open_range(rng)
        bm = scores[0]
        for sc in scores[1:]:
            bm = UOp(Ops.MAX, vt, (bm, sc))
        bm_l = self.emit(bm)
        m_old = read(m, "m_old")
        self.push(UOp(Ops.ACCUMULATE, vt, (m, bm_l), Ops.MAX))
        m_new = read(m, "m_new")
        alpha, ps = self._lane_rescale(m_old, m_new, scores, tag)
        lsum = ps[0]
        for p in ps[1:]:
            lsum = lsum + p
        alpha_l, lsum_l = self.emit(alpha), self.emit(lsum)
        for p in ps:  # before the columns' loop: once per iteration
            self.emit(p)
        self.push(UOp(Ops.ACCUMULATE, vt, (lacc, alpha_l), Ops.MUL))
        self.push(UOp(Ops.ACCUMULATE, vt, (lacc, lsum_l), Ops.ADD))

        def update() -> None:
            sub = dict(zip(cols, update_cs))
            o = UOp(Ops.LOAD, vt, (local, at(update_cs))) * alpha
            for p, v in zip(ps, values):
                o = o + p * substitute(v, sub)
            self.emit(UOp(Ops.STORE, None, (local, at(update_cs), o)))

        loop(update_cs, update)
        for _ in ranges:
            self.close_range()
        l_ph = read(lacc, "l")

        def final() -> None:
            value = UOp(Ops.READ_ACC, vt, (), ("online", tag, "o"))
            self.scopes[-1][value] = self.emit(UOp(Ops.FDIV, vt, (UOp(Ops.LOAD, vt, (local, at(final_cs))), l_ph)))
            sub = {red: value, **dict(zip(cols, final_cs))}
            for st in stores:
                self.emit(substitute(st, sub))

        loop(final_cs, final)

    @staticmethod
    def exp(x: UOp) -> UOp:
        """exp(x) of an online softmax: exp2 of x log2(e), its argument clamped at -200."""
        f32 = dtypes.f32
        return UOp(Ops.EXP2, f32, (UOp(Ops.MAX, f32, (x * UOp.const(f32, _LOG2E), UOp.const(f32, _EXP_FLOOR))),))


def start_linearizer(nodes: list[UOp], decompose: bool = False) -> _Linearizer:
    """A linearizer for a kernel's nodes (toposorted) with its declarations placed first: buffers in parameter
    order, dim variables, shared memory, then the GPU indices. Shared by `linearize` and kernels written as linear
    UOps directly (the fused attention)."""
    groups: dict[tuple[UOp, ...], list[UOp]] = {}
    for u in nodes:
        if u.op is Ops.REDUCE:
            groups.setdefault(u.src[1:], []).append(u)
    lin = _Linearizer(groups, decompose)
    for g in sorted((u for u in nodes if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg):
        lin.scopes[0][g] = lin.push(g)
    for v in sorted((u for u in nodes if u.op is Ops.DEFINE_VAR), key=lambda u: str(u.arg)):
        lin.scopes[0][v] = lin.push(v)
    for loc in (u for u in nodes if u.op is Ops.DEFINE_LOCAL):  # shared memory is declared at the top
        lin.scopes[0][loc] = lin.push(loc)
    for s in (u for u in nodes if u.op is Ops.SPECIAL):
        lin.scopes[0][s] = lin.push(s)
    return lin


def linearize(ast: UOp, decompose: bool = False) -> list[UOp]:
    """The linear program of a kernel AST (a SINK of STOREs) that has been through the pipeline's passes up to
    here (`tgc.codegen.pipeline`: no UPCAST or UNROLL range left, indices in their final width). A function,
    not a rewrite: it schedules (where each value is computed, which loops share a nest), it does not rewrite."""
    nodes = ast.toposort()
    lin = start_linearizer(nodes, decompose)
    reduce_ranges = {r for u in nodes if u.op is Ops.REDUCE for r in u.src[1:]}
    staged_loops = {a for u in nodes if u.op is Ops.BARRIER and _staged(u) for a in u.arg[1]}
    reduce_ranges |= {u for u in nodes if u.op is Ops.RANGE and u.arg in staged_loops}
    interchange = _interchanged_columns(ast, lin)
    inner = set(interchange[1]) if interchange else set()
    outer = sorted((u for u in nodes if u.op is Ops.RANGE and u not in reduce_ranges and u not in inner),
                   key=lambda r: r.arg[0])
    for r in outer:
        lin.hoist(ast)  # values that need only the loops open so far (per-row reductions) go here
        lin.open_range(r)
    if interchange:
        red, cols = interchange
        size = red.dtype.count
        for c in cols:
            size *= c.src[0].arg
        local = UOp(Ops.DEFINE_LOCAL, dtypes.f32.as_ptr(), (), ("o_rows", size))
        lin.out.insert(next(i for i, u in enumerate(lin.out) if u.op is Ops.RANGE), local)  # declared first
        lin.scopes[0][local] = local
        lin.emit_online_rows(red, cols, local, list(ast.src))
    else:
        for store in ast.src:
            lin.emit(store)
    while lin.open_ranges:
        lin.close_range()
    return lin.out


def _staged(u: UOp) -> bool:
    """A BARRIER(STAGED): stores in loops of their own (its arg's range ids) before the loads that read them."""
    return isinstance(u.arg, tuple) and len(u.arg) == 2 and u.arg[0] == "staged"


def _interchanged_columns(ast: UOp, lin: _Linearizer) -> tuple[UOp, list[UOp]] | None:
    """(the REDUCE, the column loops) where every store of the kernel stores one per-lane ONLINE_SOFTMAX REDUCE (n
    score vectors then n value vectors of its type) whose values vary by output loops of constant size that its
    scores do not vary by (the rows form's output columns): those loops are interchanged into its key loop
    (`emit_online_rows`). None otherwise (the loops stay outside: correct, but the scores computed per column)."""
    # (the nodes below the stores are those below the SINK: one walk, not one per store; a convolution's register
    # tile stores 256 lanes, each over most of the kernel: 0.75 s of ResNet-50's lowering under cProfile)
    reds = {u for u in ast.toposort() if u.op is Ops.REDUCE and u.arg is Ops.ONLINE_SOFTMAX}
    if len(reds) != 1:
        return None
    red = reds.pop()
    pairs = red.src[0]
    if red.dtype is None or red.dtype.count == 1 or pairs.op is not Ops.VECTORIZE or len(pairs.src) % 2 or \
            not all(s.dtype == red.dtype for s in pairs.src):
        return None
    n = len(pairs.src) // 2
    in_scores = frozenset().union(*(lin.free_ranges(s) for s in pairs.src[:n]))
    in_values = frozenset().union(*(lin.free_ranges(s) for s in pairs.src[n:]))
    cols = sorted((r for r in in_values - in_scores if r.arg[1] is RangeKind.LOOP), key=lambda r: r.arg[0])
    if not cols or any(c.src[0].op is not Ops.CONST for c in cols):
        return None
    if ast.src and any(st.op is not Ops.STORE or red not in st.src[2].toposort() for st in ast.src):
        return None
    # the columns must be the innermost output loops (nothing else of the kernel is computed inside them)
    staged = {a for u in ast.toposort() if u.op is Ops.BARRIER and _staged(u) for a in u.arg[1]}
    others = [r for r in {u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] is RangeKind.LOOP}
              if r not in cols and r.arg not in staged]
    if any(o.arg[0] > min(c.arg[0] for c in cols) for o in others):
        return None
    return red, cols


__all__ = ["linearize", "dtypes"]
