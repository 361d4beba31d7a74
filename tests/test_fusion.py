"""Which values the scheduler realizes (gets a buffer of its own) and which it fuses, as kernel counts and as the
operations each kernel computes; every program is also checked against numpy.

The rule under test (tgc/engine/schedule.py): elementwise work that a broadcast would make its consumer
recompute is realized when its cost times the extra recomputations reaches RECOMPUTE_LIMIT.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tgc
from tgc.codegen.attention import is_fused_attention
from tgc.engine.schedule import RECOMPUTE_LIMIT
from tgc.ir.uop import Ops

TRANSCENDENTAL = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT}


def _transcendentals(item) -> int:
    return sum(1 for u in item.ast.toposort() if u.op in TRANSCENDENTAL)


def _divisions(item) -> int:
    return sum(1 for u in item.ast.toposort() if u.op is Ops.FDIV)


def _ops(item) -> int:
    return sum(1 for u in item.ast.toposort() if u.op in (Ops.ADD, Ops.MUL, Ops.FDIV, Ops.WHERE, Ops.CMPLT))


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


MLP = "x: f32[M, K]\nw1: f32[K, H]\nb1: f32[H]\nw2: f32[H, N]\nreturn {act}(x @ w1 + b1) @ w2\n"


@pytest.mark.parametrize("device", ["CPU", "CUDA", "PYTHON"])
def test_gelu_before_a_matmul_is_computed_once(device):
    """The GELU of the hidden layer is realized with the first matmul, not recomputed per output column."""
    prog = tgc.loads(MLP.format(act="gelu"))
    items = prog.schedule({"M": 8, "K": 16, "H": 32, "N": 24}, device=device)
    assert len(items) == 2
    first, second = items
    # the GELU (its erf: a rational polynomial, one division) is computed where the hidden layer is
    assert _divisions(first) >= 1 and _ops(first) > 2 * _ops(second)
    assert _divisions(second) == 0 and _transcendentals(second) == 0  # the second matmul reads it from memory
    assert second.bufs[1] is first.output  # ... from the buffer the first kernel wrote


def test_gelu_mlp_matches_numpy():
    rng = np.random.default_rng(1)
    x, w1, b1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((8, 16), (16, 32), (32,), (32, 24)))
    got = tgc.loads(MLP.format(act="gelu")).run(x=x, w1=w1, b1=b1, w2=w2)["out0"]
    want = _gelu(x.astype(np.float64) @ w1 + b1) @ w2
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_relu_mlp_matches_numpy_whatever_is_fused():
    rng = np.random.default_rng(2)
    x, w1, b1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((8, 16), (16, 32), (32,), (32, 24)))
    prog = tgc.loads(MLP.format(act="relu"))
    assert len(prog.schedule({"M": 8, "K": 16, "H": 32, "N": 24}, device="CPU")) == 2
    want = np.maximum(x.astype(np.float64) @ w1 + b1, 0) @ w2
    np.testing.assert_allclose(prog.run(x=x, w1=w1, b1=b1, w2=w2)["out0"], want, rtol=1e-4, atol=1e-4)


BROADCAST = "x: f32[M, N]\ny: f32[N]\nreturn x + exp(y)\n"


@pytest.mark.parametrize("m, kernels", [(2, 1), (64, 2)])
def test_a_broadcast_transcendental_is_realized_only_when_recomputing_it_costs_more(m, kernels):
    """exp(y) broadcast over M rows: recomputed M-1 extra times. Cheap enough for 2 rows (fused), not for 64."""
    cost = 10  # one transcendental
    assert (cost * (m - 1) >= RECOMPUTE_LIMIT) == (kernels == 2)
    prog = tgc.loads(BROADCAST)
    items = prog.schedule({"M": m, "N": 16}, device="CPU")
    assert len(items) == kernels
    rng = np.random.default_rng(m)
    x, y = rng.standard_normal((m, 16)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    np.testing.assert_allclose(prog.run(x=x, y=y)["out0"], x + np.exp(y), rtol=1e-4, atol=1e-5)


def test_cheap_broadcast_work_stays_fused():
    """A cast and an add broadcast over rows cost less than a round trip through memory."""
    prog = tgc.loads("x: f32[M, N]\ny: i32[N]\nreturn x * cast(y + 1, f32)\n")
    assert len(prog.schedule({"M": 8, "N": 16}, device="CPU")) == 1


def test_per_row_values_on_the_cpu_are_not_recomputations():
    """softmax and layernorm stay one kernel on the CPU: a per-row value is computed once per row."""
    for src in ("x: f32[N, D]\nreturn softmax(x, axis=1)\n", "x: f32[N, D]\nreturn layernorm(x)\n"):
        assert len(tgc.loads(src).schedule({"N": 64, "D": 128}, device="CPU")) == 1, src


def test_attention_weights_are_computed_once_not_per_head_dim_column():
    """softmax(s) @ v: the weights (exp of the scores) are not recomputed for each of the D columns: the fused
    attention kernel (tgc/codegen/attention.py) computes one exp per score and one rescale per block of keys."""
    from tgc.codegen.attention import BLOCK
    src = "q: f32[H, S, D]\nk: f32[H, S, D]\nv: f32[H, S, D]\nreturn softmax(q @ k.transpose(1, 2), axis=-1) @ v\n"
    prog = tgc.loads(src)
    items = prog.schedule({"H": 2, "S": 16, "D": 32}, device="CPU")
    assert len(items) == 1 and is_fused_attention(items[0].ast)
    uops = prog.compile("PYTHON", dims={"H": 2, "S": 16, "D": 32})[0].uops
    assert sum(1 for u in uops if u.op in TRANSCENDENTAL) == BLOCK + 1
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 16, 32)).astype(np.float32) for _ in range(3))
    s = q.astype(np.float64) @ k.transpose(0, 2, 1)
    e = np.exp(s - s.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(prog.run(q=q, k=k, v=v)["out0"], want, rtol=1e-4, atol=1e-5)
