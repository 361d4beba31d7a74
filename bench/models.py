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


# --- the model corpus (bench/models/*.tg): each block's twin, written against `xp` as a JAX user would write it.
# Each function takes the .tg file's inputs in their declared order; constants the .tg file sets (heads) are
# the same here. `CORPUS` lists the programs with the dims the bench runs, small dims and odd dims for tests.


def rms_norm(xp: Any, x, g, eps: float = 1e-5):
    return x / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g


def gelu_tanh(xp: Any, x):
    return 0.5 * x * (1 + xp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def sigmoid(xp: Any, x):
    return 1 / (1 + xp.exp(-x))


def conv2d(xp: Any, x, w, stride: int = 1, padding: int = 0, groups: int = 1):
    """torch's conv2d (NCHW input, OIHW weight, no bias): lax's convolution for JAX, sliding windows and an
    einsum for numpy."""
    if xp is not np:
        import jax
        return jax.lax.conv_general_dilated(x, w, (stride, stride), ((padding, padding), (padding, padding)),
                                            feature_group_count=groups)
    n, c, _, _ = x.shape
    o, cg, kh, kw = w.shape
    xp_ = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    win = np.lib.stride_tricks.sliding_window_view(xp_, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    ho, wo = win.shape[2:4]
    win = win.reshape(n, groups, cg, ho, wo, kh, kw)
    wg = w.reshape(groups, o // groups, cg, kh, kw)
    out = np.einsum("ngchwij,gocij->ngohw", win, wg, optimize=True)
    return out.reshape(n, o, ho, wo)


def _attend(xp: Any, q, k, v, bias=None):
    s = q @ xp.swapaxes(k, -1, -2) * (1.0 / math.sqrt(q.shape[-1]))
    return softmax(xp, s if bias is None else s + bias) @ v


def _heads(xp: Any, t, n: int):
    b, tt, c = t.shape
    return xp.transpose(t.reshape(b, tt, n, c // n), (0, 2, 1, 3))


def _merge(xp: Any, t):
    b, n, tt, d = t.shape
    return xp.transpose(t, (0, 2, 1, 3)).reshape(b, tt, n * d)


def _rotate(xp: Any, t, cos, sin):
    d = t.shape[-1]
    return t * cos + xp.concatenate([-t[..., d // 2:], t[..., :d // 2]], axis=-1) * sin


def llama_block(xp: Any, x, attn_norm, wq, wk, wv, wo, cos, sin, mlp_norm, w_gate, w_up, w_down):
    """bench/models/llama_block.tg: RMSNorm, rotary embeddings, causal multi-head attention, SwiGLU."""
    d = cos.shape[-1]
    h = rms_norm(xp, x, attn_norm)
    q, k = (_rotate(xp, _heads(xp, h @ w, x.shape[-1] // d), cos, sin) for w in (wq, wk))
    v = _heads(xp, h @ wv, x.shape[-1] // d)
    t = x.shape[1]
    s = q @ xp.swapaxes(k, -1, -2) * (1.0 / math.sqrt(d))
    s = xp.where(xp.arange(t)[:, None] >= xp.arange(t)[None, :], s, -1e30)
    y = x + _merge(xp, softmax(xp, s) @ v) @ wo
    h2 = rms_norm(xp, y, mlp_norm)
    gate = h2 @ w_gate
    return y + (gate * sigmoid(xp, gate) * (h2 @ w_up)) @ w_down


def llama_gqa_block(xp: Any, x, attn_norm, wq, wk, wv, wo, cos, sin, mlp_norm, w_gate, w_up, w_down):
    """bench/models/llama_gqa_block.tg: as llama_block with KH = wk's width / D key/value heads."""
    b, t, c = x.shape
    d = cos.shape[-1]
    heads, kv_heads = c // d, wk.shape[1] // d
    h = rms_norm(xp, x, attn_norm)
    q = _rotate(xp, _heads(xp, h @ wq, heads), cos, sin)
    k = xp.repeat(_rotate(xp, _heads(xp, h @ wk, kv_heads), cos, sin), heads // kv_heads, axis=1)
    v = xp.repeat(_heads(xp, h @ wv, kv_heads), heads // kv_heads, axis=1)
    s = q @ xp.swapaxes(k, -1, -2) * (1.0 / math.sqrt(d))
    s = xp.where(xp.tril(xp.ones((t, t), dtype=bool)), s, -xp.inf)
    y = x + _merge(xp, softmax(xp, s) @ v) @ wo
    h2 = rms_norm(xp, y, mlp_norm)
    gate = h2 @ w_gate
    return y + (gate * sigmoid(xp, gate) * (h2 @ w_up)) @ w_down


GPT2_HEADS = 12


def gpt2_block(xp: Any, x, mask, ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj):
    """bench/models/gpt2_block.tg: pre-norm, q, k, v sliced from one projection, an additive mask input."""
    c = x.shape[-1]
    qkv = layernorm(xp, x, ln1_g, ln1_b) @ w_qkv + b_qkv
    q, k, v = (_heads(xp, qkv[..., i * c:(i + 1) * c], GPT2_HEADS) for i in range(3))
    y = x + _merge(xp, _attend(xp, q, k, v, mask)) @ w_o + b_o
    return y + gelu(xp, layernorm(xp, y, ln2_g, ln2_b) @ w_fc + b_fc) @ w_proj + b_proj


BERT_HEADS = 12


def bert_layer(xp: Any, x, pad_mask, w_qkv, b_qkv, w_o, b_o, ln1_g, ln1_b, w_in, b_in, w_out, b_out, ln2_g, ln2_b):
    """bench/models/bert_layer.tg: post-norm, padding mask, tanh GELU."""
    b, t, c = x.shape
    qkv = x @ w_qkv + b_qkv
    q, k, v = (_heads(xp, qkv[..., i * c:(i + 1) * c], BERT_HEADS) for i in range(3))
    bias = ((1.0 - pad_mask) * -10000.0).reshape(b, 1, 1, t)
    y = layernorm(xp, x + _merge(xp, _attend(xp, q, k, v, bias)) @ w_o + b_o, ln1_g, ln1_b)
    return layernorm(xp, y + gelu_tanh(xp, y @ w_in + b_in) @ w_out + b_out, ln2_g, ln2_b)


VIT_HEADS = 6


def vit_block(xp: Any, img, w_patch, b_patch, cls, pos, ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc,
              b_fc, w_proj, b_proj):
    """bench/models/vit_block.tg: patch embedding (a stride-P convolution), class token, position embeddings,
    a pre-norm block."""
    b = img.shape[0]
    c, p = w_patch.shape[0], w_patch.shape[-1]
    patches = conv2d(xp, img, w_patch, stride=p) + b_patch.reshape(1, c, 1, 1)
    tokens = xp.transpose(patches.reshape(b, c, -1), (0, 2, 1))
    x = xp.concatenate([xp.broadcast_to(cls.reshape(1, 1, c), (b, 1, c)), tokens], axis=1) + pos
    h = layernorm(xp, x, ln1_g, ln1_b) @ w_qkv + b_qkv
    q, k, v = (_heads(xp, h[..., i * c:(i + 1) * c], VIT_HEADS) for i in range(3))
    y = x + _merge(xp, _attend(xp, q, k, v)) @ w_o + b_o
    return y + gelu(xp, layernorm(xp, y, ln2_g, ln2_b) @ w_fc + b_fc) @ w_proj + b_proj


def _conv_bn(xp: Any, h, w, gamma, beta, mean, var, pad: int):
    s = gamma / xp.sqrt(var + 1e-5)
    return conv2d(xp, h, w * s.reshape(-1, 1, 1, 1), padding=pad) + (beta - mean * s).reshape(1, -1, 1, 1)


def resnet_bottleneck(xp: Any, x, w1, g1, b1, mean1, var1, w2, g2, b2, mean2, var2, w3, g3, b3, mean3, var3):
    """bench/models/resnet_bottleneck.tg: 1x1, 3x3, 1x1 with batch norm folded, identity shortcut."""
    h = xp.maximum(_conv_bn(xp, x, w1, g1, b1, mean1, var1, 0), 0)
    h = xp.maximum(_conv_bn(xp, h, w2, g2, b2, mean2, var2, 1), 0)
    return xp.maximum(_conv_bn(xp, h, w3, g3, b3, mean3, var3, 0) + x, 0)


def mobilenet_block(xp: Any, x, w_dw, dw_scale, dw_shift, w_pw, pw_scale, pw_shift):
    """bench/models/mobilenet_block.tg: depthwise 3x3, BN, ReLU6, pointwise 1x1, BN, ReLU6."""
    def bn_relu6(h, scale, shift):
        return xp.clip(h * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1), 0.0, 6.0)
    h = bn_relu6(conv2d(xp, x, w_dw, padding=1, groups=x.shape[1]), dw_scale, dw_shift)
    return bn_relu6(conv2d(xp, h, w_pw), pw_scale, pw_shift)


def mixer_block(xp: Any, x, ln1_g, ln1_b, w_tok1, b_tok1, w_tok2, b_tok2, ln2_g, ln2_b, w_ch1, b_ch1, w_ch2, b_ch2):
    """bench/models/mixer_block.tg: token mixing on the transposed activations, then channel mixing."""
    t = xp.swapaxes(layernorm(xp, x, ln1_g, ln1_b), 1, 2)
    y = x + xp.swapaxes(mlp_layer(xp, t, w_tok1, b_tok1) @ w_tok2 + b_tok2, 1, 2)
    return y + mlp_layer(xp, layernorm(xp, y, ln2_g, ln2_b), w_ch1, b_ch1) @ w_ch2 + b_ch2


def unet_block(xp: Any, x, w_d1, b_d1, w_d2, b_d2, w_bot, b_bot, w_up, b_up, w_u1, b_u1, w_u2, b_u2):
    """bench/models/unet_block.tg: down (conv, conv, 2x2 max pool), bottom conv, up (2x nearest, conv, concat
    with the skip, conv, conv)."""
    def conv_relu(h, w, b):
        return xp.maximum(conv2d(xp, h, w, padding=1) + b.reshape(1, -1, 1, 1), 0)
    skip = conv_relu(conv_relu(x, w_d1, b_d1), w_d2, b_d2)
    n, c, s, _ = skip.shape
    pooled = skip.reshape(n, c, s // 2, 2, s // 2, 2).max(axis=(3, 5))
    bottom = conv_relu(pooled, w_bot, b_bot)
    up = conv_relu(xp.repeat(xp.repeat(bottom, 2, axis=2), 2, axis=3), w_up, b_up)
    return conv_relu(conv_relu(xp.concatenate([up, skip], axis=1), w_u1, b_u1), w_u2, b_u2)


def gru_cell(xp: Any, x, h, w_ih, b_ih, w_hh, b_hh):
    """bench/models/gru_cell.tg: torch.nn.GRUCell's step."""
    n = h.shape[-1]
    gi, gh = x @ w_ih + b_ih, h @ w_hh + b_hh
    r = sigmoid(xp, gi[:, :n] + gh[:, :n])
    z = sigmoid(xp, gi[:, n:2 * n] + gh[:, n:2 * n])
    c = xp.tanh(gi[:, 2 * n:] + r * gh[:, 2 * n:])
    return (1 - z) * c + z * h


def moe_layer(xp: Any, x, w_router, w1, b1, w2, b2):
    """bench/models/moe_layer.tg: top-1 routing by a one-hot mask, every expert on every token."""
    probs = softmax(xp, x @ w_router)
    experts = w_router.shape[1]
    gate = xp.where(xp.argmax(probs, axis=-1)[..., None] == xp.arange(experts), probs, 0.0)
    y = 0
    for e in range(experts):
        y = y + gate[..., e:e + 1] * (gelu(xp, x @ w1[e] + b1[e]) @ w2[e] + b2[e])
    return y


def kv_decode(xp: Any, x, norm_g, wq, wk, wv, wo, cos, sin, k_cache, v_cache):
    """bench/models/kv_decode.tg: one token against its KV cache (grouped-query), returns (y, k_new, v_new)."""
    b, _, c = x.shape
    d = cos.shape[-1]
    heads, kv_heads = c // d, k_cache.shape[1]
    h = rms_norm(xp, x, norm_g)
    q = _rotate(xp, _heads(xp, h @ wq, heads), cos, sin)
    k_new = _rotate(xp, _heads(xp, h @ wk, kv_heads), cos, sin)
    v_new = _heads(xp, h @ wv, kv_heads)
    k = xp.repeat(xp.concatenate([k_cache, k_new], axis=2), heads // kv_heads, axis=1)
    v = xp.repeat(xp.concatenate([v_cache, v_new], axis=2), heads // kv_heads, axis=1)
    return x + _merge(xp, _attend(xp, q, k, v)) @ wo, k_new, v_new


# name, .tg file (bench/models/), the twin, the dims the bench runs, small dims and odd dims (tests)
CORPUS: list[dict[str, Any]] = [
    dict(name="llama", file="llama_block.tg", model=llama_block,
         dims={"B": 1, "T": 128, "C": 512, "D": 64, "F": 1365},
         small={"B": 2, "T": 6, "C": 16, "D": 4, "F": 32}, odd={"B": 1, "T": 7, "C": 12, "D": 4, "F": 13}),
    dict(name="llama gqa", file="llama_gqa_block.tg", model=llama_gqa_block,
         dims={"B": 1, "T": 128, "C": 512, "D": 64, "KH": 2, "F": 1365},
         small={"B": 2, "T": 8, "C": 16, "D": 4, "KH": 2, "F": 32},
         odd={"B": 1, "T": 7, "C": 24, "D": 4, "KH": 3, "F": 13}),
    dict(name="gpt2", file="gpt2_block.tg", model=gpt2_block, dims={"B": 1, "T": 128, "C": 768},
         small={"B": 2, "T": 8, "C": 24}, odd={"B": 1, "T": 7, "C": 36}),
    dict(name="bert", file="bert_layer.tg", model=bert_layer, dims={"B": 4, "T": 128, "C": 768, "F": 3072},
         small={"B": 2, "T": 8, "C": 24, "F": 32}, odd={"B": 3, "T": 7, "C": 36, "F": 37}),
    dict(name="vit", file="vit_block.tg", model=vit_block,
         dims={"B": 1, "IMG": 224, "P": 16, "C": 384, "F": 1536},
         small={"B": 2, "IMG": 8, "P": 4, "C": 12, "F": 16}, odd={"B": 1, "IMG": 9, "P": 3, "C": 18, "F": 19}),
    dict(name="resnet", file="resnet_bottleneck.tg", model=resnet_bottleneck,
         dims={"B": 4, "C": 512, "M": 128, "S": 28},
         small={"B": 2, "C": 16, "M": 8, "S": 6}, odd={"B": 1, "C": 12, "M": 5, "S": 7}),
    dict(name="mobilenet", file="mobilenet_block.tg", model=mobilenet_block,
         dims={"B": 4, "C": 256, "O": 256, "S": 28},
         small={"B": 2, "C": 16, "O": 8, "S": 6}, odd={"B": 1, "C": 7, "O": 13, "S": 9}),
    dict(name="mixer", file="mixer_block.tg", model=mixer_block,
         dims={"B": 4, "S": 196, "C": 512, "DS": 256, "DC": 2048},
         small={"B": 2, "S": 8, "C": 16, "DS": 8, "DC": 32}, odd={"B": 1, "S": 9, "C": 13, "DS": 7, "DC": 21}),
    dict(name="unet", file="unet_block.tg", model=unet_block, dims={"B": 2, "CI": 32, "C": 64, "S": 64},
         small={"B": 1, "CI": 3, "C": 4, "S": 8}, odd={"B": 1, "CI": 5, "C": 3, "S": 10}),
    dict(name="gru", file="gru_cell.tg", model=gru_cell, dims={"B": 8, "I": 512, "H": 1024},
         small={"B": 2, "I": 16, "H": 32}, odd={"B": 3, "I": 13, "H": 21}),
    dict(name="moe", file="moe_layer.tg", model=moe_layer, dims={"B": 2, "T": 64, "C": 512, "E": 4, "F": 1024},
         small={"B": 2, "T": 4, "C": 16, "E": 4, "F": 32}, odd={"B": 1, "T": 7, "C": 13, "E": 3, "F": 19}),
    dict(name="kv decode", file="kv_decode.tg", model=kv_decode,
         dims={"B": 1, "P": 1023, "C": 1024, "D": 64, "KH": 4},
         small={"B": 2, "P": 15, "C": 16, "D": 4, "KH": 2}, odd={"B": 1, "P": 36, "C": 24, "D": 4, "KH": 3}),
    # odd-size variants: sizes with no power-of-two factor the tiles want
    dict(name="llama odd", file="llama_gqa_block.tg", model=llama_gqa_block,
         dims={"B": 1, "T": 77, "C": 576, "D": 64, "KH": 3, "F": 1000}),
    dict(name="bert odd", file="bert_layer.tg", model=bert_layer, dims={"B": 3, "T": 77, "C": 300, "F": 1000}),
]


def corpus_inputs(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    """float32 inputs of a corpus model from its input shapes, as a trained model's would look: weights
    ~ 1/sqrt(fan-in), norms' gains near 1, biases and shifts small, variances positive, rotary tables of
    angles, a padding mask with each sequence's tail padded, KV caches of unit scale."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        n = rng.standard_normal(shape)
        if name in ("cos", "sin"):  # rotary tables: [T, D] or [D] (one position)
            d = shape[-1]
            pos = np.arange(shape[0])[:, None] if len(shape) == 2 else np.array([shape[0] + 3.0])
            ang = pos / 10000 ** (np.arange(0, d, 2) / d)
            ang = np.concatenate([ang, ang], -1)
            v = np.cos(ang) if name == "cos" else np.sin(ang)
        elif name == "pad_mask":  # sequence i keeps its first T - i tokens (at least one)
            b, t = shape
            v = (np.arange(t)[None, :] < np.maximum(t - np.arange(b)[:, None] * max(t // 4, 1), 1)).astype(float)
        elif name.startswith("var"):
            v = rng.uniform(0.5, 1.5, shape)
        elif name.startswith("mean") or name.startswith("b") or name.endswith("shift") or name in ("cls", "pos"):
            v = n * 0.1
        elif name.endswith("_g") or name.startswith("g") or name.endswith("norm") or name.endswith("scale"):
            v = 1 + n * 0.1
        elif name.startswith("w") and len(shape) >= 2:
            fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[-2]
            v = n / math.sqrt(fan_in)
        else:  # activations, caches, masks given as numbers
            v = n
        out[name] = v.astype(np.float32)
    if "mask" in shapes:  # an additive causal mask (gpt2_block.tg)
        t = shapes["mask"][0]
        out["mask"] = np.where(np.tril(np.ones((t, t), bool)), 0.0, -1e9).astype(np.float32)
    return out
