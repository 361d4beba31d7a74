"""The CUDA backend: NVRTC (in-process, no GPU needed) compiles CUDA C to cubin; the driver API runs it.

Compiling needs only the `cuda` extra (`nvidia-cuda-nvrtc` + `cuda-bindings`, both pinned to 13.0);
running needs an NVIDIA GPU with its driver (`libcuda.so.1`). Nothing from `cuda.bindings` is imported
until a compile or a launch needs it, so importing this module is cheap.

Headers: the NVRTC wheel ships no CUDA headers (no `cuda_fp16.h`, `cuda_bf16.h`, not even `stdint.h`),
so kernels must be self-contained. NVRTC still knows the device builtins (`threadIdx`, `__syncthreads`,
`__shfl_*_sync`, `expf`, `__expf`, `__uint_as_float`, ...). Half and bf16 values are held as
`unsigned short` bits and converted with inline PTX (`cvt.f32.f16`, `cvt.rn.f16.f32`, `cvt.rn.bf16.f32`;
bf16 -> f32 is a 16-bit shift); `HALF_HELPERS` (in tgc.backends.cstyle, with the renderer) is the set of such helpers.

Without a GPU, the tests run this module end to end against a CPU stand-in for `libcuda.so.1`
(tests/cuda_standin.py).

Launch convention (see `tgc.backends.base`): `global_size` is the grid in *blocks*, `local_size` the
block in threads (as in `cuLaunchKernel`). Kernel parameters are the buffers' device pointers, then the
`vals` as 32-bit ints.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import re
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from tgc.backends.base import Compiler, Device, LRUAllocator, Program, keep_python_sigint
from tgc.backends.cstyle import DYNAMIC_SHARED_SYMBOL, STATIC_SHARED_BYTES, CUDARenderer
from tgc.backends.cstyle import HALF_HELPERS as HALF_HELPERS  # re-exported (tests, the stand-in)
from tgc.capabilities import Capabilities
from tgc.env import env_str
from tgc.errors import CompileError, DeviceError

INSTALL_HINT = "pip install 'tgc[cuda]'"
DEFAULT_ARCH = "sm_90"

# Half/bf16 helpers for header-free kernels (NVRTC has no cuda_fp16.h here): values travel as unsigned short.


# ---------------------------------------------------------------- NVRTC (compile, no GPU needed)

@functools.cache
def _nvrtc() -> Any:
    """The `cuda.bindings.nvrtc` module, imported on first use; CompileError when it is missing or broken."""
    try:
        from cuda.bindings import nvrtc
        nvrtc.nvrtcVersion()  # proves that libnvrtc loads
    except ImportError as e:
        raise CompileError(f"NVRTC is not installed ({e})", hint=INSTALL_HINT) from None
    except RuntimeError as e:  # cuda-bindings present, libnvrtc missing
        raise CompileError(f"NVRTC could not be loaded ({e})", hint=INSTALL_HINT) from None
    return nvrtc


@functools.cache
def nvrtc_error() -> str | None:
    """Why NVRTC cannot be used here, or None when it can."""
    try:
        _nvrtc()
    except CompileError as e:
        return f"{e.msg}; install it with {INSTALL_HINT}"
    return None


@functools.cache
def nvrtc_version() -> str:
    """The NVRTC version, e.g. "13.0" (raises CompileError when NVRTC is missing)."""
    err, major, minor = _nvrtc().nvrtcVersion()
    return f"{major}.{minor}"


def normalize_arch(arch: str) -> str:
    """`"sm_90"`, `"90"`, `"9.0"`, `"compute_90"` -> `"sm_90"` (keeps an `a`/`f` suffix: `sm_90a`)."""
    s = arch.strip().lower()
    m = re.fullmatch(r"(?:sm_|compute_)?(\d+)\.?(\d)?([af]?)", s)
    if not m:
        raise CompileError(f"bad CUDA architecture '{arch}'", hint="write it like sm_90 (or 90, 9.0)")
    major, minor, suffix = m.groups()
    digits = major + minor if minor is not None else major
    return f"sm_{digits}{suffix}"


_KERNEL_NAME = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s+)?(\w+)\s*\(")


class NVRTCCompiler(Compiler):
    """CUDA C to cubin for one architecture, in-process with NVRTC.

    `compile(src)` returns the cubin (an ELF file); `compile_ptx(src)` the PTX text. The PTX of every cubin
    compiled in this process is remembered, so `disassemble(cubin)` returns it without recompiling.
    """

    name = "nvrtc"
    # -default-device: functions without __device__/__host__ are device functions (helpers need no marks).
    # No -use_fast_math: results must match numpy within DSL.md's tolerance; renderers use __expf etc. explicitly.
    # --fmad=false: no product is contracted into an fma unless the kernel says fmaf (a reduction's accumulate);
    # NVRTC's default contraction broke `x * s - max(x * s)` (see tgc.backends.cstyle.CStyleRenderer.fma_fn).
    options: tuple[str, ...] = ("-default-device", "-std=c++17", "--fmad=false")
    max_remembered_ptx = 512

    def __init__(self, arch: str = DEFAULT_ARCH):
        self.arch = normalize_arch(arch)
        self._ptx: OrderedDict[bytes, str] = OrderedDict()
        self.last_log = ""  # NVRTC's log (warnings) from the last successful compile

    @property
    def version(self) -> str:  # type: ignore[override]
        return nvrtc_version()

    @property
    def cache_key(self) -> str:
        flags = hashlib.sha256(" ".join(self.options).encode()).hexdigest()[:8]  # --fmad=false changed cubins
        return f"{self.name}-{self.version}-{self.arch}-{flags}"

    @property
    def compute_arch(self) -> str:
        return "compute_" + self.arch[3:]

    def compile(self, src: str) -> bytes:
        """CUDA C source to a cubin for `self.arch`; CompileError with NVRTC's log on failure."""
        cubin, ptx = self._build(src, self.arch, want_cubin=True)
        self._remember(cubin, ptx)
        return cubin

    def compile_ptx(self, src: str) -> str:
        """CUDA C source to PTX text (virtual arch `compute_XX`)."""
        return self._build(src, self.compute_arch, want_cubin=False)[1]

    def disassemble(self, lib: bytes, src: str | None = None) -> str:
        """The PTX behind a cubin from this process, else regenerated from `src` when given."""
        if lib[:4] != b"\x7fELF":  # already PTX text
            return lib.decode(errors="replace").rstrip("\0")
        ptx = self._ptx.get(hashlib.sha256(lib).digest())
        if ptx is not None:
            return ptx
        if src is not None:
            return self.compile_ptx(src)
        raise CompileError("the PTX of this cubin is unknown (it was not compiled in this process)",
                           hint="pass the kernel source: disassemble(lib, src=...)")

    def _remember(self, cubin: bytes, ptx: str) -> None:
        self._ptx[hashlib.sha256(cubin).digest()] = ptx
        while len(self._ptx) > self.max_remembered_ptx:
            self._ptx.popitem(last=False)

    def _build(self, src: str, arch: str, want_cubin: bool) -> tuple[bytes, str]:
        nvrtc = _nvrtc()
        ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
        m = _KERNEL_NAME.search(src)
        filename = f"{m.group(1) if m else 'kernel'}.cu"
        err, prog = nvrtc.nvrtcCreateProgram(src.encode(), filename.encode(), 0, None, None)
        if err != ok:
            raise CompileError(f"nvrtcCreateProgram failed: {_nvrtc_err(err)}")
        try:
            opts = [f"-arch={arch}".encode(), *(o.encode() for o in self.options)]
            err, = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
            keep_python_sigint()  # NVRTC re-installs SIGINT with SA_RESTART (Ctrl-C would wait for kernels)
            log = _read(prog, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog).decode(errors="replace")
            if err != ok:
                hint = None
                if err == nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION and "arch" in log:
                    hint = f"NVRTC {nvrtc_version()} supports {', '.join(_supported_archs())}; set TGC_CUDA_ARCH"
                raise CompileError(f"NVRTC could not compile {filename} for {arch}:\n{log.strip()}", hint=hint)
            self.last_log = log.strip()
            ptx = _read(prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX).decode()
            cubin = _read(prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN, text=False) if want_cubin else b""
            return cubin, ptx
        finally:
            nvrtc.nvrtcDestroyProgram(prog)


