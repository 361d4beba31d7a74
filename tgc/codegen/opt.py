"""Kernel optimizations (OptOps) on the AST's loop ranges, the hand-coded heuristic, and launch mapping.

A kernel's loops are RANGE uops, so every optimization is a split or a relabelling of ranges:

- UPCAST(axis, n): an output loop is split and its inner n iterations are unrolled into registers;
- UNROLL(axis, n): the same for a reduction loop;
- LOCAL(axis, n): on GPUs, the inner n iterations of an output loop become a work-group dimension;
- GROUP(axis, n): on GPUs, a reduction split across n threads of a work-group (partial sums combined by warp
  shuffles or in shared memory, `lower_groups`); thread g takes steps g, g + n, ... (adjacent threads read
  adjacent elements);
- GROUPTOP(axis, n): the same, the threads taking the reduction's outer digit: thread g takes a contiguous
  n-th of it (steps g * size / n, ...), which a CPU-backed OpenCL (one core walking a work-group's threads in
  turn) may read faster;
- STAGE(axis, n): on GPUs, a reduction loop is split into tiles of n steps; the operands of each tile (the values
  the work-group's threads read in it) are copied to shared memory by all the threads together (coalesced,
  double-buffered, one barrier a tile), and the threads read them from there (`stage_tiles`);
- TC(0, 0): on GPUs with tensor cores (CUDA sm_80+), an f16/bf16 matmul's reduction as warp-wide `mma.sync`
  (m16n8k16, f32 accumulate): a warp per 16 x 8 tile of outputs, 16 steps of the reduction at a time
  (`tensor_core`); the first opt of a kernel, and no LOCAL, GROUP or STAGE after it (the warp is the work-group);
- PADTO(axis, n): a reduction loop rounded up to a multiple of n, the extra iterations masked out; an output
  loop (on the CPU) rounded up the same way, the loads and stores of the extra iterations gated off;
- SWAP(a, b): two output loops exchange their nesting order;
- THREAD(axis, n): on the CPU, the outer loop is split across n threads.

`axis` counts the kernel's "shape": its output loops first, then its reduction loops, in nesting order.
Every opt checks that it applies and raises `OptError` with the reason otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tgc.dtype import dtypes
from tgc.env import env_flag
from tgc.errors import CompileError
from tgc.ir.kernel import flat_index, identity
from tgc.ir.shapes import prod
from tgc.ir.symbolic import _terms, simplify
from tgc.ir.uop import Ops, PatternMatcher, RangeKind, UOp, UPat, graph_rewrite, rebuild, substitute

INDEX = dtypes.index
# below this many loop iterations a kernel is not worth a thread launch
MIN_WORK_PER_THREAD = 1 << 15
MAX_UNROLLED = 512  # limit on the product of UPCAST and UNROLL sizes (register pressure, code size)


class OptError(Exception):
    pass


@dataclass(frozen=True)
class LaunchLimits:
    """What one launch of a GPU kernel may use: threads per work-group, shared memory per work-group (bytes),
    and work-groups along the first grid dimension. Read from the device's `caps` (tgc/capabilities.py: the
    renderer's declaration, lowered where the device states `max_local_size` or `max_shared_bytes`)."""
    threads: int = 256
    shared_bytes: int = 32768
    grid: int = 2**31 - 1


def launch_limits(device: Any) -> LaunchLimits:
    caps = device.caps
    return LaunchLimits(caps.max_threads_per_block, caps.max_shared_bytes, caps.max_grid)


def shared_bytes(ast: UOp, stage_buffers: int = 2) -> int:
    """The shared memory `lower_groups` and `stage_tiles` will declare for this AST: per GROUP reduction, one slot
    per thread of the work-group and per UPCAST lane of the reduced value (half floats are held as 4-byte floats);
    per staged tile, `stage_buffers` copies of it (3 where the device copies asynchronously: an upper bound)."""
    ranges = {u for u in ast.toposort() if u.op is Ops.RANGE}
    local = prod(r.src[0].arg for r in ranges if r.arg[1] is RangeKind.LOCAL)
    total = 0
    for u in ast.toposort():
        if u.op is not Ops.REDUCE:
            continue
        for g in (r for r in u.src[1:] if r.arg[1] is RangeKind.GROUP):
            lanes = prod(r.src[0].arg for r in u.src[0].toposort()
                         if r.op is Ops.RANGE and r.arg[1] is RangeKind.UPCAST)
            size = 4 if u.dtype.name in ("f16", "bf16") else u.dtype.itemsize
            total += local * lanes * g.src[0].arg * size
    for ld, tile in staged_tiles(ast):
        total += stage_buffers * prod(r.src[0].arg for r in tile) * (4 if ld.dtype.name in ("f16", "bf16")
                                                                       else ld.dtype.itemsize)
    return total


class OptOps(str, Enum):
    """The optimizations (see the module docstring). A stored or printed opt names its op by `.name` (a member
    also equals that string, so BEAM's stored winners read as before)."""
    UPCAST = "UPCAST"
    UNROLL = "UNROLL"
    LOCAL = "LOCAL"
    GROUP = "GROUP"
    GROUPTOP = "GROUPTOP"
    PADTO = "PADTO"
    STAGE = "STAGE"
    TC = "TC"
    SWAP = "SWAP"
    THREAD = "THREAD"


@dataclass(frozen=True)
class Opt:
    """One optimization: `Opt(OptOps.UPCAST, 0, 4)`. A known name as a string (`Opt("UPCAST", 0, 4)`) becomes the
    enum member; an unknown one stays a string, which `OptKernel.apply` refuses with a reason."""
    op: OptOps
    axis: int
    amount: int

    def __post_init__(self) -> None:
        if not isinstance(self.op, OptOps) and isinstance(self.op, str) and self.op in OptOps.__members__:
            object.__setattr__(self, "op", OptOps[self.op])

    @property
    def name(self) -> str:
        return self.op.name if isinstance(self.op, OptOps) else str(self.op)

    def __str__(self) -> str:
        return f"{self.name}({self.axis}, {self.amount})"

    def to_json(self) -> list:
        return [self.name, self.axis, self.amount]

    @staticmethod
    def from_json(v: list) -> Opt:
        """The opt a stored list names; ValueError for an op this version does not know (a stale entry)."""
        name = str(v[0])
        if name not in OptOps.__members__:
            raise ValueError(f"unknown opt {name}")
        return Opt(OptOps[name], int(v[1]), int(v[2]))



