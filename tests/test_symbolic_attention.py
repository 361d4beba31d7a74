"""A symbolic plan (one compile for a size class: `run(symbolic=True)`, `compile_symbolic`) runs the fused
online-softmax attention where the head dims are constants and the batch and sequence length are dims (issue 20,
item 4): the last row tile and key block are masked at any length. Checked against numpy at T = 1, an odd T and
300 (not on the PYTHON emulator: too slow there) with the causal mask by `where` and by addition, on every device
of `TGC_TEST_DEVICES`; where a head dim is itself a dim the plan keeps the plain chain (row max and sum as
reductions)."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.codegen.attention import is_fused_attention
from tgc.codegen.sizes import size_class

D, E = 8, 5  # the head dims: constants of the program
HEAD = f"q: f32[B, T, {D}]\nk: f32[B, T, {D}]\nv: f32[B, T, {E}]\n"
CAUSAL = "causal = arange(q.shape[1])[:, None] >= arange(q.shape[1])[None, :]\n"
SPELLINGS = {
    "where_causal": CAUSAL + "s = where(causal, q @ k.transpose(-2, -1) * 0.3, -1e30)\nw = softmax(s, axis=-1)\n",
    "additive_causal": CAUSAL + "s = q @ k.transpose(-2, -1) * 0.3 + where(causal, 0.0, -1e9)\n"
                                "w = softmax(s, axis=-1)\n",
}


def _numpy(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = q @ k.swapaxes(-1, -2) * 0.3
    t = s.shape[-1]
    s = np.where(np.arange(t)[:, None] >= np.arange(t)[None, :], s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def _inputs(b: int, t: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal((b, t, w)).astype(np.float32) for n, w in (("q", D), ("k", D), ("v", E))}


def _fused(plan) -> list[bool]:
    return [is_fused_attention(a) for a in plan.asts]


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_symbolic_attention_matches_numpy_at_any_length(name, device):
    if device.startswith("REMOTE"):
        pytest.skip("a REMOTE server runs size-specialized kernels only (no symbolic plans)")
    prog = tgc.loads(HEAD + SPELLINGS[name] + "return w @ v\n")
    # (the PYTHON device emulates each lane in Python: T = 300 takes it ~20 s, so 37 is its longest length)
    for b, t in ((2, 1), (2, 37), *(((1, 300),) if device != "PYTHON" else ())):
        ins = _inputs(b, t, seed=t)
        out = prog.run(device, dims={"B": b, "T": t}, symbolic=True, **ins)[prog.output_names[0]]
        np.testing.assert_allclose(out.astype(np.float64), _numpy(**ins), rtol=3e-5, atol=3e-5,
                                   err_msg=f"{name} on {device} at B={b}, T={t}")
        if t > 1:  # (T = 1 is a size class of its own: one key, no softmax left to fuse)
            assert prog.last_run == "symbolic", prog.last_run
    cls = size_class(prog.dim_names, {"B": 2, "T": 37})
    plan = next(p for (_, c), p in prog._plans.items() if c == cls)
    assert _fused(plan) == [True], [k.name for k in plan.kernels]  # one kernel: the online softmax


def test_the_symbolic_plan_holds_the_fused_kernel_not_the_chain():
    """Head dims constant: the plan's one kernel is the REDUCE(ONLINE_SOFTMAX) (its source has no separate row
    max and sum kernels); a head dim that is a dim keeps the plain chain, which is still right."""
    prog = tgc.loads(HEAD + SPELLINGS["where_causal"] + "return w @ v\n")
    plan = prog.compile_symbolic("CPU")
    assert len(plan.kernels) == 1 and _fused(plan) == [True]
    assert plan.kernels[0].binary is not None and plan.kernels[0].name.startswith("attn_")

    dims_src = "q: f32[B, T, D]\nk: f32[B, T, D]\nv: f32[B, T, E]\n" + SPELLINGS["where_causal"] + "return w @ v\n"
    plain = tgc.loads(dims_src)
    plan = plain.compile_symbolic("CPU")
    assert not any(_fused(plan))
    ins = {n: np.random.default_rng(1).standard_normal((2, 11, 3)).astype(np.float32) for n in ("q", "k", "v")}
    out = plain.run("CPU", dims={"B": 2, "T": 11, "D": 3, "E": 3}, symbolic=True, **ins)[plain.output_names[0]]
    assert plain.last_run == "symbolic"
    np.testing.assert_allclose(out.astype(np.float64), _numpy(**ins), rtol=3e-5, atol=3e-5)
