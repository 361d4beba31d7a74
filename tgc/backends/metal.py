"""The Metal backend: kernels in the Metal Shading Language (MSL), run through the Metal framework on macOS.

On macOS, kernels compile with Xcode's `xcrun metal` (to a `.metallib`) or, where that toolchain is missing,
with the framework itself (`MTLDevice.newLibraryWithSource`); they run through pyobjc (`pyobjc-framework-Metal`):
buffers are shared-storage `MTLBuffer`s, a program is a compute pipeline, and a launch is one command buffer.

Elsewhere no Metal compiler exists. `tgc compile -d METAL` still renders every kernel and type-checks it with
clang (libclang from pip, in-process, a few ms a kernel) as C++17 against `metal_stdlib.h`, a stub of Apple's
header kept in step with `MetalRenderer`; this catches syntax and type errors, not Metal-only rules. The device
then has no compiler (`compiler is None`): kernels carry `binary=None` and `compile_error` says that running
needs macOS; `lint(src)` is the type-check, which the kernel compile step (`tgc.codegen.kernel`) calls on sources
it cannot compile.

Launch convention (see `tgc.backends.base`): `global_size` is the number of threadgroups per dimension and
`local_size` the threads per threadgroup (`dispatchThreadgroups:threadsPerThreadgroup:`); `local_size=None`
means one thread per group. Buffers bind at indices 0.. in DEFINE_GLOBAL order, then each of `vals` as a
32-bit int (`setBytes`) at the indices after them, matching the renderer's `constant int& name [[buffer(n)]]`.

Nothing heavy is imported at module import: libclang on the first lint, pyobjc when a Mac device opens.
"""

from __future__ import annotations

import functools
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tgc.backends.base import Compiler, Device, LRUAllocator, Program
from tgc.backends.clang_lint import ClangLinter, libclang_error, libclang_version
from tgc.backends.clang_lint import LintDiagnostic as LintDiagnostic  # re-exported
from tgc.backends.cstyle import MetalRenderer
from tgc.errors import CompileError, DeviceError

INSTALL_HINT = "pip install 'tgc[metal]'"
IS_MACOS = sys.platform == "darwin"
STUB_HEADER = Path(__file__).with_name("metal_stdlib.h")

NOT_MACOS = "Metal kernels run only on macOS; the source was type-checked with clang against a stub <metal_stdlib>"
PROBE_NOT_MACOS = "Metal runs only on macOS (rendering and clang type-checking work here)"
RUN_HINT = "Program.compile(\"METAL\") renders and type-checks the kernels here; run them on a Mac or another device"
CLI_RUN_HINT = "`tgc compile -d METAL` renders and type-checks the kernels here; run them on a Mac or another device"

# Where the lint's in-memory files live (libclang maps them in; nothing is written to disk).
_VIRTUAL_ROOT = "/tgc-metal-lint"
_VIRTUAL_INCLUDE = f"{_VIRTUAL_ROOT}/include"
# C++17 for Apple silicon (signed char, 64-bit long, _Float16), hermetic: no system headers.
CLANG_ARGS = ("-x", "c++", "-std=c++17", "-fsyntax-only", "--target=arm64-apple-macos13", "-nostdinc",
              "-nostdinc++", f"-I{_VIRTUAL_INCLUDE}", "-ferror-limit=50")

# Attributes of MSL kernel arguments and functions. clang does not know them and ignores them with a warning;
# the lint reports any other attribute name as an error, so a misspelt one is caught.
METAL_ATTRIBUTES = frozenset({
    "buffer", "texture", "sampler", "threadgroup", "stage_in", "function_constant", "host_name",
    "thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
    "threads_per_grid", "threads_per_threadgroup", "threadgroups_per_grid", "thread_index_in_threadgroup",
    "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup", "threads_per_simdgroup",
    "simdgroups_per_threadgroup", "thread_index_in_quadgroup", "quadgroup_index_in_threadgroup",
    "dispatch_threads_per_threadgroup", "grid_origin", "grid_size", "max_total_threads_per_threadgroup",
    "kernel", "user", "id", "raster_order_group",
})

SOURCE_LIB_MAGIC = b"tgc-msl\0"  # a "binary" that is MSL source, compiled by the framework when it is loaded


# ---------------------------------------------------------------- clang type-check (any platform)

