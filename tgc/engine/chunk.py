"""Chunked (micro-batched) runs: a program whose every output is computed independently for each index of
the batch axis runs as several runs on slices of it, so that its intermediates are a fraction of their size.

Separability is the many-devices placement (`tgc.engine.multi.plan`) asked on `c` pretend devices: shard
every input whose declared axis 0 is the dim along axis 0; the program is separable into `c` chunks when the
plan needs no collective step (no all-reduce, no gather), every output stays sharded along axis 0 with the
inputs' bounds, and every chunk's graph is the same one (UOps are interned: equal bounds give identical local
nodes unless something depends on the chunk's position, e.g. an `arange` along the batch axis). Chunk 0's
graph is then the program on one chunk: compiled once, run `c` times on the slices (`Chunking.executable()`,
run by `tgc.engine.executable.run`).

Whether to chunk comes from the memory plans (`choose`): only where the whole program's planned peak is over
`LIMIT` times its inputs+outputs, and only into chunks big enough to keep the kernels efficient
(`MIN_CHUNK_BYTES`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tgc.engine.executable import Executable
from tgc.engine.multi import even_bounds
from tgc.engine.multi import plan as plan_multi
from tgc.engine.realize import buffer_nbytes, writes_in_place
from tgc.engine.schedule import MEMORY_LIMIT
from tgc.ir.shapes import prod, shape_of
from tgc.ir.uop import Ops, UOp

LIMIT = MEMORY_LIMIT  # chunk where the planned peak is over this many times the inputs+outputs (the target)
# each chunk's own data (its slice of the sliced inputs and of the outputs) at least this large: smaller chunks
# leave the kernels too little work per launch, and weights reread (and repacked) per chunk cost more
MIN_CHUNK_BYTES = 1 << 20


@dataclass
class Chunking:
    """How a program runs in chunks: along dim `dim` (size `size`) in `count` chunks of `low` (one chunk's
    program, whose memory plan keeps its outputs apart), slicing the inputs named in `sliced`. `before` and
    `after`: the planned peak bytes unchunked and chunked (the whole inputs and outputs with one chunk's
    intermediates); `io`: the bytes of the inputs and outputs."""

    dim: str
    size: int
    count: int
    low: Executable
    sliced: set[str]
    before: int
    after: int
    io: int

    def executable(self) -> Executable:
        """The chunked run as one executable: `low`'s steps, repeated over the chunks."""
        return self.low.chunked(self.count, self.sliced)

    def line(self) -> str:
        """What DEBUG=2 prints."""
        mib = 1 << 20
        return (f"chunked along {self.dim} into {self.count} chunks of {self.size // self.count}: planned peak "
                f"{self.before / mib:.1f} MiB ({self.before / self.io:.2f}x inputs+outputs) -> "
                f"{self.after / mib:.1f} MiB ({self.after / self.io:.2f}x)")


def host_memory(dev: Any) -> bool:
    """Whether `dev` can run chunked: its buffers are host memory (numpy arrays: a chunk's output is a view of
    the whole one) whose memory plans share slots."""
    features = dev.allocator.features
    return features.host_buffers and features.shared_slots


def batch_dims(decls: list[Any], dims: dict[str, int]) -> list[str]:
    """Dims that are axis 0 of some input and appear at no other axis of any input (candidates to chunk)."""
    out = []
    for name in dims:
        if any(d.shape and d.shape[0] == name for d in decls) and \
                not any(name in d.shape[1:] for d in decls):
            out.append(name)
    return out


def separable(outs: list[UOp], in_bufs: list[UOp], shard: dict[int, int], size: int, count: int
              ) -> list[UOp] | None:
    """Chunk 0's output nodes when the program splits into `count` independent equal chunks along axis 0 of
    the inputs in `shard` (input index -> 0), else None."""
    if count < 2 or size % count or not outs:
        return None
    p = plan_multi(outs, in_bufs, shard, count)
    bounds = even_bounds(size, count)
    if p.steps or any(ax != 0 or b != bounds for ax, b in p.input_bounds.values()):
        return None
    for o in p.outputs:
        if o.axis != 0 or o.bounds != bounds or any(loc is not o.locals[0] for loc in o.locals):
            return None
    return [o.locals[0] for o in p.outputs]


