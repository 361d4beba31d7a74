"""Indexing by integer tensors: `take`, `take_along_axis`, `x[idx]` (numpy advanced indexing) and `scatter_add`.

Contract: every gather is one tensor-level `Ops.GATHER` node (a real indexed load, O(output) work), built
from movement ops around it. The index rule is the same everywhere (DSL.md has no runtime errors): an index
`i` into an axis of size `n` is wrapped once if negative (`i + n`), then clamped into `[0, n)`. So `-1` is the
last element, `n + 5` reads the last element and `-n - 5` the first; no access is ever out of bounds. Indices
known at compile time (Python ints in an index) are checked instead: out of range is a compile-time error.
`scatter_add` is a masked reduction (O(output x indices) work), with the same index rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tgc.dsl.tensor import DslError, Tensor, _shape_error, broadcast_shapes
from tgc.dtype import dtypes
from tgc.ir.shapes import prod
from tgc.ir.uop import Ops, UOp


class IndexList(tuple):
    """`x[[0, 2]]`: an index array of compile-time ints (not a tuple of indices, one per axis)."""

    __slots__ = ()


def index_tensor(idx: Any, what: str = "indices") -> Tensor:
    """An index argument as an int tensor: an int tensor as is, a Python int or a tuple of ints as constants."""
    if isinstance(idx, Tensor):
        if idx.dtype.is_bool:
            raise DslError(f"{what} are bool: indexing with a mask gives a size that depends on the data",
                           hint="use where(mask, x, 0), or sum over the mask")
        if not idx.dtype.is_int:
            raise DslError(f"{what} must be integers, got {idx.dtype.name}", hint="cast them: cast(i, i32)")
        return idx
    if isinstance(idx, int) and not isinstance(idx, bool):
        return Tensor.const(idx, dtypes.i32 if -2**31 <= idx < 2**31 else dtypes.i64)
    if isinstance(idx, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in idx):
        return const_vector(idx)
    raise DslError(f"{what} must be an int tensor, an int or a tuple of ints, got {idx!r}")


def const_vector(values: tuple[int, ...]) -> Tensor:
    """A 1-d i32 (i64 if needed) tensor of compile-time ints, computed from the position (no buffer)."""
    dtype = dtypes.i32 if all(-2**31 <= v < 2**31 for v in values) else dtypes.i64
    n = len(values)
    if n == 0:
        return Tensor.const(0, dtype, (0,))
    pos = Tensor(UOp(Ops.IOTA, dtypes.i32, (), n))
    out = Tensor.const(values[-1], dtype, (n,))
    for k in range(n - 2, -1, -1):
        if values[k] != values[-1]:
            out = (pos == k).where(Tensor.const(values[k], dtype), out)
    return out


def gather(x: Tensor, idx: Tensor, axis: int) -> Tensor:
    """out[..., i, ...] = x[..., idx[..., i, ...], ...] along `axis` (x and idx of one ndim; the other axes
    broadcast). The primitive behind every gather: one GATHER node."""
    idx = index_tensor(idx)
    if idx.ndim != x.ndim:
        raise DslError(f"gather: indices have {idx.ndim} dims, values {x.ndim}")
    try:
        off = broadcast_shapes(tuple(1 if i == axis else s for i, s in enumerate(x.shape)),
                               tuple(1 if i == axis else s for i, s in enumerate(idx.shape)))
    except DslError:
        raise _shape_error(f"cannot broadcast indices {idx} with values {x} off axis {axis}") from None
    out_shape = tuple(idx.shape[axis] if i == axis else s for i, s in enumerate(off))
    src_shape = tuple(x.shape[axis] if i == axis else s for i, s in enumerate(off))
    if prod(out_shape) == 0:
        return Tensor.const(0, x.dtype, out_shape)
    if x.shape[axis] == 0:
        raise _shape_error(f"cannot index into axis {axis} of size 0 ({x})")
    x, idx = x.expand(src_shape), idx.expand(out_shape)
    if x.shape[axis] == 1:  # every index clamps to 0
        return x.expand(out_shape)
    return Tensor(UOp(Ops.GATHER, x.dtype, (x.uop, idx.uop), axis))


def take(x: Tensor, indices: Any, axis: int | None = None) -> Tensor:
    """numpy.take: out[pre, I..., post] = x[pre, indices[I...], post]; axis=None indexes the flattened x."""
    if axis is None:
        x, axis = x.flatten(), 0
    ax = x._axis(axis)
    if isinstance(indices, int) and not isinstance(indices, bool):
        n = x.shape[ax]
        if not -n <= indices < n:
            raise _shape_error(f"index {indices} is out of range for axis {ax} with size {n}")
    idx = index_tensor(indices)
    pre, post, k = x.shape[:ax], x.shape[ax + 1:], idx.ndim
    n = x.shape[ax]
    # values: pre + (1,)*k + (n,) + post; indices: (1,)*|pre| + I + (1,) + (1,)*|post|; gather along the n axis
    xv = x.reshape(pre + (1,) * k + (n,) + post)
    iv = idx.reshape((1,) * len(pre) + idx.shape + (1,) + (1,) * len(post))
    out = gather(xv, iv, len(pre) + k)
    return out.reshape(pre + idx.shape + post)


def take_along_axis(x: Tensor, indices: Any, axis: int | None = -1) -> Tensor:
    """numpy.take_along_axis: indices of x's ndim (axis=None: 1-d indices into the flattened x)."""
    idx = index_tensor(indices)
    if axis is None:
        if idx.ndim != 1:
            raise DslError(f"take_along_axis with axis=None needs 1-d indices, got {idx}")
        return gather(x.flatten(), idx, 0)
    ax = x._axis(axis)
    if idx.ndim != x.ndim:
        raise DslError(f"take_along_axis: indices {idx} and values {x} must have the same number of dims")
    return gather(x, idx, ax)


