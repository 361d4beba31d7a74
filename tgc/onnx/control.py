"""ONNX control flow, registered into `OPS`: If, Loop and Scan, resolved at load time (tgc compiles straight-line
tensor programs for static shapes).

Contract: If's condition must be known at load time (a constant, or folded from shapes): the chosen branch is
translated inline. Scan is unrolled over its (static) sequence length; Loop is unrolled when its trip count and
its condition are known at load time at every step (a condition computed from data, or a loop without a
bound, is one clear error naming the op, node and opset). The body's values are translated each step through
`cx.run_body`, outer values visible. Scan's opset-8 form (a batch axis, no `sequence_lens`) is unrolled over
the batch too. Scan outputs are stacked along their axis, in reverse order for a reverse direction.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tgc.dtype import dtypes
from tgc.onnx.core import Ctx, Value
from tgc.onnx.ops import _axis, op

MAX_UNROLL = 4096  # steps: a loop longer than this is refused rather than unrolled


def _index(axis: int, i: int) -> str:
    return "[" + ":, " * axis + f"{i}]"


def _slice(cx: Ctx, v: Value, axis: int, i: int) -> Value:
    """Step `i` of `v` along `axis` (a constant stays a constant)."""
    shape = tuple(s for k, s in enumerate(v.shape) if k != axis)
    if v.const is not None:
        return Value(v.name, v.dtype, shape, const=np.take(v.const, i, axis=axis))
    return Value(v.name, v.dtype, shape, expr=cx.let(f"{cx.tensor(v)}{_index(axis, i)}", "step"))


def _stack(cx: Ctx, vals: list[Value], axis: int, name: str) -> Value:
    if all(v.const is not None for v in vals):
        arr = np.stack([v.const for v in vals], axis=axis)
        return Value(name, vals[0].dtype, tuple(arr.shape), const=arr)
    shape = list(vals[0].shape)
    shape.insert(axis, len(vals))
    e = cx.let(f"stack({', '.join(cx.tensor(v) for v in vals)}, axis={axis})", name)
    return Value(name, vals[0].dtype, tuple(shape), expr=e)


@op("If")
def _if(cx, node, ins, at, opset):
    cond = cx.static(ins[0], "the condition")
    branch = at["then_branch"] if bool(np.asarray(cond).reshape(-1)[0]) else at["else_branch"]
    return cx.run_body(branch.g, [])


def _scan_once(cx: Ctx, body: Any, states: list[Value], scans: list[Value], in_axes: list[int],
               in_rev: list[int], out_axes: list[int], out_rev: list[int], node: Any) -> list[Value]:
    steps = {s.shape[a] for s, a in zip(scans, in_axes)}
    if len(steps) == 1 and not isinstance(next(iter(steps)), int):
        raise cx.need_dims("its scan length (the loop is unrolled)")
    if len(steps) != 1:
        raise cx.unsupported("scan inputs of different lengths")
    n = next(iter(steps))
    if n > MAX_UNROLL or n == 0:
        raise cx.unsupported(f"a scan of {n} steps (unrolled: 1 to {MAX_UNROLL})")
    per_step: list[list[Value]] = []
    for t in range(n):
        slices = [_slice(cx, s, a, n - 1 - t if r else t) for s, a, r in zip(scans, in_axes, in_rev)]
        outs = cx.run_body(body, states + slices)
        states = outs[:len(states)]
        per_step.append(outs[len(states):])
    k = len(per_step[0])
    stacked = []
    for j in range(k):
        seq = [step[j] for step in per_step]
        if out_rev[j]:
            seq = seq[::-1]
        stacked.append(_stack(cx, seq, out_axes[j], f"scan_{j}"))
    return states + stacked


@op("Scan")
def _scan(cx, node, ins, at, opset):
    body = at["body"].g
    m = int(at["num_scan_inputs"])
    if opset < 9:  # Scan-8: a leading sequence_lens input and a batch axis on everything
        if ins[0] is not None:
            raise cx.unsupported("sequence_lens")
        ins = ins[1:]
    states, scans = list(ins[:len(ins) - m]), list(ins[len(ins) - m:])
    k = len(body.output) - len(states)
    if opset < 9:
        rev_in = list(at.get("directions", [0] * m))
        batch = scans[0].shape[0]
        results = []
        for b in range(batch):
            results.append(_scan_once(cx, body, [_slice(cx, s, 0, b) for s in states],
                                      [_slice(cx, s, 0, b) for s in scans], [0] * m, rev_in, [0] * k, [0] * k, node))
        return [_stack(cx, [r[j] for r in results], 0, f"scan_b{j}") for j in range(len(results[0]))]
    in_axes = [_axis(a, s.rank) for a, s in zip(at.get("scan_input_axes", [0] * m), scans)]
    in_rev = list(at.get("scan_input_directions", [0] * m))
    out_axes = list(at.get("scan_output_axes", [0] * k))
    out_rev = list(at.get("scan_output_directions", [0] * k))
    out_axes = [a + len(body.output[len(states) + j].type.tensor_type.shape.dim) + 1 if a < 0 else a
                for j, a in enumerate(out_axes)]
    return _scan_once(cx, body, states, scans, in_axes, in_rev, out_axes, out_rev, node)


@op("Loop")
def _loop(cx, node, ins, at, opset):
    body = at["body"].g
    ins = list(ins) + [None] * 2
    trip = cx.static(ins[0], "the trip count") if ins[0] is not None else None
    cond = bool(np.asarray(cx.static(ins[1], "the condition")).reshape(-1)[0]) if ins[1] is not None else True
    carried = [v for v in ins[2:len(node.input)]]
    n_carried = len(carried)
    if trip is None and ins[1] is None:
        raise cx.unsupported("a loop with neither a trip count nor a condition")
    limit = int(np.asarray(trip).reshape(-1)[0]) if trip is not None else MAX_UNROLL + 1
    scans: list[list[Value]] = []
    i = 0
    while i < limit and cond:
        if i >= MAX_UNROLL:
            raise cx.unsupported(f"a loop of more than {MAX_UNROLL} steps (it is unrolled)")
        it = Value("iter", dtypes.i64, (), const=np.array(i, np.int64))
        c = Value("cond", dtypes.bool, (), const=np.array(cond))
        outs = cx.run_body(body, [it, c, *carried])
        if outs[0].const is None:
            raise cx.unsupported("a loop condition computed from data (the loop is unrolled at load time)")
        cond = bool(np.asarray(outs[0].const).reshape(-1)[0])
        carried = outs[1:1 + n_carried]
        scans.append(outs[1 + n_carried:])
        i += 1
    n_scan = len(body.output) - 1 - n_carried
    if n_scan and not scans:
        raise cx.unsupported("scan outputs of a loop that runs no step")
    return carried + [_stack(cx, [s[j] for s in scans], 0, f"loop_{j}") for j in range(n_scan)]
