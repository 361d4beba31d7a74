"""What the engine may rely on, declared in one place (issue 21 item 0): a launchable kernel, a buffer spec, a
device's memory and its runtime. The realizer, the multi-device runner and the REMOTE server read these
declarations, never probe an object for a method (`getattr`/`hasattr`): every allocator states its
`MemoryFeatures`, every device its `RuntimeFeatures`, and the methods behind a feature exist on every
implementation (`tgc.backends.base.Allocator`/`Device` give the defaults), called only where the feature is
declared. Base layer: imports nothing from tgc.

- `LaunchableKernel`: what a run launches. A compiled kernel (`tgc.codegen.kernel.Kernel`) and a package's
  kernel (`tgc.package.PackagedKernel`) both implement it; the engine takes nothing else from a kernel.
- `BufferSpec`: a planned buffer that is not a tensor node (a package's `PlanBuffer`, a chunked run's whole
  output): its dtype and concrete shape. Tensor nodes are buffer keys too (their shape is the graph's).
- `DeviceMemory` and `MemoryFeatures`: an allocator and what it offers beyond alloc/free/copy.
- `Runtime` and `RuntimeFeatures`: a device as the engine runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class MemoryFeatures:
    """What an allocator offers beyond `alloc`/`free`/`copyin`/`copyout` (each a method of `DeviceMemory`):

    - `zero_copy_align`: host buffers that a user's array may be (`wrap`) and that may be handed to the user
      (`give`) where its data starts at a multiple of this; None: every buffer is a copy.
    - `host_buffers`: handles are host memory (numpy byte arrays): a chunked run writes a chunk's output into
      a view of the whole one.
    - `views`: `view(handle, nbytes)` gives the start of a larger allocation (memory-plan slots shared by
      smaller buffers hand them views); else the slot's handle itself.
    - `shared_slots`: a memory plan may place several buffers in one allocation (False: a copy out returns
      the whole allocation, REMOTE).
    - `ranged_copies`: `copyin_range`/`copyout_range` copy part of a buffer (else the engine copies the
      whole buffer through host memory).
    - `offsets`: `offset(handle, nbytes, offset)` makes a handle into the middle of a buffer.
    - `pool`: freed buffers are kept for reuse (`disown` forgets a handed-over one, `pooled_bytes` and
      `free_cache` bound the pool)."""

    zero_copy_align: int | None = None
    host_buffers: bool = False
    views: bool = False
    shared_slots: bool = True
    ranged_copies: bool = False
    offsets: bool = False
    pool: bool = False


class DeviceMemory(Protocol):
    """An allocator. Every method exists on every allocator; those behind a feature are called only where
    `features` declares it."""

    features: MemoryFeatures

    def alloc(self, nbytes: int) -> Any: ...
    def free(self, handle: Any, nbytes: int) -> None: ...
    def copyin(self, handle: Any, src: memoryview) -> None: ...
    def copyout(self, dest: memoryview, handle: Any) -> None: ...
    def wrap(self, arr: Any) -> Any | None: ...
    def give(self, handle: Any, dtype: Any, shape: tuple[int, ...]) -> Any | None: ...
    def view(self, handle: Any, nbytes: int) -> Any: ...
    def disown(self, handle: Any, nbytes: int) -> None: ...
    def copyin_range(self, handle: Any, offset: int, src: memoryview) -> None: ...
    def copyout_range(self, dest: memoryview, handle: Any, offset: int) -> None: ...
    def offset(self, handle: Any, nbytes: int, offset: int) -> Any: ...
    def pooled_bytes(self) -> int: ...
    def free_cache(self) -> None: ...


@dataclass(frozen=True)
class RuntimeFeatures:
    """What a device's runtime offers beyond launching kernels (each behind a method of `Runtime`):

    - `native_launch`: kernels run as native code in this process (`tgc serve` runs them in killable worker
      processes and checks every launch).
    - `direct_copies`: `copy_to(...)` copies between two devices without host memory (it may still decline).
    - `batched_copies` / `batched_reduces`: the device class does a whole collective step's copies
      (`copy_batch`) or reductions (`reduce_batch`) in one call (it may still decline).
    - `max_work_items`: the most work-items one GPU-style launch may ask for; None: no stated limit.
    - `rebind_graphs`: a device graph (`graph(...)`) can be pointed at other buffers between runs
      (`group = graph.bind_args(uses, handle)`: the buffer arguments (launch i, argument j) in `uses`, all on
      `handle`, as one group holding that buffer alive in `group.handle`, which the caller may set to None once
      it will rebind the group before the next run; `graph.rebind(group, handle)` points them at another buffer
      as large): a chunked run keeps its chunks' graphs and patches the inputs' and outputs' addresses."""

    native_launch: bool = False
    direct_copies: bool = False
    batched_copies: bool = False
    batched_reduces: bool = False
    max_work_items: int | None = None
    rebind_graphs: bool = False


class Runtime(Protocol):
    """A device as the engine runs it (`tgc.backends.base.Device`)."""

    name: str
    kind: str
    allocator: DeviceMemory
    runtime: RuntimeFeatures
    max_buffer_bytes: int | None

    def program(self, name: str, lib: bytes) -> Any: ...
    def synchronize(self) -> None: ...
    def graph(self, launches: list[tuple]) -> Any: ...
    def copy_to(self, src_handle: Any, dst_dev: Any, dst_handle: Any, nbytes: int, src_offset: int = 0,
                dst_offset: int = 0) -> bool: ...


class LaunchableKernel(Protocol):
    """A kernel a run can launch: its program on `bufs` (buffer keys, DEFINE_GLOBAL order) with its launch sizes
    and `vals`; `written()` the buffer indices it stores to; `linear_uops()` its linear UOps where it keeps them
    (None: a packaged kernel, which keeps source and binary only)."""

    name: str
    src: str
    bufs: list
    global_size: tuple[int, int, int]
    local_size: tuple[int, int, int] | None
    vals: tuple[int, ...]
    flops: int
    bytes_moved: int
    graph_flops: int
    line: int | None
    opts: list
    device: Any

    def program(self) -> Any: ...
    def uops_text(self) -> str: ...
    def written(self) -> frozenset[int]: ...
    def linear_uops(self) -> list | None: ...


@dataclass(eq=False)
class BufferSpec:
    """A planned buffer that is not a tensor node: its dtype and concrete shape (`plan_shape`). Compared by
    identity (each is one buffer of a plan)."""

    dtype: Any
    plan_shape: tuple[int, ...]


__all__ = ["BufferSpec", "DeviceMemory", "LaunchableKernel", "MemoryFeatures", "Runtime", "RuntimeFeatures"]
