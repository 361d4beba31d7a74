"""conv2d on the CPU: weights packed 16 output channels to a vector (tgc/engine/schedule.py `pack_conv_operands`),
output channels as the vector lanes (tgc/codegen/expand.py `pick_vector_range`) and the heuristic's lane tile
(tgc/codegen/heuristic.py `lane_tile`). Results against numpy at shapes the packing must handle (input channels
not a multiple of 16, odd sizes, padding 0/1/2, stride 2, dilation, groups) and the kernels it makes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from convkit import conv_np

import tgc
from tgc.backends import python as pyb
from tgc.codegen.opt import OptOps
from tgc.engine import schedule
from tgc.ir.uop import Ops

SHAPES = [  # (N, C, H, W, O, K, stride, padding, dilation, groups)
    (2, 3, 9, 11, 16, 3, 1, 1, 1, 1),  # 3 input channels, odd sizes
    (1, 20, 7, 13, 32, 3, 2, 2, 1, 1),  # stride 2, padding 2
    (2, 8, 10, 10, 48, 3, 1, 0, 1, 1),  # padding 0, 3 vectors of output channels
    (1, 32, 9, 9, 64, 3, 1, 1, 1, 2),  # 2 groups of 32 output channels
    (2, 24, 6, 7, 48, 3, 1, 1, 1, 3),  # 3 groups of 16 output channels
    (1, 12, 6, 6, 24, 3, 1, 1, 1, 3),  # 3 groups of 8 output channels: not packed
    (1, 4, 6, 5, 16, 1, 1, 0, 1, 1),  # 1x1
    (1, 5, 12, 11, 32, 3, 1, 2, 2, 1),  # dilation 2
    (3, 17, 5, 7, 16, 5, 1, 2, 1, 1),  # 5x5, 17 input channels
    (2, 6, 8, 9, 24, 3, 1, 1, 1, 1),  # 24 output channels: not packed, still right
]


def _src(k: int, stride: int, pad: int, dil: int, groups: int) -> str:
    return (f"x: f32[N, C, H, W]\nw: f32[O, CG, {k}, {k}]\n"
            f"return conv2d(x, w, stride={stride}, padding={pad}, dilation={dil}, groups={groups})")


def _inputs(shape: tuple, seed: int = 0) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    n, c, h, w, o, k, _, _, _, groups = shape
    rng = np.random.default_rng(seed)
    dims = {"N": n, "C": c, "H": h, "W": w, "O": o, "CG": c // groups}
    return dims, {"x": rng.standard_normal((n, c, h, w)).astype(np.float32),
                  "w": rng.standard_normal((o, c // groups, k, k)).astype(np.float32)}


@pytest.fixture
def pack_small(monkeypatch):
    """Pack convolutions of every size (the test shapes are below the size where packing pays)."""
    monkeypatch.setattr(schedule, "CONV_MIN_FLOPS", 0)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_conv2d_against_numpy_on_the_cpu(shape, pack_small):
    *_, k, stride, pad, dil, groups = shape
    prog = tgc.loads(_src(k, stride, pad, dil, groups))
    dims, inputs = _inputs(shape)
    got = prog.run(device="CPU", dims=dims, **inputs)["out0"]
    np.testing.assert_allclose(got, conv_np(inputs["x"], inputs["w"], stride, pad, dil, groups), rtol=1e-4, atol=1e-4)
    kernels = prog.compile(device="CPU", dims=dims)
    packed = shape[4] // groups % 16 == 0
    # odd channels of one group: 16s and the last 16, each packed, joined (schedule.split_odd_channels)
    split = groups == 1 and shape[4] > 16 and shape[4] % 16
    # a packed conv over a padded input reads a padded copy of it (one kernel, shared by a split conv's parts)
    copied = bool((packed or split) and pad)
    assert len(kernels) == (5 if split else 2 if packed else 1) + copied  # the weight's packing copy, the conv
    h, w = shape[2] + 2 * pad, shape[3] + 2 * pad
    assert [kk.name for kk in kernels if kk.name.startswith("E_") and kk.name.endswith(f"_{h}_{w}")] == (
        [kernels[0].name] if copied else [])  # the padded copy, first, (N,) C, H + 2 pad, W + 2 pad
    if packed:
        conv = kernels[-1]
        assert conv.opts[0].op is OptOps.UPCAST and conv.opts[0].amount == 16  # output channels as 16 lanes
        assert "load <16 x float>" in conv.src and "<16 x float> @" not in conv.src  # vector weights, no calls


@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[3], SHAPES[7]], ids=["stride2", "groups2", "dilation2"])
def test_packed_conv_kernels_on_the_python_device(shape, pack_small, monkeypatch):
    """The PYTHON device checks every access against its buffer: the packed kernels with the CPU's choices."""
    monkeypatch.setattr(pyb.PythonRenderer, "caps", replace(pyb.PythonRenderer.caps, pack_matmul=True))
    *_, k, stride, pad, dil, groups = shape
    prog = tgc.loads(_src(k, stride, pad, dil, groups))
    dims, inputs = _inputs(shape, seed=1)
    assert len(prog.schedule(dims, device="PYTHON")) == 3  # the padded input's copy, the weight's, the conv
    got = prog.run(device="PYTHON", dims=dims, **inputs)["out0"]
    np.testing.assert_allclose(got, conv_np(inputs["x"], inputs["w"], stride, pad, dil, groups), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_image_columns_without_a_tile_divisor_are_padded(device, pack_small, monkeypatch):
    """13 output columns (prime; SqueezeNet's last layers) beside 2 vectors of channels: the lane tile pads them to
    14 and takes 7 at a time,
    the extra column's loads and stores gated off (the PYTHON device checks every access against its buffer)."""
    monkeypatch.setattr(pyb.PythonRenderer, "caps", replace(pyb.PythonRenderer.caps, pack_matmul=True))
    shape = (1, 4, 13, 13, 32, 3, 1, 1, 1, 1)
    prog = tgc.loads(_src(3, 1, 1, 1, 1))
    dims, inputs = _inputs(shape, seed=4)
    conv = prog.compile(device=device, dims=dims, tuned=False)[-1]
    if device == "CPU":
        assert [str(o) for o in conv.opts if o.op in (OptOps.PADTO, OptOps.UPCAST)] == \
            ["UPCAST(0, 16)", "UPCAST(0, 2)", "PADTO(2, 7)", "UPCAST(2, 7)"]
    got = prog.run(device=device, dims=dims, **inputs)["out0"]
    np.testing.assert_allclose(got, conv_np(inputs["x"], inputs["w"], 1, 1, 1, 1), rtol=1e-4, atol=1e-4)


def test_the_packing_copy_happens_once_per_weight(pack_small):
    src = ("x: f32[2, 8, 10, 10]\ny: f32[2, 8, 10, 10]\nw: f32[32, 8, 3, 3]\n"
           "return conv2d(x, w, padding=1) + conv2d(y, w, padding=1)")
    items = tgc.loads(src).schedule(device="CPU")
    copies = [i for i in items if i.output.op is Ops.CONTIGUOUS]
    pads = [i.name for i in items if i.output.op is Ops.PAD]  # a padded copy of each input (its kernel writes the pad)
    # one packing kernel and the padded copies of x and y (2 x 8 x 12 x 12); both convolutions fuse into one kernel
    assert len(copies) == 1 and pads == ["E_2_8_12_12", "E_2_8_12_12"] and len(items) == 4
    assert items[0].line == 4  # the copy is named after the line of the conv it serves


def test_a_conv_of_a_conv_packs_both_weights_and_keeps_its_outputs(pack_small):
    src = ("x: f32[1, 4, 8, 8]\nw1: f32[16, 4, 3, 3]\nw2: f32[32, 16, 3, 3]\n"
           "h = conv2d(x, w1, padding=1)\nreturn conv2d(h, w2, padding=1), h")
    prog = tgc.loads(src)
    items = prog.schedule(device="CPU")
    assert sum(i.output.op is Ops.CONTIGUOUS for i in items) == 2 and len(items) == 6  # (and 2 padded copies)
    assert sum(i.output.op is Ops.PAD for i in items) == 2
    outs, _ = prog._trace({})
    assert {i.output for i in items} >= set(outs)  # outputs keep their node: the realizer finds them
    rng = np.random.default_rng(2)
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((1, 4, 8, 8), (16, 4, 3, 3), (32, 16, 3, 3)))
    got = prog.run(device="CPU", x=x, w1=w1, w2=w2)
    h = conv_np(x, w1, 1, 1, 1, 1)
    np.testing.assert_allclose(got["h"], h, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["out0"], conv_np(h.astype(np.float32), w2, 1, 1, 1, 1), rtol=1e-4, atol=1e-3)


