"""The shape of a tensor-level UOp, derived from its op and arg (never stored twice)."""

from __future__ import annotations

from tgc.ir.uop import ALU, Ops, UOp


def shape_of(u: UOp) -> tuple[int, ...]:
    try:
        return u._shape
    except AttributeError:
        u._shape = shape = _shape(u)  # a value derived from the node alone (see `UOp.__slots__`)
        return shape


def _shape(u: UOp) -> tuple[int, ...]:
    op, arg = u.op, u.arg
    if op is Ops.BUFFER:
        return tuple(arg[2])
    if op is Ops.CONST:
        return ()
    if op is Ops.IOTA:
        return (arg,)
    if op in ALU or op in (Ops.CAST, Ops.BITCAST, Ops.CONTIGUOUS):
        return shape_of(u.src[-1]) if op is Ops.WHERE else shape_of(u.src[0])
    if op is Ops.GATHER:
        return shape_of(u.src[1])
    if op in (Ops.RESHAPE, Ops.EXPAND):
        return tuple(arg)
    src = shape_of(u.src[0])
    if op is Ops.PERMUTE:
        return tuple(src[i] for i in arg)
    if op is Ops.PAD:
        return tuple(s + b + a for s, (b, a) in zip(src, arg[0]))
    if op is Ops.SHRINK:
        return tuple(e - b for b, e in arg)
    if op is Ops.FLIP:
        return src
    if op is Ops.STRIDE:
        return tuple((s + st - 1) // st for s, st in zip(src, arg))
    if op is Ops.WINDOW:
        axis, k, stride, dil = arg
        out = (src[axis] - dil * (k - 1) - 1) // stride + 1
        return src[:axis] + (max(out, 0), k) + src[axis + 1:]
    if op is Ops.REDUCE_AXIS:
        axes = arg[1]
        return tuple(1 if i in axes else s for i, s in enumerate(src))
    raise ValueError(f"no shape for {op}")


def prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def strides_for(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Contiguous (row-major) strides in elements."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))
