"""The PYTHON device: whole programs against numpy, bit-exact agreement with the CPU on int programs, and
its renderer, checker and interpreter on hand-written kernels (loops, accumulators, gates, threads, order)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import tgc
from tgc.backends import get_device
from tgc.backends import python as pyb
from tgc.dtype import bf16_to_f32, dtypes, f32_to_bf16
from tgc.errors import CompileError, DeviceError

DEV = "PYTHON"


def run(src: str, **inputs) -> dict[str, np.ndarray]:
    return tgc.loads(src).run(device=DEV, **inputs)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=rtol, atol=atol)


# ------------------------------------------------------------------------------------------------------------------
# Programs against numpy


def test_device_is_registered_and_single_threaded(monkeypatch):
    dev = get_device("python")
    assert isinstance(dev, pyb.PythonDevice) and dev.kind == "PYTHON" and dev.launch_style == "cpu"
    monkeypatch.delenv("TGC_THREADS", raising=False)
    assert dev.cores == 1
    monkeypatch.setenv("TGC_THREADS", "3")
    assert dev.cores == 3
    assert pyb.PythonDevice.probe()[0]


def test_elementwise_chain():
    x, y = rng().standard_normal((2, 5, 7)).astype(np.float32)
    out = run("x: f32[N, M]\ny: f32[N, M]\nreturn exp(x) * y + sqrt(abs(x)) - sin(y) / 2, maximum(x, y)", x=x, y=y)
    close(out["out0"], np.exp(x) * y + np.sqrt(np.abs(x)) - np.sin(y) / 2)
    np.testing.assert_array_equal(out["out1"], np.maximum(x, y))


def test_reductions_over_axes():
    x = rng(1).standard_normal((3, 4, 5)).astype(np.float32)
    out = run("x: f32[A, B, C]\nreturn sum(x, axis=1), max(x, axis=(0, 2)), min(x), prod(x, axis=-1), mean(x, axis=0)",
              x=x)
    close(out["out0"], x.sum(1))
    np.testing.assert_array_equal(out["out1"], x.max((0, 2)))
    np.testing.assert_array_equal(out["out2"], x.min())
    close(out["out3"], x.prod(-1))
    close(out["out4"], x.mean(0))


def test_softmax():
    x = rng(2).standard_normal((6, 9)).astype(np.float32)
    out = run("x: f32[N, D]\nm = x.max(axis=1, keepdim=True)\ne = exp(x - m)\nreturn e / sum(e, axis=1, keepdim=True)",
              x=x)
    e = np.exp(x - x.max(1, keepdims=True))
    close(out["out0"], e / e.sum(1, keepdims=True))


def test_matmul_with_bias_and_relu():
    a = rng(3).standard_normal((7, 11)).astype(np.float32)
    b = rng(4).standard_normal((11, 5)).astype(np.float32)
    bias = rng(5).standard_normal(5).astype(np.float32)
    out = run("a: f32[M, K]\nb: f32[K, N]\nbias: f32[N]\nreturn relu(a @ b + bias)", a=a, b=b, bias=bias)
    close(out["out0"], np.maximum(a @ b + bias, 0), rtol=1e-5, atol=1e-5)


def _conv2d(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, _, h, wd = xp.shape
    o, _, kh, kw = w.shape
    out = np.zeros((n, o, h - kh + 1, wd - kw + 1))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + out.shape[2], j:j + out.shape[3]], w[:, :, i, j])
    return out


def test_conv2d_small():
    x = rng(6).standard_normal((2, 3, 6, 5)).astype(np.float32)
    w = rng(7).standard_normal((4, 3, 3, 3)).astype(np.float32)
    out = run("x: f32[N, C, H, W]\nw: f32[O, C, 3, 3]\nreturn conv2d(x, w, padding=1)", x=x, w=w)
    close(out["out0"], _conv2d(x, w, 1), rtol=1e-4, atol=1e-5)


def test_pad_slice_flip():
    x = np.arange(30, dtype=np.int32).reshape(5, 6)
    out = run("x: i32[5, 6]\nreturn x[1:-1, ::2], flip(x, 0), pad(x, ((1, 2), (0, 1)), value=3), x[::-1, 3]", x=x)
    np.testing.assert_array_equal(out["out0"], x[1:-1, ::2])
    np.testing.assert_array_equal(out["out1"], x[::-1])
    np.testing.assert_array_equal(out["out2"], np.pad(x, ((1, 2), (0, 1)), constant_values=3))
    np.testing.assert_array_equal(out["out3"], x[::-1, 3])


def test_int_division_by_zero_gives_zero_and_floors():
    a = np.array([7, -7, 7, -7, 5, -2**31, 0], np.int32)
    b = np.array([2, 2, -2, 0, 0, -1, 0], np.int32)
    out = run("a: i32[7]\nb: i32[7]\nreturn a // b, a % b", a=a, b=b)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(out["out0"], np.where(b == 0, 0, a // np.where(b == 0, 1, b)))
        np.testing.assert_array_equal(out["out1"], np.where(b == 0, 0, a % np.where(b == 0, 1, b)))


def test_bool_logic_and_sum():
    a = np.array([True, False, True, False, True])
    b = np.array([True, True, False, False, True])
    out = run("a: bool[5]\nb: bool[5]\nreturn a & b, a | b, a ^ b, ~a, where(a, 1, 2), sum(a), max(b), a < b", a=a, b=b)
    np.testing.assert_array_equal(out["out0"], a & b)
    np.testing.assert_array_equal(out["out1"], a | b)
    np.testing.assert_array_equal(out["out2"], a ^ b)
    np.testing.assert_array_equal(out["out3"], ~a)
    np.testing.assert_array_equal(out["out4"], np.where(a, 1, 2))
    assert out["out5"] == 3 and out["out5"].dtype == np.int32
    assert out["out6"] == np.True_ and out["out6"].dtype == np.bool_
    np.testing.assert_array_equal(out["out7"], a < b)


def test_f16_rounds_after_each_op_and_sums_in_f32():
    x = np.array([1.5, -2.25, 65504, 1e-4, 0.1], np.float16)
    out = run("x: f16[5]\nreturn x * 3, x + x, sum(x), exp(x)", x=x)
    assert out["out0"].dtype == np.float16
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out["out0"], x * np.float16(3))
        np.testing.assert_array_equal(out["out1"], x + x)
        assert out["out2"] == np.float16(x.astype(np.float32).sum())
        close(out["out3"], np.exp(x.astype(np.float32)).astype(np.float16), rtol=1e-3)


def test_bf16_rounds_to_nearest_even():
    vals = np.array([1.0, 1.00390625, 1.01171875, -3.5, 3e38, 1e-3], np.float32)
    x = bf16_to_f32(f32_to_bf16(vals))  # bf16 inputs come as float32 holding bf16 values
    out = run("x: bf16[6]\nreturn x * 3, x + 1.0078125, cast(x, f32) * 1.001, sum(x)", x=x)
    with np.errstate(over="ignore"):
        want = bf16_to_f32(f32_to_bf16(x * np.float32(3)))
    np.testing.assert_array_equal(out["out0"], want)
    np.testing.assert_array_equal(out["out1"], bf16_to_f32(f32_to_bf16(x + np.float32(1.0078125))))
    np.testing.assert_array_equal(out["out2"], x * np.float32(1.001))
    np.testing.assert_array_equal(out["out3"], bf16_to_f32(f32_to_bf16(np.array(x.sum(dtype=np.float32)))))


def test_u8_wraps_around():
    a = np.array([250, 3, 128, 255, 0], np.uint8)
    out = run("a: u8[5]\nreturn a + 10, a * 3, a - 251, sum(a), -a", a=a)
    np.testing.assert_array_equal(out["out0"], a + np.uint8(10))
    np.testing.assert_array_equal(out["out1"], a * np.uint8(3))
    np.testing.assert_array_equal(out["out2"], a - np.uint8(251))
    assert out["out3"] == a.sum() and out["out3"].dtype == np.uint32
    np.testing.assert_array_equal(out["out4"], (-a.astype(np.int64)).astype(np.uint8))


def test_argmax_first_of_ties():
    x = np.array([[1, 5, 5, 2], [7, 7, 7, 7], [-1, -3, -1, -4]], np.float32)
    out = run("x: f32[3, 4]\nreturn argmax(x, axis=1), argmin(x, axis=0), argmax(x)", x=x)
    np.testing.assert_array_equal(out["out0"], x.argmax(1))
    np.testing.assert_array_equal(out["out1"], x.argmin(0))
    assert out["out2"] == x.argmax()


def test_float_to_int_casts_saturate():
    x = np.array([np.nan, np.inf, -np.inf, 3.7, -3.7, 1e10, -1e10, 255.9, -0.5], np.float32)
    out = run("x: f32[9]\nreturn cast(x, i32), cast(x, u8), cast(x, bool)", x=x)
    np.testing.assert_array_equal(out["out0"], [0, 2**31 - 1, -2**31, 3, -3, 2**31 - 1, -2**31, 255, 0])
    np.testing.assert_array_equal(out["out1"], [0, 255, 0, 3, 0, 255, 0, 255, 0])
    np.testing.assert_array_equal(out["out2"], [True, True, True, True, True, True, True, True, True])


def test_empty_dims_and_scalars():
    out = run("x: f32[N]\nreturn sum(x), x * 2, prod(x)", x=np.zeros(0, np.float32))
    assert out["out0"] == 0 and out["out1"].shape == (0,) and out["out2"] == 1
    out = run("x: i32\nreturn x * 3 + 1", x=np.array(7, np.int32))
    assert out["out0"] == 22


# ------------------------------------------------------------------------------------------------------------------
# Bit-exact against the CPU on int programs

INT_PROGRAMS = [
    "a: {d}[N]\nb: {d}[N]\nreturn a + b, a - b, a * b, a // b, a % b, -a, maximum(a, b), minimum(a, b)",
    "a: {d}[N]\nb: {d}[N]\nreturn a & b, a | b, a ^ b, ~a, a << (b & 7), a >> (b & 7), a < b, a == b",
    "a: {d}[N]\nb: {d}[N]\nreturn sum(a), prod(b), max(a), argmax(a), cast(a, f32), cast(a, i8), cast(a, u16)",
    "a: {d}[N]\nb: {d}[N]\nm = reshape(a, (4, -1))\nreturn sum(m, axis=0), m @ transpose(m, 0, 1), flip(m, 1)[1:, ::2]",
]


@pytest.mark.parametrize("prog", range(len(INT_PROGRAMS)))
@pytest.mark.parametrize("d", ["i8", "u8", "i16", "i32", "u32", "i64", "u64"])
def test_int_programs_match_cpu_bit_for_bit(prog, d):
    pytest.importorskip("llvmlite")
    r = rng(hash((prog, d)) % 1000)
    info = np.iinfo(dtypes.by_name[d].np)
    edge = np.array([0, 1, info.max, info.min, 2, info.max - 1, 7, 3], dtype=info.dtype)
    a = np.concatenate([edge, r.integers(info.min, info.max, 16, dtype=info.dtype, endpoint=True)])
    b = np.concatenate([edge[::-1], r.integers(info.min, info.max, 16, dtype=info.dtype, endpoint=True)])
    program = tgc.loads(INT_PROGRAMS[prog].format(d=d))
    cpu, py = program.run(device="CPU", a=a, b=b), program.run(device=DEV, a=a, b=b)
    for name in cpu:
        assert cpu[name].dtype == py[name].dtype and cpu[name].shape == py[name].shape, name
        assert cpu[name].tobytes() == py[name].tobytes(), (name, cpu[name], py[name])


def test_threaded_kernels_match_cpu(monkeypatch):
    """With TGC_THREADS the optimizer splits the outer loop by core_id; each core index runs in turn."""
    pytest.importorskip("llvmlite")
    monkeypatch.setenv("TGC_THREADS", "3")
    a = rng(8).integers(-1000, 1000, (300, 400), dtype=np.int32)
    program = tgc.loads("a: i32[N, M]\nreturn a * 3 + 1, sum(a, axis=1)")
    kernels = program.compile(device=DEV, dims={"N": 300, "M": 400})
    assert any(k.global_size[0] > 1 for k in kernels)
    py = program.run(device=DEV, a=a)
    np.testing.assert_array_equal(py["out0"], a * 3 + 1)
    np.testing.assert_array_equal(py["out1"], a.sum(1, dtype=np.int32))


# ------------------------------------------------------------------------------------------------------------------
# Renderer and checker


def test_rendered_source_is_one_json_uop_per_line():
    ks = tgc.loads("x: f32[N, D]\nreturn sum(x, axis=1)").compile(device=DEV, dims={"N": 3, "D": 4})
    assert len(ks) == 1 and ks[0].binary == ks[0].src.encode()
    doc = json.loads(ks[0].src)
    assert doc["kernel"] == ks[0].name and doc["format"] == pyb.FORMAT
    lines = [ln for ln in ks[0].src.splitlines() if ln.strip().startswith("[\"")]
    assert len(lines) == len(doc["uops"]) == len(ks[0].uops)
    ops = [u[0] for u in doc["uops"]]
    assert {"RANGE", "DEFINE_ACC", "ACCUMULATE", "READ_ACC", "STORE", "ENDRANGE"} <= set(ops)
    rng_uop = doc["uops"][ops.index("RANGE")]
    assert rng_uop[3][1] == "LOOP" and rng_uop[3][2] == 3
    assert get_device(DEV).compiler.disassemble(ks[0].binary) == ks[0].src


def kernel(*uops: list) -> str:
    """A hand-written kernel in the PYTHON device's format."""
    return json.dumps({"kernel": "k", "format": pyb.FORMAT, "uops": list(uops)})


