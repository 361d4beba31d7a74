"""Index width: kernels index in i32 where their symbolic bounds prove it enough, in i64 where they may not.

Issue 10 ("sizes beyond 32 bits"): dims were cut to 32 bits (N = 2^32 + 5 compiled to a 5-element kernel,
N = 3e9 to a negative loop bound) and a u8 input of 2^31 + 16 elements came back all zeros.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import tgc
from tgc.backends.cstyle import MetalRenderer, OpenCLRenderer
from tgc.dtype import dtypes
from tgc.errors import CompileError

ADD1 = "x: f32[N]\nreturn x + 1\n"
ADD1_U8 = "x: u8[N]\nreturn x + 1\n"
BIG = (1 << 31) + 16


def _kernel(src: str, device: str, **dims: int):
    (k,) = tgc.loads(src).compile(device=device, dims=dims)
    return k


def _python_uops(k) -> list[list]:
    return json.loads(k.src)["uops"]


# --- small kernels keep i32


def test_small_kernel_indexes_in_i32_on_the_cpu():
    src = _kernel(ADD1, "CPU", N=1000).src
    assert "phi i32" in src and "ptr %data1, i32" in src
    assert not re.search(r"\bi64\b", src.split("\n", 1)[1])  # (the first line is a comment with the file name)


def test_small_kernel_indexes_in_i32_on_gpus():
    k = _kernel(ADD1, "CUDA", N=1 << 20)
    for src in (k.src, OpenCLRenderer().render(k.name, k.uops), MetalRenderer().render(k.name, k.uops)):
        body = src[src.rindex(f" {k.name}("):]  # the kernel, after any helper functions
        assert "long" not in body and re.search(r"\bint v\d+ = ", body), body


def test_small_kernel_indexes_in_i32_on_python():
    uops = _python_uops(_kernel(ADD1, "PYTHON", N=1000))
    assert {u[1] for u in uops if u[0] in ("RANGE", "CONST") and u[1] and u[1].startswith("i")} == {"i32"}


def test_big_buffer_read_in_a_small_window_keeps_i32():
    """Only kernels whose index values may pass 2^31 are wide: a few elements of a huge input are not."""
    src = _kernel("x: u8[N]\nreturn x[:16] + 1\n", "CPU", N=BIG).src
    assert "i64" not in src.split("\n", 1)[1]


# --- past 2^31: i64, never truncated


def test_dim_past_32_bits_is_not_cut():
    k = _kernel(ADD1, "CPU", N=(1 << 32) + 5)
    assert k.name == "E_4294967301"
    assert "4294967301" in k.src and "phi i64" in k.src and "ptr %data1, i64" in k.src
    assert k.binary is not None


def test_dim_of_3e9_has_a_positive_64_bit_loop_bound():
    k = _kernel(ADD1, "PYTHON", N=3_000_000_000)
    uops = _python_uops(k)
    ranges = [u for u in uops if u[0] == "RANGE"]
    assert ranges and all(u[1] == "i64" for u in ranges)
    consts = [u[3] for u in uops if u[0] == "CONST" and u[1] in ("i32", "i64")]
    assert 3_000_000_000 in consts and all(c >= 0 for c in consts)
    cpu = _kernel(ADD1, "CPU", N=3_000_000_000).src
    assert "-1294967296" not in cpu and "icmp slt i64" in cpu


def test_cuda_source_for_a_big_buffer_uses_64_bit_indices():
    k = _kernel(ADD1_U8, "CUDA", N=BIG)
    assert "long long" in k.src and re.search(r"data1\[v\d+\]", k.src)
    assert "int gidx0" in k.src  # launch indices stay 32-bit, widened in the kernel
    if k.binary is None:
        pytest.skip(f"NVRTC is not available: {k.compile_error}")


@pytest.mark.parametrize("renderer", [OpenCLRenderer(), MetalRenderer()], ids=["opencl", "metal"])
def test_c_dialects_for_a_big_buffer_use_64_bit_indices(renderer):
    k = _kernel(ADD1_U8, "CUDA", N=BIG)  # the GPU pipeline's uops, printed in another dialect
    src = renderer.render(k.name, k.uops)
    assert re.search(r"\blong v\d+ = ", src) and " int v" not in src


def test_grid_past_what_a_gpu_kernel_indexes_is_a_clear_error():
    n = 2**31 * 256  # 2^31 work-groups even of the largest size tgc maps to: one more than a grid indexes
    with pytest.raises(CompileError, match="work-groups"):
        _kernel(ADD1_U8, "CUDA", N=n)
    assert _kernel(ADD1_U8, "CUDA", N=2147483659)  # 2^31 + 11, a prime: a rounded-up grid of full groups


def test_buffer_past_the_device_allocation_limit_is_a_clear_error(monkeypatch):
    """OpenCL (CL_DEVICE_MAX_MEM_ALLOC_SIZE) and Metal (maxBufferLength) state a largest buffer: a program
    that needs a larger one fails with that reason (here a CPU given such a limit stands in for them)."""
    from tgc.backends import get_device
    from tgc.errors import DeviceError
    monkeypatch.setattr(get_device("CPU"), "max_buffer_bytes", 4096)
    prog = tgc.loads(ADD1)
    assert prog.run(device="CPU", x=np.ones(1024, np.float32))["out0"][0] == 2  # 4096 bytes: allowed
    with pytest.raises(DeviceError, match=r"f32\[1025\] buffer takes 4100 bytes, more than the 4096 bytes CPU"):
        prog.run(device="CPU", x=np.ones(1025, np.float32))


@pytest.mark.parametrize("n", [1 << 63, (1 << 64) + 5])
def test_tensor_past_64_bit_indexing_is_refused(n):
    from tgc.errors import TgcError
    with pytest.raises(TgcError, match="more than the 2\\^63 - 1 that tgc can index") as e:
        _kernel(ADD1, "CPU", N=n)
    assert e.value.kind == "user"


def test_largest_64_bit_dim_still_compiles():
    k = _kernel(ADD1, "CPU", N=(1 << 63) - 1)
    assert "9223372036854775807" in k.src and k.binary is not None


# --- the i64 code paths, checked at a small size by forcing the width


PROGRAMS = {
    "softmax": ("x: f32[N, M]\nreturn softmax(x, 1)\n", {"x": (64, 48)}),
    "matmul": ("a: f32[N, K]\nb: f32[K, M]\nreturn a @ b\n", {"a": (32, 40), "b": (40, 24)}),
    "slicing": ("x: f32[N]\ny = pad(x[:-2] + x[2:], ((3, 1),))\nreturn y[::-1], x[::3]\n", {"x": (301,)}),
    "sum": ("x: f32[N]\nreturn x.sum()\n", {"x": (1 << 17,)}),
}


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_forced_i64_kernels_match_i32(name, device, monkeypatch):
    src, shapes = PROGRAMS[name]
    rng = np.random.default_rng(0)
    inputs = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    want = tgc.loads(src).run(device=device, **inputs)
    import tgc.codegen.index as index
    monkeypatch.setattr(index, "index_width", lambda ast: dtypes.i64)
    prog = tgc.loads(src)
    dims, _ = prog.bind(inputs)
    kernels = prog.compile(device=device, dims=dims)
    assert all("i64" in k.src for k in kernels)
    got = prog.run(device=device, **inputs)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-6)


# --- a real buffer past 2^31 elements on the CPU (4 GiB: input and output)


@pytest.mark.slow
def test_u8_buffer_past_2_31_elements_on_the_cpu():
    from tgc.backends import get_device
    from tgc.engine.realize import launch

    k = _kernel(ADD1_U8, "CPU", N=BIG)
    dev = get_device("CPU")
    assert [b.dtype for b in k.bufs] == [dtypes.u8, dtypes.u8]

    class Buf:  # device memory outside the reuse pool, so that the 4 GiB go when the test ends
        def __init__(self) -> None:
            self.handle = dev.allocator._alloc(BIG)

    out, x = Buf(), Buf()
    period = 251  # x[i] = i % 251: an index cut to 32 bits (or 31) reads a different value
    tile = np.tile(np.arange(period, dtype=np.uint8), (1 << 22) // period + 1)
    step = len(tile) - len(tile) % period
    for start in range(0, BIG, step):
        chunk = x.handle[start:start + step]
        chunk[:] = tile[:len(chunk)]
    windows = [(0, 64), ((1 << 31) - 64, (1 << 31) + 16), (BIG - 64, BIG), (3 << 29, (3 << 29) + 64)]
    for lo, hi in windows:
        out.handle[lo:hi] = 0  # what an unwritten output held in the bug
    launch(k, [out, x])
    for lo, hi in windows:
        want = ((np.arange(lo, hi, dtype=np.int64) % period + 1) % 256).astype(np.uint8)
        np.testing.assert_array_equal(out.handle[lo:hi], want, err_msg=f"elements {lo}..{hi}")


# --- argmax/argmin: i32 indices where the reduced axis fits i32, i64 beyond (issue 25)


ARGMAX = ("x: f32[N, M]\nreturn argmax(x), argmin(x), argmax(x, axis=1), argmin(x, axis=0, keepdim=True), "
          "argmax(x, axis=-1, keepdim=True)\n")


@pytest.mark.parametrize("device", ["CPU", "PYTHON", "OPENCL"])
def test_argmax_wide_index_path_at_a_small_size(device, monkeypatch):
    """The i64 index path of argmax/argmin, forced at a small size: axes longer than the (lowered) i32 limit give
    i64 indices, shorter ones i32; the whole-tensor ones run as two-stage reductions (lowered threshold) whose
    kernels index in i64 (forced width). Values have many ties: the first index of the extreme must win."""
    from langkit import device_skip_reason
    why = device_skip_reason(device)
    if why is not None:
        pytest.skip(why)
    import tgc.codegen.index as index
    import tgc.dsl.tensor as tensor
    import tgc.engine.schedule as schedule
    monkeypatch.setattr(tensor, "ARGMAX_I32_LIMIT", 40)  # rows of 36 stay i32; columns of 64, all 2304: i64
    monkeypatch.setattr(schedule, "SPLIT_REDUCE_MIN", 2048)  # 2304 elements: two stages of 1152
    monkeypatch.setattr(index, "index_width", lambda ast: dtypes.i64)
    rng = np.random.default_rng(7)
    x = rng.integers(-4, 5, (64, 36)).astype(np.float32)
    x[50, 20] = x[63, 35] = 9  # the overall max twice, late: the first of them, index 1820
    x[60, 3] = -9  # the overall min, index 2163
    prog = tgc.loads(ARGMAX)
    kernels = prog.compile(device=device, dims={"N": 64, "M": 36})
    assert any(k.name.startswith("r_2_1152") for k in kernels)  # the two-stage reduction ran
    out = prog.run(device=device, x=x)
    want = [np.argmax(x), np.argmin(x), np.argmax(x, axis=1), np.argmin(x, axis=0, keepdims=True),
            np.argmax(x, axis=-1, keepdims=True)]
    dtypes_ = [np.int64, np.int64, np.int32, np.int64, np.int32]
    for (name, got), w, dt in zip(out.items(), want, dtypes_):
        assert got.dtype == dt, name
        np.testing.assert_array_equal(got, w, err_msg=name)
    ref = prog.reference(x=x)  # the float64 reference: the same dtypes and values
    for (name, got), w, dt in zip(ref.items(), want, dtypes_):
        assert got.dtype == dt, name
        np.testing.assert_array_equal(got, w, err_msg=name)


ARGMAX_2D = "x: u8[N, M]\nreturn argmin(x), argmax(x), argmax(x, axis=1)\n"


def test_symbolic_argmax_is_not_used_past_an_i32_count(tmp_path):
    """The symbolic kernel of argmax over N * M elements holds the count in i32: at sizes where N * M passes
    2^31 - 1 its launch check fails, so `Program.run(symbolic=True)` runs size-specialized kernels (i64) and a
    symbolic package refuses the sizes (exit 2) instead of a wrong index. Checked without allocating."""
    from tgc import package
    from tgc.codegen.kernel import check_failure_text, failed_check
    from tgc.package import PackageError
    prog = tgc.loads(ARGMAX_2D)
    plan = prog.compile_symbolic("CPU")
    big, fits = {"N": 8, "M": (1 << 28) + 2}, {"N": 8, "M": (1 << 28) - 1}
    assert prog.output_types(big)[0][1] == dtypes.i64 and prog.output_types(fits)[0][1] == dtypes.i32
    failed = [failed_check(k, big) for k in plan.kernels]
    assert any(f is not None for f in failed)
    assert all(failed_check(k, fits) is None for k in plan.kernels)
    assert "M * N = 2147483664 passes 2147483647" in check_failure_text(next(f for f in failed if f))
    low, why = prog.lower_symbolic("CPU", big)
    assert low is None and why
    path = tmp_path / "argmax.tgpkg"
    package.write(prog, path, "CPU", {})
    pkg = tgc.load_package(path)
    assert pkg.at(fits).kernels  # (2^31 - 8 elements: served)
    with pytest.raises(PackageError, match=r"M \* N = 2147483664 passes 2147483647") as e:
        pkg.at(big)
    assert e.value.exit_code == 2
    from click.testing import CliRunner

    from tgc.cli.main import main
    r = CliRunner().invoke(main, ["inspect", str(path), "-D", "N=8", "-D", f"M={big['M']}"])
    assert r.exit_code == 2 and "do not serve these sizes" in r.output


@pytest.mark.slow
def test_argmin_argmax_past_2_31_elements_on_the_cpu():
    """Issue 25: a u8 input of 2^31 + 16 ones with one 5 at index 2^31 + 9 gave argmin 17 and argmax
    -2147483639. Whole-tensor indices past i32 are i64; a row's index (rows of 2^30 + 8) stays i32 and right
    although the kernels index 2^31 + 16 elements; specialized and symbolic runs alike (~2.1 GiB input)."""
    x = np.ones((2, (1 << 30) + 8), np.uint8)
    x.reshape(-1)[(1 << 31) + 9] = 5
    prog = tgc.loads(ARGMAX_2D)
    try:
        for symbolic in (False, True):
            out = prog.run(device="CPU", x=x, symbolic=symbolic)
            lo, hi, rows = out.values()
            assert lo.dtype == np.int64 and hi.dtype == np.int64 and rows.dtype == np.int32
            assert int(lo) == 0 and int(hi) == (1 << 31) + 9, (symbolic, lo, hi)
            np.testing.assert_array_equal(rows, [0, (1 << 30) + 1])
            if symbolic:
                assert prog.last_run.startswith("specialized"), prog.last_run
    finally:
        prog.release()
    y = x.reshape(-1)
    del x
    prog1 = tgc.loads("x: u8[N]\nreturn argmin(x), argmax(x)\n")
    try:
        lo, hi = prog1.run(device="CPU", x=y).values()
        assert (int(lo), int(hi)) == (0, (1 << 31) + 9)
    finally:
        prog1.release()
