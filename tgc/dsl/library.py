"""The operations models need beyond DSL.md's first list (docs/LANGUAGE.md documents each one).

Every function here is written once in terms of the core ops (elementwise ALU ops, REDUCE_AXIS, movement
ops and the GATHER of `tgc.dsl.indexing`), so it fuses like the functions of `tgc.dsl.functions` and runs
on every device. Names, signatures and semantics are numpy's where numpy has the function, else PyTorch's.
Argument errors raise `DslError`, which the front end positions in the source.

Work rules (docs/DESIGN.md "Language operations"): `cumsum`/`cumprod` along n elements do O(n * SCAN_BLOCK)
work (a masked reduction inside blocks of SCAN_BLOCK, then the scan of the block totals, recursively);
`sort`/`argsort`/`topk` count comparisons, O(n^2) per row; `scatter_add` is a masked reduction, O(n * m);
`take`/`take_along_axis`/`x[idx]` are indexed loads, O(output).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tgc.dsl import indexing
from tgc.dsl.tensor import DslError, Tensor, _pair, _shape_error
from tgc.dtype import DType, dtypes, promote, sum_dtype
from tgc.ir.symsize import type_text
from tgc.ir.uop import Ops, UOp

SCAN_BLOCK = 32  # cumsum/cumprod: rows up to this long are one masked reduction; longer ones are blocked


def _tensor(x: Any, what: str = "argument") -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float)):
        return Tensor.const(x, Tensor.literal_dtype(x))
    raise DslError(f"{what} must be a tensor or a number, got {type_text(x)}")


def _number(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DslError(f"{name} must be a number, got {v!r}")
    return v


def _int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise DslError(f"{name} must be an integer, got {v!r}")
    return v


def _dtype(d: Any) -> DType | None:
    if d is None or isinstance(d, DType):
        return d
    raise DslError(f"expected a dtype such as f32, got {d!r}")


def _iota(n: int) -> Tensor:
    return Tensor(UOp(Ops.IOTA, dtypes.i32, (), n))


def _in_f32(x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """A float function computed in f32 for f16/bf16 (rounded once at the end), else in x's own dtype."""
    x = x.float()
    if x.dtype.itemsize < 4:
        return fn(x.cast(dtypes.f32)).cast(x.dtype)
    return fn(x)


# ------------------------------------------------------------------------------------------------ elementwise


def _log1p(x: Tensor) -> Tensor:
    u = 1 + x
    # log(u) * x / (u - 1) cancels the rounding of 1 + x (Goldberg); exact x where 1 + x rounds to 1
    fixed = (u == 1).where(x, u.log() * (x / (u - 1)))
    return (u == math.inf).where(u, fixed)


def _expm1(x: Tensor) -> Tensor:
    u = x.exp()
    um1 = u - 1
    fixed = (u == 1).where(x, (um1 == -1).where(um1, um1 * (x / u.log())))
    return (u == math.inf).where(u, fixed)


def log1p(x):
    return _in_f32(_tensor(x), _log1p)


def expm1(x):
    return _in_f32(_tensor(x), _expm1)


def isnan(x):
    t = _tensor(x)
    return t != t if t.dtype.is_float else Tensor.const(False, dtypes.bool, t.shape)


def isinf(x):
    t = _tensor(x)
    return t.abs() == math.inf if t.dtype.is_float else Tensor.const(False, dtypes.bool, t.shape)


def isfinite(x):
    t = _tensor(x)
    return (t - t) == 0 if t.dtype.is_float else Tensor.const(True, dtypes.bool, t.shape)


def silu(x):
    t = _tensor(x).float()
    return t * t.sigmoid()


def softplus(x, beta=1.0, threshold=20.0):
    beta, threshold = _number(beta, "beta"), _number(threshold, "threshold")
    t = _tensor(x).float()
    bx = t * beta
    return (bx > threshold).where(t, _in_f32(bx, _log1p_exp) * (1.0 / beta))


def _log1p_exp(x: Tensor) -> Tensor:
    return _log1p(x.exp())


def elu(x, alpha=1.0):
    alpha = _number(alpha, "alpha")
    t = _tensor(x).float()
    return (t > 0).where(t, _in_f32(t, _expm1) * alpha)


