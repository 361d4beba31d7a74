"""ONNX ops whose output shape depends on input values (NonZero, Unique, NonMaxSuppression), registered into
`OPS`. With inputs known at load they are folded like any constant (`translate._fold`); otherwise the op raises
`NeedHost`: `tgc.staged.StagedModel` then runs the model in stages, computing this node on the host between two
tgc programs (docs/DESIGN.md, "ONNX in": data-dependent output shapes)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tgc.onnx.core import Ctx, NeedHost
from tgc.onnx.ops import op

HOST_OPS = ("NonZero", "Unique", "NonMaxSuppression")


@op(*HOST_OPS)
def _host(cx: Ctx, node: Any, ins: list, attrs: dict, opset: int) -> list:
    raise NeedHost(f"{cx.where()}: its output shape depends on the values of its inputs, which are not known "
                   "at load", node.op_type,
                   hint="tgc run|compile|bench|beam and tgc.load run such a model in stages (the node on the "
                   "host); tgc import and packages need one static program")


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def nonzero(x: np.ndarray) -> list[np.ndarray]:
    """ONNX NonZero: the indices of the non-zero elements, one row per axis, in row-major order (int64)."""
    x = np.asarray(x)
    if x.ndim == 0:
        return [np.zeros((0, int(x != 0)), np.int64)]
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


def unique(x: np.ndarray, axis: int | None = None, sorted_: bool = True) -> list[np.ndarray]:
    """ONNX Unique: (Y, indices of first occurrences, inverse indices, counts); with `sorted_` false, Y in the
    order of first occurrence. `axis` None: over the flattened input; else slices along `axis`."""
    x = np.asarray(x)
    flat = x.reshape(-1) if axis is None else np.moveaxis(x, axis, 0)
    _, first, inverse, counts = np.unique(flat if axis is None else flat.reshape(flat.shape[0], -1), axis=
                                          None if axis is None else 0, return_index=True, return_inverse=True,
                                          return_counts=True)
    inverse = inverse.reshape(-1)
    if not sorted_:  # renumber by first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        first, counts, inverse = first[order], counts[order], rank[inverse]
    y = flat[first] if axis is None else np.moveaxis(flat[first], 0, axis)
    return [y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]


def non_max_suppression(boxes: np.ndarray, scores: np.ndarray, max_out: int, iou_threshold: float,
                        score_threshold: float | None, center_point_box: int) -> np.ndarray:
    """ONNX NonMaxSuppression: [num_selected, 3] int64 rows (batch, class, box), per batch and class the boxes in
    descending score order (ties: the lower index first), each kept when its IoU with every box kept before it is
    at most `iou_threshold` (and its score above `score_threshold`), at most `max_out` per class."""
    boxes = np.asarray(boxes, np.float64)
    if center_point_box:
        c, s = boxes[..., :2], boxes[..., 2:] / 2
        boxes = np.concatenate([c - s, c + s], axis=-1)  # corners (x/y order does not change the IoU)
    lo = np.minimum(boxes[..., :2], boxes[..., 2:])
    hi = np.maximum(boxes[..., :2], boxes[..., 2:])
    area = np.prod(hi - lo, axis=-1)
    rows = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            sc = np.asarray(scores[b, c], np.float64)
            order = np.argsort(-sc, kind="stable")
            if score_threshold is not None:
                order = order[sc[order] > score_threshold]
            kept: list[int] = []
            for i in order:
                if len(kept) >= max_out:
                    break
                ok = True
                for j in kept:
                    inter = np.prod(np.clip(np.minimum(hi[b, i], hi[b, j]) - np.maximum(lo[b, i], lo[b, j]), 0, None))
                    union = area[b, i] + area[b, j] - inter
                    if inter > 0 and area[b, i] > 0 and area[b, j] > 0 and inter / union > iou_threshold:
                        ok = False
                        break
                if ok:
                    kept.append(int(i))
            rows += [(b, c, i) for i in kept]
    return np.array(rows, np.int64).reshape(-1, 3)


def run_host(node: Any, ins: list[np.ndarray | None]) -> list[np.ndarray]:
    """Compute one NonZero, Unique or NonMaxSuppression node on the host (numpy), with ONNX's semantics."""
    if node.op_type == "NonZero":
        return nonzero(ins[0])
    if node.op_type == "Unique":
        axis = _attr(node, "axis", None)
        x = np.asarray(ins[0])
        if axis is not None:
            axis = int(axis) + x.ndim if int(axis) < 0 else int(axis)
        return unique(x, axis, bool(_attr(node, "sorted", 1)))
    if node.op_type == "NonMaxSuppression":
        def scalar(i: int, default: Any) -> Any:
            return np.asarray(ins[i]).reshape(-1)[0] if len(ins) > i and ins[i] is not None and \
                np.asarray(ins[i]).size else default
        max_out = int(scalar(2, 0))
        iou = float(scalar(3, 0.0))
        score = scalar(4, None)
        return [non_max_suppression(ins[0], ins[1], max_out, iou, None if score is None else float(score),
                                    int(_attr(node, "center_point_box", 0)))]
    raise ValueError(f"{node.op_type} is not a host op")