def launch(src: str, *arrays: np.ndarray, **kw) -> list[np.ndarray]:
    """Compile and run a hand-written kernel on copies of `arrays`; returns the buffers afterwards."""
    dev = get_device(DEV)
    prog = dev.program("k", dev.compiler.compile(src))
    handles = []
    for arr in arrays:
        h = dev.allocator.alloc(arr.nbytes)
        dev.allocator.copyin(h, memoryview(np.ascontiguousarray(arr)).cast("B"))
        handles.append(h)
    prog(*handles, **kw)
    outs = []
    for arr, h in zip(arrays, handles):
        out = np.empty_like(arr)
        dev.allocator.copyout(memoryview(out).cast("B"), h)
        outs.append(out)
    return outs


# out[i] = sum_j x[i*M + j] over i < N, j < M
def sum_rows(n: int, m: int) -> list[list]:
    return [
        ["DEFINE_GLOBAL", "f32*", [], 0], ["DEFINE_GLOBAL", "f32*", [], 1],
        ["CONST", "i32", [], n], ["RANGE", "i32", [2], [0, "LOOP", n]],
        ["CONST", "f32", [], 0.0], ["DEFINE_ACC", "f32", [4], 0],
        ["CONST", "i32", [], m], ["RANGE", "i32", [6], [1, "REDUCE", m]],
        ["MUL", "i32", [3, 6], None], ["ADD", "i32", [8, 7], None], ["LOAD", "f32", [1, 9], None],
        ["ACCUMULATE", "f32", [5, 10], "ADD"], ["ENDRANGE", None, [7], None],
        ["READ_ACC", "f32", [5], None], ["STORE", None, [0, 3, 13], None], ["ENDRANGE", None, [3], None],
    ]


