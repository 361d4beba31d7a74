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
    order = root.toposort()
    contractions = _contractions(order)
    skipped = {n for chain in contractions.values() for n in chain}
    memo: dict[UOp, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for node in order:
            if node in skipped:
                continue
            chain = contractions.get(node)
            if chain is not None:
                mul = chain[-1]
                memo[node] = _contract(memo[mul.src[0]], memo[mul.src[1]], node.arg[1], _np_dtype(node.dtype))
            else:
                memo[node] = _eval(node, [memo[s] for s in node.src], env)
    return memo[root]


# ------------------------------------------------------------------------------------------- contractions
# A matmul is `(a.expand(M, K, N) * b.expand(M, K, N)).sum(axis=1)`: evaluated node by node, the product
# is an M x K x N float64 array (2 GiB at 512^3). A sum of a product is evaluated instead as one einsum of
# the operands with their broadcast (stride 0) axes dropped, which never builds the product.


def _contractions(order: list[UOp]) -> dict[UOp, list[UOp]]:
    """{REDUCE_AXIS(ADD) node: [its float casts..., the MUL]} for sums of products whose intermediate nodes
    have no other user (so they need not be evaluated at all)."""
    users: dict[UOp, int] = {}
    for node in order:
        for s in node.src:
            users[s] = users.get(s, 0) + 1
    found: dict[UOp, list[UOp]] = {}
    for node in order:
        if node.op is not Ops.REDUCE_AXIS or node.arg[0] is not Ops.ADD or node.dtype is None:
            continue
        chain, x = [], node.src[0]
        while x.op is Ops.CAST and x.dtype is not None and x.dtype.is_float and x.src[0].dtype is not None \
                and x.src[0].dtype.is_float and users.get(x, 0) == 1:
            chain.append(x)
            x = x.src[0]
        if x.op is Ops.MUL and users.get(x, 0) == 1 and x.dtype is not None and not x.dtype.is_bool \
                and node.dtype.is_float == x.dtype.is_float:
            found[node] = [*chain, x]
    return found


_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _contract(a: np.ndarray, b: np.ndarray, axes: tuple[int, ...], nd: np.dtype) -> np.ndarray:
    """`np.sum(a * b, axis=axes, keepdims=True)` without materializing `a * b`."""
    shape = np.broadcast_shapes(a.shape, b.shape)
    ndim = len(shape)
    if ndim > len(_LETTERS):
        return np.sum(a * b, axis=axes, keepdims=True, dtype=nd)
    reduced = {ax % ndim if ndim else ax for ax in axes}
    operands, subscripts, present = [], [], set()
    for x in (a, b):
        x = x.reshape((1,) * (ndim - x.ndim) + x.shape) if x.ndim < ndim else x
        keep = [i for i in range(ndim) if x.shape[i] != 1 and x.strides[i] != 0]
        index = tuple(slice(None) if i in keep else 0 for i in range(ndim))
        operands.append(x[index])
        subscripts.append("".join(_LETTERS[i] for i in keep))
        present.update(keep)
    out_axes = [i for i in range(ndim) if i in present and i not in reduced]
    spec = f"{subscripts[0]},{subscripts[1]}->{''.join(_LETTERS[i] for i in out_axes)}"
    result = np.asarray(np.einsum(spec, *operands, optimize=True)).astype(nd, copy=False)
    repeat = 1  # a summed axis along which both operands are broadcast adds up equal terms
    for i in reduced:
        if i not in present:
            repeat *= shape[i]
    if repeat != 1:
        result = (result * repeat).astype(nd, copy=False)
    result = result.reshape(tuple(shape[i] if i in out_axes else 1 for i in range(ndim)))
    full = tuple(1 if i in reduced else shape[i] for i in range(ndim))
    return result if result.shape == full else np.broadcast_to(result, full)


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
