"""Grouped, depthwise and unpacked convolutions over image rows with no vector divisor (tgc/codegen/heuristic.py
rules `image_columns`, `channel_rows`, `window_taps` and their strided twins): results against numpy on CPU,
PYTHON (which checks every access against its buffer) and OPENCL at small sizes, and the rules' choices for
given sizes as exact expectations (no kernel compiled there)."""

from __future__ import annotations

import numpy as np
import pytest
from convkit import conv_np
from langkit import device_skip_reason
from test_heuristic_rules import ZEN4, kernel, run

import tgc
from tgc.codegen.heuristic import Machine, classify
from tgc.codegen.opt import OptOps

SHAPES = [  # (N, C, H, W, O, K, stride, padding, groups): channels per group, columns
    (1, 12, 5, 14, 12, 3, 1, 1, 12),  # depthwise 3x3: 1 channel per group, 14 columns padded to 16
    (1, 6, 4, 7, 6, 1, 1, 0, 6),  # depthwise 1x1, 7 columns padded to 8
    (1, 9, 7, 13, 9, 3, 2, 1, 3),  # 3 groups of 3, stride 2 (7 columns)
    (1, 136, 3, 7, 136, 1, 1, 0, 2),  # 2 groups of 68, 7 columns
    (2, 64, 4, 14, 64, 3, 1, 1, 8),  # 8 groups of 8, 2 images
    (1, 16, 3, 28, 16, 1, 1, 0, 2),  # 28 columns padded to 32: two vectors
    (1, 272, 2, 13, 272, 1, 1, 0, 1),  # one group of 272 (below the packing's size), 13 columns
    (1, 8, 3, 9, 8, 3, 1, 1, 1),  # 9 columns: padding would add too much, left as it was
]
DEVICES = ["CPU", "PYTHON", "OPENCL"]


