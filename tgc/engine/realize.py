"""The realizer: allocate buffers, copy inputs in, launch a program's kernels in order, copy outputs out.

It takes a lowered program (`Lowered`: the device object, compiled kernels, input and output nodes) and
imports nothing above the scheduler: `Program.run` (tgc.api) looks the device up and compiles."""

from __future__ import annotations

import sys
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from tgc.dtype import DType, bf16_to_f32, dtypes
from tgc.env import env_int
from tgc.errors import DeviceError, TgcError
from tgc.ir.shapes import prod, shape_of
from tgc.ir.uop import Ops, UOp


def _debug() -> int:
    try:
        return env_int("DEBUG", 0)
    except TgcError:  # the CLI refuses a bad DEBUG up front; the API runs as without it
        return 0


class Buffer:
    """Device memory holding one tensor node's values (contiguous).

    On a device with zero-copy host buffers (the CPU, see docs/DESIGN.md) a buffer may instead borrow a
    user's input array (`Buffer.borrow`: `owned` is False, and freeing it leaves the array alone) or hand its
    own memory to the user as an output (`numpy(give=True)`: it is then never freed into the pool)."""

    def __init__(self, device: Any, node: UOp, handle: Any = None):
        self.device, self.node = device, node
        self.nbytes = max(prod(shape_of(node)) * node.dtype.itemsize, 1)
        limit = device.max_buffer_bytes
        if limit is not None and self.nbytes > limit:
            raise DeviceError(f"a {node.dtype.name}{list(shape_of(node))} buffer takes {self.nbytes} bytes, more than "
                              f"the {limit} bytes {device.name} can allocate at once",
                              hint="use smaller tensors, or a device without this limit (CPU, CUDA)")
        self.owned = handle is None
        self.handle = device.allocator.alloc(self.nbytes) if handle is None else handle

    @classmethod
    def borrow(cls, device: Any, node: UOp, arr: np.ndarray) -> Buffer | None:
        """A buffer on `arr`'s own memory, or None where it must be copied in (the device copies, or `arr` is
        misaligned, strided, empty, or not laid out as the node's dtype)."""
        wrap = getattr(device.allocator, "wrap", None)
        if wrap is None or arr.dtype != node.dtype.np or arr.nbytes != prod(shape_of(node)) * node.dtype.itemsize:
            return None
        handle = wrap(arr)
        return None if handle is None else cls(device, node, handle)

    def copyin(self, arr: np.ndarray) -> None:
        if arr.nbytes:
            self.device.allocator.copyin(self.handle, memoryview(np.ascontiguousarray(arr)).cast("B"))

    def numpy(self, give: bool = False) -> np.ndarray:
        """The values as a numpy array: a copy, or with `give` (an owned buffer on a zero-copy device) the
        buffer's memory itself, which from then on belongs to the returned array."""
        shape, dtype = shape_of(self.node), self.node.dtype.np
        if give and self.owned and prod(shape):
            give_fn = getattr(self.device.allocator, "give", None)
            arr = give_fn(self.handle, dtype, shape) if give_fn is not None else None
            if arr is not None:
                self.owned = False
                return arr
        out = np.empty(shape, dtype=dtype)
        if out.nbytes:
            self.device.allocator.copyout(memoryview(out).cast("B"), self.handle)
        return out

    def free(self) -> None:
        if self.owned:
            self.device.allocator.free(self.handle, self.nbytes)


@dataclass
class Lowered:
    """A program lowered for one device: what the realizer and `tgc bench` run. `kernels` in launch order
    (each with its `program()`, `bufs`, launch sizes and `vals`), `inputs` the input tensor nodes with the
    names their arrays come under, `outputs` the output names with their tensor nodes."""

    device: Any
    kernels: list
    inputs: list[tuple[UOp, str]]
    outputs: list[tuple[str, UOp]]


