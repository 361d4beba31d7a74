"""Shapes computed from the inputs' symbolic sizes (`dim_param`), as exported models compute them: Shape ->
Gather -> Unsqueeze -> Concat -> Reshape (with -1 and 0), Expand by a shape, ConstantOfShape, Tile, Range and
TopK's k from a size. ONNX's shape inference (with data propagation) follows some of these and leaves the rest
unknown (`unk__0`), after which every later value is untyped.

Contract: `propagate(graph, shapes, consts)` follows the top-level nodes' small integer values (rank 0 or 1) as
size expressions: ints, `Mono`s (a coefficient times a product of `.tg` dim names) and `Text`s (any other exact
size expression, as `.tg` text: a sum, a difference). `mul/add/sub/div` keep them exact: a division of sizes only
where it divides; a product of dims by a positive int, where it does not, as `//` (ONNX's truncating Div and
`.tg`'s floor agree on nonnegative sizes), except for a Reshape's -1 and Range's count, which must divide. It
returns ({value: (rank, sizes)} for the values it knows, {output: its shape} for the outputs of shape-consuming
nodes that it can compute). `translate` pins those shapes into the model's value_info (a compound size as a
fresh dim_param standing for its `.tg` text) and runs ONNX's inference again, so every later value is typed in
the dims; the op functions read the size lists (`Ctx.size_values`) for TopK's k, Tile's repeats and Range's
limit. A value it cannot follow is simply not known: the translation then needs the dims' values (`NeedDims`)
as before. Nothing here decides an order or an equality that depends on the sizes, except that a size is never
negative (Equal(size, -1) is false: PyTorch's exporter writes that test).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Mono:
    """`coef * product of names` (names: `.tg` dim names, sorted, repeated for powers)."""

    coef: int
    names: tuple[str, ...]

    def text(self) -> str:
        parts = ([str(self.coef)] if self.coef != 1 else []) + list(self.names)
        return "*".join(parts) if self.names else str(self.coef)


@dataclass(frozen=True)
class Text:
    """Any other exact size expression, as parenthesized `.tg` text. `terms`: where it is a sum, its terms
    ((names, coef), ...; names () for the constant), so sums combine like terms (`(past + seq) - past` is
    `seq`); `lo`: a lower bound at every size (dims at least 0), where one is known. Equality is by the text."""

    text: str
    terms: tuple | None = field(default=None, compare=False)
    lo: int | None = field(default=None, compare=False)


Size = Any  # int | Mono | Text


def norm(v: Size) -> Size:
    if isinstance(v, Mono) and (v.coef == 0 or not v.names):
        return v.coef
    return v


def text(v: Size) -> str:
    return str(v) if isinstance(v, int) else v.text if isinstance(v, Text) else v.text()


def _mono(v: Size) -> Mono | None:
    return Mono(v, ()) if isinstance(v, int) else v if isinstance(v, Mono) else None


def mul(a: Size, b: Size) -> Size:
    ma, mb = _mono(a), _mono(b)
    if ma is not None and mb is not None:
        return norm(Mono(ma.coef * mb.coef, tuple(sorted(ma.names + mb.names))))
    la, lb = lower(a), lower(b)
    return Text(f"({text(a)} * {text(b)})", lo=la * lb if la is not None and lb is not None and min(la, lb) >= 0
                else None)


def lower(v: Size) -> int | None:
    """A lower bound of `v` at every size (each dim at least 0; a dim may be 0), or None where none is known."""
    if isinstance(v, int):
        return v
    if isinstance(v, Mono):
        return 0 if v.coef >= 0 else None
    return v.lo


def _terms(v: Size) -> dict | None:
    if isinstance(v, int):
        return {(): v}
    if isinstance(v, Mono):
        return {v.names: v.coef}
    return dict(v.terms) if v.terms is not None else None


def _sum(terms: dict) -> Size:
    """The size of a sum of terms: an int or a Mono where one term is left, else a Text with its terms."""
    terms = {n: c for n, c in terms.items() if c}
    if not terms:
        return 0
    if len(terms) == 1:
        (names, coef), = terms.items()
        return norm(Mono(coef, names))
    monos = [(n, c) for n, c in terms.items() if n]
    const = terms.get((), 0)
    order = [m for m in monos if m[1] > 0] + [m for m in monos if m[1] < 0]
    order = order + [((), const)] if const and order[0][1] > 0 else ([((), const)] if const else []) + order
    out = ""
    for i, (n, c) in enumerate(order):
        t = text(norm(Mono(abs(c) if i else c, n)))
        out = t if not i else f"{out} {'-' if c < 0 else '+'} {t}"
    lo = const if all(c > 0 for n, c in monos) else None
    return Text(f"({out})", tuple(order), lo)


def add(a: Size, b: Size) -> Size:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if b == 0:
        return a
    if a == 0:
        return b
    ta, tb = _terms(a), _terms(b)
    if ta is not None and tb is not None:  # (a sum of monomials: like terms combined)
        for n, c in tb.items():
            ta[n] = ta.get(n, 0) + c
        return _sum(ta)
    la, lb = lower(a), lower(b)
    lo = la + lb if la is not None and lb is not None else None
    if isinstance(b, int) and b < 0:
        return Text(f"({text(a)} - {-b})", lo=lo)
    return Text(f"({text(a)} + {text(b)})", lo=lo)


def sub(a: Size, b: Size) -> Size:
    if isinstance(b, int):
        return add(a, -b)
    mb = _mono(b)
    if mb is not None:
        return add(a, Mono(-mb.coef, mb.names)) if a != 0 else norm(Mono(-mb.coef, mb.names))
    tb = _terms(b)
    if tb is not None:
        return add(a, _sum({n: -c for n, c in tb.items()}))
    return Text(f"({text(a)} - {text(b)})")


def div(a: Size, b: Size, exact: bool = False) -> Size | None:
    """ONNX's integer Div `a / b` (truncating): of two ints; of sizes where it divides exactly; with `exact`
    False also a product of dims by a positive int as `//` (truncation is the floor on nonnegative sizes);
    else None. `exact`: only where `a` is known to be a multiple of `b` (a Reshape's -1, Range's count)."""
    if isinstance(a, int) and isinstance(b, int):
        if b == 0 or (exact and a % b):
            return None
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b > 0) else -q
    ma, mb = _mono(a), _mono(b)
    if not exact and ma is not None and ma.coef > 0 and isinstance(b, int) and b > 0 and ma.coef % b:
        return Text(f"({text(a)} // {b})", lo=0)  # (a nonnegative size by a positive int: truncation is the floor)
    if ma is None or mb is None or mb.coef == 0 or ma.coef % mb.coef:
        return None
    names = list(ma.names)
    for n in mb.names:
        if n not in names:
            return None
        names.remove(n)
    return norm(Mono(ma.coef // mb.coef, tuple(names)))


def _binary(op: str, a: list, b: list) -> list | None:
    if len(a) != len(b) and 1 not in (len(a), len(b)):
        return None
    n = max(len(a), len(b))
    a, b = (a * n if len(a) == 1 else a), (b * n if len(b) == 1 else b)
    fn = {"Mul": mul, "Add": add, "Sub": sub, "Div": div}[op]
    out = [fn(x, y) for x, y in zip(a, b)]
    return None if any(v is None for v in out) else out


def _equal(a: Size, b: Size) -> bool | None:
    if a == b:
        return True
    if isinstance(a, int) and isinstance(b, int):
        return False
    for x, y in ((a, b), (b, a)):  # a size is never negative
        if isinstance(y, int) and y < 0 and isinstance(x, Mono) and x.coef > 0:
            return False
    return None


def propagate(graph: Any, shapes: dict[str, tuple | None], consts: dict[str, np.ndarray]
              ) -> tuple[dict[str, tuple[int, list]], dict[str, list]]:
    """({value: (rank, sizes)} for the small integer values known as size expressions, {value: shape} for the
    outputs of shape-consuming nodes computed from them). `shapes`: the values' shapes as the translation has
    them (ints and `.tg` dim names; None where unknown); `consts`: initializers and Constant values."""
    known: dict[str, tuple[int, list]] = {}
    out_shapes: dict[str, list] = {}

    def sizes(name: str) -> tuple[int, list] | None:
        if not name:
            return None
        if name in known:
            return known[name]
        c = consts.get(name)
        if c is not None and c.dtype.kind in "iu" and c.ndim <= 1 and c.size <= 64:
            return c.ndim, [int(v) for v in c.reshape(-1)]
        if c is not None and c.dtype == np.bool_ and c.ndim <= 1 and c.size <= 64:
            return c.ndim, [bool(v) for v in c.reshape(-1)]
        return None

    def shape_sizes(name: str) -> list | None:
        s = shapes.get(name)
        if name in out_shapes:
            s = tuple(out_shapes[name])
        if s is None:
            return None
        out = []
        for d in s:
            if isinstance(d, int):
                out.append(d)
            elif isinstance(d, str) and d.isidentifier():
                out.append(Mono(1, (d,)))
            elif isinstance(d, (Mono, Text)):
                out.append(d)
            else:
                return None
        return out

    for node in graph.node:
        op, ins, outs = node.op_type, list(node.input), list(node.output)
        at = {a.name: a for a in node.attribute}
        try:
            got = _node(op, ins, at, sizes, shape_sizes)
        except (ValueError, IndexError, TypeError, KeyError, ZeroDivisionError, AttributeError):
            got = None
        if got is None:
            continue
        vals, shp = got
        if vals is not None and outs and outs[0]:
            known[outs[0]] = vals
        for o, s in zip(outs, shp or []):
            if o and s is not None:
                out_shapes[o] = s
    return known, out_shapes


def _ival(a: Any) -> int:
    return int(a.i)


def _node(op: str, ins: list, at: dict, sizes: Any, shape_sizes: Any) -> tuple | None:
    """(the output's (rank, sizes) or None, [output shapes] or None) for one node; None where unknown."""
    s = [sizes(i) for i in ins]
    if op == "Shape":
        sh = shape_sizes(ins[0])
        if sh is None:
            return None
        start = _ival(at["start"]) if "start" in at else 0
        end = _ival(at["end"]) if "end" in at else len(sh)
        return (1, sh[slice(start, end)]), None
    if op == "Size":
        sh = shape_sizes(ins[0])
        return ((0, [math.prod(sh, start=1) if all(isinstance(d, int) for d in sh) else _prod(sh)]), None) \
            if sh is not None else None
    if op in ("Identity", "Cast"):
        if s[0] is None or (op == "Cast" and _ival(at["to"]) not in (6, 7)):  # (to int32, int64)
            return None
        return (s[0][0], [int(v) if isinstance(v, bool) else v for v in s[0][1]]), None  # (bool to 0/1)
    if op == "Gather" and s[0] is not None and s[0][0] == 1 and s[1] is not None:
        axis = _ival(at["axis"]) if "axis" in at else 0
        if axis not in (0, -1):
            return None
        data = s[0][1]
        picked = [data[i] for i in s[1][1]]
        return (s[1][0], picked), None
    if op in ("Unsqueeze", "Squeeze") and s[0] is not None:
        rank = s[0][0] + (1 if op == "Unsqueeze" else -1)
        return ((rank, s[0][1]), None) if 0 <= rank <= 1 else None
    if op == "Concat" and all(v is not None and v[0] == 1 for v in s):
        return (1, [x for v in s for x in v[1]]), None
    if op == "Slice" and s[0] is not None and s[0][0] == 1 and all(v is not None for v in s[1:]):
        if any(not isinstance(x, int) for v in s[1:] for x in v[1]):
            return None
        st, en = s[1][1][0], s[2][1][0]
        step = s[4][1][0] if len(s) > 4 else 1
        return (1, s[0][1][slice(st, en, step)]), None
    if op == "Slice" and len(ins) >= 3 and all(s[i] is not None for i in range(1, len(ins)) if ins[i]):
        # every bound known as an int, every sliced axis of a fixed size: ONNX's clamping, as ops._slice does
        sh = shape_sizes(ins[0])
        vals = [v[1] if v is not None else None for v in s[1:]] + [None] * (5 - len(s))
        starts, ends, axes, steps = vals[0], vals[1], vals[2], vals[3]
        if sh is None or any(not isinstance(x, int) for v in (starts, ends, axes, steps) if v for x in v):
            return None
        axes = axes if axes is not None else list(range(len(starts)))
        steps = steps if steps is not None else [1] * len(starts)
        out = list(sh)
        for st, en, ax, sp in zip(starts, ends, axes, steps):
            ax = ax + len(sh) if ax < 0 else ax
            if not isinstance(sh[ax], int) or sp == 0:
                return None
            d = sh[ax]
            st, en = (st + d if st < 0 else st), (en + d if en < 0 else en)
            st, en = (min(max(st, 0), d), min(max(en, 0), d)) if sp > 0 else (min(max(st, 0), d - 1),
                                                                                min(max(en, -1), d - 1))
            out[ax] = len(range(st, en, sp))
        return None, [out]
    if op in ("Mul", "Add", "Sub", "Div") and s[0] is not None and s[1] is not None:
        vals = _binary(op, s[0][1], s[1][1])
        return ((max(s[0][0], s[1][0]), vals), None) if vals is not None else None
    if op == "Equal" and s[0] is not None and s[1] is not None:
        a, b = s[0][1], s[1][1]
        n = max(len(a), len(b))
        eq = [_equal(x, y) for x, y in zip(a * n if len(a) == 1 else a, b * n if len(b) == 1 else b)]
        return ((max(s[0][0], s[1][0]), eq), None) if None not in eq else None
    if op == "Where" and all(v is not None for v in s):
        c, a, b = (v[1] for v in s)
        n = max(len(c), len(a), len(b))
        c, a, b = ((v * n if len(v) == 1 else v) for v in (c, a, b))
        return (max(v[0] for v in s), [x if k else y for k, x, y in zip(c, a, b)]), None
    # shape-consuming nodes: their output shapes
    if op == "Reshape" and len(ins) > 1 and s[1] is not None:
        return None, [_reshape(shape_sizes(ins[0]), s[1][1], bool(_ival(at["allowzero"])) if "allowzero" in at
                               else False)]
    if op == "Expand" and s[1] is not None:
        return None, [_broadcast(shape_sizes(ins[0]), s[1][1])]
    if op == "ConstantOfShape" and s[0] is not None:
        shape = list(s[0][1])
        return (_filled(shape, at.get("value")), [shape])
    if op == "Tile" and s[1] is not None:
        sh = shape_sizes(ins[0])
        return None, [[mul(d, r) for d, r in zip(sh, s[1][1])] if sh is not None and len(sh) == len(s[1][1])
                      else None]
    if op == "Range" and all(v is not None and v[0] == 0 for v in s):
        start, limit, delta = (v[1][0] for v in s)
        n = div(sub(limit, start), delta, exact=True) if delta != 1 else sub(limit, start)  # (its count is a
        # ceiling, known where it divides, and max(count, 0): a size only where it is at least 0 at every size)
        lo = lower(n) if n is not None else None
        if lo is None or lo < 0:
            return None
        return None, [[n]]
    if op == "TopK" and len(ins) > 1 and s[1] is not None and len(s[1][1]) == 1:
        sh = shape_sizes(ins[0])
        if sh is None:
            return None
        axis = _ival(at["axis"]) if "axis" in at else -1
        axis = axis + len(sh) if axis < 0 else axis
        shape = [s[1][1][0] if i == axis else d for i, d in enumerate(sh)]
        return None, [shape, list(shape)]
    return None


def _filled(shape: list, value: Any) -> tuple[int, list] | None:
    """The values of ConstantOfShape's small integer output (PyTorch's expand writes ConstantOfShape(Shape(size),
    1) and compares the sizes with it times -1), where `shape` is a rank-0 or rank-1 int list; else None."""
    from onnx import numpy_helper

    if len(shape) > 1 or any(not isinstance(d, int) for d in shape) or value is None:
        return None
    v = numpy_helper.to_array(value.t).reshape(-1)
    if v.size != 1 or v.dtype.kind not in "iub" or (shape and shape[0] > 64):
        return None
    x = bool(v[0]) if v.dtype.kind == "b" else int(v[0])
    return len(shape), [x] * (shape[0] if shape else 1)


def _prod(sh: list) -> Size:
    out: Size = 1
    for d in sh:
        out = mul(out, d)
    return out


def _reshape(x: list | None, want: list, allowzero: bool) -> list | None:
    shape = list(want)
    for i, v in enumerate(shape):
        if v == 0 and not allowzero:
            if x is None or i >= len(x):
                return None
            shape[i] = x[i]
    if shape.count(-1) > 1 or any(isinstance(v, int) and v < -1 for v in shape):
        return None
    if -1 in shape:
        if x is None:
            return None
        rest = _prod([v for v in shape if v != -1])
        n = div(_prod(x), rest, exact=True)
        if n is None:
            return None
        shape[shape.index(-1)] = n
    return shape


def _broadcast(x: list | None, want: list) -> list | None:
    if x is None:
        return None
    n = max(len(x), len(want))
    a, b = [1] * (n - len(x)) + x, [1] * (n - len(want)) + want
    out = []
    for p, q in zip(a, b):
        if p == q or q == 1:
            out.append(p)
        elif p == 1:
            out.append(q)
        else:
            return None  # (two sizes not known equal: the broadcast is decided by their values)
    return out
