"""Attention fusion, codegen side: one kernel computing `softmax(X) @ v` as an online softmax.

The scheduler (`tgc.engine.attention`) hands a kernel whose `meta["attention"]` holds the score X at
(query row, key j) (its inner products as REDUCEs over the head dimension), v at (j, column) and the output
index. The kernel, for every device:

    for each batch index and query row i (CPU: rows split across threads; GPU: one thread per row)
      m = -inf; l = 0; o[0..Dv) = 0                 accumulators (DEFINE_ACC)
      for each block of BLOCK keys j0..j0+BLOCK
        s_j = X(i, j)  (j past the end: -inf)       BLOCK inner products sharing one loop over the head dim
        m' = max(m, max_j s_j); alpha = exp(m - m'); p_j = exp(s_j - m')
        l = l * alpha + sum_j p_j; o[c] = o[c] * alpha + sum_j p_j v[j, c]
      out[i, c] = o[c] / l

That is the per-row form: an ordinary kernel AST of REDUCE(ONLINE_SOFTMAX) (`online_softmax_ast`) that the
pipeline's passes lower (`pipeline.lower`: `unroll_reduce` makes a block of keys one iteration, `vectorize` on
devices with vectors takes the inner products 16 lanes at a time, the block's scores as one vector and 16 output
columns as the REDUCE's lanes, `linearize` writes the accumulators, the rescale and, on a GPU whose work-groups
stage each block of k and v in shared memory (`_stage_shared`), the block's second barrier). It serves the PYTHON
device, NOOPT, the GPU dialects and, on the CPU, f16 inputs, one query row, long heads and BEAM's unoptimized
reference.

The CPU's rows form is still written here as linear UOps: `build_rows`, 16 query rows as the lanes of every
value, with loops, not written-out terms: the row side of the inner products is staged once per tile of rows into
a local array (head dimension x 16), each key's score is a 16-lane REDUCE over the head dimension (a block's keys
share that loop), the output row's accumulators are a second local array (Dv x 16) that a loop over the columns
rescales and adds the block's p * v to, and the block's exps are one vector polynomial per key. Its size does not
grow with the head dimension.

The scores live in registers for one block and are never stored; the accumulators are updated with ACCUMULATE
MUL then ADD (no new linear op: every renderer and the PYTHON device run it; the PYTHON device steps a loop that
reads an accumulator it updates one index at a time). Keys past the end of the last block read the last key
(clamped index) and get weight 0, so no load leaves its buffer.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tgc.codegen.expand import _Vectorizer
from tgc.codegen.index import narrow_index
from tgc.codegen.lanes import splat, widen
from tgc.codegen.legalize import HALF, legalize
from tgc.codegen.linearize import start_linearizer
from tgc.codegen.opt import (
    MIN_WORK_PER_THREAD,
    Opt,
    OptError,
    OptOps,
    gate_memory,
    launch_limits,
    split_threads,
)
from tgc.codegen.pipeline import drop_unused_buffers, finish, lower, shared_memory_bytes, uops_text
from tgc.codegen.transcendental import decompose_transcendentals
from tgc.dtype import dtypes
from tgc.env import debug_level, env_flag
from tgc.ir.kernel import INDEX
from tgc.ir.symbolic import simplify, symbolic
from tgc.ir.uop import Ops, RangeKind, UOp, graph_rewrite, pretty, substitute

VECTOR_WIDTH = 16  # the CPU's per-row form: output columns and inner-product lanes per vector
BLOCK = 16  # keys per block: scores held in registers at once
SHARED_ROWS = 64  # GPU: query rows per work-group sharing each block's keys and values in shared memory
_LOG2E = 1 / math.log(2)
_FLOOR = -200.0  # exp2 arguments are clamped here: exp2(-200) is 0 in f32, and -inf - -inf never reaches exp2


def _ph(name: str, w: int = 1) -> UOp:
    """A placeholder for an accumulator's value, bound to a READ_ACC while linearizing."""
    return UOp(Ops.READ_ACC, dtypes.f32.vec(w), (), ("attn", name))


def _f32(u: UOp) -> UOp:
    return u if u.dtype == dtypes.f32 else UOp(Ops.CAST, dtypes.f32, (u,))


def _c(v: float) -> UOp:
    return UOp.const(dtypes.f32, v)


def _exp(x: UOp) -> UOp:
    return UOp(Ops.EXP2, dtypes.f32, (UOp(Ops.MAX, dtypes.f32, (x * _c(_LOG2E), _c(_FLOOR))),))


def _staged_loads(sp: Any) -> list[tuple[UOp, list[UOp], list[int], int]]:
    """The loads `_stage_shared` stages: each load of X or v that varies with the key but not with the query row
    (and whose other ranges have constant ends), with those other ranges, their sizes and the elements per key."""
    ri, outer = sp.loops[-1], set(sp.loops)
    out, seen = [], set()
    for ld in [u for e in (sp.x, sp.v) for u in e.toposort() if u.op is Ops.LOAD]:
        if ld in seen:
            continue
        seen.add(ld)
        rs = {u for u in ld.src[1].toposort() if u.op is Ops.RANGE}
        if sp.rj not in rs or ri in rs:
            continue
        inner = sorted((r for r in rs if r is not sp.rj and r not in outer), key=lambda r: r.arg[0])
        if any(r.src[0].op is not Ops.CONST for r in inner):
            continue
        sizes = [r.src[0].arg for r in inner]
        per_key = 1
        for n in sizes:
            per_key *= n
        out.append((ld, inner, sizes, per_key))
    return out


