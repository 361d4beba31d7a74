"""OpenCL backend through pyopencl (on a machine without a GPU: PoCL on the CPU).

Launch convention (as in CUDA): `global_size` is the number of work-groups per dimension and
`local_size` the work-items per group, so the ND range enqueued is `global_size * local_size`.
With `local_size=None`, `global_size` is the total number of work-items and the runtime picks
the group size.

pyopencl is imported only when a device is opened or probed, never at module import.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import struct
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tgc.backends.base import Compiler, Device, LRUAllocator, Program, keep_python_sigint
from tgc.backends.clang_lint import ClangLinter, libclang_error, libclang_version
from tgc.backends.cstyle import OpenCLRenderer
from tgc.errors import CompileError, DeviceError, TgcError
from tgc.version import __version__

if TYPE_CHECKING:
    import pyopencl as cl

INSTALL_HINT = "pip install 'tgc[opencl]'"
LLVM_BITCODE_MAGIC = b"BC\xc0\xde"
STUB_HEADER = Path(__file__).with_name("opencl_c_base.h")


def _import_cl():
    """pyopencl, or a DeviceError that says how to install it."""
    try:
        import pyopencl
    except ImportError as e:
        raise DeviceError(f"pyopencl is not installed ({e})", hint=INSTALL_HINT) from e
    return pyopencl


def _all_devices() -> list[cl.Device]:
    """Every OpenCL device, over all platforms in platform order. Raises DeviceError when there is none."""
    cl = _import_cl()
    try:
        platforms = cl.get_platforms()
        keep_python_sigint()  # PoCL installs its own SIGINT handler when it loads (Ctrl-C would wait for kernels)
    except cl.Error as e:
        raise DeviceError(f"no OpenCL platform found ({e})",
                          hint=f"install an OpenCL driver, e.g. PoCL: {INSTALL_HINT}") from e
    devices: list[cl.Device] = []
    for platform in platforms:
        try:
            devices.extend(platform.get_devices())
        except cl.Error:  # a platform without devices raises DEVICE_NOT_FOUND
            continue
    if not devices:
        raise DeviceError("no OpenCL device found", hint=f"install an OpenCL driver, e.g. PoCL: {INSTALL_HINT}")
    return devices


class OpenCLCompiler(Compiler):
    """OpenCL C source to the driver's program binary (`Program.binaries[0]`)."""

    def __init__(self, device: OpenCLDevice):
        self.device = device
        cl_dev = device.cl_device
        self.name = "opencl-" + cl_dev.platform.name.strip()
        # The device name is part of the version so a binary never loads on a different device.
        self.version = f"{cl_dev.driver_version.strip()} {cl_dev.opencl_c_version.strip()} ({cl_dev.name.strip()})"

    # PoCL spends ~0.15 s of CPU on any build, however small its kernels (its builtin library linked and compiled
    # in, the program's binary written), and ~0.01-0.03 s more per small kernel: 8 kernels built as one program
    # take ~0.35 s, one by one ~1.2 s. Each binary of a batch holds the batch's kernels (~14 KiB each in PoCL's
    # binary, which the disk cache stores once per kernel): 8 bounds that.
    batch_max = 8

    def compile(self, src: str) -> bytes:
        """Build `src` for the device; a failed build raises CompileError carrying the build log."""
        cl = self.device.cl
        prg = cl.Program(self.device.context, src)
        try:
            prg.build(devices=[self.device.cl_device])
        except cl.Error as e:
            log = self._build_log(prg) or str(e)
            raise CompileError(f"OpenCL build failed on {self.device.cl_device.name.strip()}:\n{log.strip()}") from e
        return prg.binaries[0]

    def compile_batch(self, srcs: list[str]) -> list[bytes]:
        """`srcs` built as one OpenCL program (`joined_source`): every binary is that program's, each kernel loads
        by its name. Where they do not join, or the joined build fails, each is built alone (a failure raises for
        its own source, as `compile`)."""
        joined = joined_source(srcs) if len(srcs) > 1 else None
        if joined is not None:
            try:
                lib = self.compile(joined)
            except CompileError:
                pass
            else:
                return [lib] * len(srcs)
        return [self.compile(src) for src in srcs]

    def _build_log(self, prg: cl.Program) -> str:
        cl = self.device.cl
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return prg.get_build_info(self.device.cl_device, cl.program_build_info.LOG) or ""
        except cl.Error:
            return ""

    def disassemble(self, lib: bytes, src: str | None = None) -> str:
        """LLVM IR of the kernels in the binary (with `src`, only the kernel it defines: a binary built with
        other kernels, `compile_batch`, holds theirs too).

        A PoCL binary embeds the program's LLVM bitcode (its `program.bc`), which llvmlite can print. Other
        drivers' binaries (or bitcode llvmlite cannot read) come back as the printable text found in the bytes.
        """
        m = KERNEL_NAME.search(src) if src is not None else None
        ir = _pocl_bitcode_ir(lib, m.group(1) if m else None)
        if ir is not None:
            return ir
        return "; no disassembler for this OpenCL binary; printable strings follow\n" + _printable_strings(lib)


