"""The realizer: allocate buffers, copy inputs in, launch a program's kernels in order, copy outputs out.

It runs an executable (`tgc.engine.executable.Executable`: the device object, its launch steps, input and
output buffer keys, its memory plan) and imports nothing above the scheduler; `tgc.engine.executable.run` is
the one entry (a single run, a chunked run, or a replay of a launch plan as a device graph); `Program.run`
(tgc.api) looks the device up and compiles. While a profile
trace records (`tgc.profile.active`), runs, copies, launches and graph runs are recorded, every launch waiting
for its kernel; otherwise each costs one attribute check."""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from tgc import profile
from tgc.dtype import DType, bf16_to_f32, dtypes
from tgc.engine import bound as bound_work
from tgc.engine.memplan import MemoryPlan, plan_memory
from tgc.env import debug_level, env_int
from tgc.errors import DeviceError, TgcError
from tgc.interfaces import BufferSpec, LaunchableKernel, Runtime
from tgc.ir.shapes import prod, shape_of
from tgc.ir.uop import Ops, RangeKind, substitute


def buffer_type(key: Any) -> tuple[DType, tuple[int, ...]]:
    """The dtype and shape of a buffer key: a tensor node, or a `BufferSpec` (a package's `PlanBuffer`, a
    chunked run's whole output: its own `plan_shape`)."""
    return key.dtype, (tuple(key.plan_shape) if isinstance(key, BufferSpec) else shape_of(key))


def buffer_nbytes(key: Any) -> int:
    dtype, shape = buffer_type(key)
    return max(prod(shape) * dtype.itemsize, 1)


class Slot:
    """One device allocation of a memory plan, shared by buffers whose lifetimes do not overlap."""

    def __init__(self, device: Any, nbytes: int, largest: Any):
        self.device, self.nbytes = device, nbytes
        limit = device.max_buffer_bytes
        if limit is not None and nbytes > limit:
            dtype, shape = buffer_type(largest)
            raise DeviceError(f"a {dtype.name}{list(shape)} buffer takes {nbytes} bytes, more than "
                              f"the {limit} bytes {device.name} can allocate at once",
                              hint="use smaller tensors, or a device without this limit (CPU, CUDA)")
        self.handle = device.allocator.alloc(nbytes)
        self.given = False  # handed to the user as an output's memory (zero-copy): never freed into the pool
        self.foreign = False  # memory the allocator did not allocate (`borrowed`): never freed here

    @classmethod
    def borrowed(cls, device: Any, handle: Any, nbytes: int) -> Slot:
        """A slot on memory that is not the allocator's (a chunk's part of a whole output): never freed here."""
        slot = cls.__new__(cls)
        slot.device, slot.nbytes, slot.handle, slot.given, slot.foreign = device, nbytes, handle, False, True
        return slot

    def free(self) -> None:
        if self.foreign:
            return
        if not self.given:
            self.device.allocator.free(self.handle, self.nbytes)
        else:
            self.device.allocator.disown(self.handle, self.nbytes)


def borrowable(device: Any, node: Any, arr: np.ndarray) -> Any:
    """A device handle on `arr`'s own memory for buffer `node` (`Buffer.borrow`), or None where it must be copied
    in (the device copies, or `arr` is misaligned, strided, empty, or not laid out as the node's dtype)."""
    alloc = device.allocator
    if alloc.features.zero_copy_align is None:
        return None
    dtype, shape = buffer_type(node)
    if arr.dtype != dtype.np or arr.nbytes != prod(shape) * dtype.itemsize:
        return None
    return alloc.wrap(arr)


class Buffer:
    """Device memory holding one tensor's values (contiguous): the start of a memory-plan slot, which it frees
    if it `owns` it (one buffer per slot does).

    On a device with zero-copy host buffers (the CPU, see docs/DESIGN.md) a buffer may instead borrow a user's
    input array (`handle` given: no slot, and freeing it leaves the array alone), and an output's memory may be
    handed to the user (`numpy(give=True)`: its slot is then never freed into the pool)."""

    def __init__(self, device: Any, node: Any, slot: Slot | None = None, owns: bool = True, handle: Any = None):
        self.device, self.node = device, node
        self.dtype, self.shape = buffer_type(node)
        self.nbytes = max(prod(self.shape) * self.dtype.itemsize, 1)
        if handle is not None:  # borrowed: the user's array
            self.slot, self.owns, self.handle = None, False, handle
            return
        if slot is None:
            slot = Slot(device, self.nbytes, node)
        self.slot, self.owns = slot, owns
        alloc = device.allocator
        self.handle = alloc.view(slot.handle, self.nbytes) if alloc.features.views and slot.nbytes != self.nbytes \
            else slot.handle

    @classmethod
    def borrow(cls, device: Any, node: Any, arr: np.ndarray) -> Buffer | None:
        """A buffer on `arr`'s own memory, or None where it must be copied in (the device copies, or `arr` is
        misaligned, strided, empty, or not laid out as the node's dtype)."""
        handle = borrowable(device, node, arr)
        if handle is None:
            return None
        buf = cls(device, node, handle=handle)
        if profile.active is not None:
            profile.active.instant(device.name, "copies", "input used in place (zero-copy)",
                                   buf._copy_args("host -> device"))
        return buf

    def copyin(self, arr: np.ndarray) -> None:
        if arr.nbytes:
            prof = profile.active
            if prof is None:
                self.device.allocator.copyin(self.handle, memoryview(np.ascontiguousarray(arr)).cast("B"))
                return
            with prof.timed(self.device.name, "copies", "copy in", "copy", self._copy_args("host -> device")):
                self.device.allocator.copyin(self.handle, memoryview(np.ascontiguousarray(arr)).cast("B"))

    def _copy_args(self, direction: str) -> dict[str, Any]:
        return {"bytes": self.nbytes, "direction": direction, "dtype": self.dtype.name, "shape": list(self.shape)}

    def numpy(self, give: bool = False) -> np.ndarray:
        """The values as a numpy array: a copy, or with `give` (a buffer of a slot on a zero-copy device) the
        buffer's memory itself, which from then on belongs to the returned array (the slot is never freed)."""
        shape, dtype = self.shape, self.dtype.np
        if give and self.slot is not None and not self.slot.given and prod(shape):
            alloc = self.device.allocator
            arr = alloc.give(self.handle, dtype, shape) if alloc.features.zero_copy_align is not None else None
            if arr is not None:
                self.slot.given = True
                if profile.active is not None:
                    profile.active.instant(self.device.name, "copies", "output handed over (zero-copy)",
                                           self._copy_args("device -> host"))
                return arr
        out = np.empty(shape, dtype=dtype)
        if out.nbytes:
            prof = profile.active
            if prof is None:
                self.device.allocator.copyout(memoryview(out).cast("B"), self.handle)
            else:
                with prof.timed(self.device.name, "copies", "copy out", "copy", self._copy_args("device -> host")):
                    self.device.allocator.copyout(memoryview(out).cast("B"), self.handle)
        return out

    def free(self) -> None:
        if self.owns:
            self.slot.free()


# ------------------------------------------------------------------------- the executable (re-exported by
# tgc.engine.executable, whose `run` and `bench` consume it)


