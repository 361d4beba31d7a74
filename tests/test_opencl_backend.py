"""The OpenCL backend on whatever OpenCL device is here (PoCL on the CPU in CI), with hand-written kernels.

PoCL and pyopencl write caches under `~/.cache`; this module points `POCL_CACHE_DIR` and `XDG_CACHE_HOME` at a
temporary directory before pyopencl is first imported (the Makefile sets them too).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

if "POCL_CACHE_DIR" not in os.environ or "XDG_CACHE_HOME" not in os.environ:
    _cache_root = tempfile.mkdtemp(prefix="tgc-test-opencl-")
    atexit.register(shutil.rmtree, _cache_root, ignore_errors=True)
    os.environ.setdefault("POCL_CACHE_DIR", os.path.join(_cache_root, "pocl"))
    os.environ.setdefault("XDG_CACHE_HOME", os.path.join(_cache_root, "xdg"))

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tgc.backends.opencl import OpenCLDevice  # noqa: E402
from tgc.errors import CompileError, DeviceError, TgcError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
AVAILABLE, WHY_NOT = OpenCLDevice.probe()
needs_opencl = pytest.mark.skipif(not AVAILABLE, reason=f"no OpenCL here: {WHY_NOT}")

ADD_SRC = """
__kernel void add(__global float* out, __global const float* a, __global const float* b, int n) {
  int i = get_global_id(0);
  if (i < n) out[i] = a[i] + b[i];
}
"""

HALF_SRC = """
__kernel void scale_half(__global half* out, __global const half* a, int k) {
  int i = get_global_id(0);
  vstore_half(vload_half(i, a) * k, i, out);
}
"""

# One partial sum per work-group of 64 items, through local memory and barriers.
REDUCE_SRC = """
__kernel void partial_sum(__global float* out, __global const float* a) {
  __local float scratch[64];
  int lid = get_local_id(0);
  scratch[lid] = a[get_global_id(0)];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int stride = 32; stride > 0; stride >>= 1) {
    if (lid < stride) scratch[lid] += scratch[lid + stride];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) out[get_group_id(0)] = scratch[0];
}
"""

AFFINE2D_SRC = """
__kernel void affine2d(__global int* out, int width, int mul, int add) {
  int x = get_global_id(0), y = get_global_id(1);
  out[y * width + x] = (y * width + x) * mul + add;
}
"""


def env_for_subprocess(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="module")
def dev() -> OpenCLDevice:
    if not AVAILABLE:
        pytest.skip(f"no OpenCL here: {WHY_NOT}")
    return OpenCLDevice(0)


def upload(dev: OpenCLDevice, arr: np.ndarray):
    buf = dev.allocator.alloc(arr.nbytes)
    dev.allocator.copyin(buf, memoryview(np.ascontiguousarray(arr)))
    return buf


def download(dev: OpenCLDevice, buf, shape, dtype) -> np.ndarray:
    out = np.empty(shape, dtype=dtype)
    dev.allocator.copyout(memoryview(out), buf)
    return out


def run_add(dev: OpenCLDevice, lib: bytes, n: int, **launch) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    out = dev.allocator.alloc(4 * n)
    dev.program("add", lib)(out, upload(dev, a), upload(dev, b), vals=(n,), wait=True, **launch)
    return download(dev, out, n, np.float32), a + b


# --- no pyopencl / no platform -------------------------------------------------------------------------------------


def test_module_import_does_not_import_pyopencl():
    code = "import sys, tgc.backends.opencl; print('pyopencl' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_for_subprocess())
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_probe_without_pyopencl_says_how_to_install():
    code = textwrap.dedent("""
        import sys
        sys.modules["pyopencl"] = None  # makes `import pyopencl` raise ImportError
        from tgc.backends.opencl import OpenCLDevice
        ok, why = OpenCLDevice.probe()
        print(ok); print(why)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_for_subprocess())
    assert res.returncode == 0, res.stderr
    ok, why = res.stdout.split("\n", 1)
    assert ok == "False"
    assert "pyopencl is not installed" in why and "pip install 'tgc[opencl]'" in why


