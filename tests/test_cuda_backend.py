"""The CUDA backend: NVRTC compiles without a GPU; the runtime runs against a fake driver here and a real GPU
where one exists (tests marked `gpu`)."""

from __future__ import annotations

import ctypes
import enum
import subprocess
import sys

import numpy as np
import pytest

from tgc.backends import cuda
from tgc.errors import CompileError, DeviceError

nvrtc_missing = cuda.nvrtc_error()
needs_nvrtc = pytest.mark.skipif(nvrtc_missing is not None, reason=f"NVRTC unavailable: {nvrtc_missing}")

ADD = """
extern "C" __global__ void add(float* out, const float* a, const float* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
"""

SCALE = """
extern "C" __global__ void scale(float* out, const float* a, int n, int k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] * (float)k;
}
"""

# f16 in, bf16 out, both as unsigned short bits: no cuda_fp16.h needed.
HALF = cuda.HALF_HELPERS + """
extern "C" __global__ void h2bf(unsigned short* out, const unsigned short* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tgc_float2bf16(tgc_half2float(a[i]) * 2.0f + tgc_bf162float(tgc_float2bf16(1.0f)));
}
extern "C" __global__ void f2h(unsigned short* out, const float* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tgc_float2half(a[i]);
}
"""


# ---------------------------------------------------------------- compiling (no GPU needed)

def test_import_does_not_load_cuda_bindings():
    code = "import sys, tgc.backends.cuda; print([m for m in sys.modules if m.startswith('cuda')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@needs_nvrtc
def test_ptx_of_a_handwritten_kernel():
    ptx = cuda.NVRTCCompiler("sm_90").compile_ptx(ADD)
    assert ".visible .entry add(" in ptx
    assert ".target sm_90" in ptx
    assert "add.rn.f32" in ptx  # --fmad=false: every add is rounded on its own, never fused


@needs_nvrtc
def test_cubin_is_an_elf_for_the_arch_and_disassembles_to_ptx():
    comp = cuda.NVRTCCompiler("sm_90")
    cubin = comp.compile(ADD)
    assert cubin[:4] == b"\x7fELF"
    assert b"add" in cubin
    ptx = comp.disassemble(cubin)
    assert ".visible .entry add(" in ptx and ".target sm_90" in ptx


@needs_nvrtc
def test_other_arch_targets_it():
    comp = cuda.NVRTCCompiler("89")
    assert comp.arch == "sm_89"
    assert ".target sm_89" in comp.compile_ptx(ADD)
    assert comp.compile(ADD)[:4] == b"\x7fELF"


@needs_nvrtc
def test_disassemble_a_cubin_from_elsewhere_needs_the_source():
    cubin = cuda.NVRTCCompiler("sm_90").compile(ADD)
    fresh = cuda.NVRTCCompiler("sm_90")
    with pytest.raises(CompileError, match="PTX of this cubin is unknown"):
        fresh.disassemble(cubin)
    assert ".entry add(" in fresh.disassemble(cubin, src=ADD)
    assert ".entry add(" in fresh.compile_ptx(ADD)


@needs_nvrtc
def test_half_and_bf16_without_headers():
    comp = cuda.NVRTCCompiler("sm_90")
    ptx = comp.compile_ptx(HALF)
    for insn in ("cvt.f32.f16", "cvt.rn.f16.f32", "cvt.rn.bf16.f32"):
        assert insn in ptx
    assert comp.compile(HALF)[:4] == b"\x7fELF"


@needs_nvrtc
def test_cuda_fp16_header_is_not_shipped():
    # A documented fact of the nvidia-cuda-nvrtc wheel: kernels must define their own half helpers.
    src = '#include <cuda_fp16.h>\nextern "C" __global__ void k(__half* a) { a[0] = a[1]; }'
    with pytest.raises(CompileError, match="could not open source file"):
        cuda.NVRTCCompiler().compile(src)


@needs_nvrtc
def test_syntax_error_raises_compile_error_with_nvrtc_log():
    with pytest.raises(CompileError) as info:
        cuda.NVRTCCompiler().compile(ADD.replace("threadIdx.x;", "threadIdx.x"))
    err = info.value
    assert 'expected a ";"' in err.msg
    assert "add.cu(" in err.msg  # NVRTC's log names the kernel's file and line
    assert err.exit_code == 1