def _pocl_bitcode_ir(lib: bytes, kernel: str | None = None) -> str | None:
    """The kernel functions of the bitcode a PoCL binary holds (with `kernel`, that one where the binary has it), as
    LLVM IR text; None if there is none."""
    at = lib.find(LLVM_BITCODE_MAGIC)
    if not lib.startswith(b"poclbin") or at < 4:
        return None
    (size,) = struct.unpack_from("<I", lib, at - 4)  # each embedded file is stored as <u32 size><bytes>
    try:
        import llvmlite.binding as llvm
        with _quiet_stderr():  # LLVM warns about the debug-info version of PoCL's bitcode on stderr
            module = llvm.parse_bitcode(lib[at:at + size])
    except Exception:
        return None
    defined = [fn for fn in module.functions if not fn.is_declaration]
    kernels = [fn for fn in defined if "spir_kernel" in str(fn).split("{", 1)[0]]
    if kernel is not None and any(fn.name == kernel for fn in kernels):
        kernels = [fn for fn in kernels if fn.name == kernel]
    return "\n".join(str(fn) for fn in (kernels or defined))


KERNEL_NAME = re.compile(r"^__kernel\s+void\s+(\w+)\s*\(", re.M)


def joined_source(srcs: list[str]) -> str | None:
    """Kernel sources (each: a prelude of directives and one-line helper definitions, then one `__kernel`
    function) as one OpenCL C source: each source's directives kept in its place (a pragma holds from there on,
    so every kernel still follows its own), each helper definition written once (at its first source: a later
    source's equal line would redefine it). None where a source is not of that form (a helper over several
    lines, no kernel, more than one) or two define kernels of one name."""
    out: list[str] = []
    helpers: set[str] = set()
    names: set[str] = set()
    for src in srcs:
        found = KERNEL_NAME.findall(src)
        if len(found) != 1 or found[0] in names:
            return None
        names.add(found[0])
        lines = src.split("\n")
        start = next(i for i, line in enumerate(lines) if KERNEL_NAME.match(line))
        for line in lines[:start]:
            text = line.strip()
            if not text or text.startswith(("#", "//")):
                out.append(line)
            elif line[0].isspace() or not text.endswith("}") or text.count("{") != text.count("}"):
                return None
            elif line not in helpers:
                helpers.add(line)
                out.append(line)
        out.extend(lines[start:])
    return "\n".join(out)


def _printable_strings(lib: bytes, min_len: int = 4) -> str:
    out, run = [], bytearray()
    for byte in lib + b"\0":
        if 32 <= byte < 127:
            run.append(byte)
            continue
        if len(run) >= min_len:
            out.append(run.decode("ascii"))
        run.clear()
    return "\n".join(out)


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (native libraries write there directly)."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class OpenCLAllocator(LRUAllocator):
    """`cl.Buffer`s in the device's context; copies go through its queue."""

    def __init__(self, device: OpenCLDevice):
        super().__init__()
        self.device = device

    def _alloc(self, nbytes: int) -> cl.Buffer:
        cl = self.device.cl
        try:
            # OpenCL rejects zero-size buffers, so an empty tensor still gets one byte.
            return cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, max(nbytes, 1))
        except cl.MemoryError as e:
            raise MemoryError(f"OpenCL could not allocate {nbytes} bytes: {e}") from e

    def _free(self, handle: cl.Buffer, nbytes: int) -> None:
        handle.release()

    def copyin(self, handle: cl.Buffer, src: memoryview) -> None:
        src = memoryview(src).cast("B")
        if src.nbytes:
            # blocking: the caller may drop `src` as soon as this returns
            self.device.cl.enqueue_copy(self.device.queue, handle, src, is_blocking=True)

    def copyout(self, dest: memoryview, handle: cl.Buffer) -> None:
        dest = memoryview(dest).cast("B")
        if dest.nbytes:
            self.device.cl.enqueue_copy(self.device.queue, dest, handle, is_blocking=True)


