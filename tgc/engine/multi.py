"""Many devices: one traced program sharded across a list of devices (tinygrad's multi tensors).

`plan(outputs, inputs, shard, n)` walks the device-neutral tensor graph once and gives every node a
placement: replicated (each device holds the whole value) or sharded along one axis (device d holds rows
`bounds[d]`). Each node also gets one *local* node per device: the same op on the device's part. Where the
placement cannot be kept the plan inserts a collective step and continues from its result:

- a reduction over the sharded axis reduces each shard locally, then **all-reduces** (a ring, below);
- a movement op that would split the sharded axis, or an op mixing shards of different axes, **gathers**
  first (each device receives every other shard; DEBUG=2 says so).

The result (`MultiPlan`) is a list of collective steps, each with the local node every device must realize
before it, and the outputs' local nodes. `Program.lower_multi` compiles each device's local graphs through the
ordinary single-device pipeline, and `build_executable` makes them one `Executable` (each device's launches,
copies and collectives over each device's planned buffers), which `tgc.engine.executable.run`/`bench` run.

Device-to-device copies go through one function, `copy_between`: direct where both devices offer it
(`copy_to`), else staged through host memory. Every copy is counted per device (`Transfers`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tgc import profile
from tgc.dtype import DType, bf16_to_f32, dtypes, f32_to_bf16
from tgc.engine.realize import Collective, Copy, Executable, InputPart, Launch, OutputPart, buffer_type
from tgc.env import debug_level
from tgc.ir.alu import reducer
from tgc.ir.shapes import prod, shape_of
from tgc.ir.uop import ALU, Ops, UOp

Bounds = tuple[tuple[int, int], ...]


def even_bounds(size: int, n: int) -> Bounds:
    """`size` rows over `n` devices, the first `size % n` one row longer (shards differ by at most one row)."""
    q, r = divmod(size, n)
    out, start = [], 0
    for d in range(n):
        end = start + q + (1 if d < r else 0)
        out.append((start, end))
        start = end
    return tuple(out)


@dataclass
class Placed:
    """A node's placement: `axis` None (replicated) or the sharded axis with each device's rows."""

    axis: int | None
    bounds: Bounds | None
    locals: list[UOp]  # one per device


@dataclass
class Step:
    """A collective: `kind` "allreduce" (arg: the reduce op) or "gather" (arg: (axis, bounds)). Device d
    realizes `srcs[d]`; afterwards its buffers `outs[d]` (BUFFER nodes) hold the result."""

    kind: str
    arg: Any
    srcs: list[UOp]
    outs: list[list[UOp]]


@dataclass
class MultiPlan:
    n: int
    steps: list[Step]
    outputs: list[Placed]
    input_bounds: dict[int, tuple[int, Bounds]]  # input index -> (axis, bounds) of a sharded input
    notes: list[str] = field(default_factory=list)  # what DEBUG=2 prints (gathers)


_BUF_BASE = 1 << 20  # collective results' BUFFER indices start here (program inputs count from 0)


def plan(outputs: list[UOp], inputs: list[UOp], shard: dict[int, int], n: int) -> MultiPlan:
    """Place every node of `outputs` on `n` devices; `shard` maps an input's index to its sharded axis (the
    caller checked the axis and that its size is at least `n`)."""
    placed: dict[UOp, Placed] = {}
    steps: list[Step] = []
    notes: list[str] = []
    input_bounds: dict[int, tuple[int, Bounds]] = {}

    def new_buffer(dtype: DType, shape: tuple[int, ...], tag: str) -> UOp:
        return UOp(Ops.BUFFER, dtype, (), (_BUF_BASE + len(steps), tag, tuple(shape)))

    def gather(node: UOp, p: Placed, why: str) -> Placed:
        """Every device receives every shard into one whole buffer (a collective step)."""
        assert p.axis is not None and p.bounds is not None
        notes.append(f"gather {node.dtype.name}{list(shape_of(node))} sharded on axis {p.axis}: {why}")
        buf = new_buffer(node.dtype, shape_of(node), f"_gather{len(steps)}")
        steps.append(Step("gather", (p.axis, p.bounds), list(p.locals), [[buf] for _ in range(n)]))
        return Placed(None, None, [buf] * n)

    def replicated(node: UOp) -> Placed:
        p = placed[node]
        return p if p.axis is None else gather(node, p, "needed whole")

    def local_part(node: UOp, p: Placed, axis: int, bounds: Bounds, d: int) -> UOp:
        """Device d's rows `bounds[d]` of `node` (placed as `p`) along `axis`."""
        if p.axis == axis and p.bounds == bounds:
            return p.locals[d]
        assert p.axis is None
        shp = shape_of(node)
        s, e = bounds[d]
        narrowed = narrow(p.locals[d], axis, bounds, d)
        if narrowed is not None:
            return narrowed
        return UOp(Ops.SHRINK, node.dtype, (p.locals[d],),
                   tuple((s, e) if i == axis else (0, x) for i, x in enumerate(shp)))

    def narrow(local: UOp, axis: int, bounds: Bounds, d: int) -> UOp | None:
        """A broadcast along the axis expanded less instead of sliced: an EXPAND from size 1 there, also
        through further EXPANDs and RESHAPEs that keep the axes up to it (a batched matmul's broadcast weight:
        reshape, expand, reshape, expand). None: not a broadcast along the axis."""
        shp = shape_of(local)
        if local.op is Ops.EXPAND:
            src = local.src[0]
            inner = src if shape_of(src)[axis] == 1 else narrow(src, axis, bounds, d)
            if inner is not None:
                return UOp(Ops.EXPAND, local.dtype, (inner,), sized(shp, axis, bounds, d))
        elif local.op is Ops.RESHAPE:
            src = local.src[0]
            if len(shape_of(src)) > axis and shape_of(src)[:axis + 1] == shp[:axis + 1]:
                inner = narrow(src, axis, bounds, d)
                if inner is not None:
                    return UOp(Ops.RESHAPE, local.dtype, (inner,), sized(shp, axis, bounds, d))
        return None

    def sized(shape: tuple[int, ...], axis: int, bounds: Bounds, d: int, scale: int = 1) -> tuple[int, ...]:
        s, e = bounds[d]
        return tuple((e - s) * scale if i == axis else x for i, x in enumerate(shape))

    for out in outputs:
        for node in out.toposort():
            if node in placed:
                continue
            op, arg = node.op, node.arg
            if op is Ops.BUFFER:
                idx = arg[0]
                if idx in shard:
                    ax = shard[idx]
                    bounds = even_bounds(arg[2][ax], n)
                    input_bounds[idx] = (ax, bounds)
                    placed[node] = Placed(ax, bounds, [
                        UOp(Ops.BUFFER, node.dtype, (), (idx, arg[1], sized(arg[2], ax, bounds, d)))
                        for d in range(n)])
                else:
                    placed[node] = Placed(None, None, [node] * n)
                continue
            if op in (Ops.CONST, Ops.IOTA):
                placed[node] = Placed(None, None, [node] * n)
                continue
            srcs = [placed[s] for s in node.src]
            sharded = [(s, p) for s, p in zip(node.src, srcs) if p.axis is not None]
            if not sharded:
                placed[node] = Placed(None, None, [
                    UOp(op, node.dtype, tuple(p.locals[d] for p in srcs), arg) for d in range(n)])
                continue
            if op is Ops.GATHER:  # reads its values at data-dependent places: computed whole on every device
                srcs = [replicated(s) for s in node.src]
                placed[node] = Placed(None, None, [
                    UOp(op, node.dtype, tuple(p.locals[d] for p in srcs), arg) for d in range(n)])
                continue
            if op in ALU or op in (Ops.CAST, Ops.BITCAST, Ops.CONTIGUOUS):
                first = sharded[0][1]
                if any((p.axis, p.bounds) != (first.axis, first.bounds) for _, p in sharded):
                    srcs = [replicated(s) for s in node.src]
                    placed[node] = Placed(None, None, [
                        UOp(op, node.dtype, tuple(p.locals[d] for p in srcs), arg) for d in range(n)])
                    continue
                ax, bounds = first.axis, first.bounds
                assert ax is not None and bounds is not None
                full = shape_of(node)
                locs = []
                for d in range(n):
                    parts = []
                    for s, p in zip(node.src, srcs):
                        if p.axis is None and shape_of(s) != full:  # a scalar operand: used as is
                            parts.append(p.locals[d])
                        else:
                            parts.append(local_part(s, p, ax, bounds, d))
                    locs.append(UOp(op, node.dtype, tuple(parts), arg))
                placed[node] = Placed(ax, bounds, locs)
                continue
            # movement and reduction ops have one source
            src, p = node.src[0], srcs[0]
            ax, bounds = p.axis, p.bounds
            assert ax is not None and bounds is not None
            in_shape, out_shape = shape_of(src), shape_of(node)
            keep: tuple[int, Bounds, list[UOp]] | None = None
            why = ""
            if op is Ops.PERMUTE:
                keep = (arg.index(ax), bounds, [UOp(op, node.dtype, (p.locals[d],), arg) for d in range(n)])
            elif op is Ops.EXPAND:
                keep = (ax, bounds, [UOp(op, node.dtype, (p.locals[d],), sized(arg, ax, bounds, d))
                                     for d in range(n)])
            elif op is Ops.RESHAPE:
                keep = _reshape(node, p, in_shape, out_shape, n)
                why = f"reshape {list(in_shape)} -> {list(out_shape)} splits the sharded axis"
            elif op is Ops.PAD:
                if arg[0][ax] == (0, 0):
                    keep = (ax, bounds, [UOp(op, node.dtype, (p.locals[d],), arg) for d in range(n)])
                why = "pad along the sharded axis"
            elif op is Ops.SHRINK:
                if arg[ax] == (0, in_shape[ax]):
                    keep = (ax, bounds, [UOp(op, node.dtype, (p.locals[d],),
                                             tuple((0, e - s) if i == ax else r for i, (r, (s, e)) in
                                                   enumerate(zip(arg, [bounds[d]] * len(arg)))))
                                         for d in range(n)])
                why = "slice along the sharded axis"
            elif op is Ops.FLIP:
                if not arg[ax]:
                    keep = (ax, bounds, [UOp(op, node.dtype, (p.locals[d],), arg) for d in range(n)])
                why = "flip along the sharded axis"
            elif op is Ops.STRIDE:
                if arg[ax] == 1:
                    keep = (ax, bounds, [UOp(op, node.dtype, (p.locals[d],), arg) for d in range(n)])
                why = "stride along the sharded axis"
            elif op is Ops.WINDOW:
                if arg[0] != ax:
                    keep = (ax + (1 if ax > arg[0] else 0), bounds,
                            [UOp(op, node.dtype, (p.locals[d],), arg) for d in range(n)])
                why = "window along the sharded axis"
            elif op is Ops.REDUCE_AXIS:
                locs = [UOp(op, node.dtype, (p.locals[d],), arg) for d in range(n)]
                if ax not in arg[1]:
                    keep = (ax, bounds, locs)
                else:  # each shard reduces its rows, then the partial results are all-reduced
                    buf = new_buffer(node.dtype, out_shape, f"_allreduce{len(steps)}")
                    steps.append(Step("allreduce", arg[0], locs, [[buf] for _ in range(n)]))
                    placed[node] = Placed(None, None, [buf] * n)
                    continue
            if keep is not None:
                placed[node] = Placed(keep[0], keep[1], keep[2])
                continue
            g = gather(src, p, why or f"{op.name} of a sharded value")
            placed[node] = Placed(None, None, [UOp(op, node.dtype, (g.locals[d],), arg) for d in range(n)])
    return MultiPlan(n, steps, [placed[o] for o in outputs], input_bounds, notes)