@pytest.mark.parametrize("bad, why", [
    ("not json", "not valid JSON"),
    (json.dumps({"uops": []}), "format"),
    (kernel(["FROB", "i32", [], None]), "does not run FROB"),
    (kernel(["CONST", "i32", [], 1], ["ADD", "i32", [0, 2], None]), "not earlier"),
    (kernel(["CONST", "i32", [], 4], ["RANGE", "i32", [0], [0, "LOOP", 4]]), "never closed"),
    (kernel(["CONST", "i32", [], 4], ["RANGE", "i32", [0], [0, "LOOP", 4]], ["ADD", "i32", [1, 1], None],
            ["ENDRANGE", None, [1], None], ["ADD", "i32", [2, 0], None]), "outside the loop"),
    (kernel(["CONST", "bf16", [], 1.0], ["ADD", "bf16", [0, 0], None]), "bf16"),
    (kernel(["CONST", "f32x4", [], 1.0]), "vectors"),
    (kernel(["DEFINE_GLOBAL", "f32*", [], 0], ["CONST", "i32", [], 0], ["LOAD", "f32", [1, 1], None]),
     "DEFINE_GLOBAL"),
])
def test_checker_rejects_malformed_kernels(bad, why):
    with pytest.raises(CompileError, match=why):
        get_device(DEV).compiler.compile(bad)


