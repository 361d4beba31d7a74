"""The lane tile of a half-empty tile (tgc/codegen/heuristic.py `_vector_tile`): a packed convolution whose image
columns (and rows) leave 2 lane vectors' tile half empty or less (27 columns: tiles of 3, 6 of 16 accumulators)
takes the fuller of: its columns padded to whole tiles (27 -> 28, tiles of 7), or 4 lane vectors where the
output channels hold 4 of them and the reduction has WIDE_TILE_STEPS steps or more. Columns that fill more than
half the tile keep it. The choices as exact opts, every result against a float64 numpy convolution."""

from __future__ import annotations

import numpy as np
import pytest
from convkit import conv_np

import tgc
from tgc.codegen.opt import OptOps
from tgc.engine import schedule

CONV = ("x: f32[N, C, H, W]\nw: f32[O, C, {k}, {k}]\nb: f32[O]\n"
        "return relu(conv2d(x, w, stride={s}, padding={p}) + b.reshape(1, -1, 1, 1))")


@pytest.fixture(autouse=True)
def pack_small(monkeypatch):
    """Pack convolutions of every size (the test shapes are below the size where packing pays)."""
    monkeypatch.setattr(schedule, "CONV_MIN_FLOPS", 0)


CASES = [  # (N, C, H, W, O, window, stride, padding), the tile's upcasts and paddings
    ((1, 32, 3, 27, 128, 3, 1, 1), ["U16", "U2", "P7", "U7"]),  # 27 columns, 3 rows: 2 x 3 -> 2 x 7 of 28
    ((1, 32, 3, 27, 64, 3, 1, 1), ["U16", "U2", "P7", "U7"]),
    ((1, 3, 7, 223, 64, 3, 2, 0), ["U16", "U2", "P8", "U8"]),  # stride 2, 111 columns: 2 x 8 of 112
    ((1, 32, 3, 9, 64, 3, 1, 1), ["U16", "U4", "U3"]),  # 9 columns: 2 x 5 of 10 < 4 vectors x 3
    ((1, 3, 3, 9, 64, 3, 1, 1), ["U16", "U2", "P5", "U5"]),  # 3 x 3 x 3 = 27 steps: no 4 vectors
    ((1, 32, 3, 9, 32, 3, 1, 1), ["U16", "U2", "P5", "U5"]),  # 2 vectors of channels: no 4
    ((1, 32, 3, 55, 64, 3, 1, 1), ["U16", "U2", "U5"]),  # 55 columns: 2 x 5 fills more than half the tile
    ((1, 32, 4, 27, 64, 3, 1, 1), ["U16", "U2", "U3", "U2"]),  # 4 rows: 2 of them fill the tile
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])))
def test_the_tile_width_and_the_result(case):
    (n, c, h, w, o, k, s, p), want = case
    prog = tgc.loads(CONV.format(k=k, s=s, p=p))
    dims = {"N": n, "C": c, "H": h, "W": w, "O": o}
    convs = [kn for kn in prog.compile(device="CPU", dims=dims, tuned=False) if kn.name.startswith("r_")]
    assert len(convs) == 1
    assert [f"{op.name[0]}{op.amount}" for op in convs[0].opts if op.op in (OptOps.UPCAST, OptOps.PADTO)] == want
    rng = np.random.default_rng(c + w + o)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((o, c, k, k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    got = prog.run(device="CPU", dims=dims, x=x, w=wt, b=b)["out0"]
    want_y = np.maximum(conv_np(x, wt, s, p) + b.reshape(1, -1, 1, 1), 0)
    np.testing.assert_allclose(got, want_y, rtol=1e-4, atol=1e-3)

