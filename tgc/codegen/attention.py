"""Attention fusion, codegen side: one kernel computing `softmax(X) @ v` as an online softmax.

The scheduler (`tgc.engine.attention`) hands a kernel whose AST is a REDUCE(ONLINE_SOFTMAX) over the keys of
(score X at (query row, key j), its inner products as REDUCEs over the head dimension; v at (j, column)), stored
at the output index; `spec_of` reads these pieces back from the AST. The kernel, for every device:

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

The CPU's rows form (`online_softmax_ast(rows=)`) goes through the same passes: 16 query rows are an UPCAST range
the scores vary by, which `vectorize` makes the lanes of every value (per-lane m and l; the row side of the inner
products staged once per tile into a local array, head dimension x 16, read back as one vector per element), each
key's score a 16-lane REDUCE over the head dimension (a block's keys share that loop); the output columns are a
loop that the linearizer interchanges into the key loop, with the output row's accumulators a local array (Dv x
16) that a loop over the columns rescales and adds the block's p * v to; the block's exps are one vector
polynomial per key. Its size does not grow with the head dimension.

The scores live in registers for one block and are never stored; the accumulators are updated with ACCUMULATE
MUL then ADD (no new linear op: every renderer and the PYTHON device run it; the PYTHON device steps a loop that
reads an accumulator it updates one index at a time). Keys past the end of the last block read the last key
(clamped index) and get weight 0, so no load leaves its buffer. Where the batch axes, query rows or keys are dims
(a symbolic plan's kernel; the head dims are constants), the last row tile and key block are always masked and
nothing is staged in shared memory.
"""

from __future__ import annotations

import math
from typing import Any

from tgc.codegen.legalize import HALF
from tgc.codegen.opt import (
    MIN_WORK_PER_THREAD,
    Opt,
    OptError,
    OptOps,
    gate_memory,
    launch_limits,
)
from tgc.codegen.pipeline import lower, shared_memory_bytes
from tgc.dtype import dtypes
from tgc.engine.attention import online_softmax_of, spec_of
from tgc.env import env_flag
from tgc.ir.kernel import INDEX
from tgc.ir.symbolic import simplify
from tgc.ir.uop import Ops, RangeKind, UOp, substitute

VECTOR_WIDTH = 16  # the CPU's per-row form: output columns and inner-product lanes per vector
BLOCK = 16  # keys per block: scores held in registers at once
SHARED_ROWS = 64  # GPU: query rows per work-group sharing each block's keys and values in shared memory


def _f32(u: UOp) -> UOp:
    return u if u.dtype == dtypes.f32 else UOp(Ops.CAST, dtypes.f32, (u,))


def _c(v: float) -> UOp:
    return UOp.const(dtypes.f32, v)


def _keys(sp: Any, block: int) -> int:
    """Keys per block: `block`, cut to the key count where that is a constant (a dim: the last block masked)."""
    return block if sp.tk is None else min(block, sp.tk)


