"""The CPU device: LLVM IR compiled by llvmlite to an object file, loaded in-process, run on threads.

Compiled objects are plain bytes (cacheable on disk); `tgc.backends.elf` loads them without llvmlite,
so a cached run never imports LLVM. Each launch runs `global_size[0]` threads; thread i gets i as its
last argument (`core_id`) and the kernel splits its outer loop by it. On a busy machine (the rule a CPU graph runs
serially by, `tgc.backends.cpu_graph.oversubscribed`) the calling thread runs every core id's chunk in turn instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from tgc.backends.base import Device, HostAllocator, Program
from tgc.backends.llvm_compile import (  # noqa: F401  (re-exported: the compiler and its rules lived here)
    COMPILER,
    LLVM_OPTIONS,
    LLVMCompiler,
    _cpu_fingerprint,
    _set_llvm_options,
    needs_slp,
    needs_unroll,
)
from tgc.interfaces import MemoryFeatures, RuntimeFeatures

if TYPE_CHECKING:  # (imported when a launch first needs threads: not on a one-thread run's start-up)
    from concurrent.futures import ThreadPoolExecutor


class HostBuffer(np.ndarray):
    """A CPU buffer (the allocator's handle) that knows its data's address (`address`, taken once at allocation:
    numpy's `.ctypes.data` costs about a microsecond per call, per buffer, per launch). Views and results of
    operations on it carry no `address`; `data_address` falls back to `.ctypes.data` for them."""

    __slots__ = ("address",)  # (no per-buffer __dict__)
    address: int


def data_address(buf: Any) -> int:
    """The data address of a CPU buffer handle (any C-contiguous numpy array)."""
    addr = getattr(buf, "address", None)
    return addr if addr is not None else buf.ctypes.data


class CPUAllocator(HostAllocator):
    """Host memory for the CPU device (64-byte aligned for vector loads); zero-copy for the user's arrays.

    A buffer that an interrupted kernel may still be writing (see `_Abandoned`) is not handed out again
    when freed: it is dropped from the pool and released once that kernel is done."""

    # inputs run in place when aligned as the LLVM renderer declares its buffer parameters
    # (16 = tgc.backends.llvmir.PARAM_ALIGN, not imported on a warm run's start-up: tests/test_warm_start.py checks)
    features = MemoryFeatures(zero_copy_align=16, host_buffers=True, views=True, ranged_copies=True, pool=True)

    def __init__(self) -> None:
        super().__init__()
        self.busy: set[int] = set()  # data addresses of buffers that abandoned kernels still use

    def _alloc(self, nbytes: int) -> Any:
        handle = super()._alloc(nbytes).view(HostBuffer)
        handle.address = handle.ctypes.data
        return handle

    def view(self, handle: Any, nbytes: int) -> Any:
        """The first `nbytes` of a slot, knowing its address as the slot does."""
        view = handle[:nbytes]
        view.address = data_address(handle)
        return view

    def free(self, handle: Any, nbytes: int) -> None:
        if data_address(handle) in self.busy:
            return
        super().free(handle, nbytes)


class _Abandoned:
    """Launches interrupted by Ctrl-C (KeyboardInterrupt) while their threads still run native code.

    A running kernel cannot be stopped, so its program (the loaded code) and its buffers are kept alive
    here until its threads finish: freeing them under the threads is what crashed (exit 139). `running()`
    tells the CLI to leave at once with os._exit (memory is never freed under a kernel) instead of a normal
    exit, which would first wait for the kernel to finish."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._launches: list[tuple[Any, list[Any], list[Any]]] = []  # (program, buffers, futures)

    def add(self, program: Any, bufs: list[Any], futures: list[Any]) -> None:
        allocator = program.device.allocator
        with self._lock:
            self._launches.append((program, bufs, futures))
            allocator.busy.update(b.ctypes.data for b in bufs)
        for f in futures:
            f.add_done_callback(lambda _f: self._reap())
        self._reap()

    def _reap(self) -> None:
        with self._lock:
            done = [entry for entry in self._launches if all(f.done() for f in entry[2])]
            for entry in done:
                self._launches.remove(entry)
            still = {b.ctypes.data for _, bufs, _ in self._launches for b in bufs}
            for program, bufs, _ in done:
                program.device.allocator.busy.difference_update(b.ctypes.data for b in bufs
                                                                if b.ctypes.data not in still)

    def running(self) -> bool:
        self._reap()
        with self._lock:
            return bool(self._launches)


ABANDONED = _Abandoned()


@contextlib.contextmanager
def _sigint_deferred():
    """Block SIGINT on this thread for the block's duration (where the platform can); a Ctrl-C in between is
    delivered, as KeyboardInterrupt, right after it."""
    import signal
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def kernels_running() -> bool:
    """True while a kernel interrupted by Ctrl-C still runs on some thread (see `_Abandoned`)."""
    return ABANDONED.running()


def _busy(threads: int, device: Any) -> bool:
    """Whether `threads` threads would oversubscribe the machine now (`tgc.backends.cpu_graph.oversubscribed`, the
    rule a CPU graph runs serially by), compared with the cores tgc may run on or the device's, the more."""
    from tgc.backends import cpu_graph
    return cpu_graph.oversubscribed(threads, max(machine_cores(), int(device.cores or 1)))


class CPUProgram(Program):
    serial_when_busy = True  # on a busy machine, run the chunks in turn on the calling thread (`_busy`)

    def __init__(self, device: CPUDevice, name: str, lib: bytes):
        super().__init__(device, name, lib)
        from tgc.backends.elf import load_object
        self.image = load_object(lib)
        try:
            self.address = self.image.address(name)
        except KeyError:
            # a binary shared by identical kernels (`CPUDevice.canonical_source`) names the kernel compiled first
            if len(self.image.symbols) != 1:
                raise
            self.address = next(iter(self.image.symbols.values()))
        self._fn_cache: dict[tuple[int, int], Any] = {}

    def _fn(self, nbufs: int, nvals: int):
        key = (nbufs, nvals)
        if key not in self._fn_cache:
            proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nbufs + [ctypes.c_int32] * nvals))
            self._fn_cache[key] = proto(self.address)
        return self._fn_cache[key]

    def __call__(self, *bufs: Any, global_size=(1, 1, 1), local_size=None, vals=(), wait=False) -> float | None:
        import time
        ptrs = [data_address(b) for b in bufs]
        threads = max(1, int(global_size[0]))
        fn = self._fn(len(ptrs), len(vals) + 1)
        st = time.perf_counter()
        if threads == 1:
            fn(*ptrs, *vals, 0)
        elif self.serial_when_busy and _busy(threads, self.device):
            # a busy machine: every core id's chunk in turn on this thread (as a CPU graph run alone calls them:
            # the same chunks, the same bits), not a hand-off to threads that would wait for a time slice each
            for core in range(threads):
                fn(*ptrs, *vals, core)
        else:
            from concurrent.futures import Future

            pool = self.device.pool(threads)
            # each chunk's future is made before its hand-off, so every chunk that may run is known when a
            # Ctrl-C arrives: held back while the threads are handed their work, it can still surface inside
            # `submit` after the work was queued where the SIGINT went to another thread of the process (a
            # future returned by `submit` would then be lost, and the buffers freed under its thread)
            futures: list[Any] = [Future() for _ in range(threads)]
            try:
                with _sigint_deferred():
                    for core, f in enumerate(futures):
                        pool.submit(_chunk, fn, ptrs, vals, core, f)
                for f in futures:
                    f.result()
            except BaseException:  # Ctrl-C while waiting: the threads run on; keep what they use alive
                for f in futures:
                    f.cancel()
                running = [f for f in futures if not f.done()]
                if running:
                    ABANDONED.add(self, list(bufs), running)
                raise
        return time.perf_counter() - st if wait else None