@dataclass(frozen=True)
class Launch:
    """One step: launch `kernel` on its buffers (`kernel.bufs`, keys of the planned buffers of device number
    `device`: the executable's one device, or its position in a device list)."""

    kernel: LaunchableKernel
    device: int = 0


@dataclass(frozen=True)
class Copy:
    """One step of a device list: copy buffer `src` of device `src_device` into buffer `dst` (as large) of device
    `dst_device` (`tgc.engine.multi.copy_between`: directly where the devices can, else through host memory)."""

    src_device: int
    src: Any
    dst_device: int
    dst: Any


@dataclass(frozen=True)
class Collective:
    """One step of a device list, every device taking part: `kind` "allreduce" (`arg`: the reduce op; each
    device's buffer `bufs[d]` ends up holding op over all of them, in place) or "gather" (`arg`: (axis, bounds);
    device d's shard `srcs[d]` (rows `bounds[d]` along axis) goes to every device's whole buffer `bufs[d]`).
    `index`: the collective's number in the program (profile traces and DEBUG lines)."""

    kind: str
    arg: Any
    srcs: tuple
    bufs: tuple
    index: int = 0


Step = Launch | Copy | Collective


@dataclass(frozen=True)
class InputPart:
    """Where input `name` goes on a device list: device `device`'s buffer `key` gets rows `rows` of `axis`
    (`axis` None: the whole array, replicated)."""

    name: str
    device: int
    key: Any
    axis: int | None = None
    rows: tuple[int, int] | None = None


@dataclass(frozen=True)
class OutputPart:
    """Where output `name` comes from on a device list: the buffers `holders` ((device, key), in order), put
    together along `axis` (None: one replicated copy, the first holder's)."""

    name: str
    holders: tuple[tuple[int, Any], ...]
    axis: int | None = None


@dataclass(frozen=True)
class Chunks:
    """The steps are one chunk: run `count` times on equal axis-0 slices of the inputs named in `sliced`."""

    count: int
    sliced: frozenset[str]


class Executable:
    """A program ready to run: `steps` in order over planned buffers. On one device (`device`; `devices` is
    [device]) the steps are `Launch`es; `inputs` the input buffer keys with the names their arrays come under,
    `outputs` the output names with their keys; `memory` the memory plan (computed on first use, or given by a
    package); `graph_options` extra keywords for `Device.graph` (a CPU package: its runner object); `chunks`
    how the steps repeat over slices, or None.

    On a device list (`Executable.across`: `devices`, `device` the first of them) the steps are each device's
    `Launch`es, `Copy` and `Collective` steps; `inputs` is a list of `InputPart`s (each device's part of each
    input) and `outputs` of `OutputPart`s; each device's buffers have a memory plan of their own
    (`memory_plan(d)`)."""

    def __init__(self, device: Runtime, kernels: list, inputs: list, outputs: list,
                 memory: MemoryPlan | None = None, graph_options: dict | None = None, chunks: Chunks | None = None):
        self.device = device
        self.devices: list[Runtime] = [device]
        self.steps: list[Step] = [Launch(k) for k in kernels]
        self.kernels: list = list(kernels)  # (the steps' kernels, in order: what launch plans and bench read)
        self.inputs, self.outputs = inputs, outputs
        self.memory, self.graph_options, self.chunks = memory, graph_options, chunks
        self.memories: list[MemoryPlan | None] = [memory]
        self.pool: Any = None  # a device list's host threads, one per device (started on first use, kept)
        # a device list's extra `Device.graph` keywords per device (a package's CPU graph runner), or None
        self.graph_options_of: list[dict | None] = [graph_options]
        # names of inputs bound at load (a model's weights): the same arrays every run, so the kernels reading only
        # them run once per launch plan (`tgc.engine.bound`)
        self.bound: frozenset[str] = frozenset()
        # a chunked run's buffers and chunk graphs kept between its runs (`run_chunked`; made at the first run)
        self.kept: ChunkRuns | None = None

    @classmethod
    def across(cls, devices: list[Runtime], steps: list[Step], inputs: list[InputPart],
               outputs: list[OutputPart]) -> Executable:
        """A device list's executable: `steps` over the buffers of each device (keys per device: the same key
        on two devices is two buffers)."""
        exe = cls(devices[0], [], inputs, outputs)
        exe.devices, exe.steps = list(devices), list(steps)
        exe.kernels = [s.kernel for s in steps if isinstance(s, Launch)]
        exe.memories = [None] * len(devices)
        exe.graph_options_of = [None] * len(devices)
        return exe

    @property
    def multi(self) -> bool:
        """Whether this runs on a device list (its steps name devices by position)."""
        return len(self.devices) > 1

    def launches(self) -> list[tuple[int, Any]]:
        """(device position, kernel) of every launch, in order."""
        return [(s.device, s.kernel) for s in self.steps if isinstance(s, Launch)]

    def collectives(self) -> list[Collective]:
        return [s for s in self.steps if isinstance(s, Collective)]

    def memory_plan(self, d: int = 0) -> MemoryPlan:
        """The memory plan of device `d`'s buffers (computed on first use)."""
        if not self.multi:
            if self.memory is None:
                self.memory = plan_for(self.device, self.kernels, self.inputs, self.outputs)
            return self.memory
        if self.memories[d] is None:
            self.memories[d] = plan_device(self, d)
        plan = self.memories[d]
        assert plan is not None
        return plan

    def threads(self) -> Any:
        """One host thread per device (a device list's launches run on all devices at once)."""
        if self.pool is None:
            from concurrent.futures import ThreadPoolExecutor
            self.pool = ThreadPoolExecutor(max_workers=len(self.devices), thread_name_prefix="tgc-dev")
        return self.pool

    def chunked(self, count: int, sliced: set[str] | frozenset[str]) -> Executable:
        """This executable (one chunk's program, whose memory plan keeps its outputs apart) run in `count`
        chunks, slicing the inputs named in `sliced`."""
        return Executable(self.device, self.kernels, self.inputs, self.outputs, self.memory, self.graph_options,
                          Chunks(count, frozenset(sliced)))

    def one_chunk(self) -> Executable:
        """The steps of one chunk as an executable of their own (itself when not chunked)."""
        if self.chunks is None:
            return self
        return Executable(self.device, self.kernels, self.inputs, self.outputs, self.memory, self.graph_options)

    def __repr__(self) -> str:
        if self.multi:
            return (f"<Executable on {','.join(d.name for d in self.devices)}: {len(self.kernels)} launches, "
                    f"{len(self.collectives())} collectives>")
        how = f", {self.chunks.count} chunks" if self.chunks is not None else ""
        return f"<Executable on {self.device.name}: {len(self.steps)} launches{how}>"