def _blocks(n: UOp, size: int) -> UOp:
    """ceil(n / size) for a size `n` (a constant or an expression of dims)."""
    if n.op is Ops.CONST:
        return UOp.const(INDEX, -(-n.arg // size))
    return simplify((n + UOp.const(INDEX, size - 1)) // UOp.const(INDEX, size))


def _ragged(n: UOp, size: int) -> bool:
    """Tiles of `size` leave a partial last one (always assumed where `n` is a dim)."""
    return n.op is not Ops.CONST or n.arg % size != 0


def _clamp(i: UOp, n: UOp) -> UOp:
    """min(i, n - 1): an index past the end reads the last element."""
    return simplify((i < n).where(i, simplify(n - UOp.const(INDEX, 1))))


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


ROW_LANES = 16  # query rows per vector on devices with vectors (the rows form)
ROW_BLOCK = 16  # keys per block there


def _rows_local_bytes(sp: Any, w: int) -> int:
    """The local memory the rows form declares at most: the staged query side (at most one array per inner product
    term, head dimension x w) and the output accumulators (Dv x w), 4 bytes each."""
    d = sum(r.src[0].arg for red in sp.x.toposort() if red.op is Ops.REDUCE for r in red.src[1:])
    return 4 * w * (d + sp.dv)


# The fused kernel's opts (`AttentionKernel`). In the rows form a block's scores are held in registers, rows x keys
# values: at most ROW_BLOCK_VALUES (16 vectors of 16 lanes, the default's), as `opt.MAX_UNROLLED` bounds an
# ordinary kernel's unrolled values; 32 rows or 32 keys of 16 rows spilled registers when measured (old grid).
ROW_CHOICES = (8, 16)  # query rows per vector the rows form takes
MAX_BLOCK = 64  # keys per block (the per-row form's bound; the rows form's is ROW_BLOCK_VALUES)
ROW_BLOCK_VALUES = 256
# A key block's size is bounded by the terms the kernel then writes out (`_terms`), as an ordinary kernel's unrolled
# values are by `opt.MAX_UNROLLED`: the rows form writes out only the keys of a block (its head
# dimension and output columns are loops); the per-row form (GPUs, PYTHON, half inputs) writes out each
# key's term of every output column, so a wide head's large blocks there take many seconds each to compile.
MAX_SEARCH_TERMS = 4096


class AttentionKernel:
    """The fused attention kernel's search state, as `tgc.codegen.opt.OptKernel` is an ordinary kernel's: BEAM's one
    driver (`tgc.codegen.search`) enumerates, applies, copies and lowers it the same way. Its axes are the spec's
    output loops (the query row last, where `row_loop`), then the key axis (a reduction); its opts are ordinary
    `Opt`s on them:

    - `UPCAST(row axis, n)`: n query rows per vector (the rows form; the product of the UPCASTs must
      be 8 or 16, and rows x keys per block at most `ROW_BLOCK_VALUES`); without it, the per-row form
      (`online_softmax_ast` without rows: one row at a time, inner products 16 lanes of the head dimension where
      the device has vectors);
    - `UNROLL(key axis, n)`: n keys per block (the product of the UNROLLs, 2..`MAX_BLOCK`, cut to the key count;
      without one, `BLOCK`), within `MAX_SEARCH_TERMS` written-out terms;
    - `THREAD(0, n)`: n CPU threads over the first output loop (without one, the automatic count, as
      `opt.apply_opts` adds to an ordinary kernel).

    A partial last row tile or key block is masked by the lowering itself, so these axes take any amount
    (`ragged_axes`). The unoptimized kernel (no opts) is the per-row form: BEAM's reference output."""

    def __init__(self, item: Any, device: Any):
        self.item, self.device = item, device
        self.spec = spec_of(item.ast)
        if self.spec is None:
            raise ValueError(f"{item.name}: not a fused attention kernel (no REDUCE(ONLINE_SOFTMAX) of keys)")
        self.base = item.ast  # what the BEAM store keys the kernel by (its AST)
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
            if rows * _keys(sp, self.block or ROW_BLOCK) > ROW_BLOCK_VALUES:
                raise OptError(f"{rows} rows x {self.block} keys: over {ROW_BLOCK_VALUES} scores in registers")
            self.rows = rows
        elif opt.op is OptOps.UNROLL and opt.axis == self.key_axis:
            block = max(self.block, 1) * amt
            if amt < 2 or block > MAX_BLOCK:
                raise OptError(f"{block} keys per block: a block holds 2..{MAX_BLOCK}")
            if self.rows * _keys(sp, block) > ROW_BLOCK_VALUES:
                raise OptError(f"{self.rows} rows x {block} keys: over {ROW_BLOCK_VALUES} scores in registers")
            if _terms(sp, {"rows": self.rows, "block": _keys(sp, block)}) > MAX_SEARCH_TERMS:
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
        block = _keys(sp, self.block or (ROW_BLOCK if rows else BLOCK))
        threads = self.threads
        if not self.threads_chosen:
            threads = 0
            fixed = sp.tk is not None and all(r.src[0].op is Ops.CONST for r in sp.loops)
            # (sizes that are dims: threads only as an opt chooses them, a symbolic plan's fast variant)
            if not self.device.caps.gpu and sp.loops and not env_flag("NOOPT") and fixed:
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
                    trace: list[tuple[str, str]] | None = None, vals: tuple[int, ...] = ()) -> Any:
    """The fused attention kernel of `item` lowered for `device` (a `tgc.codegen.pipeline.LoweredKernel`), with the
    opts `opts` (`AttentionKernel`: [] is the unoptimized per-row form) or the heuristic's (None): an ordinary AST of
    REDUCE(ONLINE_SOFTMAX) (`online_softmax_ast`) that `pipeline.lower` takes, in every form. `trace`, when a list,
    gets (pass name, text) for every pass, as `pipeline.lower` gives it. `vals`: the dim variables' values where
    the rows, keys or batch axes are dims (a symbolic plan's kernel: `pipeline.lower`'s)."""

    k = attention_kernel(item, device, opts)
    sp = k.spec
    ch = k.choices()
    vectors = device.caps.vectors and not env_flag("NOOPT")
    if ch["rows"] and vectors and not device.caps.gpu and _rows_apply(sp) and \
            _rows_local_bytes(sp, ch["rows"]) <= launch_limits(device).shared_bytes:
        # the rows form: `vectorize` makes the query rows the lanes (per-lane m and l) and stages q's side of the
        # inner products per tile, the linearizer interchanges the output columns into the key loop (o in local
        # memory); a long head whose local arrays do not fit takes the per-row form below
        ast = online_softmax_ast(sp, ch["block"], rows=ch["rows"])
        # the threads this kernel chose (BEAM's THREAD, one included) or counted: `apply_opts` splits the first loop
        threads = [Opt(OptOps.THREAD, 0, ch["threads"])] if ch["threads"] >= 1 else []
        low = lower(ast, device, list(item.bufs), name, opts=threads, trace=trace, vals=vals)
        low.applied = list(k.applied)
        return low
    # the per-row form; on a GPU each block of k and v staged into shared memory by work-groups of up to SHARED_ROWS
    # rows, within the device's limit; with vectors (the CPU) the output columns split so that `vectorize` takes
    # VECTOR_WIDTH of them as lanes, and the block's keys and inner products as vectors
    group = min(SHARED_ROWS, launch_limits(device).threads) if device.caps.gpu and not env_flag("NOOPT") else 0
    block, group = _staging_plan(sp, device, ch["block"], group)
    ast = online_softmax_ast(sp, block, group) if group else None
    if ast is None or shared_memory_bytes(ast.toposort()) > launch_limits(device).shared_bytes:
        # nothing staged (or a staging the plan's count missed)
        ast = online_softmax_ast(sp, ch["block"], width=VECTOR_WIDTH if vectors and not device.caps.gpu else 1)
    chosen = k.threads_chosen or (vectors and not device.caps.gpu)
    threads = [Opt(OptOps.THREAD, 0, ch["threads"])] if chosen and ch["threads"] > 1 else []
    low = lower(ast, device, list(item.bufs), name, opts=threads, trace=trace, vals=vals)
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
    bk, tk = _keys(sp, block), sp.rj.src[0]
    nblocks = _blocks(tk, bk)
    jb = UOp(Ops.RANGE, INDEX, (nblocks,), (next_id, RangeKind.REDUCE)) \
        if nblocks.op is not Ops.CONST or nblocks.arg > 1 else None
    jj = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, bk),), (next_id + 1, RangeKind.UNROLL)) if bk > 1 else None
    parts = [r for r in (jb, jj) if r is not None]
    j = UOp.const(INDEX, 0)
    if jb is not None:
        j = jb * UOp.const(INDEX, bk)
    if jj is not None:
        j = j + jj
    j = simplify(j)
    x, v, out_index, gate = sp.x, sp.v, sp.out_index, ()
    key = {sp.rj: _clamp(j, tk) if _ragged(tk, bk) else j}
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
        tq = ri.src[0]
        tile = UOp(Ops.RANGE, INDEX, (_blocks(tq, rows),), ri.arg)
        lane = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, rows),), (next_id + 11, RangeKind.UPCAST))
        row = simplify(tile * UOp.const(INDEX, rows) + lane)
        if _ragged(tq, rows):
            row = _clamp(row, tq)
        x, v, out_index = (substitute(e, {ri: row}) for e in (x, v, out_index))
    score = _f32(simplify(substitute(x, key)))
    if _ragged(tk, bk):
        score = UOp(Ops.WHERE, dtypes.f32, (simplify(j < tk), score, _c(-math.inf)))
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
    if sp.tk is None or sp.loops[-1].src[0].op is not Ops.CONST:
        return block, 0  # (the rows or keys a dim, a symbolic plan's kernel: every thread reads k and v itself)
    group = min(group, sp.loops[-1].src[0].arg)
    per_key = _shared_bytes_per_key(sp)
    if per_key > limit:
        group = 0
    elif per_key * min(block, sp.tk) > limit:
        block = limit // per_key
    return block, group


def is_fused_attention(ast: UOp) -> bool:
    """`ast` is a fused attention kernel's (`tgc.engine.attention.kernel_ast`: lowered by `lower_attention`)."""
    return online_softmax_of(ast) is not None and spec_of(ast) is not None


__all__ = ["BLOCK", "MAX_BLOCK", "ROW_BLOCK_VALUES", "ROW_CHOICES", "ROW_LANES", "AttentionKernel", "attention_kernel",
           "is_fused_attention", "lower_attention", "online_softmax_ast"]