def _chunk(fn: Any, ptrs: list[int], vals: tuple, core: int, future: Any) -> None:
    """One chunk of a threaded launch on a pool thread, its outcome set on `future` (made by the launcher); a
    chunk whose future was cancelled before it started (an interrupted launch) does not run."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        fn(*ptrs, *vals, core)
    except BaseException as e:  # noqa: BLE001 - handed to the launcher through its future
        future.set_exception(e)
    else:
        future.set_result(None)


class CPUDevice(Device):
    kind = "CPU"
    launch_style = "cpu"
    # kernels run as native code here (`tgc serve` checks every launch); a CPU graph's addresses can be patched
    runtime = RuntimeFeatures(native_launch=True, rebind_graphs=True)

    def __init__(self, index: int = 0):
        super().__init__(index)
        self._renderer: Any = None
        self.compiler = _COMPILER
        self.allocator = CPUAllocator()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._pool_lock = threading.Lock()  # (two threads growing the pool at once would make two)
        self.share: int | None = None  # in a device list: this device's part of the cores (`shared`)
        self.graph_lock = threading.Lock()  # one multi-thread graph at a time (see tgc.backends.cpu_graph)

    @property
    def renderer(self) -> Any:
        """The LLVM IR renderer, made on first use: a run of cached binaries (the program cache's warm path)
        never renders, so it never imports tgc.backends.llvmir and the UOp modules behind it."""
        if self._renderer is None:
            from tgc.backends.llvmir import LLVMRenderer

            self._renderer = LLVMRenderer()
        return self._renderer

    @classmethod
    def device_count(cls) -> int:
        """CPU:0 .. CPU:(max(8, cores) - 1): alone, a CPU device uses every core; in a device list the CPU
        devices split the cores between them (`shared`)."""
        return max(8, machine_cores())

    @property
    def cores(self) -> int:
        from tgc.env import env_int

        threads = env_int("TGC_THREADS", 0) or machine_cores()
        return min(threads, self.share) if self.share else threads

    def shared(self, position: int, count: int) -> CPUDevice:
        """This device as the `position`-th of `count` CPU devices in one list: its own instance with its own
        thread pool and cores // count of the cores (the first cores % count one more; at least one)."""
        dev = CPUDevice(self.index)
        total = CPUDevice(self.index).cores
        q, r = divmod(total, count)
        dev.share = max(1, q + (1 if position < r else 0))
        return dev

    def pool(self, threads: int) -> ThreadPoolExecutor:
        """A thread pool of at least `threads` workers, kept for the device. A smaller one is replaced, not shut
        down: a launch on another thread may still be submitting to it (its threads end with the process)."""
        with self._pool_lock:
            if self._pool is None or self._pool_size < threads:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tgc-cpu")
                self._pool_size = threads
            return self._pool

    def binary_target(self) -> str:
        """x86-64 objects for this CPU's model and features: what `tgc.backends.elf` loads, whichever llvmlite
        built them (read without importing llvmlite)."""
        import platform
        return f"{platform.machine()}-{_cpu_fingerprint()}"

    def program(self, name: str, lib: bytes) -> CPUProgram:
        return CPUProgram(self, name, lib)

    def canonical_source(self, src: str) -> str:
        """The LLVM IR without comments and with its one exported function renamed: an object of one function is
        loaded under any kernel's name (`CPUProgram`), so kernels equal but for their names and source lines
        share one binary and one compile. A source defining other than one function is returned as it is."""
        body = "\n".join(line for line in src.splitlines() if not line.startswith(";"))
        names = _DEFINE.findall(body)
        if len(names) != 1:
            return src
        return re.sub("@" + re.escape(names[0]) + r"\b", "@tgc_kernel", body)

    def graph(self, launches: list[tuple], runner_object: bytes | None = None, compile_runner: bool = True) -> Any:
        """One native call running every kernel of `launches` in order (tgc.backends.cpu_graph); a package
        passes the runner's object it ships and `compile_runner=False` (it never compiles)."""
        from tgc.backends.cpu_graph import CPUGraph
        return CPUGraph(self, launches, _sigint_deferred, data_address, runner_object, compile_runner)

    def compile_pool(self, workers: int) -> Any:
        """LLVM compiles in worker processes (a fatal LLVM error kills only a worker)."""
        from tgc.backends.compile_worker import WorkerPool
        return WorkerPool(workers)

    def measure_peak(self) -> dict[str, Any]:
        """Peak FLOP/s and memory bandwidth, measured now (`tgc.engine.bench.machine_peak` caches it)."""
        from tgc.backends.cpu_peak import measure_peak
        return measure_peak(self)

    def cache_bytes(self) -> int | None:
        """This machine's last-level cache in bytes, or None where unknown."""
        from tgc.backends.cpu_peak import cpu_cache_bytes
        return cpu_cache_bytes()

    def info(self) -> dict[str, Any]:
        from importlib.metadata import version  # (llvmlite's version without importing it: packages run without)
        cores = self.cores
        two = [max(1, cores // 2 + (1 if i < cores % 2 else 0)) for i in range(2)]
        return {"renderer": "LLVM IR", "compiler": f"llvmlite {version('llvmlite')}", "cores": cores,
                "device_list": f"CPU:0 .. CPU:{self.device_count() - 1} in a device list split the {cores} "
                               f"core{'s' if cores != 1 else ''} between them, each with its own threads "
                               f"(CPU:0,CPU:1: {two[0]} + {two[1]})"}


def machine_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# a function the IR defines (not declares) and exports: not an `internal` one (a tile's outlined epilogue, `llvmir`)
_DEFINE = re.compile(r"^define (?!internal )[^@\n]*@([-\w.$]+)\(", re.M)

_COMPILER = COMPILER