def local_inputs(in_bufs: list[UOp], shard: dict[int, int], count: int) -> list[UOp]:
    """The chunk program's input nodes (as `multi.plan` makes them: a sliced input's BUFFER with 1/count rows)."""
    out = []
    for b in in_bufs:
        idx, name, shape = b.arg
        if idx in shard:
            shape = (shape[0] // count,) + tuple(shape[1:])
        out.append(UOp(Ops.BUFFER, b.dtype, (), (idx, name, tuple(shape))))
    return out


def chunked_peak(low: Executable, whole_io: int) -> int:
    """The planned peak of a chunked run: the whole inputs and outputs, and the slots of one chunk's plan that
    hold neither (its intermediates; every chunk takes the same ones), nor an output written in place in the
    whole output (`realize.writes_in_place`; else it has a slot, copied)."""
    plan = low.memory_plan()
    alloc = low.device.allocator
    io_keys = {key for key, _ in low.inputs} | \
        {key for _, key in low.outputs if writes_in_place(alloc, buffer_nbytes(key))}
    io_slots = {plan.slot_of[k] for k in io_keys if k in plan.slot_of}
    return whole_io + sum(s for i, s in enumerate(plan.slots) if i not in io_slots)


def divisors(n: int, most: int) -> list[int]:
    """The divisors of `n` (a positive int) up to `most`, ascending: O(sqrt(n)) steps (a dim of 2^31 rows is
    46341 of them; trying every count up to `n` took minutes of a first run)."""
    small, large = [], []
    for i in range(1, math.isqrt(n) + 1):
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
    return [d for d in small + large[::-1] if d <= most]


def chunk_counts(decls: list[Any], dims: dict[str, int], outs: list[UOp], in_bufs: list[UOp]
                 ) -> dict[str, list[int]]:
    """For each dim `choose` may chunk along: the chunk counts it allows (divisors of the dim's size, 2 and up,
    whose chunks keep `MIN_CHUNK_BYTES` of sliced inputs and outputs). Dims with no allowed count are left out.
    Needs only the traced graph (no kernels): where it is empty, `choose` returns None whatever the memory plan
    says, so a run need not lower the whole program first to decide (`Program._chunking`)."""
    out: dict[str, list[int]] = {}
    if any(prod(shape_of(o)) == 0 for o in outs):
        return out
    for dim in batch_dims(decls, dims):
        size = dims[dim]
        shard = {i: 0 for i, d in enumerate(decls) if d.shape and d.shape[0] == dim}
        if any(not shape_of(o) or shape_of(o)[0] != size for o in outs):
            continue
        per_row = sum(buffer_nbytes(b) for b in in_bufs if b.arg[0] in shard) + \
            sum(buffer_nbytes(o) for o in outs)
        most = per_row // MIN_CHUNK_BYTES if MIN_CHUNK_BYTES > 0 else size  # (per_row // c >= MIN_CHUNK_BYTES)
        counts = [c for c in divisors(size, most) if c >= 2]
        if counts:
            out[dim] = counts
    return out


def choose(whole: Executable, decls: list[Any], dims: dict[str, int], outs: list[UOp], in_bufs: list[UOp],
           lower_chunk: Callable[[list[UOp], list[tuple[UOp, str]]], Executable]) -> Chunking | None:
    """The chunking to run with, or None. Only where the whole program's planned peak is over `LIMIT` x its
    inputs+outputs; then the fewest equal chunks (a divisor of the dim) that bring it to `LIMIT` or below,
    else the count with the lowest planned peak if lower than unchunked; chunks no smaller than
    `MIN_CHUNK_BYTES` of sliced inputs and outputs. `lower_chunk(outs, inputs)` compiles a chunk's program."""
    io = sum(buffer_nbytes(b) for b in in_bufs) + sum(buffer_nbytes(o) for o in outs)
    if not io or any(prod(shape_of(o)) == 0 for o in outs):
        return None
    before = whole.memory_plan().peak_bytes
    if before <= LIMIT * io:
        return None
    best: Chunking | None = None
    for dim, counts in chunk_counts(decls, dims, outs, in_bufs).items():
        size = dims[dim]
        shard = {i: 0 for i, d in enumerate(decls) if d.shape and d.shape[0] == dim}
        # each chunk count tried costs a compile of the chunk's program: start from the fewest chunks that could
        # reach LIMIT if every intermediate shrank with the chunk (an optimistic bound: weights' packed copies
        # do not), or the most chunks allowed where none could
        reach = [c for c in counts if io + (before - io) / c <= LIMIT * io]
        for count in counts[counts.index(reach[0]) if reach else -1:]:
            local_outs = separable(outs, in_bufs, shard, size, count)
            if local_outs is None:
                continue
            local_in = local_inputs(in_bufs, shard, count)
            names = [decls[b.arg[0]].name for b in local_in]
            low = lower_chunk(local_outs, list(zip(local_in, names)))
            after = chunked_peak(low, io)
            if after < before and (best is None or after < best.after):
                best = Chunking(dim, size, count, low, {decls[i].name for i in shard}, before, after, io)
            if after <= LIMIT * io:
                break
    return best
