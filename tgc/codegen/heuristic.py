"""The hand-coded heuristic as a table of rules (`RULES`) over a kernel's sizes, strides, reuse and the machine's
registers and caches: what `tgc.codegen.opt.hand_coded` applies when no opts are given.

Contract:
- A kernel is first classified (`classify`): "gpu" (any kernel on a GPU), "elementwise" (no reduction),
  "lanes" (an output axis whose split makes vector lanes every reduction load reads contiguously: a convolution
  over packed weights), "matmul" (a reduction with inputs broadcast along output axes: matmul, convolution),
  "strided" (a reduction reading across its contiguous axis), else "plain" (no rule: LLVM's own vectorizer).
- Then every rule of that class whose `when` holds runs its `act`, in table order. A rule reads the kernel's
  facts (`Facts`: sizes, strides, reuse, what earlier rules did) and the machine (`Machine`: vector lanes,
  vector registers, private cache per core, cores), never a program's name or one exact size: a new win is a
  row of the table or a constant of `Machine`, not a branch.
- `decide(k, machine)` applies the table and returns the names of the rules that ran (unit tests check the
  choices for given sizes); each opt a rule applies is checked by `OptKernel.apply` like any other.
"""

from __future__ import annotations

import functools
import glob
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tgc.codegen.opt import Opt, OptKernel, OptOps, _loads, _stride, _try
from tgc.ir.shapes import prod
from tgc.ir.uop import ALU, Ops, RangeKind, UOp


@dataclass(frozen=True)
class Machine:
    """What the rules assume of the machine. `lanes`: f32 lanes of a vector register; `registers`: vector
    registers; `private_cache`: the cache each core has to itself (L2), bytes; `cores`: threads run at once."""

    lanes: int = 16
    registers: int = 32
    private_cache: int = 1 << 20
    cores: int = 1

    @property
    def accumulators(self) -> int:
        """Vectors of accumulators a register tile holds: half the registers (the rest hold operands)."""
        return self.registers // 2

    @property
    def tile_values(self) -> int:
        """Values a register tile computes side by side."""
        return self.accumulators * self.lanes


@functools.cache
def private_cache_bytes() -> int:
    """This machine's per-core (L2) cache in bytes, read from sysfs; 1 MiB where unknown."""
    best = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(f"{path}/level") as f:
                level = int(f.read().strip())
            with open(f"{path}/size") as f:
                text = f.read().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text[:-1] if scale > 1 else text
        if level == 2 and digits.isdigit():
            best = int(digits) * scale
    return best or 1 << 20


def machine_of(device: Any) -> Machine:
    """The `Machine` of a CPU device: widest vector of its caps, this host's L2, the device's cores."""
    widths = device.caps.vector_widths or (16,)
    return Machine(lanes=max(widths) if device.caps.vectors else 16, private_cache=private_cache_bytes(),
                   cores=max(1, int(device.cores or 1)))


@dataclass
class Facts:
    """What the rules read. Sizes are of the kernel as classified (before any rule ran); `done` holds the names
    of the rules that ran so far (a rule may depend on an earlier one's outcome)."""

    kind: str
    machine: Machine
    loops: list[int]  # output loop sizes (0: symbolic)
    reduces: list[int]  # reduction loop sizes (0: symbolic)
    reuse: list[int] = field(default_factory=list)  # output axes some load does not depend on (broadcast)
    out_contiguous: list[int] = field(default_factory=list)  # output axes of stride 1 in the store
    vec_axis: int = -1  # matmul: the output axis made vector lanes
    gathered: bool = False  # matmul: every load along vec_axis is strided (each vector a gather)
    rhs_bytes: int = 0  # matmul over (rows, columns): the bytes of the operand reused across rows
    col_values: int = 0  # matmul: the values of the tile along the columns (set by the rows rule)
    panel_case: bool | None = None  # matmul: the panels rule's condition, as first evaluated
    shared_rhs: bool = False  # matmul: the operand loads along vec_axis read no other output axis (one for all rows)
    done: list[str] = field(default_factory=list)

    @property
    def plain_matmul(self) -> bool:
        """Output axes (batches..., rows, columns), columns last and contiguous, the operand read along them
        (K x N) the same for every row and batch, fixed sizes, not gathered: two axes, or a batch of rows over
        one weight matrix (a batched activation times a weight)."""
        n = len(self.loops)
        return n >= 2 and self.vec_axis == n - 1 and n - 1 in self.reuse and n - 2 in self.reuse and \
            self.shared_rhs and not self.gathered and all(self.loops) and all(self.reduces)


def _size(r: UOp) -> int:
    return r.src[0].arg if r.src[0].op is Ops.CONST else 0


def _first_divisor(n: int, amounts: tuple[int, ...]) -> int:
    return next((a for a in amounts if n and n % a == 0), 0)


def classify(k: OptKernel, machine: Machine) -> Facts:
    """The kernel's class and facts (module docstring)."""
    loops, reduces = k.loops(), k.reduces()
    facts = Facts("plain", machine, [_size(r) for r in loops], [_size(r) for r in reduces])
    if k.device.caps.gpu:
        facts.kind = "gpu"
        return facts
    store = next(u for u in k.ast.toposort() if u.op is Ops.STORE)
    facts.out_contiguous = [i for i, r in enumerate(loops) if _stride(store.src[1], r) == 1]
    if not reduces:
        facts.kind = "elementwise"
        return facts
    loads = _loads(k.ast)
    if lane_axis(k, store) is not None and not _whole_vector_columns(k, store, loads, machine):
        facts.kind = "lanes"
        return facts
    facts.reuse = [i for i, r in enumerate(loops) if _size(r) != 1
                   and any(r not in ld.src[1].toposort() for ld in loads)
                   and any(r in ld.src[1].toposort() for ld in loads)]
    if len(facts.reuse) >= 2 or (facts.reuse and facts.out_contiguous):
        facts.kind = "matmul"
        facts.vec_axis = facts.out_contiguous[0] if facts.out_contiguous else facts.reuse[-1]
        vr = loops[facts.vec_axis]
        facts.gathered = all(isinstance(st := _stride(ld.src[1], vr), int) and st > 1
                             for ld in loads if vr in ld.src[1].toposort())
        on_cols = [ld for ld in loads if vr in ld.src[1].toposort()]
        itemsize = max((ld.dtype.itemsize for ld in on_cols if ld.dtype is not None), default=4)
        facts.rhs_bytes = prod(facts.reduces) * facts.loops[facts.vec_axis] * itemsize
        # (the operands: loads inside the reduction; an epilogue's, such as a residual added after, do not count)
        operands = [ld for ld in on_cols if any(r in ld.src[1].toposort() for r in reduces)]
        facts.shared_rhs = bool(operands) and all(r not in ld.src[1].toposort() for ld in operands
                                                  for i, r in enumerate(loops) if i != facts.vec_axis)
        return facts
    if facts.out_contiguous and not any(_stride(ld.src[1], r) == 1 for ld in loads for r in reduces):
        facts.kind = "strided"
    return facts


