"""The device surface every backend offers.

A backend is one module that defines a `Device` subclass. Its parts:

- `renderer`: turns a kernel's linear UOps into source text (`Renderer.render(name, uops) -> str`);
- `compiler`: source text to bytes (`Compiler.compile(src) -> bytes`), or None where this machine
  cannot compile for the device (then `compile_error` says why);
- `allocator`: `alloc(nbytes) -> handle`, `free(handle, nbytes)`, `copyin(handle, memoryview)`,
  `copyout(memoryview, handle)`;
- `program(name, lib) -> Program`: a loaded binary; calling it launches the kernel.

Launch convention, shared by every backend and by REMOTE:
`prog(*handles, global_size=(x, y, z), local_size=(x, y, z) | None, vals=(ints...), wait=False)`.
Buffers come in the order of the kernel's DEFINE_GLOBAL indices, `vals` in the order of its DEFINE_VARs.
With `wait=True` the call blocks until the kernel is done and returns its time in seconds.
On the CPU, `global_size[0]` is the number of threads; each gets its thread index as the first val
(`core_id`), and the kernel splits its outer loop by that index.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from tgc.capabilities import Capabilities
from tgc.errors import DeviceError
from tgc.interfaces import MemoryFeatures, RuntimeFeatures


class Allocator:
    """Device memory (`tgc.interfaces.DeviceMemory`). Subclasses implement `_alloc`/`_free`; `LRUAllocator` adds
    reuse. `features` declares what the allocator offers beyond alloc/free/copies; the methods behind a feature
    are defined here for every allocator (refusing, or the plain fallback) and overridden where declared."""

    features = MemoryFeatures()

    @property
    def zero_copy_align(self) -> int | None:
        return self.features.zero_copy_align

    @property
    def shared_slots(self) -> bool:
        return self.features.shared_slots

    def alloc(self, nbytes: int) -> Any:
        return self._alloc(nbytes)

    def free(self, handle: Any, nbytes: int) -> None:
        self._free(handle, nbytes)

    def _alloc(self, nbytes: int) -> Any:
        raise NotImplementedError

    def _free(self, handle: Any, nbytes: int) -> None:
        pass

    def copyin(self, handle: Any, src: memoryview) -> None:
        raise NotImplementedError

    def copyout(self, dest: memoryview, handle: Any) -> None:
        raise NotImplementedError

    # --- behind `features` (the defaults: the feature is not offered)
    def wrap(self, arr: Any) -> Any | None:
        """A handle on a user's array's own memory, or None where it must be copied (`zero_copy_align`)."""
        return None

    def give(self, handle: Any, dtype: Any, shape: tuple[int, ...]) -> Any | None:
        """An allocated buffer's memory as the user's array, or None where outputs are copied out."""
        return None

    def view(self, handle: Any, nbytes: int) -> Any:
        """The first `nbytes` of an allocation (`views`); without views, the allocation itself."""
        return handle

    def disown(self, handle: Any, nbytes: int) -> None:
        """Forget a buffer whose memory now belongs to the user (`pool`); nothing to forget without a pool."""

    def copyout_range(self, dest: memoryview, handle: Any, offset: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no ranged copies")

    def copyin_range(self, handle: Any, offset: int, src: memoryview) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no ranged copies")

    def offset(self, handle: Any, nbytes: int, offset: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no buffer views at an offset")

    def pooled_bytes(self) -> int:
        """Bytes of freed buffers kept for reuse (`pool`)."""
        return 0

    def free_cache(self) -> None:
        """Release the pool of freed buffers (`pool`)."""


class LRUAllocator(Allocator):
    """Keeps freed buffers by size and hands them out again, so a second run allocates nothing new.

    `allocations` counts real device allocations; `live_bytes` the bytes handed out and not yet freed, and
    `peak_bytes` its largest value since `reset_peak()` (the tests compare it with a memory plan's peak).
    """

    features = MemoryFeatures(pool=True)

    def __init__(self) -> None:
        self.cached: dict[int, list[Any]] = defaultdict(list)
        self.allocations = 0
        self.live_bytes = self.peak_bytes = 0

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def alloc(self, nbytes: int) -> Any:
        if self.cached[nbytes]:
            handle = self.cached[nbytes].pop()
        else:
            self.allocations += 1
            try:
                handle = self._alloc(nbytes)
            except MemoryError:
                self.free_cache()
                handle = self._alloc(nbytes)
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return handle

    def free(self, handle: Any, nbytes: int) -> None:
        self.live_bytes -= nbytes
        self.cached[nbytes].append(handle)

    def disown(self, handle: Any, nbytes: int) -> None:
        """A buffer whose memory now belongs to someone else (a zero-copy output handed to the user): no longer
        live here, and never handed out again."""
        self.live_bytes -= nbytes

    def pooled_bytes(self) -> int:
        return sum(size * len(handles) for size, handles in self.cached.items())

    def free_cache(self) -> None:
        for nbytes, handles in self.cached.items():
            for h in handles:
                self._free(h, nbytes)
        self.cached.clear()


class HostAllocator(LRUAllocator):
    """Host memory as 64-byte-aligned numpy byte arrays (the handle is the array): CPU-side devices."""

    align = 64
    features = MemoryFeatures(host_buffers=True, views=True, ranged_copies=True, pool=True)

    def _alloc(self, nbytes: int) -> Any:
        import numpy as np
        raw = np.empty(nbytes + self.align, dtype=np.uint8)
        offset = (-raw.ctypes.data) % self.align
        return raw[offset:offset + nbytes]

    def view(self, handle: Any, nbytes: int) -> Any:
        """The first `nbytes` of an allocation (a memory plan's slot shared by smaller buffers)."""
        return handle[:nbytes]

    def copyin(self, handle: Any, src: memoryview) -> None:
        import numpy as np
        np.copyto(handle, np.frombuffer(src, dtype=np.uint8))

    def copyout(self, dest: memoryview, handle: Any) -> None:
        import numpy as np
        np.copyto(np.frombuffer(dest, dtype=np.uint8), handle)

    def copyout_range(self, dest: memoryview, handle: Any, offset: int) -> None:
        """Bytes `offset .. offset + len(dest)` of a buffer (the multi-device collectives copy chunks)."""
        import numpy as np
        np.copyto(np.frombuffer(dest, dtype=np.uint8), handle[offset:offset + dest.nbytes])

    def copyin_range(self, handle: Any, offset: int, src: memoryview) -> None:
        import numpy as np
        np.copyto(handle[offset:offset + src.nbytes], np.frombuffer(src, dtype=np.uint8))

    # Zero-copy host buffers (see docs/DESIGN.md, "Zero-copy CPU buffers"): where `features.zero_copy_align` is
    # set, a handle is any C-contiguous uint8 numpy array whose data starts at a multiple of it, so a user's input
    # array runs in place and an output's memory is handed to the user. None: every buffer is a copy.

    def wrap(self, arr: Any) -> Any | None:
        """A handle on `arr`'s own memory (read-only use: kernels never write an input), or None where it must
        be copied (zero-copy off, not C-contiguous, misaligned, or empty)."""
        align = self.zero_copy_align
        if align is None or not arr.flags.c_contiguous or not arr.nbytes or arr.ctypes.data % align:
            return None
        return arr.reshape(-1).view("uint8")

    def give(self, handle: Any, dtype: Any, shape: tuple[int, ...]) -> Any | None:
        """An allocated buffer's memory as the user's array (numpy owns it from here on: it is never freed into
        the pool), or None where outputs must be copied out."""
        if self.zero_copy_align is None:
            return None
        import numpy as np
        return np.asarray(handle).view(dtype).reshape(shape)  # (a plain ndarray, not the allocator's type)


class Compiler:
    """Source text to bytes. `name` and `version` go into the disk-cache key."""

    name = "none"
    version = "0"
    # what else names this compiler in the disk-cache key, for a compiler that runs elsewhere (REMOTE); None: nothing
    cache_identity: tuple[str, ...] | None = None
    source_assembly = False  # `assembly(src)` lists the assembly from the source (else: `disassemble(binary)`)

    # how many kernel sources `compile_batch` builds together at most (`tgc.codegen.kernel.build_kernels` sends a
    # program's cache misses in groups of this size); 1: each source is compiled alone
    batch_max = 1

    def compile(self, src: str) -> bytes:
        raise NotImplementedError

    def compile_batch(self, srcs: list[str]) -> list[bytes]:
        """The binaries of `srcs` (one kernel each), in order, as `compile` gives them, raising as `compile` does
        for the first source that does not compile. A compiler whose builds have a large fixed cost (PoCL) builds
        them as one program: each binary may then hold the other kernels too, and loads its own by name."""
        return [self.compile(src) for src in srcs]

    def disassemble(self, lib: bytes, src: str | None = None) -> str:
        """Human-readable assembly of a compiled binary (for `--emit asm`); `src`, the kernel's source, for
        compilers that need it (a binary holding several kernels, a listing regenerated from the source)."""
        raise NotImplementedError

    def assembly(self, src: str) -> str:
        """The assembly listing of `src`, made from the source (for `--emit asm`): compilers that say
        `source_assembly`; the others' listing is the disassembly of the binary."""
        raise NotImplementedError

    def optimized_ir(self, src: str) -> str:
        """The compiler's IR after its optimizer ran on `src` (for `--emit ir`; LLVM compilers only)."""
        raise NotImplementedError

    @property
    def cache_key(self) -> str:
        return f"{self.name}-{self.version}"


class Program:
    """A compiled kernel loaded on a device."""

    def __init__(self, device: Device, name: str, lib: bytes):
        self.device, self.name, self.lib = device, name, lib

    def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1),
                 local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
                 wait: bool = False) -> float | None:
        raise NotImplementedError