def test_probe_without_platform(tmp_path):
    # The ICD loader bundled with the pyopencl wheel falls back to its own PoCL when the vendors dir is empty,
    # but a vendors path that does not exist leaves it with no platform at all.
    code = "from tgc.backends.opencl import OpenCLDevice; ok, why = OpenCLDevice.probe(); print(ok); print(why)"
    env = env_for_subprocess(OCL_ICD_VENDORS=str(tmp_path / "no-such-vendors-dir"))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    ok, why = res.stdout.split("\n", 1)
    if ok == "True":
        pytest.skip("this OpenCL loader ignores OCL_ICD_VENDORS; cannot simulate a machine without a platform")
    assert "no OpenCL platform found" in why or "no OpenCL device found" in why
    assert "pip install" in why


def test_device_index_out_of_range_is_a_user_error():
    with pytest.raises(TgcError, match="no OpenCL device 999") as info:
        OpenCLDevice(999)
    assert info.value.exit_code == 2


# --- device facts ----------------------------------------------------------------------------------------------------


def test_device_facts(dev):
    info = dev.info()
    for key in ("platform", "device", "driver_version", "opencl_c_version", "compute_units", "max_work_group_size",
                "local_mem_size", "fp16", "fp64"):
        assert key in info, key
    assert info["compute_units"] >= 1 and info["max_work_group_size"] >= 1
    assert info["opencl_c_version"].startswith("OpenCL C")
    assert (dev.kind, dev.launch_style, dev.renderer.name) == ("OPENCL", "gpu", "opencl")
    assert dev.compiler.name == "opencl-" + info["platform"]
    assert info["driver_version"] in dev.compiler.version and info["opencl_c_version"] in dev.compiler.version
    assert dev.has_fp16 == info["fp16"] and dev.has_fp64 == info["fp64"]


def test_fp16_flag_matches_what_the_compiler_accepts(dev):
    # Arithmetic straight on `half` pointers only builds with cl_khr_fp16, which is what has_fp16 reports.
    src = ("#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n"
           "__kernel void h(__global half* a) { a[0] = a[1] * a[2]; }")
    if dev.has_fp16:
        dev.compiler.compile(src)
    else:
        with pytest.raises(CompileError):
            dev.compiler.compile(src)


