"""Neural-network operators with ONNX's semantics (docs/LANGUAGE.md "Neural-network operators (ONNX)").

Contract: each function here is written once in terms of the core tensor ops (elementwise ALU ops,
REDUCE_AXIS, movement ops, WINDOW and the GATHER of `tgc.dsl.indexing`), so it fuses like every other
function and runs on every device. Keyword arguments mirror the attributes of the ONNX operator of the same
meaning (`strides`, `pads` as (begin..., end...) per spatial axis, `dilations`, `group`, `auto_pad`,
`ceil_mode`, ...), with ONNX's defaults; the ONNX importer maps a node's attributes onto them one to one.
Every geometry (output sizes, pads, resize coordinates and weights) is computed at compile time from the
static shapes, so a bad attribute is a `DslError` before anything runs.

Index rule: as everywhere in the language (tgc.dsl.indexing), runtime indices are wrapped once if negative
and then clamped into range (DSL.md has no runtime errors); indices known at compile time (nested tuples of
ints) are checked instead, and an out-of-range one is a compile-time error. one_hot follows ONNX: an index
outside [-depth, depth) gives a row of off values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from tgc.dsl import indexing
from tgc.dsl.tensor import DslError, Tensor, _shape_error
from tgc.dtype import DType, dtypes, promote
from tgc.errors import close_match
from tgc.ir.shapes import prod
from tgc.ir.symsize import type_text
from tgc.ir.uop import Ops, UOp

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


# ------------------------------------------------------------------------------------------------ arguments


def _tensor(x: Any, what: str = "argument") -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float)):
        return Tensor.const(x, Tensor.literal_dtype(x))
    raise DslError(f"{what} must be a tensor or a number, got {type_text(x)}")


def _int(v: Any, name: str) -> int:
    v = _seq(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise DslError(f"{name} must be an integer, got {v!r}")
    return v


def _number(v: Any, name: str) -> float:
    v = _seq(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DslError(f"{name} must be a number, got {v!r}")
    return float(v)


def _flag(v: Any, name: str) -> bool:
    """ONNX's int flags (0/1) or True/False."""
    v = _seq(v)
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise DslError(f"{name} must be 0 or 1 (or False/True), got {v!r}")


def _seq(v: Any) -> Any:
    """Lists and numpy arrays (from Python callers such as an importer) as the tuples the language gives."""
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, list):
        return tuple(_seq(e) for e in v)
    if isinstance(v, np.generic):
        return v.item()
    return v


def _ints(v: Any, n: int, name: str, default: int, positive: bool = True) -> tuple[int, ...]:
    """An int or a tuple of n ints (None: the default for every axis)."""
    if v is None:
        return (default,) * n
    v = _seq(v)
    vals = v if isinstance(v, tuple) else (v,) * n
    if len(vals) != n:
        raise DslError(f"{name} needs {n} values (one per spatial axis), got {len(vals)}")
    out = tuple(_int(a, name) for a in vals)
    if positive and any(a < 1 for a in out):
        raise DslError(f"{name} must be positive, got {list(out)}")
    return out


def _choice(v: Any, name: str, allowed: tuple[str, ...]) -> str:
    if isinstance(v, bytes):  # ONNX's string attributes
        v = v.decode(errors="replace")
    if v not in allowed:
        close = close_match(v, list(allowed)) if isinstance(v, str) else None
        raise DslError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}, got {v!r}",
                       hint=f"did you mean '{close}'?" if close else None)
    return v


def _iota(n: int) -> Tensor:
    return Tensor(UOp(Ops.IOTA, dtypes.i32, (), n))


def _along(v: Tensor, axis: int, ndim: int) -> Tensor:
    """A 1-d tensor laid along `axis` of an ndim-d shape (size 1 elsewhere)."""
    return v.reshape(tuple(v.shape[0] if i == axis else 1 for i in range(ndim)))


def _const_floats(values: list[float], dtype: DType) -> Tensor:
    """A 1-d float tensor of compile-time values: the most common value, with the others picked by position."""
    n = len(values)
    common = max(set(values), key=values.count)
    out = Tensor.const(common, dtype, (n,))
    pos = _iota(n)
    for k, v in enumerate(values):
        if v != common:
            out = (pos == k).where(Tensor.const(v, dtype), out)
    return out


def _lowest(dtype: DType) -> float | int:
    if dtype.is_float:
        return -math.inf
    if dtype.is_unsigned or dtype.is_bool:
        return 0
    return -(1 << (dtype.itemsize * 8 - 1))


def _highest(dtype: DType) -> float | int:
    if dtype.is_float:
        return math.inf
    if dtype.is_bool:
        return 1
    bits = dtype.itemsize * 8
    return (1 << bits) - 1 if dtype.is_unsigned else (1 << (bits - 1)) - 1


def _float_compute(x: Tensor) -> tuple[Tensor, DType]:
    """x in the dtype a float computation runs in (f32 for f16/bf16/ints/bool, else its own), and the dtype
    the result goes back to."""
    out = x.dtype if x.dtype.is_float else dtypes.f32
    return (x.cast(dtypes.f32) if x.dtype.itemsize < 4 or not x.dtype.is_float else x), out


def _spatial(x: Tensor, name: str) -> int:
    if x.ndim < 3:
        raise DslError(f"{name} needs an (N, C, spatial...) input with at least 1 spatial axis, got {x}")
    return x.ndim - 2


# ------------------------------------------------------------------------------------------------ geometry