def _wrap_clamp(idx: Tensor, n: int) -> Tensor:
    """The index rule as tensor math (for scatter_add): wrap once if negative, then clamp into [0, n)."""
    if idx.dtype.is_unsigned:
        return idx.minimum(n - 1) if n - 1 < (1 << idx.dtype.bits) else idx
    i = idx.cast(dtypes.i64)  # i + n must not overflow a narrow dtype
    i = (i < 0).where(i + n, i)
    return i.maximum(0).minimum(n - 1)


def advanced_getitem(x: Tensor, items: list[Any], getitem: Callable[[Tensor, Any], Tensor]) -> Tensor:
    """numpy indexing where some items are int tensors: ints and tensors broadcast together; their result dims
    go where the first of them is when they are adjacent, else first (numpy's rule). `getitem` does the basic
    indexing (slices) first."""
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise DslError("an index can only have a single ellipsis ('...')")
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    if consumed > x.ndim:
        raise DslError(f"too many indices: {consumed} for a tensor with {x.ndim} dims")
    if any(i is Ellipsis for i in items):  # (`in` would compare tensors with ==)
        at = next(k for k, i in enumerate(items) if i is Ellipsis)
        items[at:at + 1] = [slice(None)] * (x.ndim - consumed)
    else:
        items += [slice(None)] * (x.ndim - consumed)
    # None: a new size-1 axis, indexed by a full slice
    shape, dim, per_dim = [], 0, []
    for it in items:
        if it is None:
            shape.append(1)
            per_dim.append(slice(None))
        else:
            shape.append(x.shape[dim])
            per_dim.append(it)
            dim += 1
    x = x.reshape(tuple(shape))
    advanced = [d for d, it in enumerate(per_dim) if not isinstance(it, slice) or isinstance(it, IndexList)]
    x = getitem(x, tuple(slice(None) if d in advanced else it for d, it in enumerate(per_dim)))
    idxs = []
    for d in advanced:
        it, n = per_dim[d], x.shape[d]
        for v in (it if isinstance(it, IndexList) else [it] if isinstance(it, int) else []):
            if not -n <= v < n:  # known at compile time: checked, not clamped
                raise _shape_error(f"index {v} is out of range for axis {d} with size {n}")
        idxs.append(index_tensor(it, "index arrays"))
    try:
        bshape = broadcast_shapes(*(i.shape for i in idxs))
    except DslError:
        raise _shape_error("index arrays cannot be broadcast together: " +
                           ", ".join(str(list(i.shape)) for i in idxs)) from None
    adjacent = advanced == list(range(advanced[0], advanced[-1] + 1))
    if not adjacent:
        rest = [d for d in range(x.ndim) if d not in advanced]
        x = x.permute(tuple(advanced) + tuple(rest))
        first = 0
    else:
        first = advanced[0]
    k = len(advanced)
    sizes = x.shape[first:first + k]
    if any(s == 0 for s in sizes) and prod(bshape) > 0:
        raise _shape_error(f"cannot index into an axis of size 0 ({x})")
    # one flat index into the merged advanced axes: sum of (wrapped, clamped) index * stride
    flat: Tensor | None = idxs[0] if k == 1 else None  # one index: the gather applies the rule itself
    stride = 1 if k > 1 else 0
    for i, n in zip(reversed(idxs), reversed(sizes)) if k > 1 else ():
        term = _wrap_clamp(i, max(n, 1)).cast(dtypes.i64)
        term = term * stride if stride != 1 else term
        flat = term if flat is None else flat + term
        stride *= n
    assert flat is not None
    merged = x.reshape(x.shape[:first] + (prod(sizes),) + x.shape[first + k:])
    return take(merged, flat.broadcast_to(bshape) if flat.shape != bshape else flat, axis=first)