def _reshape(node: UOp, p: Placed, src: tuple[int, ...], dst: tuple[int, ...], n: int
             ) -> tuple[int, Bounds, list[UOp]] | None:
    """Where a reshape keeps the sharded axis whole (or merges it with the axes after it, or splits it at shard
    boundaries): the new axis, bounds and local reshapes. None: it cannot (the caller gathers)."""
    ax, bounds = p.axis, p.bounds
    assert ax is not None and bounds is not None
    before = prod(src[:ax])
    for b in range(len(dst)):
        if prod(dst[:b]) != before or dst[b] == 1:
            continue
        if dst[b] % src[ax] == 0:  # kept whole, or merged with the following axes
            inner = dst[b] // src[ax]
            k = ax + 1
            while k <= len(src) and prod(src[ax + 1:k]) < inner:
                k += 1
            if prod(src[ax + 1:k]) != inner:
                continue
            nb = tuple((s * inner, e * inner) for s, e in bounds)
        elif src[ax] % dst[b] == 0:  # split into this axis and the following ones
            inner = src[ax] // dst[b]
            k = b + 1
            while k <= len(dst) and prod(dst[b + 1:k]) < inner:
                k += 1
            if prod(dst[b + 1:k]) != inner or any(s % inner or e % inner for s, e in bounds):
                continue
            nb = tuple((s // inner, e // inner) for s, e in bounds)
        else:
            continue
        locs = [UOp(Ops.RESHAPE, node.dtype, (p.locals[d],),
                    tuple(nb[d][1] - nb[d][0] if i == b else x for i, x in enumerate(dst))) for d in range(n)]
        return b, nb, locs
    return None


# --- copies and collectives

@dataclass
class Transfers:
    """Bytes each device sent and received, and copies made (for DEBUG=2, `tgc bench` and the tests)."""

    sent: list[int]
    received: list[int]
    copies: int = 0
    seconds: float = 0.0

    @classmethod
    def for_devices(cls, n: int) -> Transfers:
        return cls([0] * n, [0] * n)


def _read(dev: Any, handle: Any, offset: int, nbytes: int, total: int) -> np.ndarray:
    """Bytes offset .. offset + nbytes of a `total`-byte buffer: a ranged copy where the allocator has one
    (host memory), else the whole buffer through host memory."""
    out = np.empty(nbytes, dtype=np.uint8)
    alloc = dev.allocator
    if alloc.features.ranged_copies:
        alloc.copyout_range(memoryview(out), handle, offset)
        return out
    whole = np.empty(total, dtype=np.uint8)
    alloc.copyout(memoryview(whole), handle)
    out[:] = whole[offset:offset + nbytes]
    return out


def _write(dev: Any, handle: Any, offset: int, data: np.ndarray, total: int) -> None:
    alloc = dev.allocator
    if alloc.features.ranged_copies:
        alloc.copyin_range(handle, offset, memoryview(data))
        return
    if offset == 0 and data.nbytes == total:
        alloc.copyin(handle, memoryview(data))
        return
    whole = np.empty(total, dtype=np.uint8)
    alloc.copyout(memoryview(whole), handle)
    whole[offset:offset + data.nbytes] = data
    alloc.copyin(handle, memoryview(whole))


def copy_between(src_dev: Any, src_handle: Any, dst_dev: Any, dst_handle: Any, nbytes: int, src_offset: int = 0,
                 dst_offset: int = 0, stats: Transfers | None = None, ids: tuple[int, int] | None = None,
                 sizes: tuple[int, int] | None = None) -> None:
    """Copy `nbytes` from one device's buffer to another's: directly where the source device offers
    `copy_to(src_handle, dst_dev, dst_handle, nbytes, src_offset, dst_offset)` and accepts, else through host
    memory. `ids` (the devices' positions in the list) is where `stats` counts the bytes; `sizes` the two
    buffers' sizes (default: `nbytes` past each offset), for allocators without ranged copies."""
    if nbytes <= 0:
        return
    src_size, dst_size = sizes or (src_offset + nbytes, dst_offset + nbytes)
    if not (src_dev.runtime.direct_copies and
            src_dev.copy_to(src_handle, dst_dev, dst_handle, nbytes, src_offset, dst_offset)):
        _write(dst_dev, dst_handle, dst_offset, _read(src_dev, src_handle, src_offset, nbytes, src_size), dst_size)
    if stats is not None and ids is not None and ids[0] != ids[1]:
        stats.sent[ids[0]] += nbytes
        stats.received[ids[1]] += nbytes
        stats.copies += 1
    if debug_level() >= 3:
        print(f"*** copy {nbytes} bytes {src_dev.name} -> {dst_dev.name}", file=sys.stderr)


@dataclass
class Move:
    """One copy of a collective step: `nbytes` from device `src` (at `src_offset` of its `src_size`-byte
    buffer) to device `dst` (at `dst_offset` of its `dst_size`-byte buffer); devices by list position."""

    src: int
    dst: int
    src_offset: int
    dst_offset: int
    nbytes: int
    src_size: int
    dst_size: int


def copy_step(devices: list[Any], src_handles: list[Any], dst_handles: list[Any], moves: list[Move],
              stats: Transfers) -> None:
    """The copies of one collective step. Where every device involved is of one class that offers
    `copy_batch(devices, src_handles, dst_handles, moves) -> bool` (one round trip for the whole step, e.g.
    between REMOTE servers) and it accepts, that does them; else `copy_between` each."""
    cls = type(devices[0])
    done = (cls.runtime.batched_copies and all(type(devices[m.src]) is cls and type(devices[m.dst]) is cls
                                               for m in moves)
            and cls.copy_batch(devices, src_handles, dst_handles, moves))
    for m in moves:
        if done:
            if m.src != m.dst and m.nbytes > 0:
                stats.sent[m.src] += m.nbytes
                stats.received[m.dst] += m.nbytes
                stats.copies += 1
        else:
            copy_between(devices[m.src], src_handles[m.src], devices[m.dst], dst_handles[m.dst], m.nbytes,
                         m.src_offset, m.dst_offset, stats, (m.src, m.dst), (m.src_size, m.dst_size))


REDUCE_OPS = {"sum": Ops.ADD, "prod": Ops.MUL, "max": Ops.MAX, "min": None}


def _combine(op: Ops | str, dtype: DType, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a op b elementwise on raw bytes of `dtype` (the ALU table's reducers; min is minimum / and: nan wins)."""
    if dtype == dtypes.bf16:
        x, y = bf16_to_f32(a.view(np.uint16)), bf16_to_f32(b.view(np.uint16))
        return f32_to_bf16(_combine(op, dtypes.f32, x.view(np.uint8), y.view(np.uint8)).view(np.float32)).view(
            np.uint8)
    x, y = a.view(dtype.np), b.view(dtype.np)
    if op == "min":
        fn = np.logical_and if dtype.is_bool else np.minimum
    else:
        fn, _ = reducer(REDUCE_OPS.get(op, op) if isinstance(op, str) else op, dtype)
    with np.errstate(all="ignore"):
        return np.ascontiguousarray(fn(x, y)).astype(dtype.np, copy=False).view(np.uint8)


def chunk_bounds(nbytes: int, itemsize: int, n: int) -> list[tuple[int, int]]:
    """Byte ranges of the ring's n chunks (element-aligned, differing by at most one element)."""
    return [(s * itemsize, e * itemsize) for s, e in even_bounds(nbytes // itemsize, n)]


def ring_allreduce(devices: list[Any], handles: list[Any], nbytes: int, dtype: DType, op: Ops | str,
                   stats: Transfers | None = None) -> Transfers:
    """In place: every handle ends up holding op over all of them. Reduce-scatter then all-gather around the
    ring, in n chunks: each device sends (and receives) 2(n-1) chunks, 2(n-1)/n of the tensor."""
    n = len(devices)
    stats = stats or Transfers.for_devices(n)
    st = time.perf_counter()
    chunks = chunk_bounds(nbytes, dtype.itemsize, n)
    cls = type(devices[0])
    batch = cls.reduce_batch if cls.runtime.batched_reduces and all(type(dev) is cls for dev in devices) else None
    for s in range(n - 1):  # reduce-scatter: device d sends chunk d-s to d+1, which reduces it into its own
        moves = []
        for d in range(n):
            lo, hi = chunks[(d - s) % n]
            moves.append(Move(d, (d + 1) % n, lo, lo, hi - lo, nbytes, nbytes))
        # a backend may do a whole step in one call (`reduce_batch(devices, handles, moves, op, dtype) -> bool`:
        # dst chunk = op(dst chunk, src chunk) for every move at once, e.g. between REMOTE servers)
        if not (batch is not None and batch(devices, handles, moves, op, dtype)):
            incoming = []
            for m in moves:  # every send of a step is read before any device writes
                data = _read(devices[m.src], handles[m.src], m.src_offset, m.nbytes, nbytes) if m.nbytes else None
                incoming.append((m, data))
            for m, data in incoming:
                if data is not None:
                    mine = _read(devices[m.dst], handles[m.dst], m.dst_offset, m.nbytes, nbytes)
                    _write(devices[m.dst], handles[m.dst], m.dst_offset, _combine(op, dtype, mine, data), nbytes)
        for m in moves:
            if m.nbytes:
                stats.sent[m.src] += m.nbytes
                stats.received[m.dst] += m.nbytes
                stats.copies += 1
    for s in range(n - 1):  # all-gather: device d passes on the finished chunk d+1-s
        moves = []
        for d in range(n):
            lo, hi = chunks[(d + 1 - s) % n]
            moves.append(Move(d, (d + 1) % n, lo, lo, hi - lo, nbytes, nbytes))
        copy_step(devices, handles, handles, moves, stats)
    stats.seconds += time.perf_counter() - st
    return stats


def gather_shards(devices: list[Any], shards: list[Any], outs: list[Any], shape: tuple[int, ...], dtype: DType,
                  axis: int, bounds: Bounds, stats: Transfers | None = None) -> Transfers:
    """Every device's `outs` buffer receives the whole tensor from the shards (`shards[j]` on device j holds
    rows `bounds[j]` along `axis`). Shards of the outermost axis are byte ranges, copied device to device
    (`copy_between`); others are assembled in host memory and written to each device. Each device sends its
    shard to the n-1 others."""
    n = len(devices)
    stats = stats or Transfers.for_devices(n)
    st = time.perf_counter()
    row = prod(shape[axis + 1:]) * dtype.itemsize
    if prod(shape[:axis]) == 1:
        whole = prod(shape) * dtype.itemsize
        copy_step(devices, shards, outs, [Move(j, d, 0, s * row, (e - s) * row, (e - s) * row, whole)
                                          for d in range(n) for j, (s, e) in enumerate(bounds)], stats)
    else:
        host = np.empty(shape, dtype=np.uint8 if dtype.itemsize == 1 else dtype.np)
        for j, (s, e) in enumerate(bounds):
            part = tuple(e - s if i == axis else x for i, x in enumerate(shape))
            data = _read(devices[j], shards[j], 0, prod(part) * dtype.itemsize, prod(part) * dtype.itemsize)
            host[(slice(None),) * axis + (slice(s, e),)] = data.view(host.dtype).reshape(part)
        flat = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        for d in range(n):
            _write(devices[d], outs[d], 0, flat, flat.nbytes)
            for j, (s, e) in enumerate(bounds):
                if j != d:
                    nbytes = prod(shape) // shape[axis] * (e - s) * dtype.itemsize
                    stats.sent[j] += nbytes
                    stats.received[d] += nbytes
                    stats.copies += 1
    stats.seconds += time.perf_counter() - st
    return stats


# --- a device list's executable (its builder) and its collective steps


def build_executable(devices: list[Any], p: MultiPlan, step_nodes: list[list[UOp]], step_kernels: list[list[list]],
                     out_nodes: list[list[UOp | None]], out_kernels: list[list], input_names: dict[int, str],
                     output_names: list[str]) -> Executable:
    """The `Executable` of a program planned across `devices` (`plan`): before collective step k, every device
    d launches `step_kernels[k][d]` (computing `step_nodes[k][d]`, its operand); an all-reduce first copies
    each device's operand into its result buffer (a `Copy` step), then reduces there in place; a gather
    sends each shard into every device's whole buffer. Then each device launches `out_kernels[d]`, computing
    its part of the outputs `out_nodes[d]` (None: not there; a replicated output on device 0 only)."""
    n = len(devices)
    steps: list[Any] = []
    for k, step in enumerate(p.steps):
        steps += [Launch(kern, d) for d in range(n) for kern in step_kernels[k][d]]
        bufs = tuple(step.outs[d][0] for d in range(n))
        if step.kind == "allreduce":
            steps += [Copy(d, step_nodes[k][d], d, bufs[d]) for d in range(n)]
            steps.append(Collective("allreduce", step.arg, bufs, bufs, k))
        else:
            steps.append(Collective("gather", step.arg, tuple(step_nodes[k]), bufs, k))
    steps += [Launch(kern, d) for d in range(n) for kern in out_kernels[d]]
    outputs = [OutputPart(name, tuple((d, out_nodes[d][i]) for d in range(n) if out_nodes[d][i] is not None),
                          p.outputs[i].axis) for i, name in enumerate(output_names)]
    used: list[dict[UOp, None]] = [{} for _ in range(n)]  # each device's input buffers, in first-use order
    for s in steps:
        if isinstance(s, Launch):
            used[s.device].update(dict.fromkeys(s.kernel.bufs))
        elif isinstance(s, Collective):
            for d in range(n):
                used[d][s.srcs[d]] = None
    for part in outputs:
        for d, key in part.holders:
            used[d][key] = None
    inputs = []
    for d in range(n):
        for node in used[d]:
            if node.op is Ops.BUFFER and node.arg[0] < _BUF_BASE:
                idx = node.arg[0]
                if idx in p.input_bounds:
                    axis, bounds = p.input_bounds[idx]
                    inputs.append(InputPart(input_names[idx], d, node, axis, bounds[d]))
                else:
                    inputs.append(InputPart(input_names[idx], d, node))
    return Executable.across(devices, steps, inputs, outputs)


def run_collective(devices: list[Any], step: Collective, buffers: list[dict[Any, Any]], stats: Transfers) -> str:
    """Run collective `step` on the devices' buffers (`buffers[d]`: device d's, by key), counting the bytes moved
    in `stats`; what it did, in words (profile spans, DEBUG lines)."""
    n = len(devices)
    dtype, shape = buffer_type(step.bufs[0])  # (a tensor node, or a package's PlanBuffer)
    outs = [buffers[d][step.bufs[d]].handle for d in range(n)]
    if step.kind == "allreduce":
        ring_allreduce(devices, outs, prod(shape) * dtype.itemsize, dtype, step.arg, stats)
        op = step.arg if isinstance(step.arg, str) else step.arg.name.lower()
        return f"all-reduce ({op}) {dtype.name}{list(shape)}"
    gather_shards(devices, [buffers[d][step.srcs[d]].handle for d in range(n)], outs, shape, dtype,
                  step.arg[0], step.arg[1], stats)
    return f"gather axis {step.arg[0]}"


def profile_collective(prof: Any, devices: list[Any], what: str, step: int, st_ns: int, stats: Transfers,
                       sent: list[int], received: list[int]) -> None:
    """A collective step in a profile trace: one span per device on its `collectives` track with the bytes it
    sent and received in this step, a counter of each device's bytes sent so far, one span on the host."""
    end = time.perf_counter_ns()
    total = sum(stats.sent) - sum(sent)
    host = prof.span(profile.HOST, prof.host_thread("collectives"), what, st_ns, end, "collective",
                     {"step": step, "bytes_sent": total, "devices": [d.name for d in devices]})
    for d, dev in enumerate(devices):
        ev = prof.span(dev.name, "collectives", what, st_ns, end, "collective",
                       {"step": step, "sent_bytes": stats.sent[d] - sent[d],
                        "received_bytes": stats.received[d] - received[d]})
        prof.flow(host, ev, "collective")
        prof.counter(dev.name, "collective bytes sent", end, {"bytes": stats.sent[d]})