def _whole_vector_columns(k: OptKernel, store: UOp, loads: list[UOp], machine: Machine) -> bool:
    """Whether the store's contiguous output axis could be the vector lanes of a plain matmul tile instead of a
    `lane_axis`: two whole vectors divide it, every load inside the reduction that reads it reads it contiguously
    (no gather), some load inside the reduction reads it (a right-hand side's columns), and the reduction is one
    loop (a matmul's, not a window's). Then the lanes'
    stores (each lane to its own row: 16 scattered stores a vector) are not needed: the transposed operand's
    contiguous axis (a `[S, C]` activation read as `C x S`) is broadcast from a line instead (the MLP-Mixer's
    first token matmul, `r_4_512_256_196`: 1415 -> 1089 us single kernel, program_rounds min of 7)."""
    reduces = set(k.reduces())
    if len(reduces) != 1:  # (a convolution's window: its taps reuse the input's lines, the lanes' tile measured
        return False       # 1.2-1.6x faster over U-Net's 64-column images than this one)
    inner = [ld for ld in loads if reduces & set(ld.src[1].toposort())]
    for r in k.loops():
        n = _size(r)
        if not n or n % (2 * machine.lanes) or _stride(store.src[1], r) != 1:
            continue
        on = [ld for ld in inner if r in ld.src[1].toposort()]
        if on and all(_stride(ld.src[1], r) == 1 for ld in on):
            return True
    return False


# ------------------------------------------------------------------------------------ rules with more steps


LANE_TILE = Machine().accumulators  # vectors of accumulators in a lane tile (the rest of the registers hold operands)


def lane_axis(k: OptKernel, store: UOp) -> int | None:
    """An output axis that, split by 16, makes 16 vector lanes that every load inside the reduction either reads
    contiguously or not at all, although the store is not contiguous along it: a convolution's output channels
    over weights packed 16 channels to a vector (tgc/engine/schedule.py `pack_conv_operands`); the input values
    are then broadcast. None where no axis is like that."""
    for i, r in enumerate(k.loops()):
        if r.src[0].op is not Ops.CONST or r.src[0].arg % 16 or _stride(store.src[1], r) == 1:
            continue
        trial = k.copy()
        if not _try(trial, Opt(OptOps.UPCAST, i, 16)):
            continue
        lane = max(trial.ranges(), key=lambda u: u.arg[0])
        inner = [ld for ld in _loads(trial.ast) if any(u.op is Ops.RANGE and u.arg[1] is RangeKind.REDUCE
                                                       for u in ld.src[1].toposort())]
        on_lane = [ld for ld in inner if lane in ld.toposort()]
        if on_lane and all(_stride(ld.src[1], lane) == 1 and (len(ld.src) == 2 or lane not in ld.src[2].toposort())
                           for ld in on_lane):
            return i
    return None


SQUARE_TILE_STEPS = 128  # a lane tile whose input moves a cache line per step takes 4 x 4 from this many steps
LINE_VALUES = 16  # values of a 64-byte cache line (f32)


def one_tap_steps(k: OptKernel, axis: int) -> int:
    """The reduction steps of a lane-tile kernel whose broadcast operand (the loads inside the reduction that do
    not read the lane axis `axis`: a convolution's input) moves by a cache line or more at every reduction step
    (a 1x1 convolution over NCHW input: each step reads the next input channel, H x W values on): the sum of
    the lengths of the reduction loops those loads read. 0 where some reduction loop reads them less than a
    line apart (a window's taps along a row: consecutive taps share lines) or not affinely, or where there is
    no such load."""
    lane = k.loops()[axis]
    reduces = set(k.reduces())
    inputs = [ld for ld in _loads(k.ast) if lane not in ld.src[1].toposort()
              and any(r in reduces for r in ld.src[1].toposort())]
    read: set[UOp] = set()
    for ld in inputs:
        for r in reduces & set(ld.src[1].toposort()):
            st = _stride(ld.src[1], r)
            if st is None or abs(st) < LINE_VALUES:
                return 0
            read.add(r)
    return sum(_size(r) for r in read) if inputs and all(_size(r) for r in read) else 0


def _fill_tile(k: OptKernel, axis: int, store: UOp, want: int, pad: bool = False) -> int:
    """Upcast the image columns (else the other output loops, innermost first) by divisors up to `want`
    (columns with none padded, `_padded_columns`; with `pad`, columns padded wherever that gives a wider tile
    than their divisors) until `want` accumulators per lane vector are reached; the part of `want` left
    unfilled (1: a full tile)."""
    cols = [i for i, r in enumerate(k.loops()) if i != axis and _stride(store.src[1], r) == 1]
    for i in cols + [i for i in range(len(k.loops()) - 1, -1, -1) if i != axis and i not in cols]:
        if want < 2:
            break
        n = k.loops()[i].src[0].arg if k.loops()[i].src[0].op is Ops.CONST else 1
        amt = max((d for d in range(2, want + 1) if n % d == 0), default=0)
        if pad and amt and i in cols:
            t = k.copy()
            wide = _padded_columns(t, i, n, want)
            if wide > amt and _try(t, Opt(OptOps.UPCAST, i, wide)):
                for opt in t.applied[len(k.applied):]:
                    k.apply(opt)
                want //= wide
                continue
        if not amt and i in cols:
            amt = _padded_columns(k, i, n, want)
        if amt and _try(k, Opt(OptOps.UPCAST, i, amt)):
            want //= amt
    return want


def _square_tile(k: OptKernel, axis: int, store: UOp) -> bool:
    """4 lane vectors x 4 columns instead of 2 x 8 (`lane_tile`) where each reduction step's input values come
    from a line of their own (`one_tap_steps` >= SQUARE_TILE_STEPS: a 1x1 convolution over many input
    channels, two such convolutions summed) and the image columns divide by 4 (the 4 columns of a step then
    share one line; 2 columns x 2 image rows read two and measured 5% slower at 14 x 14). Such a step is bound
    by its loads, not its FMAs: 4 + 4 loads per 16 FMAs instead of 2 + 8 (1x1 256 -> 64 at 56 x 56: 1.06 ->
    0.79 ms single-thread; a window's taps read their lines from L1 and gained nothing; 64 input channels lost
    up to 10%). The kernel unchanged where it does not apply."""
    want = LANE_TILE // 4
    cols = [i for i, r in enumerate(k.loops()) if i != axis and _stride(store.src[1], r) == 1
            and _size(r) and _size(r) % want == 0]
    if not cols or not _size(k.loops()[axis]) or _size(k.loops()[axis]) % 4 or \
            one_tap_steps(k, axis) < SQUARE_TILE_STEPS:
        return False
    trial = k.copy()
    if not (_try(trial, Opt(OptOps.UPCAST, axis, 4)) and _try(trial, Opt(OptOps.UPCAST, cols[0], want))):
        return False
    for opt in trial.applied[len(k.applied):]:
        k.apply(opt)
    return True