def scatter_add(x: Tensor, axis: int, index: Any, src: Any) -> Tensor:
    """torch.scatter_add: a copy of x with src[..., i, ...] added at x[..., index[..., i, ...], ...] along
    `axis`; index and src broadcast to one shape, whose other axes must match x's. The result has x's dtype."""
    ax = x._axis(axis)
    idx = index_tensor(index)
    s = src if isinstance(src, Tensor) else Tensor.const(src, x.dtype)
    if idx.ndim != x.ndim:
        raise DslError(f"scatter_add: index {idx} and input {x} must have the same number of dims")
    try:
        shape = broadcast_shapes(idx.shape, s.shape)
    except DslError:
        raise _shape_error(f"scatter_add: cannot broadcast index {idx} with src {s}") from None
    if len(shape) != x.ndim or any(a != b for d, (a, b) in enumerate(zip(shape, x.shape)) if d != ax):
        raise _shape_error(f"scatter_add: index/src {list(shape)} must match input {x} except along axis {ax}")
    n, m = x.shape[ax], shape[ax]
    if n == 0 or m == 0:
        return x
    idx = _wrap_clamp(idx.expand(shape), n)
    s = s.cast(x.dtype).expand(shape)
    # (pre, n, m, post): position j of the output against entry i of the index
    wide = x.shape[:ax] + (n, m) + x.shape[ax + 1:]
    pos = Tensor(UOp(Ops.IOTA, dtypes.i32, (), n)).reshape(tuple(n if d == ax else 1 for d in range(len(wide))))
    hit = idx.unsqueeze(ax) == pos
    vals = s.unsqueeze(ax).expand(wide)
    if x.dtype.is_bool:
        return x | (hit & vals).max(ax + 1)
    acc = dtypes.f32 if x.dtype in (dtypes.f16, dtypes.bf16) else x.dtype
    zero = Tensor.const(0, acc)
    added = hit.where(vals.cast(acc), zero)._reduce(Ops.ADD, ax + 1, False)
    return (x.cast(acc) + added).cast(x.dtype)


__all__ = ["IndexList", "gather", "take", "take_along_axis", "advanced_getitem", "scatter_add", "index_tensor",
           "const_vector"]
