"""Device buffers mapped into host memory, for `tgc serve` to receive a request blob straight into (OpenCL).

Contract: `mappable(device)` says whether the served device's buffers can be mapped (an OpenCL device: its
allocator hands out `cl.Buffer`s); only blobs of `MAP_MIN` bytes or more are. `MappedBlock.fresh(device, size)`
makes a new buffer of `size` bytes and maps it for writing; `MappedBlock(device, buffer, size)` maps an existing one
(the buffer a CopyIn's adoption replaced, kept for the next blob). `host` is a writable 1-D uint8 numpy view of the
mapping: the socket's bytes are received into it (`protocol.read_body`), and where the platform maps in place (PoCL
on the CPU: the same address every time) that is the buffer's own memory, so no copy follows. `adopt()` unmaps and
returns the buffer, now holding the blob, for a session's buffer to use as its handle; `release()` unmaps and frees
it. A block is used by one thread at a time (the connection that reads into it, then the batch that adopts or copies
from it); OpenCL's own calls are thread-safe, and a mapping waits, in the in-order queue, for every command queued
before it (an unmap needs no wait: the commands queued after it run after it).
`map_for_reading` maps a session's buffer for a copy out to be sent from (the server unmaps it once the answer is
out, with the session's lock still held).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Blobs and copies out of at least this many bytes go through a mapping; smaller ones are copied (a map and an unmap
# cost ~20-30 us of CPU and a hand-off to the platform's worker threads on PoCL; copying 256 KiB costs about that).
MAP_MIN = 256 << 10


def mappable(device: Any) -> bool:
    """Whether blobs for `device` can be received into its mapped buffers (an OpenCL device)."""
    try:
        from tgc.backends.opencl import OpenCLAllocator
    except Exception:  # (pyopencl missing: no OpenCL device either)
        return False
    return isinstance(getattr(device, "allocator", None), OpenCLAllocator)


class MappedBlock:
    """One device buffer of `size` bytes, mapped for writing (see the module's docstring)."""

    __slots__ = ("device", "buffer", "size", "host", "_map")

    def __init__(self, device: Any, buffer: Any, size: int):
        self.device, self.buffer, self.size = device, buffer, size
        cl = device.cl
        # WRITE_INVALIDATE_REGION: the old bytes need not be read back (they are never shown: a blob fills the block
        # before anyone reads it)
        host, _ = cl.enqueue_map_buffer(device.queue, buffer, cl.map_flags.WRITE_INVALIDATE_REGION, 0, (size,),
                                        np.uint8, is_blocking=True)
        self.host: np.ndarray | None = host
        self._map = host.base

    @classmethod
    def fresh(cls, device: Any, size: int) -> MappedBlock:
        """A new buffer of `size` bytes (not from the allocator's pool, which only the batch thread touches)."""
        buffer = device.allocator._alloc(size)
        try:
            return cls(device, buffer, size)
        except BaseException:  # (a buffer that cannot be mapped is not kept)
            buffer.release()
            raise

    def __len__(self) -> int:
        return self.size

    def _unmap(self) -> None:
        if self.host is not None:  # (later commands of the in-order queue run after the unmap: no wait)
            self.host = None
            self._map.release(self.device.queue)

    def adopt(self) -> Any:
        """Unmap and hand over the buffer (its bytes are the blob's); the block is spent."""
        self._unmap()
        buffer, self.buffer = self.buffer, None
        return buffer

    def release(self) -> None:
        """Unmap and free the buffer."""
        self._unmap()
        if self.buffer is not None:
            self.buffer.release()
            self.buffer = None


def map_for_reading(device: Any, buffer: Any, size: int) -> np.ndarray:
    """The first `size` bytes of an OpenCL `buffer`, mapped for reading (blocking: commands queued before it are
    done), as a 1-D uint8 array; its `base` is the mapping, which the caller releases (`base.release(queue)`)
    before anything may write the buffer again."""
    cl = device.cl
    host, _ = cl.enqueue_map_buffer(device.queue, buffer, cl.map_flags.READ, 0, (size,), np.uint8, is_blocking=True)
    return host
