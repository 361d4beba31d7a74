"""The lane tile's square shape (tgc/codegen/heuristic.py `_square_tile`, `one_tap_steps`): a packed convolution
whose input moves a cache line or more at every reduction step (a 1x1 convolution over many input channels, or
two of them summed) takes 4 vectors of output channels x 4 image columns; a window (3x3), a short reduction or
image columns with no divisor of 4 keep 2 vectors x 8 (or 7) columns. The choices as exact opts, every result
against a float64 numpy convolution."""

from __future__ import annotations

import numpy as np
import pytest
from convkit import conv_np

import tgc
from tgc.backends import get_device
from tgc.codegen.heuristic import LINE_VALUES, SQUARE_TILE_STEPS, lane_axis, one_tap_steps
from tgc.codegen.opt import OptKernel, OptOps
from tgc.codegen.pipeline import prepare
from tgc.engine import schedule
from tgc.ir.uop import Ops

CPU = get_device("CPU")
CONV = ("x: f32[N, C, H, W]\nw: f32[O, C, {k}, {k}]\nb: f32[O]\n"
        "return relu(conv2d(x, w, stride={s}, padding={p}) + b.reshape(1, -1, 1, 1))")
TWO = ("x: f32[N, C, H, W]\nz: f32[N, D, H, W]\nw: f32[O, C, 1, 1]\nv: f32[O, D, 1, 1]\n"
       "return relu(conv2d(x, w) + conv2d(z, v))")


@pytest.fixture(autouse=True)
def pack_small(monkeypatch):
    """Pack convolutions of every size (the test shapes are below the size where packing pays)."""
    monkeypatch.setattr(schedule, "CONV_MIN_FLOPS", 0)


def conv_kernel(prog: tgc.Program, dims: dict) -> object:
    convs = [k for k in prog.compile(device="CPU", dims=dims, tuned=False) if k.name.startswith("r_")]
    assert len(convs) == 1
    return convs[0]


def tile(kernel: object) -> list[int]:
    return [o.amount for o in kernel.opts if o.op is OptOps.UPCAST]


CASES = [  # (N, C, H, W, O, window, stride, padding), the tile's upcasts
    ((2, 256, 6, 16, 64, 1, 1, 0), [16, 4, 4]),  # 1x1 over 256 channels: 4 vectors x 4 columns
    ((1, 128, 12, 24, 128, 1, 2, 0), [16, 4, 4]),  # stride 2 (12 output columns), 128 channels: still square
    ((2, 64, 6, 16, 64, 1, 1, 0), [16, 2, 8]),  # 64 steps: short of SQUARE_TILE_STEPS
    ((1, 256, 6, 14, 64, 1, 1, 0), [16, 2, 7]),  # 14 columns: 4 columns would take two image rows
    ((1, 256, 6, 16, 48, 1, 1, 0), [16, 16]),  # 3 vectors of channels: no 4 (nor 2) of them
    ((1, 64, 6, 16, 64, 3, 1, 1), [16, 2, 8]),  # a 3x3 window: consecutive taps share lines
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])))
def test_the_tile_shape_and_the_result(case):
    (n, c, h, w, o, k, s, p), want = case
    prog = tgc.loads(CONV.format(k=k, s=s, p=p))
    dims = {"N": n, "C": c, "H": h, "W": w, "O": o}
    assert tile(conv_kernel(prog, dims)) == want
    rng = np.random.default_rng(c + w)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((o, c, k, k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    got = prog.run(device="CPU", dims=dims, x=x, w=wt, b=b)["out0"]
    want_y = np.maximum(conv_np(x, wt, s, p) + b.reshape(1, -1, 1, 1), 0)
    np.testing.assert_allclose(got, want_y, rtol=1e-4, atol=1e-3)


def test_two_short_convolutions_summed_count_both_reductions():
    # 64 + 64 input channels in one kernel (a residual block's 1x1 and its projection): 128 steps per tile
    prog = tgc.loads(TWO)
    dims = {"N": 1, "C": 64, "D": 64, "H": 4, "W": 16, "O": 64}
    assert tile(conv_kernel(prog, dims)) == [16, 4, 4]
    rng = np.random.default_rng(7)
    x, z = (rng.standard_normal((1, 64, 4, 16)).astype(np.float32) for _ in range(2))
    w, v = (rng.standard_normal((64, 64, 1, 1)).astype(np.float32) for _ in range(2))
    got = prog.run(device="CPU", dims=dims, x=x, z=z, w=w, v=v)["out0"]
    np.testing.assert_allclose(got, np.maximum(conv_np(x, w, 1, 0) + conv_np(z, v, 1, 0), 0), rtol=1e-4, atol=1e-3)
    # 32 + 64 channels: 96 steps, short
    dims = {"N": 1, "C": 32, "D": 64, "H": 4, "W": 16, "O": 64}
    assert tile(conv_kernel(tgc.loads(TWO), dims)) == [16, 2, 8]


def _steps(src: str, dims: dict) -> int:
    items = [it for it in tgc.loads(src).schedule(dims, "CPU") if it.ast.src and it.name.startswith("r_")]
    k = OptKernel(prepare(items[-1].ast, CPU), CPU)
    axis = lane_axis(k, next(u for u in k.ast.toposort() if u.op is Ops.STORE))
    assert axis is not None
    return one_tap_steps(k, axis)


def test_one_tap_steps_counts_reductions_whose_input_moves_a_line_per_step():
    assert SQUARE_TILE_STEPS == 128 and LINE_VALUES == 16
    one = CONV.format(k=1, s=1, p=0)
    assert _steps(one, {"N": 1, "C": 256, "H": 6, "W": 16, "O": 64}) == 256
    # 2 x 8 values per channel: the next channel 16 values on, a line
    assert _steps(one, {"N": 1, "C": 256, "H": 2, "W": 8, "O": 64}) == 256
    # 3 x 5 values per channel: channels share lines
    assert _steps(one, {"N": 1, "C": 256, "H": 3, "W": 5, "O": 64}) == 0
    assert _steps(CONV.format(k=3, s=1, p=1), {"N": 1, "C": 64, "H": 6, "W": 16, "O": 64}) == 0
    assert _steps(TWO, {"N": 1, "C": 64, "D": 32, "H": 4, "W": 16, "O": 64}) == 96