def window_geometry(name: str, sizes: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...],
              dilations: tuple[int, ...], pads: Any, auto_pad: Any, ceil_mode: bool = False
              ) -> tuple[list[int], list[int], list[int], list[int]]:
    """ONNX's window geometry per spatial axis: (pads before, pads after, extra pads after for ceil_mode,
    output sizes). Windows start at -pad_before and step by the stride; with ceil_mode a last partial window
    is kept where it starts inside the input or the pads before it (ONNX, PyTorch)."""
    n = len(sizes)
    auto_pad = _choice(auto_pad, "auto_pad", AUTO_PADS)
    if auto_pad != "NOTSET" and pads is not None:
        raise DslError(f"{name}: give pads or auto_pad={auto_pad!r}, not both")
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(n):
            out = -(-sizes[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + eff[i] - sizes[i])
            small, big = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else big)
            end.append(big if auto_pad == "SAME_UPPER" else small)
    elif auto_pad == "VALID" or pads is None:
        begin, end = [0] * n, [0] * n
    else:
        p = _ints(pads, 2 * n, "pads", 0, positive=False)
        if any(v < 0 for v in p):
            raise DslError(f"{name}: pads must not be negative, got {list(p)}")
        begin, end = list(p[:n]), list(p[n:])
    outs, extra = [], []
    for i in range(n):
        span = sizes[i] + begin[i] + end[i] - eff[i]
        if span < 0:
            raise _shape_error(f"{name}: the window ({eff[i]} with dilation) is larger than the padded input "
                               f"({sizes[i] + begin[i] + end[i]}) along spatial axis {i}")
        if ceil_mode:
            out = -(-span // strides[i]) + 1
            if (out - 1) * strides[i] >= sizes[i] + begin[i]:
                out -= 1
        else:
            out = span // strides[i] + 1
        outs.append(out)
        extra.append(max(0, (out - 1) * strides[i] + eff[i] - (sizes[i] + begin[i] + end[i])))
    return begin, end, extra, outs


def _windows(t: Tensor, kernel: tuple[int, ...], strides: tuple[int, ...], dilations: tuple[int, ...]) -> Tensor:
    """(N, C, S1..Sn) -> (N, C, O1..On, K1..Kn): the windows as index math (no copy)."""
    n = len(kernel)
    for i in range(n):
        t = t.window(2 + 2 * i, kernel[i], strides[i], dilations[i])
    order = [0, 1] + [2 + 2 * i for i in range(n)] + [3 + 2 * i for i in range(n)]
    return t.permute(order)


def _pad_spatial(t: Tensor, begin: list[int], end: list[int], value: Any = 0) -> Tensor:
    return t.pad(((0, 0), (0, 0)) + tuple(zip(begin, end)), value)


# ------------------------------------------------------------------------------------------------ convolution


def conv(x, w, b=None, strides=None, pads=None, dilations=None, group=1, auto_pad="NOTSET", kernel_shape=None):
    """ONNX Conv: x (N, C, D1..Dn), w (M, C/group, k1..kn), optional bias b (M,)."""
    x, w = _tensor(x, "conv's input"), _tensor(w, "conv's weight")
    n = _spatial(x, "conv")
    if w.ndim != x.ndim:
        raise DslError(f"conv: the weight {w} needs {x.ndim} dims (M, C/group, kernel...) for input {x}")
    group = _int(group, "group")
    if group < 1:
        raise DslError(f"conv: group must be positive, got {group}")
    big_n, c = x.shape[:2]
    m, cg = w.shape[:2]
    ks = w.shape[2:]
    if kernel_shape is not None and _ints(kernel_shape, n, "kernel_shape", 1) != ks:
        raise _shape_error(f"conv: kernel_shape {list(kernel_shape)} differs from the weight's {list(ks)}")
    if c != cg * group:
        raise _shape_error(f"conv: input has {c} channels, the weight expects {cg} x {group} groups")
    if m % group:
        raise _shape_error(f"conv: {m} output channels do not split into {group} groups")
    strides, dilations = _ints(strides, n, "strides", 1), _ints(dilations, n, "dilations", 1)
    begin, end, _, outs = window_geometry("conv", x.shape[2:], ks, strides, dilations, pads, auto_pad)
    dtype = promote(x.dtype, w.dtype)
    win = _windows(_pad_spatial(x.cast(dtype), begin, end), ks, strides, dilations)  # (N, C, O.., K..)
    mg = m // group
    outs_t = tuple(outs)
    xw = win.reshape((big_n, group, 1, cg) + outs_t + ks)
    ww = w.cast(dtype).reshape((1, group, mg, cg) + (1,) * n + ks)
    full = (big_n, group, mg, cg) + outs_t + ks
    out = (xw.expand(full) * ww.expand(full)).sum(axis=(3,) + tuple(range(4 + n, 4 + 2 * n)))
    out = out.reshape((big_n, m) + outs_t).cast(dtype)
    if b is not None:
        bt = _tensor(b, "conv's bias")
        if bt.shape != (m,):
            raise _shape_error(f"conv: the bias {bt} must have shape [{m}]")
        out = out + bt.cast(dtype).reshape((1, m) + (1,) * n)
    return out


def conv_transpose_geometry(x_shape: tuple[int, ...], w_shape: tuple[int, ...], strides: Any, pads: Any,
                            dilations: Any, group: Any, auto_pad: Any, output_padding: Any, output_shape: Any,
                            kernel_shape: Any) -> tuple[tuple[int, ...], tuple[int, ...], list[int], list[int]]:
    """ConvTranspose as a conv of the stride-dilated input: (strides, dilations, pads before, pads after) of
    that input (negative pads crop), checked as ONNX says."""
    n = len(x_shape) - 2
    if n < 1:
        raise DslError(f"conv_transpose needs an (N, C, spatial...) input, got {list(x_shape)}")
    if len(w_shape) != len(x_shape):
        raise DslError(f"conv_transpose: the weight {list(w_shape)} needs {len(x_shape)} dims (C, M/group, kernel...)")
    group = _int(group, "group")
    if group < 1:
        raise DslError(f"conv_transpose: group must be positive, got {group}")
    c = x_shape[1]
    if w_shape[0] != c or c % group:
        raise _shape_error(f"conv_transpose: the weight {list(w_shape)} needs {c} input channels divisible by "
                           f"{group} groups")
    ks = w_shape[2:]
    if kernel_shape is not None and _ints(kernel_shape, n, "kernel_shape", 1) != ks:
        raise _shape_error(f"conv_transpose: kernel_shape {list(kernel_shape)} differs from the weight's {list(ks)}")
    strides, dilations = _ints(strides, n, "strides", 1), _ints(dilations, n, "dilations", 1)
    outpad = _ints(output_padding, n, "output_padding", 0, positive=False)
    auto_pad = _choice(auto_pad, "auto_pad", AUTO_PADS)
    if any(p < 0 or (p >= s and p >= d) for p, s, d in zip(outpad, strides, dilations)):
        raise DslError(f"conv_transpose: output_padding {list(outpad)} must be smaller than the strides or "
                       f"the dilations")
    sizes = x_shape[2:]
    eff = [(k - 1) * d + 1 for k, d in zip(ks, dilations)]
    full_len = [s * (i - 1) + op + e for s, i, op, e in zip(strides, sizes, outpad, eff)]
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if pads is not None:
            raise DslError("conv_transpose: give pads, or output_shape/auto_pad, not both")
        if output_shape is not None:
            shp = _seq(output_shape) if isinstance(_seq(output_shape), tuple) else (output_shape,)
            shp = shp[-n:] if len(shp) == n + 2 else shp
            target = _ints(shp, n, "output_shape", 1)
        else:
            target = tuple(i * s for i, s in zip(sizes, strides))
        begin, end = [], []
        for fl, t in zip(full_len, target):
            total = fl - t  # negative: an output_shape past the full output, zeros (and the bias) beyond it
            small, big = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else big)
            end.append(big if auto_pad == "SAME_UPPER" else small)
    elif pads is None or auto_pad == "VALID":
        if pads is not None:
            raise DslError("conv_transpose: give pads or auto_pad='VALID', not both")
        begin, end = [0] * n, [0] * n
    else:
        p = _ints(pads, 2 * n, "pads", 0, positive=False)
        if any(v < 0 for v in p):
            raise DslError(f"conv_transpose: pads must not be negative, got {list(p)}")
        begin, end = list(p[:n]), list(p[n:])
    outs = [fl - b_ - e_ for fl, b_, e_ in zip(full_len, begin, end)]
    if any(o < 1 for o in outs):
        raise _shape_error(f"conv_transpose: the pads leave an empty output {outs}")
    # full padding eff-1 on both sides, output_padding after, minus the requested pads (negative crops)
    pb = [e - 1 - b_ for e, b_ in zip(eff, begin)]
    pe = [e - 1 - e_ + op for e, e_, op in zip(eff, end, outpad)]
    return strides, dilations, pb, pe


