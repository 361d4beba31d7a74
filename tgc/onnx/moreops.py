"""More ONNX ops, registered into `OPS`: Compress (a load-time condition), ReverseSequence, Det (up to 4x4) and
MaxUnpool.

Contract (ONNX's semantics): Compress keeps the slices whose condition is true along `axis` (the flattened input
without one); its condition decides the output's shape, so it must be a load-time constant (`NeedStatic`).
ReverseSequence reverses the first `sequence_lens[b]` steps of each batch entry along `time_axis`. Det is the
determinant of the last two axes by cofactor expansion (matrices up to 4x4; larger ones are refused). MaxUnpool
scatters each value to its flat index in the output (`output_shape`, else the default unpooled shape; small
tensors only: every output position is compared with every index).
"""

from __future__ import annotations

import numpy as np

from tgc.dtype import dtypes
from tgc.onnx.core import shape_text
from tgc.onnx.ops import _axis, _cast, _const, op


@op("Compress")
def _compress(cx, node, ins, at, opset):
    x, cond = ins
    keep = np.nonzero(np.asarray(cx.static(cond, "the condition")).reshape(-1))[0]
    e = cx.tensor(x)
    if "axis" not in at:
        e, ax, n = f"reshape({e}, (-1,))", 0, int(np.prod(x.shape))
    else:
        ax = _axis(int(at["axis"]), x.rank)
        n = x.shape[ax]
    keep = keep[keep < n]
    if len(keep) == 0:
        raise cx.unsupported("a condition that keeps nothing (an empty output)")
    idx = cx.tensor(_const(keep.astype(np.int64), dtypes.i64, "keep"))
    return [f"take({e}, {idx}, axis={ax})"]


@op("ReverseSequence")
def _reverse_sequence(cx, node, ins, at, opset):
    x, lens = ins
    t_ax, b_ax = int(at.get("time_axis", 0)), int(at.get("batch_axis", 1))
    steps, batch = x.shape[t_ax], x.shape[b_ax]
    shape = [1] * x.rank
    shape[t_ax], shape[b_ax] = steps, batch
    t = f"reshape(arange({steps}), {shape_text([steps if i == t_ax else 1 for i in range(x.rank)])})"
    n = f"reshape(cast({cx.tensor(lens)}, i32), {shape_text([batch if i == b_ax else 1 for i in range(x.rank)])})"
    src = cx.let(f"expand(clip(where({t} < {n}, {n} - 1 - {t}, {t}), 0, {steps - 1}), {shape_text(x.shape)})",
                 "src")
    return [f"gather({cx.tensor(x)}, {t_ax}, {src})"]


def _det_terms(m: list[list[str]]) -> str:
    """The determinant of a small matrix of expressions, by cofactor expansion along the first row."""
    n = len(m)
    if n == 1:
        return m[0][0]
    if n == 2:
        return f"({m[0][0]} * {m[1][1]} - {m[0][1]} * {m[1][0]})"
    terms = []
    for j in range(n):
        minor = [row[:j] + row[j + 1:] for row in m[1:]]
        terms.append(f"{'-' if j % 2 else '+'} {m[0][j]} * {_det_terms(minor)}")
    return "(" + " ".join(terms).lstrip("+ ") + ")"


@op("Det")
def _det(cx, node, ins, at, opset):
    x = ins[0]
    n = x.shape[-1]
    if not isinstance(n, int) or n > 4:
        raise cx.unsupported(f"a {n}x{n} determinant (tgc expands up to 4x4)")
    e = cx.tensor(x)
    m = [[cx.let(f"{e}[..., {i}, {j}]", "m") for j in range(n)] for i in range(n)]
    return [_cast(_det_terms(m), x.dtype)]


@op("MaxUnpool")
def _max_unpool(cx, node, ins, at, opset):
    x, idx = ins[0], ins[1]
    shape_in = ins[2] if len(ins) > 2 and ins[2] is not None else None
    if shape_in is not None:
        out = [int(s) for s in cx.static(shape_in, "the output shape").reshape(-1)]
    else:
        k = list(at["kernel_shape"])
        s = list(at.get("strides", [1] * len(k)))
        p = list(at.get("pads", [0] * 2 * len(k)))
        sp = [(d - 1) * st + kk - p[i] - p[i + len(k)] for i, (d, st, kk) in enumerate(zip(x.shape[2:], s, k))]
        out = [x.shape[0], x.shape[1], *sp]
    total = int(np.prod(out))
    if total * int(np.prod(x.shape)) > 1 << 24:
        raise cx.unsupported("an unpooling this large (tgc compares every output position with every index)")
    flat_x = f"reshape({cx.tensor(x)}, (-1,))"
    # each output position: the value whose index points at it (indices count within the whole tensor)
    flat_i = f"reshape(cast({cx.tensor(idx)}, i64), (1, -1))"
    pos = f"reshape(arange({total}), ({total}, 1))"
    hit = cx.let(f"cast({pos}, i64) == {flat_i}", "hit")
    y = f"sum(where({hit}, reshape({flat_x}, (1, -1)), 0), axis=1)"
    return [f"reshape({_cast(y, x.dtype)}, {shape_text(out)})"]