def test_small_convs_and_other_devices_are_not_packed():
    src = "x: f32[1, 8, 8, 8]\nw: f32[16, 8, 3, 3]\nreturn conv2d(x, w, padding=1)"
    assert len(tgc.loads(src).schedule(device="CPU")) == 1  # below CONV_MIN_FLOPS: no copy
    big = "x: f32[8, 64, 56, 56]\nw: f32[64, 64, 3, 3]\nreturn conv2d(x, w, padding=1)"
    assert len(tgc.loads(big).schedule(device="CPU")) == 3  # the padded input's copy, the weight's, the conv
    for device in ("PYTHON", "CUDA", "OPENCL", "METAL"):
        assert len(tgc.loads(big).schedule(device=device)) == 1


def test_the_benchmark_conv_takes_output_channels_as_lanes():
    """The heuristic's tile for the bench's conv: 16 lanes x 2 vectors of output channels x 8 image columns."""
    big = "x: f32[8, 64, 56, 56]\nw: f32[64, 64, 3, 3]\nreturn conv2d(x, w, padding=1)"
    conv = tgc.loads(big).compile(device="CPU")[-1]
    assert [(o.op, o.axis, o.amount) for o in conv.opts if o.op is not OptOps.THREAD] == \
        [(OptOps.UPCAST, 1, 16), (OptOps.UPCAST, 1, 2), (OptOps.UPCAST, 3, 8)]