# --- compile and run -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 1000, 4096])
def test_add_groups_times_local(dev, n):
    lib = dev.compiler.compile(ADD_SRC)
    assert isinstance(lib, bytes) and lib
    got, want = run_add(dev, lib, n, global_size=(-(-n // 64), 1, 1), local_size=(64, 1, 1))
    np.testing.assert_array_equal(got, want)


def test_add_with_runtime_local_size(dev):
    n = 777
    got, want = run_add(dev, dev.compiler.compile(ADD_SRC), n, global_size=(n, 1, 1), local_size=None)
    np.testing.assert_array_equal(got, want)


def test_int_vals_and_2d_grid(dev):
    # 3 x 2 groups of 4 x 8 items: global range 12 x 16, so the launch must multiply groups by local size.
    width, height = 12, 16
    out = dev.allocator.alloc(4 * width * height)
    prg = dev.program("affine2d", dev.compiler.compile(AFFINE2D_SRC))
    prg(out, global_size=(3, 2, 1), local_size=(4, 8, 1), vals=(width, 3, -5), wait=True)
    got = download(dev, out, (height, width), np.int32)
    np.testing.assert_array_equal(got, np.arange(width * height, dtype=np.int32).reshape(height, width) * 3 - 5)


def test_wait_returns_seconds_and_no_wait_returns_none(dev):
    lib = dev.compiler.compile(ADD_SRC)
    prg = dev.program("add", lib)
    n = 256
    bufs = [dev.allocator.alloc(4 * n) for _ in range(3)]
    assert prg(*bufs, global_size=(4, 1, 1), local_size=(64, 1, 1), vals=(n,)) is None
    dev.synchronize()
    elapsed = prg(*bufs, global_size=(4, 1, 1), local_size=(64, 1, 1), vals=(n,), wait=True)
    assert isinstance(elapsed, float) and elapsed >= 0


def test_half_storage_with_vload_vstore(dev):
    a = np.linspace(-4, 4, 300).astype(np.float16)
    out = dev.allocator.alloc(a.nbytes)
    prg = dev.program("scale_half", dev.compiler.compile(HALF_SRC))
    prg(out, upload(dev, a), global_size=(a.size, 1, 1), local_size=None, vals=(3,), wait=True)
    got = download(dev, out, a.shape, np.float16)
    np.testing.assert_array_equal(got, (a.astype(np.float32) * 3).astype(np.float16))


def test_local_memory_reduction(dev):
    groups = 37
    a = np.random.default_rng(0).integers(-100, 100, size=64 * groups).astype(np.float32)
    out = dev.allocator.alloc(4 * groups)
    prg = dev.program("partial_sum", dev.compiler.compile(REDUCE_SRC))
    prg(out, upload(dev, a), global_size=(groups, 1, 1), local_size=(64, 1, 1), wait=True)
    got = download(dev, out, groups, np.float32)
    np.testing.assert_array_equal(got, a.reshape(groups, 64).sum(axis=1))  # small integers: exact in f32


# --- binaries --------------------------------------------------------------------------------------------------------


def test_binary_loads_in_another_device_instance(dev):
    lib = dev.compiler.compile(ADD_SRC)
    other = OpenCLDevice(0)  # a second context: the bytes alone must be enough
    assert other.context is not dev.context
    got, want = run_add(other, lib, 500, global_size=(8, 1, 1), local_size=(64, 1, 1))
    np.testing.assert_array_equal(got, want)


def test_binary_loads_in_another_process(dev, tmp_path):
    (tmp_path / "add.bin").write_bytes(dev.compiler.compile(ADD_SRC))
    code = textwrap.dedent(f"""
        import numpy as np
        from tgc.backends.opencl import OpenCLDevice
        dev = OpenCLDevice(0)
        lib = open({str(tmp_path / "add.bin")!r}, "rb").read()
        n = 100
        a = np.arange(n, dtype=np.float32); b = np.full(n, 0.5, dtype=np.float32)
        bufs = [dev.allocator.alloc(4 * n) for _ in range(3)]
        dev.allocator.copyin(bufs[1], memoryview(a)); dev.allocator.copyin(bufs[2], memoryview(b))
        dev.program("add", lib)(*bufs, global_size=(2, 1, 1), local_size=(64, 1, 1), vals=(n,), wait=True)
        out = np.empty(n, dtype=np.float32); dev.allocator.copyout(memoryview(out), bufs[0])
        print(",".join(str(x) for x in out))
    """)
    # A fresh PoCL cache too, so the child cannot reuse what this process built.
    env = env_for_subprocess(POCL_CACHE_DIR=str(tmp_path / "pocl"), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    got = np.array([float(x) for x in res.stdout.strip().split(",")], dtype=np.float32)
    np.testing.assert_array_equal(got, np.arange(100, dtype=np.float32) + 0.5)


def test_disassemble_names_the_kernel(dev):
    asm = dev.compiler.disassemble(dev.compiler.compile(ADD_SRC))
    assert "add" in asm
    if dev.info()["platform"] == "Portable Computing Language":
        assert "define" in asm and "@add(" in asm  # LLVM IR from the bitcode inside the PoCL binary


def test_missing_kernel_name(dev):
    with pytest.raises(DeviceError, match="no kernel 'sub'.*add"):
        dev.program("sub", dev.compiler.compile(ADD_SRC))


def test_wrong_argument_count(dev):
    prg = dev.program("add", dev.compiler.compile(ADD_SRC))
    buf = dev.allocator.alloc(4)
    with pytest.raises(DeviceError, match="takes 4 arguments"):
        prg(buf, buf, vals=(1,))


# --- errors and memory -----------------------------------------------------------------------------------------------


def test_build_error_carries_the_log(dev):
    src = "__kernel void bad(__global float* out) { out[0] = not_declared_anywhere; }"
    with pytest.raises(CompileError) as info:
        dev.compiler.compile(src)
    assert "not_declared_anywhere" in str(info.value)
    assert isinstance(info.value, TgcError) and info.value.exit_code == 1


def test_allocator_reuses_freed_buffers():
    if not AVAILABLE:
        pytest.skip(f"no OpenCL here: {WHY_NOT}")
    dev = OpenCLDevice(0)  # its own allocator, so the count starts at zero
    alloc = dev.allocator
    first = alloc.alloc(1024)
    assert alloc.allocations == 1
    alloc.free(first, 1024)
    again = alloc.alloc(1024)
    assert again is first and alloc.allocations == 1
    alloc.alloc(2048)
    assert alloc.allocations == 2
    alloc.free(again, 1024)
    alloc.free_cache()
    assert alloc.alloc(1024) is not first and alloc.allocations == 3


def test_zero_size_buffer(dev):
    buf = dev.allocator.alloc(0)
    empty = np.empty(0, dtype=np.float32)
    dev.allocator.copyin(buf, memoryview(empty))
    dev.allocator.copyout(memoryview(empty), buf)
    dev.allocator.free(buf, 0)


def test_copy_round_trip_keeps_bytes(dev):
    a = np.random.default_rng(1).integers(0, 255, size=4099, dtype=np.uint8)
    np.testing.assert_array_equal(download(dev, upload(dev, a), a.shape, np.uint8), a)


# --- the probe tells the truth; a device that cannot build is not available ---------------------------------------

POCL_ZEN5_LOG = "error: unknown target CPU 'generic'\nDevice pthread-AMD EPYC failed to build the program\n"
POCL_VERSION = "OpenCL 3.0 PoCL 3.0-rc2  Linux, Release, RELOC, LLVM 14.0.6, SLEEF, DISTRO, POCL_DEBUG"


def test_unknown_cpu_build_log_becomes_one_line(monkeypatch):
    from tgc.backends import opencl
    monkeypatch.setattr(opencl, "cpu_description", lambda: "AMD EPYC, family 26")
    assert opencl.explain_build_failure(POCL_ZEN5_LOG, POCL_VERSION, "pthread-AMD EPYC") == \
        "PoCL 3.0-rc2 cannot compile for this CPU (AMD EPYC, family 26): its LLVM does not know it"
    other = opencl.explain_build_failure("\n  error: out of resources\nmore\n", "OpenCL 3.0 Vendor", "GPU X")
    assert other == "OpenCL device 'GPU X' cannot build a test kernel: error: out of resources"


def test_cpu_description_names_model_and_family():
    from tgc.backends.opencl import cpu_description
    text = cpu_description()
    assert text and "\n" not in text
    if Path("/proc/cpuinfo").exists() and "cpu family" in Path("/proc/cpuinfo").read_text():
        assert ", family " in text


def test_probe_builds_and_runs_for_real_and_is_cached(monkeypatch):
    """The probe's answer comes from a real build and launch in a subprocess, once; later asks read the cache."""
    from tgc import cache
    from tgc.backends import opencl
    try:
        opencl._all_devices()
    except DeviceError as e:
        pytest.skip(f"no OpenCL device is listed here: {e.msg}")
    opencl.probe_device.cache_clear()
    cache.clear("probe")
    calls = []
    real = opencl._run_probe_subprocess
    monkeypatch.setattr(opencl, "_run_probe_subprocess", lambda i: calls.append(i) or real(i))
    first = opencl.probe_device(0)
    opencl.probe_device.cache_clear()
    second = opencl.probe_device(0)
    opencl.probe_device.cache_clear()
    assert first == second and calls == [0]  # the second answer came from the disk cache
    # the subprocess's answer agrees with building the same kernel here, in this process
    assert first == (AVAILABLE, WHY_NOT)
    child = opencl._probe_child(0)
    assert (child["ok"], child["why"]) == first


def test_a_crashing_driver_is_unavailable_not_a_crash(monkeypatch):
    from tgc.backends import opencl
    monkeypatch.setattr(opencl, "PROBE_KERNEL", "this is not OpenCL C")

    class Proc:
        returncode, stdout, stderr = -11, "", "Segmentation fault\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Proc())
    ok, why = opencl._run_probe_subprocess(0)
    assert not ok and "exit -11" in why and "Segmentation fault" in why


@pytest.fixture
def failing_probe(monkeypatch):
    """OPENCL as on a CPU PoCL's LLVM does not know: listed by pyopencl, but its probe fails."""
    from tgc import backends
    from tgc.backends import opencl
    why = "PoCL 3.0-rc2 cannot compile for this CPU (AMD EPYC, family 26): its LLVM does not know it"
    monkeypatch.setattr(opencl, "probe_device", lambda index=0: (False, why))
    monkeypatch.setattr(backends, "_instances", {})
    return why


SOFTMAX = str(ROOT / "kernels" / "softmax.tg")


def _cli(*args: str):
    from click.testing import CliRunner

    from tgc.cli.main import main
    return CliRunner(env={"NO_COLOR": "1", "TGC_DEVICE": None}).invoke(main, list(args))


def test_failing_probe_devices_says_why(failing_probe):
    import json
    res = _cli("devices", "--json")
    assert res.exit_code == 0, res.output
    row = next(r for r in json.loads(res.output) if r["device"] == "OPENCL")
    assert row["available"] is False and row["why_not"] == failing_probe
    assert "clang" in row["compiler"]


def test_failing_probe_run_fails_with_the_reason_exit_1(failing_probe):
    res = _cli("run", SOFTMAX, "--random", "-D", "N=4", "-D", "D=8", "-d", "OPENCL")
    assert res.exit_code == 1, res.output
    assert f"error: {failing_probe}" in res.output
    assert "Traceback" not in res.output and "internal error" not in res.output


def test_failing_probe_compile_still_prints_opencl_c(failing_probe):
    res = _cli("compile", SOFTMAX, "-D", "N=4", "-D", "D=8", "-d", "OPENCL")
    assert res.exit_code == 0, res.output
    assert "__kernel void" in res.output and "get_local_id" in res.output or "get_group_id" in res.output
    assert failing_probe in res.output  # the note says why nothing was built


def test_failing_probe_skips_the_language_suite_with_the_reason(failing_probe):
    from langkit import device_skip_reason
    assert device_skip_reason("OPENCL") == f"OPENCL cannot run here: {failing_probe}"
    assert device_skip_reason("CPU") is None


def test_failing_probe_api_run_raises_device_error(failing_probe):
    import tgc
    prog = tgc.loads("x: f32[4]\nreturn x + 1\n")
    with pytest.raises(DeviceError, match="cannot compile for this CPU"):
        prog.run(device="OPENCL", x=np.zeros(4, np.float32))
    kernels = prog.compile(device="OPENCL")  # rendering needs no device
    assert kernels and all(k.binary is None and "__kernel" in k.src for k in kernels)


# --- OpenCL C type-checked with clang where no driver compiles it ------------------------------------------------

LINT_ERROR = None
try:
    from tgc.backends.clang_lint import libclang_error as _le
    LINT_ERROR = _le()
except ImportError as _e:  # pragma: no cover
    LINT_ERROR = str(_e)
needs_libclang = pytest.mark.skipif(LINT_ERROR is not None, reason=f"libclang missing: {LINT_ERROR}")


@needs_libclang
@pytest.mark.parametrize("src", [ADD_SRC, HALF_SRC, REDUCE_SRC, AFFINE2D_SRC])
def test_handwritten_opencl_type_checks(src):
    from tgc.backends.opencl import opencl_linter
    assert opencl_linter().diagnostics(src) == []


@needs_libclang
@pytest.mark.parametrize("bad, message", [
    ("out[i] = undefined_fn(a[i]);", "undefined_fn"),
    ("out[i] = sqrt(a);", "sqrt"),  # no overload takes a pointer
    ("out[i] = a[i] + b;", "invalid operands"),  # float + pointer
    ("out[i] = as_int(a[i], 2);", "as_int"),
    ("barrier(CLK_LOCAL_MEM_FENCE, 1);", "barrier"),
])
def test_broken_opencl_gives_clang_errors_at_the_line(bad, message):
    from tgc.backends.opencl import opencl_linter
    src = ("__kernel void k(__global float* out, __global const float* a, __global const float* b) {\n"
           "  int i = get_global_id(0);\n  " + bad + "\n}\n")
    with pytest.raises(CompileError) as info:
        opencl_linter().lint(src)
    assert info.value.line == 3 and info.value.file == "k.cl"
    assert message in info.value.format() or message in str(getattr(info.value, "diagnostics", ""))


@needs_libclang
def test_rendered_kernels_of_every_dtype_type_check():
    """Every dtype through loads, stores, casts, bitcasts, math and reductions, rendered and linted."""
    import tgc
    from tgc.backends.opencl import opencl_linter
    for dt in ("bool", "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "f16", "bf16", "f32", "f64"):
        src = f"x: {dt}[4, 8]\ny: f32[4, 8]\nreturn (x.cast(f32) * y).sum(axis=1), x.max(axis=0), y.cast({dt})\n"
        for k in tgc.loads(src).compile(device="OPENCL", dims={}):
            assert opencl_linter().diagnostics(k.src) == [], k.src