def _read(prog: Any, size_fn: Any, get_fn: Any, text: bool = True) -> bytes:
    """One NVRTC output (log, PTX, cubin) as bytes, without the trailing NUL of text outputs."""
    nvrtc = _nvrtc()
    err, n = size_fn(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{size_fn.__name__} failed: {_nvrtc_err(err)}")
    buf = bytearray(n)
    if n:
        err, = get_fn(prog, buf)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"{get_fn.__name__} failed: {_nvrtc_err(err)}")
    return bytes(buf).rstrip(b"\0") if text else bytes(buf)


def _nvrtc_err(err: Any) -> str:
    try:
        return _nvrtc().nvrtcGetErrorString(err)[1].decode()
    except Exception:
        return str(err)


@functools.cache
def _supported_archs() -> tuple[str, ...]:
    err, archs = _nvrtc().nvrtcGetSupportedArchs()
    return tuple(f"sm_{a}" for a in archs)


def nvrtc_compiler(arch: str = DEFAULT_ARCH) -> NVRTCCompiler:
    """The shared compiler instance for an architecture."""
    return _compiler_for(normalize_arch(arch))


@functools.cache
def _compiler_for(arch: str) -> NVRTCCompiler:
    return NVRTCCompiler(arch)


# ---------------------------------------------------------------- the driver (needs a GPU)

