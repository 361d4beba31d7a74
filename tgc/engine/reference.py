"""A numpy evaluation of a tensor graph in float64 (ints exact): the reference behind `tgc run --check`.

It reads the same tensor-level UOps the compiler does, so it checks lowering, optimization and the
backends; the front end's own decompositions (floor division, argmax, ...) are checked against plain
numpy in the tests.
"""

from __future__ import annotations

import numpy as np

from tgc.dtype import DType, bf16_to_f32, dtypes, f32_to_bf16
from tgc.ir.alu import cast, exec_alu, reducer
from tgc.ir.uop import ALU, Ops, UOp


def _np_dtype(d: DType) -> np.dtype:
    return np.dtype(np.float64) if d.is_float else d.np


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
        src = u.src[0].dtype
        return cast(s[0], dtypes.f64 if src.is_float else src.scalar(), dtypes.f64 if d.is_float else d.scalar())
    if op is Ops.BITCAST:
        src_d = u.src[0].dtype
        # a bf16 source is held as float64 here: its bits are those of the value as bf16 (2 bytes, not 8)
        x = s[0].astype(src_d.np) if src_d.fmt else f32_to_bf16(s[0].astype(np.float32))
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
    if op is Ops.GATHER:  # indices wrap once if negative, then clamp into range (as the kernels do)
        n = s[0].shape[arg]
        j = s[1].astype(np.int64) if s[1].dtype.kind == "i" else np.minimum(s[1], max(n - 1, 0)).astype(np.int64)
        j = np.clip(np.where(j < 0, j + n, j), 0, max(n - 1, 0))
        return np.take_along_axis(s[0], j, axis=arg)
    if op is Ops.REDUCE_AXIS:
        rop, axes = arg
        x = s[0]
        fn, ident = reducer(rop, dtypes.f64 if d.is_float else d.scalar())
        kw = {} if d.is_bool else {"dtype": x.dtype}
        return fn.reduce(x, axis=axes, keepdims=True, initial=ident, **kw)
    if op in ALU:  # floats are computed in float64, ints and bools in their own dtype
        cd = u.src[1].dtype if op is Ops.WHERE else u.src[0].dtype
        return exec_alu(op, dtypes.f64 if cd.is_float else cd.scalar(), s)
    raise NotImplementedError(f"reference: {op}")