def _shared_bytes_per_key(sp: Any) -> int:
    """The shared memory one key of a block takes when staged (as `pipeline.shared_memory_bytes` counts it)."""
    return sum(per_key * (4 if ld.dtype.name in ("f16", "bf16") else ld.dtype.itemsize)
               for ld, _, _, per_key in _staged_loads(sp))


def _stage_shared(sp: Any, jb: UOp, bk: int, group: int, next_id: int) -> tuple:
    """GPU work-groups of `group` query rows share each block's keys and values through shared memory: every
    load of X or v that varies with the key but not with the query row is staged, per block, into a
    DEFINE_LOCAL by all threads of the group (STOREs, then one BARRIER), and read from there. Returns X, v and
    the query row with those loads replaced, the in-block key placeholder and the staging STOREs (in order)."""
    ri = sp.loops[-1]
    tq = ri.src[0].arg
    tile = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, -(-tq // group)),), ri.arg)
    lane = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, group),), (next_id + 1, RangeKind.LOCAL))
    rows = simplify(tile * UOp.const(INDEX, group) + lane)
    # a thread of a row past the end stages its share and reaches every barrier, but its own global loads and its
    # output stores are gated off (`live`): it never reads or writes a row another thread owns
    live = simplify(rows < UOp.const(INDEX, tq)) if tq % group else None
    rjl = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, bk),), (next_id + 2, RangeKind.REDUCE))
    stores: list[UOp] = []
    mapping: dict[UOp, UOp] = {}
    for ld, inner, sizes, per_key in _staged_loads(sp):
        n = bk * per_key
        local = UOp(Ops.DEFINE_LOCAL, ld.dtype.as_ptr(), (), (f"kv{len(mapping)}", n))
        for e in range(-(-n // group)):
            flat = simplify(UOp.const(INDEX, e * group) + lane)
            # the last round's threads past the array's end stage nothing (gated load and store)
            in_array = simplify(flat < UOp.const(INDEX, n)) if (e + 1) * group > n else None
            sub = {sp.rj: None}
            rest = flat
            for r, size in zip(reversed(inner), reversed(sizes)):
                sub[r] = simplify(rest % UOp.const(INDEX, size))
                rest = simplify(rest // UOp.const(INDEX, size))
            j = simplify(jb * UOp.const(INDEX, bk) + rest)
            if sp.tk % bk:
                j = simplify((j < UOp.const(INDEX, sp.tk)).where(j, UOp.const(INDEX, sp.tk - 1)))
            sub[sp.rj] = j
            value = simplify(substitute(ld, sub))
            if in_array is None:
                stores.append(UOp(Ops.STORE, None, (local, flat, value)))
            else:
                stores.append(UOp(Ops.STORE, None, (local, flat, gate_memory(value, in_array), in_array)))
        idx = rjl * UOp.const(INDEX, per_key)
        stride = per_key
        for r, size in zip(inner, sizes):
            stride //= size
            idx = idx + r * UOp.const(INDEX, stride)
        mapping[ld] = (local, simplify(idx))
    if not stores:
        return None
    barrier = None  # after every staging store (a BARRIER orders at most 256: a chain past that)
    for i in range(0, len(stores), 255):
        barrier = UOp(Ops.BARRIER, None, (*(() if barrier is None else (barrier,)), *stores[i:i + 255]))
    loads = {ld: UOp(Ops.LOAD, ld.dtype, (local, idx, barrier)) for ld, (local, idx) in mapping.items()}
    x = substitute(sp.x, {**loads, ri: rows})
    v = substitute(sp.v, loads)
    if live is not None:  # what is still read from global memory (q's row) only for a live row
        x, v = gate_memory(x, live, keep=(barrier,)), gate_memory(v, live, keep=(barrier,))
    return x, v, ri, rows, live, rjl, stores


ROW_LANES = 16  # query rows per vector on devices with vectors (`build_rows`)
# The rows form through the pipeline's passes (`online_softmax_ast(rows=)`, `expand._vectorize_online_rows`) instead
# of `build_rows`: not the default until its kernels are as fast ("The rows form through the passes" in DESIGN.md).
ROWS_THROUGH_PASSES = False
ROW_BLOCK = 16  # keys per block there


def _row_vectorizer(lane: UOp, cache: dict | None = None, simp: Any = simplify) -> Any:
    """The `tgc.codegen.expand` vectorizer, except that integer and bool values varying by lane (index math, a
    causal mask's comparison) are computed lane by lane as scalars: index math stays scalar, with its bounds.
    `simp` simplifies each lane's value (`_memo_simplify`: one memo across the kernel's expressions)."""

    shared: dict = {} if cache is None else cache  # (value, lane) -> the value at that lane, across vectorizers

    class _Rows(_Vectorizer):
        def at(self, u: UOp, j: int) -> UOp:
            key = (u, j)
            if key not in shared:
                shared[key] = simp(substitute(u, {self.lane: UOp.const(self.lane.dtype, j)}))
            return shared[key]

        def vec(self, u: UOp) -> UOp:
            if (u in self.depends and u.op is not Ops.LOAD and u.dtype is not None and u.dtype.count == 1
                    and not u.dtype.is_float):
                if u not in self.memo:
                    self.memo[u] = UOp(Ops.VECTORIZE, u.dtype.vec(self.width),
                                       tuple(self.at(u, j) for j in range(self.width)))
                return self.memo[u]
            return super().vec(u)

    return _Rows(lane)


def _memo_simplify() -> Any:
    """`simplify` with one memo shared by every call (node -> its simplified form): the kernel's expressions
    share most subtrees (index math of the row tile, the key block), which are then simplified once."""
    memo: dict[UOp, UOp] = {}
    return lambda u: graph_rewrite(u, symbolic, memo=memo)


@dataclasses.dataclass
class RowsKernel:
    """`build_rows`'s kernel: `ast` a SINK of [block max, alpha, sum of p, the output update's store, then
    `nfinal` output stores, `nstage` staging stores, `nzero` zeroing stores]; the loops by range id: `jb` the key
    blocks, `stage` the staging loop over the head dimension, `zero`, `update` and `final` the loops over the
    output columns (zeroing the accumulators, adding a block to them, storing them)."""

    ast: UOp
    jb: Any
    stage: Any
    zero: Any
    update: Any
    final: Any
    nfinal: int
    nstage: int
    nzero: int


def _row_side(body: UOp, lane: UOp, r: UOp, rj: UOp) -> list[UOp]:
    """The largest float subexpressions of an inner product's `body` that vary with the query row (`lane`) and the
    head-dimension index `r` but not with the key `rj` (q's element, or what q is computed from): each is staged
    once per tile of rows (`build_rows`) instead of recomputed for every key."""
    nodes = body.toposort()
    dep: dict[UOp, int] = {}  # bit 1: varies with the row, 2: with r, 4: with the key
    for u in nodes:
        bits = (1 if u is lane else 2 if u is r else 4 if u is rj else 0)
        for s in u.src:
            bits |= dep.get(s, 0)
        dep[u] = bits

    def wanted(u: UOp) -> bool:
        return dep[u] == 3 and u.dtype is not None and u.dtype.count == 1 and u.dtype.is_float

    users: dict[UOp, list[UOp]] = {}
    for u in nodes:
        for s in u.src:
            users.setdefault(s, []).append(u)
    return [u for u in nodes if wanted(u) and (u is body or any(not wanted(p) for p in users.get(u, [])))]


def build_rows(sp: Any, decompose: bool, w: int = ROW_LANES, block: int | None = None) -> RowsKernel | None:
    """The kernel with `w` query rows as the lanes of every value (devices with vectors). Loops, not written-out
    terms: per tile of rows, what the inner products read of the query rows (`_row_side`) is staged once into
    a DEFINE_LOCAL (head dimension x w lanes: one vector load per element after); per block of keys, each key's
    scores are one w-lane REDUCE over the head dimension (the block's keys share that loop: one accumulator
    each), and the output row's accumulators (Dv x w lanes) live in a second DEFINE_LOCAL that a loop over the
    columns rescales and adds the block's p * v to. None where it does not apply (half types, one query row)."""
    if not _rows_apply(sp):
        return None
    ri = sp.loops[-1]
    simp = _memo_simplify()
    tq = ri.src[0].arg
    ids = [u.arg[0] for e in (sp.x, sp.v, *sp.loops) for u in e.toposort() if u.op is Ops.RANGE]
    next_id = max(ids, default=0) + 1

    def new_range(n: int, offset: int, kind: RangeKind = RangeKind.REDUCE) -> UOp:
        return UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, n),), (next_id + offset, kind))

    tile = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, -(-tq // w)),), ri.arg)
    lane = new_range(w, 1, RangeKind.UPCAST)
    rows = simp(tile * UOp.const(INDEX, w) + lane)
    rows_c = simp((rows < UOp.const(INDEX, tq)).where(rows, UOp.const(INDEX, tq - 1))) if tq % w else rows
    bk = min(ROW_BLOCK if block is None else block, sp.tk)
    nblocks = -(-sp.tk // bk)
    jb = new_range(nblocks, 0)
    ragged = sp.tk % bk != 0
    vf = dtypes.f32.vec(w)
    lanes_at: dict = {}

    def vectorizer() -> Any:
        return _row_vectorizer(lane, lanes_at, simp)

    # staging: each row-side subexpression of an inner product, for every head-dimension index, into local memory
    x = simp(substitute(sp.x, {ri: rows_c}))
    staged: dict[UOp, UOp] = {}
    stage_stores: list[UOp] = []
    stage_sizes = {r.src[0].arg for red in x.toposort() if red.op is Ops.REDUCE for r in red.src[1:]}
    if len(stage_sizes) > 1:  # inner products of different lengths: one staging loop would not cover them
        return None
    rs = new_range(stage_sizes.pop() if stage_sizes else 1, 2)
    for red in (u for u in x.toposort() if u.op is Ops.REDUCE):
        r = red.src[1]
        for u in _row_side(red.src[0], lane, r, sp.rj):
            if u in staged:
                continue
            n = r.src[0].arg
            local = UOp(Ops.DEFINE_LOCAL, u.dtype.as_ptr(), (), (f"q{len(staged)}", n * w))
            vz = vectorizer()
            st = UOp(Ops.STORE, None, (local, simp(rs * UOp.const(INDEX, w) + lane), simp(substitute(u, {r: rs}))))
            vz.analyze(st)
            stage_stores.extend(vz.store(st))
            staged[u] = UOp(Ops.LOAD, u.dtype, (local, simp(r * UOp.const(INDEX, w) + lane)))
    if staged:
        x = substitute(x, staged)
    scores, keys = [], []
    for jj in range(bk):
        j = simp(jb * UOp.const(INDEX, bk) + UOp.const(INDEX, jj)) if nblocks > 1 else UOp.const(INDEX, jj)
        jc = simp((j < UOp.const(INDEX, sp.tk)).where(j, UOp.const(INDEX, sp.tk - 1))) if ragged else j
        xs = simp(substitute(x, {sp.rj: jc}))
        vz = vectorizer()
        vz.analyze(xs)
        sv = vz.broadcast(_f32(xs))
        if ragged:
            sv = UOp(Ops.WHERE, vf, (splat(simp(j < UOp.const(INDEX, sp.tk)), w), sv, splat(_c(-math.inf), w)))
        scores.append(sv)
        keys.append(jc)
    bm = scores[0]
    for sv in scores[1:]:
        bm = UOp(Ops.MAX, vf, (bm, sv))
    m_old, m_new = _ph("m_old", w), _ph("m_new", w)
    m_safe = UOp(Ops.WHERE, vf, (UOp(Ops.CMPNE, dtypes.bool.vec(w), (m_new, splat(_c(-math.inf), w))), m_new,
                                 splat(_c(0.0), w)))
    z = _ph("z")
    pz = _exp(z)
    if decompose:
        pz = decompose_transcendentals(UOp(Ops.SINK, None, (pz,))).src[0]
    alpha = widen(pz, z, m_old - m_safe, w)
    ps = [widen(pz, z, sv - m_safe, w) for sv in scores]
    lsum = ps[0]
    for p in ps[1:]:
        lsum = lsum + p
    # the output row's accumulators: Dv x w lanes in local memory, column c at [c * w, c * w + w)
    acc = UOp(Ops.DEFINE_LOCAL, dtypes.f32.as_ptr(), (), ("o", sp.dv * w))
    rz, rc, rf = new_range(sp.dv, 3), new_range(sp.dv, 4), new_range(sp.dv, 5)
    zero = UOp(Ops.STORE, None, (acc, simp(rz * UOp.const(INDEX, w)), splat(_c(0.0), w)))
    at_c = simp(rc * UOp.const(INDEX, w))
    o = UOp(Ops.LOAD, vf, (acc, at_c)) * alpha
    vc = simp(substitute(sp.v, {sp.rdv: rc, ri: rows_c}))
    for p, jc in zip(ps, keys):
        vk = simp(substitute(vc, {sp.rj: jc}))
        vz = vectorizer()
        vz.analyze(vk)
        o = o + p * vz.broadcast(_f32(vk))
    update = UOp(Ops.STORE, None, (acc, at_c, o))
    value = UOp(Ops.FDIV, vf, (UOp(Ops.LOAD, vf, (acc, simp(rf * UOp.const(INDEX, w)))), _ph("l", w)))
    # a lane past the last row computed the last row (its index is clamped): it stores that same value
    finals = []
    for t in range(min(w, tq)):
        row = simp(substitute(rows_c, {lane: UOp.const(INDEX, t)}))
        idx = simp(substitute(sp.out_index, {sp.rdv: rf, ri: row}))
        finals.append(UOp(Ops.STORE, None, (sp.out, idx, UOp(Ops.GEP, dtypes.f32, (value,), t))))
    ast = UOp(Ops.SINK, None, (bm, alpha, lsum, update, *finals, *stage_stores, zero))
    return RowsKernel(ast, jb.arg, rs.arg, rz.arg, rc.arg, rf.arg, len(finals), len(stage_stores), 1)


def _rows_local_bytes(sp: Any, w: int) -> int:
    """The local memory `build_rows` declares at most: the staged query side (at most one array per inner product
    term, head dimension x w) and the output accumulators (Dv x w), 4 bytes each."""
    d = sum(r.src[0].arg for red in sp.x.toposort() if red.op is Ops.REDUCE for r in red.src[1:])
    return 4 * w * (d + sp.dv)


# The fused kernel's opts (`AttentionKernel`). In the rows form a block's scores are held in registers, rows x keys
# values: at most ROW_BLOCK_VALUES (16 vectors of 16 lanes, the default's), as `opt.MAX_UNROLLED` bounds an
# ordinary kernel's unrolled values; 32 rows or 32 keys of 16 rows spilled registers when measured (old grid).
ROW_CHOICES = (8, 16)  # query rows per vector the rows form (`build_rows`) takes
MAX_BLOCK = 64  # keys per block (the per-row form's bound; the rows form's is ROW_BLOCK_VALUES)
ROW_BLOCK_VALUES = 256
# A key block's size is bounded by the terms the kernel then writes out (`_terms`), as an ordinary kernel's unrolled
# values are by `opt.MAX_UNROLLED`: the rows form (`build_rows`) writes out only the keys of a block (its head
# dimension and output columns are loops); the per-row form (`build`: GPUs, PYTHON, half inputs) writes out each
# key's term of every output column, so a wide head's large blocks there take many seconds each to compile.
MAX_SEARCH_TERMS = 4096


class AttentionKernel:
    """The fused attention kernel's search state, as `tgc.codegen.opt.OptKernel` is an ordinary kernel's: BEAM's one
    driver (`tgc.codegen.search`) enumerates, applies, copies and lowers it the same way. Its axes are the spec's
    output loops (the query row last, where `row_loop`), then the key axis (a reduction); its opts are ordinary
    `Opt`s on them:

    - `UPCAST(row axis, n)`: n query rows per vector (the rows form, `build_rows`; the product of the UPCASTs must
      be 8 or 16, and rows x keys per block at most `ROW_BLOCK_VALUES`); without it, the per-row form (`build`:
      one row at a time, inner products 16 lanes of the head dimension where the device has vectors);
    - `UNROLL(key axis, n)`: n keys per block (the product of the UNROLLs, 2..`MAX_BLOCK`, cut to the key count;
      without one, `BLOCK`), within `MAX_SEARCH_TERMS` written-out terms;
    - `THREAD(0, n)`: n CPU threads over the first output loop (without one, the automatic count, as
      `opt.apply_opts` adds to an ordinary kernel).

    A partial last row tile or key block is masked by the lowering itself, so these axes take any amount
    (`ragged_axes`). The unoptimized kernel (no opts) is the per-row form: BEAM's reference output."""

    def __init__(self, item: Any, device: Any):
        self.item, self.device = item, device
        self.spec = item.meta["attention"]
        self.base = item.ast  # what the BEAM store keys the kernel by (its plain AST)
        self.applied: list[Opt] = []
        self.rows, self.block, self.threads = 0, 0, 0  # 0: not chosen (per-row form, BLOCK keys, automatic threads)
        self.threads_chosen = False

    # --- the kernel's shape, as OptKernel's
    def loops(self) -> list[UOp]:
        return list(self.spec.loops)

    def reduces(self) -> list[UOp]:
        return [self.spec.rj]

    def axes(self) -> list[UOp]:
        return self.loops() + self.reduces()

    def ranges(self) -> list[UOp]:
        return self.axes()

    @property
    def row_axis(self) -> int | None:
        return len(self.spec.loops) - 1 if self.spec.row_loop and self.spec.loops else None

    @property
    def key_axis(self) -> int:
        return len(self.spec.loops)

    @property
    def ragged_axes(self) -> frozenset[int]:
        """Axes an opt may split by an amount that does not divide them (the lowering masks the rest)."""
        return frozenset(a for a in (self.row_axis, self.key_axis) if a is not None)

    def copy(self) -> AttentionKernel:
        k = AttentionKernel(self.item, self.device)
        k.applied, k.rows, k.block, k.threads = list(self.applied), self.rows, self.block, self.threads
        k.threads_chosen = self.threads_chosen
        return k

    # --- applying opts
    def apply(self, opt: Opt) -> None:
        """Apply one opt; OptError (and the kernel unchanged) where it does not apply to this kernel."""
        sp, amt = self.spec, opt.amount
        if opt.op is OptOps.UPCAST and opt.axis == self.row_axis:
            if not self.device.caps.vectors or not _rows_apply(sp):
                raise OptError("query rows as vector lanes need a device with vectors and f32 values")
            rows = max(self.rows, 1) * amt
            if amt < 2 or rows not in ROW_CHOICES:
                raise OptError(f"{rows} query rows per vector: the rows form takes {ROW_CHOICES}")
            if rows * min(self.block or ROW_BLOCK, sp.tk) > ROW_BLOCK_VALUES:
                raise OptError(f"{rows} rows x {self.block} keys: over {ROW_BLOCK_VALUES} scores in registers")
            self.rows = rows
        elif opt.op is OptOps.UNROLL and opt.axis == self.key_axis:
            block = max(self.block, 1) * amt
            if amt < 2 or block > MAX_BLOCK:
                raise OptError(f"{block} keys per block: a block holds 2..{MAX_BLOCK}")
            if self.rows * min(block, sp.tk) > ROW_BLOCK_VALUES:
                raise OptError(f"{self.rows} rows x {block} keys: over {ROW_BLOCK_VALUES} scores in registers")
            if _terms(sp, {"rows": self.rows, "block": min(block, sp.tk)}) > MAX_SEARCH_TERMS:
                raise OptError(f"a block of {block} keys writes out more than {MAX_SEARCH_TERMS} terms")
            self.block = block
        elif opt.op is OptOps.THREAD and opt.axis == 0:
            if self.device.caps.gpu or not sp.loops:
                raise OptError("THREAD splits a CPU kernel's first output loop")
            if self.threads_chosen:
                raise OptError("THREAD was already applied")
            if not 1 <= amt <= self.device.cores:
                raise OptError(f"THREAD({amt}): the device has {self.device.cores} cores")
            self.threads, self.threads_chosen = amt, True
        else:
            raise OptError(f"{opt} does not apply to a fused attention kernel")
        self.applied.append(opt)

    def heuristic(self) -> None:
        """The hand-coded choice: `ROW_LANES` (16) query rows per vector where the rows form applies, as
        UPCAST(row, 8) then UPCAST(row, 2), so that BEAM's starts (the heuristic's prefixes) hold 8 rows as well
        (keys in blocks of `BLOCK` and the threads are the defaults); nothing under NOOPT."""
        if env_flag("NOOPT") or self.row_axis is None:
            return
        first = ROW_CHOICES[0]
        trial = self.copy()
        try:
            trial.apply(Opt(OptOps.UPCAST, self.row_axis, first))
            trial.apply(Opt(OptOps.UPCAST, self.row_axis, ROW_LANES // first))
        except OptError:
            return
        self.applied, self.rows = trial.applied, trial.rows

    def choices(self) -> dict[str, int]:
        """What the opts choose, the defaults filled in: {"rows": query rows per vector (0: the per-row form),
        "block": keys per block, "threads": CPU threads (0 on GPUs, under NOOPT or without loops)}."""
        sp = self.spec
        rows = self.rows
        block = min(self.block or (ROW_BLOCK if rows else BLOCK), sp.tk)
        threads = self.threads
        if not self.threads_chosen:
            threads = 0
            if not self.device.caps.gpu and sp.loops and not env_flag("NOOPT"):
                n = 1
                for r in sp.loops[:-1]:
                    n *= r.src[0].arg
                n *= -(-sp.loops[-1].src[0].arg // rows) if rows else sp.loops[-1].src[0].arg
                work = n * sp.tk * max(sp.dv, 1) * 4 * max(rows, 1)
                threads = min(self.device.cores, n, max(1, work // MIN_WORK_PER_THREAD))
        return {"rows": rows, "block": block, "threads": threads}


def _terms(sp: Any, ch: dict[str, int]) -> int:
    """How many terms the kernel writes out, roughly (what its compile time grows with): in the rows form each
    key of a block, in its inner products' loop and in the output columns' loop; in the per-row form each key
    of a block once per head-dimension element and value column."""
    if ch["rows"]:
        return 2 * ch["block"]
    d = sum(r.src[0].arg for red in sp.x.toposort() if red.op is Ops.REDUCE for r in red.src[1:]
            if r.src[0].op is Ops.CONST)
    return (1 + ch["block"]) * (d + sp.dv)


def _rows_apply(sp: Any) -> bool:
    if not sp.row_loop or not sp.loops or sp.loops[-1].arg[1] is not RangeKind.LOOP or sp.dtype != dtypes.f32:
        return False
    if any(u.dtype is not None and u.dtype.scalar() in HALF for e in (sp.x, sp.v) for u in e.toposort()):
        return False
    for red in (u for u in sp.x.toposort() if u.op is Ops.REDUCE):
        rs = red.src[1:]
        if red.arg is not Ops.ADD or len(rs) != 1 or rs[0].src[0].op is not Ops.CONST:
            return False
    return True


def attention_kernel(item: Any, device: Any, opts: list[Opt] | None = None) -> AttentionKernel:
    """The fused kernel of `item` with `opts` applied (BEAM's, a stored winner's; OptError for one that does not
    apply), or with the heuristic's choice (None)."""
    k = AttentionKernel(item, device)
    if opts is None:
        k.heuristic()
    else:
        for o in opts:
            k.apply(o)
    return k


def lower_attention(item: Any, device: Any, name: str, opts: list[Opt] | None = None,
                    trace: list[tuple[str, str]] | None = None) -> Any:
    """The fused attention kernel of `item` lowered for `device` (a `tgc.codegen.pipeline.LoweredKernel`), with the
    opts `opts` (`AttentionKernel`: [] is the unoptimized per-row form) or the heuristic's (None). `trace`, when a
    list, gets (step, text) as `pipeline.lower` gives it: every pass where the kernel goes through them (the
    per-row form without vectors: PYTHON, NOOPT, the GPU dialects), else (the CPU's forms) one `lower_attention`
    step and its linear UOps."""

    sp = item.meta["attention"]
    k = attention_kernel(item, device, opts)
    ch = k.choices()
    vectors = device.caps.vectors and not env_flag("NOOPT")
    if ch["rows"] and ROWS_THROUGH_PASSES and vectors and not device.caps.gpu and _rows_apply(sp) and \
            _rows_local_bytes(sp, ch["rows"]) <= launch_limits(device).shared_bytes:
        # the rows form through the pipeline's passes (`vectorize` makes the rows the lanes: per-lane m and l)
        ast = online_softmax_ast(sp, ch["block"], rows=ch["rows"])
        # the threads this kernel chose (BEAM's THREAD, one included) or counted: `apply_opts` splits the first loop
        threads = [Opt(OptOps.THREAD, 0, ch["threads"])] if ch["threads"] >= 1 else []
        low = lower(ast, device, list(item.bufs), name, opts=threads, trace=trace)
        low.applied = list(k.applied)
        return low
    presplit = 0  # threads given their chunk of the first loop in the spec (before the kernel is written out)
    if ch["rows"] and not device.caps.gpu and ch["threads"] > 1:
        split = _split_spec(sp, ch["threads"])
        if split is not None:
            sp, presplit = split
    by_rows = build_rows(sp, device.caps.decompose_transcendentals, w=ch["rows"], block=ch["block"]) \
        if ch["rows"] else None
    if by_rows is not None and shared_memory_bytes(by_rows.ast.toposort()) > launch_limits(device).shared_bytes:
        by_rows = None  # its local arrays (a long head dimension) do not fit: the per-row form
    if by_rows is None:
        sp = item.meta["attention"]  # (not split ahead for the rows form's threads: `apply_opts` splits it)
        # the per-row form: an ordinary kernel of REDUCE(ONLINE_SOFTMAX) that the pipeline's passes lower; on a GPU
        # each block of k and v staged into shared memory by work-groups of up to SHARED_ROWS rows, within the
        # device's limit; with vectors (the CPU) the output columns split so that `vectorize` takes VECTOR_WIDTH of
        # them as lanes, and the block's keys and inner products as vectors
        group = min(SHARED_ROWS, launch_limits(device).threads) if device.caps.gpu and not env_flag("NOOPT") else 0
        block, group = _staging_plan(sp, device, ch["block"], group)
        ast = online_softmax_ast(sp, block, group) if group else None
        if ast is None or shared_memory_bytes(ast.toposort()) > launch_limits(device).shared_bytes:
            # nothing staged (or a staging the plan's count missed)
            ast = online_softmax_ast(sp, ch["block"], width=VECTOR_WIDTH if vectors and not device.caps.gpu else 1)
        chosen = k.threads_chosen or (vectors and not device.caps.gpu)
        threads = [Opt(OptOps.THREAD, 0, ch["threads"])] if chosen and ch["threads"] > 1 else []
        low = lower(ast, device, list(item.bufs), name, opts=threads, trace=trace)
        low.applied = list(k.applied)
        return low
    ast = by_rows.ast  # the rows form (the CPU with vectors)
    ast = legalize(ast)
    if device.caps.decompose_transcendentals:
        ast = decompose_transcendentals(ast)
    launch: dict = {}
    if presplit > 1:
        launch["global_size"] = (presplit, 1, 1)
    elif ch["threads"] > 1:
        ast, threads = split_threads(ast, ch["threads"])
        if threads > 1:
            launch["global_size"] = (threads, 1, 1)
    bufs = list(item.bufs)
    ast, bufs = drop_unused_buffers(ast, bufs)
    ast = narrow_index(ast)
    uops = _linearize_rows(ast, by_rows)
    if debug_level() >= 6:  # the pipeline's passes do not run here: show what this lowering made
        import sys
        print(f"--- {name}: fused attention (tgc/codegen/attention.py), linear UOps\n{uops_text(uops)}",
              file=sys.stderr)
    if trace is not None:
        trace.extend([("lower_attention", pretty(ast)), ("linearize", uops_text(uops))])
    low = finish(device, name, ast, uops, bufs, launch)
    low.applied = list(k.applied)
    return low


def online_softmax_ast(sp: Any, block: int, group: int = 0, width: int = 1, rows: int = 0) -> UOp | None:
    """The per-row form as an ordinary kernel AST that the pipeline's passes lower (`pipeline.lower`): one STORE per
    output element of REDUCE(ONLINE_SOFTMAX) over the keys, in blocks of `block` keys (a REDUCE range of blocks, an
    UNROLL range of keys in a block: `unroll_reduce` makes the block one iteration), the output columns an UPCAST
    range (`upcast_stores` copies them; their REDUCEs share the scores, so the linearizer gives them one m and l).
    Keys past the end of the last block read the last key (clamped index) with score -inf (weight 0).
    `group` > 0 (GPUs): work-groups of `group` query rows (a LOCAL range) stage each block's k and v into shared
    memory (`_stage_shared`: the staging STOREs are the sources of a BARRIER that the staged LOADs read after, so
    the linearizer writes them inside the key-block loop before the scores; it ends the loop with a second
    BARRIER); None where nothing is staged.
    `rows` > 0 (the rows form, devices with vectors): the query row becomes a tile loop and an UPCAST range of `rows`
    rows (a partial last tile's rows clamped to the last row: they compute and store its values again), which the
    scores vary by, so `vectorize` makes it the lanes of the scores, the values and the REDUCE (per-lane m and l)."""
    ids = [u.arg[0] for e in (sp.x, sp.v, *sp.loops, sp.rj, sp.rdv) for u in e.toposort() if u.op is Ops.RANGE]
    next_id = max(ids, default=0) + 1
    bk = min(block, sp.tk)
    nblocks = -(-sp.tk // bk)
    jb = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, nblocks),), (next_id, RangeKind.REDUCE)) if nblocks > 1 else None
    jj = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, bk),), (next_id + 1, RangeKind.UNROLL)) if bk > 1 else None
    parts = [r for r in (jb, jj) if r is not None]
    j = UOp.const(INDEX, 0)
    if jb is not None:
        j = jb * UOp.const(INDEX, bk)
    if jj is not None:
        j = j + jj
    j = simplify(j)
    x, v, out_index, gate = sp.x, sp.v, sp.out_index, ()
    key = {sp.rj: simplify((j < UOp.const(INDEX, sp.tk)).where(j, UOp.const(INDEX, sp.tk - 1))) if sp.tk % bk else j}
    if group:
        staged = _stage_shared(sp, UOp.const(INDEX, 0) if jb is None else jb, bk, group, next_id + 3)
        if staged is None:
            return None
        x, v, ri, group_rows, live, rjl, _ = staged
        key[rjl] = UOp.const(INDEX, 0) if jj is None else jj
        out_index = substitute(out_index, {ri: group_rows})
        gate = () if live is None else (live,)
    if rows:
        ri = sp.loops[-1]
        tq = ri.src[0].arg
        tile = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, -(-tq // rows)),), ri.arg)
        lane = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, rows),), (next_id + 11, RangeKind.UPCAST))
        row = simplify(tile * UOp.const(INDEX, rows) + lane)
        if tq % rows:
            row = simplify((row < UOp.const(INDEX, tq)).where(row, UOp.const(INDEX, tq - 1)))
        x, v, out_index = (substitute(e, {ri: row}) for e in (x, v, out_index))
    score = _f32(simplify(substitute(x, key)))
    if sp.tk % bk:
        score = UOp(Ops.WHERE, dtypes.f32, (simplify(j < UOp.const(INDEX, sp.tk)), score, _c(-math.inf)))
    # the rows form's columns: a loop (the linearizer interchanges it into the key loop, o in local memory)
    col = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, sp.dv),), (next_id + 2, RangeKind.LOOP if rows else RangeKind.UPCAST))
    if width > 1 and sp.dv % width == 0 and sp.dv > width:  # the columns' lanes one UPCAST of a vector width
        lanes = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, width),), (next_id + 10, RangeKind.UPCAST))
        col = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, sp.dv // width),), (next_id + 2, RangeKind.UPCAST)) * \
            UOp.const(INDEX, width) + lanes
    value = _f32(simplify(substitute(v, {**key, sp.rdv: col})))
    pairs = UOp(Ops.VECTORIZE, dtypes.f32.vec(2), (score, value))
    out = UOp(Ops.REDUCE, dtypes.f32, (pairs, *parts), Ops.ONLINE_SOFTMAX)
    if sp.dtype != dtypes.f32:
        out = UOp(Ops.CAST, sp.dtype, (out,))
    index = simplify(substitute(out_index, {sp.rdv: col}))
    return UOp(Ops.SINK, None, (UOp(Ops.STORE, None, (sp.out, index, out, *gate)),))