# cuDriverGetVersion of the oldest driver that loads NVRTC 13's cubins (CUDA 13.0: driver R580 or newer)
MIN_DRIVER_VERSION = 13000
# errors of an asynchronous launch that leave the context unusable until it is reset ("sticky" errors):
# ILLEGAL_ADDRESS, LAUNCH_TIMEOUT, HARDWARE_STACK_ERROR, ILLEGAL_INSTRUCTION, MISALIGNED_ADDRESS,
# INVALID_ADDRESS_SPACE, INVALID_PC, LAUNCH_FAILED
STICKY_ERRORS = frozenset({700, 702, 714, 715, 716, 717, 718, 719})


def _version_text(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


@functools.cache
def _driver_probe() -> tuple[bool, str, int]:
    """(usable, why not, device count), through ctypes on libcuda: no cuda-bindings import."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False, "no CUDA driver (libcuda.so.1 not found)", 0
    rc = lib.cuInit(0)
    if rc != 0:
        return False, f"cuInit failed: {_ctypes_error_name(lib, rc)}", 0
    count = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0:
        return False, f"cuDeviceGetCount failed: {_ctypes_error_name(lib, rc)}", 0
    if count.value == 0:
        return False, "no CUDA device found (the driver is there, cuDeviceGetCount = 0)", 0
    version = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value < MIN_DRIVER_VERSION:
        return (False, f"the NVIDIA driver supports CUDA {_version_text(version.value)} only; kernels from NVRTC "
                f"{_version_text(MIN_DRIVER_VERSION)} need CUDA {_version_text(MIN_DRIVER_VERSION)} (driver R580 "
                "or newer): update the driver", count.value)
    if importlib.util.find_spec("cuda.bindings") is None:
        return False, f"cuda-bindings is not installed: {INSTALL_HINT}", count.value
    return True, "", count.value


def _ctypes_error_name(lib: Any, rc: int) -> str:
    name = ctypes.c_char_p()
    if lib.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
        return name.value.decode()
    return f"CUresult {rc}"


def _driver() -> Any:
    """The `cuda.bindings.driver` module (tests replace this function with a fake driver)."""
    from cuda.bindings import driver
    return driver


class CUDAFault(DeviceError):
    """A sticky error: a kernel faulted, and the context must be reset before the GPU can be used again."""

    def __init__(self, msg: str, code: int, **kw: Any):
        super().__init__(msg, **kw)
        self.code = code


class CUDAContextReset(DeviceError):
    """What a user sees after a fault: which kernel faulted, and that the context was reset."""


def _check(drv: Any, result: Any, what: str) -> Any:
    """Unpack a cuda-bindings `(CUresult, *values)` tuple; DeviceError (MemoryError for OOM, CUDAFault for a
    sticky error) on failure."""
    err, *vals = result
    if err != drv.CUresult.CUDA_SUCCESS:
        name = getattr(err, "name", str(err))
        if err == drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            raise MemoryError(f"CUDA out of memory: {what}: {name}")
        if int(err) in STICKY_ERRORS:
            raise CUDAFault(f"CUDA {what} failed: {name}", int(err))
        raise DeviceError(f"CUDA {what} failed: {name}")
    if not vals:
        return None
    return vals[0] if len(vals) == 1 else tuple(vals)


def _dims3(size: tuple[int, ...] | None) -> tuple[int, int, int]:
    s = tuple(int(x) for x in (size or ()))
    if len(s) > 3 or any(x < 1 for x in s):
        raise DeviceError(f"bad CUDA launch size {size}: want up to 3 positive numbers")
    return (*s, *(1,) * (3 - len(s)))  # type: ignore[return-value]


class CUDAAllocator(LRUAllocator):
    """Device memory through cuMemAlloc/cuMemFree; handles are device addresses (ints).

    `live` maps the handles of the current context to their sizes: after a context reset (a faulted kernel)
    the old handles are gone (`stale`), and using one is an error instead of a stray access."""

    def __init__(self, device: CUDADevice):
        super().__init__()
        self.device = device
        self.live: dict[int, int] = {}
        self.stale: set[int] = set()  # handles of reset contexts (until an allocation reuses the address)

    def _alloc(self, nbytes: int) -> int:
        dev = self.device
        dev.activate()
        h = int(dev.check(dev._drv.cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc({nbytes})"))
        self.live[h] = nbytes
        self.stale.discard(h)
        return h

    def _free(self, handle: int, nbytes: int) -> None:
        if self.live.pop(handle, None) is None:  # a buffer of a context that was reset: already gone
            return
        dev = self.device
        dev.activate()
        dev.check(dev._drv.cuMemFree(handle), "cuMemFree")

    def free(self, handle: int, nbytes: int) -> None:
        if handle in self.live:  # buffers of a reset context are not cached for reuse
            super().free(handle, nbytes)

    def drop(self) -> None:
        """Forget every buffer without freeing it (the context that held them was reset)."""
        self.cached.clear()
        self.stale.update(self.live)
        self.live.clear()

    def require(self, handle: int, what: str) -> None:
        if int(handle) in self.stale:
            raise DeviceError(f"CUDA {what}: the buffer is gone (the GPU context was reset after a kernel fault)",
                              hint="allocate and upload the data again")

    def copyin(self, handle: int, src: memoryview) -> None:
        dev = self.device
        dev.activate()
        self.require(handle, "cuMemcpyHtoD")
        src = memoryview(src).cast("B")
        dev.check(dev._drv.cuMemcpyHtoD(handle, src, src.nbytes), "cuMemcpyHtoD")

    def copyout(self, dest: memoryview, handle: int) -> None:
        dev = self.device
        dev.activate()
        self.require(handle, "cuMemcpyDtoH")
        dest = memoryview(dest).cast("B")
        dev.check(dev._drv.cuMemcpyDtoH(dest, handle, dest.nbytes), "cuMemcpyDtoH")


class CUDAProgram(Program):
    """A cubin loaded into the device's context (cuModuleLoadData), launched with cuLaunchKernel.
    After a context reset the module is loaded again at the next launch."""

    def __init__(self, device: CUDADevice, name: str, lib: bytes):
        super().__init__(device, name, lib)
        self.gpu = device
        self.module: Any = None
        self._load()

    def _load(self) -> None:
        dev = self.gpu
        dev.activate()
        try:
            module = dev.check(dev._drv.cuModuleLoadData(self.lib), "cuModuleLoadData")
        except CUDAContextReset:
            raise
        except DeviceError as e:
            raise DeviceError(f"{e.msg} (kernel '{self.name}')",
                              hint=f"the binary must be a cubin for this GPU's architecture ({dev.arch}); "
                                   "TGC_CUDA_ARCH chooses the architecture kernels are compiled for") from None
        self.module, self.generation = module, dev.generation
        self.function = dev.check(dev._drv.cuModuleGetFunction(module, self.name.encode()),
                                  f"cuModuleGetFunction('{self.name}')")
        self.dynamic_shared = self._dynamic_shared_bytes()

    def _dynamic_shared_bytes(self) -> int:
        """The dynamic shared memory the kernel declares (the module global the CUDA renderer writes when its
        shared arrays pass 48 KiB; 0 without one), passed at every launch. Past 48 KiB a function may use it only
        after cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) raises its limit, up to the GPU's opt-in maximum."""
        symbol = f"{DYNAMIC_SHARED_SYMBOL}{self.name}".encode()
        if symbol not in self.lib:  # not in the cubin's symbol names: static shared arrays only
            return 0
        dev, drv = self.gpu, self.gpu._drv
        err, ptr, size = drv.cuModuleGetGlobal(self.module, symbol)
        if err != drv.CUresult.CUDA_SUCCESS:
            return 0  # the name was only part of another symbol's
        raw = bytearray(4)
        dev.check(drv.cuMemcpyDtoH(raw, ptr, 4), "cuMemcpyDtoH (the kernel's dynamic shared memory size)")
        nbytes = int.from_bytes(raw, "little")
        if nbytes > STATIC_SHARED_BYTES:
            attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            dev.check(drv.cuFuncSetAttribute(self.function, attr, nbytes),
                      f"cuFuncSetAttribute('{self.name}', MAX_DYNAMIC_SHARED_SIZE_BYTES, {nbytes})")
        return nbytes

    def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1),
                 local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
                 wait: bool = False) -> float | None:
        dev = self.gpu
        drv = dev.activate()
        if self.generation != dev.generation:
            self._load()
        grid, block = _dims3(global_size), _dims3(local_size or (1, 1, 1))
        for b in bufs:
            dev.allocator.require(b, f"launching '{self.name}'")
        # the kernel parameters packed here (a void** array of pointers to the values), not by cuda-bindings
        # inside the timed region
        values = [ctypes.c_uint64(int(b)) for b in bufs] + [ctypes.c_int32(int(v)) for v in vals]
        pointers = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        params = ctypes.addressof(pointers) if values else None
        what = f"cuLaunchKernel('{self.name}', grid={grid}, block={block})"
        shared = self.dynamic_shared
        if not wait:
            dev.check(drv.cuLaunchKernel(self.function, *grid, *block, shared, None, params, 0), what)
            dev.last_launch = self.name
            return None
        start, end = dev.events()
        dev.check(drv.cuEventRecord(start, None), "cuEventRecord")  # right before the launch, after the packing
        dev.check(drv.cuLaunchKernel(self.function, *grid, *block, shared, None, params, 0), what)
        dev.last_launch = self.name
        dev.check(drv.cuEventRecord(end, None), "cuEventRecord")
        dev.check(drv.cuEventSynchronize(end), f"running '{self.name}'")
        return dev.check(drv.cuEventElapsedTime(start, end), "cuEventElapsedTime") * 1e-3

    def __del__(self) -> None:
        gpu, module = getattr(self, "gpu", None), getattr(self, "module", None)
        if gpu is None or module is None or gpu._ctx is None or self.generation != gpu.generation:
            return  # never loaded, or its context was reset (which unloaded it)
        try:  # the context current on this thread (GC may run anywhere), then unload
            gpu._drv.cuCtxSetCurrent(gpu._ctx)
            gpu._drv.cuModuleUnload(module)
        except Exception:  # interpreter shutdown: nothing to do
            pass


