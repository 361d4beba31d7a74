"""ONNX ops written as one call of the NN library's functions (tgc/dsl/nnlib.py), registered into `OPS`.

Contract: each function here maps a node's attributes one to one onto the keyword arguments of the nnlib
function of the same meaning (tools/nnlib_onnx_cases.py is the reference for that mapping), so ONNX's semantics
live in one place. Inputs that decide shapes (Resize's scales/sizes/roi, OneHot's depth) must be load-time
constants (`NeedStatic` otherwise). Importing this module replaces the plain-`.tg` versions in `tgc.onnx.ops`
for the ops the library covers more fully (3-d ConvTranspose, MaxPool's Indices, scatter reductions,
GatherND's batch_dims, Resize's antialias and tf_crop_and_resize, SpaceToDepth's CRD mode, BatchNormalization
in training mode); where the library's version is the same or slower for models, the plain one stays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tgc.onnx.core import Ctx
from tgc.onnx.ops import OPS, _cast, _resize, op


def _lit(v: Any) -> str:
    """A `.tg` literal for an attribute value: tuples for lists and arrays, strings in double quotes."""
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_lit(e) for e in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    return repr(int(v)) if isinstance(v, (int, np.integer, bool, np.bool_)) else repr(v)


def _call(fn: str, args: list[str], at: dict, keys: tuple[str, ...], extra: dict[str, str] | None = None) -> str:
    """`fn(args..., key=value...)` for the attributes among `keys` the node sets (the others keep ONNX's
    defaults, which are the library's; an empty auto_pad, as old exporters write, is the default NOTSET)."""
    kw = [f"{k}={_lit(at[k])}" for k in keys if k in at and not (k == "auto_pad" and at[k] in ("", b""))]
    kw += [f"{k}={v}" for k, v in (extra or {}).items()]
    return f"{fn}({', '.join(args + kw)})"


def _opt(ins: list, i: int) -> Any:
    return ins[i] if len(ins) > i and ins[i] is not None else None


_CONV_KEYS = ("strides", "pads", "dilations", "group", "auto_pad", "kernel_shape")


_plain_conv = OPS["Conv"]


@op("Conv")
def _conv(cx: Ctx, node: Any, ins: list, at: dict, opset: int) -> list:
    """1-d to 3-d: the plain version (2-d convolutions, tgc's fast path); more spatial axes: the library."""
    x, w, b = ins[0], ins[1], _opt(ins, 2)
    if x.rank <= 5:
        return _plain_conv(cx, node, ins, at, opset)
    args = [cx.tensor(x), cx.tensor(w)] + ([cx.tensor(b)] if b is not None else [])
    return [_cast(_call("conv", args, at, _CONV_KEYS), x.dtype)]


@op("ConvTranspose")
def _conv_transpose(cx: Ctx, node: Any, ins: list, at: dict, opset: int) -> list:
    x, w, b = ins[0], ins[1], _opt(ins, 2)
    at = dict(at)
    if "output_shape" in at or at.get("auto_pad") in ("SAME_UPPER", "SAME_LOWER", "VALID"):
        at.pop("pads", None)  # (ONNX ignores explicit pads there; the library wants one or the other)
    args = [cx.tensor(x), cx.tensor(w)] + ([cx.tensor(b)] if b is not None else [])
    return [_cast(_call("conv_transpose", args, at, _CONV_KEYS + ("output_padding", "output_shape")), x.dtype)]


_plain_maxpool = OPS["MaxPool"]


@op("MaxPool")
def _maxpool(cx: Ctx, node: Any, ins: list, at: dict, opset: int) -> list:
    """The plain version (with its max_pool2d fast path) unless the Indices output or storage_order is asked."""
    wants_indices = len(node.output) > 1 and bool(node.output[1])
    if not wants_indices and not at.get("storage_order", 0):
        return _plain_maxpool(cx, node, ins, at, opset)
    keys = ("kernel_shape", "strides", "pads", "dilations", "ceil_mode", "auto_pad", "storage_order")
    if not wants_indices:
        return [_call("max_pool", [cx.tensor(ins[0])], at, keys)]
    t = cx.let(_call("max_pool", [cx.tensor(ins[0])], at, keys, {"return_indices": "True"}), "pooled")
    return [f"{t}[0]", f"{t}[1]"]


@op("GatherND")
def _gather_nd(cx: Ctx, node: Any, ins: list, at: dict, opset: int) -> list:
    x, idx = ins
    return [_call("gather_nd", [cx.tensor(x), cx.tensor(idx)], at, ("batch_dims",))]


@op("ScatterElements", "Scatter")
def _scatter_elements(cx: Ctx, node: Any, ins: list, at: dict, opset: int) -> list:
    x, idx, upd = ins
    return [_call("scatter_elements", [cx.tensor(x), cx.tensor(idx), cx.tensor(upd)], at, ("axis", "reduction"))]


@op("ScatterND")
def _scatter_nd(cx: Ctx, node: Any, ins: list, at: dict, opset: int) -> list:
    x, idx, upd = ins
    return [_call("scatter_nd", [cx.tensor(x), cx.tensor(idx), cx.tensor(upd)], at, ("reduction",))]


@op("SpaceToDepth")
def _space_to_depth(cx: Ctx, node: Any, ins: list, at: dict, opset: int) -> list:
    return [_call("space_to_depth", [cx.tensor(ins[0])], at, ("blocksize", "mode"))]


@op("DepthToSpace")
def _depth_to_space(cx: Ctx, node: Any, ins: list, at: dict, opset: int) -> list:
    return [_call("depth_to_space", [cx.tensor(ins[0])], at, ("blocksize", "mode"))]


_plain_batchnorm = OPS["BatchNormalization"]


@op("BatchNormalization")
def _batchnorm(cx: Ctx, node: Any, ins: list, at: dict, opset: int) -> list:
    """Inference form: the plain version (its weights folded into one multiply-add at load); training mode
    (opset 14+: the batch's own statistics, and the running mean and variance as outputs 1 and 2): the library."""
    if not at.get("training_mode", 0):
        return _plain_batchnorm(cx, node, ins, at, opset)
    args = [cx.tensor(v) for v in ins[:5]]
    t = cx.let(_call("batch_norm", args, at, ("epsilon", "momentum"), {"training_mode": "1"}), "batch_norm")
    return [f"{t}[0]", f"{t}[1]", f"{t}[2]"]


_RESIZE_KEYS = ("mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a", "exclude_outside",
                "extrapolation_value", "axes", "keep_aspect_ratio_policy", "antialias")


@op("Resize")
def _resize_nn(cx: Ctx, node: Any, ins: list, at: dict, opset: int) -> list:
    """Opset 11+: the library's resize (every mode, antialias, tf_crop_and_resize with its roi); Resize 10 and
    Upsample keep the plain version (asymmetric coordinates, scales only)."""
    if opset < 11:
        return _resize(cx, node, ins, at, opset)
    x = ins[0]

    def given(i: int, what: str) -> np.ndarray | None:
        v = _opt(ins, i)
        if v is None or (v.shape is not None and 0 in v.shape):
            return None
        arr = cx.static(v, what)
        return arr if arr is not None and arr.size else None

    extra = {}
    roi = given(1, "the roi") if at.get("coordinate_transformation_mode") == "tf_crop_and_resize" else None
    scales, sizes = given(2, "the scales"), given(3, "the sizes")
    if roi is not None:
        extra["roi"] = _lit(roi.astype(float))
    if scales is not None:
        extra["scales"] = _lit(scales.astype(float))
    if sizes is not None:
        extra["sizes"] = _lit(sizes.astype(np.int64))
    return [_call("resize", [cx.tensor(x)], at, _RESIZE_KEYS, extra)]


__all__ = ["OPS"]