# ------------------------------------------------------------------------------------------------------------------
# Interpreter semantics on hand-written kernels


def test_reduction_kernel_and_blocks(monkeypatch):
    x = rng(9).standard_normal(12 * 7).astype(np.float32)
    want = x.reshape(12, 7).astype(np.float64).sum(1)
    out, _ = launch(kernel(*sum_rows(12, 7)), np.zeros(12, np.float32), x)
    close(out, want)
    for budget in (1, 3, 8, 20):  # loops split into blocks, down to one index at a time
        monkeypatch.setattr(pyb, "BLOCK_ELEMENTS", budget)
        out, _ = launch(kernel(*sum_rows(12, 7)), np.zeros(12, np.float32), x)
        close(out, want)


def test_out_of_bounds_load_is_a_device_error():
    with pytest.raises(DeviceError, match=r"kernel k, uop 10 \(LOAD\).*out of bounds: index 80"):
        launch(kernel(*sum_rows(12, 7)), np.zeros(12, np.float32), np.zeros(80, np.float32))


def test_gated_load_reads_zero_where_the_gate_is_false():
    uops = [
        ["DEFINE_GLOBAL", "i32*", [], 0], ["DEFINE_GLOBAL", "i32*", [], 1],
        ["CONST", "i32", [], 6], ["RANGE", "i32", [2], [0, "LOOP", 6]],
        ["CONST", "i32", [], 3], ["CMPLT", "bool", [3, 4], None],
        ["CONST", "i32", [], 100], ["ADD", "i32", [3, 6], None], ["WHERE", "i32", [5, 3, 7], None],
        ["LOAD", "i32", [1, 8, 5], None],  # index 100+ is never read: its gate is false
        ["STORE", None, [0, 3, 9], None], ["ENDRANGE", None, [3], None],
    ]
    out, _ = launch(kernel(*uops), np.full(6, -1, np.int32), np.array([5, 6, 7], np.int32))
    np.testing.assert_array_equal(out, [5, 6, 7, 0, 0, 0])


