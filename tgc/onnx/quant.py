"""ONNX's linear quantization ops, registered into `OPS`: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv.

Contract (ONNX's semantics): quantizing is `saturate(round_half_even(x / scale) + zero_point)` in the zero
point's integer type (uint8 when absent); dequantizing is `(x - zero_point) * scale` in the scale's float type.
A scale and zero point are scalars, 1-d along `axis` (per-axis) or, with `block_size`, blocks along `axis` (then
they must be load-time constants). Integer products (MatMulInteger, ConvInteger) accumulate in int32; the
QLinear ops compute the integer product exactly in float64 and requantize it. Float8 and 4-bit types are not
supported (the dtype map refuses them with the op, node and opset).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tgc.dtype import DType, dtypes
from tgc.onnx.core import Ctx, Value, shape_text
from tgc.onnx.ops import OPS, _axis, op

_INT_RANGE = {dtypes.u8: (0, 255), dtypes.i8: (-128, 127), dtypes.u16: (0, 65535), dtypes.i16: (-32768, 32767),
              dtypes.i32: (-(2 ** 31), 2 ** 31 - 1), dtypes.u32: (0, 2 ** 32 - 1)}


def _opt(ins: list, i: int) -> Value | None:
    return ins[i] if len(ins) > i and ins[i] is not None else None


def _along(cx: Ctx, v: Value, x: Value, axis: int, block: int, what: str) -> str:
    """A scale or zero point `v` as an expression that broadcasts against `x`: a scalar as is, a 1-d one along
    `axis`, a blocked one (same rank as x) repeated `block` times along `axis` (a load-time constant then)."""
    rank = x.rank
    if v.shape is None or len(v.shape) == 0 or (len(v.shape) == 1 and v.shape[0] == 1 and block == 0):
        return cx.tensor(v) if len(v.shape or ()) == 0 else f"reshape({cx.tensor(v)}, ())"
    a = _axis(axis, rank)
    if block > 0:
        arr = cx.static(v, f"the blocked {what}")
        full = np.repeat(arr, block, axis=a)
        full = np.take(full, np.arange(x.shape[a]), axis=a)
        return cx.tensor(Value(v.name, v.dtype, tuple(full.shape), const=full))
    if len(v.shape) != 1:
        raise cx.unsupported(f"a {len(v.shape)}-d {what} without block_size")
    shape = [1] * rank
    shape[a] = v.shape[0]
    return f"reshape({cx.tensor(v)}, {shape_text(shape)})"


def _saturate(expr: str, dt: DType) -> str:
    lo, hi = _INT_RANGE[dt]
    return f"cast(clip({expr}, {lo}, {hi}), {dt.name})"


def _quant_dtype(cx: Ctx, zp: Value | None, at: dict) -> DType:
    if zp is not None:
        dt = zp.dtype
    elif at.get("output_dtype"):
        from tgc.onnx.core import onnx_dtype

        dt = onnx_dtype(int(at["output_dtype"]), f"QuantizeLinear's output_dtype in {cx.where()}")
    else:
        dt = dtypes.u8
    if dt not in _INT_RANGE:
        raise cx.unsupported(f"quantizing to {dt.name}")
    return dt


@op("QuantizeLinear")
def _quantize(cx, node, ins, at, opset):
    x, scale, zp = ins[0], ins[1], _opt(ins, 2)
    axis, block = int(at.get("axis", 1)), int(at.get("block_size", 0))
    dt = _quant_dtype(cx, zp, at)
    s = _along(cx, scale, x, axis, block, "scale")
    q = f"round(cast({cx.tensor(x)}, f32) / cast({s}, f32))"
    if zp is not None:
        q = f"({q} + cast({_along(cx, zp, x, axis, block, 'zero point')}, f32))"
    return [_saturate(q, dt)]


@op("DequantizeLinear")
def _dequantize(cx, node, ins, at, opset):
    x, scale, zp = ins[0], ins[1], _opt(ins, 2)
    if x.dtype not in _INT_RANGE:
        raise cx.unsupported(f"dequantizing {x.dtype.name}")
    axis, block = int(at.get("axis", 1)), int(at.get("block_size", 0))
    out = scale.dtype
    if at.get("output_dtype"):
        from tgc.onnx.core import onnx_dtype

        out = onnx_dtype(int(at["output_dtype"]), f"DequantizeLinear's output_dtype in {cx.where()}")
    e = f"cast({cx.tensor(x)}, f32)"
    if zp is not None:
        e = f"({e} - cast({_along(cx, zp, x, axis, block, 'zero point')}, f32))"
    return [f"cast({e} * cast({_along(cx, scale, x, axis, block, 'scale')}, f32), {out.name})"]


@op("DynamicQuantizeLinear")
def _dynamic_quantize(cx, node, ins, at, opset):
    x = cx.tensor(ins[0])
    lo = cx.let(f"minimum(min({x}), 0.0)", "qmin")
    hi = cx.let(f"maximum(max({x}), 0.0)", "qmax")
    scale = cx.let(f"(({hi} - {lo}) / 255.0)", "qscale")
    zp = cx.let(_saturate(f"round(0.0 - {lo} / {scale})", dtypes.u8), "qzero")
    y = _saturate(f"(round({x} / {scale}) + cast({zp}, f32))", dtypes.u8)
    return [y, Value(node.output[1], dtypes.f32, (), expr=scale), Value(node.output[2], dtypes.u8, (), expr=zp)]


def _centered(cx: Ctx, x: Value, zp: Value | None, axis: int, to: str) -> str:
    """`x - zero_point` in dtype `to` (a 1-d zero point runs along `axis` of x)."""
    e = f"cast({cx.tensor(x)}, {to})"
    if zp is None:
        return e
    if zp.shape and len(zp.shape) == 1 and zp.shape[0] != 1:
        shape = [1] * x.rank
        shape[_axis(axis, x.rank)] = zp.shape[0]
        return f"({e} - cast(reshape({cx.tensor(zp)}, {shape_text(shape)}), {to}))"
    z = cx.tensor(zp) if not zp.shape else f"reshape({cx.tensor(zp)}, ())"
    return f"({e} - cast({z}, {to}))"


@op("MatMulInteger")
def _matmul_integer(cx, node, ins, at, opset):
    a, b = ins[0], ins[1]
    ea = _centered(cx, a, _opt(ins, 2), -1 if a.rank == 1 else -2, "i32")  # a's zero point: per row
    eb = _centered(cx, b, _opt(ins, 3), -1, "i32")  # b's: per column
    return [f"({ea} @ {eb})"]


def _conv_of(cx: Ctx, node: Any, x: str, xv: Value, w: str, wv: Value, dt: DType, at: dict, opset: int) -> Any:
    """OPS['Conv'] on two expressions (x and w as values of dtype `dt`), the node's attributes unchanged."""
    xin = Value(xv.name, dt, xv.shape, expr=cx.let(x, "xc"))
    win = Value(wv.name, dt, wv.shape, expr=cx.let(w, "wc"))
    return OPS["Conv"](cx, node, [xin, win], at, opset)[0]