def conv_transpose(x, w, b=None, strides=None, pads=None, dilations=None, group=1, auto_pad="NOTSET",
                   output_padding=None, output_shape=None, kernel_shape=None):
    """ONNX ConvTranspose: x (N, C, D1..Dn), w (C, M/group, k1..kn); the gradient of conv, computed as a conv
    of the stride-dilated input with the flipped kernel."""
    x, w = _tensor(x, "conv_transpose's input"), _tensor(w, "conv_transpose's weight")
    strides, dilations, pb, pe = conv_transpose_geometry(x.shape, w.shape, strides, pads, dilations, group,
                                                         auto_pad, output_padding, output_shape, kernel_shape)
    n = x.ndim - 2
    c, mg, ks = x.shape[1], w.shape[1], w.shape[2:]
    dtype = promote(x.dtype, w.dtype)
    t = x.cast(dtype)
    for i, s in enumerate(strides):  # s - 1 zeros between neighbours: (.., D) -> (.., (D - 1) * s + 1)
        if s > 1:
            ax = 2 + i
            d = t.shape[ax]
            t = t.unsqueeze(ax + 1).pad(tuple((0, s - 1) if a == ax + 1 else (0, 0) for a in range(t.ndim + 1)))
            t = t.reshape(t.shape[:ax] + (d * s,) + t.shape[ax + 2:])
            t = t.shrink(tuple((0, (d - 1) * s + 1) if a == ax else (0, v) for a, v in enumerate(t.shape)))
    t = t.pad(((0, 0), (0, 0)) + tuple(zip(pb, pe)))
    # weight (G, C/G, Mg, k..) -> (G, Mg, C/G, k..) = (M, C/G, k..), spatially flipped
    cg = c // group
    wt = w.cast(dtype).reshape((group, cg, mg) + ks).permute((0, 2, 1) + tuple(range(3, 3 + n)))
    wt = wt.reshape((group * mg, cg) + ks).flip(tuple(range(2, 2 + n)))
    return conv(t, wt, b, dilations=dilations, group=group)


# ------------------------------------------------------------------------------------------------ pooling


def pool_geometry(shape: tuple[int, ...], name: str, kernel_shape: Any, strides: Any, pads: Any, dilations: Any,
                  ceil_mode: Any, auto_pad: Any) -> tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...],
                                                          list[int], list[int], list[int], list[int]]:
    """A pool's checked geometry: (spatial axes, kernel, strides, dilations, pads before, pads after, extra
    pads after for ceil_mode, output sizes)."""
    n = len(shape) - 2
    if n < 1:
        raise DslError(f"{name} needs an (N, C, spatial...) input with at least 1 spatial axis, got {list(shape)}")
    if kernel_shape is None:
        raise DslError(f"{name} needs kernel_shape")
    ks = _ints(kernel_shape, n, "kernel_shape", 1)
    strides, dilations = _ints(strides, n, "strides", 1), _ints(dilations, n, "dilations", 1)
    begin, end, extra, outs = window_geometry(name, shape[2:], ks, strides, dilations, pads, auto_pad,
                                        _flag(ceil_mode, "ceil_mode"))
    for i in range(n):
        if begin[i] >= (ks[i] - 1) * dilations[i] + 1 or end[i] >= (ks[i] - 1) * dilations[i] + 1:
            raise DslError(f"{name}: pads {begin[i]}, {end[i]} must be smaller than the window along spatial "
                           f"axis {i}")
    return n, ks, strides, dilations, begin, end, extra, outs


def max_pool(x, kernel_shape=None, strides=None, pads=None, dilations=None, ceil_mode=0, auto_pad="NOTSET",
             storage_order=0, return_indices=False):
    """ONNX MaxPool; with return_indices=True also the i64 indices of the maxima into the flattened input
    (row-major, or column-major per (n, c) image with storage_order=1), first maximum of a window on ties."""
    x = _tensor(x, "max_pool's input")
    n, ks, strides, dilations, begin, end, extra, outs = pool_geometry(
        x.shape, "max_pool", kernel_shape, strides, pads, dilations, ceil_mode, auto_pad)
    end_all = [e + x_ for e, x_ in zip(end, extra)]
    xt = x.cast(dtypes.u8) if x.dtype.is_bool else x
    win = _windows(_pad_spatial(xt, begin, end_all, _lowest(xt.dtype)), ks, strides, dilations)
    kaxes = tuple(range(2 + n, 2 + 2 * n))
    values = win.max(kaxes)
    if x.dtype.is_bool:
        values = values.cast(dtypes.bool)
    if not _flag(return_indices, "return_indices"):
        return values
    order = _flag(storage_order, "storage_order")
    sizes = x.shape[2:]
    plane = prod(sizes)
    # the row-major position of every input element within its image, windowed like the values
    pos = Tensor.const(0, dtypes.i64, ())
    step = 1
    for i in reversed(range(n)):
        pos = pos + _along(_iota(sizes[i]).cast(dtypes.i64), i, n) * step
        step *= sizes[i]
    pos = pos.expand(sizes).reshape((1, 1) + sizes)
    pwin = _windows(_pad_spatial(pos, begin, end_all, plane), ks, strides, dilations)
    is_max = win == values.reshape(values.shape + (1,) * n)
    first = is_max.where(pwin, Tensor.const(plane, dtypes.i64)).min(kaxes)  # (N, C, O..)
    if order:  # the same element's column-major position
        col, rest, cstep = Tensor.const(0, dtypes.i64, ()), first, 1
        rsteps = [prod(sizes[i + 1:]) for i in range(n)]
        for i in range(n):
            coord = rest // rsteps[i]
            rest = rest - coord * rsteps[i]
            col = col + coord * cstep
            cstep *= sizes[i]
        first = col
    big_n, c = x.shape[:2]
    image = (_along(_iota(big_n).cast(dtypes.i64), 0, 2 + n) * c + _along(_iota(c).cast(dtypes.i64), 1, 2 + n))
    return values, first + image * plane


def window_counts(size: int, begin: int, end: int, k: int, s: int, d: int, out: int, include_pad: bool) -> list[int]:
    """How many window positions of each output fall in the input (or in input + pads: never in the extra
    positions of ceil_mode), along one axis; windows start at -begin."""
    lo, hi = (0, size + begin + end) if include_pad else (begin, begin + size)
    return [sum(1 for j in range(k) if lo <= o * s + j * d < hi) for o in range(out)]


def avg_pool(x, kernel_shape=None, strides=None, pads=None, dilations=None, ceil_mode=0, count_include_pad=0,
             auto_pad="NOTSET"):
    """ONNX AveragePool: the window sum over the elements counted (the input's, plus the pads with
    count_include_pad=1; never the extra positions of ceil_mode)."""
    x = _tensor(x, "avg_pool's input")
    n, ks, strides, dilations, begin, end, extra, outs = pool_geometry(
        x.shape, "avg_pool", kernel_shape, strides, pads, dilations, ceil_mode, auto_pad)
    include = _flag(count_include_pad, "count_include_pad")
    xt, back = _float_compute(x)
    win = _windows(_pad_spatial(xt, begin, [e + x_ for e, x_ in zip(end, extra)]), ks, strides, dilations)
    total = win.sum(tuple(range(2 + n, 2 + 2 * n)))
    for i in range(n):
        counts = window_counts(x.shape[2 + i], begin[i], end[i], ks[i], strides[i], dilations[i], outs[i], include)
        if any(cnt == 0 for cnt in counts):
            raise _shape_error("avg_pool: a window covers no element")
        recips = [1.0 / cnt for cnt in counts]
        if len(set(recips)) == 1:
            total = total * recips[0]
        else:
            total = total * _along(_const_floats(recips, total.dtype), 2 + i, 2 + n)
    return total.cast(back)


