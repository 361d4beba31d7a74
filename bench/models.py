"""The bench workloads as a numpy user and a JAX user would write them, independently of tgc.

Each model is one function written against an array namespace `xp` (numpy, or `jax.numpy`), so numpy's and
XLA's versions are the same program; `erf` comes from `erf_of(xp)` (math.erf vectorized for numpy, where numpy
has none; jax.scipy's for JAX). The tests compare tgc's programs in kernels/ with the numpy versions.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def erf_of(xp: Any):
    """erf for the namespace: scipy's for numpy (numpy has none; math.erf vectorized where scipy is missing),
    jax.scipy's for JAX."""
    if xp is np:
        try:
            from scipy.special import erf
            return erf
        except ImportError:
            verf = np.vectorize(math.erf, otypes=[np.float64])
            return lambda x: verf(x.astype(np.float64)).astype(x.dtype)
    import jax.scipy.special
    return jax.scipy.special.erf


def gelu(xp: Any, x):
    return 0.5 * x * (1 + erf_of(xp)(x * (1 / math.sqrt(2))))


def softmax(xp: Any, x, axis: int = -1):
    e = xp.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def layernorm(xp: Any, x, gamma=None, beta=None, eps: float = 1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    c = x - mu
    y = c / xp.sqrt((c * c).mean(axis=-1, keepdims=True) + eps)
    return y if gamma is None else y * gamma + beta


def attention(xp: Any, q, k, v):
    s = q @ xp.swapaxes(k, -1, -2) * (1.0 / math.sqrt(q.shape[-1]))
    return softmax(xp, s) @ v


def mlp_layer(xp: Any, x, w, b):
    return gelu(xp, x @ w + b)


def small_kernels(xp: Any, x, steps: int = 19):
    y = x
    for _ in range(steps):
        y = (y - y.mean(axis=0)) * 1.001
    return y


TRANSFORMER_HEADS = 4
TRANSFORMER_WEIGHTS = ("ln1_g", "ln1_b", "w_qkv", "b_qkv", "w_o", "b_o", "ln2_g", "ln2_b", "w_fc", "b_fc", "w_proj",
                       "b_proj")


def transformer_block(xp: Any, x, ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj):
    """kernels/transformer_block.tg: pre-norm, 4-head causal attention, output projection, erf-GELU MLP."""
    b, t, c = x.shape
    heads, hd = TRANSFORMER_HEADS, c // TRANSFORMER_HEADS
    h = layernorm(xp, x, ln1_g, ln1_b)
    qkv = (h @ w_qkv + b_qkv).reshape(b, t, 3, heads, hd)
    q, k, v = (xp.transpose(qkv[:, :, i], (0, 2, 1, 3)) for i in range(3))
    s = q @ xp.swapaxes(k, -1, -2) * (1.0 / math.sqrt(hd))
    causal = xp.arange(t)[:, None] >= xp.arange(t)[None, :]
    att = softmax(xp, xp.where(causal, s, -1e30)) @ v
    y = x + xp.transpose(att, (0, 2, 1, 3)).reshape(b, t, c) @ w_o + b_o
    h2 = layernorm(xp, y, ln2_g, ln2_b)
    return y + gelu(xp, h2 @ w_fc + b_fc) @ w_proj + b_proj


def transformer_inputs(b: int, t: int, c: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the block at a realistic scale (weights ~ 1/sqrt(fan-in)), as float32."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    return {"x": w(b, t, c), "ln1_g": 1 + w(c, scale=0.1), "ln1_b": w(c, scale=0.1),
            "w_qkv": w(c, 3 * c, scale=c ** -0.5), "b_qkv": w(3 * c, scale=0.02), "w_o": w(c, c, scale=c ** -0.5),
            "b_o": w(c, scale=0.02), "ln2_g": 1 + w(c, scale=0.1), "ln2_b": w(c, scale=0.1),
            "w_fc": w(c, 4 * c, scale=c ** -0.5), "b_fc": w(4 * c, scale=0.02),
            "w_proj": w(4 * c, c, scale=(4 * c) ** -0.5), "b_proj": w(c, scale=0.02)}


def transformer_dims(b: int, t: int, c: int) -> dict[str, int]:
    """The dims of kernels/transformer_block.tg (its weights are declared 3 * C and 4 * C wide)."""
    return {"B": b, "T": t, "C": c}