_KERNEL_NAME = re.compile(r"\bkernel\s+void\s+(\w+)")
_UNKNOWN_ATTRIBUTE = re.compile(r"unknown attribute '([\w:]+)' ignored")
_HEADER_PATH = f"{_VIRTUAL_INCLUDE}/metal_stdlib"


class MetalLinter(ClangLinter):
    """Type-checks MSL as C++17 with libclang, in-process, against the stub `<metal_stdlib>`.

    `diagnostics(src)` gives the errors (an empty list when the source is clean); `lint(src)` raises
    CompileError carrying them. Results are cached by source text.
    """

    what = "Metal"
    root = _VIRTUAL_ROOT
    args = CLANG_ARGS
    header_names = {_HEADER_PATH: "<metal_stdlib> (tgc's stub)"}

    def __init__(self, header: Path = STUB_HEADER):
        try:
            self.header = header.read_text(encoding="utf-8")
        except OSError as e:
            raise CompileError(f"the stub <metal_stdlib> is missing from this install ({e})",
                               hint=f"reinstall tgc: {INSTALL_HINT}") from None
        super().__init__({_HEADER_PATH: self.header})

    @property
    def note(self) -> str:
        return "clang type-checked the Metal source as C++17 against tgc's stub <metal_stdlib>"

    def default_filename(self, src: str) -> str:
        m = _KERNEL_NAME.search(src)
        return f"{m.group(1) if m else 'kernel'}.metal"

    def keep(self, severity: int, message: str, option: str, cindex: Any) -> str | None:
        if severity < cindex.Diagnostic.Error:
            m = _UNKNOWN_ATTRIBUTE.fullmatch(message) if option == "-Wunknown-attributes" else None
            if m is None or m.group(1) in METAL_ATTRIBUTES:
                return None
            message = f"unknown Metal attribute '{m.group(1)}'"
        elif message.startswith("attempt to use a poisoned identifier"):
            message = "Metal has no 'double' (64-bit float) type"
        return _metal_words(message)


_ADDRESS_SPACES = {"1": "device", "2": "constant", "3": "threadgroup"}


def _metal_words(message: str) -> str:
    """clang's names for the stub's address spaces, in Metal's words."""
    message = re.sub(r"(?:const )?__attribute__\(\(address_space\((\d)\)\)\)",
                     lambda m: _ADDRESS_SPACES.get(m.group(1), m.group(0)), message)
    message = re.sub(r"address space '?(\d)'?",
                     lambda m: f"{_ADDRESS_SPACES.get(m.group(1), m.group(1))} address space", message)
    return message.replace("default address space", "thread address space").replace("generic address space",
                                                                                      "thread address space")


@functools.cache
def metal_linter() -> MetalLinter:
    """The shared linter (its result cache is shared too)."""
    return MetalLinter()


# ---------------------------------------------------------------- macOS: compilers