class OpenCLProgram(Program):
    """One kernel of a program binary, loaded on the device."""

    def __init__(self, device: OpenCLDevice, name: str, lib: bytes):
        super().__init__(device, name, lib)
        cl = device.cl
        try:
            self.program = device.loaded(lib)
        except cl.Error as e:
            raise DeviceError(f"OpenCL could not load the binary of '{name}': {e}") from e
        try:
            self.kernel = cl.Kernel(self.program, name)
        except cl.Error as e:
            names = self.program.get_info(cl.program_info.KERNEL_NAMES)
            raise DeviceError(f"no kernel '{name}' in the OpenCL binary (it has: {names or 'none'})") from e
        self.num_args: int = self.kernel.get_info(cl.kernel_info.NUM_ARGS)

    def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1),
                 local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
                 wait: bool = False) -> float | None:
        """Launch with `global_size` groups of `local_size` items (or `global_size` items if local is None)."""
        device: OpenCLDevice = self.device  # type: ignore[assignment]
        cl = device.cl
        if len(bufs) + len(vals) != self.num_args:
            raise DeviceError(f"kernel '{self.name}' takes {self.num_args} arguments, "
                              f"got {len(bufs)} buffers and {len(vals)} ints")
        for i, arg in enumerate([*bufs, *(np.int32(v) for v in vals)]):
            self.kernel.set_arg(i, arg)
        if local_size is None:
            global_items, local = tuple(global_size), None
        else:
            if len(local_size) != len(global_size):
                raise DeviceError(f"global_size {global_size} and local_size {local_size} differ in rank")
            global_items, local = tuple(g * l for g, l in zip(global_size, local_size)), tuple(local_size)
        try:
            event = cl.enqueue_nd_range_kernel(device.queue, self.kernel, global_items, local)
            if not wait:
                return None
            event.wait()
        except cl.Error as e:
            raise DeviceError(f"OpenCL launch of '{self.name}' failed (global {global_items}, local {local}): {e}") \
                from e
        return (event.profile.end - event.profile.start) * 1e-9


class OpenCLLinter(ClangLinter):
    """Type-checks OpenCL C 1.2 with libclang against clang's own builtin declarations (see `clang_lint`)."""

    what = "OpenCL C"
    root = "/tgc-opencl-lint"
    args = ("-x", "cl", "-cl-std=CL1.2", "-target", "spir64", "-Xclang", "-fdeclare-opencl-builtins",
            "-fsyntax-only", "-nostdinc", f"-I{root}/include", "-ferror-limit=50")
    header_names = {f"{root}/include/opencl-c-base.h": "<opencl-c-base.h> (tgc's stub)"}

    def __init__(self, header: Path = STUB_HEADER):
        try:
            text = header.read_text(encoding="utf-8")
        except OSError as e:
            raise CompileError(f"the stub <opencl-c-base.h> is missing from this install ({e})",
                               hint="reinstall tgc") from None
        super().__init__({f"{self.root}/include/opencl-c-base.h": text})

    @property
    def note(self) -> str:
        return "clang type-checked the OpenCL C 1.2 source (no OpenCL compiler runs here)"

    def default_filename(self, src: str) -> str:
        m = re.search(r"__kernel\s+void\s+(\w+)", src)
        return f"{m.group(1) if m else 'kernel'}.cl"


@functools.cache
def opencl_linter() -> OpenCLLinter:
    """The shared linter (its result cache is shared too)."""
    return OpenCLLinter()


