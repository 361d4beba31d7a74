"""Attention fusion, codegen side: one kernel computing `softmax(X) @ v` as an online softmax.

The scheduler (`tgc.engine.attention`) hands a kernel whose `meta["attention"]` holds the score X at
(query row, key j) (its inner products as REDUCEs over the head dimension), v at (j, column) and the output
index. This module writes its linear UOps directly, for every device:

    for each batch index and query row i (CPU: rows split across threads; GPU: one thread per row)
      m = -inf; l = 0; o[0..Dv) = 0                 accumulators (DEFINE_ACC)
      for each block of BLOCK keys j0..j0+BLOCK
        s_j = X(i, j)  (j past the end: -inf)       BLOCK inner products sharing one loop over the head dim
        m' = max(m, max_j s_j); alpha = exp(m - m'); p_j = exp(s_j - m')
        l = l * alpha + sum_j p_j; o[c] = o[c] * alpha + sum_j p_j v[j, c]
      out[i, c] = o[c] / l

The scores live in registers for one block and are never stored; the accumulators are updated with
ACCUMULATE MUL then ADD (no new op: every renderer and the PYTHON device run it; the PYTHON device steps a
loop that reads an accumulator it updates one index at a time). Keys past the end of the last block read the
last key (clamped index) and get weight 0, so no load leaves its buffer.
"""

from __future__ import annotations

import math
from typing import Any

from tgc.dtype import dtypes
from tgc.ir.kernel import INDEX
from tgc.ir.symbolic import simplify
from tgc.ir.uop import Ops, RangeKind, UOp, substitute

BLOCK = 16  # keys per block: scores held in registers at once
_LOG2E = 1 / math.log(2)
_FLOOR = -200.0  # exp2 arguments are clamped here: exp2(-200) is 0 in f32, and -inf - -inf never reaches exp2


def _ph(name: str) -> UOp:
    """A placeholder for an accumulator's value, bound to a READ_ACC while linearizing."""
    return UOp(Ops.READ_ACC, dtypes.f32, (), ("attn", name))


def _f32(u: UOp) -> UOp:
    return u if u.dtype == dtypes.f32 else UOp(Ops.CAST, dtypes.f32, (u,))


def _c(v: float) -> UOp:
    return UOp.const(dtypes.f32, v)


def _exp(x: UOp) -> UOp:
    return UOp(Ops.EXP2, dtypes.f32, (UOp(Ops.MAX, dtypes.f32, (x * _c(_LOG2E), _c(_FLOOR))),))


def _splat(u: UOp, w: int) -> UOp:
    return u if w == 1 else UOp(Ops.VECTORIZE, u.dtype.vec(w), (u,) * w)


def _hsum(v: UOp) -> UOp:
    """The sum of a vector's lanes, as a balanced tree."""
    lanes = [UOp(Ops.GEP, v.dtype.scalar(), (v,), i) for i in range(v.dtype.count)]
    while len(lanes) > 1:
        lanes = [lanes[i] + lanes[i + 1] if i + 1 < len(lanes) else lanes[i] for i in range(0, len(lanes), 2)]
    return lanes[0]


def _lanes(u: UOp, r: UOp, w: int, lane_id: int) -> UOp | None:
    """`u` with range `r` split as r = r' * w + lane and the lane made vector lanes (contiguous loads become
    vector loads, the `tgc.codegen.expand` vectorizer), or None where `u` does not vary with the lane."""
    from tgc.codegen.expand import _Vectorizer
    lane = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, w),), (lane_id, RangeKind.UPCAST))
    outer = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, r.src[0].arg // w),), r.arg)
    inner = simplify(substitute(u, {r: outer * UOp.const(INDEX, w) + lane}))
    vz = _Vectorizer(lane)
    vz.analyze(inner)
    out = vz.vec(inner)
    return out if out.dtype is not None and out.dtype.count == w else None


def _vector_scores(x: UOp, w: int, lane_id: int) -> UOp:
    """x with each f32 inner product over a multiple of `w` computed `w` lanes at a time (then summed)."""
    mapping = {}
    for red in (u for u in x.toposort() if u.op is Ops.REDUCE):
        if (red.arg is not Ops.ADD or red.dtype != dtypes.f32 or len(red.src) != 2
                or red.src[1].src[0].op is not Ops.CONST or red.src[1].src[0].arg % w):
            continue
        vin = _lanes(red.src[0], red.src[1], w, lane_id)
        if vin is not None:
            outer = vin.toposort()
            r = next(u for u in outer if u.op is Ops.RANGE and u.arg == red.src[1].arg)
            mapping[red] = _hsum(UOp(Ops.REDUCE, vin.dtype, (vin, r), Ops.ADD))
    return substitute(x, mapping) if mapping else x


def _widen(u: UOp, z: UOp, zv: UOp, w: int) -> UOp:
    """`u`, a function of the scalar `z`, computed on the lanes of the vector `zv` (others broadcast)."""
    memo: dict[UOp, UOp] = {z: zv}
    for n in u.toposort():
        if n in memo:
            continue
        if not any(s in memo for s in n.src):
            continue
        srcs = tuple(memo[s] if s in memo else _splat(s, w) for s in n.src)
        memo[n] = UOp(n.op, n.dtype.vec(w), srcs, n.arg)
    return memo.get(u, _splat(u, w))