def test_core_id_runs_each_core_and_vars_come_from_vals():
    # out[core * chunk + i] = core * 1000 + i + offset, for i < min(chunk, n - core * chunk)
    uops = [
        ["DEFINE_GLOBAL", "i32*", [], 0], ["DEFINE_VAR", "i32", [], ["core_id", 0, 2]],
        ["DEFINE_VAR", "i32", [], ["offset", 0, 100]],
        ["CONST", "i32", [], 4], ["MUL", "i32", [1, 3], None],  # start
        ["CONST", "i32", [], 10], ["SUB", "i32", [5, 4], None],  # left
        ["CMPLT", "bool", [6, 3], None], ["WHERE", "i32", [7, 6, 3], None],  # end
        ["RANGE", "i32", [8], [0, "LOOP", 4]], ["ADD", "i32", [4, 9], None],
        ["CONST", "i32", [], 1000], ["MUL", "i32", [1, 11], None], ["ADD", "i32", [12, 9], None],
        ["ADD", "i32", [13, 2], None], ["STORE", None, [0, 10, 14], None], ["ENDRANGE", None, [9], None],
    ]
    out, = launch(kernel(*uops), np.zeros(10, np.int32), global_size=(3, 1, 1), vals=(7,))
    np.testing.assert_array_equal(out, [7, 8, 9, 10, 1007, 1008, 1009, 1010, 2007, 2008])


def test_a_buffer_read_and_written_runs_in_loop_order():
    # a running sum through memory: out[i] = out[i - 1] + x[i] (for i >= 1)
    uops = [
        ["DEFINE_GLOBAL", "i32*", [], 0], ["DEFINE_GLOBAL", "i32*", [], 1],
        ["CONST", "i32", [], 7], ["RANGE", "i32", [2], [0, "LOOP", 7]],
        ["CONST", "i32", [], 1], ["ADD", "i32", [3, 4], None],  # i + 1
        ["LOAD", "i32", [0, 3], None], ["LOAD", "i32", [1, 5], None], ["ADD", "i32", [6, 7], None],
        ["STORE", None, [0, 5, 8], None], ["ENDRANGE", None, [3], None],
    ]
    x = np.arange(1, 9, dtype=np.int32)
    out, _ = launch(kernel(*uops), np.array([1, 0, 0, 0, 0, 0, 0, 0], np.int32), x)
    np.testing.assert_array_equal(out, np.cumsum(x))