class Device:
    """One device instance, e.g. `CPU:0`. Subclasses set the class attributes and override what differs."""

    kind = "NONE"  # the registry name, e.g. "CPU"
    renderer: Any = None
    compiler: Compiler | None = None
    allocator: Allocator
    # Launch shape: "cpu" (threads over the outer loop) or "gpu" (global/local grid).
    launch_style = "cpu"
    # The largest buffer the device can allocate, where it states one (OpenCL, Metal); None: memory is the limit.
    max_buffer_bytes: int | None = None
    # Lower launch limits than the renderer's, where this device states them (threads per work-group, bytes of
    # shared memory per work-group); None: the renderer's.
    max_local_size: int | None = None
    max_shared_bytes: int | None = None
    # what the runtime offers beyond launches (tgc/interfaces.py); the methods behind it are defined below
    runtime = RuntimeFeatures()

    def __init__(self, index: int = 0):
        self.index = index

    def shared(self, position: int, count: int) -> Device:
        """This device as the `position`-th of `count` devices of its kind in one device list (the CPU gives
        each its own share of the cores; other kinds are used as they are)."""
        return self

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.index}" if self.index or getattr(self, "share", None) else self.kind

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        """(can it run here, why not). Cheap: no heavy imports beyond what the probe needs."""
        return True, ""

    @property
    def compile_error(self) -> str | None:
        """Why this machine cannot compile for the device, or None."""
        return None

    @property
    def cores(self) -> int:
        """Threads one CPU-style launch may split its outer loop across (`core_id`): 1 unless the device has more
        (the CPU: its cores or TGC_THREADS). A runtime fact of the device, read by the optimizer's thread split."""
        return 1

    @property
    def caps(self) -> Capabilities:
        """What this device can do (tgc/capabilities.py): its renderer's declaration within the device's limits.
        The scheduler and the optimizer read this, never the device's kind."""
        declared = self.renderer.caps if self.renderer is not None else Capabilities()
        return declared.limited(self.max_local_size, self.max_shared_bytes)

    def binary_target(self) -> str:
        """What a compiled binary must have been built for to load here (a package records it): by default the
        compiler's identity (name and version)."""
        return self.compiler.cache_key if self.compiler is not None else self.kind

    def ensure_runnable(self) -> None:
        """Raise DeviceError (why, in one line) when kernels cannot run on this device here. Called before a
        program allocates anything; devices that only find out on first use (a GPU context) may do nothing."""

    def program(self, name: str, lib: bytes) -> Program:
        raise NotImplementedError

    def canonical_source(self, src: str) -> str:
        """`src` as far as its binary depends on it: sources equal here share one binary (the compile cache's key,
        and one compile for a program's identical kernels). By default the source itself; a device whose
        `program(name, lib)` loads a binary's one kernel under any name drops the name and comments (CPU)."""
        return src

    def synchronize(self) -> None:
        pass

    def graph(self, launches: list[tuple]) -> Any:
        """One device graph running `launches` (each `(program, handles, global_size, local_size, vals)`) in
        order, called as `graph(wait=False) -> seconds | None` and released by `graph.free()`; None where the
        device has none (the launch plan then launches each kernel, waiting once at the end). A graph binds
        the buffers given: other buffers need another graph."""
        return None

    def copy_to(self, src_handle: Any, dst_dev: Any, dst_handle: Any, nbytes: int, src_offset: int = 0,
                dst_offset: int = 0) -> bool:
        """Copy to another device's buffer without host memory (`runtime.direct_copies`); False: not done here
        (the caller copies through host memory)."""
        return False

    @classmethod
    def copy_batch(cls, devices: Any, src_handles: Any, dst_handles: Any, moves: Any) -> bool:
        """A collective step's copies in one call (`runtime.batched_copies`); False: not done."""
        return False

    @classmethod
    def reduce_batch(cls, devices: Any, handles: Any, moves: Any, op: Any, dtype: Any) -> bool:
        """A collective step's reductions in one call (`runtime.batched_reduces`); False: not done."""
        return False

    def compile_pool(self, workers: int) -> Any:
        """Worker processes that compile many sources at once (BEAM), or None: compile in-process."""
        return None

    def info(self) -> dict[str, Any]:
        """Facts for `tgc devices`: versions, peak figures where known."""
        return {}

    def lint(self, src: str) -> None:
        """Check a kernel's source without compiling it (CompileError), where this machine cannot compile for
        the device but can still type-check (OpenCL and Metal through libclang); else nothing."""


def keep_python_sigint() -> None:
    """Put Python's own SIGINT handler back after a native library changed it.

    NVRTC re-installs it with SA_RESTART and PoCL replaces it with its own: after either, Ctrl-C no longer
    interrupts a blocked wait (a CPU launch waiting for its threads), so KeyboardInterrupt arrives only when
    the kernel ends. Only the main thread can set handlers; elsewhere this does nothing."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        handler = signal.getsignal(signal.SIGINT)
        if handler is not None:  # None: installed outside Python, leave it
            signal.signal(signal.SIGINT, handler)
    except (ValueError, OSError, TypeError):
        pass


def timed(fn, *args, **kwargs) -> float:
    st = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - st


def require(ok: bool, msg: str) -> None:
    if not ok:
        raise DeviceError(msg)
