"""A numpy evaluation of a tensor graph in float64 (ints exact): the reference behind `tgc run --check`.

It reads the same tensor-level UOps the compiler does, so it checks lowering, optimization and the
backends; the front end's own decompositions (floor division, argmax, ...) are checked against plain
numpy in the tests.
"""

from __future__ import annotations

import numpy as np

from tgc.dtype import DType, bf16_to_f32
from tgc.ir.uop import Ops, UOp


def _np_dtype(d: DType) -> np.dtype:
    return np.dtype(np.float64) if d.is_float else d.np


def _c_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.floor_divide(a, b)
    fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return np.where(fix, q + 1, q).astype(a.dtype)


def evaluate(root: UOp, env: dict[UOp, np.ndarray]) -> np.ndarray:
    memo: dict[UOp, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for node in root.toposort():
            memo[node] = _eval(node, [memo[s] for s in node.src], env)
    return memo[root]


def _eval(u: UOp, s: list[np.ndarray], env: dict[UOp, np.ndarray]) -> np.ndarray:
    op, arg, d = u.op, u.arg, u.dtype
    nd = _np_dtype(d) if d is not None else None
    if op is Ops.BUFFER:
        a = env[u]
        return bf16_to_f32(a).astype(np.float64) if d.name == "bf16" else a.astype(nd)
    if op is Ops.CONST:
        return np.array(arg, dtype=nd)
    if op is Ops.IOTA:
        return np.arange(arg, dtype=np.int32)
    if op is Ops.CAST:
        x = s[0]
        if d.is_float:
            return x.astype(np.float64)
        if d.is_bool:
            return x != 0
        if x.dtype.kind == "f":
            x = np.nan_to_num(np.trunc(x), nan=0, posinf=0, neginf=0)
            info = np.iinfo(d.np)
            x = np.clip(x, info.min, info.max)
        return x.astype(d.np)
    if op is Ops.BITCAST:
        src_d = u.src[0].dtype
        x = s[0].astype(src_d.np) if src_d.fmt else s[0]
        out = x.view(d.np) if d.fmt else x.view(np.uint16)
        return bf16_to_f32(out).astype(np.float64) if d.name == "bf16" else out.astype(nd)
    if op is Ops.CONTIGUOUS:
        return s[0]
    if op is Ops.RESHAPE:
        return s[0].reshape(arg)
    if op is Ops.PERMUTE:
        return s[0].transpose(arg)
    if op is Ops.EXPAND:
        return np.broadcast_to(s[0], arg)
    if op is Ops.PAD:
        pads, fill = arg
        return np.pad(s[0], pads, constant_values=fill)
    if op is Ops.SHRINK:
        return s[0][tuple(slice(b, e) for b, e in arg)]
    if op is Ops.FLIP:
        return np.flip(s[0], tuple(i for i, f in enumerate(arg) if f))
    if op is Ops.STRIDE:
        return s[0][tuple(slice(None, None, st) for st in arg)]
    if op is Ops.WINDOW:
        axis, k, stride, dil = arg
        x = s[0]
        h = x.shape[axis]
        oh = max((h - dil * (k - 1) - 1) // stride + 1, 0)
        idx = (np.arange(oh)[:, None] * stride + np.arange(k)[None, :] * dil)
        return np.take(x, idx, axis=axis) if oh else np.zeros(x.shape[:axis] + (0, k) + x.shape[axis + 1:], x.dtype)
    if op is Ops.REDUCE_AXIS:
        rop, axes = arg
        x = s[0]
        if rop is Ops.ADD:
            return np.sum(x, axis=axes, keepdims=True, dtype=x.dtype)
        if rop is Ops.MUL:
            return np.prod(x, axis=axes, keepdims=True, dtype=x.dtype)
        return np.max(x, axis=axes, keepdims=True)
    a = s[0]
    b = s[1] if len(s) > 1 else None
    if op is Ops.ADD:
        return (a + b).astype(nd)
    if op is Ops.SUB:
        return (a - b).astype(nd)
    if op is Ops.MUL:
        return (a * b).astype(nd)
    if op is Ops.FDIV:
        return a / b
    if op is Ops.IDIV:
        return _c_div(a, b)
    if op is Ops.MOD:
        return (a - b * _c_div(a, b)).astype(nd)
    if op is Ops.MAX:
        return np.maximum(a, b)
    if op is Ops.CMPLT:
        return a < b
    if op is Ops.CMPNE:
        return a != b
    if op is Ops.CMPEQ:
        return a == b
    if op is Ops.AND:
        return a & b
    if op is Ops.OR:
        return a | b
    if op is Ops.XOR:
        return a ^ b
    if op in (Ops.SHL, Ops.SHR):
        bits = d.bits
        big = b.astype(np.int64) >= bits
        sh = np.where(big, bits - 1, b).astype(a.dtype)
        r = np.left_shift(a, sh) if op is Ops.SHL else np.right_shift(a, sh)
        return np.where(big & ((op is Ops.SHL) | d.is_unsigned), 0, r).astype(nd)
    if op is Ops.NEG:
        return (-a).astype(nd)
    if op is Ops.NOT:
        return np.logical_not(a) if d.is_bool else ~a
    if op is Ops.EXP2:
        return np.exp2(a)
    if op is Ops.LOG2:
        return np.log2(a)
    if op is Ops.SIN:
        return np.sin(a)
    if op is Ops.SQRT:
        return np.sqrt(a)
    if op is Ops.RECIP:
        return 1.0 / a
    if op is Ops.TRUNC:
        return np.trunc(a)
    if op is Ops.WHERE:
        return np.where(a, b, s[2]).astype(nd)
    if op is Ops.MULACC:
        return a * b + s[2]
    raise NotImplementedError(f"reference: {op}")
