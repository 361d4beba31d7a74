"""The functions of DSL.md, each callable as `f(x, ...)` and, where the first argument is a tensor, `x.f(...)`.

Every entry takes already-evaluated values (tensors, Python numbers, dtypes, tuples) and returns a value;
argument errors raise `DslError`, which the front end positions in the source.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tgc.dsl import indexing, library, nnlib
from tgc.dsl import tensor as T
from tgc.dsl.tensor import DslError, Tensor, _pair, broadcast_shapes
from tgc.dtype import DType, dtypes
from tgc.ir.symsize import NotProbeable, NotTraceable, SymSize, type_text


def _tensor(x: Any, what: str = "argument") -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float)):
        return Tensor.const(x, Tensor.literal_dtype(x))
    raise DslError(f"{what} must be a tensor or a number, got {type_text(x)}")


def _shape_arg(args: tuple) -> tuple[int, ...]:
    """Accept f(x, (2, 3)), f(x, [2, 3]), f(x, 2, 3) and f(x, 6)."""
    if len(args) == 1 and isinstance(args[0], tuple):
        args = args[0]
    for a in args:
        if not isinstance(a, int) or isinstance(a, bool):
            raise DslError(f"a shape holds integers, got {a!r}")
    return tuple(args)


def _dtype_arg(d: Any) -> DType:
    if isinstance(d, DType):
        return d
    raise DslError(f"expected a dtype such as f32, got {d!r}")


def _bool_arg(v: Any, name: str) -> bool:
    if not isinstance(v, bool):
        raise DslError(f"{name} must be True or False")
    return v


def _elementwise(name: str) -> Callable:
    def fn(x):
        return getattr(_tensor(x), name)()
    fn.__name__ = name
    return fn


def _reduction(name: str) -> Callable:
    def fn(x, axis=None, keepdim=False):
        return getattr(_tensor(x), name)(axis, _bool_arg(keepdim, "keepdim"))
    fn.__name__ = name
    return fn


def where(cond, a, b):
    return _tensor(cond, "condition").where(a, b)


def maximum(a, b):
    return _tensor(a).maximum(b) if isinstance(a, Tensor) else _tensor(b).maximum(a)


def minimum(a, b):
    return _tensor(a).minimum(b) if isinstance(a, Tensor) else _tensor(b).minimum(a)


def pow_(a, b):
    if isinstance(a, Tensor):
        return a.pow(b)
    x, y = _pair(a, b)
    return x.pow(y)


def clip(x, lo, hi):
    return _tensor(x).clip(lo, hi)


def cast(x, dtype):
    return _tensor(x).cast(_dtype_arg(dtype))


def bitcast(x, dtype):
    return _tensor(x).bitcast(_dtype_arg(dtype))


def argmax(x, axis=None, keepdim=False):
    if isinstance(axis, tuple):
        raise DslError("argmax takes one axis or None")
    return _tensor(x).argmax(axis, _bool_arg(keepdim, "keepdim"))


def argmin(x, axis=None, keepdim=False):
    if isinstance(axis, tuple):
        raise DslError("argmin takes one axis or None")
    return _tensor(x).argmin(axis, _bool_arg(keepdim, "keepdim"))


def logsumexp(x, axis=None, keepdim=False):
    return _tensor(x).logsumexp(axis, _bool_arg(keepdim, "keepdim"))


def softmax(x, axis=-1):
    return _tensor(x).softmax(axis)


def log_softmax(x, axis=-1):
    return _tensor(x).log_softmax(axis)


def _ddof(ddof: Any, correction: Any) -> int:
    """The divisor's correction: numpy's `ddof=` or torch's `correction=` (one of them), 0 by default as numpy."""
    if ddof is not None and correction is not None:
        raise DslError("give ddof= or correction= (torch's name for it), not both")
    value = ddof if ddof is not None else correction if correction is not None else 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise DslError(f"{'ddof' if ddof is not None else 'correction'} must be a non-negative integer, got {value!r}")
    return value


def var(x, axis=None, keepdim=False, ddof=None, correction=None):
    return _tensor(x).var(axis, _bool_arg(keepdim, "keepdim"), _ddof(ddof, correction))


def std(x, axis=None, keepdim=False, ddof=None, correction=None):
    return _tensor(x).std(axis, _bool_arg(keepdim, "keepdim"), _ddof(ddof, correction))


def reshape(x, *shape):
    return _tensor(x).reshape(_shape_arg(shape))


def permute(x, *order):
    return _tensor(x).permute(_shape_arg(order))


def transpose(x, a=-2, b=-1):
    return _tensor(x).transpose(a, b) if _tensor(x).ndim >= 2 else _tensor(x)


def expand(x, *shape):
    return _tensor(x).expand(_shape_arg(shape))


def squeeze(x, axis=None):
    return _tensor(x).squeeze(axis)


def unsqueeze(x, axis):
    return _tensor(x).unsqueeze(axis)


def flatten(x, start=0, end=-1):
    return _tensor(x).flatten(start, end)