class CUDAGraph:
    """A launch plan as one CUDA graph: a kernel node per launch, each depending on the one before (the plan's
    order), instantiated once (cuGraphInstantiate); each call is one cuGraphLaunch. Kernel parameters are
    bound when the graph is built (the buffers' device pointers and the vals), so other buffers need another
    graph. A graph of a context that was reset since (a kernel fault) refuses to run: build it again."""

    def __init__(self, device: CUDADevice, launches: list[tuple]):
        dev = self.device = device
        drv = dev.activate()
        self.generation = dev.generation
        names = [prog.name for prog, *_ in launches]
        shown = ", ".join(names) if len(names) <= 3 else f"{names[0]}, ..., {names[-1]}"
        self.label = f"graph of {len(names)} kernels ({shown})"
        self.programs = [launch[0] for launch in launches]  # their modules stay loaded while the graph lives
        self._keep: list[Any] = []  # the parameter values and pointer arrays the nodes point at
        self.exec: Any = None
        graph = dev.check(drv.cuGraphCreate(0), "cuGraphCreate")
        try:
            prev: list[Any] = []
            for prog, bufs, global_size, local_size, vals in launches:
                if not isinstance(prog, CUDAProgram) or prog.gpu is not dev:
                    raise DeviceError("a CUDA graph can only hold programs of its own device")
                if prog.generation != dev.generation:
                    prog._load()
                for b in bufs:
                    dev.allocator.require(b, f"building the {self.label}")
                grid, block = _dims3(global_size), _dims3(local_size or (1, 1, 1))
                values = [ctypes.c_uint64(int(b)) for b in bufs] + [ctypes.c_int32(int(v)) for v in vals]
                pointers = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
                p = drv.CUDA_KERNEL_NODE_PARAMS()
                p.func = prog.function
                p.gridDimX, p.gridDimY, p.gridDimZ = grid
                p.blockDimX, p.blockDimY, p.blockDimZ = block
                p.sharedMemBytes = prog.dynamic_shared
                p.kernelParams = ctypes.addressof(pointers) if values else 0
                self._keep.append((values, pointers, p))
                node = dev.check(drv.cuGraphAddKernelNode(graph, prev, len(prev), p),
                                 f"cuGraphAddKernelNode('{prog.name}', grid={grid}, block={block})")
                prev = [node]
            self.exec = dev.check(drv.cuGraphInstantiate(graph, 0), f"cuGraphInstantiate({self.label})")
        finally:
            drv.cuGraphDestroy(graph)  # the executable graph holds its own copy

    def __call__(self, wait: bool = False) -> float | None:
        dev = self.device
        drv = dev.activate()
        if self.generation != dev.generation:
            raise DeviceError(f"the CUDA {self.label} belongs to a GPU context that was reset after a kernel fault",
                              hint="run the program again: its launch plan and graph are built anew")
        what = f"cuGraphLaunch({self.label})"
        if not wait:
            dev.check(drv.cuGraphLaunch(self.exec, None), what)
            dev.last_launch = self.label
            return None
        start, end = dev.events()
        dev.check(drv.cuEventRecord(start, None), "cuEventRecord")
        dev.check(drv.cuGraphLaunch(self.exec, None), what)
        dev.last_launch = self.label
        dev.check(drv.cuEventRecord(end, None), "cuEventRecord")
        dev.check(drv.cuEventSynchronize(end), f"running the {self.label}")
        return dev.check(drv.cuEventElapsedTime(start, end), "cuEventElapsedTime") * 1e-3

    def free(self) -> None:
        dev, exe = self.device, self.exec
        self.exec = None
        if exe is None or dev._ctx is None or self.generation != dev.generation:
            return  # never instantiated, or its context was reset (which destroyed it)
        try:
            dev._drv.cuCtxSetCurrent(dev._ctx)
            dev._drv.cuGraphExecDestroy(exe)
        except Exception:  # interpreter shutdown: nothing to do
            pass

    def __del__(self) -> None:
        self.free()