def leaky_relu(x, negative_slope=0.01):
    slope = _number(negative_slope, "negative_slope")
    t = _tensor(x).float()
    return (t < 0).where(t * slope, t)


# Cephes atan (double precision): a rational function on [-0.66, 0.66] after range reduction
_ATAN_P = (-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1,
           -1.228866684490136173410e2, -6.485021904942025371773e1)
_ATAN_Q = (2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2,
           4.853903996359136964868e2, 1.945506571482613964425e2)
_T3P8 = 2.41421356237309504880  # tan(3 pi / 8)


def _atan(x: Tensor) -> Tensor:
    a = x.abs()
    big, mid = a > _T3P8, a > 0.66
    r = big.where(-(a.recip()), mid.where((a - 1) / (a + 1), a))
    y0 = big.where(Tensor.const(math.pi / 2, x.dtype), mid.where(Tensor.const(math.pi / 4, x.dtype),
                                                               Tensor.const(0.0, x.dtype)))
    z = r * r
    p = (((_ATAN_P[0] * z + _ATAN_P[1]) * z + _ATAN_P[2]) * z + _ATAN_P[3]) * z + _ATAN_P[4]
    q = ((((z + _ATAN_Q[0]) * z + _ATAN_Q[1]) * z + _ATAN_Q[2]) * z + _ATAN_Q[3]) * z + _ATAN_Q[4]
    y = y0 + (r * z * p / q + r)
    return (x < 0).where(-y, y)


def atan(x):
    return _in_f32(_tensor(x), _atan)


def _negative(t: Tensor) -> Tensor:
    """Sign bit set (-0.0 included), for floats."""
    return (t < 0) | ((t == 0) & (t.recip() < 0))


def atan2(y, x):
    """numpy.arctan2 (quadrants and signed zeros included), via atan of a ratio in [0, 1]."""
    a, b = _pair(y, x)
    dtype = a.dtype if a.dtype.is_float else dtypes.f32
    a, b = a.cast(dtype), b.cast(dtype)

    def fn(args: tuple[Tensor, Tensor]) -> Tensor:
        yy, xx = args
        ay, ax = yy.abs(), xx.abs()
        both_inf = (ay == math.inf) & (ax == math.inf)
        both_zero = (ay == 0) & (ax == 0)
        r = (ax >= ay).where(ay / ax, ax / ay)
        r = both_inf.where(Tensor.const(1.0, r.dtype), both_zero.where(Tensor.const(0.0, r.dtype), r))
        t = _atan(r)
        t = (ay > ax).where(math.pi / 2 - t, t)
        t = _negative(xx).where(math.pi - t, t)
        return _negative(yy).where(-t, t)

    if dtype.itemsize < 4:
        return fn((a.cast(dtypes.f32), b.cast(dtypes.f32))).cast(dtype)
    return fn((a, b))


def gelu(x, approximate="none"):
    t = _tensor(x)
    if approximate == "none":
        return t.gelu()
    if approximate != "tanh":
        raise DslError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    t = t.float()
    return 0.5 * t * (1 + (math.sqrt(2 / math.pi) * (t + 0.044715 * t * t * t)).tanh())


def clamp(x, min=None, max=None):  # noqa: A002 - torch's parameter names
    if min is None and max is None:
        raise DslError("clamp needs min or max (or both)")
    x = t = _tensor(x)
    if min is not None:
        t = t.maximum(min)
    if max is not None:
        t = t.minimum(max)
    return isnan(x).where(x, t) if x.dtype.is_float else t  # nan stays nan, as in torch


def astype(x, dtype):
    d = _dtype(dtype)
    if d is None:
        raise DslError("astype needs a dtype such as f32")
    return _tensor(x).cast(d)


def _fill(like: Tensor, value: Any, dtype: DType | None) -> Tensor:
    """A constant of `like`'s shape; the value converted as numpy's full_like does (ints truncate)."""
    if not isinstance(value, (bool, int, float)):
        raise DslError(f"the fill value must be a number, got {value!r}")
    d = dtype or like.dtype
    if d.is_bool:
        value = bool(value)
    elif d.is_int:
        if not math.isfinite(value):
            raise DslError(f"cannot fill a {d.name} tensor with {value}")
        value = math.trunc(value)
    return Tensor.const(value, d, like.shape)