@needs_nvrtc
def test_unsupported_arch_says_which_are():
    with pytest.raises(CompileError) as info:
        cuda.NVRTCCompiler("sm_50").compile(ADD)
    assert "gpu-architecture" in info.value.msg
    assert "sm_90" in info.value.hint


@needs_nvrtc
def test_compiler_identity_and_cache():
    comp = cuda.nvrtc_compiler("sm_90")
    assert cuda.nvrtc_compiler("90") is comp and cuda.nvrtc_compiler("9.0") is comp
    assert cuda.nvrtc_compiler("sm_89") is not comp
    assert comp.name == "nvrtc"
    major, minor = comp.version.split(".")
    assert int(major) >= 12 and minor.isdigit()
    assert comp.cache_key.startswith(f"nvrtc-{comp.version}-sm_90-")  # then a hash of the options (--fmad=false)


@pytest.mark.parametrize("given, want", [("sm_90", "sm_90"), ("90", "sm_90"), ("9.0", "sm_90"), ("compute_89", "sm_89"),
                                         ("sm_90a", "sm_90a"), ("10.0", "sm_100"), ("SM_120", "sm_120")])
def test_normalize_arch(given, want):
    assert cuda.normalize_arch(given) == want


def test_normalize_arch_rejects_junk():
    with pytest.raises(CompileError, match="bad CUDA architecture"):
        cuda.normalize_arch("hopper")


# ---------------------------------------------------------------- the device without a GPU

@pytest.fixture
def no_driver(monkeypatch):
    """Pretend libcuda.so.1 is missing, whatever this machine has."""
    def missing(*args, **kwargs):
        raise OSError("libcuda.so.1: cannot open shared object file")
    cuda._driver_probe.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", missing)
    yield
    cuda._driver_probe.cache_clear()


def test_probe_without_driver(no_driver):
    ok, why = cuda.CUDADevice.probe()
    assert ok is False
    assert why == "no CUDA driver (libcuda.so.1 not found)"


def test_device_without_gpu_compiles_but_cannot_run(no_driver, monkeypatch):
    monkeypatch.delenv("TGC_CUDA_ARCH", raising=False)
    dev = cuda.CUDADevice()
    assert dev.kind == "CUDA" and dev.launch_style == "gpu" and dev.arch == "sm_90"
    assert dev.compile_error == nvrtc_missing
    with pytest.raises(DeviceError, match="no CUDA device is present: no CUDA driver"):
        dev.allocator.alloc(64)
    with pytest.raises(DeviceError, match="no CUDA device is present"):
        dev.program("add", b"\x7fELF")
    info = dev.info()
    assert info["available"] is False and "libcuda" in info["reason"]
    assert info["arch"] == "sm_90" and info["compiler"] == "nvrtc"


def test_arch_from_env_without_gpu(no_driver, monkeypatch):
    monkeypatch.setenv("TGC_CUDA_ARCH", "8.9")
    dev = cuda.CUDADevice()
    assert dev.arch == "sm_89"
    if nvrtc_missing is None:
        assert dev.compiler.arch == "sm_89"
        assert ".target sm_89" in dev.compiler.compile_ptx(ADD)


# ---------------------------------------------------------------- the runtime against a fake driver