# ---------------------------------------------------------------- the probe: a real build and launch

PROBE_KERNEL = "__kernel void tgc_probe(__global int* out, int k) { int i = get_global_id(0); out[i] = i * k + 1; }"
PROBE_ITEMS = 16
NOT_HERE_HINT = ("OpenCL C is still rendered and type-checked here (Program.compile(\"OPENCL\")); "
                 "run on another device, e.g. CPU")
CLI_NOT_HERE_HINT = ("OpenCL C is still rendered and type-checked here (tgc compile -d OPENCL); "
                     "run on another device, e.g. -d CPU")


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ({} where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if fields:
                        break
                    continue
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def _platform_cpu() -> str:
    import platform
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_description() -> str:
    """`AMD EPYC, family 26`: the CPU's model name and family from /proc/cpuinfo (or platform's words)."""
    info = _cpuinfo()
    name = info.get("model name") or _platform_cpu()
    return f"{name}, family {info['cpu family']}" if "cpu family" in info else name


def _cpu_identity() -> str:
    """What distinguishes this CPU for the probe cache: vendor, family, model, stepping, model name."""
    info = _cpuinfo()
    if not info:
        return _platform_cpu()
    return "|".join(f"{k}={info.get(k, '')}" for k in ("vendor_id", "cpu family", "model", "stepping", "model name"))


def explain_build_failure(log: str, platform_version: str, device_name: str) -> str:
    """One line that says why a device cannot build kernels, from the driver's build log."""
    if "unknown target CPU" in log:
        m = re.search(r"PoCL\s+(\S+)", platform_version)
        pocl = f"PoCL {m.group(1)}" if m else "PoCL"
        return f"{pocl} cannot compile for this CPU ({cpu_description()}): its LLVM does not know it"
    first = next((ln.strip() for ln in log.splitlines() if ln.strip()), "no build log")
    return f"OpenCL device '{device_name}' cannot build a test kernel: {first}"


def _probe_child(index: int) -> dict[str, Any]:
    """In the probe's subprocess: build and run PROBE_KERNEL on device `index`; what happened, as JSON-able."""
    cl = _import_cl()
    dev = _all_devices()[index]
    ctx = cl.Context([dev])
    prg = cl.Program(ctx, PROBE_KERNEL)
    try:
        prg.build(devices=[dev])
    except cl.Error as e:
        try:
            log = prg.get_build_info(dev, cl.program_build_info.LOG) or ""
        except cl.Error:
            log = ""
        return {"ok": False, "why": explain_build_failure(log or str(e), dev.platform.version, dev.name.strip())}
    queue = cl.CommandQueue(ctx, dev)
    out = np.zeros(PROBE_ITEMS, np.int32)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, out.nbytes)
    knl = cl.Kernel(prg, "tgc_probe")
    knl.set_arg(0, buf)
    knl.set_arg(1, np.int32(3))
    cl.enqueue_nd_range_kernel(queue, knl, (PROBE_ITEMS,), None)
    cl.enqueue_copy(queue, out, buf, is_blocking=True)
    want = np.arange(PROBE_ITEMS, dtype=np.int32) * 3 + 1
    if not np.array_equal(out, want):
        return {"ok": False, "why": f"OpenCL device '{dev.name.strip()}' ran a test kernel and gave wrong results"}
    return {"ok": True, "why": ""}


def _run_probe_subprocess(index: int) -> tuple[bool, str]:
    """Probe in a child process, so a driver that crashes or hangs cannot take tgc down with it."""
    import json
    import subprocess
    import sys
    code = ("import json, sys; from tgc.backends.opencl import _probe_child; "
            "print('TGC-PROBE ' + json.dumps(_probe_child(int(sys.argv[1]))))")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(index)], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False, f"the OpenCL driver did not build a test kernel within {PROBE_TIMEOUT_S} s"
    except OSError as e:
        return False, f"could not start the OpenCL probe ({e})"
    for line in proc.stdout.splitlines():
        if line.startswith("TGC-PROBE "):
            res = json.loads(line[len("TGC-PROBE "):])
            return bool(res["ok"]), str(res["why"])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return False, f"the OpenCL driver failed while building a test kernel (exit {proc.returncode}: {tail})"