def run_program(low: Lowered, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Allocate, copy `arrays` (by input name) in, launch every kernel in order, copy the outputs out."""
    dev = low.device
    buffers: dict[UOp, Buffer] = {}
    try:
        if getattr(dev.allocator, "zero_copy_align", None) is None:
            allocate(low, arrays, buffers)
            for k in low.kernels:
                launch(k, [buffers[n] for n in k.bufs])
        else:
            _run_host(low, arrays, buffers)
        result = {}
        for out_name, node in low.outputs:
            if node in buffers:
                # an output that no kernel wrote (an input) is copied: a user's array is never returned as another
                arr = buffers[node].numpy(give=True)
            else:  # an empty output: no kernel ran
                arr = np.zeros(shape_of(node), dtype=node.dtype.np)
            result[out_name] = to_user_array(arr, node.dtype)
        dev.synchronize()
        return result
    finally:
        for buf in buffers.values():
            buf.free()


def _run_host(low: Lowered, arrays: dict[str, np.ndarray], buffers: dict[UOp, Buffer]) -> None:
    """The launches on a device whose kernels have finished when `launch` returns (the CPU): an intermediate
    buffer is allocated just before its first kernel and goes back to the pool right after its last, so a
    later kernel's buffer of the same size reuses it (a chain of kernels keeps two intermediates, not all)."""
    allocate_inputs(low, arrays, buffers)
    keep = set(buffers) | {node for _, node in low.outputs}
    last = {n: i for i, k in enumerate(low.kernels) for n in k.bufs}
    for i, k in enumerate(low.kernels):
        for n in k.bufs:
            if n not in buffers:
                buffers[n] = Buffer(low.device, n)
        launch(k, [buffers[n] for n in k.bufs])
        for n in set(k.bufs):
            if last[n] == i and n not in keep:
                buffers.pop(n).free()


def to_user_array(arr: np.ndarray, dtype: DType) -> np.ndarray:
    """Device bytes -> the array users see (bf16 becomes float32)."""
    return bf16_to_f32(arr) if dtype == dtypes.bf16 else arr


def allocate(low: Lowered, arrays: dict[str, np.ndarray], buffers: dict[UOp, Buffer]) -> None:
    """Device buffers for a program's inputs (filled from `arrays`) and for every kernel's outputs, into
    `buffers` (passed in so that the caller can free whatever was allocated if this fails midway).

    An input runs in place (no copy) where the device allows it (`Buffer.borrow`) and no kernel stores to it;
    a kernel that did would write the user's array, so such an input gets its own copy."""
    allocate_inputs(low, arrays, buffers)
    for k in low.kernels:
        for node in k.bufs:
            if node not in buffers:
                buffers[node] = Buffer(low.device, node)


def allocate_inputs(low: Lowered, arrays: dict[str, np.ndarray], buffers: dict[UOp, Buffer]) -> None:
    """The input buffers of `allocate`: borrowed where allowed and no kernel of `low` stores to them, else
    copies."""
    written = {k.bufs[i] for k in low.kernels for i in stored_indices(k.ast) if i < len(k.bufs)}
    for b, name in low.inputs:
        buf = Buffer.borrow(low.device, b, arrays[name]) if b not in written else None
        if buf is None:
            buf = Buffer(low.device, b)
            buf.copyin(arrays[name])
        buffers[b] = buf


_STORED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def stored_indices(ast: UOp) -> frozenset[int]:
    """The DEFINE_GLOBAL indices a kernel's AST stores to (the buffers it writes), memoized per AST."""
    got = _STORED.get(ast)
    if got is None:
        found = set()
        for u in ast.toposort():
            if u.op is Ops.STORE and u.src:
                found.update(g.arg for g in u.src[0].toposort() if g.op is Ops.DEFINE_GLOBAL)
        got = _STORED[ast] = frozenset(i for i in found if isinstance(i, int))
    return got


def launch(k, bufs: list[Buffer]) -> float | None:
    """Run one kernel. With DEBUG>=2 it runs twice and prints a line with the second (warm) launch's time,
    its GFLOP/s and GB/s, and the first launch's time (which includes loading the binary and cold caches);
    a kernel only writes its output buffer, so the second run leaves the same values."""
    level = _debug()
    if level >= 4:
        print(k.src, file=sys.stderr)
    if level >= 5:
        print(k.uops_text(), file=sys.stderr)
    prog = k.program()
    wait = level >= 2

    def once() -> float | None:
        st = time.perf_counter()
        try:
            t = prog(*[b.handle for b in bufs], global_size=k.global_size, local_size=k.local_size, vals=k.vals,
                     wait=wait)
        except TgcError:
            raise
        except Exception as e:  # a device failure is a runtime error, not a crash
            raise DeviceError(f"kernel {k.name} failed on {k.device.name}: {e}") from None
        return (t if t is not None else time.perf_counter() - st) if wait else t

    first = once()
    if not wait:
        return first
    t = once()
    gflops = k.flops / t / 1e9 if t > 0 else 0
    gbs = k.bytes_moved / t / 1e9 if t > 0 else 0
    print(f"*** {k.device.name:<8} {k.name:<28} launch {str(k.global_size):<14} {t * 1e6:9.2f} us "
          f"{gflops:8.2f} GFLOP/s {gbs:8.2f} GB/s  (warm; first launch {first * 1e6:.2f} us)", file=sys.stderr)
    return t

