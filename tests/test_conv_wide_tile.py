"""The lane tile's wide shape (tgc/codegen/heuristic.py `_vector_tile`): a packed convolution whose image columns
(and rows) leave 2 lane vectors' tile half empty or less (27 columns: tiles of 3, 6 of LANE_TILE accumulators)
takes 4 lane vectors instead where the output channels hold 4 of them and the reduction has WIDE_TILE_STEPS
steps or more (4 x 3 = 12 accumulators). A short reduction, channels of 2 vectors, or columns that fill the tile
keep 2 vectors. The choices as exact opts, every result against a float64 numpy convolution."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.codegen.opt import OptOps
from tgc.engine import schedule

CONV = ("x: f32[N, C, H, W]\nw: f32[O, C, {k}, {k}]\nb: f32[O]\n"
        "return relu(conv2d(x, w, stride={s}, padding={p}) + b.reshape(1, -1, 1, 1))")


@pytest.fixture(autouse=True)
def pack_small(monkeypatch):
    """Pack convolutions of every size (the test shapes are below the size where packing pays)."""
    monkeypatch.setattr(schedule, "CONV_MIN_FLOPS", 0)


def conv_np(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    x, w = x.astype(np.float64), w.astype(np.float64)
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (xp.shape[2] - kh) // stride + 1, (xp.shape[3] - kw) // stride + 1
    out = np.zeros((x.shape[0], o, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


CASES = [  # (N, C, H, W, O, window, stride, padding), the tile's upcasts
    ((1, 32, 3, 27, 128, 3, 1, 1), [16, 4, 3]),  # 27 columns, 3 rows: 2 x 3 -> 4 x 3 accumulators
    ((1, 32, 3, 27, 64, 3, 1, 1), [16, 4, 3]),  # all 4 vectors of the channels in one tile
    ((1, 16, 7, 223, 64, 3, 2, 0), [16, 4, 3]),  # stride 2, 111 columns: 144 reduction steps
    ((1, 3, 7, 223, 64, 3, 2, 0), [16, 2, 3]),  # 3 x 3 x 3 = 27 steps: short of WIDE_TILE_STEPS
    ((1, 32, 3, 27, 32, 3, 1, 1), [16, 2, 3]),  # 2 vectors of channels: no 4
    ((1, 32, 3, 55, 64, 3, 1, 1), [16, 2, 5]),  # 55 columns: 2 x 5 leaves less than half the tile
    ((1, 32, 4, 27, 64, 3, 1, 1), [16, 2, 3, 2]),  # 4 rows: 2 of them fill the 2-vector tile
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])))
def test_the_tile_width_and_the_result(case):
    (n, c, h, w, o, k, s, p), want = case
    prog = tgc.loads(CONV.format(k=k, s=s, p=p))
    dims = {"N": n, "C": c, "H": h, "W": w, "O": o}
    convs = [kn for kn in prog.compile(device="CPU", dims=dims, tuned=False) if kn.name.startswith("r_")]
    assert len(convs) == 1
    assert [op.amount for op in convs[0].opts if op.op is OptOps.UPCAST] == want
    rng = np.random.default_rng(c + w + o)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((o, c, k, k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    got = prog.run(device="CPU", dims=dims, x=x, w=wt, b=b)["out0"]
    want_y = np.maximum(conv_np(x, wt, s, p) + b.reshape(1, -1, 1, 1), 0)
    np.testing.assert_allclose(got, want_y, rtol=1e-4, atol=1e-3)