def pad(x, pads, value=0):
    t = _tensor(x)
    if not isinstance(pads, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in pads):
        raise DslError("pad takes ((before, after), ...) with one pair per axis")
    if isinstance(value, Tensor):
        raise DslError("the pad value must be a number")
    return t.pad(pads, value)


def flip(x, axis=None):
    return _tensor(x).flip(axis)


def _cat_list(args: tuple) -> list[Tensor]:
    items = list(args[0]) if len(args) == 1 and isinstance(args[0], tuple) else list(args)
    if not items:
        raise DslError("needs at least one tensor")
    return [_tensor(t) for t in items]


def cat(*tensors, axis=0):
    items = _cat_list(tensors)
    dtype = items[0].dtype
    for t in items[1:]:
        dtype = T.promote(dtype, t.dtype)
    items = [t.cast(dtype) for t in items]
    first = items[0]
    ax = first._axis(axis)
    for t in items[1:]:
        if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != ax):
            raise DslError(f"cat: shapes {first} and {t} differ outside axis {ax}", shape_dependent=True)
    total = sum(t.shape[ax] for t in items)
    out_shape = first.shape[:ax] + (total,) + first.shape[ax + 1:]
    # each piece padded into place; a mask along the axis picks the piece (exact, unlike adding zeros). The mask is
    # compared along the axis alone and broadcast after: it depends on no other axis, so a slice of the result
    # along another axis (a chunk of the batch, tgc.engine.chunk) reads the same mask whatever the slice
    pos = T._iota(total).reshape(tuple(total if i == ax else 1 for i in range(first.ndim)))
    result: Tensor | None = None
    offset = 0
    for t in items:
        n = t.shape[ax]
        pads = tuple((offset, total - offset - n) if i == ax else (0, 0) for i in range(t.ndim))
        placed = t.pad(pads)
        result = placed if result is None else (pos < offset).expand(out_shape).where(result, placed)
        offset += n
    assert result is not None
    return result


def stack(*tensors, axis=0):
    items = _cat_list(tensors)
    ax = items[0]._axis(axis, items[0].ndim + 1)
    return cat(*[t.unsqueeze(ax) for t in items], axis=ax)


def zeros(*shape, dtype=dtypes.f32):
    return T.full(_shape_arg(shape), 0, _dtype_arg(dtype))


def ones(*shape, dtype=dtypes.f32):
    return T.full(_shape_arg(shape), 1, _dtype_arg(dtype))


def full(shape, value, dtype=None):
    if isinstance(value, Tensor):
        raise DslError("full takes a number as its value")
    return T.full(_shape_arg((shape,)), value, None if dtype is None else _dtype_arg(dtype))


def arange(start, stop=None, step=1, dtype=None):
    for v in (start, stop, step):
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            raise DslError("arange takes numbers")
    return T.arange(start, stop, step, None if dtype is None else _dtype_arg(dtype))


def eye(n, m=None, dtype=dtypes.f32):
    return T.eye(n, m, _dtype_arg(dtype))


def matmul(a, b):
    return _tensor(a).matmul(_tensor(b))


def conv2d(x, w, stride=1, padding=0, dilation=1, groups=1):
    return _tensor(x).conv2d(_tensor(w), stride, padding, dilation, groups)


def max_pool2d(x, kernel, stride=None):
    return _tensor(x).max_pool2d(kernel, stride)


def avg_pool2d(x, kernel, stride=None):
    return _tensor(x).avg_pool2d(kernel, stride)


def layernorm(x, axis=-1, eps=1e-5):
    return _tensor(x).layernorm(axis, eps)


def index_list(values: Any) -> indexing.IndexList:
    """`x[[0, 2, 1]]`: a list of compile-time ints as an index array (checked against its axis when used)."""
    if not isinstance(values, tuple) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise DslError("an index list holds integers")
    return indexing.IndexList(values)