PROBE_TIMEOUT_S = 120


@functools.cache
def probe_device(index: int = 0) -> tuple[bool, str]:
    """(True, "") when OpenCL device `index` really builds and runs a tiny kernel, else (False, why in one line).

    The answer is kept in the disk cache (table `probe`), keyed by this CPU, the platform, device and driver
    versions and pyopencl's and tgc's versions, so a machine probes once per driver; and per process here.
    """
    try:
        devices = _all_devices()
    except DeviceError as e:
        return False, f"{e.msg}; {e.hint}" if e.hint else e.msg
    if index >= len(devices):
        return False, f"no OpenCL device {index}: this machine has {len(devices)}"
    import json

    from tgc import cache
    d = devices[index]
    cl = _import_cl()
    key = cache.make_key("opencl-probe", index, d.platform.name, d.platform.version, d.name, d.driver_version,
                         d.opencl_c_version, getattr(cl, "VERSION_TEXT", ""), __version__, _cpu_identity())
    hit = cache.get_json("probe", key, lambda v: isinstance(v, list) and len(v) == 2)  # damaged: probe again
    if hit is not None:
        return bool(hit[0]), str(hit[1])
    ok, why = _run_probe_subprocess(index)
    cache.put("probe", key, json.dumps([ok, why]).encode(), meta=f"OPENCL:{index} {d.name.strip()}")
    return ok, why


def _device_limit(cl_device: Any, name: str) -> int | None:
    """A positive limit the OpenCL device reports (e.g. `local_mem_size`: CL_DEVICE_LOCAL_MEM_SIZE), or None."""
    try:
        value = int(getattr(cl_device, name))
    except Exception:  # noqa: BLE001 - any driver error means: not known, the declared limit holds
        return None
    return value if value > 0 else None


# program binaries `OpenCLDevice.loaded` keeps loaded (a batch's kernels load one after the other)
LOADED_KEEP = 16


