"""kernels/tiny_gpt.tg (the README's GPT) against the same GPT and loss written independently in numpy, per
device of TGC_TEST_DEVICES: token ids into an embedding, L blocks over stacked weights, tied logits, and the
mean cross-entropy. The ids fed here are valid (0..V-1); --random's ints may be negative, which the index rule
wraps (tests/test_lang_more_ops.py checks that rule)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

import tgc

TINY_GPT = Path(__file__).resolve().parent.parent / "kernels" / "tiny_gpt.tg"
HEADS = 4  # n_head in the program
B, T, V, C, L = 2, 5, 11, 8, 2
_erf = np.vectorize(math.erf, otypes=[np.float64])


def gpt_inputs(seed: int) -> dict[str, np.ndarray]:
    """Valid token ids (both ends of the vocabulary included) and weights of GPT-2's scale."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, V, (B, T)).astype(np.int32)
    ids[0, 0], ids[1, -1] = 0, V - 1
    targets = rng.integers(0, V, (B, T)).astype(np.int32)
    shapes = {"wte": (V, C), "wpe": (T, C), "ln1_g": (L, C), "ln1_b": (L, C), "w_qkv": (L, C, 3 * C),
              "b_qkv": (L, 3 * C), "w_o": (L, C, C), "b_o": (L, C), "ln2_g": (L, C), "ln2_b": (L, C),
              "w_fc": (L, C, 4 * C), "b_fc": (L, 4 * C), "w_proj": (L, 4 * C, C), "b_proj": (L, C),
              "lnf_g": (C,), "lnf_b": (C,)}
    weights = {name: (rng.standard_normal(shape) * 0.3).astype(np.float32) for name, shape in shapes.items()}
    for g in ("ln1_g", "ln2_g", "lnf_g"):
        weights[g] += 1
    return {"ids": ids, "targets": targets, **weights}


def numpy_gpt(inp: dict[str, np.ndarray]) -> tuple[np.ndarray, float]:
    """(logits, mean cross-entropy) in float64, written from the GPT-2 recipe, not from tgc's program."""
    w = {k: v.astype(np.float64) for k, v in inp.items() if k not in ("ids", "targets")}
    ids, targets = inp["ids"], inp["targets"]

    def layernorm(x, g, b):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b

    def softmax(s):
        e = np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    hd = C // HEADS
    x = w["wte"][ids] + w["wpe"][np.arange(T)]
    future = np.triu(np.ones((T, T), dtype=bool), k=1)  # key after query
    for i in range(L):
        h = layernorm(x, w["ln1_g"][i], w["ln1_b"][i])
        qkv = h @ w["w_qkv"][i] + w["b_qkv"][i]
        q, k, v = (qkv[..., j * C:(j + 1) * C].reshape(B, T, HEADS, hd).transpose(0, 2, 1, 3) for j in range(3))
        scores = np.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(hd)
        scores[..., future] = -np.inf
        att = (softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + att @ w["w_o"][i] + w["b_o"][i]
        u = layernorm(x, w["ln2_g"][i], w["ln2_b"][i]) @ w["w_fc"][i] + w["b_fc"][i]
        x = x + (0.5 * u * (1 + _erf(u / math.sqrt(2)))) @ w["w_proj"][i] + w["b_proj"][i]
    logits = layernorm(x, w["lnf_g"], w["lnf_b"]) @ w["wte"].T
    m = logits.max(-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    nll = -logp[np.arange(B)[:, None], np.arange(T)[None, :], targets]
    return logits, float(nll.mean())


def test_tiny_gpt_matches_numpy(device):
    inputs = gpt_inputs(seed=1)
    got = tgc.load(TINY_GPT).run(device=device, **inputs)
    logits, loss = numpy_gpt(inputs)
    assert got["logits"].shape == (B, T, V) and got["logits"].dtype == np.float32
    np.testing.assert_allclose(got["logits"], logits, rtol=1e-4, atol=1e-4)
    assert got["loss"].shape == () and got["loss"].dtype == np.float32
    assert abs(float(got["loss"]) - loss) <= 1e-4 * abs(loss), (float(got["loss"]), loss)


def test_tiny_gpt_is_causal_and_the_loss_follows_the_targets(device):
    prog = tgc.load(TINY_GPT)
    inputs = gpt_inputs(seed=2)
    before = prog.run(device=device, **inputs)
    changed = dict(inputs, ids=inputs["ids"].copy(), targets=(inputs["targets"] + 1) % V)
    changed["ids"][:, -1] = (changed["ids"][:, -1] + 3) % V  # the last token only
    after = prog.run(device=device, **changed)
    # a position never sees a later token: every earlier position's logits are unchanged
    np.testing.assert_array_equal(after["logits"][:, :-1], before["logits"][:, :-1])
    assert not np.allclose(after["logits"][:, -1], before["logits"][:, -1])
    assert abs(float(after["loss"]) - numpy_gpt(changed)[1]) <= 1e-4 * numpy_gpt(changed)[1]


def test_the_readme_shows_this_program():
    readme = (TINY_GPT.parent.parent / "README.md").read_text()
    assert f"```python\n{TINY_GPT.read_text()}```" in readme, "README's tiny GPT differs from kernels/tiny_gpt.tg"
    assert "tgc run kernels/tiny_gpt.tg --random" in readme
