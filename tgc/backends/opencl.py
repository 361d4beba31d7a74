"""OpenCL backend through pyopencl (on a machine without a GPU: PoCL on the CPU).

Launch convention (as in CUDA): `global_size` is the number of work-groups per dimension and
`local_size` the work-items per group, so the ND range enqueued is `global_size * local_size`.
With `local_size=None`, `global_size` is the total number of work-items and the runtime picks
the group size.

pyopencl is imported only when a device is opened or probed, never at module import.
"""

from __future__ import annotations

import contextlib
import os
import struct
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from tgc.backends.base import Compiler, Device, LRUAllocator, Program
from tgc.backends.cstyle import OpenCLRenderer
from tgc.errors import CompileError, DeviceError

if TYPE_CHECKING:
    import pyopencl as cl

INSTALL_HINT = "pip install 'tgc[opencl]'"
LLVM_BITCODE_MAGIC = b"BC\xc0\xde"


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

    def _build_log(self, prg: cl.Program) -> str:
        cl = self.device.cl
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return prg.get_build_info(self.device.cl_device, cl.program_build_info.LOG) or ""
        except cl.Error:
            return ""

    def disassemble(self, lib: bytes) -> str:
        """LLVM IR of the kernels in the binary.

        A PoCL binary embeds the program's LLVM bitcode (its `program.bc`), which llvmlite can print. Other
        drivers' binaries (or bitcode llvmlite cannot read) come back as the printable text found in the bytes.
        """
        ir = _pocl_bitcode_ir(lib)
        if ir is not None:
            return ir
        return "; no disassembler for this OpenCL binary; printable strings follow\n" + _printable_strings(lib)


def _pocl_bitcode_ir(lib: bytes) -> str | None:
    """The kernel functions of the bitcode a PoCL binary holds, as LLVM IR text; None if there is none."""
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
    return "\n".join(str(fn) for fn in (kernels or defined))


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
            self.program = cl.Program(device.context, [device.cl_device], [lib]).build()
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


class OpenCLDevice(Device):
    """`OPENCL:i`: the i-th OpenCL device over all platforms."""

    kind = "OPENCL"
    # The OpenCL C renderer is a dialect of the shared C-style renderer (written by the lead); it is attached there.
    renderer: Any = OpenCLRenderer()
    launch_style = "gpu"

    def __init__(self, index: int = 0):
        super().__init__(index)
        self.cl = _import_cl()
        devices = _all_devices()
        if index >= len(devices):
            raise DeviceError(f"no OpenCL device {index}: this machine has {len(devices)}",
                              hint=f"use OPENCL:0 .. OPENCL:{len(devices) - 1}")
        self.cl_device = devices[index]
        self.context = self.cl.Context([self.cl_device])
        self.queue = self.cl.CommandQueue(self.context, self.cl_device,
                                          properties=self.cl.command_queue_properties.PROFILING_ENABLE)
        extensions = self.cl_device.extensions.split()
        # Without cl_khr_fp16 (PoCL), `half` is storage only: the renderer must use vload_half/vstore_half.
        self.has_fp16: bool = "cl_khr_fp16" in extensions
        self.has_fp64: bool = "cl_khr_fp64" in extensions
        self.compiler = OpenCLCompiler(self)
        self.allocator = OpenCLAllocator(self)

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        """(True, "") when pyopencl is installed and at least one OpenCL device exists."""
        try:
            _all_devices()
        except DeviceError as e:
            return False, f"{e.msg}; {e.hint}" if e.hint else e.msg
        return True, ""

    @property
    def max_buffer_bytes(self) -> int | None:  # type: ignore[override]
        return int(self.cl_device.max_mem_alloc_size)

    def program(self, name: str, lib: bytes) -> OpenCLProgram:
        return OpenCLProgram(self, name, lib)

    def synchronize(self) -> None:
        self.queue.finish()

    def info(self) -> dict[str, Any]:
        d = self.cl_device
        return {
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