class OptKernel:
    """A kernel AST plus the opts applied to it."""

    def __init__(self, ast: UOp, device: Any):
        self.ast, self.device = ast, device
        self.base = ast  # the AST before any opt: `applied` replayed on it gives `ast`
        self.applied: list[Opt] = []
        self.threads = 1
        self.pads: dict[int, int] = {}
        # a symbolic kernel's launch assumptions: (size expression, divisor) pairs that must divide evenly
        self.assumptions: list[tuple[UOp, int]] = []

    # --- the kernel's shape
    def ranges(self) -> list[UOp]:
        return sorted({u for u in self.ast.toposort() if u.op is Ops.RANGE}, key=lambda r: r.arg[0])

    def loops(self) -> list[UOp]:
        return [r for r in self.ranges() if r.arg[1] is RangeKind.LOOP]

    def reduces(self) -> list[UOp]:
        return [r for r in self.ranges() if r.arg[1] is RangeKind.REDUCE]

    def axes(self) -> list[UOp]:
        return self.loops() + self.reduces()

    def unrolled_size(self) -> int:
        return prod(r.src[0].arg for r in self.ranges() if r.arg[1] in (RangeKind.UPCAST, RangeKind.UNROLL))

    def _next_id(self) -> int:
        return max((r.arg[0] for r in self.ranges()), default=-1) + 1

    def copy(self) -> OptKernel:
        k = OptKernel(self.ast, self.device)
        k.base, k.applied, k.threads, k.pads = self.base, list(self.applied), self.threads, dict(self.pads)
        k.assumptions = list(self.assumptions)
        return k

    # --- applying opts
    def apply(self, opt: Opt) -> None:
        """Apply one opt; OptError (and the kernel unchanged) when it does not apply or breaks a launch limit."""
        ast, applied, threads = self.ast, list(self.applied), self.threads
        self._apply(opt)
        if self.device.caps.gpu:
            try:
                self.check_limits()
            except OptError:
                self.ast, self.applied, self.threads = ast, applied, threads
                raise

    def check_limits(self) -> None:
        """The work-group size and shared memory against the device's launch limits (GPUs)."""
        lim = launch_limits(self.device)
        ranges = self.ranges()
        group = prod(r.src[0].arg for r in ranges if r.arg[1] in (RangeKind.LOCAL, RangeKind.GROUP))
        if group > lim.threads:
            raise OptError(f"a work-group of {group} threads is too large (at most {lim.threads})")
        shared = shared_bytes(self.ast, stage_buffers(self.device.caps.async_copy))
        if shared > lim.shared_bytes:
            raise OptError(f"{shared} bytes of shared memory is too much (at most {lim.shared_bytes})")

    def _apply(self, opt: Opt) -> None:
        if not isinstance(opt.op, OptOps):
            raise OptError(f"unknown opt {opt.op}")
        axes = self.axes()
        gpu = self.device.caps.gpu
        if opt.op is OptOps.SWAP:
            loops = self.loops()
            if not (0 <= opt.axis < len(loops) and 0 <= opt.amount < len(loops)) or opt.axis == opt.amount:
                raise OptError(f"SWAP needs two distinct output axes < {len(loops)}")
            a, b = loops[opt.axis], loops[opt.amount]
            ta = UOp(Ops.RANGE, INDEX, a.src, (b.arg[0], RangeKind.LOOP))
            tb = UOp(Ops.RANGE, INDEX, b.src, (a.arg[0], RangeKind.LOOP))
            self.ast = substitute(self.ast, {a: ta, b: tb})
            self.applied.append(opt)
            return
        if opt.op is OptOps.THREAD:
            if gpu:
                raise OptError("THREAD is for CPU devices")
            if self.threads != 1:
                raise OptError("THREAD was already applied")
            if opt.axis != 0 or not self.loops():
                raise OptError("THREAD splits the outermost output axis (axis 0)")
            self.ast, self.threads = split_threads(self.ast, opt.amount)
            self.applied.append(opt)
            return
        if opt.op is OptOps.TC:
            if not (gpu and self.device.caps.tensor_cores):
                raise OptError("TC needs a GPU with tensor cores (CUDA sm_80 or later)")
            if self.applied:
                raise OptError("TC is the first opt of a kernel")
            self.ast = tensor_core(self.ast, self._next_id())
            self.applied.append(opt)
            return
        if opt.op in (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.STAGE) and \
                any(u.op is Ops.MMA for u in self.ast.toposort()):
            raise OptError(f"{opt.op.name} after TC (the work-group is the warp of the tensor cores)")
        if not 0 <= opt.axis < len(axes):
            raise OptError(f"axis {opt.axis} is out of range: the kernel has {len(axes)} axes")
        r = axes[opt.axis]
        # a symbolic size (an expression of dim variables): the split assumes it divides, checked at launch
        n = r.src[0].arg if r.src[0].op is Ops.CONST else None
        amt = opt.amount
        if amt <= 1:
            raise OptError("amount must be at least 2")
        is_reduce = r.arg[1] is RangeKind.REDUCE
        if opt.op is OptOps.STAGE:
            if not gpu:
                raise OptError("STAGE needs a GPU-shaped device")
            if not is_reduce or n is None:
                raise OptError("STAGE applies to a reduction axis of a constant size")
            if any(x.arg[1] in (RangeKind.TILE, RangeKind.GROUP) for x in self.ranges()):
                raise OptError("STAGE once per kernel, and not with GROUP")
            if n % amt:
                raise OptError(f"axis {opt.axis} has size {n}, which {amt} does not divide")
            self.ast = split_range(self.ast, r, amt, RangeKind.TILE, self._next_id())
            self.applied.append(opt)
            return
        if n is None and opt.op not in (OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP):
            raise OptError(f"{opt.op.name} needs a constant size")
        if opt.op is OptOps.PADTO:
            if not is_reduce and gpu:
                raise OptError("PADTO of an output axis is for CPU devices (a GPU rounds its grid up itself)")
            if n % amt == 0:
                raise OptError(f"axis {opt.axis} (size {n}) is already a multiple of {amt}")
            padded = -(-n // amt) * amt
            if padded - n > n:
                raise OptError(f"padding axis {opt.axis} (size {n}) to {padded} would more than double it")
            new = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, padded),), r.arg)
            self.ast = pad_reduce(self.ast, r, new) if is_reduce else pad_loop(self.ast, r, new)
            self.applied.append(opt)
            return
        if n is not None and n % amt:
            raise OptError(f"axis {opt.axis} has size {n}, which {amt} does not divide")
        if opt.op is OptOps.UPCAST:
            if is_reduce:
                raise OptError("UPCAST applies to output axes (use UNROLL for reductions)")
            if self.unrolled_size() * amt > MAX_UNROLLED:
                raise OptError(f"more than {MAX_UNROLLED} values would be unrolled")
            kind = RangeKind.UPCAST
        elif opt.op is OptOps.UNROLL:
            if not is_reduce:
                raise OptError("UNROLL applies to reduction axes")
            if self.unrolled_size() * amt > MAX_UNROLLED:
                raise OptError(f"more than {MAX_UNROLLED} values would be unrolled")
            kind = RangeKind.UNROLL
        elif opt.op is OptOps.LOCAL:
            if not gpu:
                raise OptError("LOCAL needs a GPU-shaped device")
            if is_reduce:
                raise OptError("LOCAL applies to output axes")
            kind = RangeKind.LOCAL
        else:  # GROUP, GROUPTOP
            if not gpu:
                raise OptError(f"{opt.op.name} needs a GPU-shaped device")
            if not is_reduce:
                raise OptError(f"{opt.op.name} applies to reduction axes")
            if any(x.arg[1] in (RangeKind.GROUP, RangeKind.TILE) for x in self.ranges()):
                raise OptError("only one GROUP per kernel, and not with STAGE")
            kind = RangeKind.GROUP
        if n is None:
            self.assumptions.append((r.src[0], amt))
        self.ast = split_range(self.ast, r, amt, kind, self._next_id(), top=opt.op is OptOps.GROUPTOP)
        self.applied.append(opt)


