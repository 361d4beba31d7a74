"""Attention is formed from any spelling of `exp(x - max) / sum` over a matmul (issue 20, item 4): `softmax`,
exp/sum by hand (with or without keepdim), `log_softmax` then `exp`, a mask by `where` or by addition (an input
or a causal iota mask), the scale before or after, q/k/v as slices of one projection. Each is ONE fused kernel
(`attn_`, or the projection's kernel and then the fused one) checked against numpy, on every device of
`TGC_TEST_DEVICES`, at odd lengths and head dims 32..256. Chains that are not a softmax over the matmul's
reduced axis keep the ordinary schedule."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.codegen.attention import is_fused_attention
from tgc.engine import attention
from tgc.engine.attention import spec_of

HEAD = """q: f32[B, T, D]
k: f32[B, T, D]
v: f32[B, T, E]
"""
CAUSAL = "causal = arange(q.shape[1])[:, None] >= arange(q.shape[1])[None, :]\n"

# name -> (program body after the inputs, numpy scores from q, k (and mask), causal?)
SPELLINGS = {
    "softmax": ("s = q @ k.transpose(-2, -1) * 0.3\nw = softmax(s, axis=-1)\n", False),
    "by_hand_keepdim": ("s = q @ k.transpose(-2, -1) * 0.3\n"
                        "e = exp(s - max(s, axis=-1, keepdim=True))\nw = e / sum(e, axis=-1, keepdim=True)\n", False),
    "by_hand_no_keepdim": ("s = q @ k.transpose(-2, -1) * 0.3\n"
                           "e = exp(s - max(s, axis=-1)[:, :, None])\nw = e / sum(e, axis=-1)[:, :, None]\n", False),
    "reciprocal": ("s = q @ k.transpose(-2, -1) * 0.3\n"
                   "e = exp(s - max(s, axis=-1, keepdim=True))\nw = e * (1.0 / sum(e, axis=-1, keepdim=True))\n",
                   False),
    "no_max_shift": ("s = q @ k.transpose(-2, -1) * 0.3\ne = exp(s)\nw = e / sum(e, axis=-1, keepdim=True)\n", False),
    "log_softmax_exp": ("s = q @ k.transpose(-2, -1) * 0.3\nw = exp(log_softmax(s, axis=-1))\n", False),
    "scale_before": ("s = (q * 0.3) @ k.transpose(-2, -1)\nw = softmax(s, axis=-1)\n", False),
    "scale_after_shift": ("s = q @ k.transpose(-2, -1)\n"
                          "e = exp((s - max(s, axis=-1, keepdim=True)) * 0.3)\n"
                          "w = e / sum(e, axis=-1, keepdim=True)\n", False),
    "where_causal": (CAUSAL + "s = where(causal, q @ k.transpose(-2, -1) * 0.3, -1e30)\n"
                     "w = softmax(s, axis=-1)\n", True),
    "additive_causal": (CAUSAL + "s = q @ k.transpose(-2, -1) * 0.3 + where(causal, 0.0, -1e9)\n"
                        "w = softmax(s, axis=-1)\n", True),
}


def _numpy(q, k, v, causal: bool, mask=None) -> np.ndarray:
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = q @ k.swapaxes(-1, -2) * 0.3
    if mask is not None:
        s = s + mask
    if causal:
        t = s.shape[-1]
        s = np.where(np.arange(t)[:, None] >= np.arange(t)[None, :], s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def _check(src: str, device: str, dims: dict, ins: dict, want: np.ndarray, fused_kernels: int = 1) -> None:
    p = tgc.loads(src)
    names = [kk.name for kk in p.compile(device, dims=dims)]
    assert sum(n.startswith("attn_") for n in names) == 1 and len(names) == fused_kernels, names
    out = p.run(device, dims=dims, **ins)[p.output_names[0]]
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=3e-5, atol=3e-5)


def _inputs(b: int, t: int, d: int, e: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in (("q", (b, t, d)), ("k", (b, t, d)),
                                                                      ("v", (b, t, e)))}


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_every_spelling_is_one_fused_kernel_matching_numpy(name, device):
    body, causal = SPELLINGS[name]
    b, t, d, e = 2, 13, 8, 5  # odd length, not a multiple of any block
    ins = _inputs(b, t, d, e)
    _check(HEAD + body + "return w @ v\n", device, {"B": b, "T": t, "D": d, "E": e}, ins,
           _numpy(ins["q"], ins["k"], ins["v"], causal))


@pytest.mark.parametrize("d,e", [(32, 32), (96, 24), (256, 16)])
def test_head_dims_32_to_256_at_odd_lengths(d, e, device):
    """Head dims (the inner products' length) 32..256; the value width kept small (each output column is an
    accumulator of its own: wide ones are tests/test_attention_lowering.py's)."""
    b, t = 1, 7 if d == 256 else 11
    body, causal = SPELLINGS["where_causal"]
    ins = _inputs(b, t, d, e, seed=d)
    _check(HEAD + body + "return w @ v\n", device, {"B": b, "T": t, "D": d, "E": e}, ins,
           _numpy(ins["q"], ins["k"], ins["v"], causal))


def test_an_input_mask_added_and_qkv_slices_of_one_projection(device):
    """GPT-2's spelling: q, k and v slices of one projection (realized once: its own kernel), heads split by
    reshape and permute, the mask an input added to the scores."""
    src = """x: f32[B, T, C]
w_qkv: f32[C, 3 * C]
mask: f32[T, T]
H = 2
qkv = x @ w_qkv
q = permute(reshape(qkv[:, :, :C], (B, T, H, C // H)), (0, 2, 1, 3))
k = permute(reshape(qkv[:, :, C:2 * C], (B, T, H, C // H)), (0, 2, 1, 3))
v = permute(reshape(qkv[:, :, 2 * C:], (B, T, H, C // H)), (0, 2, 1, 3))
s = q @ k.transpose(-2, -1) * 0.3 + mask
return softmax(s, axis=-1) @ v
"""
    b, t, c, h = 2, 9, 16, 2
    rng = np.random.default_rng(3)
    x = rng.standard_normal((b, t, c)).astype(np.float32)
    w_qkv = (rng.standard_normal((c, 3 * c)) * 0.3).astype(np.float32)
    mask = np.where(rng.random((t, t)) < 0.3, -1e9, 0.0).astype(np.float32)
    np.fill_diagonal(mask, 0.0)
    qkv = x.astype(np.float64) @ w_qkv
    heads = [qkv[:, :, i * c:(i + 1) * c].reshape(b, t, h, c // h).transpose(0, 2, 1, 3) for i in range(3)]
    want = _numpy(*heads, False, mask=mask)
    p = tgc.loads(src)
    items = p.schedule({"B": b, "T": t, "C": c})
    assert sum(is_fused_attention(it.ast) for it in items) == 1
    # the projection is not recomputed per score: its matmul is a kernel of its own, read by the fused one
    fused = next(it for it in items if is_fused_attention(it.ast))
    assert not any(u.op.name == "REDUCE" for u in spec_of(fused.ast).v.toposort())
    out = p.run(device, dims={"B": b, "T": t, "C": c}, x=x, w_qkv=w_qkv, mask=mask)[p.output_names[0]]
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=3e-5, atol=3e-5)


@pytest.mark.parametrize("body", [
    # weights that do not sum to one: exp of half the normalizer
    "s = q @ k.transpose(-2, -1)\nm = s - max(s, axis=-1, keepdim=True)\n"
    "w = exp(m - 0.5 * log(sum(exp(m), axis=-1, keepdim=True)))\n",
    # the sum of another exponent (scaled differently) than the numerator's
    "s = q @ k.transpose(-2, -1)\nw = exp(s) / sum(exp(s * 0.5), axis=-1, keepdim=True)\n",
    # normalized over the other axis
    "s = q @ k.transpose(-2, -1)\nw = exp(s) / sum(exp(s), axis=-2, keepdim=True)\n",
    # times twice the reciprocal of the sum
    "s = q @ k.transpose(-2, -1)\ne = exp(s)\nw = e * (2.0 / sum(e, axis=-1, keepdim=True))\n",
    # a sum of exps that is not normalized at all
    "s = q @ k.transpose(-2, -1)\nw = exp(s)\n",
    # log_softmax itself
    "s = q @ k.transpose(-2, -1)\nw = log_softmax(s, axis=-1)\n",
    # a per-element (not per-row) shift in the numerator's exponent that the sum's exponent lacks
    "s = q @ k.transpose(-2, -1)\nw = exp(s - s * s) / sum(exp(s), axis=-1, keepdim=True)\n",
])
def test_chains_that_are_not_a_softmax_are_not_fused(body):
    items = tgc.loads(HEAD + body + "return w @ v\n").schedule({"B": 1, "T": 6, "D": 4, "E": 3})
    assert not any(is_fused_attention(it.ast) for it in items)


def test_the_scores_are_the_exponent_without_its_row_constants():
    """The rule read directly: the max (a row broadcast) and the constant shift are dropped, the scale kept."""
    p = tgc.loads(HEAD + "s = q @ k.transpose(-2, -1)\ne = exp((s - max(s, axis=-1, keepdim=True) + 2.0) * 0.5)\n"
                  "w = e / sum(e, axis=-1, keepdim=True)\nreturn w @ v\n")
    outs, _ = p._trace({"B": 1, "T": 4, "D": 3, "E": 2})
    (m,) = attention.find(outs).values()
    assert len(m.scores) == 1
    node, coef = m.scores[0]
    assert node.op.name == "RESHAPE" or node.op.name == "REDUCE_AXIS"  # the matmul q @ k^T, nothing else
    assert abs(coef - 0.5) < 1e-9