def lp_pool(x, kernel_shape=None, strides=None, pads=None, dilations=None, ceil_mode=0, auto_pad="NOTSET", p=2):
    """ONNX LpPool: (sum over the window of |x|^p)^(1/p), zero pads."""
    x = _tensor(x, "lp_pool's input")
    n, ks, strides, dilations, begin, end, extra, outs = pool_geometry(
        x.shape, "lp_pool", kernel_shape, strides, pads, dilations, ceil_mode, auto_pad)
    p = _int(p, "p")
    if p < 1:
        raise DslError(f"lp_pool: p must be positive, got {p}")
    xt, back = _float_compute(x)
    win = _windows(_pad_spatial(xt.abs(), begin, [e + x_ for e, x_ in zip(end, extra)]), ks, strides, dilations)
    total = win.pow(p).sum(tuple(range(2 + n, 2 + 2 * n)))
    return (total if p == 1 else total.pow(1.0 / p)).cast(back)


def global_avg_pool(x):
    """ONNX GlobalAveragePool: the mean over every spatial axis, kept as size 1."""
    t = _tensor(x, "global_avg_pool's input")
    n = _spatial(t, "global_avg_pool")
    xt, back = _float_compute(t)
    return xt.mean(tuple(range(2, 2 + n)), keepdim=True).cast(back)


def global_max_pool(x):
    """ONNX GlobalMaxPool: the max over every spatial axis, kept as size 1."""
    t = _tensor(x, "global_max_pool's input")
    n = _spatial(t, "global_max_pool")
    return t.max(tuple(range(2, 2 + n)), keepdim=True)


def global_lp_pool(x, p=2):
    """ONNX GlobalLpPool: (sum over the spatial axes of |x|^p)^(1/p), kept as size 1."""
    t = _tensor(x, "global_lp_pool's input")
    n = _spatial(t, "global_lp_pool")
    p = _int(p, "p")
    if p < 1:
        raise DslError(f"global_lp_pool: p must be positive, got {p}")
    xt, back = _float_compute(t)
    total = xt.abs().pow(p).sum(tuple(range(2, 2 + n)), keepdim=True)
    return (total if p == 1 else total.pow(1.0 / p)).cast(back)


# ------------------------------------------------------------------------------------------------ normalization


def _per_channel(v: Any, c: int, ndim: int, name: str, what: str) -> Tensor:
    t = _tensor(v, f"{name}'s {what}")
    if t.shape != (c,):
        raise _shape_error(f"{name}: {what} {t} must have one value per channel: shape [{c}]")
    return _along(t, 1, ndim)


def batch_norm(x, scale, bias, mean, var, epsilon=1e-5, training_mode=0, momentum=0.9):
    """ONNX BatchNormalization: (x - mean) / sqrt(var + epsilon) * scale + bias along axis 1. With
    training_mode=1 (opset 14+), the batch's own mean and variance (over every axis but 1) normalize, and it
    returns (y, running_mean, running_var) = (y, mean * momentum + batch mean * (1 - momentum), likewise var)."""
    t = _tensor(x, "batch_norm's input")
    if t.ndim < 2:
        raise DslError(f"batch_norm needs an (N, C, ...) input, got {t}")
    eps = _number(epsilon, "epsilon")
    training = _flag(training_mode, "training_mode")
    mom = _number(momentum, "momentum")
    c = t.shape[1]
    xt, back = _float_compute(t)
    sc, bi, mu, va = (_per_channel(v, c, t.ndim, "batch_norm", w).cast(xt.dtype)
                      for v, w in ((scale, "scale"), (bias, "bias"), (mean, "mean"), (var, "var")))
    if not training:
        return ((xt - mu) * (va + eps).rsqrt() * sc + bi).cast(back)
    axes = (0,) + tuple(range(2, t.ndim))
    batch_mu = xt.mean(axes, keepdim=True)
    d = xt - batch_mu
    batch_var = (d * d).mean(axes, keepdim=True)
    y = (d * (batch_var + eps).rsqrt() * sc + bi).cast(back)
    running_mean = (mu * mom + batch_mu * (1 - mom)).reshape((c,)).cast(back)
    running_var = (va * mom + batch_var * (1 - mom)).reshape((c,)).cast(back)
    return y, running_mean, running_var


def _normalize(xt: Tensor, axes: tuple[int, ...], eps: float) -> Tensor:
    mu = xt.mean(axes, keepdim=True)
    d = xt - mu
    return d * ((d * d).mean(axes, keepdim=True) + eps).rsqrt()


def instance_norm(x, scale, bias, epsilon=1e-5):
    """ONNX InstanceNormalization: each (n, c) image normalized over its spatial axes, then scale and bias."""
    t = _tensor(x, "instance_norm's input")
    n = _spatial(t, "instance_norm")
    eps = _number(epsilon, "epsilon")
    c = t.shape[1]
    xt, back = _float_compute(t)
    sc = _per_channel(scale, c, t.ndim, "instance_norm", "scale").cast(xt.dtype)
    bi = _per_channel(bias, c, t.ndim, "instance_norm", "bias").cast(xt.dtype)
    return (_normalize(xt, tuple(range(2, 2 + n)), eps) * sc + bi).cast(back)