def _src(k: int, stride: int, pad: int, groups: int) -> str:
    return (f"x: f32[N, C, H, W]\nw: f32[O, CG, {k}, {k}]\n"
            f"return conv2d(x, w, stride={stride}, padding={pad}, groups={groups})")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_grouped_convolutions_against_numpy(shape, device):
    if why := device_skip_reason(device):
        pytest.skip(why)
    n, c, h, w, o, k, stride, pad, groups = shape
    if device == "PYTHON" and n * o * h * w * (c // groups) * k * k > 200_000:
        pytest.skip("the emulator takes seconds for this one: the CPU and OPENCL runs cover it")
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((o, c // groups, k, k)).astype(np.float32)
    got = tgc.loads(_src(k, stride, pad, groups)).run(device=device, x=x, w=wt)["out0"]
    np.testing.assert_allclose(got, conv_np(x, wt, stride, pad, 1, groups), rtol=1e-4, atol=1e-4)


def _conv(shape: tuple, index: int = -1):
    n, c, h, w, o, k, stride, pad, groups = shape
    return _src(k, stride, pad, groups), {"N": n, "C": c, "H": h, "W": w, "O": o, "CG": c // groups}


def test_a_grouped_1x1_conv_pads_its_image_row_and_takes_channels_side_by_side():
    """14 columns (no divisor of 8 or 16) -> one vector of 16, 8 output channels over it (68 per group: the
    input is read through the group o // 68, so the channels share each loaded row)."""
    names, opts = run(*_conv((1, 272, 14, 14, 272, 1, 1, 0, 4)))
    assert names == ["image_columns", "channel_rows", "unroll2"]
    assert opts == ["PADTO(2, 16)", "UPCAST(2, 16)", "UPCAST(0, 8)", "UNROLL(3, 2)"]


def test_28_columns_become_two_vectors_and_7_half_a_vector():
    names, opts = run(*_conv((1, 136, 28, 28, 136, 1, 1, 0, 4)))
    assert names[:2] == ["image_columns", "channel_rows"]
    assert opts[:4] == ["PADTO(2, 16)", "UPCAST(2, 16)", "UPCAST(2, 2)", "UPCAST(0, 8)"]
    names, opts = run(*_conv((1, 544, 7, 7, 544, 1, 1, 0, 4)))
    assert opts[:3] == ["PADTO(2, 8)", "UPCAST(2, 8)", "UPCAST(0, 8)"]


def test_a_depthwise_conv_takes_image_rows_and_unrolls_its_window():
    """Each channel reads its own input plane: no channel rows; two image rows share the window's loads, the 3x3
    taps unrolled."""
    names, opts = run(*_conv((1, 272, 14, 14, 272, 3, 1, 1, 272)))
    assert names == ["image_columns", "rows", "window_taps"]
    assert opts == ["PADTO(2, 16)", "UPCAST(2, 16)", "UPCAST(1, 2)", "UNROLL(3, 3)", "UNROLL(4, 3)"]


def test_channels_that_do_not_divide_the_tile_are_padded():
    """68 channels: 8 does not divide them, padding to 72 adds 4 (at most 1/PAD_WASTE): 8 side by side."""
    names, opts = run(*_conv((1, 68, 14, 14, 68, 1, 1, 0, 1)))
    assert "channel_rows" in names and opts[2:4] == ["PADTO(0, 8)", "UPCAST(0, 8)"]


def test_rows_that_padding_would_grow_too_much_and_matmuls_are_left_alone():
    names, _ = run(*_conv((1, 16, 9, 9, 16, 3, 1, 1, 2)))  # 9 columns -> 16 would add 7/9
    assert "image_columns" not in names
    names, _ = run("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b", {"M": 64, "K": 32, "N": 14})  # b reads no rows
    assert "image_columns" not in names
    eight = Machine(lanes=8, registers=16, cores=2)
    names, _ = run(*_conv((1, 32, 14, 12, 32, 1, 1, 0, 2)), machine=eight)  # 12 columns: half a vector (4) divides
    assert "image_columns" not in names
    names, opts = run(*_conv((1, 32, 14, 14, 32, 1, 1, 0, 2)), machine=eight)  # 14 -> 16: two vectors of 8
    assert names[0] == "image_columns" and opts[:3] == ["PADTO(2, 8)", "UPCAST(2, 8)", "UPCAST(2, 2)"]


def test_a_conv_whose_weight_is_a_constant_is_a_strided_reduction_and_gets_the_same_tile():
    """A grouped 1x1 conv of a constant weight (ONNX's light models fill theirs with ConstantOfShape): the weight
    folds away, only the input is loaded (a strided reduction over channels): the same padded row."""
    src = "x: f32[1, 272, 14, 14]\nw = full((272, 68, 1, 1), 0.5)\nreturn conv2d(x, w, groups=4)"
    k = kernel(src, {})
    assert classify(k, ZEN4).kind == "strided"
    names, opts = run(src, {})
    assert names[:2] == ["strided_image_columns", "strided_channel_rows"]
    assert opts == ["PADTO(2, 16)", "UPCAST(2, 16)", "UPCAST(0, 8)"]
    x = np.random.default_rng(5).standard_normal((1, 272, 14, 14)).astype(np.float32)
    got = tgc.loads(src).run(device="CPU", x=x)["out0"]
    want = conv_np(x, np.full((272, 68, 1, 1), 0.5, np.float32), 1, 0, 1, 4)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert any(o.op is OptOps.PADTO for o in tgc.loads(src).compile(device="CPU")[-1].opts)


def _lrn_np(x: np.ndarray, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> np.ndarray:
    sq = x.astype(np.float64) ** 2
    lo = (size - 1) // 2
    padded = np.pad(sq, ((0, 0), (lo, size - 1 - lo), (0, 0), (0, 0)))
    sums = sum(padded[:, i:i + x.shape[1]] for i in range(size))
    return x / (bias + alpha / size * sums) ** beta


LRN = "x: f32[1, 8, 6, 13]\nreturn lrn(x, 5, alpha=0.01)"  # (its window sum a strided reduction)
# LRN over 3 channels written out as slices of a padded square: one elementwise kernel, its loads gated
NEIGHBOURS = "x: f32[8, 6, 13]\ny = pad(x * x, ((1, 1), (0, 0), (0, 0)))\nreturn x / (1 + y[:-2] + y[1:-1] + y[2:])"


def _neighbours_np(x: np.ndarray) -> np.ndarray:
    y = np.pad(x.astype(np.float64) ** 2, ((1, 1), (0, 0), (0, 0)))
    return x / (1 + y[:-2] + y[1:-1] + y[2:])


def test_an_elementwise_kernel_with_gated_loads_over_odd_image_rows_is_written_as_vectors():
    """Loads gated at the first and last channels, 13 columns: padded to 16, one vector per row (LLVM left the
    loop scalar, a branch per gated load)."""
    names, opts = run(NEIGHBOURS, {})
    assert names == ["gated_rows"] and opts == ["PADTO(2, 16)", "UPCAST(2, 16)"]
    names, _ = run(NEIGHBOURS.replace("13]", "16]"), {})  # a whole vector: short_rows' case, not this rule's
    assert "gated_rows" not in names
    names, _ = run("x: f32[8, 6, 13]\ny: f32[8, 6, 13]\nreturn x + y", {})  # no gated load: LLVM's own loop
    assert "gated_rows" not in names
    names, opts = run(LRN, {})
    assert names == ["strided_image_columns"] and opts[:2] == ["PADTO(2, 16)", "UPCAST(2, 16)"]


@pytest.mark.parametrize("device", DEVICES)
def test_gated_rows_and_lrn_over_odd_image_rows_against_numpy(device):
    if why := device_skip_reason(device):
        pytest.skip(why)
    x = np.random.default_rng(7).standard_normal((1, 8, 6, 13)).astype(np.float32) * 3
    got = tgc.loads(LRN).run(device=device, x=x)["out0"]
    np.testing.assert_allclose(got, _lrn_np(x, 5, alpha=0.01), rtol=1e-4, atol=1e-5)
    got = tgc.loads(NEIGHBOURS).run(device=device, x=x[0])["out0"]
    np.testing.assert_allclose(got, _neighbours_np(x[0]), rtol=1e-4, atol=1e-5)


# a ReLU over a concatenation by channel at odd image rows of 2 vectors or more (SqueezeNet's fire modules): the
# loads' gates are by channel, the same for a whole row, and the loads contiguous along it; a max pool over it
CONCAT = "x: f32[4, 6, 61]\ny: f32[5, 6, 61]\nreturn relu(cat(x, y, axis=0))"
CONCAT_POOL = "x: f32[4, 6, 61]\ny: f32[5, 6, 61]\nreturn max_pool(unsqueeze(relu(cat(x, y, axis=0)), 0), " \
    "kernel_shape=[3, 3], strides=[2, 2])"


def test_gates_the_same_for_a_whole_contiguous_row_are_left_to_llvm():
    """A concatenation's gate (by channel) over contiguous rows of 2 vectors or more: no gated_rows (LLVM
    vectorizes the loop itself, measured 2.2x faster on SqueezeNet's 128 x 55 x 55); rows of 13 (the padded
    neighbours above) keep the rule."""
    names, _ = run(CONCAT, {})
    assert "gated_rows" not in names
    names, _ = run(CONCAT.replace("61]", "13]"), {})
    assert "gated_rows" in names


def _pool_np(a: np.ndarray) -> np.ndarray:
    c, h, w = a.shape
    oh, ow = (h - 3) // 2 + 1, (w - 3) // 2 + 1
    return np.array([[[a[ch, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max() for j in range(ow)] for i in range(oh)]
                     for ch in range(c)])


@pytest.mark.parametrize("device", DEVICES)
def test_relu_and_pool_over_a_concatenation_against_numpy(device):
    if why := device_skip_reason(device):
        pytest.skip(why)
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal((n, 6, 61)).astype(np.float32) for n in (4, 5))
    want = np.maximum(np.concatenate([x, y]), 0)
    np.testing.assert_array_equal(tgc.loads(CONCAT).run(device=device, x=x, y=y)["out0"], want)
    got = tgc.loads(CONCAT_POOL).run(device=device, x=x, y=y)["out0"]
    np.testing.assert_array_equal(got, _pool_np(want)[None])