def _slice_length(start: int, stop: int, step: int) -> int:
    """`len(range(start, stop, step))` of sizes of the dims: a floor division by the step (`(C + 1) // 2` for
    `m[:, ::2]`, a `symsize.atom`), 0 where the range is empty."""
    span = stop - start if step > 0 else start - stop
    return max((span + abs(step) - 1) // abs(step), 0)


def _slice_indices(it: slice, size: int) -> tuple[int, int, int]:
    """`slice.indices(size)`; for a size of the dims (`SymSize`, traced once) the same clamps written with its
    comparisons (which the size class answers; `slice.indices` would read the raw number). A step other than
    1 and -1 clamps as they do; its length is a floor division of the size (`_slice_length`)."""
    if not any(isinstance(v, SymSize) for v in (size, it.start, it.stop, it.step)):
        return it.indices(size)
    # (a fixed axis sliced by sizes of the dims, `x[:, :N // 32]` of an f32[N, 64]: the same clamps, so that the
    # class answers them; `slice.indices` would read the sizes' raw numbers and bake one length in)
    step = 1 if it.step is None else it.step
    if isinstance(step, SymSize):
        raise NotProbeable("a slice with a step that depends on the dims")
    if not isinstance(step, int) or isinstance(step, bool) or step == 0:
        raise NotTraceable("a slice with a step that is not a constant")
    low, high = (0, size) if step > 0 else (-1, size - 1)  # as `slice.indices` clamps for the step's sign

    def clamp(v: int | None, default: int) -> int:
        if v is None:
            return default
        return max(v + size, low) if v < 0 else min(v, high)
    return clamp(it.start, 0 if step > 0 else size - 1), clamp(it.stop, size if step > 0 else -1), step


def getitem(x: Tensor, index: Any) -> Tensor:
    """numpy indexing: ints, slices (any step), None and a single `...`; int tensors (advanced indexing,
    `tgc.dsl.indexing`)."""
    items = list(index) if isinstance(index, tuple) and not isinstance(index, indexing.IndexList) else [index]
    if any(isinstance(i, (Tensor, indexing.IndexList)) for i in items):
        return indexing.advanced_getitem(x, items, getitem)
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise DslError("an index can only have a single ellipsis ('...')")
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    if consumed > x.ndim:
        raise DslError(f"too many indices: {consumed} for a tensor with {x.ndim} dims")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at:at + 1] = [slice(None)] * (x.ndim - consumed)
    else:
        items += [slice(None)] * (x.ndim - consumed)
    bounds, flips, steps, out_shape = [], [], [], []
    dim = 0
    for it in items:
        if it is None:
            out_shape.append(1)
            continue
        size = x.shape[dim]
        if isinstance(it, int):
            if not -size <= it < size:
                raise DslError(f"index {it} is out of range for axis {dim} with size {size}", shape_dependent=True)
            i = it % size
            bounds.append((i, i + 1))
            flips.append(False)
            steps.append(1)
        else:
            start, stop, step = _slice_indices(it, size)
            symbolic = any(isinstance(v, SymSize) for v in (size, start, stop))
            n = _slice_length(start, stop, step) if symbolic else len(range(start, stop, step))
            # (the stride takes every step-th element of the range from its start: the range's length is n
            # after it; ending the range at its stop, not after its last element, keeps a size's stop a size,
            # where `start + (n - 1) * step + 1` would ask whether a floor division divides)
            if step > 0:
                bounds.append((start, stop) if n else (start, start))
                flips.append(False)
            else:
                first = size - 1 - start  # position of `start` once the axis is flipped
                bounds.append((first, size - 1 - stop) if n else (0, 0))
                flips.append(True)
            steps.append(abs(step))
            out_shape.append(n)
        dim += 1
    t = x.flip(tuple(i for i, f in enumerate(flips) if f)) if any(flips) else x
    t = t.shrink(tuple(bounds)).stride(tuple(steps))
    return t.reshape(tuple(out_shape))


FUNCTIONS: dict[str, Callable] = {
    **{n: _elementwise(n) for n in ("exp", "log", "exp2", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh",
                                     "sigmoid", "relu", "gelu", "abs", "sign", "recip", "floor", "ceil", "trunc",
                                     "round", "square", "erf")},
    **{n: _reduction(n) for n in ("sum", "max", "min", "prod", "mean")},
    "maximum": maximum, "minimum": minimum, "pow": pow_, "clip": clip, "cast": cast, "bitcast": bitcast,
    "where": where, "argmax": argmax, "argmin": argmin, "logsumexp": logsumexp, "softmax": softmax,
    "log_softmax": log_softmax, "var": var, "std": std,
    "reshape": reshape, "permute": permute, "transpose": transpose, "expand": expand, "squeeze": squeeze,
    "unsqueeze": unsqueeze, "flatten": flatten, "pad": pad, "flip": flip, "cat": cat, "stack": stack,
    "zeros": zeros, "ones": ones, "full": full, "arange": arange, "eye": eye, "matmul": matmul,
    "conv2d": conv2d, "max_pool2d": max_pool2d, "avg_pool2d": avg_pool2d, "layernorm": layernorm,
    **library.FUNCTIONS,
    **nnlib.FUNCTIONS,
}
# other libraries' names of these functions (numpy, PyTorch): only what an unknown function's did-you-mean
# suggests, never names of the language (`concatenate(a, b)` is an error whose hint is `cat`)
ALIASES: dict[str, str] = {
    "concat": "cat", "concatenate": "cat", "amax": "max", "amin": "min", "power": "pow", "absolute": "abs",
    "reciprocal": "recip", "view": "reshape", "swapaxes": "transpose", "expand_dims": "unsqueeze",
    "broadcast_to": "expand", "mm": "matmul", "bmm": "matmul",
}
# functions whose first argument is not a tensor: no method form (`x.cat(y, axis=1)` is cat(x, y, axis=1))
NOT_METHODS = {"zeros", "ones", "full", "arange", "eye", *library.NOT_METHODS}
TAKES_STRINGS = library.TAKES_STRINGS | nnlib.TAKES_STRINGS  # the only functions a string literal may be passed to

__all__ = ["ALIASES", "FUNCTIONS", "NOT_METHODS", "TAKES_STRINGS", "getitem", "where", "broadcast_shapes"]