def lane_tile(k: OptKernel, store: UOp) -> bool:
    """A register tile for kernels with an output axis of vector lanes (`lane_axis`, a convolution over packed
    weights): 16 lanes of that axis, up to 2 vectors of it, and the contiguous output axis (image columns)
    upcast so that LANE_TILE vectors of accumulators are computed side by side. Each step of the reduction
    then loads 2 weight vectors and broadcasts 8 input values into 16 FMAs; more accumulators spill (28 ran
    2.5x slower). A reduction whose input moves a line per step gets 4 vectors x 4 columns (`_square_tile`).
    False (the kernel unchanged) where it does not apply."""
    axis = lane_axis(k, store)
    if axis is None:
        return False
    k.apply(Opt(OptOps.UPCAST, axis, 16))
    if not _square_tile(k, axis, store):
        _vector_tile(k, axis, store)
    # threads split the outermost loop: where the tile left it shorter than the cores (one image, one vector of
    # output channels), the longest loop goes outermost instead
    sizes = [r.src[0].arg if r.src[0].op is Ops.CONST else 0 for r in k.loops()]
    longest = max(range(len(sizes)), key=lambda i: sizes[i], default=0)
    if sizes and sizes[0] < k.device.cores <= sizes[longest]:
        _try(k, Opt(OptOps.SWAP, 0, longest))
    return True


WIDE_TILE_STEPS = 64  # `_vector_tile` takes 4 lane vectors over a reduction of at least this many steps