def group_norm(x, scale, bias, num_groups, epsilon=1e-5):
    """ONNX GroupNormalization: channels split into num_groups groups, each normalized over its channels and
    spatial axes; scale and bias per channel (opset 21), or per group (opset 18) when given num_groups values."""
    t = _tensor(x, "group_norm's input")
    if t.ndim < 2:
        raise DslError(f"group_norm needs an (N, C, ...) input, got {t}")
    g = _int(num_groups, "num_groups")
    eps = _number(epsilon, "epsilon")
    big_n, c = t.shape[:2]
    if g < 1 or c % g:
        raise _shape_error(f"group_norm: {c} channels do not split into {g} groups")
    xt, back = _float_compute(t)
    grouped = xt.reshape((big_n, g, (c // g) * prod(t.shape[2:])))
    y = _normalize(grouped, (2,), eps).reshape(t.shape)

    def param(v: Any, what: str) -> Tensor:
        p = _tensor(v, f"group_norm's {what}")
        if p.shape == (g,) and g != c:
            p = p.reshape((g, 1)).expand((g, c // g)).reshape((c,))
        return _per_channel(p, c, t.ndim, "group_norm", what).cast(xt.dtype)

    return (y * param(scale, "scale") + param(bias, "bias")).cast(back)


def layer_norm(x, scale, bias=None, axis=-1, epsilon=1e-5, return_stats=False):
    """ONNX LayerNormalization: normalized over the axes from `axis` to the last, then scale (and bias),
    which broadcast against those axes. return_stats=True also returns ONNX's Mean and InvStdDev outputs
    (size 1 over the normalized axes, in the computation's dtype: f32 for f16/bf16)."""
    t = _tensor(x, "layer_norm's input")
    if t.ndim == 0:
        raise DslError("layer_norm needs at least 1 dim")
    ax = t._axis(_int(axis, "axis"))
    eps = _number(epsilon, "epsilon")
    stats = _flag(return_stats, "return_stats")
    xt, back = _float_compute(t)
    axes = tuple(range(ax, t.ndim))
    mu = xt.mean(axes, keepdim=True)
    d = xt - mu
    inv = ((d * d).mean(axes, keepdim=True) + eps).rsqrt()
    y = d * inv
    norm_shape = t.shape[ax:]
    for v, what in ((scale, "scale"), (bias, "bias")):
        if v is None:
            continue
        p = _tensor(v, f"layer_norm's {what}")
        if p.ndim > len(norm_shape) or any(a not in (1, b) for a, b in zip(p.shape[::-1], norm_shape[::-1])):
            raise _shape_error(f"layer_norm: {what} {p} does not broadcast against the normalized axes "
                               f"{list(norm_shape)}")
        y = y * p.cast(xt.dtype) if what == "scale" else y + p.cast(xt.dtype)
    return (y.cast(back), mu, inv) if stats else y.cast(back)


def lrn(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    """ONNX LRN: x / (bias + alpha / size * sum of x^2 over `size` neighbouring channels)^beta."""
    t = _tensor(x, "lrn's input")
    if t.ndim < 2:
        raise DslError(f"lrn needs an (N, C, ...) input, got {t}")
    size = _int(size, "size")
    if size < 1:
        raise DslError(f"lrn: size must be positive, got {size}")
    alpha, beta, bias = _number(alpha, "alpha"), _number(beta, "beta"), _number(bias, "bias")
    xt, back = _float_compute(t)
    sq = xt * xt
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    padded = sq.pad(tuple((lo, hi) if a == 1 else (0, 0) for a in range(t.ndim)))
    sums = padded.window(1, size, 1, 1)._reduce(Ops.ADD, 2, False)  # (N, C, K, ...) summed over K
    return (xt / (bias + (alpha / size) * sums).pow(beta)).cast(back)


def mean_variance_normalization(x, axes=None):
    """ONNX MeanVarianceNormalization: (x - mean) / (sqrt(var) + 1e-9) over `axes` (None: ONNX's (0, 2, 3))."""
    t = _tensor(x, "mean_variance_normalization's input")
    if axes is None:
        axes = (0, 2, 3)
    axes = _seq(axes)
    axs = axes if isinstance(axes, tuple) else (axes,)
    axs = tuple(sorted({t._axis(_int(a, "axes")) for a in axs}))
    xt, back = _float_compute(t)
    d = xt - xt.mean(axs, keepdim=True)
    return (d / ((d * d).mean(axs, keepdim=True).sqrt() + 1e-9)).cast(back)


# ------------------------------------------------------------------------------------------------ resize

RESIZE_MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_crop_and_resize", "tf_half_pixel_for_nn")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


def _antialias_row(mode: str, r: float, scale: float, a: float) -> list[float]:
    """onnx.reference's antialiased weights (downsampling widens the filter by 1 / scale), normalized."""
    s = min(scale, 1.0)
    if mode == "linear":
        start = int(math.floor(-1 / s) + 1)
        args = [(i - r) * s for i in range(start, start + 2 - 2 * start)]
        w = [min(max(1 - abs(v), 0.0), 1.0) for v in args]
    else:
        start = int(math.floor(-2 / s) + 1)

        def cubic(v: float) -> float:
            v = abs(v)
            if v <= 1:
                return (a + 2) * v ** 3 - (a + 3) * v * v + 1
            return a * v ** 3 - 5 * a * v * v + 8 * a * v - 4 * a if v < 2 else 0.0

        w = [cubic(s * (i - r)) for i in range(start, 2 - start)]
    total = sum(w)
    return [v / total for v in w]


def _resize_taps(mode: str, coord: str, nearest: str, a: float, exclude: bool, size: int, out: int, scale: float,
                 roi: tuple[float, float] | None, antialias: bool = False
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """ONNX Resize along one axis, at compile time: (indices (out, taps), weights (out, taps), extrapolated
    positions or None), as onnx.reference computes them."""
    width = scale * size
    y = np.arange(out, dtype=np.float64)
    extrap = None
    if coord == "align_corners":
        xo = np.zeros(out) if width == 1 else y * (size - 1) / (width - 1)
    elif coord == "asymmetric":
        xo = y / scale
    elif coord == "tf_crop_and_resize":
        r0, r1 = roi if roi is not None else (0.0, 1.0)
        xo = np.full(out, (r1 - r0) * (size - 1) / 2) if width == 1 else y * (r1 - r0) * (size - 1) / (width - 1)
        xo = xo + r0 * (size - 1)
        extrap = (xo < 0) | (xo > size - 1)
    elif coord == "pytorch_half_pixel":
        xo = np.full(out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif coord == "half_pixel":
        xo = (y + 0.5) / scale - 0.5
    elif coord == "tf_half_pixel_for_nn":  # opset 11 only
        xo = (y + 0.5) / scale
    else:  # half_pixel_symmetric
        xo = size / 2 * (1 - out / width) + (y + 0.5) / scale - 0.5
    base = np.floor(xo)
    ratios = np.where(xo == base, 1.0, xo - base)
    rows = []
    for r in ratios:
        if mode == "nearest":
            if float(r).is_integer():
                rows.append([0.0, 1.0])
            elif nearest == "round_prefer_floor":
                rows.append([float(r <= 0.5), float(r > 0.5)])
            elif nearest == "round_prefer_ceil":
                rows.append([float(r < 0.5), float(r >= 0.5)])
            else:
                rows.append([1.0, 0.0] if nearest == "floor" else [0.0, 1.0])
        elif antialias:
            rows.append(_antialias_row(mode, float(r), scale, a))
        elif mode == "linear":
            rows.append([1 - r, r])
        else:
            rows.append([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                         ((a + 2) * r - (a + 3)) * r * r + 1,
                         ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
                         ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a])
    coeffs = np.array(rows, dtype=np.float64).reshape(out, -1)
    taps = coeffs.shape[1]
    half = -(-taps // 2)
    xp = xo + half
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if taps % 2 == 0:
        offset = np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((taps - 1) // 2), -((taps - 1) // 2) + 1)
    idx = (p + offset)[:, None] + np.arange(taps)[None, :] - half
    if exclude:
        coeffs = np.where((idx < 0) | (idx >= size), 0.0, coeffs)
        sums = coeffs.sum(axis=-1, keepdims=True)
        coeffs = coeffs / np.where(sums == 0, 1.0, sums)
    return idx, coeffs, extrap  # indices past the edges: the consumer clamps them into [0, size) (edge padding)


def resize_plan(shape: tuple[int, ...], scales: Any = None, sizes: Any = None, mode: Any = "nearest",
                coordinate_transformation_mode: Any = "half_pixel", nearest_mode: Any = "round_prefer_floor",
                cubic_coeff_a: Any = -0.75, exclude_outside: Any = 0, axes: Any = None, roi: Any = None,
                keep_aspect_ratio_policy: Any = "stretch", antialias: Any = 0
                ) -> list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray | None]]:
    """ONNX Resize of a tensor of `shape`, checked, as steps one axis after the other: (axis, output size,
    source indices (out, taps) before clamping into [0, size), weights (out, taps), extrapolated positions or
    None). Nearest has one tap."""
    ndim = len(shape)
    mode = _choice(mode, "mode", RESIZE_MODES)
    coord = _choice(coordinate_transformation_mode, "coordinate_transformation_mode", COORDINATE_MODES)
    nearest = _choice(nearest_mode, "nearest_mode", NEAREST_MODES)
    policy = _choice(keep_aspect_ratio_policy, "keep_aspect_ratio_policy", ASPECT_POLICIES)
    a = _number(cubic_coeff_a, "cubic_coeff_a")
    exclude = _flag(exclude_outside, "exclude_outside")
    smooth = _flag(antialias, "antialias")
    scales, sizes, axes, roi = _seq(scales), _seq(sizes), _seq(axes), _seq(roi)
    if smooth and mode == "nearest":
        raise DslError("resize: antialias needs mode 'linear' or 'cubic'")

    def axis(v: Any) -> int:
        v = _int(v, "axes")
        if not -ndim <= v < ndim:
            raise DslError(f"resize: axis {v} is out of range for {ndim} dims")
        return v % ndim

    axs = tuple(range(ndim)) if axes is None else tuple(axis(v) for v in (axes if isinstance(axes, tuple)
                                                                          else (axes,)))
    if len(set(axs)) != len(axs):
        raise DslError(f"resize: repeated axis in axes {list(axs)}")
    if (scales is None) == (sizes is None):
        raise DslError("resize needs scales or sizes (one of them)")
    k = len(axs)
    if scales is not None:
        sc = scales if isinstance(scales, tuple) else (scales,)
        if len(sc) != k:
            raise DslError(f"resize: {len(sc)} scales for {k} axes")
        factors = [_number(v, "scales") for v in sc]
        if any(f <= 0 for f in factors):
            raise DslError(f"resize: scales must be positive, got {list(sc)}")
        outs = [int(f * shape[ax]) for f, ax in zip(factors, axs)]
    else:
        sz = sizes if isinstance(sizes, tuple) else (sizes,)
        if len(sz) != k:
            raise DslError(f"resize: {len(sz)} sizes for {k} axes")
        outs = [_int(v, "sizes") for v in sz]
        if any(o < 1 for o in outs):
            raise DslError(f"resize: sizes must be positive, got {list(sz)}")
        if any(shape[ax] == 0 for ax in axs):
            raise _shape_error(f"resize: cannot resize an empty axis of {list(shape)}")
        factors = [o / shape[ax] for o, ax in zip(outs, axs)]
        if policy != "stretch":
            f = min(factors) if policy == "not_larger" else max(factors)
            factors = [f] * k
            outs = [int(f * shape[ax] + 0.5) for ax in axs]
    rois: list[tuple[float, float] | None] = [None] * k
    if coord == "tf_crop_and_resize":
        if roi is None:
            raise DslError("resize: coordinate_transformation_mode='tf_crop_and_resize' needs roi")
        rv = [_number(v, "roi") for v in (roi if isinstance(roi, tuple) else (roi,))]
        if len(rv) == 2 * ndim and k != ndim:
            rv = [rv[ax] for ax in axs] + [rv[ndim + ax] for ax in axs]
        if len(rv) != 2 * k:
            raise DslError(f"resize: roi needs {2 * k} values (starts, then ends), got {len(rv)}")
        rois = [(rv[i], rv[k + i]) for i in range(k)]
    steps = []
    for ax, f, out, r in zip(axs, factors, outs, rois):
        size = shape[ax]
        if math.isclose(f, 1.0) and out == size and (r is None or (math.isclose(r[0], 0) and math.isclose(r[1], 1))):
            continue
        if out > 0 and size == 0:
            raise _shape_error(f"resize: cannot resize an empty axis of {list(shape)}")
        idx, coeffs, extrap = _resize_taps(mode, coord, nearest, a, exclude, size, out, f, r, smooth)
        if mode == "nearest":
            idx = np.take_along_axis(idx, np.argmax(coeffs, axis=1)[:, None], axis=1)
            coeffs = np.ones_like(idx, dtype=np.float64)
        steps.append((ax, out, idx, coeffs, extrap if extrap is not None and extrap.any() else None))
    return steps


def _period(idx: np.ndarray, coeffs: np.ndarray, longest: int = 16) -> tuple[int, np.ndarray] | None:
    """(q, steps per tap) where the unclamped indices advance by a fixed step and the weights repeat every q
    outputs (a rational scale), for q up to `longest`; None when the pattern is longer (or there is none)."""
    out = idx.shape[0]
    for q in range(1, min(longest, out - 1) + 1):
        step = idx[q] - idx[0]
        if (idx[q:] - idx[:-q] == step).all() and np.allclose(coeffs[q:], coeffs[:-q], rtol=0, atol=1e-12):
            return q, step
    return None


def _by_phase(phase: Tensor, values: list, dtype: DType) -> Tensor:
    """values[phase] for a small list of compile-time values (a `where` per value that differs from the last)."""
    out = Tensor.const(values[-1], dtype, phase.shape)
    for k, v in enumerate(values[:-1]):
        if v != values[-1]:
            out = (phase == k).where(Tensor.const(v, dtype), out)
    return out


def resize(x, scales=None, sizes=None, mode="nearest", coordinate_transformation_mode="half_pixel",
           nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0,
           axes=None, roi=None, keep_aspect_ratio_policy="stretch", antialias=0):
    """ONNX Resize: by scales or by sizes, for any number of axes (all, or `axes`), one axis after the other;
    the source positions and weights are compile-time constants."""
    t = _tensor(x, "resize's input")
    mode = _choice(mode, "mode", RESIZE_MODES)
    fill = _number(extrapolation_value, "extrapolation_value")
    steps = resize_plan(t.shape, scales, sizes, mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a,
                        exclude_outside, axes, roi, keep_aspect_ratio_policy, antialias)
    compute = t if mode == "nearest" else _float_compute(t)[0]
    for ax, out, idx, coeffs, extrap in steps:
        res = None
        size = compute.shape[ax]
        period = _period(idx, coeffs)
        for j in range(idx.shape[1]):
            if not coeffs[:, j].any():
                continue
            if period is None:
                src = indexing.const_vector(tuple(int(v) for v in np.clip(idx[:, j], 0, size - 1)))
                weights = _const_floats([float(v) for v in coeffs[:, j]], compute.dtype)
            else:  # idx[o] = idx[o % q] + (o // q) * step, clamped; the weights repeat every q outputs
                q, step = period
                phase, block = _iota(out) % q, _iota(out) // q
                src = _by_phase(phase, [int(v) for v in idx[:q, j]], dtypes.i32) + block * int(step[j])
                src = src.maximum(0).minimum(size - 1)
                weights = _by_phase(phase, [float(v) for v in coeffs[:q, j]], compute.dtype)
            g = indexing.take(compute, src, axis=ax)
            term = g if (coeffs[:, j] == 1).all() else g * _along(weights, ax, compute.ndim)
            res = term if res is None else res + term
        if res is None:
            res = Tensor.const(0, compute.dtype, compute.shape[:ax] + (out,) + compute.shape[ax + 1:])
        if extrap is not None:
            mask = indexing.const_vector(tuple(int(v) for v in extrap)) != 0
            res = _along(mask, ax, res.ndim).where(Tensor.const(fill, res.dtype), res)
        compute = res
    return compute.cast(t.dtype)


# ------------------------------------------------------------------------------------------------ indices


def _nested_ints(v: Any) -> tuple[list[int], tuple[int, ...]] | None:
    """A nested tuple of ints as (flat values, shape), or None when v is not one."""
    if isinstance(v, bool) or not isinstance(v, (int, tuple)):
        return None
    if isinstance(v, int):
        return [v], ()
    if not v:
        return [], (0,)
    parts = [_nested_ints(e) for e in v]
    if any(p is None for p in parts) or len({p[1] for p in parts}) != 1:  # type: ignore[index]
        return None
    return [x for p in parts for x in p[0]], (len(v),) + parts[0][1]  # type: ignore[index]


def _index_arg(v: Any, what: str) -> tuple[Tensor, list[int] | None]:
    """Indices as an int tensor, with their values when they are compile-time ints (for range checks)."""
    v = _seq(v)
    if isinstance(v, Tensor):
        return indexing.index_tensor(v, what), None
    nested = _nested_ints(v)
    if nested is None:
        raise DslError(f"{what} must be an int tensor or (nested) tuples of ints, got {v!r}")
    flat, shape = nested
    t = indexing.const_vector(tuple(flat)) if flat else Tensor.const(0, dtypes.i64, (0,))
    return t.reshape(shape), flat


def _check_range(values: list[int] | None, n: int, what: str) -> None:
    for v in values or ():
        if not -n <= v < n:
            raise _shape_error(f"{what}: index {v} is out of range for an axis of size {n}")


def gather_elements(x, indices, axis=0):
    """ONNX GatherElements: out[..., i, ...] = x[..., indices[..., i, ...], ...] along `axis`; indices of x's
    rank, at most x's sizes off the axis; negative indices count from the end."""
    t = _tensor(x, "gather_elements' input")
    ax = t._axis(_int(axis, "axis"))
    idx, known = _index_arg(indices, "indices")
    _check_range(known, t.shape[ax], "gather_elements")
    if idx.ndim != t.ndim:
        raise DslError(f"gather_elements: indices {idx} and input {t} must have the same number of dims")
    if any(i > s for d, (i, s) in enumerate(zip(idx.shape, t.shape)) if d != ax):
        raise _shape_error(f"gather_elements: indices {idx} are larger than the input {t} off axis {ax}")
    part = t.shrink(tuple((0, s) if d == ax else (0, i) for d, (i, s) in enumerate(zip(idx.shape, t.shape))))
    return indexing.gather(part, idx, ax)


def _wrap_clamp(idx: Tensor, n: int) -> Tensor:
    return indexing._wrap_clamp(idx, max(n, 1)).cast(dtypes.i64)


def gather_nd(x, indices, batch_dims=0):
    """ONNX GatherND: indices (b..., q..., k) pick slices x[b..., i1..ik] after the batch_dims leading axes."""
    t = _tensor(x, "gather_nd's input")
    idx, known = _index_arg(indices, "indices")
    b = _int(batch_dims, "batch_dims")
    if idx.ndim < 1:
        raise DslError("gather_nd: indices need at least 1 dim")
    k = idx.shape[-1]
    if b < 0 or b >= min(t.ndim, idx.ndim) or b + k > t.ndim:
        raise DslError(f"gather_nd: batch_dims={b} with index tuples of {k} does not fit input {t} and "
                       f"indices {idx}")
    if t.shape[:b] != idx.shape[:b]:
        raise _shape_error(f"gather_nd: the batch dims of {t} and {idx} differ")
    dims = t.shape[b:b + k]
    if known is not None:
        for j, v in enumerate(known):
            _check_range([v], dims[j % k], "gather_nd")
    bsz, q = prod(t.shape[:b]), idx.shape[b:-1]
    rest = t.shape[b + k:]
    flat: Tensor | None = None
    stride = 1
    for j in reversed(range(k)):
        col = idx.shrink(tuple((j, j + 1) if d == idx.ndim - 1 else (0, s) for d, s in enumerate(idx.shape)))
        term = _wrap_clamp(col.reshape(col.shape[:-1]), dims[j]) * stride
        flat = term if flat is None else flat + term
        stride *= dims[j]
    nq = prod(q)
    if k == 0:
        flat = Tensor.const(0, dtypes.i64, idx.shape[:-1])
    assert flat is not None
    if nq == 0 or prod(rest) == 0:
        return Tensor.const(0, t.dtype, t.shape[:b] + q + rest)
    xv = t.reshape((bsz, prod(dims)) + rest)
    iv = flat.reshape((bsz, nq) + (1,) * len(rest))
    return indexing.gather(xv, iv, 1).reshape(t.shape[:b] + q + rest)


REDUCTIONS = ("none", "add", "mul", "max", "min")


def _scatter_axis(x: Tensor, ax: int, idx: Tensor, upd: Tensor, reduction: str, name: str) -> Tensor:
    """x with upd written (or combined by `reduction`) at idx along `ax`: idx and upd of one shape, of x's
    rank and at most x's sizes off the axis. A masked reduction: O(output x indices along the axis)."""
    n, m = x.shape[ax], idx.shape[ax]
    if n == 0 or m == 0 or idx.numel == 0:
        return x
    if x.dtype.is_bool and reduction != "none":
        raise DslError(f"{name}: reduction={reduction!r} needs a numeric input, got bool")
    idx = _wrap_clamp(idx, n)
    upd = upd.cast(x.dtype)
    wide = idx.shape[:ax] + (n, m) + idx.shape[ax + 1:]
    pos = _iota(n).reshape(tuple(n if d == ax else 1 for d in range(len(wide))))
    hit = idx.unsqueeze(ax) == pos  # (pre', n, m, post')
    off = tuple((0, 0) if d in (ax, ax + 1) else (0, (x.shape[d] if d < ax else x.shape[d - 1]) - wide[d])
                for d in range(len(wide)))
    hit = hit.pad(off, False)
    if reduction == "none":  # the last update that hits a position wins (onnx.reference's order)
        which = hit.where(_along(_iota(m), ax + 1, len(wide)), Tensor.const(-1, dtypes.i32)).max(ax + 1)
        upd_p = upd.pad(tuple((0, 0) if d == ax else (0, x.shape[d] - upd.shape[d]) for d in range(x.ndim)))
        picked = indexing.gather(upd_p, which.maximum(0), ax)
        return (which >= 0).where(picked, x)
    vals = upd.unsqueeze(ax).expand(idx.shape[:ax] + (n, m) + idx.shape[ax + 1:]).pad(off)
    if reduction in ("add", "mul"):
        acc = dtypes.f32 if x.dtype in (dtypes.f16, dtypes.bf16) else x.dtype
        ident = Tensor.const(0 if reduction == "add" else 1, acc)
        red = hit.where(vals.cast(acc), ident)._reduce(Ops.ADD if reduction == "add" else Ops.MUL, ax + 1, False)
        return (x.cast(acc) + red if reduction == "add" else x.cast(acc) * red).cast(x.dtype)
    any_hit = hit.max(ax + 1)
    if reduction == "max":
        best = hit.where(vals, Tensor.const(_lowest(x.dtype), x.dtype)).max(ax + 1)
        return any_hit.where(x.maximum(best), x)
    best = hit.where(vals, Tensor.const(_highest(x.dtype), x.dtype)).min(ax + 1)
    return any_hit.where(x.minimum(best), x)


def scatter_elements(x, indices, updates, axis=0, reduction="none"):
    """ONNX ScatterElements: a copy of x with updates[..., i, ...] written at x[..., indices[..., i, ...], ...]
    along `axis` (reduction none/add/mul/max/min combines them with x's value instead)."""
    t = _tensor(x, "scatter_elements' input")
    ax = t._axis(_int(axis, "axis"))
    reduction = _choice(reduction, "reduction", REDUCTIONS)
    idx, known = _index_arg(indices, "indices")
    _check_range(known, t.shape[ax], "scatter_elements")
    upd = _tensor(updates, "updates")
    if idx.ndim != t.ndim:
        raise DslError(f"scatter_elements: indices {idx} and input {t} must have the same number of dims")
    if upd.shape != idx.shape:
        if upd.ndim == 0:
            upd = upd.expand(idx.shape)
        else:
            raise _shape_error(f"scatter_elements: updates {upd} must have the shape of indices {idx}")
    if any(i > s for d, (i, s) in enumerate(zip(idx.shape, t.shape)) if d != ax):
        raise _shape_error(f"scatter_elements: indices {idx} are larger than the input {t} off axis {ax}")
    return _scatter_axis(t, ax, idx, upd, reduction, "scatter_elements")


def scatter_nd(x, indices, updates, reduction="none"):
    """ONNX ScatterND: indices (q..., k) address slices x[i1..ik]; updates (q..., x.shape[k:])."""
    t = _tensor(x, "scatter_nd's input")
    reduction = _choice(reduction, "reduction", REDUCTIONS)
    idx, known = _index_arg(indices, "indices")
    upd = _tensor(updates, "updates")
    if idx.ndim < 1 or idx.shape[-1] > t.ndim or idx.shape[-1] < 1:
        raise DslError(f"scatter_nd: indices {idx} need a last dim of 1 to {t.ndim} for input {t}")
    k = idx.shape[-1]
    q, dims, rest = idx.shape[:-1], t.shape[:k], t.shape[k:]
    if upd.shape != q + rest:
        raise _shape_error(f"scatter_nd: updates {upd} must have shape {list(q + rest)}")
    if known is not None:
        for j, v in enumerate(known):
            _check_range([v], dims[j % k], "scatter_nd")
    flat: Tensor | None = None
    stride = 1
    for j in reversed(range(k)):
        col = idx.shrink(tuple((j, j + 1) if d == idx.ndim - 1 else (0, s) for d, s in enumerate(idx.shape)))
        term = _wrap_clamp(col.reshape(col.shape[:-1]), dims[j]) * stride
        flat = term if flat is None else flat + term
        stride *= dims[j]
    assert flat is not None
    nq, nr = prod(q), prod(rest)
    x2 = t.reshape((prod(dims), nr))
    i2 = flat.reshape((nq, 1)).expand((nq, nr))
    u2 = upd.reshape((nq, nr))
    return _scatter_axis(x2, 0, i2, u2, reduction, "scatter_nd").reshape(t.shape)


def one_hot(indices, depth, values=None, axis=-1, dtype=None):
    """ONNX OneHot: a new axis of `depth` at `axis`, values[1] where it equals the index (negative indices
    count from depth), values[0] elsewhere; an index outside [-depth, depth) gives a row of values[0]."""
    if isinstance(indices, Tensor) and indices.dtype.is_float:  # ONNX allows float indices: cast to int64
        indices = indices.cast(dtypes.i64)
    idx, _ = _index_arg(indices, "indices")
    depth = _int(depth, "depth")
    if depth < 1:
        raise DslError(f"one_hot: depth must be positive, got {depth}")
    ax = idx._axis(_int(axis, "axis"), idx.ndim + 1)
    values = (0, 1) if values is None else _seq(values)
    if isinstance(values, Tensor):
        if values.numel != 2:
            raise _shape_error(f"one_hot: values {values} must hold 2 elements (off, on)")
        v = values.reshape((2,))
        off, on = v.shrink(((0, 1),)).reshape(()), v.shrink(((1, 2),)).reshape(())
        out_dtype = dtype if dtype is not None else values.dtype
    else:
        if not isinstance(values, tuple) or len(values) != 2:
            raise DslError(f"one_hot: values must be (off, on), got {values!r}")
        off, on = (_tensor(v, "one_hot's values") for v in values)
        out_dtype = dtype if dtype is not None else promote(off.dtype, on.dtype)
    if not isinstance(out_dtype, DType):
        raise DslError(f"one_hot: expected a dtype such as f32, got {out_dtype!r}")
    i = idx.cast(dtypes.i64)
    i = (i < 0).where(i + depth, i)
    hit = i.unsqueeze(ax) == _along(_iota(depth).cast(dtypes.i64), ax, idx.ndim + 1)
    return hit.where(on.cast(out_dtype), off.cast(out_dtype))


# ------------------------------------------------------------------------------------------------ rearranging


def depth_to_space(x, blocksize, mode="DCR"):
    """ONNX DepthToSpace: (N, C, H, W) -> (N, C / b^2, H * b, W * b); mode DCR (depth, column, row) or CRD."""
    t = _tensor(x, "depth_to_space's input")
    b = _int(blocksize, "blocksize")
    mode = _choice(mode, "mode", ("DCR", "CRD"))
    if t.ndim != 4 or b < 1 or t.shape[1] % (b * b):
        raise _shape_error(f"depth_to_space needs an (N, C, H, W) input with C divisible by {b}^2, got {t}")
    n, c, h, w = t.shape
    if mode == "DCR":
        t = t.reshape((n, b, b, c // (b * b), h, w)).permute((0, 3, 4, 1, 5, 2))
    else:
        t = t.reshape((n, c // (b * b), b, b, h, w)).permute((0, 1, 4, 2, 5, 3))
    return t.reshape((n, c // (b * b), h * b, w * b))


def space_to_depth(x, blocksize, mode="DCR"):
    """ONNX SpaceToDepth: (N, C, H, W) -> (N, C * b^2, H / b, W / b); the inverse of depth_to_space in the
    same mode (ONNX's mode attribute; DCR before it existed)."""
    t = _tensor(x, "space_to_depth's input")
    b = _int(blocksize, "blocksize")
    mode = _choice(mode, "mode", ("DCR", "CRD"))
    if t.ndim != 4 or b < 1 or t.shape[2] % b or t.shape[3] % b:
        raise _shape_error(f"space_to_depth needs an (N, C, H, W) input with H and W divisible by {b}, got {t}")
    n, c, h, w = t.shape
    order = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    t = t.reshape((n, c, h // b, b, w // b, b)).permute(order)
    return t.reshape((n, c * b * b, h // b, w // b))


def hardmax(x, axis=-1):
    """ONNX Hardmax (opset 13): 1 at the first maximum along `axis`, 0 elsewhere, in x's dtype."""
    t = _tensor(x, "hardmax's input")
    if t.ndim == 0:
        raise DslError("hardmax needs at least 1 dim")
    ax = t._axis(_int(axis, "axis"))
    am = t.argmax(ax, keepdim=True)
    return (_along(_iota(t.shape[ax]), ax, t.ndim) == am.cast(dtypes.i32)).cast(t.dtype)


FUNCTIONS: dict[str, Callable] = {
    "conv": conv, "conv_transpose": conv_transpose, "max_pool": max_pool, "avg_pool": avg_pool,
    "lp_pool": lp_pool, "global_avg_pool": global_avg_pool, "global_max_pool": global_max_pool,
    "global_lp_pool": global_lp_pool, "batch_norm": batch_norm, "instance_norm": instance_norm,
    "group_norm": group_norm, "layer_norm": layer_norm, "lrn": lrn,
    "mean_variance_normalization": mean_variance_normalization, "resize": resize,
    "gather_elements": gather_elements, "gather_nd": gather_nd, "scatter_elements": scatter_elements,
    "scatter_nd": scatter_nd, "one_hot": one_hot, "depth_to_space": depth_to_space,
    "space_to_depth": space_to_depth, "hardmax": hardmax,
}
# the functions that take string arguments (auto_pad=, mode=, reduction=, ...)
TAKES_STRINGS = {"conv", "conv_transpose", "max_pool", "avg_pool", "lp_pool", "resize", "scatter_elements",
                 "scatter_nd", "depth_to_space", "space_to_depth"}

__all__ = ["FUNCTIONS", "TAKES_STRINGS", "AUTO_PADS", "window_geometry", "window_counts", "conv_transpose_geometry",
           "resize_plan", "pool_geometry"]
