"""Lane arithmetic on vector values, shared by the vectorizer (`tgc.codegen.expand`) and the linearizer.

Contracts: every function builds UOps (AST level, before linearizing) from UOps and never mutates them.
`hsum`/`hmax` reduce one vector's lanes to a scalar as a balanced tree of GEPs; `lane_sums` takes n vectors of n
lanes (n a power of two) to one vector whose lane i is the sum of vector i's lanes (the transposed sums, fewer
shuffles than n `hsum`s); `splat` broadcasts a scalar; `widen` computes a function of one scalar on every lane of
a vector (the exp polynomial of a block of scores at once).
"""

from __future__ import annotations

from tgc.dtype import dtypes
from tgc.ir.uop import Ops, UOp


def splat(u: UOp, w: int) -> UOp:
    """`u` on `w` lanes (itself for one lane)."""
    return u if w == 1 else UOp(Ops.VECTORIZE, u.dtype.vec(w), (u,) * w)


def hsum(v: UOp) -> UOp:
    """The sum of a vector's lanes, as a balanced tree."""
    lanes = [UOp(Ops.GEP, v.dtype.scalar(), (v,), i) for i in range(v.dtype.count)]
    while len(lanes) > 1:
        lanes = [lanes[i] + lanes[i + 1] if i + 1 < len(lanes) else lanes[i] for i in range(0, len(lanes), 2)]
    return lanes[0]


def hmax(v: UOp) -> UOp:
    """The largest of a vector's lanes, as a balanced tree."""
    lanes = [UOp(Ops.GEP, v.dtype.scalar(), (v,), i) for i in range(v.dtype.count)]
    while len(lanes) > 1:
        lanes = [UOp(Ops.MAX, lanes[i].dtype, (lanes[i], lanes[i + 1])) if i + 1 < len(lanes) else lanes[i]
                 for i in range(0, len(lanes), 2)]
    return lanes[0]


def lane_sums(vs: list[UOp]) -> UOp:
    """n f32 vectors of n lanes (n a power of two) -> one vector whose lane i is the sum of vs[i]'s lanes: a tree of
    half-vector additions (each level adds the two halves of every vector's lanes, two vectors per shuffle pair:
    2n - 2 shuffles and n - 1 additions in all, where n horizontal sums take n log2 n of each), then one
    permutation."""
    n = len(vs)
    items = [(v, [i] * n) for i, v in enumerate(vs)]  # each vector with the input every lane belongs to
    h = n // 2
    while h >= 1:
        nxt = []
        for (a, own_a), (b, own_b) in zip(items[0::2], items[1::2]):
            lo, hi, own = [], [], []
            for k in range(n // (2 * h)):
                for src, o in ((a, own_a), (b, own_b)):
                    lo += [UOp(Ops.GEP, dtypes.f32, (src,), k * 2 * h + i) for i in range(h)]
                    hi += [UOp(Ops.GEP, dtypes.f32, (src,), k * 2 * h + h + i) for i in range(h)]
                    own += [o[k * 2 * h + i] for i in range(h)]
            vt = dtypes.f32.vec(n)
            nxt.append((UOp(Ops.VECTORIZE, vt, tuple(lo)) + UOp(Ops.VECTORIZE, vt, tuple(hi)), own))
        items, h = nxt, h // 2
    v, own = items[0]
    return UOp(Ops.VECTORIZE, dtypes.f32.vec(n), tuple(UOp(Ops.GEP, dtypes.f32, (v,), own.index(i)) for i in range(n)))


def widen(u: UOp, z: UOp, zv: UOp, w: int) -> UOp:
    """`u`, a function of the scalar `z`, computed on the lanes of the vector `zv` (others broadcast)."""
    memo: dict[UOp, UOp] = {z: zv}
    for n in u.toposort():
        if n in memo:
            continue
        if not any(s in memo for s in n.src):
            continue
        srcs = tuple(memo[s] if s in memo else splat(s, w) for s in n.src)
        memo[n] = UOp(n.op, n.dtype.vec(w), srcs, n.arg)
    return memo.get(u, splat(u, w))
