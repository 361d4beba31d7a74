"""Odd sizes under a fused attention, and the corpus's memory and vector-width rules (issue 20 items 2 and 5,
branch corpusmem). Kernel structure is compared with exact expectations, values with numpy; no timings."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.engine.inputs import random_inputs
from tgc.ir.uop import Ops

# a BERT-style attention whose q, k and v are slices of one projection with 900 columns (no multiple of 32)
QKV_ATTN = """x: f32[B, T, C]
w: f32[C, 3 * C]
H = 12

def heads(t):
    return permute(reshape(t, (B, T, H, C // H)), (0, 2, 1, 3))

q, k, v = split(x @ w, 3, axis=-1)
o = softmax(heads(q) @ heads(k).transpose(-2, -1), axis=-1) @ heads(v)
return reshape(permute(o, (0, 2, 1, 3)), (B, T, C))
"""
DIMS = {"B": 1, "T": 77, "C": 300}


def _columns(item) -> int:
    loops = [u for u in item.ast.toposort() if u.op is Ops.RANGE and u.arg[1].name == "LOOP"]
    return max(loops, key=lambda r: r.arg[0]).src[0].arg


def _numpy_attention(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    B, T, C = x.shape
    q, k, v = np.split(x @ w, 3, axis=-1)
    def heads(t):
        return t.reshape(B, T, 12, C // 12).transpose(0, 2, 1, 3)
    s = heads(q) @ heads(k).transpose(0, 1, 3, 2)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ heads(v)).transpose(0, 2, 1, 3).reshape(B, T, C)


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_projection_read_by_a_fused_attention_is_split(device):
    """The projection's 900 columns run as 896 and the last 16 (before, a fused attention's operands were kept
    whole: one untiled kernel of 4-lane vectors); the attention itself stays one fused kernel, unsplit."""
    prog = tgc.loads(QKV_ATTN)
    items = [i for i in prog.schedule(DIMS, device=device) if i.ast.src]
    assert sum(i.name.startswith("attn_") for i in items) == 1
    projection = [_columns(i) for i in items if not i.name.startswith("attn_")
                  and any(u.op is Ops.REDUCE for u in i.ast.toposort())]
    assert sorted(projection) == [16, 896]


def test_projection_split_under_attention_matches_numpy():
    prog = tgc.loads(QKV_ATTN)
    inputs = random_inputs(prog, DIMS, seed=3)
    want = _numpy_attention(inputs["x"].astype(np.float64), inputs["w"].astype(np.float64))
    got = prog.run(**inputs)["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