@op("ConvInteger")
def _conv_integer(cx, node, ins, at, opset):
    x, w = ins[0], ins[1]
    ex = _centered(cx, x, _opt(ins, 2), 1, "f64")
    ew = _centered(cx, w, _opt(ins, 3), 0, "f64")  # per output channel
    return [f"cast(round({_conv_of(cx, node, ex, x, ew, w, dtypes.f64, at, opset)}), i32)"]


def _requantize(cx: Ctx, acc: str, scale: str, y_scale: Value, y_zp: Value | None, y: Value) -> str:
    e = f"round({acc} * {scale} / cast({cx.tensor(y_scale)}, f64))"
    if y_zp is not None:
        e = f"({e} + cast({cx.tensor(y_zp)}, f64))"
    return _saturate(e, y_zp.dtype if y_zp is not None else dtypes.u8)


@op("QLinearMatMul")
def _qlinear_matmul(cx, node, ins, at, opset):
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = (list(ins) + [None] * 8)[:8]
    ea = _centered(cx, a, a_zp, -2, "f64")
    eb = _centered(cx, b, b_zp, -1, "f64")
    acc = cx.let(f"({ea} @ {eb})", "qacc")
    scale = f"(cast({cx.tensor(a_s)}, f64) * cast({cx.tensor(b_s)}, f64))"
    return [_requantize(cx, acc, scale, y_s, y_zp, a)]


@op("QLinearConv")
def _qlinear_conv(cx, node, ins, at, opset):
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = (list(ins) + [None] * 8)[:8]
    bias = ins[8] if len(ins) > 8 else None
    ex = _centered(cx, x, x_zp, 1, "f64")
    ew = _centered(cx, w, w_zp, 0, "f64")
    acc = _conv_of(cx, node, ex, x, ew, w, dtypes.f64, at, opset)
    if bias is not None:
        acc = f"({acc} + reshape(cast({cx.tensor(bias)}, f64), {shape_text((1, w.shape[0]) + (1,) * (x.rank - 2))}))"
    ws = cx.tensor(w_s)
    if w_s.shape and len(w_s.shape) == 1 and w_s.shape[0] != 1:
        ws = f"reshape({ws}, {shape_text((1, w.shape[0]) + (1,) * (x.rank - 2))})"
    scale = f"(cast({cx.tensor(x_s)}, f64) * cast({ws}, f64))"
    return [_requantize(cx, cx.let(acc, "qacc"), scale, y_s, y_zp, x)]