@functools.cache
def _xcrun_metal_version() -> str | None:
    """The first line of `xcrun metal --version` when Xcode's Metal toolchain works here, else None."""
    if not IS_MACOS or shutil.which("xcrun") is None:
        return None
    try:
        r = subprocess.run(["xcrun", "-sdk", "macosx", "metal", "--version"], capture_output=True, text=True,
                           timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    return (r.stdout.strip().splitlines() or ["metal"])[0]


def _xcrun(args: list[str], what: str) -> None:
    try:
        r = subprocess.run(["xcrun", "-sdk", "macosx", *args], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CompileError(f"{what} could not run: {e}") from None
    if r.returncode != 0:
        raise CompileError(f"{what} failed:\n{(r.stderr or r.stdout).strip()}")


class XcrunMetalCompiler(Compiler):
    """MSL source to a `.metallib` with Xcode's toolchain: `metal -c` to AIR, then `metallib`."""

    name = "xcrun-metal"

    def __init__(self, version: str):
        self.version = version

    def compile(self, src: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="tgc-metal-") as tmp:
            d = Path(tmp)
            (d / "kernel.metal").write_text(src, encoding="utf-8")
            _xcrun(["metal", "-c", "-fno-fast-math", str(d / "kernel.metal"), "-o", str(d / "kernel.air")],
                   "metal (xcrun)")
            _xcrun(["metallib", str(d / "kernel.air"), "-o", str(d / "kernel.metallib")], "metallib (xcrun)")
            return (d / "kernel.metallib").read_bytes()

    def disassemble(self, lib: bytes, src: str | None = None) -> str:
        """The AIR (LLVM IR) of the library, when Xcode's `metal-objdump` can print it."""
        with tempfile.TemporaryDirectory(prefix="tgc-metal-") as tmp:
            path = Path(tmp) / "kernel.metallib"
            path.write_bytes(lib)
            try:
                r = subprocess.run(["xcrun", "-sdk", "macosx", "metal-objdump", "--disassemble-all", str(path)],
                                   capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise CompileError(f"metal-objdump could not run: {e}") from None
        if r.returncode != 0:
            raise CompileError(f"metal-objdump failed:\n{(r.stderr or r.stdout).strip()}")
        return r.stdout


class MetalSourceCompiler(Compiler):
    """Without Xcode's toolchain: the Metal framework compiles source when a program loads.

    `compile` builds the library once to report errors now, and returns the source itself behind
    `SOURCE_LIB_MAGIC` as the "binary".
    """

    name = "metal-framework"

    def __init__(self, device: MetalDevice):
        import platform
        self.device = device
        self.version = f"macOS {platform.mac_ver()[0]} ({device.mtl.name()})"

    def compile(self, src: str) -> bytes:
        self.device.library_from_source(src)
        return SOURCE_LIB_MAGIC + src.encode("utf-8")

    def disassemble(self, lib: bytes, src: str | None = None) -> str:
        return "// the Metal framework compiles at load time and keeps no assembly; the source follows\n" + \
            lib[len(SOURCE_LIB_MAGIC):].decode("utf-8")


# ---------------------------------------------------------------- macOS: pyobjc runtime

@functools.cache
def _pyobjc_metal() -> Any:
    """The pyobjc `Metal` module; DeviceError off macOS or when pyobjc-framework-Metal is missing."""
    if not IS_MACOS:
        raise DeviceError(f"{NOT_MACOS} (this is {sys.platform})", hint=RUN_HINT, cli_hint=CLI_RUN_HINT)
    try:
        import Metal
    except ImportError as e:
        raise DeviceError(f"pyobjc-framework-Metal is not installed ({e})", hint=INSTALL_HINT) from None
    return Metal


def _mtl_devices() -> list[Any]:
    """Every Metal device, the system default first."""
    metal = _pyobjc_metal()
    default = metal.MTLCreateSystemDefaultDevice()
    if default is None:
        raise DeviceError("no Metal device found on this Mac")
    others = [d for d in (metal.MTLCopyAllDevices() or []) if d.registryID() != default.registryID()]
    return [default, *others]


def _mtl_size(metal: Any, dims: tuple[int, ...]) -> Any:
    x, y, z = (tuple(int(d) for d in dims) + (1, 1, 1))[:3]
    make = getattr(metal, "MTLSizeMake", None)
    return make(x, y, z) if make is not None else metal.MTLSize(x, y, z)


def _ns_error(err: Any) -> str:
    if err is None:
        return "unknown error"
    try:
        return str(err.localizedDescription())
    except Exception:
        return str(err)


class MetalAllocator(LRUAllocator):
    """Shared-storage `MTLBuffer`s (CPU and GPU see one memory); copies go through `contents()`."""

    def __init__(self, device: MetalDevice):
        super().__init__()
        self.device = device

    def _alloc(self, nbytes: int) -> Any:
        metal, mtl = _pyobjc_metal(), self.device.mtl
        buf = mtl.newBufferWithLength_options_(max(nbytes, 1), metal.MTLResourceStorageModeShared)
        if buf is None:
            raise MemoryError(f"Metal could not allocate {nbytes} bytes")
        return buf

    def _free(self, handle: Any, nbytes: int) -> None:
        handle.setPurgeableState_(_pyobjc_metal().MTLPurgeableStateEmpty)

    def copyin(self, handle: Any, src: memoryview) -> None:
        src = memoryview(src).cast("B")
        if src.nbytes:
            self.device.synchronize()  # a kernel still in flight may read this buffer
            handle.contents().as_buffer(handle.length())[:src.nbytes] = src

    def copyout(self, dest: memoryview, handle: Any) -> None:
        dest = memoryview(dest).cast("B")
        if dest.nbytes:
            self.device.synchronize()
            dest[:] = handle.contents().as_buffer(handle.length())[:dest.nbytes]


class OffMacAllocator(LRUAllocator):
    """Off macOS: every allocation says that running needs macOS."""

    def _alloc(self, nbytes: int) -> Any:
        raise DeviceError(f"{NOT_MACOS} (this is {sys.platform})", hint=RUN_HINT, cli_hint=CLI_RUN_HINT)


class MetalProgram(Program):
    """One kernel of a library, as a compute pipeline state."""

    def __init__(self, device: MetalDevice, name: str, lib: bytes):
        super().__init__(device, name, lib)
        library = device.library(lib)
        fn = library.newFunctionWithName_(name)
        if fn is None:
            names = ", ".join(str(n) for n in (library.functionNames() or [])) or "none"
            raise DeviceError(f"no kernel '{name}' in the Metal library (it has: {names})")
        pso, err = device.mtl.newComputePipelineStateWithFunction_error_(fn, None)
        if pso is None:
            raise DeviceError(f"Metal could not make a pipeline for '{name}': {_ns_error(err)}")
        self.pipeline = pso
        self.max_threads: int = int(pso.maxTotalThreadsPerThreadgroup())

    def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1),
                 local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
                 wait: bool = False) -> float | None:
        """Dispatch `global_size` threadgroups of `local_size` threads (one thread each when it is None)."""
        device: MetalDevice = self.device  # type: ignore[assignment]
        metal = _pyobjc_metal()
        local = tuple(local_size) if local_size is not None else (1, 1, 1)
        threads = 1
        for n in local:
            threads *= n
        if threads > self.max_threads:
            raise DeviceError(f"kernel '{self.name}' asks for {threads} threads per threadgroup; "
                              f"its pipeline allows {self.max_threads}")
        cb = device.queue.commandBuffer()
        enc = cb.computeCommandEncoder()
        enc.setComputePipelineState_(self.pipeline)
        for i, buf in enumerate(bufs):
            enc.setBuffer_offset_atIndex_(buf, 0, i)
        for j, v in enumerate(vals):
            enc.setBytes_length_atIndex_(struct.pack("<i", int(v)), 4, len(bufs) + j)
        enc.dispatchThreadgroups_threadsPerThreadgroup_(_mtl_size(metal, tuple(global_size)), _mtl_size(metal, local))
        enc.endEncoding()
        cb.commit()
        if not wait:
            device.pending.append((self.name, cb))
            return None
        cb.waitUntilCompleted()
        device.check(self.name, cb)
        return float(cb.GPUEndTime() - cb.GPUStartTime())


# ---------------------------------------------------------------- the device

class MetalDevice(Device):
    """`METAL:i`: the i-th Metal GPU of a Mac (0 is the system default). Off macOS: render and type-check only."""

    kind = "METAL"
    renderer: Any = MetalRenderer()
    launch_style = "gpu"

    def __init__(self, index: int = 0):
        super().__init__(index)
        self.pending: list[tuple[str, Any]] = []  # (kernel name, command buffer) committed and not yet waited on
        self._mtl: Any = None
        self._queue: Any = None
        self._compiler: Compiler | None = None
        self._compiler_error: str | None = None
        if IS_MACOS:
            self.allocator = MetalAllocator(self)
            self._pick_compiler()
        else:
            self.allocator = OffMacAllocator()

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        if not IS_MACOS:
            return False, PROBE_NOT_MACOS
        try:
            _mtl_devices()
        except DeviceError as e:
            return False, f"{e.msg}; {e.hint}" if e.hint else e.msg
        return True, ""

    # ---- compiling
    def _pick_compiler(self) -> None:
        version = _xcrun_metal_version()
        if version is not None:
            self._compiler = XcrunMetalCompiler(version)
            return
        try:
            self._compiler = MetalSourceCompiler(self)
        except DeviceError as e:
            self._compiler_error = (f"no Metal compiler here: Xcode's Metal toolchain (xcrun metal) is missing and "
                                    f"the Metal framework cannot be used ({e.msg}; {INSTALL_HINT})")

    @property
    def compiler(self) -> Compiler | None:  # type: ignore[override]
        return self._compiler

    @property
    def compile_error(self) -> str | None:
        if IS_MACOS:
            return self._compiler_error
        why = libclang_error()
        if why is not None:
            return f"Metal kernels run only on macOS; the source was not type-checked ({why})"
        return NOT_MACOS

    def lint(self, src: str) -> None:
        """Type-check a kernel source with clang against the stub <metal_stdlib>; CompileError on an error.

        A no-op when libclang is missing (then `compile_error` says how to install it).
        """
        if libclang_error() is None:
            metal_linter().lint(src)

    # ---- the Metal framework (macOS)
    @property
    def mtl(self) -> Any:
        """The `MTLDevice`, opened on first use."""
        if self._mtl is None:
            devices = _mtl_devices()
            if self.index >= len(devices):
                raise DeviceError(f"no Metal device {self.index}: this Mac has {len(devices)}",
                                  hint=f"use METAL:0 .. METAL:{len(devices) - 1}")
            self._mtl = devices[self.index]
        return self._mtl

    @property
    def max_buffer_bytes(self) -> int | None:  # type: ignore[override]
        """`maxBufferLength` of the GPU (None off macOS, where nothing is allocated on a GPU)."""
        if not IS_MACOS:
            return None
        try:
            return int(self.mtl.maxBufferLength())
        except DeviceError:
            raise
        except Exception:  # a pyobjc attribute missing on an older macOS
            return None

    @property
    def queue(self) -> Any:
        if self._queue is None:
            self._queue = self.mtl.newCommandQueue()
        return self._queue

    def library_from_source(self, src: str) -> Any:
        metal = _pyobjc_metal()
        options = metal.MTLCompileOptions.new()
        options.setFastMathEnabled_(False)  # Metal's default fast math contracts and drops inf/nan rules
        lib, err = self.mtl.newLibraryWithSource_options_error_(src, options, None)
        if lib is None:
            raise CompileError(f"Metal could not compile the kernel:\n{_ns_error(err)}")
        return lib

    def library(self, lib: bytes) -> Any:
        """An `MTLLibrary` from what a compiler made: a `.metallib`, or source behind SOURCE_LIB_MAGIC."""
        if lib.startswith(SOURCE_LIB_MAGIC):
            return self.library_from_source(lib[len(SOURCE_LIB_MAGIC):].decode("utf-8"))
        from Foundation import NSURL
        with tempfile.TemporaryDirectory(prefix="tgc-metal-") as tmp:
            path = Path(tmp) / "kernel.metallib"
            path.write_bytes(lib)
            library, err = self.mtl.newLibraryWithURL_error_(NSURL.fileURLWithPath_(str(path)), None)
        if library is None:
            raise DeviceError(f"Metal could not load the library: {_ns_error(err)}")
        return library

    def program(self, name: str, lib: bytes) -> Program:
        if not IS_MACOS:
            raise DeviceError(f"{NOT_MACOS} (this is {sys.platform})", hint=RUN_HINT, cli_hint=CLI_RUN_HINT)
        return MetalProgram(self, name, lib)

    def check(self, name: str, cb: Any) -> None:
        """DeviceError when a finished command buffer failed."""
        if cb.error() is not None:
            raise DeviceError(f"Metal kernel '{name}' failed: {_ns_error(cb.error())}")

    def synchronize(self) -> None:
        pending, self.pending = self.pending, []
        for name, cb in pending:
            cb.waitUntilCompleted()
            self.check(name, cb)

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"renderer": "metal"}
        if not IS_MACOS:
            out.update(compiler="clang type-check (stub <metal_stdlib>)", version=libclang_version(),
                       available=False, reason=PROBE_NOT_MACOS)
            if libclang_error() is not None:
                out["compile_error"] = libclang_error()
            return out
        comp = self.compiler
        out.update(compiler=comp.name if comp else None, version=comp.version if comp else None)
        if comp is None:
            out["compile_error"] = self._compiler_error
        try:
            mtl = self.mtl
            out.update(available=True, device=str(mtl.name()),
                       max_threads_per_threadgroup=int(mtl.maxThreadsPerThreadgroup().width),
                       unified_memory=bool(mtl.hasUnifiedMemory()),
                       recommended_working_set=int(mtl.recommendedMaxWorkingSetSize()))
        except DeviceError as e:
            out.update(available=False, reason=e.msg)
        except Exception as e:  # a pyobjc attribute missing on an older macOS
            out["info_error"] = f"{type(e).__name__}: {e}"
        return out