class OpenCLDevice(Device):
    """`OPENCL:i`: the i-th OpenCL device over all platforms.

    Creating it opens nothing: rendering needs no device, so `tgc compile -d OPENCL` prints OpenCL C on every
    machine. Where the device really builds and runs a kernel (`probe_device`), kernels compile with the driver
    and run; elsewhere `compiler` is None, `compile_error` says why, each kernel is type-checked with libclang
    (`lint`), and running raises DeviceError with the probe's reason.
    """

    kind = "OPENCL"
    # The OpenCL C renderer is a dialect of the shared C-style renderer.
    renderer: Any = OpenCLRenderer()
    launch_style = "gpu"

    def __init__(self, index: int = 0):
        super().__init__(index)
        self._opened: dict[str, Any] | None = None
        self._compiler: OpenCLCompiler | None = None
        self._loaded: dict[bytes, Any] = {}  # program binary -> its cl.Program (`loaded`)
        self._loaded_lock = threading.Lock()
        try:
            found = _all_devices()
        except DeviceError:
            found = []
        count = len(found) if found else None
        if index > 0 and (count is None or index >= count):
            raise TgcError(f"no OpenCL device {index}: this machine has {count or 0}",
                           hint=f"use OPENCL:0 .. OPENCL:{count - 1}" if count and count > 1 else
                           "use OPENCL (index 0)")
        if index < len(found):
            # the device's own shared-memory limit (read from the device list: no context is opened); `caps`
            # takes the lower of it and the renderer's declared one
            self.max_shared_bytes = _device_limit(found[index], "local_mem_size")
        self.allocator = OpenCLAllocator(self)

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        """(True, "") when OpenCL device 0 builds and runs a tiny kernel; else why not, in one line."""
        return probe_device(0)

    @property
    def available(self) -> tuple[bool, str]:
        return probe_device(self.index)

    def ensure_runnable(self) -> None:
        ok, why = self.available
        if not ok:
            raise DeviceError(why, hint=NOT_HERE_HINT, cli_hint=CLI_NOT_HERE_HINT)

    def _open(self) -> dict[str, Any]:
        """pyopencl, the device, its context and queue: opened on first use, once the probe has passed."""
        if self._opened is None:
            self.ensure_runnable()
            cl = _import_cl()
            cl_device = _all_devices()[self.index]
            context = cl.Context([cl_device])
            queue = cl.CommandQueue(context, cl_device, properties=cl.command_queue_properties.PROFILING_ENABLE)
            self._opened = {"cl": cl, "cl_device": cl_device, "context": context, "queue": queue}
        return self._opened

    @property
    def cl(self) -> Any:
        return self._open()["cl"]

    @property
    def cl_device(self) -> cl.Device:
        return self._open()["cl_device"]

    @property
    def context(self) -> cl.Context:
        return self._open()["context"]

    @property
    def queue(self) -> cl.CommandQueue:
        return self._open()["queue"]

    @property
    def has_fp16(self) -> bool:
        """`half` arithmetic (cl_khr_fp16); without it `half` is storage only (vload_half/vstore_half)."""
        return self.available[0] and "cl_khr_fp16" in self.cl_device.extensions.split()

    @property
    def has_fp64(self) -> bool:
        return not self.available[0] or "cl_khr_fp64" in self.cl_device.extensions.split()

    @property
    def compiler(self) -> OpenCLCompiler | None:  # type: ignore[override]
        if self._compiler is None and self.available[0]:
            self._compiler = OpenCLCompiler(self)
        return self._compiler

    @property
    def compile_error(self) -> str | None:
        ok, why = self.available
        if ok:
            return None
        lint = libclang_error()
        return f"{why}; the source was type-checked with clang" if lint is None else \
            f"{why}; the source was not type-checked ({lint})"

    def lint(self, src: str) -> None:
        """Type-check a kernel source as OpenCL C 1.2 with clang; CompileError on an error (a no-op without
        libclang, where `compile_error` says so)."""
        if libclang_error() is None:
            opencl_linter().lint(src)

    @property
    def max_buffer_bytes(self) -> int | None:  # type: ignore[override]
        return int(self.cl_device.max_mem_alloc_size)

    def program(self, name: str, lib: bytes) -> OpenCLProgram:
        self.ensure_runnable()
        return OpenCLProgram(self, name, lib)

    def loaded(self, lib: bytes) -> cl.Program:
        """The program binary `lib` built (loaded) on the device, once for the kernels it holds: the binary of a
        batch (`OpenCLCompiler.compile_batch`) holds up to `batch_max` kernels; the last LOADED_KEEP are kept."""
        key = lib if isinstance(lib, bytes) else bytes(lib)  # (a bytearray or memoryview is no dict key)
        with self._loaded_lock:
            prg = self._loaded.pop(key, None)
        if prg is None:
            prg = self.cl.Program(self.context, [self.cl_device], [key]).build()
        with self._loaded_lock:
            self._loaded[key] = prg  # (most recent last)
            while len(self._loaded) > LOADED_KEEP:
                del self._loaded[next(iter(self._loaded))]
        return prg

    def synchronize(self) -> None:
        if self._opened is not None:
            self.queue.finish()

    def info(self) -> dict[str, Any]:
        ok, why = self.available
        if not ok:
            out: dict[str, Any] = {"renderer": "opencl", "available": False, "reason": why,
                                   "compiler": "clang type-check (OpenCL C 1.2)", "version": libclang_version()}
            try:
                d = _all_devices()[self.index]
                out.update(platform=d.platform.name.strip(), platform_version=d.platform.version.strip(),
                           device=d.name.strip(), driver_version=d.driver_version.strip())
            except (DeviceError, IndexError):
                pass
            if libclang_error() is not None:
                out["compile_error"] = libclang_error()
            return out
        d = self.cl_device
        return {
            "available": True,
            "platform": d.platform.name.strip(),
            "platform_version": d.platform.version.strip(),
            "device": d.name.strip(),
            "driver_version": d.driver_version.strip(),
            "opencl_c_version": d.opencl_c_version.strip(),
            "compute_units": d.max_compute_units,
            "max_work_group_size": d.max_work_group_size,
            "local_mem_size": d.local_mem_size,
            "global_mem_size": d.global_mem_size,
            "fp16": self.has_fp16,
            "fp64": self.has_fp64,
        }