@pytest.mark.parametrize("dtype, np_dtype", [("i32", np.int32), ("f64", np.float64), ("f16", np.float16)])
def test_conv2d_of_other_dtypes(dtype, np_dtype, pack_small):
    prog = tgc.loads(f"x: {dtype}[2, 5, 9, 7]\nw: {dtype}[32, 5, 3, 3]\nreturn conv2d(x, w, padding=1)")
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 5, 9, 7)) * 3).astype(np_dtype)
    w = (rng.standard_normal((32, 5, 3, 3)) * 3).astype(np_dtype)
    assert len(prog.compile(device="CPU")) == 3  # packed, padded (half floats: the product is summed in f32)
    got = prog.run(device="CPU", x=x, w=w)["out0"].astype(np.float64)
    want = conv_np(x, w, 1, 1, 1, 1)
    if dtype == "i32":
        np.testing.assert_array_equal(got, want)  # exact: the packed kernel sums the same integers
    elif dtype == "f64":
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-10)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=0.2)


def _range(i: int, n: int):
    from tgc.dtype import dtypes
    from tgc.ir.uop import RangeKind, UOp
    return UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, n),), (i, RangeKind.LOOP))


def test_a_low_part_below_the_divisor_folds_out_of_div_and_mod():
    """(16a + i) // 32 -> a // 2 and (16a + i) % 32 -> 16 (a % 2) + i for 0 <= i < 16: what makes a grouped conv's
    channel group lane-free; and every such fold agrees with the arithmetic at every value."""
    import itertools

    from tgc.dtype import dtypes
    from tgc.ir.symbolic import simplify
    from tgc.ir.uop import UOp, substitute
    c = lambda v: UOp.const(dtypes.index, v)  # noqa: E731
    a, i = _range(0, 4), _range(1, 16)
    x = a * c(16) + i
    assert simplify(x // c(32)) is simplify(a // c(2))
    assert simplify(x % c(32)) is simplify((a % c(2)) * c(16) + i)
    assert simplify((x + c(16)) // c(16)) is simplify(a + c(1))  # the folds that were there stay
    b = _range(2, 3)
    for coefs, const, d in [((16, 1, 4), 0, 32), ((8, 1, 2), 1, 16), ((6, 3, 1), 0, 12), ((32, 16, 1), 5, 64)]:
        e = c(const)
        for r, k in zip((a, i, b), coefs):
            e = e + r * c(k)
        for op in ("//", "%"):
            s = simplify(e // c(d) if op == "//" else e % c(d))
            for va, vi, vb in itertools.product(range(4), range(16), range(3)):
                v = const + coefs[0] * va + coefs[1] * vi + coefs[2] * vb
                got = simplify(substitute(s, {a: c(va), i: c(vi), b: c(vb)}))
                assert got.op is Ops.CONST and got.arg == (v // d if op == "//" else v % d), (coefs, const, d, op)


def test_one_image_of_one_channel_vector_keeps_a_loop_for_the_threads(monkeypatch):
    """One image and 16 output channels leave the tile's outermost loop of size 1, which threads cannot split:
    the longest loop (the image rows) goes outermost."""
    monkeypatch.setenv("TGC_THREADS", "2")
    src = "x: f32[1, 32, 112, 112]\nw: f32[16, 32, 3, 3]\nreturn conv2d(x, w, padding=1)"
    conv = tgc.loads(src).compile(device="CPU")[-1]
    assert [str(o) for o in conv.opts] == ["UPCAST(0, 16)", "UPCAST(2, 16)", "SWAP(0, 1)", "THREAD(0, 2)"]


def test_packed_conv_with_an_epilogue_on_two_devices_and_in_a_package(pack_small, tmp_path):
    """A bias and relu after the conv fuse into its kernel; the packed program also runs sharded over two CPU
    devices (each schedules its part) and from a compiled package (the packing kernel is one of its kernels)."""
    src = ("x: f32[4, 6, 9, 10]\nw: f32[32, 6, 3, 3]\nb: f32[32]\n"
           "return relu(conv2d(x, w, padding=1) + b.reshape(1, 32, 1, 1))")
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((4, 6, 9, 10)).astype(np.float32), rng.standard_normal((32, 6, 3, 3)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    want = np.maximum(conv_np(x, w, 1, 1, 1, 1) + b.reshape(1, 32, 1, 1), 0)
    prog = tgc.loads(src)
    assert len(prog.compile(device="CPU")) == 3  # the padded input's copy, the weight's, the conv
    np.testing.assert_allclose(prog.run(device="CPU", x=x, w=w, b=b)["out0"], want, rtol=1e-4, atol=1e-4)
    got = prog.run(device=["CPU:0", "CPU:1"], shard={"x": 0}, x=x, w=w, b=b)["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    from tgc.package import write
    path = tmp_path / "conv.tgpkg"
    write(prog, str(path), device="CPU", dims={})
    got = tgc.load_package(str(path)).run(x=x, w=w, b=b)["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_conv_with_dims_runs_symbolically_and_right(pack_small):
    """A conv2d program with dims, run with symbolic=True: its packing depends on the sizes (16 | O), so the plan
    is the size-specialized one where the kernels differ; either way the answer is numpy's."""
    prog = tgc.loads(_src(3, 1, 1, 1, 1))
    for shape in (SHAPES[0], SHAPES[9]):  # packed (16 channels) and not (24 channels)
        dims, inputs = _inputs(shape, seed=5)
        got = prog.run(device="CPU", dims=dims, symbolic=True, **inputs)["out0"]
        np.testing.assert_allclose(got, conv_np(inputs["x"], inputs["w"], 1, 1, 1, 1), rtol=1e-4, atol=1e-4)


def test_a_conv_whose_weight_is_a_packed_matmul(pack_small):
    """Both packings in one program: the matmul's right-hand side in column panels, the conv's weight (the
    matmul's product) in channel vectors; each copy names its own line."""
    src = ("x: f32[1, 32, 6, 6]\na: f32[32, 1024]\nb: f32[1024, 288]\n"
           "w = (a @ b).reshape(32, 32, 3, 3)\nreturn conv2d(x, w, padding=1)")
    prog = tgc.loads(src)
    items = prog.schedule(device="CPU")
    copies = [i for i in items if i.output.op is Ops.CONTIGUOUS]
    # b's panels (line 4; in two column parts, branch memory: the whole 1.1 MiB copy is over the 1.5x target of
    # this 1.2 MiB program), w's vectors (line 5)
    assert len(copies) == 3 and sorted(c.line for c in copies) == [4, 4, 5]
    assert [i.line for i in items if i.output.op is Ops.PAD] == [5]  # x's padded copy
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 32, 6, 6)).astype(np.float32)
    a, b = rng.standard_normal((32, 1024)).astype(np.float32), rng.standard_normal((1024, 288)).astype(np.float32)
    w = (a.astype(np.float64) @ b).reshape(32, 32, 3, 3)
    got = prog.run(device="CPU", x=x, a=a, b=b)["out0"]
    np.testing.assert_allclose(got, conv_np(x, w, 1, 1, 1, 1), rtol=1e-3, atol=1e-1)
