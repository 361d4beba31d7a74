"""The realizer: allocate buffers, copy inputs in, launch a program's kernels in order, copy outputs out."""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from tgc.errors import DeviceError, TgcError
from tgc.ir.shapes import prod, shape_of
from tgc.ir.uop import Ops, UOp


def _debug() -> int:
    from tgc.env import env_int

    try:
        return env_int("DEBUG", 0)
    except TgcError:  # the CLI refuses a bad DEBUG up front; the API runs as without it
        return 0


class Buffer:
    """Device memory holding one tensor node's values (contiguous)."""

    def __init__(self, device: Any, node: UOp):
        self.device, self.node = device, node
        self.nbytes = max(prod(shape_of(node)) * node.dtype.itemsize, 1)
        limit = getattr(device, "max_buffer_bytes", None)
        if limit is not None and self.nbytes > limit:
            raise DeviceError(f"a {node.dtype.name}{list(shape_of(node))} buffer takes {self.nbytes} bytes, more than "
                              f"the {limit} bytes {device.name} can allocate at once",
                              hint="use smaller tensors, or a device without this limit (CPU, CUDA)")
        self.handle = device.allocator.alloc(self.nbytes)

    def copyin(self, arr: np.ndarray) -> None:
        if arr.nbytes:
            self.device.allocator.copyin(self.handle, memoryview(np.ascontiguousarray(arr)).cast("B"))

    def numpy(self) -> np.ndarray:
        out = np.empty(shape_of(self.node), dtype=self.node.dtype.np)
        if out.nbytes:
            self.device.allocator.copyout(memoryview(out).cast("B"), self.handle)
        return out

    def free(self) -> None:
        self.device.allocator.free(self.handle, self.nbytes)


def run_program(prog, device: str | None, dims: dict[str, int], arrays: dict[str, np.ndarray]
                ) -> dict[str, np.ndarray]:
    from tgc.api import to_user_array
    from tgc.backends import default_device, get_device

    name = device or default_device()
    if "," in name:
        raise TgcError(f"device lists such as '{name}' (one program sharded across devices) are not supported yet",
                       hint="run on one device, e.g. " + name.split(",")[0].strip())
    dev = get_device(name)
    dev.ensure_runnable()
    kernels = prog.compile(device=name, dims=dims)
    outs, in_bufs = prog._trace(dims)
    buffers: dict[UOp, Buffer] = {}
    try:
        allocate(dev, prog, kernels, in_bufs, arrays, buffers)
        for k in kernels:
            launch(k, [buffers[n] for n in k.bufs])
        result = {}
        for out_name, node in zip(prog.output_names, outs):
            if node in buffers:
                arr = buffers[node].numpy()
            else:  # an empty output: no kernel ran
                arr = np.zeros(shape_of(node), dtype=node.dtype.np)
            result[out_name] = to_user_array(arr, node.dtype)
        dev.synchronize()
        return result
    finally:
        for buf in buffers.values():
            buf.free()


def allocate(dev: Any, prog, kernels: list, in_bufs: list[UOp], arrays: dict[str, np.ndarray],
             buffers: dict[UOp, Buffer]) -> None:
    """Device buffers for a program's inputs (filled from `arrays`) and for every kernel's outputs, into
    `buffers` (passed in so that the caller can free whatever was allocated if this fails midway)."""
    for b in in_bufs:
        buffers[b] = Buffer(dev, b)
        buffers[b].copyin(arrays[prog.inputs[b.arg[0]].name])
    for k in kernels:
        for node in k.bufs:
            if node not in buffers:
                buffers[node] = Buffer(dev, node)


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


_ = Ops