def _staging_plan(sp: Any, device: Any, block: int, group: int) -> tuple[int, int]:
    """(keys per block, rows per work-group staging k and v: 0 for none) within the device's shared memory
    (`launch_limits`: declared and queried). The staged arrays grow with the block (block x (head dim + value dim)
    elements): where they do not fit, the largest block that fits (shared memory is linear in it), and where not
    even one key fits, no staging (every thread reads k and v from global memory)."""
    limit = launch_limits(device).shared_bytes
    if not (group and sp.row_loop and sp.loops and sp.loops[-1].op is Ops.RANGE
            and sp.loops[-1].arg[1] is RangeKind.LOOP):
        return block, 0  # (one query row: nothing is shared across the rows of a work-group)
    group = min(group, sp.loops[-1].src[0].arg)
    per_key = _shared_bytes_per_key(sp)
    if per_key > limit:
        group = 0
    elif per_key * min(block, sp.tk) > limit:
        block = limit // per_key
    return block, group


def _split_spec(sp: Any, threads: int) -> tuple[Any, int] | None:
    """`sp` with its first loop (a batch loop, not the query row) split across `threads` threads as
    `tgc.codegen.opt.split_threads` splits it (each thread a contiguous chunk, its end depending on `core_id`),
    done on the spec's small expressions instead of the written-out kernel; None where it does not apply."""
    if len(sp.loops) < 2 or sp.loops[0].src[0].op is not Ops.CONST or \
            sp.loops[0].arg[0] != min(r.arg[0] for r in sp.loops):
        return None
    r, n = sp.loops[0], sp.loops[0].src[0].arg
    threads = min(threads, n)
    if threads <= 1:
        return None
    chunk = -(-n // threads)
    threads = -(-n // chunk)
    core = UOp(Ops.DEFINE_VAR, INDEX, (), ("core_id", 0, threads - 1))
    start = core * UOp.const(INDEX, chunk)
    left = UOp.const(INDEX, n) - start
    end = simplify((left < UOp.const(INDEX, chunk)).where(left, UOp.const(INDEX, chunk)))
    inner = UOp(Ops.RANGE, INDEX, (end,), (r.arg[0], RangeKind.LOOP))
    sub = {r: simplify(start + inner)}
    return dataclasses.replace(sp, loops=(inner, *sp.loops[1:]), x=substitute(sp.x, sub), v=substitute(sp.v, sub),
                               out_index=substitute(sp.out_index, sub)), threads


def _linearize_rows(ast: UOp, k: RowsKernel) -> list[UOp]:
    """The linear UOps of `build_rows`'s kernel (`ast` its SINK after the lowering's passes, `k` its layout): the
    outer loops, the staging loop, the zeroing loop, the m and l accumulators, the key-block loop (the scores'
    inner products, one loop shared by the block's keys; the online update; the loop adding the block to the
    output accumulators), then the loop storing the output."""
    nodes = ast.toposort()
    bm, alpha, lsum, update = ast.src[:4]
    finals = ast.src[4:4 + k.nfinal]
    stages = ast.src[4 + k.nfinal:4 + k.nfinal + k.nstage]
    zeros = ast.src[4 + k.nfinal + k.nstage:]
    ranges = {u.arg: u for u in nodes if u.op is Ops.RANGE}
    lin = start_linearizer(nodes)
    for r in sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[1] is RangeKind.LOOP), key=lambda r: r.arg[0]):
        lin.open_range(r)

    def loop(arg: Any, stores: tuple[UOp, ...]) -> None:
        if arg in ranges:
            lin.open_range(ranges[arg])
        for st in stores:
            lin.emit(st)
        if arg in ranges:
            lin.close_range()

    def acc(init: float, d) -> UOp:
        a = lin.push(UOp(Ops.DEFINE_ACC, d, (lin.emit(UOp.const(d, init)),), lin.acc_count))
        lin.acc_count += 1
        return a

    def bind(name: str, a: UOp) -> None:
        read = lin.push(UOp(Ops.READ_ACC, a.dtype, (a,), name))  # (the tag keeps each read its own node)
        lin.scopes[-1][UOp(Ops.READ_ACC, a.dtype, (), ("attn", name))] = read

    loop(k.stage, stages)
    loop(k.zero, zeros)
    m, lacc = acc(-math.inf, bm.dtype), acc(0.0, lsum.dtype)
    if k.jb in ranges:
        lin.open_range(ranges[k.jb])
    bm_l = lin.emit(bm)
    bind("m_old", m)
    lin.push(UOp(Ops.ACCUMULATE, m.dtype, (m, bm_l), Ops.MAX))
    bind("m_new", m)
    alpha_l, lsum_l = lin.emit(alpha), lin.emit(lsum)
    lin.push(UOp(Ops.ACCUMULATE, lacc.dtype, (lacc, alpha_l), Ops.MUL))
    lin.push(UOp(Ops.ACCUMULATE, lacc.dtype, (lacc, lsum_l), Ops.ADD))
    loop(k.update, (update,))
    if k.jb in ranges:
        lin.close_range()
    bind("l", lacc)
    loop(k.final, finals)
    while lin.open_ranges:
        lin.close_range()
    return lin.out


__all__ = ["BLOCK", "MAX_BLOCK", "ROW_BLOCK_VALUES", "ROW_CHOICES", "ROW_LANES", "AttentionKernel", "attention_kernel",
           "build_rows", "lower_attention", "online_softmax_ast"]