class FakeDriver:
    """Just enough of `cuda.bindings.driver` to run `add`/`scale` on host memory, recording each launch."""

    class CUresult(enum.IntEnum):
        CUDA_SUCCESS = 0
        CUDA_ERROR_OUT_OF_MEMORY = 2
        CUDA_ERROR_INVALID_VALUE = 1
        CUDA_ERROR_INVALID_IMAGE = 200

    class CUevent_flags(enum.IntEnum):
        CU_EVENT_DEFAULT = 0

    class CUdevice_attribute(enum.IntEnum):
        CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
        CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38
        CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36
        CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76

    ATTRS = {13: 1_980_000, 16: 132, 36: 2_619_000, 37: 5120, 38: 50 << 20, 75: 9, 76: 0}

    def __init__(self, memory_limit: int = 1 << 20):
        self.memory: dict[int, bytearray] = {}
        self.next_addr, self.memory_limit = 0x10000, memory_limit
        self.launches: list[tuple] = []
        self.current = None
        ok = self.CUresult.CUDA_SUCCESS
        self.cuInit = lambda flags: (ok,)
        self.cuDeviceGet = lambda i: (ok, i)
        self.cuDeviceGetAttribute = lambda attr, dev: (ok, self.ATTRS[int(attr)])
        self.cuDeviceGetName = lambda n, dev: (ok, b"Fake H100".ljust(n, b"\0"))
        self.cuDeviceTotalMem = lambda dev: (ok, 80 << 30)
        self.cuDriverGetVersion = lambda: (ok, 13000)
        self.cuDevicePrimaryCtxRetain = lambda dev: (ok, f"ctx{dev}")
        self.cuCtxSynchronize = lambda: (ok,)
        self.cuModuleGetFunction = lambda mod, name: (ok, name.decode())
        self.cuModuleUnload = lambda mod: (ok,)
        self.cuEventCreate = lambda flags: (ok, object())
        self.cuEventRecord = lambda ev, stream: (ok,)
        self.cuEventSynchronize = lambda ev: (ok,)
        self.cuEventElapsedTime = lambda start, end: (ok, 2.5)

    def cuCtxSetCurrent(self, ctx):
        self.current = ctx
        return (self.CUresult.CUDA_SUCCESS,)

    def cuMemAlloc(self, nbytes):
        if sum(map(len, self.memory.values())) + nbytes > self.memory_limit:
            return (self.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
        addr, self.next_addr = self.next_addr, self.next_addr + nbytes + 256
        self.memory[addr] = bytearray(nbytes)
        return (self.CUresult.CUDA_SUCCESS, addr)

    def cuMemFree(self, addr):
        del self.memory[int(addr)]
        return (self.CUresult.CUDA_SUCCESS,)

    def cuMemcpyHtoD(self, dst, src, nbytes):
        self.memory[dst][:nbytes] = bytes(src)[:nbytes]
        return (self.CUresult.CUDA_SUCCESS,)

    def cuMemcpyDtoH(self, dst, src, nbytes):
        dst[:nbytes] = self.memory[src][:nbytes]
        return (self.CUresult.CUDA_SUCCESS,)

    def cuModuleLoadData(self, image):
        if bytes(image[:4]) != b"\x7fELF":
            return (self.CUresult.CUDA_ERROR_INVALID_IMAGE, None)
        return (self.CUresult.CUDA_SUCCESS, "module")

    SIGNATURES = {"add": (ctypes.c_void_p,) * 3 + (ctypes.c_int32,),
                  "scale": (ctypes.c_void_p,) * 2 + (ctypes.c_int32,) * 2}

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        # params: the address of a void** array (packed by the runtime), decoded with the kernel's signature
        types = self.SIGNATURES[fn]
        ptrs = (ctypes.c_void_p * len(types)).from_address(params)
        args = tuple((ctypes.c_uint64 if t is ctypes.c_void_p else t).from_address(p).value
                     for t, p in zip(types, ptrs))
        self.launches.append((fn, (gx, gy, gz), (bx, by, bz), (args, types)))
        if bx * by * bz > 1024:
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE,)
        threads = gx * bx
        f32 = lambda addr: np.frombuffer(self.memory[addr], np.float32)  # noqa: E731
        if fn == "add":
            out, a, b, n = args
            m = min(n, threads)
            f32(out)[:m] = f32(a)[:m] + f32(b)[:m]
        elif fn == "scale":
            out, a, n, k = args
            m = min(n, threads)
            f32(out)[:m] = f32(a)[:m] * np.float32(k)
        return (self.CUresult.CUDA_SUCCESS,)


@pytest.fixture
def fake(monkeypatch):
    drv = FakeDriver()
    monkeypatch.setattr(cuda, "_driver", lambda: drv)
    monkeypatch.setattr(cuda, "_driver_probe", lambda: (True, "", 1))
    return drv


def _upload(dev, arr: np.ndarray) -> int:
    h = dev.allocator.alloc(arr.nbytes)
    dev.allocator.copyin(h, memoryview(arr))
    return h