def _strip_half_rounding(v: UOp) -> UOp:
    """A product as legalized (`CAST f32 (CAST f16 (x))`: rounded to the half type) -> x."""
    if v.op is Ops.CAST and v.src[0].op is Ops.CAST and v.src[0].dtype.name in ("f16", "bf16"):
        return v.src[0].src[0]
    return v


def _half_load(v: UOp) -> UOp | None:
    """The f16/bf16 global LOAD an operand is (`CAST f32 (LOAD)`), else None."""
    if v.op is Ops.CAST and v.src[0].op is Ops.LOAD and v.src[0].src[0].op is Ops.DEFINE_GLOBAL and \
            v.src[0].dtype.name in ("f16", "bf16") and len(v.src[0].src) == 2:
        return v.src[0]
    return None


def tensor_core(ast: UOp, next_id: int) -> UOp:
    """TC's rewrite: the kernel's one sum reduction of a product of two f16 (or two bf16) loads, A read along rows
    R and the reduction K, B along K and columns C (each a constant loop: R % 16, C % 8, K % 16), becomes per
    warp a 16 x 8 tile: a LOCAL range `lane` of 32, each lane's 8 values of A and 4 of B at the positions of the
    PTX ISA's m16n8k16 fragments (g = lane // 4, t = lane % 4: A rows g, g + 8 and columns 2t, 2t + 1, 2t + 8,
    2t + 9; B rows 2t, 2t + 1, 2t + 8, 2t + 9 and column g), one `Ops.MMA` per 16 steps, and each output the sum
    over the steps of its lane of the result (rows g, g + 8, columns 2t, 2t + 1): four stores per store. The
    products are exact in f32 and summed in f32 (the tensor cores' f32 accumulate; the kernel without TC rounds
    each product to the half type first). OptError where the kernel is not such a matmul."""
    reduces = [u for u in ast.toposort() if u.op is Ops.REDUCE]
    if len(reduces) != 1 or reduces[0].arg is not Ops.ADD or len(reduces[0].src) != 2:
        raise OptError("TC needs one sum reduction over one loop")
    red = reduces[0]
    k = red.src[1]
    body = _strip_half_rounding(red.src[0])
    if body.op is not Ops.MUL:
        raise OptError("TC needs a reduction of a product")
    loads = [_half_load(x) for x in body.src]
    if any(ld is None for ld in loads) or loads[0].dtype != loads[1].dtype:
        raise OptError("TC needs both factors loaded from f16 (or both from bf16) buffers")
    loops = sorted((u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] is RangeKind.LOOP),
                   key=lambda r: r.arg[0])
    if any(r.src[0].op is not Ops.CONST for r in [*loops, k]):
        raise OptError("TC needs constant sizes")
    in_a, in_b = (set(ld.src[1].toposort()) for ld in loads)
    rows = [r for r in loops if r in in_a and r not in in_b]
    cols = [r for r in loops if r in in_b and r not in in_a]
    if not rows or not cols:
        a_op, b_op = body.src[1], body.src[0]  # B @ A as written: the other order
        in_a, in_b = in_b, in_a
        rows = [r for r in loops if r in in_a and r not in in_b]
        cols = [r for r in loops if r in in_b and r not in in_a]
    else:
        a_op, b_op = body.src
    if len(rows) != 1 or len(cols) != 1 or k not in in_a or k not in in_b:
        raise OptError("TC needs one row axis read by one factor and one column axis by the other")
    rr, cc = rows[0], cols[0]
    if rr.src[0].arg % 16 or cc.src[0].arg % 8 or k.src[0].arg % 16:
        raise OptError("TC needs rows in 16s, columns in 8s and a reduction in 16s")
    c = lambda v: UOp.const(INDEX, v)  # noqa: E731
    lane = UOp(Ops.RANGE, INDEX, (c(32),), (next_id, RangeKind.LOCAL))
    ro = UOp(Ops.RANGE, INDEX, (c(rr.src[0].arg // 16),), rr.arg)
    co = UOp(Ops.RANGE, INDEX, (c(cc.src[0].arg // 8),), cc.arg)
    ko = UOp(Ops.RANGE, INDEX, (c(k.src[0].arg // 16),), k.arg)
    g, t = lane // c(4), lane % c(4)
    a_vals = [substitute(a_op, {rr: ro * c(16) + g + c(8 * ((j // 2) % 2)),
                                k: ko * c(16) + t * c(2) + c(j % 2 + 8 * (j // 4))}) for j in range(8)]
    b_vals = [substitute(b_op, {k: ko * c(16) + t * c(2) + c(j % 2 + 8 * (j // 2)), cc: co * c(8) + g})
              for j in range(4)]
    mma = UOp(Ops.MMA, dtypes.f32.vec(4), tuple(simplify(v) for v in (*a_vals, *b_vals)), loads[0].dtype.name)
    stores = []
    for i in range(4):
        total = UOp(Ops.REDUCE, red.dtype, (UOp(Ops.GEP, dtypes.f32, (mma,), i), ko), Ops.ADD)
        where = {rr: ro * c(16) + g + c(8 * (i // 2)), cc: co * c(8) + t * c(2) + c(i % 2)}
        stores += [substitute(st, {red: total, **where}) for st in ast.src]
    return simplify(UOp(Ops.SINK, ast.dtype, tuple(stores), ast.arg))


def split_range(ast: UOp, r: UOp, amount: int, inner_kind: RangeKind, inner_id: int, top: bool = False) -> UOp:
    """Replace range r by outer * amount + inner; a REDUCE over r then reduces over both parts (a rewrite).
    With `top`, the new range of `amount` steps is the high digit instead: r = new * (size / amount) + outer
    (GROUPTOP). A symbolic size (not a CONST) is divided as an expression: the caller has checked that `amount`
    divides it."""
    end = r.src[0]
    outer_end = UOp.const(INDEX, end.arg // amount) if end.op is Ops.CONST else \
        simplify(end // UOp.const(INDEX, amount))
    outer = UOp(Ops.RANGE, INDEX, (outer_end,), r.arg)
    inner = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, amount),), (inner_id, inner_kind))
    value = inner * outer_end + outer if top else outer * UOp.const(INDEX, amount) + inner
    ctx = _Split(r, value, (outer, inner))
    return simplify(graph_rewrite(ast, _split_rules, ctx))


@dataclass(frozen=True)
class _Split:
    old: UOp  # the range split
    value: UOp  # what its uses become
    parts: tuple[UOp, ...]  # what a REDUCE over it reduces over instead


def _split_reduce(ctx: _Split, x: UOp) -> UOp | None:
    if ctx.value not in x.src[1:]:
        return None
    ranges = [p for s in x.src[1:] for p in (ctx.parts if s is ctx.value else (s,))]
    return UOp(Ops.REDUCE, x.dtype, (x.src[0], *ranges), x.arg)


_split_rules = PatternMatcher([
    (UPat(Ops.RANGE, name="x"), lambda ctx, x: ctx.value if x is ctx.old else None),
    (UPat(Ops.REDUCE, name="x"), _split_reduce),
])


@dataclass(frozen=True)
class _Pad:
    old: UOp  # the reduction range
    new: UOp  # the same range, run to a multiple of the opt's amount


def _pad_reduce(ctx: _Pad, x: UOp) -> UOp | None:
    if ctx.old not in x.src[1:]:
        return None
    valid = UOp(Ops.CMPLT, dtypes.bool, (ctx.new, UOp.const(INDEX, ctx.old.src[0].arg)))
    body = gate_loads(substitute(x.src[0], {ctx.old: ctx.new}), valid)
    masked = UOp(Ops.WHERE, x.dtype, (valid, body, UOp.const(x.dtype, identity(x.arg, x.dtype))))
    return UOp(Ops.REDUCE, x.dtype, (masked, *[ctx.new if s is ctx.old else s for s in x.src[1:]]), x.arg)


_pad_rules = PatternMatcher([(UPat(Ops.REDUCE, name="x"), _pad_reduce)])


def pad_reduce(ast: UOp, r: UOp, new: UOp) -> UOp:
    """Run a reduction loop to `new`'s size; iterations past the old size contribute the identity (a rewrite)."""
    return simplify(graph_rewrite(ast, _pad_rules, _Pad(r, new)))


def pad_loop(ast: UOp, r: UOp, new: UOp) -> UOp:
    """Run an output loop to `new`'s size: below the stores the loop's index is clamped to the last one
    (`min(new, old size - 1)`: every load stays in bounds, ungated, and its index math stays outside the
    reductions), and every store is gated by `new < old size`, so the extra iterations write nothing."""
    last = UOp.const(INDEX, r.src[0].arg - 1)
    clamped = UOp(Ops.WHERE, INDEX, (UOp(Ops.CMPLT, dtypes.bool, (new, last)), new, last))
    live = UOp(Ops.CMPLT, dtypes.bool, (new, UOp.const(INDEX, r.src[0].arg)))
    # a load gated already and outside every reduction (a pad copy's, a pool's over a padded input) reads the
    # loop's index unclamped, gated by `live` as well: its index stays affine in the loop, so a row of it is
    # one masked vector load (`expand._Vectorizer`), not a branch per lane
    unclamped = {u: UOp(Ops.LOAD, u.dtype, (u.src[0], substitute(u.src[1], {r: new}),
                                           UOp(Ops.AND, dtypes.bool, (substitute(u.src[2], {r: new}), live))))
                 for u in ast.toposort() if u.op is Ops.LOAD and len(u.src) == 3 and r in u.toposort()
                 and not any(x.op is Ops.RANGE and x.arg[1] is RangeKind.REDUCE or x.op is Ops.LOAD and x is not u
                             for x in u.toposort())}
    body = substitute(ast, {**unclamped, r: clamped})

    def gate(u: UOp) -> UOp:
        if u.op is not Ops.STORE:
            return u
        idx = substitute(u.src[1], {clamped: new})
        both = live if len(u.src) <= 3 else UOp(Ops.AND, dtypes.bool, (u.src[3], live))
        return u.replace(src=(u.src[0], idx, u.src[2], both, *u.src[4:]))

    return simplify(rebuild(body, {}, gate))


def _gate_load(valid: UOp, x: UOp) -> UOp | None:
    if len(x.src) == 3 and valid in x.src[2].toposort():
        return None  # gated already
    gate = valid if len(x.src) == 2 else UOp(Ops.AND, dtypes.bool, (x.src[2], valid))
    return UOp(Ops.LOAD, x.dtype, (x.src[0], x.src[1], gate))


_gate_rules = PatternMatcher([(UPat(Ops.LOAD, name="x"), _gate_load)])


def gate_loads(u: UOp, valid: UOp) -> UOp:
    """Every LOAD under `u` reads only where `valid` holds (a rewrite)."""
    return graph_rewrite(u, _gate_rules, valid)


def split_threads(ast: UOp, threads: int) -> tuple[UOp, int]:
    """Give each of `threads` threads a contiguous chunk of the first output loop."""
    loops = sorted((u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] is RangeKind.LOOP),
                   key=lambda x: x.arg[0])
    if not loops or threads <= 1:
        return ast, 1
    r = loops[0]
    if r.src[0].op is not Ops.CONST:  # a symbolic size: chunks of ceil(n / threads), empty past the end
        n_expr = r.src[0]
        chunk_expr = simplify((n_expr + UOp.const(INDEX, threads - 1)) // UOp.const(INDEX, threads))
        core = UOp(Ops.DEFINE_VAR, INDEX, (), ("core_id", 0, threads - 1))
        start = core * chunk_expr
        left = n_expr - start
        end = simplify((left < chunk_expr).where(left, chunk_expr))
        inner = UOp(Ops.RANGE, INDEX, (end,), (r.arg[0], RangeKind.LOOP))
        return simplify(substitute(ast, {r: start + inner})), threads
    n = r.src[0].arg
    threads = min(threads, n)
    if threads <= 1:
        return ast, 1
    chunk = -(-n // threads)
    threads = -(-n // chunk)
    core = UOp(Ops.DEFINE_VAR, INDEX, (), ("core_id", 0, threads - 1))
    start = core * UOp.const(INDEX, chunk)
    left = UOp.const(INDEX, n) - start
    end = simplify((left < UOp.const(INDEX, chunk)).where(left, UOp.const(INDEX, chunk)))
    inner = UOp(Ops.RANGE, INDEX, (end,), (r.arg[0], RangeKind.LOOP))  # `end` is min(left, chunk): its bounds
    return simplify(substitute(ast, {r: start + inner})), threads


# --------------------------------------------------------------------------------------------------------------
# the hand-coded heuristic


def _loads(ast: UOp) -> list[UOp]:
    return [u for u in ast.toposort() if u.op is Ops.LOAD]


def _stride(index: UOp, r: UOp) -> int | None:
    """The coefficient of range r in an affine index (None when r appears non-linearly)."""
    terms, _ = _terms(index)
    coef = 0
    for node, c in terms:
        if node is r:
            coef += c
        elif r in node.toposort():
            return None
    return coef


def _try(k: OptKernel, opt: Opt) -> bool:
    try:
        k.apply(opt)
        return True
    except OptError:
        return False


def auto_threads(k: OptKernel) -> None:
    cores = k.device.cores
    total = prod(r.src[0].arg for r in k.ranges() if r.src[0].op is Ops.CONST)
    if k.threads == 1 and cores > 1 and total >= 2 * MIN_WORK_PER_THREAD and k.loops():
        _try(k, Opt(OptOps.THREAD, 0, min(cores, total // MIN_WORK_PER_THREAD)))


# opts replayed on an AST (`apply_opts` with a list), and the states BEAM built (`remember`): a search lowers
# hundreds of candidates of one kernel, each the state of its parent plus one opt, which it has already applied
_REPLAYED: dict[tuple, tuple[UOp, int, list[Opt]]] = {}
_STATES: dict[tuple, OptKernel] = {}
_MEMO_MAX = 4096


def remember(k: OptKernel) -> None:
    """Keep `k`'s state (its base AST with `k.applied` replayed): `apply_opts` of that list starts from it."""
    if len(_STATES) > _MEMO_MAX:
        _STATES.clear()
    _STATES[(k.base, k.device, tuple(k.applied))] = k.copy()


def apply_opts(ast: UOp, device: Any, opts: list[Opt] | None = None,
               heuristic: Callable[[OptKernel], Any] | None = None) -> tuple[UOp, int, list[Opt]]:
    """(optimized AST, CPU threads, applied opts): `opts` replays a known list (BEAM's, a stored winner's);
    None runs `heuristic` (the hand-coded rule table, `tgc.codegen.heuristic.hand_coded`, which the pipeline
    passes; nothing under NOOPT). On the CPU the outer loop is then split across
    threads unless an opt chose how (THREAD) or NOOPT is set. A replayed list is memoized (an OptKernel is a
    function of its AST, device and opts)."""
    noopt = env_flag("NOOPT")
    key = (ast, device, tuple(opts), noopt) if opts is not None else None
    if key is not None and key in _REPLAYED:
        out = _REPLAYED[key]
        return out[0], out[1], list(out[2])
    known = _STATES.get((ast, device, tuple(opts))) if opts is not None else None
    if known is not None:
        k = known.copy()
    else:
        k = OptKernel(ast, device)
        if opts is not None:
            for o in opts:
                k.apply(o)
        elif not noopt and heuristic is not None:
            heuristic(k)
    gpu = k.device.caps.gpu
    if not gpu and not noopt and not any(o.op is OptOps.THREAD for o in k.applied):
        auto_threads(k)
    if key is not None:
        if len(_REPLAYED) > _MEMO_MAX:
            _REPLAYED.clear()
        _REPLAYED[key] = (k.ast, k.threads, list(k.applied))
    return k.ast, k.threads, list(k.applied)


@dataclass
class _Groups:
    locals_: tuple[UOp, ...]  # the work-group's LOCAL ranges
    next_id: int  # the next free range id
    index: dict[UOp, int]  # REDUCE -> its position among the kernel's reductions (names its shared memory)
    shuffle_width: int = 0  # lanes of a warp shuffle (0: the dialect renders none)
    threads: int = 1  # threads of the work-group (LOCAL and GROUP ranges)
    innermost: UOp | None = None  # the work-group range whose threads are adjacent lanes (stride 1 in lidx0)


_SHUFFLED = ("f32", "f64", "f16", "bf16", "i32", "u32", "i64", "u64")  # held in registers as a shuffled type


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _combine(op: Ops, a: UOp, b: UOp) -> UOp:
    return UOp(op, a.dtype, (a, b))


def _butterfly(v: UOp, op: Ops, lanes: int) -> UOp:
    """`v` combined over each aligned block of `lanes` adjacent lanes by xor shuffles: every lane gets the block's
    result (a + b and b + a round alike, so all lanes hold the same bits)."""
    off = lanes // 2
    while off >= 1:
        v = _combine(op, v, UOp(Ops.SHUFFLE, v.dtype, (v,), off))
        off //= 2
    return v


def _lower_group(ctx: _Groups, u: UOp) -> UOp | None:
    groups = [r for r in u.src[1:] if r.arg[1] is RangeKind.GROUP]
    if not groups:
        return None
    g = groups[0]
    amt = g.src[0].arg
    rest = tuple(r for r in u.src[1:] if r is not g)
    partial = UOp(Ops.REDUCE, u.dtype, (u.src[0], *rest), u.arg) if rest else u.src[0]
    # one slot per thread of the work-group and per UPCAST lane: the lanes are unrolled into separate
    # stores later, which must not share a slot
    ups = sorted({r for r in u.src[0].toposort() if r.op is Ops.RANGE and r.arg[1] is RangeKind.UPCAST},
                 key=lambda r: r.arg[0])
    slots = ctx.locals_ + tuple(ups)
    sizes = tuple(r.src[0].arg for r in slots)
    flat = flat_index(slots, sizes) if slots else UOp.const(INDEX, 0)
    i = ctx.index.get(u, len(ctx.index))
    op = u.arg
    w = ctx.shuffle_width
    if w and _pow2(amt) and _pow2(w) and g is ctx.innermost and ctx.threads % w == 0 and u.dtype.name in _SHUFFLED:
        # warp shuffles: the GROUP's threads are adjacent lanes, whole warps run every shuffle
        v = _butterfly(partial, op, min(amt, w))
        if amt <= w:
            return v
        warps = amt // w  # <= w: a work-group has at most w * w threads
        temp = UOp(Ops.DEFINE_LOCAL, u.dtype.as_ptr(), (), (f"temp{i}", prod(sizes) * warps))
        base = simplify(flat * UOp.const(INDEX, warps))
        first = UOp(Ops.CMPEQ, dtypes.bool, (simplify(g % UOp.const(INDEX, w)), UOp.const(INDEX, 0)))
        stored = UOp(Ops.STORE, None, (temp, simplify(base + g // UOp.const(INDEX, w)), v, first))
        barrier = UOp(Ops.BARRIER, None, (stored,))
        load = UOp(Ops.LOAD, u.dtype, (temp, simplify(base + g % UOp.const(INDEX, warps)), barrier))
        return _butterfly(load, op, warps)
    if _pow2(amt) and amt > 1:
        # a tree in shared memory: log2(amt) rounds, each halving the live partials, a barrier after each
        temp = UOp(Ops.DEFINE_LOCAL, u.dtype.as_ptr(), (), (f"temp{i}", prod(sizes) * amt))
        base = simplify(flat * UOp.const(INDEX, amt))
        mine = simplify(base + g)
        barrier = UOp(Ops.BARRIER, None, (UOp(Ops.STORE, None, (temp, mine, partial)),))
        half = amt // 2
        while half >= 1:
            a = UOp(Ops.LOAD, u.dtype, (temp, mine, barrier))
            # the partner's slot wraps for the threads whose result is not stored, so every read is in range
            other = simplify(base + (g + UOp.const(INDEX, half)) % UOp.const(INDEX, amt))
            b = UOp(Ops.LOAD, u.dtype, (temp, other, barrier))
            keep = UOp(Ops.CMPLT, dtypes.bool, (g, UOp.const(INDEX, half)))
            barrier = UOp(Ops.BARRIER, None, (UOp(Ops.STORE, None, (temp, mine, _combine(op, a, b), keep)),))
            half //= 2
        return UOp(Ops.LOAD, u.dtype, (temp, base, barrier))
    temp = UOp(Ops.DEFINE_LOCAL, u.dtype.as_ptr(), (), (f"temp{i}", prod(sizes) * amt))
    base = simplify(flat * UOp.const(INDEX, amt))
    stored = UOp(Ops.STORE, None, (temp, simplify(base + g), partial))
    barrier = UOp(Ops.BARRIER, None, (stored,))
    j = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, amt),), (ctx.next_id, RangeKind.REDUCE))
    ctx.next_id += 1
    load = UOp(Ops.LOAD, u.dtype, (temp, simplify(base + j), barrier))
    return UOp(Ops.REDUCE, u.dtype, (load, j), u.arg)


_group_rules = PatternMatcher([(UPat(Ops.REDUCE, name="u"), _lower_group)])


def lower_groups(ast: UOp, shuffle_width: int = 0) -> UOp:
    """A reduction with a GROUP range: each thread of the work-group reduces its share, then the work-group
    combines the partial results and every thread gets the same value (it is stored by all of them). How:
    - warp shuffles (`shuffle_width` lanes, a dialect that renders `Ops.SHUFFLE`), where the GROUP's threads are
      adjacent lanes (its range is the innermost digit of the work-group's index), its size and the warp's are
      powers of two and the work-group is whole warps: a xor butterfly within each warp, and past one warp the
      warps' results through shared memory (one barrier) and a second butterfly;
    - else, a GROUP of a power-of-two size: a tree in shared memory (log2 rounds, a barrier after each);
    - else every thread adds up all the partials after one barrier (a loop).
    A rewrite of each such REDUCE."""
    nodes = ast.toposort()
    ranges = sorted({u for u in nodes if u.op is Ops.RANGE}, key=lambda r: r.arg[0])
    if not any(r.arg[1] is RangeKind.GROUP for r in ranges):
        return ast
    in_group = [r for r in ranges if r.arg[1] in (RangeKind.LOCAL, RangeKind.GROUP)]
    ctx = _Groups(tuple(r for r in ranges if r.arg[1] is RangeKind.LOCAL),
                  max((r.arg[0] for r in ranges), default=-1) + 1,
                  {u: i for i, u in enumerate(x for x in nodes if x.op is Ops.REDUCE)},
                  shuffle_width, prod(r.src[0].arg for r in in_group), in_group[-1] if in_group else None)
    return graph_rewrite(ast, _group_rules, ctx)


def _tile_reduce(ast: UOp) -> tuple[UOp, UOp, UOp] | None:
    """(the REDUCE over a TILE range, its outer range, the TILE range) where STAGE applies: the REDUCE runs over
    exactly those two ranges and the kernel has a work-group (LOCAL ranges). None otherwise (the TILE range is
    then an ordinary loop: right, only not staged)."""
    nodes = ast.toposort()
    if not any(u.op is Ops.RANGE and u.arg[1] is RangeKind.LOCAL for u in nodes):
        return None
    for u in nodes:
        if u.op is Ops.REDUCE and len(u.src) == 3:
            tiles = [r for r in u.src[1:] if r.arg[1] is RangeKind.TILE]
            outer = [r for r in u.src[1:] if r.arg[1] is RangeKind.REDUCE]
            if tiles and outer and all(r.src[0].op is Ops.CONST for r in u.src[1:]):
                return u, outer[0], tiles[0]
    return None


def staged_tiles(ast: UOp) -> list[tuple[UOp, tuple[UOp, ...]]]:
    """The loads `stage_tiles` copies to shared memory, each with the ranges of its tile (its work-group and
    register-tile ranges and the TILE range, the one it reads contiguously last): every global load inside the
    tiled reduction that reads along the TILE range and otherwise only along ranges the work-group shares (the
    grid's, the outer reduction's)."""
    found = _tile_reduce(ast)
    if found is None:
        return []
    u, outer, tile = found
    out = []
    for ld in u.src[0].toposort():
        if ld.op is not Ops.LOAD or ld.src[0].op is not Ops.DEFINE_GLOBAL or tile not in ld.toposort():
            continue
        deps = [r for r in ld.toposort() if r.op is Ops.RANGE]
        if any(r.arg[1] not in (RangeKind.LOOP, RangeKind.LOCAL, RangeKind.UPCAST, RangeKind.TILE) and r is not outer
               for r in deps) or any(x.op is Ops.LOAD for x in ld.src[1].toposort()):
            continue  # another reduction's loop, or an index read from memory: read where it is
        mine = sorted((r for r in deps if r.arg[1] in (RangeKind.LOCAL, RangeKind.UPCAST, RangeKind.TILE)),
                      key=lambda r: (-abs(st) if isinstance(st := _stride(ld.src[1], r), int) else -(1 << 62),
                                     r.arg[0]))
        out.append((ld, tuple(mine)))
    return out


def _digits(e: UOp, ranges: tuple[UOp, ...], sizes: tuple[int, ...]) -> dict[UOp, UOp]:
    """Each range's digit of the flat element `e` of a tile over `ranges` (row-major, the last fastest)."""
    digits, stride = {}, prod(sizes)
    for r, n in zip(ranges, sizes):
        stride //= n
        digits[r] = simplify((e // UOp.const(INDEX, stride)) % UOp.const(INDEX, n))
    return digits


def _vector_copies(ld: UOp, ranges: tuple[UOp, ...], size: int, threads: int) -> bool:
    """Whether a tile's copies can load 4 adjacent elements at once (16 bytes, aligned): a 4-byte type, no gate,
    the tile's last range contiguous (stride 1) and a multiple of 4 long, every other term of the index (and its
    constant) a multiple of 4 (buffers are whole allocations, aligned far past 16 bytes), and whole copies of 4
    elements for every thread."""
    if ld.dtype.itemsize != 4 or ld.dtype.name not in ("f32", "i32", "u32") or len(ld.src) != 2 or not ranges:
        return False
    inner = ranges[-1]
    if _stride(ld.src[1], inner) != 1 or inner.src[0].arg % 4 or size % (4 * threads):
        return False
    terms, const = _terms(ld.src[1])
    return const % 4 == 0 and all(c % 4 == 0 for node, c in terms if node is not inner)


# the arg of a STORE to shared memory issued as an asynchronous copy (`cp.async`) of the LOAD it stores: one the
# thread waits for before this step's barrier, or (prefetching) the first step's, issued in step 0, and the next
# step's, issued a step ahead (the renderer commits each kind as its own group: `cstyle.CUDARenderer`)
ASYNC_COPY, ASYNC_FIRST, ASYNC_NEXT = "async", "async_first", "async_next"


def stage_buffers(async_copy: bool) -> int:
    """Shared buffers of each staged tile: 2 (by the step's parity), 3 where the device copies asynchronously (the
    next step's copies are issued before this step's barrier: `stage_tiles`)."""
    return 3 if async_copy else 2


def stage_tiles(ast: UOp, async_copy: bool = False) -> UOp:
    """STAGE's lowering (GPUs; before `map_to_grid`, while the work-group's ranges are ranges): the reduction over
    (outer, tile) becomes a reduction over outer of a reduction over tile. In each outer step the work-group's
    threads copy every staged load's tile (`staged_tiles`) into shared memory, thread t taking elements t,
    t + threads, ... of it (in the order of its ranges, the contiguous one last: adjacent threads read adjacent
    elements), the copies past the tile gated off; one barrier; then the tile's loop reads shared memory. Two
    buffers, by the outer step's parity: a thread past the barrier writes the other buffer, which every thread
    finished reading before that barrier (so one barrier a step suffices).
    With `async_copy` (caps `async_copy`: CUDA sm_80+) and every copy 16 bytes (`_vector_copies`), the copies are
    `cp.async` (a STORE of the 4-lane LOAD into shared memory with arg ASYNC_FIRST or ASYNC_NEXT, which the
    renderer issues without registers between) and run a step ahead: step s issues step s + 1's copies (gated off
    in the last step; step 0 also issues its own, gated to step 0) into buffer (s + 1) % 3, waits for all but
    those (`cp.async.wait_group 1`: step s's, issued in step s - 1) and passes the one barrier, so the copies of
    s + 1 overlap the arithmetic of s. Three buffers keep one barrier a step right: a thread at step s has passed
    barrier s - 1, which every thread reached after computing on buffer (s - 2) % 3 = (s + 1) % 3; others may
    still compute on (s - 1) % 3, which it does not write. Otherwise (some copy element by element) the 16-byte
    copies are `cp.async` waited for before the barrier of their own step (ASYNC_COPY), with two buffers."""
    found = _tile_reduce(ast)
    staged = staged_tiles(ast)
    if found is None or not staged:
        return ast
    u, outer, tile = found
    nodes = ast.toposort()
    locals_ = sorted((r for r in nodes if r.op is Ops.RANGE and r.arg[1] is RangeKind.LOCAL), key=lambda r: r.arg[0])
    threads = prod(r.src[0].arg for r in locals_)
    tid = flat_index(tuple(locals_), tuple(r.src[0].arg for r in locals_))
    vector = [_vector_copies(ld, tr, prod(r.src[0].arg for r in tr), threads) for ld, tr in staged]
    ahead = async_copy and all(vector)
    nbuf = stage_buffers(True) if ahead else 2
    steps = outer.src[0].arg

    def buffer(step: UOp, size: int) -> UOp:
        return simplify((step % UOp.const(INDEX, nbuf)) * UOp.const(INDEX, size))

    one = UOp.const(INDEX, 1)
    first_gate = UOp(Ops.CMPLT, dtypes.bool, (outer, one))  # step 0
    next_gate = UOp(Ops.CMPLT, dtypes.bool, (outer, UOp.const(INDEX, steps - 1)))  # a step after this one
    first, stores, reads = [], [], {}
    for i, ((ld, tile_ranges), vec_ok) in enumerate(zip(staged, vector)):
        sizes = tuple(r.src[0].arg for r in tile_ranges)
        size = prod(sizes)
        temp = UOp(Ops.DEFINE_LOCAL, ld.dtype.as_ptr(), (), (f"tile{i}", nbuf * size))
        base = buffer(outer, size)
        if vec_ok:  # 16-byte loads, four elements a thread and copy
            for c in range(size // 4 // threads):
                e = simplify((tid + UOp.const(INDEX, c * threads)) * UOp.const(INDEX, 4))
                vec = substitute(ld, _digits(e, tile_ranges, sizes)).replace(dtype=ld.dtype.vec(4))
                if ahead:
                    v0 = substitute(vec, {outer: UOp.const(INDEX, 0)})
                    first.append(UOp(Ops.STORE, None, (temp, simplify(buffer(UOp.const(INDEX, 0), size) + e), v0,
                                                       first_gate), ASYNC_FIRST))
                    v1 = substitute(vec, {outer: outer + one})
                    v1 = v1.replace(src=(*v1.src[:2], next_gate))
                    stores.append(UOp(Ops.STORE, None, (temp, simplify(buffer(outer + one, size) + e), v1,
                                                        next_gate), ASYNC_NEXT))
                elif async_copy:
                    stores.append(UOp(Ops.STORE, None, (temp, simplify(base + e), vec), ASYNC_COPY))
                else:
                    for j in range(4):
                        lane = UOp(Ops.GEP, ld.dtype, (vec,), j)
                        stores.append(UOp(Ops.STORE, None, (temp, simplify(base + e + UOp.const(INDEX, j)), lane)))
        else:
            for c in range(-(-size // threads)):
                e = simplify(tid + UOp.const(INDEX, c * threads))
                copied = substitute(ld, _digits(e, tile_ranges, sizes))
                if (c + 1) * threads > size:  # a tile no multiple of the work-group: the last copy's extra threads idle
                    live = UOp(Ops.CMPLT, dtypes.bool, (e, UOp.const(INDEX, size)))
                    gate = live if len(copied.src) == 2 else UOp(Ops.AND, dtypes.bool, (copied.src[2], live))
                    copied = copied.replace(src=(*copied.src[:2], gate))
                    stores.append(UOp(Ops.STORE, None, (temp, simplify(base + e), copied, live)))
                else:
                    stores.append(UOp(Ops.STORE, None, (temp, simplify(base + e), copied)))
        reads[ld] = (temp, simplify(base + flat_index(tile_ranges, sizes)))
    barrier = UOp(Ops.BARRIER, None, tuple(first + stores))  # (the first step's copies first: their own group)
    body = substitute(u.src[0], {ld: UOp(Ops.LOAD, ld.dtype, (temp, idx, barrier))
                                 for ld, (temp, idx) in reads.items()})
    inner = UOp(Ops.REDUCE, u.dtype, (body, tile), u.arg)
    return simplify(substitute(ast, {u: UOp(Ops.REDUCE, u.dtype, (inner, outer), u.arg)}))


def map_to_grid(ast: UOp, max_local: int = 256, max_grid: int = 2**31 - 1) -> tuple[UOp, dict]:
    """Output loops -> GPU indices. LOCAL ranges form the work-group; the other output loops are flattened
    into one index split into work-groups of up to `max_local` threads: of a size that divides it exactly
    when one is at least half that, else a grid rounded up whose extra threads do nothing: every load and store
    of a global buffer is gated by `gflat < total` (`gate_memory`), never clamped onto a live element (a clamped
    thread would read an element another thread may already have overwritten, where the memory plan writes the
    output over an input: `tgc.engine.realize.inplace_pairs`)."""
    loops = sorted((u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] is RangeKind.LOOP),
                   key=lambda x: x.arg[0])
    in_group = (RangeKind.LOCAL, RangeKind.GROUP)
    locals_ = sorted((u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] in in_group), key=lambda x: x.arg[0])
    if any(r.src[0].op is not Ops.CONST for r in loops):
        return _map_to_symbolic_grid(ast, loops, locals_, max_local, max_grid)
    total = prod(r.src[0].arg for r in loops)
    mapping: dict[UOp, UOp] = {}
    if locals_:
        local = _local_ids(locals_, mapping)
        groups = total
        gflat = UOp(Ops.SPECIAL, INDEX, (), ("gidx0", groups))
    else:
        local = min(max_local, total)
        exact = next(c for c in range(local, 0, -1) if total % c == 0)
        if 2 * exact >= local:  # a divisor of the size makes full work-groups with no thread out of range
            local = exact
        groups = -(-total // local)
        gidx = UOp(Ops.SPECIAL, INDEX, (), ("gidx0", groups))
        lidx = UOp(Ops.SPECIAL, INDEX, (), ("lidx0", local))
        gflat = (gidx * UOp.const(INDEX, local) + lidx) if groups > 1 else lidx
    if groups > max_grid:
        raise CompileError(f"the kernel needs {groups} work-groups, more than the device's {max_grid}")
    # an awkward size (a prime): the grid is rounded up (instead of blocks of a few threads) and the threads
    # past the end are gated off
    live = (gflat < UOp.const(INDEX, total)) if not locals_ and groups * local != total else None
    stride = total
    for i, r in enumerate(loops):
        n = r.src[0].arg
        stride //= n
        idx = gflat // UOp.const(INDEX, stride)
        # the outermost loop needs no `% n` where the gate stops every thread past the end
        mapping[r] = simplify(idx if live is not None and i == 0 else idx % UOp.const(INDEX, n))
    out = simplify(substitute(ast, mapping))
    if live is not None:
        out = simplify(gate_memory(out, simplify(live)))
    return out, {"global_size": (groups, 1, 1), "local_size": (local, 1, 1)}


def gate_memory(ast: UOp, live: UOp, keep: tuple[UOp, ...] = ()) -> UOp:
    """`ast` with every LOAD and STORE of a global buffer gated by the bool `live` (and by its own gate, where it
    has one): where `live` is false a thread reads nothing (a gated load is 0) and writes nothing. The threads of
    a grid rounded up past the kernel's outputs are stopped this way (`map_to_grid`). The subtrees `keep` are
    left as they are (a BARRIER: what every thread stages before it)."""

    def gate(u: UOp) -> UOp:
        if u.op not in (Ops.LOAD, Ops.STORE) or u.src[0].op is not Ops.DEFINE_GLOBAL:
            return u
        at = 2 if u.op is Ops.LOAD else 3
        if len(u.src) > at:
            both = UOp(Ops.AND, dtypes.bool, (u.src[at], live))
            return u.replace(src=(*u.src[:at], both, *u.src[at + 1:]))
        return u.replace(src=(*u.src, live))

    return rebuild(ast, {k: k for k in keep}, gate)


def _local_ids(locals_: list[UOp], mapping: dict[UOp, UOp]) -> int:
    """The work-group's size: the LOCAL ranges' product, each range mapped (into `mapping`) to its digit of the
    flat local index lidx0."""
    local = prod(r.src[0].arg for r in locals_)
    lflat = UOp(Ops.SPECIAL, INDEX, (), ("lidx0", local))
    stride = local
    for r in locals_:
        n = r.src[0].arg
        stride //= n
        mapping[r] = simplify((lflat // UOp.const(INDEX, stride)) % UOp.const(INDEX, n))
    return local


def _map_to_symbolic_grid(ast: UOp, loops: list[UOp], locals_: list[UOp], max_local: int, max_grid: int
                          ) -> tuple[UOp, dict]:
    """`map_to_grid` for output loops whose ends are dim variables (`tgc.codegen.sizes`): the work-group size is
    a constant (the LOCAL ranges', else `max_local`), the number of work-groups an expression of the dims
    (`launch["grid"]`, evaluated at each launch; `global_size` holds its largest value, at most `max_grid`,
    which the launch checks). Without LOCAL ranges the grid is rounded up and the threads of the partial last
    work-group are gated off (`gate_memory`), as `map_to_grid` does at a prime size."""
    one = UOp.const(INDEX, 1)
    total = one
    for r in loops:
        total = total * r.src[0]
    total = simplify(total)
    mapping: dict[UOp, UOp] = {}
    if locals_:
        local = _local_ids(locals_, mapping)
        groups = total
        gflat = UOp(Ops.SPECIAL, INDEX, (), ("gidx0", min(int(total.vmax), max_grid)))
    else:
        local = max_local
        groups = simplify((total + UOp.const(INDEX, local - 1)) // UOp.const(INDEX, local))
        most = min(-(-int(total.vmax) // local), max_grid)
        gidx = UOp(Ops.SPECIAL, INDEX, (), ("gidx0", most))
        lidx = UOp(Ops.SPECIAL, INDEX, (), ("lidx0", local))
        gflat = (gidx * UOp.const(INDEX, local) + lidx)
        live = gflat < total
    for i, r in enumerate(loops):
        stride = one
        for inner in loops[i + 1:]:
            stride = stride * inner.src[0]
        # `% end` on the outer loop too (a no-op for a live thread, but it bounds the index for the width),
        # unless it is the only loop (gflat itself is bounded by the grid)
        idx = gflat // simplify(stride)
        mapping[r] = simplify(idx if len(loops) == 1 else idx % r.src[0])
    most = min(int(groups.vmax), max_grid)
    out = simplify(substitute(ast, mapping))
    if not locals_:
        out = simplify(gate_memory(out, simplify(live)))
    return out, {"global_size": (most, 1, 1), "local_size": (local, 1, 1), "grid": (groups, one, one)}