def f32_lanes_per_sm(cc: tuple[int, int]) -> int:
    """FP32 lanes (FMA units) per SM by compute capability, for the peak estimate in `info()`: 64 where an SM has
    64 (GP100, Volta, Turing, A100), 128 on Maxwell, consumer Pascal, consumer Ampere/Ada, Hopper and later, 192
    on Kepler. A flat 128 counted the 64-lane pre-Volta (P100) and Volta GPUs twice."""
    major, minor = cc
    if major <= 2:
        return 32 if minor == 0 else 48  # Fermi
    if major == 3:
        return 192  # Kepler
    if major == 5:
        return 128  # Maxwell
    if major == 6:
        return 64 if minor == 0 else 128  # GP100; GP10x
    if major == 7:
        return 64  # Volta (7.0, 7.2), Turing (7.5)
    if major == 8:
        return 64 if minor == 0 else 128  # A100; GA10x, Orin, Ada
    return 128  # Hopper, Blackwell and later


class CUDADevice(Device):
    """An NVIDIA GPU. Compiling works without one (NVRTC); allocating or loading a program needs one.

    Creating the device never touches the GPU beyond reading its compute capability, so `tgc compile -d CUDA`
    works on machines without a GPU; the first allocation or program opens the primary context and raises
    `DeviceError` when there is no GPU.
    """

    kind = "CUDA"
    # The shared C-style renderer's CUDA dialect; the lead wires it in tgc/backends/__init__ or here.
    renderer: Any = CUDARenderer()
    launch_style = "gpu"

    def __init__(self, index: int = 0):
        super().__init__(index)
        self._drv: Any = None
        self._ctx: Any = None
        self._lock = threading.Lock()  # the context's first-use set-up, and a reset, happen once
        self._tls = threading.local()  # per-thread timing events
        self.generation = 0  # bumped by each context reset: modules and buffers of older ones are gone
        self.last_launch: str | None = None
        self._cc: tuple[int, int] | None = None
        ok, _, count = _driver_probe()
        if ok and index < count:
            try:
                self._cc = self._compute_capability()
            except (DeviceError, RuntimeError):
                self._cc = None
            try:  # the GPU's shared memory per block: 48 KiB of static arrays, more (dynamic) where it opts in
                per_block = self._attribute("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK")
                try:
                    opt_in = self._attribute("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
                except (DeviceError, RuntimeError, AttributeError):
                    opt_in = 0
                self.max_shared_bytes = max(per_block, opt_in) or None
            except (DeviceError, RuntimeError, AttributeError):
                self.max_shared_bytes = None
        env_arch = (env_str("TGC_CUDA_ARCH", "") or "").strip()
        if env_arch:  # the user's choice wins, GPU or not (a cubin for an older minor version runs too)
            self.arch = normalize_arch(env_arch)
        elif self._cc is not None:
            self.arch = f"sm_{self._cc[0]}{self._cc[1]}"
        else:
            self.arch = DEFAULT_ARCH
        self.allocator = CUDAAllocator(self)

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        ok, why, _ = _driver_probe()
        return ok, why

    @property
    def caps(self) -> Capabilities:
        """The CUDA dialect's limits, with the shared memory this GPU reports: lower than the declared 48 KiB, or
        higher where it opts in (Volta and later; 227 KiB on Hopper), as dynamic shared memory. Without a GPU,
        the declared 48 KiB, which every GPU has."""
        caps = super().caps
        if self.max_shared_bytes is not None and self.max_shared_bytes > caps.max_shared_bytes:
            caps = replace(caps, max_shared_bytes=self.max_shared_bytes)
        digits = "".join(c for c in self.arch[3:5] if c.isdigit())
        if not digits or int(digits) < 80:  # mma.sync m16n8k16 and cp.async: Ampere and later
            caps = replace(caps, tensor_cores=False, async_copy=False)
        return caps

    @classmethod
    def device_count(cls) -> int | None:
        """How many GPUs the driver reports (`CUDA:0` .. `CUDA:n-1`), or None without a usable driver: then
        any index is accepted, since kernels for `CUDA:i` still compile, and running says why it cannot."""
        ok, _, count = _driver_probe()
        return count if ok else None

    @property
    def compiler(self) -> NVRTCCompiler | None:  # type: ignore[override]
        return nvrtc_compiler(self.arch) if nvrtc_error() is None else None

    @property
    def compile_error(self) -> str | None:
        return nvrtc_error()

    def _attribute(self, name: str) -> int:
        """One `cuDeviceGetAttribute` of this device (no context is opened)."""
        drv = _driver()
        _check(drv, drv.cuInit(0), "cuInit")
        dev = _check(drv, drv.cuDeviceGet(self.index), f"cuDeviceGet({self.index})")
        return int(_check(drv, drv.cuDeviceGetAttribute(getattr(drv.CUdevice_attribute, name), dev), name))

    def _compute_capability(self) -> tuple[int, int]:
        drv = _driver()
        _check(drv, drv.cuInit(0), "cuInit")
        dev = _check(drv, drv.cuDeviceGet(self.index), f"cuDeviceGet({self.index})")
        attr = drv.CUdevice_attribute
        major = _check(drv, drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "attr")
        minor = _check(drv, drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "attr")
        return int(major), int(minor)

    def activate(self) -> Any:
        """Make this device's primary context current on this thread (opening it once); returns the driver."""
        if self._ctx is None:
            with self._lock:
                if self._ctx is None:
                    self._open()
        _check(self._drv, self._drv.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        return self._drv

    def _open(self) -> None:
        ok, why, count = _driver_probe()
        if not ok:
            raise DeviceError(f"{'the CUDA device cannot be used' if count else 'no CUDA device is present'}: {why}",
                              hint="CUDA kernels still compile here (Program.compile(\"CUDA\")); running needs a GPU",
                              cli_hint="CUDA kernels still compile here (tgc compile -d CUDA); running needs a GPU")
        if self.index >= count:
            raise DeviceError(f"no CUDA device is present at index {self.index}: this machine has {count}")
        try:
            drv = _driver()
            _check(drv, drv.cuInit(0), "cuInit")
            self._dev = _check(drv, drv.cuDeviceGet(self.index), f"cuDeviceGet({self.index})")
            ctx = _check(drv, drv.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")
        except RuntimeError as e:  # cuda-bindings could not load libcuda
            raise DeviceError(f"no CUDA device is present: {e}") from None
        self._drv, self._ctx = drv, ctx

    def check(self, result: Any, what: str) -> Any:
        """`_check` for calls in this device's context: a sticky error (a kernel faulted) resets the context
        and raises a DeviceError naming the kernel; the device is usable again afterwards."""
        try:
            return _check(self._drv, result, what)
        except CUDAFault as e:
            raise self.recover(e, what) from None

    def recover(self, fault: CUDAFault, what: str) -> CUDAContextReset:
        """Reset the primary context after a fault: its buffers, modules and events are gone."""
        kernel = self.last_launch
        with self._lock:
            drv = self._drv
            self.generation += 1
            self.allocator.drop()
            self._tls = threading.local()
            self.last_launch = None
            reset = drv.cuDevicePrimaryCtxReset(self._dev)
            self._ctx = None  # retained again at the next use
        where = (f"a kernel of the {kernel} (the last launch)" if kernel and kernel.startswith("graph of ") else
                 f"kernel '{kernel}' (the last one launched)" if kernel else "a kernel")
        err = getattr(fault, "msg", str(fault)).split("failed: ")[-1]
        msg = (f"CUDA {where} faulted: {err}, reported by {what}. The GPU context was reset: buffers and "
               "loaded kernels of this device are gone")
        if reset[0] != drv.CUresult.CUDA_SUCCESS:
            msg += f" (the reset failed too: {getattr(reset[0], 'name', reset[0])}; restart the process)"
        return CUDAContextReset(msg, hint="an out-of-bounds access in a kernel is a tgc bug: please report it "
                                          "with the program and its inputs' shapes")

    def events(self) -> tuple[Any, Any]:
        """A (start, end) event pair for timing launches, one per thread (created on its first use)."""
        pair = getattr(self._tls, "events", None)
        if pair is None:
            drv = self.activate()
            flags = drv.CUevent_flags.CU_EVENT_DEFAULT
            pair = (self.check(drv.cuEventCreate(flags), "cuEventCreate"),
                    self.check(drv.cuEventCreate(flags), "cuEventCreate"))
            self._tls.events = pair
        return pair

    def binary_target(self) -> str:
        """Cubins for this device's architecture load whichever NVRTC built them (a package records it)."""
        return f"cubin-{self.arch}"

    def program(self, name: str, lib: bytes) -> CUDAProgram:
        return CUDAProgram(self, name, lib)

    def graph(self, launches: list[tuple]) -> CUDAGraph:
        """A CUDA graph of `launches` (cuGraphAddKernelNode per launch, in order), run by one cuGraphLaunch."""
        return CUDAGraph(self, launches)

    def synchronize(self) -> None:
        if self._ctx is not None:
            drv = self.activate()
            self.check(drv.cuCtxSynchronize(), "cuCtxSynchronize")

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"compiler": "nvrtc", "arch": self.arch}
        err = nvrtc_error()
        out["compiler_version"] = nvrtc_version() if err is None else None
        if err is not None:
            out["compile_error"] = err
        ok, why, _ = _driver_probe()
        if not ok:
            out["available"], out["reason"] = False, why
            return out
        out["available"] = True
        count = self.device_count() or 0
        out["device_count"] = count
        out["device_list"] = (f"CUDA:0 .. CUDA:{count - 1} ({count} GPUs), each its own device in a device list"
                              if count > 1 else "CUDA:0 (1 GPU); a device list pairs it with another kind "
                              "(CUDA:0,CPU:1)")
        try:
            out.update(self._gpu_info())
        except (DeviceError, RuntimeError) as e:
            out["gpu_info_error"] = str(e)
        return out

    def _gpu_info(self) -> dict[str, Any]:
        drv = _driver()
        _check(drv, drv.cuInit(0), "cuInit")
        dev = _check(drv, drv.cuDeviceGet(self.index), "cuDeviceGet")
        attr = drv.CUdevice_attribute

        def get(a: str) -> int:
            return int(_check(drv, drv.cuDeviceGetAttribute(getattr(attr, a), dev), a))

        name = _check(drv, drv.cuDeviceGetName(256, dev), "cuDeviceGetName")
        sms = get("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")
        out: dict[str, Any] = {
            "name": name.split(b"\0")[0].decode().strip(),
            "compute_capability": ".".join(map(str, self._cc or ())),
            "sm_count": sms,
            "memory_bytes": int(_check(drv, drv.cuDeviceTotalMem(dev), "cuDeviceTotalMem")),
            "driver_version": int(_check(drv, drv.cuDriverGetVersion(), "cuDriverGetVersion")),
        }
        try:  # the L2 cache: data that fits stays there between timed runs (see tgc.engine.bench.rates)
            out["cache_bytes"] = get("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE") or None
        except (DeviceError, AttributeError):
            pass
        try:  # peak estimates from clocks; these attributes may read 0 on some drivers
            clock_khz = get("CU_DEVICE_ATTRIBUTE_CLOCK_RATE")
            mem_khz = get("CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE")
            bus_bits = get("CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH")
        except DeviceError:
            return out
        if clock_khz > 0 and self._cc is not None:
            lanes = f32_lanes_per_sm(self._cc)
            out["peak_gflops"] = round(sms * lanes * 2 * clock_khz / 1e6, 1)  # f32 FMA = 2 flops
        if mem_khz > 0 and bus_bits > 0:
            out["peak_gbps"] = round(2 * mem_khz * 1e3 * bus_bits / 8 / 1e9, 1)  # double data rate
        return out