def _vector_tile(k: OptKernel, axis: int, store: UOp) -> None:
    """2 lane vectors, the image columns filling the rest of the LANE_TILE accumulators (`_fill_tile`). Where
    that tile stays half empty or less (the columns' and rows' largest divisors up to LANE_TILE // 2 leave 2 or
    more of it unfilled: 27 or 111 columns, tiles of 3, 6 accumulators: each step's FMAs wait on their loads),
    the fuller of two other tiles instead: the columns padded to whole tiles (`_padded_columns`: 27 -> 28 in
    tiles of 7, 111 -> 112 in tiles of 8; 14 and 16 accumulators), else twice the lane vectors (4 x 3 = 12)
    where the output channels hold 4 vectors and the reduction has WIDE_TILE_STEPS steps or more (each lane
    vector is stored as 16 values in 16 channel planes; over a first conv's 3 x 3 x 3 = 27 steps the wider
    tile's stores cost more than its FMAs gain: 1.12 -> 1.35 ms for 3 -> 128 channels at 111 x 111). The first
    of them wins a tie."""
    n = k.loops()[axis].src[0].arg

    def tile(vecs: int, pad: bool) -> tuple[OptKernel, int, int]:
        t = k.copy()
        if vecs > 1 and not _try(t, Opt(OptOps.UPCAST, axis, vecs)):
            vecs = 1
        left = _fill_tile(t, axis, store, LANE_TILE // vecs, pad)
        return t, left, prod(o.amount for o in t.applied[len(k.applied):] if o.op is OptOps.UPCAST)

    vecs = 2 if n % 2 == 0 else 1
    best, left, acc = tile(vecs, False)
    if left >= 2:
        choices = [tile(vecs, True)]
        if n % 4 == 0 and prod(_size(r) for r in k.reduces()) >= WIDE_TILE_STEPS:
            choices.append(tile(4, False))
        for t, _, a in choices:
            if a > acc:
                best, acc = t, a
    for opt in best.applied[len(k.applied):]:
        k.apply(opt)


def _padded_columns(k: OptKernel, axis: int, n: int, want: int) -> int:
    """Image columns with no divisor the lane tile takes (13, SqueezeNet's last layers; 2 vectors of accumulators
    left the FMAs waiting on each other): the column loop padded (PADTO: the extra columns' loads and stores gated
    off) to a multiple of the largest tile width up to `want` that adds at most 1/PAD_WASTE of the columns
    (13 -> 14, tiles of 7). The width, or 0 (the kernel unchanged) where none fits."""
    for amt in range(want, 1, -1):
        if n > amt and n % amt and (-n % amt) * PAD_WASTE <= n and _try(k, Opt(OptOps.PADTO, axis, amt)):
            return amt
    return 0


SHORT_ROW = 256  # an elementwise kernel's contiguous innermost loop up to this long is written as vectors
PACK_ROWS = 8  # ... and this many of its rows side by side where the loads continue along an outer axis (transposes)
PACK_ROW_VECTORS = 4  # a packing copy's short row is written whole as up to this many vectors


def short_rows(k: OptKernel, store: UOp) -> None:
    """An elementwise kernel whose innermost loop is short and contiguous for the store and every load on it
    (matmul's packing copy: rows of 32): one 16-wide vector per step. LLVM's loop vectorizer leaves such short
    inner loops mostly scalar (measured up to 20x slower); long loops it vectorizes itself, except where loads
    read a transpose (`_transposed_tile`)."""
    loops = k.loops()
    if len(loops) < 2:
        return
    last = loops[-1]
    n = last.src[0].arg
    if n % 16 or _stride(store.src[1], last) != 1:
        return
    if n > SHORT_ROW:
        _transposed_tile(k, loops)
        return
    loads = [ld for ld in _loads(k.ast) if last in ld.src[1].toposort()]
    if not all(_stride(ld.src[1], last) == 1 for ld in loads):
        # a transpose (the packing copy of a transposed right-hand side, `a @ b.transpose(1, 0)`): every load
        # is contiguous along one outer axis instead. 16 of the row by PACK_ROWS of that axis: LLVM writes the
        # tile with vector loads and shuffles (about 5x faster measured), one value at a time else
        along = [i for i, r in enumerate(loops[:-1])
                 if r.src[0].op is Ops.CONST and loads and all(_stride(ld.src[1], r) == 1 for ld in loads)]
        if along and loops[along[0]].src[0].arg % PACK_ROWS == 0 and _try(k, Opt(OptOps.UPCAST, len(loops) - 1, 16)):
            _try(k, Opt(OptOps.UPCAST, along[0], PACK_ROWS))
        return
    _try(k, Opt(OptOps.UPCAST, len(loops) - 1, 16))
    # an outer axis along which the loads' rows continue (stride n) while the store jumps: the packing copy's
    # column panels. It copies at memory speed written as a plain copy of its source, front to back: each short
    # row whole as vectors (up to PACK_ROW_VECTORS), the outer loops in the source's order (the rows, whose
    # loads jump farther, outside the panels), so the loads stream and each step stores one row of one panel.
    # PACK_ROWS panels side by side per step (the rule before) ran at 20-25 GB/s single-thread against 26-29
    # for this order and for a plain copy (docs/DESIGN.md "Packing copy at memory speed")
    panel = next((i for i, r in enumerate(loops[:-1]) if r.src[0].op is Ops.CONST and loads and
                  all(_stride(ld.src[1], r) == n for ld in loads) and _stride(store.src[1], r) != n), None)
    if panel is None:
        return
    if 1 < n // 16 <= PACK_ROW_VECTORS:
        _try(k, Opt(OptOps.UPCAST, len(loops) - 1, n // 16))
    strides = [[_stride(ld.src[1], r) for ld in loads] for r in loops[:-1]]
    outer = [(max(st), j) for j, st in enumerate(strides) if j > panel and loops[j].src[0].op is Ops.CONST and
             all(isinstance(s, int) and s > n for s in st)]
    if outer:
        _try(k, Opt(OptOps.SWAP, panel, max(outer)[1]))


def _transposed_tile(k: OptKernel, loops: list[UOp]) -> None:
    """A long contiguous store row (LLVM vectorizes it itself) whose other loads read a transpose: each such load
    steps by a row per element along the store's row (a cache line per value, gathered lane by lane) and is
    contiguous along one outer axis instead (a value realized in its readers' order from a transposed one,
    `tgc.engine.schedule._transposed_read`). A tile of 16 of the row by up to PACK_ROWS of that axis (its
    largest divisor among 8, 4, 2): each line loaded gives that many values, and LLVM writes the tile with
    vector loads and shuffles."""
    last = loops[-1]
    moved = [ld for ld in _loads(k.ast) if last in ld.src[1].toposort() and _stride(ld.src[1], last) != 1]
    if not moved:
        return
    # (a load whose index has no constant stride there, such as a join's piece under its gate, does not decide)
    along = [i for i, r in enumerate(loops[:-1]) if r.src[0].op is Ops.CONST
             and any(_stride(ld.src[1], r) == 1 for ld in moved)
             and all(_stride(ld.src[1], r) in (1, None) for ld in moved)]
    if not along:
        return
    size = loops[along[0]].src[0].arg
    amt = next((a for a in (PACK_ROWS, PACK_ROWS // 2, PACK_ROWS // 4) if size % a == 0), 0)
    if amt and _try(k, Opt(OptOps.UPCAST, len(loops) - 1, 16)):
        _try(k, Opt(OptOps.UPCAST, along[0], amt))


LONG_BODY = 256  # ALU ops from which an elementwise kernel's loop body is written as vectors here (`long_body`)


def body_ops(k: OptKernel) -> int:
    """ALU operations in the kernel's body (each node once)."""
    return sum(1 for u in k.ast.toposort() if u.op in ALU)


def long_body(f: Facts, k: OptKernel) -> bool:
    """A compile-size cap, not a speed rule: an elementwise kernel with a long body (a chain of thousands of
    statements, a big fused expression) gets its contiguous innermost output axis as vector lanes here, so that
    LLVM's loop vectorizer, whose time grows with the square of a loop body (a 1900-statement chain: 1.6 s of
    LLVM's 1.7 s; 0.09 s written as vectors, the same machine code size), has nothing left to do."""
    if not f.out_contiguous:
        return False
    axis = f.out_contiguous[-1]
    amt = _first_divisor(f.loops[axis], (f.machine.lanes, f.machine.lanes // 2, f.machine.lanes // 4))
    return bool(amt) and _try(k, Opt(OptOps.UPCAST, axis, amt))


# ---------------------------------------------------------------------------------------------------- the rules
# Each rule: its class, when it applies (over the facts) and what it does (opts on the kernel).


@dataclass(frozen=True)
class Rule:
    name: str
    kind: str
    when: Callable[[Facts, OptKernel], bool]
    act: Callable[[Facts, OptKernel], bool]  # True where it changed the kernel
    models: str  # what the rule models (the reason it exists)


def _gpu_group(f: Facts, k: OptKernel) -> bool:
    n = len(k.loops())
    for j, size in enumerate(f.reduces):
        if size < 256:
            continue
        for amt in (256, 128, 64, 32, 16):
            if size % amt == 0 and _try(k, Opt(OptOps.GROUP, n + j, amt)):
                return True
    return False


GPU_ROW_MIN = 64  # a row shorter than this stays one row per thread
GPU_ROW_PAD_WASTE = 8  # a row is padded to whole work-groups where that adds at most 1/8 of it


def _gpu_row_axis(f: Facts, k: OptKernel) -> int | None:
    """A row reduction on a GPU: the axis (of `k`'s shape) of a reduction of at least GPU_ROW_MIN that some load
    reads contiguously (stride 1), where no load is shared across output axes (not a matmul: each output reads
    its own row). None otherwise."""
    loops, reduces = k.loops(), k.reduces()
    loads = [ld for ld in _loads(k.ast) if ld.src[0].op is Ops.DEFINE_GLOBAL]
    if not loads or not all(f.loops) or any(r not in ld.src[1].toposort() for r in loops if _size(r) > 1
                                            for ld in loads if any(x in ld.src[1].toposort() for x in reduces)):
        return None
    for j in reversed(range(len(reduces))):
        r = reduces[j]
        if _size(r) >= GPU_ROW_MIN and any(_stride(ld.src[1], r) == 1 for ld in loads):
            return len(loops) + j
    return None


def _gpu_rows(f: Facts, k: OptKernel) -> bool:
    """One row per work-group: the GROUP's threads read adjacent elements (coalesced) and combine their partials
    by shuffles or a shared-memory tree (`opt.lower_groups`); a row no power of two >= 32 divides is padded to
    one (PADTO: the extra elements read nothing and add the identity) where that adds little."""
    axis = _gpu_row_axis(f, k)
    if axis is None:
        return False
    size = _size(k.axes()[axis])
    for amt in (256, 128, 64, 32):
        if size % amt == 0 and size >= amt and _try(k, Opt(OptOps.GROUP, axis, amt)):
            return True
    for amt in (256, 128, 64, 32):
        padded = -(-size // amt) * amt
        if size >= amt and (padded - size) * GPU_ROW_PAD_WASTE <= size:
            before = k.copy()
            if _try(k, Opt(OptOps.PADTO, axis, amt)):
                if _try(k, Opt(OptOps.GROUP, axis, amt)):
                    return True
                k.ast, k.applied, k.pads, k.assumptions = before.ast, before.applied, before.pads, before.assumptions
                return False
    return False


GPU_TILE_THREADS = (16, 8)  # threads of a work-group along rows and along columns (16 x 16 first)
GPU_TILE_OUTPUTS = (4, 2)  # outputs a thread computes along each (register blocking: 4 x 4 first)
GPU_STAGE_STEPS = (16, 8)  # reduction steps a tile staged in shared memory holds


def _gpu_tc(f: Facts, k: OptKernel) -> bool:
    """An f16/bf16 matmul on a GPU with tensor cores: TC (a warp per 16 x 8 tile, `mma.sync` with f32
    accumulate), then 4 (or 2) such tiles of columns per warp, which reuse its fragments of A."""
    if not k.device.caps.tensor_cores or not _try(k, Opt(OptOps.TC, 0, 0)):
        return False
    cols = len(k.loops()) - 1
    any(_try(k, Opt(OptOps.UPCAST, cols, n)) for n in (4, 2))
    return True


def _gpu_matmul_axes(k: OptKernel) -> tuple[int, int] | None:
    """(row axis, column axis) of a matmul-like kernel on a GPU: the column axis contiguous in the store, and
    inside the reduction one operand not read along the rows and one not read along the columns (each read by
    many outputs). None otherwise."""
    loops, reduces = k.loops(), k.reduces()
    if len(loops) < 2 or not reduces or not all(_size(r) for r in loops):
        return None
    store = next(u for u in k.ast.toposort() if u.op is Ops.STORE)
    cols = [i for i, r in enumerate(loops) if _stride(store.src[1], r) == 1]
    inner = [ld for ld in _loads(k.ast) if any(r in ld.src[1].toposort() for r in reduces)]
    if not cols or not inner:
        return None
    col = cols[0]
    for row in reversed(range(len(loops))):
        if row == col:
            continue
        rr, cr = loops[row], loops[col]
        if any(rr not in ld.src[1].toposort() for ld in inner) and any(cr not in ld.src[1].toposort()
                                                                       for ld in inner):
            return row, col
    return None


def _gpu_matmul(f: Facts, k: OptKernel) -> bool:
    """A work-group of threads over a tile of rows x columns, each thread a block of outputs (register blocking:
    each operand value loaded feeds several accumulators). The columns' LOCAL digit is the innermost, and each
    thread's columns lie a work-group's width apart, so adjacent threads read adjacent columns (coalesced).
    The largest tile dividing both sizes; none (one output per thread) where none does."""
    axes = _gpu_matmul_axes(k)
    if axes is None:
        return False
    row, col = axes
    rows, cols = _size(k.loops()[row]), _size(k.loops()[col])
    for per in GPU_TILE_OUTPUTS:
        for threads in GPU_TILE_THREADS:
            if rows % (threads * per) or cols % (threads * per):
                continue
            trial = k.copy()
            if all(_try(trial, o) for o in (Opt(OptOps.LOCAL, row, threads), Opt(OptOps.LOCAL, col, threads),
                                             Opt(OptOps.UPCAST, row, per), Opt(OptOps.UPCAST, col, per))):
                k.ast, k.applied, k.pads, k.assumptions = trial.ast, trial.applied, trial.pads, trial.assumptions
                _gpu_stage(k)
                return True
    return False


def _gpu_stage(k: OptKernel) -> bool:
    """The tile's operands through shared memory (STAGE), where the kernel has one reduction loop and a tile of
    GPU_STAGE_STEPS divides it: each operand value is read from global memory once per work-group, not once per
    thread that uses it."""
    reduces = k.reduces()
    if len(reduces) != 1:
        return False
    axis, size = len(k.loops()), _size(reduces[0])
    return any(size % steps == 0 and size > steps and _try(k, Opt(OptOps.STAGE, axis, steps))
               for steps in GPU_STAGE_STEPS)


def _panels_wanted(f: Facts) -> bool:
    """A plain matmul whose reused operand (K x N) is larger than one core's private cache. Without panels the
    threads split the rows, so every core streams the whole operand once per row block: it must fit one
    core's cache, not all cores' together (with panels outermost the threads split the columns instead)."""
    return f.plain_matmul and f.rhs_bytes >= f.machine.private_cache


def _wide_columns(f: Facts) -> bool:
    """Panels are wanted and the columns split into whole panels of 4 vectors, at least `accumulators` of them
    (so the threads each take several), with rows in whole tiles of 4."""
    panel = 4 * f.machine.lanes
    return _panels_wanted(f) and f.loops[-2] % 4 == 0 and f.loops[-1] % panel == 0 and \
        f.loops[-1] >= panel * f.machine.accumulators


COLUMN_PAD_WASTE = 4  # an image row with no vector divisor is padded where that adds at most 1/4 of its columns
WINDOW_TAPS = 25  # a convolution window of at most this many taps (5 x 5) is unrolled under a padded image row


def _columns(f: Facts) -> int:
    """The output axis of vector lanes: matmul's `vec_axis`, else (a strided reduction) the first contiguous one."""
    return f.vec_axis if f.vec_axis >= 0 else (f.out_contiguous[0] if f.out_contiguous else -1)


def _image_rows(f: Facts, k: OptKernel) -> bool:
    """The columns (vec_axis) are one row of an image: the axis before them is read by every operand load that
    reads the columns (a convolution's output rows; a matmul's right-hand side does not read its rows), and
    the store writes the rows one after the other (stride = the column count)."""
    c = _columns(f)
    if c < 1 or not all(f.loops):
        return False
    loops, reduces = k.loops(), k.reduces()
    rows, cols = loops[c - 1], loops[c]
    store = next(u for u in k.ast.toposort() if u.op is Ops.STORE)
    operands = [ld for ld in _loads(k.ast) if cols in (t := ld.src[1].toposort()) and
                (not reduces or any(r in t for r in reduces))]
    return bool(operands) and _stride(store.src[1], rows) == f.loops[c] and \
        all(rows in ld.src[1].toposort() for ld in operands)


def _image_column_pad(f: Facts) -> int:
    """The multiple (a vector, else half of one) to pad an image row to, 0 where none: the row has no divisor
    of lanes/2 or more (14, 7, 13, 28, 55: no whole vectors, or quarter vectors only) and padding adds at most
    1/COLUMN_PAD_WASTE of its columns."""
    n, lanes = f.loops[_columns(f)], f.machine.lanes
    if n % lanes == 0 or n % (lanes // 2) == 0:
        return 0
    return next((amt for amt in (lanes, lanes // 2) if n > amt // 2 and (-n % amt) * COLUMN_PAD_WASTE <= n), 0)


def _padded_image_columns(f: Facts, k: OptKernel) -> bool:
    """Pad the image row to whole vectors (PADTO: the extra columns' stores gated off, their loads clamped) and
    make them the vector lanes, two vectors side by side where the padded row holds an even count of them."""
    amt, c = _image_column_pad(f), _columns(f)
    trial = k.copy()
    if not (_try(trial, Opt(OptOps.PADTO, c, amt)) and _try(trial, Opt(OptOps.UPCAST, c, amt))):
        return False
    left = _size(trial.loops()[c])
    if amt == f.machine.lanes and left and left % 2 == 0:
        _try(trial, Opt(OptOps.UPCAST, c, 2))
    k.ast, k.applied, k.pads, k.assumptions = trial.ast, trial.applied, trial.pads, trial.assumptions
    return True


CHANNEL_ROWS = (8, 4, 2)  # output channels a padded image row's tile takes side by side, widest first


def _channel_axis(f: Facts, k: OptKernel) -> int | None:
    """After `image_columns`: an output axis before the image rows that every operand load reading the columns
    reads only through a division or not at all (a convolution's output channels, which read the input through
    their group: o // (O / groups)), so each loaded image row serves several channels. None where the input is
    read per channel (a depthwise convolution)."""
    loops, reduces = k.loops(), k.reduces()
    cols = loops[_columns(f)]
    operands = [ld for ld in _loads(k.ast) if cols in (t := ld.src[1].toposort()) and any(r in t for r in reduces)]
    found = [i for i in range(_columns(f) - 1) if _size(loops[i]) > 1 and
             all(_only_divided(ld.src[1], loops[i]) for ld in operands)]
    return max(found, key=lambda i: _size(loops[i])) if found else None


def _only_divided(index: UOp, r: UOp) -> bool:
    """`index` reads range `r` nowhere or only as `r // d` (d > 1 a constant): a group of `d` consecutive values of
    `r` reads the same element."""
    users = [u for u in index.toposort() if r in u.src]
    return all(u.op is Ops.IDIV and u.src[0] is r and u.src[1].op is Ops.CONST and u.src[1].arg > 1 for u in users)


def _channel_rows(f: Facts, k: OptKernel) -> bool:
    """Output channels side by side over the padded image row (CHANNEL_ROWS: the widest that divides them, or
    that padding them to adds at most 1/PAD_WASTE)."""
    axis = _channel_axis(f, k)
    if axis is None:
        return False
    n = _size(k.loops()[axis])
    best = next((amt for amt in CHANNEL_ROWS if n % amt == 0), 0)
    for amt in CHANNEL_ROWS:
        if amt <= best:
            break
        if n % amt and (-n % amt) * PAD_WASTE <= n:
            trial = k.copy()
            if _try(trial, Opt(OptOps.PADTO, axis, amt)) and _try(trial, Opt(OptOps.UPCAST, axis, amt)):
                k.ast, k.applied, k.pads, k.assumptions = trial.ast, trial.applied, trial.pads, trial.assumptions
                return True
    return bool(best) and _try(k, Opt(OptOps.UPCAST, axis, best))


LLVM_ROW_VECTORS = 2  # a contiguous row with gates the same along it, of this many vectors or more: LLVM's own loop


def _gated_image_rows(f: Facts, k: OptKernel) -> bool:
    """An elementwise kernel over image rows (`_image_rows`) some of whose loads are gated (a pooling window or
    LRN's neighbouring channels over a padded input): LLVM keeps each gated load a branch, so the loop stays
    scalar (AlexNet's pooled LRN: 130 branches per output). Not where every gate is the same for the whole
    row (it does not read the columns: a concatenation's, by channel), every load reads the row contiguously
    and the row holds LLVM_ROW_VECTORS vectors or more: LLVM vectorizes that loop itself (SqueezeNet's ReLU
    over a concatenation, 128 x 55 x 55: 0.22 -> 0.10 ms left to LLVM; rows of 13 stay scalar there)."""
    if not f.out_contiguous or not _image_rows(f, k):
        return False
    cols = k.loops()[_columns(f)]
    loads = _loads(k.ast)
    gated = [ld for ld in loads if len(ld.src) > 2]
    row_constant = all(cols not in ld.src[2].toposort() for ld in gated)
    contiguous = all(_stride(ld.src[1], cols) in (0, 1) for ld in loads)
    long_row = f.loops[_columns(f)] >= LLVM_ROW_VECTORS * f.machine.lanes
    return bool(gated) and not (row_constant and contiguous and long_row)


def _gated_row_vectors(f: Facts, k: OptKernel) -> bool:
    """The image row padded to whole vectors as in `image_columns` (a row that half a vector divides is left
    to LLVM: a 56-column max pool, its loads at stride 2, measured no faster as vectors of 8)."""
    return bool(_image_column_pad(f)) and _padded_image_columns(f, k)


def _window_taps(f: Facts, k: OptKernel) -> bool:
    """Unroll a convolution's window (the reduction loops after the first, of WINDOW_TAPS taps at most, or all
    of them where the first is the window): each tap's loads then share the row's index math and the padded
    image's gates, and the taps' FMAs go side by side."""
    sizes = [_size(r) for r in k.reduces()]
    taps = [j for j, n in enumerate(sizes) if 1 < n <= WINDOW_TAPS]
    while taps and prod(sizes[j] for j in taps) > WINDOW_TAPS:
        taps = taps[1:]
    changed = False
    for j in taps:
        changed = _try(k, Opt(OptOps.UNROLL, len(k.loops()) + j, sizes[j])) or changed
    return changed


def _vector_axis(f: Facts, k: OptKernel) -> bool:
    amt = _first_divisor(f.loops[f.vec_axis], (f.machine.lanes, f.machine.lanes // 2, f.machine.lanes // 4))
    return bool(amt) and _try(k, Opt(OptOps.UPCAST, f.vec_axis, amt))


def _more_columns(f: Facts, k: OptKernel) -> bool:
    left = _size(k.loops()[f.vec_axis])
    amt = 4 if "wide_columns" in f.done else 2
    return bool(left) and left % 2 == 0 and left >= 8 and _try(k, Opt(OptOps.UPCAST, f.vec_axis, amt))


def _row_axis(f: Facts, k: OptKernel) -> int | None:
    """The output axis the column vectors are reused across: one the loads along the vector axis do not read
    (matmul's rows, a convolution's output channels), else any other reuse axis."""
    vr = k.loops()[f.vec_axis]
    vec_loads = [ld for ld in _loads(k.ast) if vr in ld.src[1].toposort()]
    others = [i for i in f.reuse if i != f.vec_axis and vec_loads and
              all(k.loops()[i] not in ld.src[1].toposort() for ld in vec_loads)] or \
             [i for i in f.reuse if i != f.vec_axis]
    return others[-1] if others else None


def _tile_rows(f: Facts, k: OptKernel) -> int:
    """The rows a register tile wants over the columns upcast so far."""
    up, m = k.unrolled_size(), f.machine
    col_vectors = max(1, up // m.lanes)
    if f.gathered:  # each gathered vector is reused by as many rows as there are registers
        return m.registers // col_vectors
    if up >= m.lanes:  # the accumulators split between the column vectors (at least two of them)
        return m.accumulators // max(2, col_vectors)
    return min(m.registers, m.tile_values // up)  # less than a vector of columns: the tile's values in rows


def _rows(f: Facts, k: OptKernel) -> bool:
    axis = _row_axis(f, k)
    if axis is None:
        return False
    f.col_values = k.unrolled_size()
    rows = _tile_rows(f, k)
    for amt in (32, 16, 8, 4, 2):
        if amt <= rows and _size(k.loops()[axis]) % amt == 0:
            if amt < rows and _padded_rows_amount(f, k) > amt:
                return False  # a fuller tile by padding a few rows (196 -> 200 in tiles of 8): padded_rows
            if _try(k, Opt(OptOps.UPCAST, axis, amt)):
                return True
    return False


PAD_WASTE = 8  # an odd row axis is padded to whole tiles where that adds at most 1/PAD_WASTE of its rows


def _padded_rows_amount(f: Facts, k: OptKernel) -> int:
    """The tile's rows (a power of two) to pad an odd row axis to, 0 where none fits: the rows rule found no
    divisor, the axis is long enough that the padding wastes at most 1/PAD_WASTE of it."""
    axis = _row_axis(f, k)
    if axis is None or "rows" in f.done or not {"vector_axis", "image_columns"} & set(f.done) or not f.col_values:
        return 0
    n = _size(k.loops()[axis])
    want = _tile_rows(f, k)
    for amt in (32, 16, 8, 4):
        if amt <= want and n and n % amt and (-n % amt) * PAD_WASTE <= n:
            return amt
    return 0


def _padded_rows(f: Facts, k: OptKernel) -> bool:
    amt, axis = _padded_rows_amount(f, k), _row_axis(f, k)
    if not amt or axis is None:
        return False
    trial = k.copy()
    if not (_try(trial, Opt(OptOps.PADTO, axis, amt)) and _try(trial, Opt(OptOps.UPCAST, axis, amt))):
        return False
    k.apply(Opt(OptOps.PADTO, axis, amt))
    k.apply(Opt(OptOps.UPCAST, axis, amt))
    return True


PANEL_TILES_PER_CORE = 4  # column panels each core takes at least (panels outermost: the threads split them)


def panel_tiles_min(machine: Machine) -> int:
    """The column tiles a matmul needs for panels outermost: `PANEL_TILES_PER_CORE` per core (the threads
    split the panels, so fewer leave cores idle or unbalanced), at most `accumulators` (the old threshold, kept
    where the cores are many)."""
    return min(machine.accumulators, PANEL_TILES_PER_CORE * machine.cores)


def _panel_case(f: Facts, k: OptKernel) -> bool:
    """Panels are wanted, the tile's rows are the axis before the columns and at least `panel_tiles_min`
    column tiles are left (evaluated once, before the panels rule changes the kernel). With fewer column
    tiles than that the rows stay outermost, and every row block streams the whole operand from the shared
    cache (a 1536 x 384 operand, 12 tiles of 32 columns: 106 -> 165 GFLOP/s single-thread with panels)."""
    if f.panel_case is None:
        f.panel_case = _panels_wanted(f) and _size(k.loops()[f.vec_axis]) >= panel_tiles_min(f.machine) and \
            _row_axis(f, k) == f.vec_axis - 1
    return f.panel_case


def _unroll2(f: Facts, k: OptKernel) -> bool:
    return _try(k, Opt(OptOps.UNROLL, len(k.loops()), 2))


def _panels(f: Facts, k: OptKernel) -> bool:
    return _try(k, Opt(OptOps.SWAP, 0, f.vec_axis))


def _narrow_rows(f: Facts, k: OptKernel) -> bool:
    col = 0 if "panels" in f.done else f.vec_axis
    changed = _try(k, Opt(OptOps.UPCAST, col, 4)) or _try(k, Opt(OptOps.UPCAST, col, 2))
    if k.reduces() and _size(k.reduces()[0]) % 4 == 0:
        changed = _try(k, Opt(OptOps.UNROLL, len(k.loops()), 4)) or changed
    return changed


def _strided_outputs(f: Facts, k: OptKernel) -> bool:
    i = f.out_contiguous[0]
    amt = _first_divisor(f.loops[i], (f.machine.lanes, f.machine.lanes // 2, f.machine.lanes // 4))
    return bool(amt) and _try(k, Opt(OptOps.UPCAST, i, amt))


def _lanes(f: Facts, k: OptKernel) -> bool:
    return lane_tile(k, next(u for u in k.ast.toposort() if u.op is Ops.STORE))


def _short_rows(f: Facts, k: OptKernel) -> bool:
    before = len(k.applied)
    short_rows(k, next(u for u in k.ast.toposort() if u.op is Ops.STORE))
    return len(k.applied) > before


RULES: tuple[Rule, ...] = (
    Rule("gpu_tc", "gpu", lambda f, k: True, _gpu_tc,
         "an f16/bf16 matmul on scalar FMAs leaves the tensor cores idle: mma.sync m16n8k16 a warp per 16 x 8 "
         "tile, f32 accumulate (sm_80+)"),
    Rule("gpu_group", "gpu", lambda f, k: "gpu_tc" not in f.done and all(f.loops) and prod(f.loops) <= 4096
         and max(f.reduces, default=0) >= 256,
         _gpu_group,
         "a long reduction into few outputs leaves most of a GPU idle: a work-group shares each reduction"),
    Rule("gpu_matmul", "gpu", lambda f, k: "gpu_group" not in f.done and "gpu_tc" not in f.done, _gpu_matmul,
         "one output per thread loads each operand value once per output: a work-group over a tile of rows x "
         "columns, each thread a 4 x 4 block of outputs (register blocking), adjacent threads on adjacent columns, "
         "the operands' tiles staged in shared memory (STAGE, 16 reduction steps a tile)"),
    Rule("gpu_rows", "gpu", lambda f, k: not {"gpu_group", "gpu_matmul", "gpu_tc"} & set(f.done), _gpu_rows,
         "a row reduction with one row per thread reads the rows uncoalesced (adjacent threads a row apart): one "
         "row per work-group, its threads reading adjacent elements and combining by warp shuffles or a "
         "shared-memory tree"),
    Rule("short_rows", "elementwise", lambda f, k: True, _short_rows,
         "LLVM's loop vectorizer leaves short contiguous inner loops (<= SHORT_ROW) mostly scalar: write them as "
         "vectors; a transpose's tile or a panel copy's rows side by side (`short_rows`); a long row read from a "
         "transpose is tiled too (`_transposed_tile`)"),
    Rule("long_body", "elementwise", lambda f, k: "short_rows" not in f.done and body_ops(k) >= LONG_BODY, long_body,
         "LLVM's loop vectorizer takes time growing with the square of a loop body: a long elementwise body is "
         "written as vectors here (`long_body`: a compile-time cap)"),
    Rule("gated_rows", "elementwise", lambda f, k: not {"short_rows", "long_body"} & set(f.done)
         and _gated_image_rows(f, k), _gated_row_vectors,
         "an elementwise kernel over image rows with gated loads (a pool, LRN over a padded input) stays scalar, a "
         "branch per load: the row as vectors, padded where no vector divides it (AlexNet's LRN 19 -> 10 ms median)"),
    Rule("lane_tile", "lanes", lambda f, k: True, _lanes,
         "weights packed a vector of channels per element: channels as lanes, inputs broadcast, a tile of "
         "`accumulators` vectors (`lane_tile`; image columns with no divisor padded to whole tiles)"),
    # matmul-like kernels: a register tile of `accumulators` vectors, columns as lanes, rows reusing them
    Rule("wide_columns", "matmul", lambda f, k: _wide_columns(f), lambda f, k: True,
         "operand too large for the private caches: 4 vectors of columns x 4 rows (the same accumulators as "
         "2 x 8) so the left-hand side, streamed from the shared cache, passes once per 4 vectors of columns"),
    Rule("image_columns", "matmul", lambda f, k: not f.gathered and _image_rows(f, k) and bool(_image_column_pad(f)),
         _padded_image_columns,
         "an image row with no divisor of half a vector (14, 7, 28 columns: a grouped or unpacked convolution) ran "
         "as 2 or 4 lanes at 10-30 GFLOP/s: padded to whole vectors (PADTO, at most 1/COLUMN_PAD_WASTE more), "
         "two of them side by side where they fit"),
    Rule("vector_axis", "matmul", lambda f, k: "image_columns" not in f.done, _vector_axis,
         "the contiguous output axis as vector lanes (the widest vector dividing it)"),
    Rule("more_columns", "matmul", lambda f, k: not f.gathered and "image_columns" not in f.done, _more_columns,
         "a second vector of columns (4 with wide columns): independent accumulators hide the FMA latency"),
    Rule("channel_rows", "matmul", lambda f, k: "image_columns" in f.done, _channel_rows,
         "a padded image row reused across output channels that read the input through their group (a grouped "
         "or unpacked convolution): up to 8 channels side by side (the image rows instead measured 1.7x slower)"),
    Rule("rows", "matmul", lambda f, k: "channel_rows" not in f.done, _rows,
         "the column vectors reused across rows, as many as the accumulators left (all registers for gathered "
         "vectors, the tile's values when the columns took less than a vector); a divisor smaller than that "
         "yields to padded_rows where padding fills the tile (196 rows: 4 -> 8 by padding to 200)"),
    Rule("padded_rows", "matmul", lambda f, k: "channel_rows" not in f.done, _padded_rows,
         "rows with no divisor the tile takes (an odd count: 197 tokens, 77): the row loop padded to whole tiles "
         "(PADTO: the index clamped below the stores, the extra rows' stores gated off) where that adds at most "
         "1/PAD_WASTE of the rows; one row at a time (narrow_rows) measured 2.3x slower at 77 rows"),
    Rule("window_taps", "matmul", lambda f, k: "image_columns" in f.done and len(f.reduces) >= 2, _window_taps,
         "a short convolution window (3 x 3, a depthwise convolution's whole reduction) as loops around a padded "
         "row recomputes the row's gates and index math per tap: unrolled (at most WINDOW_TAPS taps)"),
    Rule("unroll2", "matmul", lambda f, k: _row_axis(f, k) is not None and f.col_values < f.machine.lanes
         and not f.gathered and bool(f.reduces) and f.reduces[0] % 2 == 0 and "padded_rows" not in f.done, _unroll2,
         "a tile of less than a vector of columns does little per loop step: two steps of the outer reduction "
         "per iteration (a convolution's input channels)"),
    Rule("panels", "matmul", _panel_case, _panels,
         "operand too large for the private caches: column panels outermost, so each stays in cache while "
         "every row block passes over it (rows outermost stream the whole operand once per row block); from "
         "`panel_tiles_min` column tiles (4 per core), as many as the threads can share"),
    Rule("narrow_rows", "matmul", lambda f, k: _panel_case(f, k) and "rows" not in f.done
         and "padded_rows" not in f.done, _narrow_rows,
         "rows with no divisor the tile takes: one row at a time, so 4 times the columns and 4 reduction steps "
         "per iteration keep the accumulators busy"),
    # the same three for a strided reduction over image rows (a convolution whose weight folded to a constant)
    Rule("strided_image_columns", "strided", lambda f, k: _image_rows(f, k) and bool(_image_column_pad(f)),
         _padded_image_columns, "image_columns for a strided reduction"),
    Rule("strided_channel_rows", "strided", lambda f, k: "strided_image_columns" in f.done, _channel_rows,
         "channel_rows for a strided reduction"),
    Rule("strided_window_taps", "strided", lambda f, k: "strided_image_columns" in f.done and len(f.reduces) >= 2,
         _window_taps, "window_taps for a strided reduction"),
    Rule("strided_outputs", "strided", lambda f, k: "strided_image_columns" not in f.done, _strided_outputs,
         "a reduction across its strided axis: contiguous outputs computed side by side as vector lanes"),
)


def hand_coded(k: OptKernel) -> None:
    """The hand-coded heuristic (what `tgc.codegen.opt.apply_opts` runs without opts): the table on this
    machine."""
    decide(k)


def decide(k: OptKernel, machine: Machine | None = None) -> list[str]:
    """Apply the rules to `k`; the names of those that ran (changed the kernel, or chose a variant)."""
    facts = classify(k, machine or machine_of(k.device))
    for rule in RULES:
        if rule.kind == facts.kind and rule.when(facts, k) and rule.act(facts, k):
            facts.done.append(rule.name)
    return facts.done


def rule_names() -> list[str]:
    return [r.name for r in RULES]


__all__ = ["CHANNEL_ROWS", "COLUMN_PAD_WASTE", "LANE_TILE", "LINE_VALUES", "LLVM_ROW_VECTORS", "SQUARE_TILE_STEPS",
           "WINDOW_TAPS", "LONG_BODY", "RULES", "Facts", "Machine",
           "Rule", "body_ops", "classify", "decide", "hand_coded", "lane_axis", "lane_tile", "long_body",
           "machine_of", "one_tap_steps", "panel_tiles_min", "private_cache_bytes", "rule_names", "short_rows"]