def test_fake_gpu_run_add(fake):
    dev = cuda.CUDADevice()
    assert dev.arch == "sm_90"  # from the (fake) compute capability 9.0
    a, b = np.arange(1000, dtype=np.float32), np.full(1000, 0.5, np.float32)
    ha, hb, hout = _upload(dev, a), _upload(dev, b), dev.allocator.alloc(a.nbytes)
    prog = dev.program("add", b"\x7fELF fake cubin")
    assert prog(hout, ha, hb, global_size=(4, 1, 1), local_size=(256, 1, 1), vals=(1000,)) is None
    out = np.empty_like(a)
    dev.allocator.copyout(memoryview(out), hout)
    np.testing.assert_array_equal(out, a + b)
    fn, grid, block, (args, types) = fake.launches[-1]
    assert (fn, grid, block) == ("add", (4, 1, 1), (256, 1, 1))
    assert args == (hout, ha, hb, 1000)
    assert types == (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)
    assert fake.current == "ctx0"


def test_fake_gpu_timing_and_short_sizes(fake):
    dev = cuda.CUDADevice()
    a = np.arange(10, dtype=np.float32)
    ha, hout = _upload(dev, a), dev.allocator.alloc(a.nbytes)
    secs = dev.program("scale", b"\x7fELF")(hout, ha, global_size=(10,), local_size=None, vals=(10, -3), wait=True)
    assert secs == pytest.approx(2.5e-3)
    out = np.empty_like(a)
    dev.allocator.copyout(memoryview(out), hout)
    np.testing.assert_array_equal(out, a * -3)
    _, grid, block, _ = fake.launches[-1]
    assert grid == (10, 1, 1) and block == (1, 1, 1)  # short sizes are padded with 1s; no local_size is 1x1x1


def test_fake_gpu_errors_become_device_errors(fake):
    dev = cuda.CUDADevice()
    with pytest.raises(DeviceError, match="cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE"):
        dev.program("add", b"not a cubin")
    prog = dev.program("add", b"\x7fELF")
    with pytest.raises(DeviceError, match="cuLaunchKernel.*CUDA_ERROR_INVALID_VALUE"):
        prog(0, 0, 0, global_size=(1, 1, 1), local_size=(2048, 1, 1), vals=(1,))
    with pytest.raises(DeviceError, match="bad CUDA launch size"):
        prog(0, 0, 0, global_size=(0, 1, 1), vals=(1,))


def test_fake_gpu_out_of_memory_frees_the_cache_and_retries(fake):
    dev = cuda.CUDADevice()
    fake.memory_limit = 1000
    h = dev.allocator.alloc(600)
    dev.allocator.free(h, 600)  # kept in the LRU cache, still allocated on the device
    assert dev.allocator.alloc(600) == h and dev.allocator.allocations == 1
    dev.allocator.free(h, 600)
    h2 = dev.allocator.alloc(800)  # fails once, the cache is released, then succeeds
    assert h2 in fake.memory and h not in fake.memory
    with pytest.raises(MemoryError):
        dev.allocator.alloc(5000)


def test_fake_gpu_second_device_index_is_checked(fake):
    with pytest.raises(DeviceError, match="index 1"):
        cuda.CUDADevice(1).allocator.alloc(4)


def test_fake_gpu_info(fake):
    info = cuda.CUDADevice().info()
    assert info["available"] is True
    assert info["name"] == "Fake H100" and info["sm_count"] == 132 and info["compute_capability"] == "9.0"
    assert info["memory_bytes"] == 80 << 30
    assert info["peak_gflops"] == pytest.approx(132 * 128 * 2 * 1.98, rel=1e-3)
    assert info["peak_gbps"] == pytest.approx(3352.3, rel=1e-3)
    # the one name bench and `tgc devices` read
    from tgc.engine.bench import machine_peak
    peak = machine_peak(cuda.CUDADevice())
    assert peak["gbps"] == info["peak_gbps"] and peak["gflops"] == info["peak_gflops"]
    assert info["cache_bytes"] == peak["cache_bytes"] == 50 << 20  # the L2: data that fits stays there


