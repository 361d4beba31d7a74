"""The CPU device: LLVM IR compiled by llvmlite to an object file, loaded in-process, run on threads.

Compiled objects are plain bytes (cacheable on disk); `tgc.backends.elf` loads them without llvmlite,
so a cached run never imports LLVM. Each launch runs `global_size[0]` threads; thread i gets i as its
last argument (`core_id`) and the kernel splits its outer loop by it.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tgc.backends.base import Compiler, Device, HostAllocator, Program
from tgc.backends.llvmir import LLVMRenderer
from tgc.errors import CompileError


class CPUAllocator(HostAllocator):
    """Host memory for the CPU device (64-byte aligned for vector loads)."""


class LLVMCompiler(Compiler):
    """LLVM IR text -> x86-64 object bytes, at -O3 for the host CPU."""

    name = "llvmlite"

    def __init__(self) -> None:
        self._tm = None
        self._lock = threading.Lock()

    @property
    def version(self) -> str:  # type: ignore[override]
        """llvmlite's version and the host CPU's features, read without importing llvmlite."""
        global _VERSION
        if _VERSION is None:
            from importlib.metadata import version
            _VERSION = f"{version('llvmlite')}-{_cpu_fingerprint()}"
        return _VERSION

    def _target_machine(self):
        if self._tm is None:
            from tgc.backends.elf import make_target_machine
            self._tm = make_target_machine(opt=3)
        return self._tm

    def _module(self, src: str):
        import llvmlite.binding as llvm
        tm = self._target_machine()
        try:
            mod = llvm.parse_assembly(src)
            mod.triple = tm.triple
            mod.data_layout = str(tm.target_data)
            mod.verify()
        except RuntimeError as e:
            raise CompileError(f"LLVM rejected the kernel: {e}") from None
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        return mod

    def compile(self, src: str) -> bytes:
        with self._lock:  # llvmlite's target machine is not thread-safe
            mod = self._module(src)
            return bytes(self._target_machine().emit_object(mod))

    def optimized_ir(self, src: str) -> str:
        with self._lock:
            return str(self._module(src))

    def assembly(self, src: str) -> str:
        with self._lock:
            return self._target_machine().emit_assembly(self._module(src))


_VERSION: str | None = None


def _cpu_fingerprint() -> str:
    """A short hash of the CPU model and flags: objects built for one CPU must not load on another."""
    import hashlib
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        import platform
        lines = [platform.machine(), platform.processor()]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]


class CPUProgram(Program):
    def __init__(self, device: CPUDevice, name: str, lib: bytes):
        super().__init__(device, name, lib)
        from tgc.backends.elf import load_object
        self.image = load_object(lib)
        self.address = self.image.address(name)
        self._fn_cache: dict[tuple[int, int], Any] = {}

    def _fn(self, nbufs: int, nvals: int):
        key = (nbufs, nvals)
        if key not in self._fn_cache:
            proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nbufs + [ctypes.c_int32] * nvals))
            self._fn_cache[key] = proto(self.address)
        return self._fn_cache[key]

    def __call__(self, *bufs: Any, global_size=(1, 1, 1), local_size=None, vals=(), wait=False) -> float | None:
        import time
        ptrs = [b.ctypes.data for b in bufs]
        threads = max(1, int(global_size[0]))
        fn = self._fn(len(ptrs), len(vals) + 1)
        st = time.perf_counter()
        if threads == 1:
            fn(*ptrs, *vals, 0)
        else:
            pool = self.device.pool(threads)
            list(pool.map(lambda core: fn(*ptrs, *vals, core), range(threads)))
        return time.perf_counter() - st if wait else None


class CPUDevice(Device):
    kind = "CPU"
    launch_style = "cpu"
    native_launch = True  # kernels run as native code in this process: `tgc serve` checks every launch

    def __init__(self, index: int = 0):
        super().__init__(index)
        self.renderer = LLVMRenderer()
        self.compiler = _COMPILER
        self.allocator = CPUAllocator()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0

    @property
    def cores(self) -> int:
        if os.environ.get("TGC_THREADS"):
            return max(1, int(os.environ["TGC_THREADS"]))
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def pool(self, threads: int) -> ThreadPoolExecutor:
        if self._pool is None or self._pool_size < threads:
            self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tgc-cpu")
            self._pool_size = threads
        return self._pool

    def program(self, name: str, lib: bytes) -> CPUProgram:
        return CPUProgram(self, name, lib)

    def info(self) -> dict[str, Any]:
        import llvmlite
        return {"renderer": "LLVM IR", "compiler": f"llvmlite {llvmlite.__version__}", "cores": self.cores}


_COMPILER = LLVMCompiler()
