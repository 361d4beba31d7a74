"""Neural-net helpers of the `.tg` language (conv2d, max_pool2d, avg_pool2d, layernorm) against direct numpy
implementations written here with explicit loops over the output positions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from langkit import assert_close, assert_exact, run, run1

import tgc


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def conv2d_ref(x, w, stride=1, padding=0, dilation=1, groups=1) -> np.ndarray:
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    n, c, h, wd = x.shape
    o, ci, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for oc in range(o):
        g = oc // og
        for i in range(oh):
            for j in range(ow):
                rows = slice(i * sh, i * sh + dh * (kh - 1) + 1, dh)
                cols = slice(j * sw, j * sw + dw * (kw - 1) + 1, dw)
                patch = xp[:, g * ci:(g + 1) * ci, rows, cols]
                out[:, oc, i, j] = (patch * w[oc].astype(np.float64)).sum(axis=(1, 2, 3))
    return out


def pool_ref(x, kernel, stride, reduce) -> np.ndarray:
    (kh, kw), (sh, sw) = _pair(kernel), _pair(stride)
    h, w = x.shape[-2:]
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    out = np.zeros(x.shape[:-2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            out[..., i, j] = reduce(x[..., i * sh:i * sh + kh, j * sw:j * sw + kw].astype(np.float64), axis=(-2, -1))
    return out


CONV_CASES = [
    # (x shape, w shape, kwargs)
    ((1, 1, 5, 5), (1, 1, 3, 3), ""),
    ((2, 3, 6, 7), (4, 3, 3, 2), ""),
    ((1, 2, 7, 7), (3, 2, 3, 3), "stride=2"),
    ((1, 2, 8, 6), (2, 2, 3, 3), "stride=(2, 1), padding=1"),
    ((1, 1, 5, 6), (2, 1, 2, 2), "padding=(2, 0)"),
    ((1, 2, 9, 9), (2, 2, 3, 3), "dilation=2"),
    ((2, 4, 6, 6), (6, 2, 3, 3), "groups=2"),
    ((1, 4, 5, 5), (4, 1, 3, 3), "groups=4, padding=1"),
    ((1, 6, 9, 8), (4, 3, 2, 3), "stride=3, padding=1, dilation=(2, 1), groups=2"),
    ((1, 1, 6, 6), (1, 1, 2, 2), "stride=4"),
]


@pytest.mark.parametrize("xs, ws, kwargs", CONV_CASES)
def test_conv2d(device, xs, ws, kwargs):
    rng = np.random.default_rng(21)
    x = rng.uniform(-1, 1, xs).astype(np.float32)
    w = rng.uniform(-1, 1, ws).astype(np.float32)
    args = ", " + kwargs if kwargs else ""
    src = f"x: f32[{', '.join(map(str, xs))}]\nw: f32[{', '.join(map(str, ws))}]\nreturn conv2d(x, w{args})"
    out = run1(src, device, x=x, w=w)
    kw = eval(f"dict({kwargs})")  # the test's own keyword arguments, for the reference
    want = conv2d_ref(x, w, **kw)
    scale = conv2d_ref(np.abs(x), np.abs(w), **kw)
    assert_close(out, want, "f32", scale=scale)


def test_conv2d_method_form_ints_and_bias(device):
    rng = np.random.default_rng(22)
    x = rng.integers(-3, 4, (1, 2, 5, 5)).astype(np.int32)
    w = rng.integers(-3, 4, (3, 2, 3, 3)).astype(np.int32)
    b = np.array([1, -2, 3], np.int32)
    out = run("x: i32[1, 2, 5, 5]\nw: i32[3, 2, 3, 3]\nb: i32[3]\n"
              "return x.conv2d(w, padding=1) + b.reshape(1, 3, 1, 1), relu(conv2d(x, w))", device, x=x, w=w, b=b)
    assert_exact(out["out0"], conv2d_ref(x, w, padding=1).astype(np.int64) + b.reshape(1, 3, 1, 1), "i32")
    assert_exact(out["out1"], np.maximum(conv2d_ref(x, w), 0).astype(np.int64), "i32")


@pytest.mark.parametrize("shape, kernel, stride", [
    ((1, 1, 4, 4), "2", None),
    ((2, 3, 7, 7), "2", None),  # floor mode: the last row and column are dropped
    ((1, 2, 7, 8), "3", "2"),
    ((1, 1, 6, 5), "(2, 3)", "(1, 2)"),
    ((3, 5, 5), "3", "1"),
    ((4, 6), "(2, 2)", "(2, 3)"),
])
def test_pooling(device, shape, kernel, stride):
    rng = np.random.default_rng(23)
    x = rng.uniform(-2, 2, shape).astype(np.float32)
    st = "" if stride is None else f", stride={stride}"
    decl = f"x: f32[{', '.join(map(str, shape))}]\n"
    out = run(decl + f"return max_pool2d(x, {kernel}{st}), avg_pool2d(x, {kernel}{st}), x.max_pool2d({kernel}{st})",
              device, x=x)
    k = eval(kernel)
    s = k if stride is None else eval(stride)
    assert_close(out["out0"], pool_ref(x, k, s, np.max), "f32")
    assert_close(out["out1"], pool_ref(x, k, s, np.mean), "f32")
    assert_close(out["out2"], pool_ref(x, k, s, np.max), "f32")


def test_max_pool_of_ints(device):
    x = np.arange(25, dtype=np.int8).reshape(1, 5, 5) - 12
    out = run1("x: i8[1, 5, 5]\nreturn max_pool2d(x, 2)", device, x=x)
    assert_exact(out, pool_ref(x, 2, 2, np.max), "i8")


def _layernorm_ref(x, axes, eps):
    v = x.astype(np.float64)
    mu = v.mean(axis=axes, keepdims=True)
    var = ((v - mu) ** 2).mean(axis=axes, keepdims=True)
    return (v - mu) / np.sqrt(var + eps)


@pytest.mark.parametrize("args, axes, eps", [
    ("", -1, 1e-5), ("axis=1", 1, 1e-5), ("axis=-1, eps=0.1", -1, 0.1), ("axis=(1, 2)", (1, 2), 1e-5),
    ("0", 0, 1e-5),
])
def test_layernorm(device, args, axes, eps):
    rng = np.random.default_rng(24)
    x = rng.uniform(-3, 3, (2, 3, 8)).astype(np.float32)
    out = run("x: f32[2, 3, 8]\nreturn layernorm(x" + (", " + args if args else "") + "), x.layernorm(" + args + ")",
              device, x=x)
    want = _layernorm_ref(x, axes, eps)
    assert_close(out["out0"], want, "f32")
    assert_close(out["out1"], want, "f32")


def test_layernorm_of_f16_and_a_small_mlp(device):
    rng = np.random.default_rng(25)
    x = rng.uniform(-1, 1, (4, 8)).astype(np.float16)
    w = rng.uniform(-1, 1, (8, 5)).astype(np.float16)
    out = run("x: f16[4, 8]\nw: f16[8, 5]\nreturn layernorm(x), softmax(gelu(x @ w), -1)", device, x=x, w=w)
    assert_close(out["out0"], _layernorm_ref(x, -1, 1e-5), "f16")
    h = x.astype(np.float64) @ w.astype(np.float64)
    g = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
    e = np.exp(g - g.max(-1, keepdims=True))
    assert_close(out["out1"], e / e.sum(-1, keepdims=True), "f16")


@pytest.mark.parametrize("src", [
    "x: f32[1, 2, 5, 5]\nw: f32[3, 3, 3, 3]\nreturn conv2d(x, w)",
    "x: f32[1, 4, 5, 5]\nw: f32[3, 2, 3, 3]\nreturn conv2d(x, w, groups=2)",
    "x: f32[1, 1, 2, 2]\nw: f32[1, 1, 3, 3]\nreturn conv2d(x, w)",
    "x: f32[1, 1, 2, 2]\nreturn max_pool2d(x, 3)",
])
def test_nn_shape_errors(src):
    with pytest.raises(tgc.TgcError) as info:
        tgc.loads(src).compile(dims={})
    assert info.value.line == src.count("\n") + 1 and info.value.col == 8