def plan_device(exe: Executable, d: int) -> MemoryPlan:
    """The memory plan of device `d` of a device list: its buffers live over the steps that use them (its
    launches, the copies from or to it, every collective's buffers of it); its input parts are placed as a
    program's inputs, the buffers its output parts come from as outputs."""
    uses: list[list[Any]] = []
    inplace: list[tuple[Any, Any]] = []
    for s in exe.steps:
        if isinstance(s, Launch):
            if s.device == d:
                uses.append(list(s.kernel.bufs))
                inplace += inplace_pairs(s.kernel)
        elif isinstance(s, Copy):
            uses.append([k for dev, k in ((s.src_device, s.src), (s.dst_device, s.dst)) if dev == d])
        else:
            uses.append([s.srcs[d], s.bufs[d]])
    inputs = list(dict.fromkeys(p.key for p in exe.inputs if p.device == d))
    outputs = list(dict.fromkeys(k for p in exe.outputs for dev, k in p.holders if dev == d))
    keys = dict.fromkeys(inputs + [k for u in uses for k in u] + outputs)
    return plan_memory(uses, {k: buffer_nbytes(k) for k in keys}, inputs, outputs,
                       share=exe.devices[d].allocator.features.shared_slots, inplace=inplace)


def plan_for(device: Any, kernels: list, inputs: list[tuple[Any, str]], outputs: list[tuple[str, Any]],
             fixed_outputs: bool = False) -> MemoryPlan:
    """The memory plan of an executable's kernels: its buffers share slots where the device's allocator can hand a
    buffer the start of a larger allocation (`shared_slots`, true unless the allocator says otherwise).
    `fixed_outputs`: outputs open slots of their own size, never grown nor shared with a buffer live beside
    them (a chunked run writes them into the whole output array, `run_chunked`); buffers no larger that die
    before an output is first written may use its memory (`plan_memory`'s `hosts`)."""
    kernel_bufs = [list(k.bufs) for k in kernels]
    keys = {key: None for key, _ in inputs} | {key: None for bufs in kernel_bufs for key in bufs}
    fixed = list(dict.fromkeys([key for key, _ in inputs]))
    hosts = list(dict.fromkeys([key for _, key in outputs if key in keys])) if fixed_outputs else []
    return plan_memory(kernel_bufs, {key: buffer_nbytes(key) for key in keys}, fixed,
                       [key for _, key in outputs], share=device.allocator.features.shared_slots,
                       inplace=[pair for k in kernels for pair in inplace_pairs(k)], hosts=hosts)


_SHARED = {Ops.DEFINE_LOCAL, Ops.BARRIER}  # threads that share work (a work-group reduction)
_PER_ITERATION = (RangeKind.LOOP, RangeKind.UPCAST, RangeKind.REDUCE, RangeKind.UNROLL)


_MIXED = object()  # `inplace_pairs`: the stores are under several gates


def _gate_ok(load: Any, at: Any, gate: Any, store_gate: dict[Any, Any], feeds: dict[Any, set[Any]]) -> bool:
    """Whether `load` (at the index `at` of a store) is gated as `inplace_pairs` needs: under the stores' one
    gate; or, where the stores have several, ungated or under its store's gate with its value reaching no store
    but those at `at` (where that store is gated off, what it read is dropped, whatever was there)."""
    own = load.src[2] if len(load.src) > 2 else None
    if gate is not _MIXED:
        return own == gate
    return own in (None, store_gate[at]) and feeds.get(load, set()) <= {at}


def _unclamped(index: Any, store_gate: dict[Any, Any]) -> Any:
    """`index` with its clamps `where(e < c, e, c)` (a padded row's load clamped onto the last live row) taken
    off where that gives a store's index at whose live lanes each clamp is `e`: e is never over c, or the
    store's gate is `e < c2` with c2 <= c + 1. Else `index` itself."""
    clamps = {w: w.src[1] for w in index.toposort() if w.op is Ops.WHERE and w.src[0].op is Ops.CMPLT
              and w.src[0].src[0] is w.src[1] and w.src[0].src[1] is w.src[2] and w.src[2].op is Ops.CONST}
    if not clamps:
        return index
    at = substitute(index, clamps)
    if at not in store_gate:
        return index
    g = store_gate[at]
    for w, e in clamps.items():
        c = w.src[2].arg
        if not (isinstance(e.vmax, int) and e.vmax <= c) and not (
                g is not None and g.op is Ops.CMPLT and g.src[0] is e and g.src[1].op is Ops.CONST
                and g.src[1].arg <= c + 1):
            return index
    return at


def inplace_pairs(k: Any) -> list[tuple[Any, Any]]:
    """(output, input) buffers of kernel `k` that may share memory (the memory plan keeps a pair only where the
    input dies at `k`). Read from the kernel's linear UOps (what runs): no thread shares work with another
    (no shared memory, barrier or work-group range), the kernel stores only to its output, all its stores
    under one gate or none, and never reads it back; it reads the input only at exactly the index UOps it
    stores to, under that same gate, as wide as that store, each before the first store at that index. Every
    element of the input is then read only to compute the same element of the output (an elementwise kernel;
    or a reduction's epilogue, e.g. the residual added after a matmul), before that element is written:
    writing the output over the input changes no value the kernel reads. The one gate is a GPU grid's
    (`tgc.codegen.opt.gate_memory`): the threads past the end of a rounded-up grid neither read nor write, so
    they touch no element a live thread owns. Stores under several gates (a CPU matmul's rows padded to whole
    tiles, the extra rows' stores gated off and their index clamped onto a live row's) are accepted where each
    load of the input is ungated or under its store's gate and its value reaches only the stores at its own
    index (`_gate_ok`): a gated-off store drops what its load read. Kernels without UOps (a package's): none."""
    uops = k.linear_uops()
    if not uops:
        return []
    stores: dict[Any, tuple[int, Any]] = {}  # index UOp -> (position of its first store, stored dtype)
    store_gate: dict[Any, Any] = {}  # index UOp -> its stores' gate (None: ungated)
    feeds: dict[Any, set[Any]] = {}  # LOAD -> the index UOps of the stores whose values it reaches
    out = None
    gates = set()  # the stores' gates (None: ungated)
    for pos, u in enumerate(uops):
        if u.op in _SHARED or (u.op is Ops.RANGE and u.arg[1] not in _PER_ITERATION):
            return []
        if u.op is Ops.STORE:
            if u.src[0].op is not Ops.DEFINE_GLOBAL or out not in (None, u.src[0]):
                return []
            out = u.src[0]
            g = u.src[3] if len(u.src) > 3 else None
            gates.add(g)
            if store_gate.setdefault(u.src[1], g) is not g:
                return []
            stores.setdefault(u.src[1], (pos, u.src[2].dtype))
    if out is None or not isinstance(out.arg, int) or not 0 <= out.arg < len(k.bufs):
        return []
    gate = next(iter(gates), None) if len(gates) == 1 else _MIXED
    if gate is _MIXED:  # stores under several gates (a CPU tile's padded rows: `padded_rows`)
        for u in uops:
            if u.op is Ops.STORE:
                for v in u.src[2].toposort():
                    if v.op is Ops.LOAD:
                        feeds.setdefault(v, set()).add(u.src[1])
    loads: dict[Any, bool] = {}  # DEFINE_GLOBAL -> read only at its store indices
    for pos, u in enumerate(uops):
        for j, g in enumerate(u.src):
            if g.op is not Ops.DEFINE_GLOBAL:
                continue
            if g is out and not (u.op is Ops.STORE and j == 0):  # the output read back: partial results
                return []
            if g is out:
                continue
            at = u.src[1] if u.op is not Ops.LOAD or gate is not _MIXED else _unclamped(u.src[1], store_gate)
            ok = u.op is Ops.LOAD and j == 0 and at in stores and pos < stores[at][0] \
                and u.dtype == stores[at][1] and _gate_ok(u, at, gate, store_gate, feeds)
            loads[g] = loads.get(g, True) and ok
    dst = k.bufs[out.arg]
    pairs = []
    for g, ok in loads.items():
        if not ok or not isinstance(g.arg, int) or not 0 <= g.arg < len(k.bufs):
            continue
        src = k.bufs[g.arg]
        if src is not dst and sum(b is src for b in k.bufs) == 1 and buffer_type(src)[0] == buffer_type(dst)[0] \
                and buffer_nbytes(src) == buffer_nbytes(dst):
            pairs.append((dst, src))
    return pairs