def build(sp: Any, block: int = BLOCK, width: int = 1, decompose: bool = False) -> tuple[UOp, UOp, int]:
    """The kernel as one SINK of its values (AST level, before the pipeline's rewrites) and the key-block range:
    sources are [block max, alpha, sum of p, each column group's sum of p*v, then the stores]. `width` > 1
    (devices with vectors) computes inner products and output columns that many lanes at a time. Returns the
    SINK, the key-block range and the output columns per accumulator."""
    ids = [u.arg[0] for e in (sp.x, sp.v, *sp.loops) for u in e.toposort() if u.op is Ops.RANGE]
    next_id = max(ids, default=0) + 1
    bk = min(block, sp.tk)
    nblocks = -(-sp.tk // bk)
    jb = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, nblocks),), (next_id, RangeKind.REDUCE))
    x = _vector_scores(sp.x, width, next_id + 1) if width > 1 else sp.x
    ragged = sp.tk % bk != 0
    scores, keys = [], []
    for jj in range(bk):
        j = simplify(jb * UOp.const(INDEX, bk) + UOp.const(INDEX, jj)) if nblocks > 1 else UOp.const(INDEX, jj)
        last = UOp.const(INDEX, sp.tk - 1)
        jc = simplify((j < UOp.const(INDEX, sp.tk)).where(j, last)) if ragged else j
        s = _f32(simplify(substitute(x, {sp.rj: jc})))
        if ragged:
            s = UOp(Ops.WHERE, dtypes.f32, (j < UOp.const(INDEX, sp.tk), s, _c(-math.inf)))
        scores.append(s)
        keys.append(jc)
    bm = scores[0]
    for s in scores[1:]:
        bm = UOp(Ops.MAX, dtypes.f32, (bm, s))
    m_old, m_new = _ph("m_old"), _ph("m_new")
    m_safe = UOp(Ops.WHERE, dtypes.f32, (UOp(Ops.CMPNE, dtypes.bool, (m_new, _c(-math.inf))), m_new, _c(0.0)))
    alpha = _exp(m_old - m_safe)
    if width > 1 and bk == width:  # the block's exps as one vector (the polynomial, widened: `_widen`)
        z = _ph("z")
        pz = _exp(z)
        if decompose:
            from tgc.codegen.transcendental import decompose_transcendentals
            pz = decompose_transcendentals(UOp(Ops.SINK, None, (pz,))).src[0]
        sv = UOp(Ops.VECTORIZE, dtypes.f32.vec(bk), tuple(scores)) - _splat(m_safe, bk)
        pv = _widen(pz, z, sv, bk)
        ps = [UOp(Ops.GEP, dtypes.f32, (pv,), i) for i in range(bk)]
        lsum = _hsum(pv)
    else:
        ps = [_exp(s - m_safe) for s in scores]
        lsum = ps[0]
        for p in ps[1:]:
            lsum = lsum + p
    w = width if width > 1 and sp.dv % width == 0 and sp.dtype == dtypes.f32 else 1
    vw = _lanes(sp.v, sp.rdv, w, next_id + 2) if w > 1 else None
    if vw is None:
        w = 1
    cols, stores = [], []
    for c in range(sp.dv // w):
        if w > 1:
            outer = next(u for u in vw.toposort() if u.op is Ops.RANGE and u.arg == sp.rdv.arg)
            vc = substitute(vw, {outer: UOp.const(INDEX, c)})
        else:
            vc = substitute(sp.v, {sp.rdv: UOp.const(INDEX, c)})
        acc = None
        for p, jc in zip(ps, keys):
            term = _splat(p, w) * _f32(simplify(substitute(vc, {sp.rj: jc}))) if w == 1 else \
                _splat(p, w) * simplify(substitute(vc, {sp.rj: jc}))
            acc = term if acc is None else acc + term
        cols.append(acc)
        o = UOp(Ops.READ_ACC, dtypes.f32.vec(w), (), ("attn", f"o{c}"))
        value = UOp(Ops.FDIV, dtypes.f32.vec(w), (o, _splat(_ph("l"), w)))
        if sp.dtype != dtypes.f32:
            value = UOp(Ops.CAST, sp.dtype, (value,))
        idx = simplify(substitute(sp.out_index, {sp.rdv: UOp.const(INDEX, c * w)}))
        stores.append(UOp(Ops.STORE, None, (sp.out, idx, value)))
    return UOp(Ops.SINK, None, (bm, alpha, lsum, *cols, *stores)), jb, w


def lower_attention(item: Any, device: Any, name: str) -> Any:
    """The fused attention kernel of `item` lowered for `device` (a `tgc.codegen.pipeline.Lowered`)."""
    from tgc.codegen import verify
    from tgc.codegen.index import narrow_index
    from tgc.codegen.legalize import legalize
    from tgc.codegen.opt import MIN_WORK_PER_THREAD, launch_limits, map_to_grid, split_threads
    from tgc.codegen.pipeline import Lowered, drop_unused_buffers, render_kernel
    from tgc.codegen.spec import verify_spec
    from tgc.codegen.transcendental import decompose_transcendentals
    from tgc.env import env_flag

    sp = item.meta["attention"]
    width = 16 if device.caps.vectors and not env_flag("NOOPT") else 1
    ast, jb, w = build(sp, width=width, decompose=device.caps.decompose_transcendentals)
    ast = legalize(ast)
    if device.caps.decompose_transcendentals:
        ast = decompose_transcendentals(ast)
    launch: dict = {}
    rows = 1
    for r in sp.loops:
        rows *= r.src[0].arg
    if device.caps.gpu:
        if sp.loops:
            lim = launch_limits(device)
            ast, launch = map_to_grid(ast, max_local=min(device.caps.preferred_local_size, lim.threads, 64),
                                      max_grid=lim.grid)
    elif sp.loops and not env_flag("NOOPT"):
        cores = getattr(device, "cores", 1)
        work = rows * sp.tk * max(sp.dv, 1) * 4
        threads = min(cores, rows, max(1, work // MIN_WORK_PER_THREAD))
        if threads > 1:
            ast, threads = split_threads(ast, threads)
            if threads > 1:
                launch["global_size"] = (threads, 1, 1)
    bufs = list(item.bufs)
    ast, bufs = drop_unused_buffers(ast, bufs)
    ast = narrow_index(ast)
    uops = _linearize(ast, jb.arg, sp.dv // w)
    if verify.enabled():
        verify_spec(name, uops)
        verify.verify_kernel(name, uops, bufs, launch)
    src = render_kernel(device, name, uops, bufs, launch)
    return Lowered(name, ast, uops, src, bufs, launch, [])


def _linearize(ast: UOp, jb_arg: Any, ncols: int) -> list[UOp]:
    from tgc.codegen.linearize import _Linearizer

    nodes = ast.toposort()
    bm, alpha, lsum = ast.src[:3]
    cols, stores = ast.src[3:3 + ncols], ast.src[3 + ncols:]
    groups: dict[tuple[UOp, ...], list[UOp]] = {}
    for u in nodes:
        if u.op is Ops.REDUCE:
            groups.setdefault(u.src[1:], []).append(u)
    lin = _Linearizer(groups)
    for g in sorted((u for u in nodes if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg):
        lin.scopes[0][g] = lin.push(g)
    for v in sorted((u for u in nodes if u.op is Ops.DEFINE_VAR), key=lambda u: str(u.arg)):
        lin.scopes[0][v] = lin.push(v)
    for s in (u for u in nodes if u.op is Ops.SPECIAL):
        lin.scopes[0][s] = lin.push(s)
    jb = next((u for u in nodes if u.op is Ops.RANGE and u.arg == jb_arg), None)  # None: a single block
    outer = sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[1] is RangeKind.LOOP), key=lambda r: r.arg[0])
    for r in outer:
        lin.open_range(r)
    f32 = dtypes.f32

    def acc(init: float, d=f32) -> UOp:
        a = lin.push(UOp(Ops.DEFINE_ACC, d, (lin.emit(UOp.const(d, init)),), lin.acc_count))
        lin.acc_count += 1
        return a

    def read(a: UOp, tag: str) -> UOp:
        return lin.push(UOp(Ops.READ_ACC, a.dtype, (a,), tag))

    m, lacc = acc(-math.inf), acc(0.0)
    o = [acc(0.0, c.dtype) for c in cols]
    if jb is not None:
        lin.open_range(jb)
    bm_l = lin.emit(bm)
    lin.scopes[-1][_ph("m_old")] = read(m, "m_old")
    lin.push(UOp(Ops.ACCUMULATE, f32, (m, bm_l), Ops.MAX))
    lin.scopes[-1][_ph("m_new")] = read(m, "m_new")
    alpha_l, lsum_l = lin.emit(alpha), lin.emit(lsum)
    cols_l = [lin.emit(c) for c in cols]
    lin.push(UOp(Ops.ACCUMULATE, f32, (lacc, alpha_l), Ops.MUL))
    lin.push(UOp(Ops.ACCUMULATE, f32, (lacc, lsum_l), Ops.ADD))
    for a, c in zip(o, cols_l):
        scale = alpha_l if a.dtype.count == 1 else lin.emit(_splat(alpha, a.dtype.count))
        lin.push(UOp(Ops.ACCUMULATE, a.dtype, (a, scale), Ops.MUL))
        lin.push(UOp(Ops.ACCUMULATE, a.dtype, (a, c), Ops.ADD))
    if jb is not None:
        lin.close_range()
    lin.scopes[-1][_ph("l")] = read(lacc, "l")
    for i, a in enumerate(o):
        lin.scopes[-1][UOp(Ops.READ_ACC, a.dtype, (), ("attn", f"o{i}"))] = read(a, f"o{i}")
    for st in stores:
        lin.emit(st)
    while lin.open_ranges:
        lin.close_range()
    return lin.out


__all__ = ["BLOCK", "build", "lower_attention"]