def test_fake_gpu_context_is_opened_once_across_threads(fake):
    import threading
    import time
    calls = []

    def retain(dev):
        calls.append(dev)
        time.sleep(0.05)  # a slow first open: other threads arrive meanwhile
        return (fake.CUresult.CUDA_SUCCESS, f"ctx{dev}")
    fake.cuDevicePrimaryCtxRetain = retain
    dev = cuda.CUDADevice()
    threads = [threading.Thread(target=dev.activate) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1


def test_fake_gpu_arch_from_env_wins_over_the_gpu(fake, monkeypatch):
    assert cuda.CUDADevice().arch == "sm_90"
    monkeypatch.setenv("TGC_CUDA_ARCH", "8.0")
    assert cuda.CUDADevice().arch == "sm_80"


def test_fake_gpu_timed_launch_records_start_right_before_the_launch(fake):
    order = []
    record = fake.cuEventRecord
    fake.cuEventRecord = lambda ev, stream: (order.append("record"), record(ev, stream))[1]
    launch = fake.cuLaunchKernel
    fake.cuLaunchKernel = lambda *a: (order.append(("launch", type(a[-2]))), launch(*a))[1]
    dev = cuda.CUDADevice()
    a = np.arange(10, dtype=np.float32)
    ha, hout = _upload(dev, a), dev.allocator.alloc(a.nbytes)
    dev.program("scale", b"\x7fELF")(hout, ha, global_size=(10,), vals=(10, 2), wait=True)
    assert order == ["record", ("launch", int), "record"]  # parameters packed before the start event


# ---------------------------------------------------------------- a real GPU

gpu_ok, gpu_why = cuda.CUDADevice.probe()
needs_gpu = pytest.mark.skipif(not gpu_ok, reason=f"no usable CUDA GPU: {gpu_why}")


@pytest.fixture(scope="module")
def gpu():
    dev = cuda.CUDADevice()
    if dev.compiler is None:
        pytest.skip(f"NVRTC unavailable: {dev.compile_error}")
    return dev


def _run(dev, src: str, name: str, out: np.ndarray, *ins: np.ndarray, vals=(), block=128) -> float:
    prog = dev.program(name, dev.compiler.compile(src))
    handles = [_upload(dev, x) for x in ins]
    hout = dev.allocator.alloc(out.nbytes)
    n = out.size
    secs = prog(hout, *handles, global_size=((n + block - 1) // block, 1, 1), local_size=(block, 1, 1),
                vals=vals, wait=True)
    dev.allocator.copyout(memoryview(out), hout)
    for h, x in zip(handles, ins):
        dev.allocator.free(h, x.nbytes)
    dev.allocator.free(hout, out.nbytes)
    return secs


@pytest.mark.gpu
@needs_gpu
def test_gpu_add_matches_numpy(gpu):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(10_000).astype(np.float32), rng.standard_normal(10_000).astype(np.float32)
    out = np.zeros_like(a)
    secs = _run(gpu, ADD, "add", out, a, b, vals=(a.size,))
    np.testing.assert_array_equal(out, a + b)
    assert isinstance(secs, float) and secs >= 0


@pytest.mark.gpu
@needs_gpu
def test_gpu_int_vals_and_reused_buffers(gpu):
    a = np.arange(-500, 500, dtype=np.float32)
    out = np.zeros_like(a)
    before = gpu.allocator.allocations
    _run(gpu, SCALE, "scale", out, a, vals=(a.size, -3))
    np.testing.assert_array_equal(out, a * -3)
    _run(gpu, SCALE, "scale", out, a, vals=(a.size, 7))
    np.testing.assert_array_equal(out, a * 7)
    assert gpu.allocator.allocations - before <= 2  # the second run reuses the cached buffers


@pytest.mark.gpu
@needs_gpu
def test_gpu_half_to_bf16(gpu):
    a = np.linspace(-4, 4, 777).astype(np.float16)
    out = np.zeros(a.size, np.uint16)
    _run(gpu, HALF, "h2bf", out, a.view(np.uint16), vals=(a.size,))
    got = (out.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_allclose(got, a.astype(np.float32) * 2 + 1, rtol=2 ** -8)


@pytest.mark.gpu
@needs_gpu
def test_gpu_float_to_half(gpu):
    a = np.random.default_rng(1).standard_normal(1000).astype(np.float32) * 100
    out = np.zeros(a.size, np.uint16)
    _run(gpu, HALF, "f2h", out, a, vals=(a.size,))
    np.testing.assert_array_equal(out.view(np.float16), a.astype(np.float16))  # both round to nearest even


@pytest.mark.gpu
@needs_gpu
def test_gpu_info(gpu):
    info = gpu.info()
    assert info["available"] is True and info["sm_count"] > 0 and info["memory_bytes"] > 0
    assert info["arch"].startswith("sm_")