def run_program(low: Executable, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Allocate the memory plan's slots, copy `arrays` (by input name) in, launch every kernel in order, copy the
    outputs out."""
    if profile.active is None:
        return _run_program(low, arrays)
    with profile.host_span(f"run on {low.device.name}", {"kernels": len(low.kernels), "as": "kernel by kernel"}):
        return _run_program(low, arrays)


def _run_program(low: Executable, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    dev = low.device
    buffers: dict[Any, Buffer] = {}
    try:
        allocate(low, arrays, buffers)
        for k in low.kernels:
            launch(k, [buffers[n] for n in k.bufs], in_place=debug_level() >= 2 and runs_in_place(low, k))
        result = {}
        for out_name, node in low.outputs:
            if node in buffers:
                # an output that no kernel wrote (an input) is copied: a user's array is never returned as another
                arr = buffers[node].numpy(give=True)
            else:  # an empty output: no kernel ran
                dtype, shape = buffer_type(node)
                arr = np.zeros(shape, dtype=dtype.np)
            result[out_name] = to_user_array(arr, buffer_type(node)[0])
        dev.synchronize()
        return result
    finally:
        for buf in buffers.values():
            buf.free()


def writes_in_place(alloc: Any, nbytes: int) -> bool:
    """Whether a chunked run writes a chunk's `nbytes`-byte output straight into the whole output (a host
    allocator with zero-copy buffers, and every chunk's part starting at the alignment its kernels need)."""
    align = alloc.features.zero_copy_align
    return alloc.features.host_buffers and align is not None and nbytes % align == 0


def run_chunked(low: Executable, count: int, sliced: set[str], arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a program separable along axis 0 (see `tgc.engine.chunk`) as `count` runs of `low`, its program on
    one chunk: inputs named in `sliced` are cut into `count` equal axis-0 slices (contiguous views, used in
    place where the device allows), the others (weights) are whole; each chunk's outputs are written straight
    into their slice of the whole output arrays (allocated once, handed to the user as `run_program` does).
    Each chunk's intermediates go back to the allocator's pool and the next chunk takes the same ones. A host
    allocator only (the buffers are numpy arrays); each chunk's kernels run as one device graph where the device
    has graphs. Where they can be pointed at other buffers (`RuntimeFeatures.rebind_graphs`, the CPU) the
    executable keeps its chunks' graphs and planned buffers between runs (`ChunkRuns`: a run again patches the
    inputs' and outputs' addresses and allocates only the whole outputs); elsewhere, while a profile records,
    with DEBUG>=2 or TGC_GRAPH=0, or while another thread runs the same executable, each chunk's buffers come
    from the pool and its graph is built for them (`launch_all`)."""
    if profile.active is None:
        if len(low.kernels) > 1 and low.device.runtime.rebind_graphs and graphs_enabled() and debug_level() < 2:
            kept = low.kept
            if kept is None:
                with _KEPT_LOCK:
                    if low.kept is None:
                        low.kept = ChunkRuns()
                    kept = low.kept
            assert kept is not None
            if not kept.off and kept.lock.acquire(blocking=False):
                try:
                    got = kept.run(low, count, sliced, arrays)
                finally:
                    kept.lock.release()
                if got is not None:
                    return got
        return _run_chunked(low, count, sliced, arrays)
    with profile.host_span(f"run on {low.device.name}", {"kernels": len(low.kernels), "as": f"{count} chunks"}):
        return _run_chunked(low, count, sliced, arrays)


def _whole_outputs(low: Executable, count: int) -> dict[str, Buffer]:
    """A chunked run's whole outputs (`count` chunks' parts each), by name: handed to the user after the run."""
    wholes: dict[str, Buffer] = {}
    try:
        for name, node in low.outputs:
            dtype, shape = buffer_type(node)
            wholes[name] = Buffer(low.device, BufferSpec(dtype, (shape[0] * count,) + tuple(shape[1:])))
    except BaseException:
        for buf in wholes.values():
            buf.free()
        raise
    return wholes


def _input_part(arr: np.ndarray, name: str, sliced: set[str], count: int, i: int) -> np.ndarray:
    """Input `name`'s array for chunk `i` of `count`: its rows' slice where it is sliced, else whole (a weight)."""
    if name not in sliced:
        return arr
    rows = arr.shape[0] // count
    return arr[i * rows:(i + 1) * rows]


def _output_places(low: Executable, plan: MemoryPlan, wholes: dict[str, Buffer], i: int
                   ) -> list[tuple[np.ndarray, Any, Any]]:
    """Per output of chunk `i`, (its part of the whole output, how the kernels write it, the device handle on that
    part or None): ("host", slot) where the part is the output's planned slot (buffers that die before it is
    written share it: `plan_for`'s `fixed_outputs`), "own" where it is the output's buffer alone, "copy" where
    the kernels write a buffer of their own copied in after them (a part the device cannot write in place, a
    node returned twice, an input returned as is)."""
    alloc = low.device.allocator
    inputs = {b for b, _ in low.inputs}
    out: list[tuple[np.ndarray, Any, Any]] = []
    hosted: set[int] = set()
    for j, (name, node) in enumerate(low.outputs):
        n = buffer_nbytes(node)
        dest = wholes[name].handle[i * n:(i + 1) * n]
        if node in inputs or any(node is o for _, o in low.outputs[:j]):
            out.append((dest, "copy", None))
            continue
        h = alloc.wrap(dest) if writes_in_place(alloc, n) else None
        slot = plan.slot_of.get(node)
        if h is not None and slot is not None and plan.slots[slot] == n and slot not in hosted:
            hosted.add(slot)
            out.append((dest, ("host", slot), h))
        else:
            out.append((dest, "own" if h is not None else "copy", h))
    return out


def _run_chunked(low: Executable, count: int, sliced: set[str], arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    dev = low.device
    alloc = dev.allocator
    plan = low.memory_plan()
    wholes = _whole_outputs(low, count)
    try:
        for i in range(count):
            part = {name: _input_part(arrays[name], name, sliced, count, i) for _b, name in low.inputs}
            buffers: dict[Any, Buffer] = {}
            copies = []  # (chunk output buffer, whole output handle slice) where the slice cannot be used in place
            try:
                given: dict[int, Slot] = {}  # an output's part of the whole output: its slot of the plan
                for (_name, node), (dest, how, handle) in zip(low.outputs, _output_places(low, plan, wholes, i)):
                    if how == "copy":
                        copies.append((node, dest))
                    elif how == "own":
                        buffers[node] = Buffer(dev, node, handle=handle)
                    else:
                        given[how[1]] = Slot.borrowed(dev, handle, plan.slots[how[1]])
                        buffers[node] = Buffer(dev, node, given[how[1]], owns=False)
                allocate(low, part, buffers, given=given)
                launch_all(low, buffers)
                for node, dest in copies:
                    if profile.active is None:
                        alloc.copyout(memoryview(dest), buffers[node].handle)
                        continue
                    with profile.active.timed(dev.name, "copies", "copy out", "copy",
                                              buffers[node]._copy_args("device -> host")):
                        alloc.copyout(memoryview(dest), buffers[node].handle)
            finally:
                for buf in buffers.values():
                    buf.free()
        result = {name: to_user_array(wholes[name].numpy(give=True), buffer_type(node)[0])
                  for name, node in low.outputs}
        dev.synchronize()
        return result
    finally:
        for buf in wholes.values():
            buf.free()


_KEPT_LOCK = threading.Lock()


class _Chunk:
    """One chunk's part of `ChunkRuns`: the graph of its kernels over its buffers, the buffers (by key), and where
    each run's own memory goes into the graph: `uses[source]`, the (launch, buffer argument) pairs of input
    `("in", i)` (the user's slice, used in place) or output `("out", i)` (its part of the whole output, and
    every buffer planned into that part's slot), bound as one group each (`groups`, `graph.bind_args`)."""

    def __init__(self, sig: tuple, graph: Any, buffers: dict[Any, Buffer], uses: dict[tuple, list],
                 handles: dict[tuple, Any]):
        self.sig, self.graph, self.buffers, self.uses = sig, graph, buffers, uses
        self.groups = {source: graph.bind_args(u, handles[source]) for source, u in uses.items()}


class ChunkRuns:
    """What a chunked executable keeps between its runs (`run_chunked`, a device with `rebind_graphs`): the memory
    plan's slots that are not the run's own memory (the intermediates, inputs copied in), allocated at the first
    run and kept, and per chunk its device graph over them (`_Chunk`). A run again allocates only the whole
    outputs (handed to the user) and, per chunk, points its graph at that run's input slices and output parts
    (`graph.rebind`) and runs it: nothing is planned, placed or built again. A chunk whose inputs or outputs
    come otherwise placed (an input now misaligned, so copied in) gets its graph built again. One run at a time
    (`lock`; another thread's run meanwhile runs as before, `_run_chunked`); `free()` (also when the executable
    is dropped) gives the slots back to the allocator. `graphs_built` counts the graphs built (tests)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.slots: dict[int, Slot] = {}  # the plan's slots allocated here, by index
        self.chunks: dict[int, _Chunk] = {}
        self.off = False  # no graph could be made for these kernels: every run as before
        self.graphs_built = 0
        self.written: set | None = None  # the buffers the kernels write (an input among them is copied in)

    def run(self, low: Executable, count: int, sliced: set[str], arrays: dict[str, np.ndarray]
            ) -> dict[str, np.ndarray] | None:
        """One chunked run (as `_run_chunked`), or None where no graph could be made (nothing ran; `off` is set)."""
        dev = low.device
        alloc = dev.allocator
        plan = low.memory_plan()
        if self.written is None:
            self.written = {k.bufs[i] for k in low.kernels for i in written_indices(k) if i < len(k.bufs)}
        written = self.written
        wholes = _whole_outputs(low, count)
        try:
            wholes_in = [arrays[name] for _b, name in low.inputs]

            def part(j: int, i: int) -> np.ndarray:  # input j's slice for chunk i
                return _input_part(wholes_in[j], low.inputs[j][1], sliced, count, i)

            for i in range(count):
                handles: dict[tuple, Any] = {}  # this run's own memory for the chunk, by source (`_Chunk`)
                fill: list[tuple[Any, np.ndarray]] = []  # (input key, slice) copied in
                ins = []
                ch = self.chunks.get(i)
                for j, (b, _name) in enumerate(low.inputs):
                    arr = part(j, i)
                    h = borrowable(dev, b, arr) if b not in written else None
                    if h is None:
                        fill.append((b, arr))
                    else:
                        handles[("in", j)] = h
                    ins.append(h is not None)
                places = _output_places(low, plan, wholes, i)
                outs = [how for _dest, how, _h in places]
                dests = [dest for dest, _how, _h in places]
                handles.update((("out", j), h) for j, (_dest, _how, h) in enumerate(places) if h is not None)
                sig = (tuple(ins), tuple(outs))
                if ch is None or ch.sig != sig:
                    if ch is not None:
                        del self.chunks[i]
                        ch.graph.free()
                    ch = self._build(low, plan, sig, handles)
                    if ch is None:
                        return None
                    self.chunks[i] = ch
                else:
                    for source, group in ch.groups.items():
                        if source in handles:
                            ch.graph.rebind(group, handles[source])
                for b, arr in fill:
                    ch.buffers[b].copyin(arr)
                _run_graph(low, ch.graph)
                for group in ch.groups.values():  # (no user array, input or output, is held here after the
                    group.handle = None              # run: every run points the groups at its own memory first)
                for j, (_name, node) in enumerate(low.outputs):
                    if outs[j] != "copy":
                        continue
                    src = next((handles[("in", k)] for k, (b, _n) in enumerate(low.inputs) if b is node and ins[k]),
                               None)
                    if src is None:
                        src = next((handles[("out", k)] for k, (_n, o) in enumerate(low.outputs[:j])
                                    if o is node and ("out", k) in handles), None)
                    if src is None:
                        src = ch.buffers[node].handle
                    alloc.copyout(memoryview(dests[j]), src)
            result = {name: to_user_array(wholes[name].numpy(give=True), buffer_type(node)[0])
                      for name, node in low.outputs}
            dev.synchronize()
            return result
        except BaseException:
            self.free()  # (a failed run may leave a graph half pointed at this run's memory: all built again)
            raise
        finally:
            for buf in wholes.values():
                buf.free()

    def _build(self, low: Executable, plan: MemoryPlan, sig: tuple, handles: dict[tuple, Any]) -> _Chunk | None:
        """A chunk's buffers (its own memory from `handles`, the rest in the kept slots) and its graph."""
        dev = low.device
        largest: dict[int, Any] = {}
        for k, i in plan.slot_of.items():
            if i not in largest or plan.sizes[k] > plan.sizes[largest[i]]:
                largest[i] = k
        ins, outs = sig
        source: dict[Any, tuple] = {}  # buffer key -> the source of its memory this run
        given: dict[int, Slot] = {}
        buffers: dict[Any, Buffer] = {}
        for j, (b, _name) in enumerate(low.inputs):
            if ins[j]:
                source[b] = ("in", j)
                buffers[b] = Buffer(dev, b, handle=handles[("in", j)])
        for j, (_name, node) in enumerate(low.outputs):
            how = outs[j]
            if how == "own":
                source[node] = ("out", j)
                buffers[node] = Buffer(dev, node, handle=handles[("out", j)])
            elif how != "copy":
                given[how[1]] = Slot.borrowed(dev, handles[("out", j)], plan.slots[how[1]])
                source.update((k, ("out", j)) for k, s in plan.slot_of.items() if s == how[1])

        def place(key: Any) -> None:
            index = plan.slot_of[key]
            slot = given.get(index) or self.slots.get(index)
            if slot is None:
                slot = self.slots[index] = Slot(dev, plan.slots[index], largest[index])
            buffers[key] = Buffer(dev, key, slot, owns=False)

        for b, _name in low.inputs:
            if b not in buffers:
                place(b)
        for k in low.kernels:
            for key in k.bufs:
                if key not in buffers:
                    place(key)
        uses: dict[tuple, list] = {}
        for li, k in enumerate(low.kernels):
            for j, key in enumerate(k.bufs):
                if key in source:
                    uses.setdefault(source[key], []).append((li, j))
        launches = [(k.program(), [buffers[n].handle for n in k.bufs], k.global_size, k.local_size, k.vals)
                    for k in low.kernels]
        try:
            graph = dev.graph(launches, **(low.graph_options or {}))
        except Exception:  # no graph (a kernel with too many arguments, no runner): every run as before
            graph = None
        if graph is None:
            self.off = True
            self.free()
            return None
        self.graphs_built += 1
        for key in source:  # (each run's own memory: held by the graph's groups while it runs, not kept here)
            del buffers[key]
        return _Chunk(sig, graph, buffers, uses, handles)

    def free(self) -> None:
        """Give the kept slots back and drop the chunks' graphs (a later run builds them again)."""
        chunks, self.chunks = self.chunks, {}
        for ch in chunks.values():
            try:
                ch.graph.free()
            except Exception:
                pass
        slots, self.slots = self.slots, {}
        for slot in slots.values():
            try:
                slot.free()
            except Exception:  # a device that lost its memory: nothing to give back
                pass

    def __del__(self) -> None:  # (the executable dropped: its program released, or gone)
        try:
            self.free()
        except Exception:  # interpreter shutdown
            pass


def release_kept(exe: Executable) -> None:
    """Give back what a chunked executable keeps between runs (`ChunkRuns`), unless a run holds it now (then it
    goes with the executable)."""
    kept = exe.kept
    if kept is not None and kept.lock.acquire(blocking=False):
        try:
            kept.free()
        finally:
            kept.lock.release()


def _run_graph(low: Executable, graph: Any) -> None:
    kernels = low.kernels
    try:
        graph()
    except TgcError:
        raise
    except Exception as e:  # a device failure is a runtime error, not a crash
        raise DeviceError(f"the graph of {_count(kernels)} ({_names(kernels)}) failed on "
                          f"{low.device.name}: {e}") from None


def launch_all(low: Executable, buffers: dict[Any, Buffer]) -> None:
    """Launch every kernel of `low` once on `buffers` (by key), in order: as one device graph built for these
    buffers where the device has graphs (a chunked run's chunk: one native call, the threads handing each kernel
    to the next inside it, instead of a thread hand-off per kernel launched from Python), else one by one, as
    also with DEBUG>=2 (a line per kernel), while a profile records (a record per launch) and with TGC_GRAPH=0."""
    kernels = low.kernels
    graph = None
    if len(kernels) > 1 and graphs_enabled() and profile.active is None and debug_level() < 2:
        launches = [(k.program(), [buffers[n].handle for n in k.bufs], k.global_size, k.local_size, k.vals)
                    for k in kernels]
        try:
            graph = low.device.graph(launches, **(low.graph_options or {}))
        except Exception:  # no graph (a kernel with too many arguments, no runner): each kernel on its own
            graph = None
    if graph is None:
        for k in kernels:
            launch(k, [buffers[n] for n in k.bufs])
        return
    try:
        _run_graph(low, graph)
    finally:
        graph.free()


def graphs_enabled() -> bool:
    """`TGC_GRAPH` (default 1): 0 launches each kernel on its own, never as a device graph."""
    try:
        return env_int("TGC_GRAPH", 1) != 0
    except TgcError:
        return True


class LaunchPlan:
    """A lowered program bound to device buffers of its own, for running it again and again: the kernels in
    order with their buffer handles. `run(arrays)` copies the inputs in, launches, copies the outputs out.

    After `graph_after` runs (`Program.run` makes a plan at a program's second run at some dims and runs it as a
    graph at once; `tgc bench` after one run) a plan runs as one device graph where the device has them
    (`Device.graph`: one native call on the CPU, a CUDA graph, one REMOTE request); elsewhere it launches every
    kernel without waiting and waits once. The graph binds the plan's buffers, which stay the same for the
    plan's life, so it is captured once and reused; new input values are copied into the same input buffers.
    A plan serves one run at a time (`lock`); `free()` gives its buffers back to the device's allocator.

    Kernels that read only the executable's bound inputs (`Executable.bound`, a model's weights; the prelude of
    `tgc.engine.bound.split`) run at the plan's first run (`run_prelude`) and again only when a bound input comes
    as another array object; the device graph and every run launch only the other kernels (`kernels`)."""

    GRAPH_AFTER = 1  # runs launched kernel by kernel before the plan is captured as a graph

    def __init__(self, low: Executable, graph_after: int = GRAPH_AFTER):
        self.low, self.device = low, low.device
        self.graph_after = graph_after
        self.buffers: dict[Any, Buffer] = {}
        self.graph: Any = None
        # kernels reading only bound inputs (weights) run once, in `run_prelude`; `kernels` are those run each time
        self.split = bound_work.split_of(low)
        self.kernels: list = self.split.rest
        self.constants: list[Any] = []  # keys of the kept constant buffers (the prelude's results, bound inputs)
        self.bound_arrays: dict[str, np.ndarray] | None = None  # the bound arrays the prelude ran on
        self.prelude_runs = 0
        try:
            allocate(low, None, self.buffers, skip=set(self.split.kept) | set(self.split.temporary))
        except BaseException:
            self.free()
            raise
        self.handles: list[list] = [] if self.split.prelude else \
            [[self.buffers[n].handle for n in k.bufs] for k in low.kernels]
        self.lock = threading.Lock()
        self.runs = 0
        self.graph_error: str | None = None  # why the device could not make a graph of this plan
        self.broken = False  # a run failed: the buffers may be gone (a CUDA context reset); never run it again

    def copy_in(self, arrays: dict[str, np.ndarray]) -> None:
        if self.split.prelude:
            self.run_prelude(arrays)
        for b, name in self.low.inputs:
            if not (self.split.prelude and name in self.low.bound):
                self.buffers[b].copyin(arrays[name])

    def run_prelude(self, arrays: dict[str, np.ndarray]) -> None:
        """Run the kernels that read only bound inputs, unless they ran on these very arrays before: their results
        (and the bound inputs the other kernels read) stay in buffers of their own, outside the memory plan's
        shared slots; the bound inputs and intermediates only they read are freed after."""
        bound = {name: arrays[name] for _, name in self.split.bound_inputs}
        if self.bound_arrays is not None and all(bound[n] is a for n, a in self.bound_arrays.items()):
            return
        self._free_constants()
        if self.graph is not None:  # (it bound the old constants' handles)
            graph, self.graph = self.graph, None
            try:
                graph.free()
            except Exception:
                pass
        written = {k.bufs[i] for k in self.low.kernels for i in written_indices(k) if i < len(k.bufs)}
        temporary: dict[Any, Buffer] = {}
        kept = set(self.split.kept)
        try:
            for b, name in self.split.bound_inputs:
                buf = Buffer.borrow(self.device, b, bound[name]) if b not in written else None
                if buf is None:
                    buf = Buffer(self.device, b)
                    buf.copyin(bound[name])
                self._hold(b, buf, kept, temporary)
            for k in self.split.prelude:
                for b in k.bufs:
                    if b not in self.buffers and b not in temporary:
                        self._hold(b, Buffer(self.device, b), kept, temporary)
                launch(k, [self.buffers[b] if b in self.buffers else temporary[b] for b in k.bufs])
            self.device.synchronize()
        finally:
            for buf in temporary.values():
                buf.free()
        self.prelude_runs += 1
        self.bound_arrays = bound
        self.handles = [[self.buffers[n].handle for n in k.bufs] for k in self.kernels]

    def _hold(self, key: Any, buf: Buffer, kept: set, temporary: dict[Any, Buffer]) -> None:
        if key in kept:
            self.buffers[key] = buf
            self.constants.append(key)
        else:
            temporary[key] = buf

    def _free_constants(self) -> None:
        constants, self.constants = self.constants, []
        for key in constants:
            buf = self.buffers.pop(key, None)
            if buf is not None:
                buf.free()

    def outputs(self) -> dict[str, np.ndarray]:
        result = {}
        for out_name, node in self.low.outputs:
            if node in self.buffers:
                arr = self.buffers[node].numpy()
            else:  # an empty output: no kernel ran
                dtype, shape = buffer_type(node)
                arr = np.zeros(shape, dtype=dtype.np)
            result[out_name] = to_user_array(arr, buffer_type(node)[0])
        return result

    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Copy `arrays` (by input name) in, run every kernel, copy the outputs out."""
        try:
            with profile.host_span(f"run on {self.device.name}", {"kernels": len(self.kernels),
                                                                  "as": "launch plan", "run": self.runs + 1}):
                self.copy_in(arrays)
                self.execute()
                result = self.outputs()
                self.device.synchronize()
        except BaseException:
            self.broken = True
            raise
        return result

    def capture(self) -> Any:
        """The plan's device graph (built on first use), or None where the device has none or refused this plan."""
        if self.graph is None and self.graph_error is None:
            launches = [(k.program(), h, k.global_size, k.local_size, k.vals)
                        for k, h in zip(self.kernels, self.handles)]
            try:
                self.graph = self.device.graph(launches, **(self.low.graph_options or {})) if launches else None
            except TgcError as e:
                self.graph_error = e.msg
            except Exception as e:  # no graph (a kernel with too many arguments, no compiler): launch each
                self.graph_error = f"{type(e).__name__}: {e}"
            if self.graph is None and self.graph_error is None:
                self.graph_error = f"{self.device.name} has no device graphs" if launches else "no kernels to run"
            if self.graph_error is not None and debug_level() >= 2:
                print(f"*** {self.device.name:<8} no graph for {len(launches)} kernels: {self.graph_error}",
                      file=sys.stderr)
        return self.graph

    def execute(self) -> None:
        """Launch every kernel once: as the device graph from the plan's second run on, else one by one."""
        self.runs += 1
        kernels = self.kernels
        graph = self.capture() if self.runs > self.graph_after and graphs_enabled() else None
        if graph is None:
            for k, h in zip(kernels, self.handles):
                launch(k, h, handles=True, in_place=debug_level() >= 2 and runs_in_place(self.low, k))
            return
        level = debug_level() if os.environ.get("DEBUG") else 0
        prof = profile.active
        try:
            t = prof.graph(self.device.name, kernels, lambda: graph(wait=True)) if prof is not None \
                else graph(wait=level >= 2)
        except TgcError:
            raise
        except Exception as e:  # a device failure is a runtime error, not a crash
            raise DeviceError(f"the graph of {_count(kernels)} ({_names(kernels)}) failed on "
                              f"{self.device.name}: {e}") from None
        if level >= 2:
            took = "time unknown" if t is None else \
                f"{t * 1e6:9.2f} us, {t * 1e6 / max(len(kernels), 1):.2f} us per kernel"  # (None: not timed, not 0)
            print(f"*** {self.device.name:<8} graph of {_count(kernels)} ({_names(kernels)}) ran in one launch: "
                  f"{took}", file=sys.stderr)

    def free(self) -> None:
        graph, self.graph = self.graph, None
        if graph is not None:
            try:
                graph.free()
            except Exception:
                pass
        buffers, self.buffers = self.buffers, {}
        for buf in buffers.values():
            try:
                buf.free()
            except Exception:  # a device that lost its memory (a CUDA context reset): nothing to give back
                pass


    def __del__(self) -> None:  # a plan dropped while another thread ran it (see Program._plan): give back
        try:
            self.free()
        except Exception:  # interpreter shutdown
            pass


class LaunchPlans:
    """The launch plans a program (or a package) keeps between runs, by key (device, dims, ...). The first run at
    a key keeps nothing (`run_program`: zero-copy where the device allows; but where kernels read only bound inputs,
    `tgc.engine.bound`, the plan is made at the first run, so those run once); the second makes the key's plan (its
    buffers kept, run as one device graph at once and on every later run). Plans of the last `most` keys are
    kept (oldest first in `plans`); older ones, and all on `release()`, free their buffers."""

    def __init__(self, most: int = 4):
        self.most = most
        self.plans: dict[Any, LaunchPlan] = {}
        self.seen: dict[Any, None] = {}  # keys run once without a plan, the last 4 * most

    def run(self, key: Any, lower: Any, arrays: dict[str, np.ndarray], once: Any = None, make: Any = None
            ) -> dict[str, np.ndarray]:
        """Run at `key` (`lower()` gives its `Executable` when a run or a plan needs it). `once(exe, arrays)`
        runs without a plan (default `run_program`), `make(exe)` makes the key's plan (default a `LaunchPlan`
        replayed as a device graph at once; a device list's: `tgc.engine.executable.StepsPlan`)."""
        once = once or run_program
        if key not in self.plans and key not in self.seen:
            exe = lower()
            if make is not None or not bound_work.split_of(exe).prelude:
                self.seen[key] = None
                while len(self.seen) > 4 * self.most:
                    self.seen.pop(next(iter(self.seen)))
                return once(exe, arrays)
            # work on bound inputs (weights) only: a plan at once, so that it runs once, not once per run
            lower = lambda: exe  # noqa: E731
        plan = self.plans.pop(key, None)
        if plan is not None and plan.broken:
            _release_plan(plan)
            plan = None
        if plan is None:
            plan = make(lower()) if make is not None else LaunchPlan(lower(), graph_after=0)
        self.plans[key] = plan  # (re)inserted last: the most recently used
        while len(self.plans) > self.most:
            _release_plan(self.plans.pop(next(iter(self.plans))))
        if not plan.lock.acquire(blocking=False):  # another thread runs this plan now: buffers of this run's own
            return once(plan.low, arrays)
        try:
            return plan.run(arrays)
        finally:
            plan.lock.release()

    def release(self) -> None:
        """Give back the device buffers the plans keep, and forget which keys ran."""
        plans, self.plans = self.plans, {}
        self.seen.clear()
        for plan in plans.values():
            _release_plan(plan)


def _release_plan(plan: LaunchPlan) -> None:
    """Free a plan's buffers unless a run holds it now (then they go with the plan, once unused)."""
    if plan.lock.acquire(blocking=False):
        try:
            plan.free()
        finally:
            plan.lock.release()


def _count(kernels: Any) -> str:
    return f"{len(kernels)} kernel{'' if len(kernels) == 1 else 's'}"


def _names(kernels: list) -> str:
    names = [k.name for k in kernels]
    return ", ".join(names) if len(names) <= 3 else f"{names[0]}, ..., {names[-1]}"


def to_user_array(arr: np.ndarray, dtype: DType) -> np.ndarray:
    """Device bytes -> the array users see (bf16 becomes float32)."""
    return bf16_to_f32(arr) if dtype == dtypes.bf16 else arr


def allocate(low: Executable, arrays: dict[str, np.ndarray] | None, buffers: dict[Any, Buffer],
             skip: set | frozenset = frozenset(), given: dict[int, Slot] | None = None) -> None:
    """Device buffers for a program's inputs (filled from `arrays`, unless None) and for every kernel's outputs, into
    `buffers` (passed in so that the caller can free whatever was allocated if this fails midway): the slots of
    the memory plan, each allocated once and owned (freed) by the first buffer placed in it (`given`: slots whose
    memory is given, owned by no buffer); inputs borrowed in place where the device allows (zero-copy CPU
    buffers) allocate nothing."""
    place = _placer(low.device, low.memory_plan(), buffers, given)

    # an input runs in place (no copy) where the device allows it (`Buffer.borrow`) and no kernel stores to it;
    # a kernel that did would write the user's array, so such an input gets its own copy
    written = {k.bufs[i] for k in low.kernels for i in written_indices(k) if i < len(k.bufs)} \
        if arrays is not None else set()
    for b, name in low.inputs:
        if b in skip:
            continue
        buf = Buffer.borrow(low.device, b, arrays[name]) if arrays is not None and b not in written else None
        if buf is not None:
            buffers[b] = buf
            continue
        place(b)
        if arrays is not None:
            buffers[b].copyin(arrays[name])
    for k in low.kernels:
        for node in k.bufs:
            if node not in buffers and node not in skip:
                place(node)


def _placer(device: Any, plan: MemoryPlan, buffers: dict[Any, Buffer], given: dict[int, Slot] | None = None) -> Any:
    """`place(key)`: put buffer `key` into `buffers`, in its slot of `plan` on `device` (each slot allocated
    once, owned by the first buffer placed in it; a `given` slot is not allocated and no buffer owns it)."""
    slots: dict[int, Slot] = dict(given or {})
    largest: dict[int, Any] = {}  # per slot, its largest buffer (what a too-large allocation is reported as)
    for k, i in plan.slot_of.items():
        if i not in largest or plan.sizes[k] > plan.sizes[largest[i]]:
            largest[i] = k

    def place(key: Any) -> None:
        index = plan.slot_of[key]
        owns = index not in slots
        if owns:
            slots[index] = Slot(device, plan.slots[index], largest[index])
        buffers[key] = Buffer(device, key, slots[index], owns)
    return place


def allocate_device(exe: Executable, d: int, buffers: dict[Any, Buffer]) -> None:
    """Device `d`'s buffers of a device list's executable, into `buffers` (its memory plan's slots; inputs not
    filled): every buffer its memory plan places."""
    place = _placer(exe.devices[d], exe.memory_plan(d), buffers)
    for key in exe.memory_plan(d).slot_of:
        if key not in buffers:
            place(key)


_STORED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def written_indices(k: LaunchableKernel) -> frozenset[int]:
    """The buffer indices a kernel writes (`LaunchableKernel.written`: a compiled kernel's AST's stores, a
    package's kernel its output, buffer 0)."""
    return k.written()


def stored_indices(ast: Any) -> frozenset[int]:
    """The DEFINE_GLOBAL indices a kernel's AST stores to (the buffers it writes), memoized per AST."""
    got = _STORED.get(ast)
    if got is None:
        found = set()
        for u in ast.toposort():
            if u.op is Ops.STORE and u.src:
                found.update(g.arg for g in u.src[0].toposort() if g.op is Ops.DEFINE_GLOBAL)
        got = _STORED[ast] = frozenset(i for i in found if isinstance(i, int))
    return got


def runs_in_place(low: Executable, k: Any) -> bool:
    """Whether the memory plan gives kernel `k` its output over one of its inputs (`MemoryPlan.inplace`)."""
    plan = low.memory_plan()
    bufs = set(k.bufs)
    return any(out in bufs and src in bufs for out, src in plan.inplace)


def launch(k, bufs: list, handles: bool = False, in_place: bool = False) -> float | None:
    """Run one kernel on `bufs` (Buffers, or their device handles with `handles`). With DEBUG>=2 it runs twice
    and prints a line with the second (warm) launch's time,
    its GFLOP/s and GB/s, and the first launch's time (which includes loading the binary and cold caches);
    a kernel only writes its output buffer, so the second run leaves the same values. A kernel that writes
    its output over its input (`in_place`) would read its own output the second time: it runs once, and the
    line gives that (cold) launch's time."""
    level = debug_level()
    if level >= 4:
        print(k.src, file=sys.stderr)
    if level >= 5:
        print(k.uops_text(), file=sys.stderr)
    prog = k.program()
    wait = level >= 2
    handles = bufs if handles else [b.handle for b in bufs]
    prof = profile.active
    if prof is not None and not wait:  # one synchronized launch, timed (tgc/profile.py)
        return prof.launch(k, lambda: _call(k, prog, handles, True))

    def once() -> float | None:
        st = time.perf_counter()
        if prof is not None:
            return prof.launch(k, lambda: _call(k, prog, handles, True))
        t = _call(k, prog, handles, wait)
        return (t if t is not None else time.perf_counter() - st) if wait else t

    first = once()
    if not wait:
        return first
    t = once() if not in_place else first
    # counts a symbolic package could not save are 0 bytes moved (`tgc.engine.bench.work_counts`): unknown, `-`
    known = k.bytes_moved > 0
    gflops = f"{k.flops / t / 1e9 if t > 0 else 0:8.2f}" if known else f"{'-':>8}"
    gbs = f"{k.bytes_moved / t / 1e9 if t > 0 else 0:8.2f}" if known else f"{'-':>8}"
    print(f"*** {k.device.name:<8} {k.name:<28} launch {str(k.global_size):<14} {t * 1e6:9.2f} us "
          f"{gflops} GFLOP/s {gbs} GB/s  " +
          ("(in place: one cold launch)" if in_place else f"(warm; first launch {first * 1e6:.2f} us)"),
          file=sys.stderr)
    return t



def _call(k: Any, prog: Any, handles: list, wait: bool) -> float | None:
    """Launch kernel `k`'s program on `handles`; a device failure becomes a DeviceError."""
    try:
        return prog(*handles, global_size=k.global_size, local_size=k.local_size, vals=k.vals, wait=wait)
    except TgcError:
        raise
    except Exception as e:  # a device failure is a runtime error, not a crash
        raise DeviceError(f"kernel {k.name} failed on {k.device.name}: {e}") from None
