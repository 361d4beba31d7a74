"""A numpy evaluation of a tensor graph in float64 (ints exact), each float result rounded once to its own dtype
(`_round_to`: a narrowing cast narrows, f32's overflow is inf): the reference behind `tgc run --check`.

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
    return _walk(root, env, with_scale=False)[0]


def evaluate_with_scale(root: UOp, env: dict[UOp, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(`evaluate(root, env)`, the error scale s of every element: rounding gives it an error of about u * s; see
    "scales" below). Where the analysis has no finite answer (0 * inf) the scale is 0, so the output's own scale
    decides."""
    value, var = _walk(root, env, with_scale=True)
    scale = np.sqrt(np.nan_to_num(np.asarray(var, dtype=np.float64), nan=0.0, posinf=np.inf))
    return value, np.broadcast_to(scale, value.shape)


def _walk(root: UOp, env: dict[UOp, np.ndarray], with_scale: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Every node once in topological order (a sum of products as one contraction): root's float64 value and,
    `with_scale`, its rounding variance (in units of u^2)."""
    order = root.toposort()
    contractions = _contractions(order)
    skipped = {n for chain in contractions.values() for n in chain}
    memo: dict[UOp, np.ndarray] = {}
    var: dict[UOp, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for node in order:
            if node in skipped:
                continue
            chain = contractions.get(node)
            if chain is not None:
                mul = chain[-1]
                x, y = memo[mul.src[0]], memo[mul.src[1]]
                memo[node] = _round_to(_contract(x, y, node.arg[1], _np_dtype(node.dtype)), node.dtype)
                if with_scale:
                    var[node] = _exact_where_not_finite(
                        memo[node], _contraction_variance(node, x, y, var[mul.src[0]], var[mul.src[1]]))
            else:
                srcs = [memo[s] for s in node.src]
                memo[node] = _eval(node, srcs, env)
                if node.op not in _MOVES and node.op is not Ops.BUFFER:
                    memo[node] = _round_to(memo[node], node.dtype)
                if with_scale:
                    c = _variance(node, memo[node], srcs, [var[s] for s in node.src])
                    var[node] = c if node.op in _MOVES else _exact_where_not_finite(memo[node], c)
    return memo[root], var.get(root)


def _round_to(v: np.ndarray, d: DType | None) -> np.ndarray:
    """A float64 value rounded to the float dtype `d` it stands for (held as float64 again): every op's result is
    rounded once to its own dtype, as the kernels do (half floats are computed in f32 and rounded after each op,
    DESIGN.md), so a narrowing cast, a value that overflows its type (1e20 * 1e20 in f32 is inf) and an int
    computed from a rounded float (cast(x + 1.0, i32)) agree with them. f64 and non-float values as they are."""
    if d is None or not d.is_float or d.itemsize >= 8:
        return v
    if d.name == "bf16":  # round to nearest even from f32, as the kernels' conversion does
        return bf16_to_f32(f32_to_bf16(v.astype(np.float32))).astype(np.float64)
    return v.astype(d.np).astype(np.float64)


# movement ops move the values' variances with them: a non-finite value's was cleared where it was computed
_MOVES = (Ops.CONTIGUOUS, Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.SHRINK, Ops.FLIP, Ops.STRIDE, Ops.WINDOW, Ops.PAD)


def _exact_where_not_finite(v: np.ndarray, var: np.ndarray) -> np.ndarray:
    """A value that is inf or nan carries no variance: it is compared exactly, and its square (inf) must not
    reach the finite values computed from it (a causal mask's `-inf` through `exp`: 0 * inf made their variance
    nan, which the scale reads as 0, so a masked softmax was checked without its rounding)."""
    if var.ndim == 0 and var == 0:  # (nothing to clear; and a moved value is often a broadcast view, whose
        return var                   # isfinite would allocate every element it repeats)
    finite = np.isfinite(v)
    return var if finite.all() else np.where(finite, var, 0.0)


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


def _contract(a: np.ndarray, b: np.ndarray, axes: tuple[int, ...], nd: np.dtype, squares: bool | str = False
              ) -> np.ndarray:
    """`np.sum(a * b, axis=axes, keepdims=True)` without materializing `a * b`; with `squares`, of a^2 and b^2
    (True), or of a and b^2 ("b"), or of a^2 and b ("a"), squared once the broadcast axes are dropped."""
    shape = np.broadcast_shapes(a.shape, b.shape)
    ndim = len(shape)
    if ndim > len(_LETTERS):
        sa = _sq(a) if squares is True or squares == "a" else a
        sb = _sq(b) if squares is True or squares == "b" else b
        return np.sum(sa * sb, axis=axes, keepdims=True, dtype=nd)
    reduced = {ax % ndim if ndim else ax for ax in axes}
    operands, subscripts, present = [], [], set()
    for which, x in (("a", a), ("b", b)):
        x = x.reshape((1,) * (ndim - x.ndim) + x.shape) if x.ndim < ndim else x
        # (an empty axis may have stride 0 too: it is kept, not indexed at 0)
        keep = [i for i in range(ndim) if x.shape[i] != 1 and (x.strides[i] != 0 or x.shape[i] == 0)]
        index = tuple(slice(None) if i in keep else 0 for i in range(ndim))
        operands.append(_sq(x[index]) if squares is True or squares == which else x[index])
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
        return np.arange(arg, dtype=d.np)
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


# ------------------------------------------------------------------------------------------------ scales
# `--check` measures a float output's error against the scale its computation gives it (`tgc.engine.compare`).
# Beside the float64 values, a first-order error analysis in the statistical (root-sum-square) model: every
# operation rounds its result by a relative error of about u (the unit roundoff), independently, and its
# derivative carries its operands' errors forward. Each float node gets a variance s^2 (in units of u^2) with
# u * s the size of the error rounding gives it:
#
# - an operation adds its own |result|^2 and its operands' variances times its derivative squared
#   (a + b: sa^2 + sb^2; a * b: b^2 sa^2 + a^2 sb^2; exp: exp^2 sa^2; 1/a: sa^2 / a^4; ...);
# - a sum of n terms adds the terms' variances and n times the sum of their squares (each addition rounds a
#   partial sum), so a long reduction of cancelling terms (a matmul, a mean of centred data) is measured against
#   the magnitudes it added up, as DSL.md asks, and so is everything computed from it (a softmax of large logits,
#   a layernorm of nearly equal values);
# - a max takes the variance of its largest element, `where` that of the value it picks; inputs, literals'
#   exact values and int and bool results have none (a float literal rounds: |v|^2).


def _sq(x: np.ndarray) -> np.ndarray:
    x = x if x.dtype.kind == "f" else x.astype(np.float64)
    return x * x


def _var_alu(op: Ops, v: np.ndarray, x: list[np.ndarray], c: list[np.ndarray]) -> np.ndarray:
    """The variance of one float ALU result `v` from its operands `x` and their variances `c` (first order)."""
    v2 = _sq(v)
    if op is Ops.NEG:
        return c[0]
    if op in (Ops.ADD, Ops.SUB):
        return v2 + c[0] + c[1]
    if op is Ops.MUL:
        return v2 + c[0] * _sq(x[1]) + c[1] * _sq(x[0])
    if op is Ops.FDIV:
        return v2 + (c[0] + c[1] * v2) / _sq(x[1])
    if op is Ops.RECIP:
        return v2 + c[0] * v2 * v2
    if op is Ops.SQRT:
        return v2 + c[0] / (4 * v2)
    if op is Ops.EXP2:
        return v2 + v2 * np.log(2) ** 2 * c[0]
    if op is Ops.LOG2:
        return v2 + c[0] / (_sq(x[0]) * np.log(2) ** 2)
    if op is Ops.SIN:
        return v2 + c[0]
    if op is Ops.MAX:
        return np.where(x[0] >= x[1], c[0], c[1])
    if op is Ops.WHERE:
        return np.where(x[0], c[1], c[2])
    if op is Ops.TRUNC:
        return c[0]
    if op in (Ops.MOD, Ops.IDIV):
        return v2 + c[0] + c[1] * (_sq(x[0]) / _sq(x[1]))
    return v2 + sum(c, np.zeros(()))  # any other float operation: its rounding and its sources' errors


def _variance(u: UOp, v: np.ndarray, x: list[np.ndarray], c: list[np.ndarray]) -> np.ndarray:
    op, arg, d = u.op, u.arg, u.dtype
    if d is None or not d.is_float or op in (Ops.BUFFER, Ops.IOTA, Ops.BITCAST):
        return np.zeros(())
    if op is Ops.CONST:
        return _sq(v)
    if op is Ops.CAST:
        return _sq(v) + (c[0] if u.src[0].dtype.is_float else 0)
    if op in (Ops.CONTIGUOUS, Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.SHRINK, Ops.FLIP, Ops.STRIDE, Ops.WINDOW):
        return _eval(u, [np.broadcast_to(c[0], x[0].shape)], {})  # moved as the values are
    if op is Ops.PAD:
        return np.pad(np.broadcast_to(c[0], x[0].shape), arg[0])
    if op is Ops.REDUCE_AXIS:
        rop, axes = arg
        n = int(np.prod([x[0].shape[a] for a in axes]))
        if rop is Ops.ADD:
            return np.sum(n * _sq(x[0]) + c[0], axis=axes, keepdims=True)
        if rop is Ops.MAX:  # the variance of the largest element (of the largest of ties)
            return np.max(np.where(x[0] == v, c[0], 0.0), axis=axes, keepdims=True, initial=0.0)
        rel = np.where(x[0] != 0, c[0] / np.where(x[0] != 0, _sq(x[0]), 1.0), 0.0)  # MUL: relative variances add
        return _sq(v) * (n + np.sum(rel, axis=axes, keepdims=True))
    if op in ALU:
        return _var_alu(op, v, x, c)
    return _sq(v)


def _contraction_variance(node: UOp, a: np.ndarray, b: np.ndarray, ca: np.ndarray, cb: np.ndarray) -> np.ndarray:
    """The variance of a sum of products `sum(a * b)` over node's axes: each product rounds and each partial sum
    of them, (n + 1) sum (a b)^2, plus the operands' own errors carried through."""
    if not node.dtype.is_float:
        return np.zeros(())
    f64 = np.dtype(np.float64)
    shape = np.broadcast_shapes(a.shape, b.shape)
    n = int(np.prod([shape[ax] for ax in node.arg[1]]))
    c = (n + 1) * _contract(a, b, node.arg[1], f64, squares=True)
    if ca.any():
        c = c + _contract(np.broadcast_to(ca, a.shape), b, node.arg[1], f64, squares="b")
    if cb.any():
        c = c + _contract(a, np.broadcast_to(cb, b.shape), node.arg[1], f64, squares="a")
    return c