def test_two_stores_to_one_address_keep_the_last_write():
    # iteration i stores i to out[i], then i + 100 to out[i + 1], which iteration i + 1 overwrites with i + 1;
    # all first stores before all second stores (a plain vectorized run) would leave 100, 101, ... instead
    uops = [
        ["DEFINE_GLOBAL", "i32*", [], 0],
        ["CONST", "i32", [], 5], ["RANGE", "i32", [1], [0, "LOOP", 5]],
        ["STORE", None, [0, 2, 2], None],
        ["CONST", "i32", [], 1], ["ADD", "i32", [2, 4], None],
        ["CONST", "i32", [], 100], ["ADD", "i32", [2, 6], None],
        ["STORE", None, [0, 5, 7], None], ["ENDRANGE", None, [2], None],
    ]
    out, = launch(kernel(*uops), np.zeros(6, np.int32))
    np.testing.assert_array_equal(out, [0, 1, 2, 3, 4, 104])


def test_shifts_past_the_width_and_bool_memory():
    uops = [
        ["DEFINE_GLOBAL", "i8*", [], 0], ["DEFINE_GLOBAL", "i8*", [], 1], ["DEFINE_GLOBAL", "bool*", [], 2],
        ["CONST", "i32", [], 4], ["RANGE", "i32", [3], [0, "LOOP", 4]],
        ["CAST", "i8", [4], None], ["CONST", "i8", [], 3], ["MUL", "i8", [5, 6], None],  # 0, 3, 6, 9
        ["CONST", "i8", [], -64], ["SHL", "i8", [8, 7], None], ["SHR", "i8", [8, 7], None],
        ["STORE", None, [0, 4, 9], None], ["STORE", None, [1, 4, 10], None],
        ["CONST", "i8", [], 0], ["CMPLT", "bool", [10, 13], None], ["STORE", None, [2, 4, 14], None],
        ["ENDRANGE", None, [4], None],
    ]
    shl, shr, neg = launch(kernel(*uops), np.zeros(4, np.int8), np.zeros(4, np.int8), np.zeros(4, np.bool_))
    np.testing.assert_array_equal(shl, [-64, 0, 0, 0])  # -64 << 3 wraps to 0; shifts >= 8 give 0
    np.testing.assert_array_equal(shr, [-64, -8, -1, -1])  # arithmetic; >= 8 gives the sign
    np.testing.assert_array_equal(neg, [True] * 4)


def test_ten_thousand_iteration_kernels_are_fast():
    x = rng(10).standard_normal((100, 100)).astype(np.float32)
    program = tgc.loads("x: f32[N, M]\ne = exp(x - x.max(axis=1, keepdim=True))\n"
                        "return e / sum(e, axis=1, keepdim=True)")
    program.run(device=DEV, x=x)  # compile
    kernels = program.compile(device=DEV, dims={"N": 100, "M": 100})
    st = time.perf_counter()
    program.run(device=DEV, x=x)
    per_kernel = (time.perf_counter() - st) / len(kernels)
    assert per_kernel < 0.05, per_kernel


def test_a_cold_compile_parses_the_kernel_once(monkeypatch):
    """The compiler's check and the program built from its bytes share one parse; a malformed kernel is
    rejected every time (no failure is remembered), and bytes never compiled here are parsed when loaded."""
    calls = []
    real = pyb.parse_program
    monkeypatch.setattr(pyb, "parse_program", lambda text: calls.append(text) or real(text))
    x = rng(4).standard_normal(13 * 11).astype(np.float32)
    src = kernel(*sum_rows(13, 11))
    out, _ = launch(src, np.zeros(13, np.float32), x)
    close(out, x.reshape(13, 11).astype(np.float64).sum(1))
    assert len(calls) == 1
    dev = get_device(DEV)
    for _ in range(2):
        with pytest.raises(CompileError, match="does not run FROB"):
            dev.compiler.compile(kernel(["FROB", "i32", [], 17]))
    assert len(calls) == 3
    dev.program("k", kernel(*sum_rows(17, 3)).encode())  # (as from the compile cache: no compile before)
    assert len(calls) == 4