def zeros_like(x, dtype=None):
    return _fill(_tensor(x), 0, _dtype(dtype))


def ones_like(x, dtype=None):
    return _fill(_tensor(x), 1, _dtype(dtype))


def full_like(x, fill_value, dtype=None):
    return _fill(_tensor(x), fill_value, _dtype(dtype))


# ------------------------------------------------------------------------------------------------ reductions


def _axis_opt(axis):
    if isinstance(axis, tuple) or axis is None:
        return axis
    return _int(axis, "axis")


def any_(x, axis=None, keepdim=False):
    t = _tensor(x)
    empty = _over_empty(t, _axis_opt(axis), _keep(keepdim), False)
    return empty if empty is not None else (t if t.dtype.is_bool else t != 0).max(_axis_opt(axis), _keep(keepdim))


def all_(x, axis=None, keepdim=False):
    t = _tensor(x)
    empty = _over_empty(t, _axis_opt(axis), _keep(keepdim), True)
    return empty if empty is not None else (t if t.dtype.is_bool else t != 0).min(_axis_opt(axis), _keep(keepdim))


def _over_empty(t: Tensor, axis, keepdim: bool, value: bool) -> Tensor | None:
    """any/all over an axis of size 0: numpy's answer (False for any, True for all) in the reduced shape; None
    where every reduced axis has elements (max/min, which have no identity there, do the work)."""
    axes = t._axes(axis)
    if not any(t.shape[a] == 0 for a in axes):
        return None
    shape = tuple(1 if i in axes else n for i, n in enumerate(t.shape)) if keepdim else \
        tuple(n for i, n in enumerate(t.shape) if i not in axes)
    return Tensor.const(value, dtypes.bool, shape)


def _keep(v: Any) -> bool:
    if not isinstance(v, bool):
        raise DslError("keepdim must be True or False")
    return v


# ------------------------------------------------------------------------------------------------ shapes


def _tri(x, k, lower: bool) -> Tensor:
    t = _tensor(x)
    k = _int(k, "k")
    if t.ndim < 2:
        raise DslError(f"{'tril' if lower else 'triu'} needs at least 2 dims, got {t}")
    n, m = t.shape[-2:]
    rows = _iota(n).reshape((n, 1))
    cols = _iota(m).reshape((1, m))
    keep = (cols - rows <= k) if lower else (cols - rows >= k)
    return keep.where(t, Tensor.const(0, t.dtype))


def tril(x, k=0):
    return _tri(x, k, True)


def triu(x, k=0):
    return _tri(x, k, False)


def _slice_axis(t: Tensor, ax: int, start: int, stop: int) -> Tensor:
    return t.shrink(tuple((start, stop) if i == ax else (0, s) for i, s in enumerate(t.shape)))


def split(x, indices_or_sections, axis=0):
    """numpy.split: n equal sections (n must divide the axis) or the pieces between sorted split points."""
    t = _tensor(x)
    ax = t._axis(axis)
    n = t.shape[ax]
    if isinstance(indices_or_sections, tuple):
        points = [_int(p, "a split point") for p in indices_or_sections]
        pieces = []
        for a, b in zip([0, *points], [*points, n]):  # x[a:b] along the axis, with Python's slice rules
            start, stop, _ = slice(a, b).indices(n)
            pieces.append(_slice_axis(t, ax, start, max(start, stop)))
        return tuple(pieces)
    sections = _int(indices_or_sections, "sections")
    if sections <= 0:
        raise DslError("split needs a positive number of sections")
    if n % sections:
        raise _shape_error(f"split: axis {ax} of size {n} does not divide into {sections} equal sections")
    size = n // sections
    return tuple(_slice_axis(t, ax, i * size, (i + 1) * size) for i in range(sections))


