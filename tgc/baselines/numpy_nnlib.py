"""The numpy twins of the ONNX-semantics operators of `tgc.dsl.nnlib`, for `tgc bench --vs numpy`
(`tgc.baselines.numpy_eval` looks every function of the language up by name).

Each twin is what a numpy user would write: conv is im2col (`sliding_window_view`, one copy into columns,
one `np.matmul` per group), pools reduce a strided window view, scatters use `ufunc.at`, resize gathers and
weights one axis at a time. The geometry (pads, output sizes, resize positions and weights) comes from the
same checked helpers as tgc's own functions, so both agree on every attribute. Runtime indices follow tgc's
index rule (wrapped once if negative, then clamped).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tgc.dsl import nnlib
from tgc.dtype import DType

__all__ = ["FUNCTIONS"]


def _float(x: np.ndarray) -> np.ndarray:
    return x if x.dtype.kind == "f" else x.astype(np.float32)


def _clamp(idx: Any, n: int) -> np.ndarray:
    i = np.asarray(idx).astype(np.int64)
    i = np.where(i < 0, i + n, i)
    return np.clip(i, 0, max(n - 1, 0))


def _windows(xp: np.ndarray, ks: tuple[int, ...], st: tuple[int, ...], dl: tuple[int, ...],
             outs: list[int]) -> np.ndarray:
    """(N, C, O1..On, K1..Kn) windows of the padded input (a view)."""
    n = len(ks)
    spans = tuple((k - 1) * d + 1 for k, d in zip(ks, dl))
    win = sliding_window_view(xp, spans, axis=tuple(range(2, 2 + n)))
    return win[(slice(None), slice(None)) + tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(outs, st)) +
               tuple(slice(None, None, d) for d in dl)]


def _pad(x: np.ndarray, begin: list[int], end: list[int], value: Any = 0) -> np.ndarray:
    if not any(begin) and not any(end):
        return x
    return np.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end)), constant_values=value)


def _conv(x, w, b=None, strides=None, pads=None, dilations=None, group=1, auto_pad="NOTSET", kernel_shape=None):
    x, w = np.asarray(x), np.asarray(w)
    dtype = np.result_type(x, w)
    n = x.ndim - 2
    ks = w.shape[2:]
    st, dl = nnlib._ints(strides, n, "strides", 1), nnlib._ints(dilations, n, "dilations", 1)
    begin, end, _, outs = nnlib.window_geometry("conv", x.shape[2:], ks, st, dl, pads, auto_pad)
    win = _windows(_pad(x.astype(dtype), begin, end), ks, st, dl, outs)
    big_n, m, cg = x.shape[0], w.shape[0], w.shape[1]
    g = group
    kk, pp = int(np.prod(ks)), int(np.prod(outs))
    order = (1, 2) + tuple(range(3 + n, 3 + 2 * n)) + (0,) + tuple(range(3, 3 + n))
    cols = win.reshape((big_n, g, cg) + tuple(outs) + ks).transpose(order).reshape(g, cg * kk, big_n * pp)
    out = np.matmul(w.astype(dtype).reshape(g, m // g, cg * kk), cols)
    out = out.reshape((m, big_n) + tuple(outs)).swapaxes(0, 1)
    if b is not None:
        out = out + np.asarray(b, dtype).reshape((1, m) + (1,) * n)
    return out


def _conv_transpose(x, w, b=None, strides=None, pads=None, dilations=None, group=1, auto_pad="NOTSET",
                    output_padding=None, output_shape=None, kernel_shape=None):
    x, w = np.asarray(x), np.asarray(w)
    st, dl, pb, pe = nnlib.conv_transpose_geometry(x.shape, w.shape, strides, pads, dilations, group, auto_pad,
                                                   output_padding, output_shape, kernel_shape)
    n = x.ndim - 2
    spread = np.zeros(x.shape[:2] + tuple((d - 1) * s + 1 for d, s in zip(x.shape[2:], st)), x.dtype)
    spread[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in st)] = x
    crop = tuple(slice(max(-a, 0), spread.shape[2 + i] - max(-e, 0)) for i, (a, e) in enumerate(zip(pb, pe)))
    spread = _pad(spread[(slice(None), slice(None)) + crop], [max(a, 0) for a in pb], [max(e, 0) for e in pe])
    c, mg, ks = x.shape[1], w.shape[1], w.shape[2:]
    cg = c // group
    wt = w.reshape((group, cg, mg) + ks).swapaxes(1, 2).reshape((group * mg, cg) + ks)
    wt = np.flip(wt, axis=tuple(range(2, 2 + n)))
    return _conv(spread, wt, b, dilations=dl, group=group)


def _lowest(dtype: np.dtype) -> Any:
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min if dtype.kind in "iu" else False


def _max_pool(x, kernel_shape=None, strides=None, pads=None, dilations=None, ceil_mode=0, auto_pad="NOTSET",
              storage_order=0, return_indices=False):
    x = np.asarray(x)
    n, ks, st, dl, begin, end, extra, outs = nnlib.pool_geometry(x.shape, "max_pool", kernel_shape, strides, pads,
                                                                 dilations, ceil_mode, auto_pad)
    end_all = [e + x_ for e, x_ in zip(end, extra)]
    win = _windows(_pad(x, begin, end_all, _lowest(x.dtype)), ks, st, dl, outs)
    kaxes = tuple(range(2 + n, 2 + 2 * n))
    values = win.max(axis=kaxes)
    if not nnlib._flag(return_indices, "return_indices"):
        return values
    sizes = x.shape[2:]
    plane = int(np.prod(sizes))
    pos = np.arange(plane, dtype=np.int64).reshape((1, 1) + sizes)
    pwin = _windows(_pad(pos, begin, end_all, plane), ks, st, dl, outs)
    first = np.where(win == values.reshape(values.shape + (1,) * n), pwin, plane).min(axis=kaxes)
    if nnlib._flag(storage_order, "storage_order"):
        coords = np.unravel_index(first, sizes)
        first = np.ravel_multi_index(coords, sizes, order="F").astype(np.int64)
    image = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape((x.shape[0], x.shape[1]) + (1,) * n)
    return values, first + image * plane


def _avg_pool(x, kernel_shape=None, strides=None, pads=None, dilations=None, ceil_mode=0, count_include_pad=0,
              auto_pad="NOTSET"):
    x = np.asarray(x)
    n, ks, st, dl, begin, end, extra, outs = nnlib.pool_geometry(x.shape, "avg_pool", kernel_shape, strides, pads,
                                                                 dilations, ceil_mode, auto_pad)
    include = nnlib._flag(count_include_pad, "count_include_pad")
    xf = _float(x)
    total = _windows(_pad(xf, begin, [e + x_ for e, x_ in zip(end, extra)]), ks, st, dl, outs)
    total = total.sum(axis=tuple(range(2 + n, 2 + 2 * n)))
    counts = np.ones((), np.float64)
    for i in range(n):
        c = nnlib.window_counts(x.shape[2 + i], begin[i], end[i], ks[i], st[i], dl[i], outs[i], include)
        counts = np.multiply.outer(counts, np.asarray(c, np.float64))
    return (total / counts).astype(xf.dtype).astype(x.dtype if x.dtype.kind == "f" else xf.dtype)


def _lp_pool(x, kernel_shape=None, strides=None, pads=None, dilations=None, ceil_mode=0, auto_pad="NOTSET", p=2):
    x = np.asarray(x)
    n, ks, st, dl, begin, end, extra, outs = nnlib.pool_geometry(x.shape, "lp_pool", kernel_shape, strides, pads,
                                                                 dilations, ceil_mode, auto_pad)
    xf = np.abs(_float(x))
    win = _windows(_pad(xf, begin, [e + x_ for e, x_ in zip(end, extra)]), ks, st, dl, outs)
    return ((win ** p).sum(axis=tuple(range(2 + n, 2 + 2 * n))) ** (1.0 / p)).astype(xf.dtype)


def _global_avg_pool(x):
    x = _float(np.asarray(x))
    return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True).astype(x.dtype)


def _global_max_pool(x):
    x = np.asarray(x)
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


def _global_lp_pool(x, p=2):
    x = np.abs(_float(np.asarray(x)))
    return ((x ** p).sum(axis=tuple(range(2, x.ndim)), keepdims=True) ** (1.0 / p)).astype(x.dtype)


def _channel(v: Any, ndim: int) -> np.ndarray:
    v = np.asarray(v)
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _normalized(x: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    d = x - x.mean(axis=axes, keepdims=True)
    return d / np.sqrt((d * d).mean(axis=axes, keepdims=True) + eps)


def _batch_norm(x, scale, bias, mean, var, epsilon=1e-5, training_mode=0, momentum=0.9):
    x = _float(np.asarray(x))
    nd = x.ndim
    if not training_mode:
        out = (x - _channel(mean, nd)) / np.sqrt(_channel(var, nd) + epsilon) * _channel(scale, nd)
        return (out + _channel(bias, nd)).astype(x.dtype)
    axes = (0,) + tuple(range(2, nd))
    bm, bv = x.mean(axis=axes), x.var(axis=axes)
    y = (x - _channel(bm, nd)) / np.sqrt(_channel(bv, nd) + epsilon) * _channel(scale, nd) + _channel(bias, nd)
    return (y.astype(x.dtype), (np.asarray(mean) * momentum + bm * (1 - momentum)).astype(x.dtype),
            (np.asarray(var) * momentum + bv * (1 - momentum)).astype(x.dtype))


def _instance_norm(x, scale, bias, epsilon=1e-5):
    x = _float(np.asarray(x))
    out = _normalized(x, tuple(range(2, x.ndim)), epsilon) * _channel(scale, x.ndim) + _channel(bias, x.ndim)
    return out.astype(x.dtype)


def _group_norm(x, scale, bias, num_groups, epsilon=1e-5):
    x = _float(np.asarray(x))
    c = x.shape[1]
    y = _normalized(x.reshape(x.shape[0], num_groups, -1), (2,), epsilon).reshape(x.shape)

    def param(v: Any) -> np.ndarray:
        v = np.asarray(v)
        return _channel(np.repeat(v, c // num_groups) if v.shape == (num_groups,) and num_groups != c else v, x.ndim)

    return (y * param(scale) + param(bias)).astype(x.dtype)


def _layer_norm(x, scale, bias=None, axis=-1, epsilon=1e-5, return_stats=False):
    x = _float(np.asarray(x))
    axes = tuple(range(axis % x.ndim, x.ndim))
    y = _normalized(x, axes, epsilon) * np.asarray(scale)
    y = (y if bias is None else y + np.asarray(bias)).astype(x.dtype)
    if not return_stats:
        return y
    mean = x.mean(axis=axes, keepdims=True)
    return y, mean, 1 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + epsilon)


def _lrn(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    x = _float(np.asarray(x))
    lo = (size - 1) // 2
    sq = np.pad(x * x, [(0, 0), (lo, size - 1 - lo)] + [(0, 0)] * (x.ndim - 2))
    sums = sliding_window_view(sq, size, axis=1).sum(axis=-1)
    return (x / (bias + alpha / size * sums) ** beta).astype(x.dtype)


def _mean_variance_normalization(x, axes=None):
    x = _float(np.asarray(x))
    axes = (0, 2, 3) if axes is None else axes if isinstance(axes, tuple) else (axes,)
    d = x - x.mean(axis=axes, keepdims=True)
    return (d / (np.sqrt((d * d).mean(axis=axes, keepdims=True)) + 1e-9)).astype(x.dtype)


def _resize(x, scales=None, sizes=None, mode="nearest", coordinate_transformation_mode="half_pixel",
            nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0,
            axes=None, roi=None, keep_aspect_ratio_policy="stretch", antialias=0):
    x = np.asarray(x)
    steps = nnlib.resize_plan(x.shape, scales, sizes, mode, coordinate_transformation_mode, nearest_mode,
                              cubic_coeff_a, exclude_outside, axes, roi, keep_aspect_ratio_policy, antialias)
    out = x if mode == "nearest" else _float(x)
    for ax, _, idx, coeffs, extrap in steps:
        idx = np.clip(idx, 0, out.shape[ax] - 1)
        if mode == "nearest":
            out = np.take(out, idx[:, 0], axis=ax)
        else:
            shape = (1,) * ax + (idx.shape[0],) + (1,) * (out.ndim - ax - 1)
            res = sum(np.take(out, idx[:, j], axis=ax) * coeffs[:, j].astype(out.dtype).reshape(shape)
                      for j in range(idx.shape[1]))
            out = np.asarray(res, out.dtype)
        if extrap is not None:
            out = np.where(extrap.reshape((1,) * ax + (-1,) + (1,) * (out.ndim - ax - 1)),
                           np.asarray(extrapolation_value, out.dtype), out)
    return out.astype(x.dtype)


def _gather_elements(x, indices, axis=0):
    x, idx = np.asarray(x), np.asarray(indices)
    ax = axis % x.ndim
    part = x[tuple(slice(None) if d == ax else slice(0, s) for d, s in enumerate(idx.shape))]
    return np.take_along_axis(part, _clamp(idx, x.shape[ax]), axis=ax)


def _flat_index(idx: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
    flat = np.zeros(idx.shape[:-1], np.int64)
    for j, n in enumerate(dims):
        flat = flat * n + _clamp(idx[..., j], n)
    return flat


def _gather_nd(x, indices, batch_dims=0):
    x, idx = np.asarray(x), np.asarray(indices)
    b, k = batch_dims, idx.shape[-1]
    dims, rest = x.shape[b:b + k], x.shape[b + k:]
    bsz = int(np.prod(x.shape[:b]))
    flat = _flat_index(idx, dims).reshape(bsz, -1)
    xv = x.reshape((bsz, int(np.prod(dims))) + rest)
    out = xv[np.arange(bsz)[:, None], flat]
    return out.reshape(x.shape[:b] + idx.shape[b:-1] + rest)


_AT: dict[str, Callable[..., Any]] = {"add": np.add.at, "mul": np.multiply.at, "max": np.maximum.at,
                                      "min": np.minimum.at}


def _scatter_elements(x, indices, updates, axis=0, reduction="none"):
    x = np.array(x)
    idx = np.asarray(indices)
    ax = axis % x.ndim
    upd = np.broadcast_to(np.asarray(updates, x.dtype), idx.shape)
    grid = list(np.indices(idx.shape, sparse=True))
    grid[ax] = _clamp(idx, x.shape[ax])
    if reduction == "none":
        x[tuple(grid)] = upd
    else:
        _AT[reduction](x, tuple(grid), upd)
    return x


def _scatter_nd(x, indices, updates, reduction="none"):
    x = np.array(x)
    idx = np.asarray(indices)
    k = idx.shape[-1]
    flat = _flat_index(idx, x.shape[:k]).reshape(-1)
    xv = x.reshape((-1,) + x.shape[k:])
    upd = np.asarray(updates, x.dtype).reshape((-1,) + x.shape[k:])
    if reduction == "none":
        xv[flat] = upd
    else:
        _AT[reduction](xv, flat, upd)
    return xv.reshape(x.shape)


def _one_hot(indices, depth, values=None, axis=-1, dtype=None):
    idx = np.asarray(indices).astype(np.int64)  # float indices truncate, as ONNX casts them
    idx = np.where(idx < 0, idx + depth, idx)
    off, on = (0, 1) if values is None else np.asarray(values).reshape(2)
    ax = axis % (idx.ndim + 1)
    hit = np.expand_dims(idx, ax) == np.arange(depth).reshape((-1,) + (1,) * (idx.ndim - ax))
    out = np.where(hit, on, off)
    if isinstance(dtype, DType):  # bf16 is held as float32, as in numpy_eval
        return out.astype(np.dtype(dtype.fmt) if dtype.fmt else np.float32)
    return out


def _depth_to_space(x, blocksize, mode="DCR"):
    x = np.asarray(x)
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":
        t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return t.reshape(n, c // (b * b), h * b, w * b)


def _space_to_depth(x, blocksize, mode="DCR"):
    x = np.asarray(x)
    n, c, h, w = x.shape
    b = blocksize
    order = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return x.reshape(n, c, h // b, b, w // b, b).transpose(order).reshape(n, c * b * b, h // b, w // b)


def _hardmax(x, axis=-1):
    x = np.asarray(x)
    ax = axis % x.ndim
    hit = np.arange(x.shape[ax]).reshape((-1,) + (1,) * (x.ndim - ax - 1)) == np.expand_dims(x.argmax(axis=ax), ax)
    return hit.astype(x.dtype)


FUNCTIONS: dict[str, Callable[..., Any]] = {name: globals()[f"_{name}"] for name in nnlib.FUNCTIONS}