def chunk(x, chunks, axis=0):
    """torch.chunk: pieces of ceil(n / chunks) along the axis (the last one smaller; fewer when they run out)."""
    t = _tensor(x)
    ax = t._axis(axis)
    chunks = _int(chunks, "chunks")
    if chunks <= 0:
        raise DslError("chunk needs a positive number of chunks")
    n = t.shape[ax]
    size = max(1, -(-n // chunks))
    return tuple(_slice_axis(t, ax, b, min(b + size, n)) for b in range(0, n, size)) or (t,)


def repeat(x, repeats, axis=None):
    """numpy.repeat: each element `repeats` times along the axis (axis=None: of the flattened x); `repeats` an
    int or one int per element."""
    t = _tensor(x)
    if axis is None:
        t, axis = t.flatten(), 0
    ax = t._axis(axis)
    n = t.shape[ax]
    if isinstance(repeats, tuple) and len(repeats) == 1:
        repeats = repeats[0]
    if isinstance(repeats, tuple):
        reps = [_int(r, "repeats") for r in repeats]
        if len(reps) != n:
            raise _shape_error(f"repeat: {len(reps)} repeats for an axis of size {n}")
        if any(r < 0 for r in reps):
            raise DslError("repeat: repeats must not be negative")
        total = sum(reps)
        if total == 0:
            return Tensor.const(0, t.dtype, t.shape[:ax] + (0,) + t.shape[ax + 1:])
        pos = _iota(total)
        src = Tensor.const(0, dtypes.i32, (total,))
        edge = 0
        for r in reps[:-1]:  # the source of output position o is the number of element ends at or before o
            edge += r
            src = src + (pos >= edge).cast(dtypes.i32)
        return indexing.take(t, src, axis=ax)
    r = _int(repeats, "repeats")
    if r < 0:
        raise DslError("repeat: repeats must not be negative")
    wide = t.shape[:ax + 1] + (r,) + t.shape[ax + 1:]
    return t.unsqueeze(ax + 1).expand(wide).reshape(t.shape[:ax] + (n * r,) + t.shape[ax + 1:])


def tile(x, reps):
    """numpy.tile: the whole tensor repeated `reps` times per axis (shorter reps count from the last axis)."""
    t = _tensor(x)
    reps = reps if isinstance(reps, tuple) else (reps,)
    reps = tuple(_int(r, "reps") for r in reps)
    if any(r < 0 for r in reps):
        raise DslError("tile: reps must not be negative")
    nd = max(len(reps), t.ndim)
    reps = (1,) * (nd - len(reps)) + reps
    t = t.reshape((1,) * (nd - t.ndim) + t.shape)
    inter = tuple(v for s in t.shape for v in (1, s))
    wide = tuple(v for r, s in zip(reps, t.shape) for v in (r, s))
    return t.reshape(inter).expand(wide).reshape(tuple(r * s for r, s in zip(reps, t.shape)))


# ------------------------------------------------------------------------------------------------ scans


def _scan_last(x: Tensor, op: Ops) -> Tensor:
    """Inclusive scan of `op` (ADD, MUL) along the last axis of x, in x's dtype."""
    n = x.shape[-1]
    ident = Tensor.const(0 if op is Ops.ADD else 1, x.dtype)
    if n <= 1:
        return x
    lead = x.shape[:-1]
    if n <= SCAN_BLOCK:
        row = x.unsqueeze(-2).expand(lead + (n, n))  # row[..., i, j] = x[..., j]
        mask = _iota(n).reshape((1, n)) <= _iota(n).reshape((n, 1))
        return mask.where(row, ident)._reduce(op, x.ndim, False)
    m = -(-n // SCAN_BLOCK)
    padded = x.pad(((0, 0),) * len(lead) + ((0, m * SCAN_BLOCK - n),), 0 if op is Ops.ADD else 1)
    within = _scan_last(padded.reshape(lead + (m, SCAN_BLOCK)), op)  # (..., m, B)
    totals = _slice_axis(within, x.ndim, SCAN_BLOCK - 1, SCAN_BLOCK).reshape(lead + (m,))
    carried = _scan_last(totals, op)
    before = carried.pad(((0, 0),) * len(lead) + ((1, 0),), 0 if op is Ops.ADD else 1)
    before = _slice_axis(before, len(lead), 0, m).unsqueeze(-1)  # exclusive: the blocks before this one
    out = within + before if op is Ops.ADD else within * before
    return _slice_axis(out.reshape(lead + (m * SCAN_BLOCK,)), len(lead), 0, n)


def _scan(x, axis, op: Ops) -> Tensor:
    t = _tensor(x)
    if axis is None:
        t, axis = t.flatten(), 0
    ax = t._axis(axis)
    out_dtype = sum_dtype(t.dtype)
    acc = dtypes.f32 if t.dtype in (dtypes.f16, dtypes.bf16) else out_dtype
    order = tuple(i for i in range(t.ndim) if i != ax) + (ax,)
    moved = t.cast(acc).permute(order)
    if moved.numel == 0:
        return t.cast(out_dtype)
    back = tuple(order.index(i) for i in range(t.ndim))
    return _scan_last(moved, op).permute(back).cast(out_dtype)


def cumsum(x, axis=None):
    return _scan(x, axis, Ops.ADD)


def cumprod(x, axis=None):
    return _scan(x, axis, Ops.MUL)


# ------------------------------------------------------------------------------------------------ sorting


def _before(a: Tensor, b: Tensor, descending: bool) -> Tensor:
    """Whether value a sorts strictly before value b: ascending with nan last, or descending with nan first."""
    if descending:
        a, b = b, a
    lt = a < b
    if a.dtype.is_float:
        lt = lt | ((b != b) & (a == a))
    return lt


def _ranks(t: Tensor, descending: bool) -> Tensor:
    """The stable sorted position (i32) of every element along the last axis: how many sort before it."""
    n = t.shape[-1]
    x = t.cast(dtypes.u8) if t.dtype.is_bool else t
    lead = x.shape[:-1]
    mine = x.unsqueeze(-1).expand(lead + (n, n))  # [..., i, j] = x[i]
    other = x.unsqueeze(-2).expand(lead + (n, n))  # [..., i, j] = x[j]
    j_first = _iota(n).reshape((1, n)) < _iota(n).reshape((n, 1))
    same = (other == mine) | ((other != other) & (mine != mine)) if x.dtype.is_float else other == mine
    ahead = _before(other, mine, descending) | (same & j_first)
    return ahead.cast(dtypes.i32)._reduce(Ops.ADD, x.ndim, False)


def _argsort_last(t: Tensor, descending: bool) -> Tensor:
    n = t.shape[-1]
    rank = _ranks(t, descending)  # (..., n): position of element i
    lead = t.shape[:-1]
    # order[..., r] = the i whose rank is r (a masked sum; ranks are a permutation)
    hit = rank.unsqueeze(-2).expand(lead + (n, n)) == _iota(n).reshape((n, 1))
    return hit.where(_iota(n).reshape((1, n)), Tensor.const(0, dtypes.i32))._reduce(Ops.ADD, t.ndim, False)


def _last_axis(t: Tensor, axis: Any) -> tuple[Tensor, tuple[int, ...] | None]:
    ax = t._axis(_int(axis, "axis"))
    if ax == t.ndim - 1:
        return t, None
    order = tuple(i for i in range(t.ndim) if i != ax) + (ax,)
    return t.permute(order), tuple(order.index(i) for i in range(t.ndim))


def argsort(x, axis=-1, descending=False):
    t = _tensor(x)
    if axis is None:
        t, axis = t.flatten(), 0
    if t.ndim == 0:
        return Tensor.const(0, dtypes.i32)
    moved, back = _last_axis(t, axis)
    out = _argsort_last(moved, _keep(descending)) if moved.shape[-1] > 1 else \
        Tensor.const(0, dtypes.i32, moved.shape)
    return out.permute(back) if back else out


def sort(x, axis=-1, descending=False):
    t = _tensor(x)
    if axis is None:
        t, axis = t.flatten(), 0
    if t.ndim == 0 or t.shape[t._axis(_int(axis, "axis"))] <= 1:
        return t
    moved, back = _last_axis(t, axis)
    out = indexing.gather(moved, _argsort_last(moved, _keep(descending)), moved.ndim - 1)
    return out.permute(back) if back else out


def topk(x, k, axis=-1, largest=True, sorted=True):  # noqa: A002 - torch's parameter name
    """torch.topk: (values, indices) of the k largest (or smallest) along the axis, in order; ties by index."""
    t = _tensor(x)
    if t.ndim == 0:
        raise DslError("topk needs a tensor with at least 1 dim")
    k = _int(k, "k")
    _keep(sorted)
    moved, back = _last_axis(t, axis)
    n = moved.shape[-1]
    if not 0 <= k <= n:
        raise _shape_error(f"topk: k = {k} is out of range for an axis of size {n}")
    order = _argsort_last(moved, _keep(largest)) if n > 1 else Tensor.const(0, dtypes.i32, moved.shape)
    idx = _slice_axis(order, moved.ndim - 1, 0, k)
    values = indexing.gather(moved, idx, moved.ndim - 1)
    if back:
        return values.permute(back), idx.permute(back)
    return values, idx


# ------------------------------------------------------------------------------------------------ einsum

_LETTERS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _parse_einsum(spec: str, ndims: list[int]) -> tuple[list[list[str]], list[str]]:
    """Subscripts per operand and of the output; `...` becomes the letters '0', '1', ... (broadcast dims)."""
    spec = spec.replace(" ", "")
    if "->" in spec:
        lhs, rhs = spec.split("->", 1)
        if "->" in rhs:
            raise DslError("einsum: more than one '->'")
    else:
        lhs, rhs = spec, None
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        raise DslError(f"einsum: the subscripts name {len(terms)} operands, {len(ndims)} given")
    ell = max((nd - len(t.replace("...", "")) for t, nd in zip(terms, ndims) if "..." in t), default=0)
    out_terms: list[list[str]] = []
    for t, nd in zip(terms, ndims):
        bad = set(t.replace("...", "")) - _LETTERS
        if bad or t.count("...") > 1:
            raise DslError(f"einsum: invalid subscripts '{t}'")
        if "..." in t:
            pre, post = t.split("...")
            k = nd - len(pre) - len(post)
            if k < 0:
                raise DslError(f"einsum: subscripts '{t}' name more dims than the operand's {nd}")
            letters = list(pre) + [str(ell - k + i) for i in range(k)] + list(post)
        else:
            letters = list(t)
        if len(letters) != nd:
            raise DslError(f"einsum: subscripts '{t}' name {len(letters)} dims, the operand has {nd}")
        out_terms.append(letters)
    if rhs is None:
        counts: dict[str, int] = {}
        for letters in out_terms:
            for c in letters:
                counts[c] = counts.get(c, 0) + 1
        out = [str(i) for i in range(ell)] + sorted(c for c, k in counts.items() if k == 1 and c in _LETTERS)
    else:
        bad = set(rhs.replace("...", "")) - _LETTERS
        if bad or rhs.count("...") > 1:
            raise DslError(f"einsum: invalid output subscripts '{rhs}'")
        pre, _, post = rhs.partition("...") if "..." in rhs else (rhs, "", "")
        out = list(pre) + ([str(i) for i in range(ell)] if "..." in rhs else []) + list(post)
        if len(set(out)) != len(out):
            raise DslError(f"einsum: output subscripts '{rhs}' repeat a letter")
        known = {c for letters in out_terms for c in letters}
        for c in out:
            if c not in known:
                raise DslError(f"einsum: output letter '{c}' names no operand dim")
        if "..." not in rhs and ell:
            broadcast = [str(i) for i in range(ell)]
            if any(c in known for c in broadcast):
                out = broadcast + out  # numpy puts dims of an ellipsis in front when the output omits it
    return out_terms, out


def _diagonal(t: Tensor, letters: list[str]) -> tuple[Tensor, list[str]]:
    """Repeated letters in one operand ('ii'): keep the diagonal (a strided view of the merged axes)."""
    while len(set(letters)) != len(letters):
        c = next(c for c in letters if letters.count(c) > 1)
        a = letters.index(c)
        b = letters.index(c, a + 1)
        if t.shape[a] != t.shape[b]:
            raise _shape_error(f"einsum: letter '{c}' has sizes {t.shape[a]} and {t.shape[b]}")
        order = [i for i in range(t.ndim) if i not in (a, b)] + [a, b]
        n = t.shape[a]
        t = t.permute(tuple(order)).reshape(tuple(t.shape[i] for i in order[:-2]) + (n * n,))
        if n > 1:
            t = t.stride((1,) * (t.ndim - 1) + (n + 1,))
        letters = [letters[i] for i in order[:-2]] + [c]
    return t, letters


def einsum(subscripts, *operands):
    """numpy.einsum: products of the operands summed over the letters the output does not name."""
    if not isinstance(subscripts, str):
        raise DslError("einsum takes the subscripts first, as a string: einsum('ij,jk->ik', a, b)")
    if not operands:
        raise DslError("einsum needs at least one operand")
    ts = [_tensor(o, "an einsum operand") for o in operands]
    terms, out = _parse_einsum(subscripts, [t.ndim for t in ts])
    dtype = ts[0].dtype
    for t in ts[1:]:
        dtype = promote(dtype, t.dtype)
    sizes: dict[str, int] = {}
    prepared = []
    for t, letters in zip(ts, terms):
        t, letters = _diagonal(t.cast(dtype), letters)
        for c, s in zip(letters, t.shape):
            if s != 1 and sizes.get(c, 1) not in (1, s):
                raise _shape_error(f"einsum: letter '{c}' has sizes {sizes[c]} and {s}")
            if s != 1 or c not in sizes:
                sizes[c] = s
        prepared.append((t, letters))
    summed = sorted({c for _, letters in prepared for c in letters} - set(out))
    order = out + summed
    full = tuple(sizes[c] for c in order)
    acc = dtypes.f32 if dtype in (dtypes.f16, dtypes.bf16) else dtype
    product: Tensor | None = None
    for t, letters in prepared:
        perm = tuple(letters.index(c) for c in order if c in letters)
        t = t.permute(perm) if perm else t
        t = t.reshape(tuple(sizes[c] if c in letters else 1 for c in order) if order else ())
        t = t.cast(acc).expand(full)
        product = t if product is None else product * t
    assert product is not None
    if not summed:
        return product.cast(dtype)
    axes = tuple(range(len(out), len(order)))
    if acc.is_bool:
        return product.max(axes)
    return product._reduce(Ops.ADD, axes, False).cast(dtype)


# ------------------------------------------------------------------------------------------------ indexing


def take(x, indices, axis=None):
    return indexing.take(_tensor(x), indices, None if axis is None else _int(axis, "axis"))


def take_along_axis(x, indices, axis=-1):
    return indexing.take_along_axis(_tensor(x), indices, None if axis is None else _int(axis, "axis"))


def gather(x, axis, index):
    """torch.gather: out[..., i, ...] = x[..., index[..., i, ...], ...] along `axis`; index has x's number of
    dims and, off the axis, at most x's sizes (the leading part of x is read), as torch requires."""
    t = _tensor(x)
    ax = t._axis(_int(axis, "axis"))
    idx = indexing.index_tensor(index)
    if idx.ndim != t.ndim:
        raise DslError(f"gather: index {idx} and input {t} must have the same number of dims")
    if any(i > s for d, (i, s) in enumerate(zip(idx.shape, t.shape)) if d != ax):
        raise _shape_error(f"gather: index {idx} is larger than input {t} off axis {ax}")
    part = t.shrink(tuple((0, s) if d == ax else (0, i) for d, (i, s) in enumerate(zip(idx.shape, t.shape))))
    return indexing.gather(part, idx, ax)


def scatter_add(x, axis, index, src):
    return indexing.scatter_add(_tensor(x), _int(axis, "axis"), index, src)


FUNCTIONS: dict[str, Callable] = {
    "log1p": log1p, "expm1": expm1, "isnan": isnan, "isinf": isinf, "isfinite": isfinite, "silu": silu,
    "softplus": softplus, "elu": elu, "leaky_relu": leaky_relu, "atan": atan, "atan2": atan2, "gelu": gelu,
    "clamp": clamp, "astype": astype, "zeros_like": zeros_like, "ones_like": ones_like, "full_like": full_like,
    "any": any_, "all": all_, "tril": tril, "triu": triu, "split": split, "chunk": chunk, "repeat": repeat,
    "tile": tile, "cumsum": cumsum, "cumprod": cumprod, "sort": sort, "argsort": argsort, "topk": topk,
    "einsum": einsum, "take": take, "take_along_axis": take_along_axis, "gather": gather,
    "scatter_add": scatter_add,
}
# numpy-only names that read better spelled out in messages
NOT_METHODS = {"einsum"}
TAKES_STRINGS = {"einsum", "gelu"}  # einsum's subscripts, gelu's approximate=

__all__ = ["FUNCTIONS", "NOT_METHODS", "TAKES_STRINGS", "SCAN_BLOCK"]
