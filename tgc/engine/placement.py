"""Concatenations written in place: each piece stored straight into its slice of the concatenated buffer.

A realized node that is a concatenation along one axis (`cat`: a chain of `WHERE(pos < offset, left, PAD(piece))`
over an `IOTA` of the axis; a split matmul's join: `ADD(PAD(main), PAD(rest))` with zero fills) is not computed
by one kernel that copies its pieces. The scheduler (`tgc.engine.schedule._schedule`) gives it one kernel per
piece instead, each storing the piece's values at its offset along the axis of the concatenated buffer:

- a piece that is itself realized (a convolution, a matmul part) and read by nothing but this concatenation is
  *placed*: its own kernel stores into the slice, and its buffer never exists (the copy and the piece's memory
  are gone: unet's `cat(up, skip)`, a split matmul's main part and remainder);
- any other piece (read elsewhere too, or elementwise work fused into the piece) gets a kernel of its own that
  computes or copies it into the slice.

Contract of `find_concats`: only pieces that cover the axis exactly once, in order, with static sizes, the
same dtype as the concatenation, and a mask that is provably the comparison of the axis position with the
piece's offset; anything else returns nothing and the node stays one kernel. Pure graph matching: no device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tgc.ir.shapes import shape_of
from tgc.ir.uop import ALU, Ops, UOp


@dataclass
class Concat:
    """`node` along `axis`: `pieces[i]` = (offset, size, source) in order; `placed`: the sources whose own kernel
    stores into the slice (see the module docstring)."""

    node: UOp
    axis: int
    pieces: list[tuple[int, int, UOp]]
    placed: dict[UOp, UOp] = field(default_factory=dict)  # source -> the realized root it is (or reshapes)
    root: UOp | None = None  # the kernel root whose buffer is written: `node`, or elementwise work over it
    path: frozenset = frozenset()  # the nodes from `root` down to `node` (both included)

    @property
    def root_axis(self) -> int:
        """The concatenation's axis in `root`'s coordinates (reshapes on the path only add or drop 1s)."""
        return self._axis_at(self.root)

    def _axis_at(self, u: UOp | None) -> int:
        assert u is not None
        if u is self.node:
            return self.axis
        v = next(x for x in u.src if x in self.path)
        a = self._axis_at(v)
        return _moved_axis(a, shape_of(v), shape_of(u)) if u.op is Ops.RESHAPE else a

    def piece_value(self, off: int, size: int, src: UOp) -> UOp:
        """`root`'s values over the piece at `off` (of `size` along the axis): `node` replaced by the piece's source,
        every other operand of the elementwise work above it shrunk to the piece's region."""
        assert self.root is not None
        memo: dict[UOp, UOp] = {}

        def walk(u: UOp, axis: int) -> UOp:
            if u is self.node:
                return src
            if u not in memo:
                if u in self.path:
                    a = self._axis_at(u)
                    if u.op is Ops.RESHAPE:
                        arg = tuple(size if i == a else d for i, d in enumerate(u.arg))
                        memo[u] = UOp(Ops.RESHAPE, u.dtype, (walk(u.src[0], a),), arg)
                    else:
                        memo[u] = UOp(u.op, u.dtype, tuple(walk(x, a) for x in u.src), u.arg)
                else:
                    region = tuple((off, off + size) if i == axis else (0, d) for i, d in enumerate(shape_of(u)))
                    memo[u] = UOp(Ops.SHRINK, u.dtype, (u,), region)
            return memo[u]
        return walk(self.root, self.root_axis)


def _const_value(u: UOp) -> object:
    while u.op in (Ops.EXPAND, Ops.RESHAPE):
        u = u.src[0]
    return u.arg if u.op is Ops.CONST else None


def _mask_offset(mask: UOp, shape: tuple, axis: int) -> int | None:
    """The offset `c` where `mask` is `position along axis < c` (as `tgc.dsl.functions.cat` builds it), else None."""
    while mask.op is Ops.EXPAND:
        mask = mask.src[0]
    if mask.op is not Ops.CMPLT:
        return None
    pos, bound = mask.src
    iota = pos.src[0] if pos.op is Ops.RESHAPE else pos
    if iota.op is not Ops.IOTA or iota.arg != shape[axis]:
        return None
    want = tuple(shape[axis] if i == axis else 1 for i in range(len(shape)))
    c = _const_value(bound)
    if shape_of(pos) != want or isinstance(c, bool) or not isinstance(c, int):
        return None
    return c


def _pad_piece(u: UOp, add: bool) -> tuple[int, tuple[int, int, UOp]] | None:
    """(axis, (offset, size, source)) of a PAD along one axis (with a zero fill where an ADD joins it)."""
    if u.op is not Ops.PAD:
        return None
    pads, fill = u.arg
    axes = [i for i, p in enumerate(pads) if p != (0, 0)]
    if len(axes) != 1 or (add and fill != 0):
        return None
    a = axes[0]
    size = shape_of(u.src[0])[a]
    if not isinstance(size, int) or u.src[0].dtype != u.dtype:
        return None
    return a, (pads[a][0], size, u.src[0])


def _pieces(u: UOp) -> tuple[int, list[tuple[int, int, UOp]]] | None:
    """The pieces of a concatenation node (they cover exactly the span from the first's offset to the last's end,
    consecutively), or None."""
    if u.op is Ops.PAD:
        got = _pad_piece(u, add=False)
        return None if got is None else (got[0], [got[1]])
    shape = shape_of(u)
    if u.op is Ops.WHERE:
        _, left, right = u.src
        r = _pad_piece(right, add=False)
        if r is None:
            return None
        axis, piece = r
        if _mask_offset(u.src[0], shape, axis) != piece[0] or piece[0] + piece[1] != shape[axis]:
            return None
        got = _pieces(left)
        if got is None or got[0] != axis or got[1][0][0] != 0 or got[1][-1][0] + got[1][-1][1] != piece[0]:
            return None
        return axis, got[1] + [piece]
    if u.op is Ops.ADD:
        parts = [_join_piece(s) for s in _sum_terms(u)]
        if any(p is None or p[0] != parts[0][0] for p in parts):  # type: ignore[index]
            return None
        axis = parts[0][0]  # type: ignore[index]
        pieces = sorted((q for p in parts for q in p[1]), key=lambda t: t[0])  # type: ignore[index]
        if any(a[0] + a[1] != b[0] for a, b in zip(pieces, pieces[1:])):
            return None
        return axis, pieces
    return None


def _join_piece(u: UOp) -> tuple[int, list[tuple[int, int, UOp]]] | None:
    """(axis, pieces) of one term of a join: a zero-filled PAD of one piece, or of a join along the same axis
    covering the PAD's source (a split part split again: its own parts, at their offsets in the whole)."""
    got = _pad_piece(u, add=True)
    if got is None:
        return None
    axis, (off, size, src) = got
    inner = _pieces(src) if src.op is Ops.ADD else None
    if inner is None or inner[0] != axis or inner[1][0][0] != 0 or inner[1][-1][0] + inner[1][-1][1] != size:
        return axis, [(off, size, src)]
    return axis, [(off + o, n, s) for o, n, s in inner[1]]


def _inner_join(u: UOp) -> UOp | None:
    """The join that PAD `u` pads, where `_join_piece` takes its pieces apart; else None."""
    got = _join_piece(u) if u.op is Ops.PAD and u.src[0].op is Ops.ADD else None
    return None if got is None or got[1][0][2] is u.src[0] else u.src[0]


def _sum_nodes(u: UOp) -> list[UOp]:
    """The nodes of a join (`u` first): its tree of ADDs, and the PADs of joins inside it with those joins (walked
    without recursion: a long sum is a deep tree)."""
    out, stack = [u], list(reversed(u.src))
    while stack:
        s = stack.pop()
        if s.op is Ops.ADD:
            out.append(s)
            stack.extend(reversed(s.src))
        elif (inner := _inner_join(s)) is not None:
            out += [s, inner]
            stack.extend(reversed(inner.src))
    return out


def _sum_terms(u: UOp) -> list[UOp]:
    """The terms of a tree of ADDs (a join of more than two parts: `((p0 + p1) + p2) + ...`, each a PAD), left to
    right (walked without recursion)."""
    out, stack = [], list(reversed(u.src))
    while stack:
        s = stack.pop()
        if s.op is Ops.ADD:
            stack.extend(reversed(s.src))
        else:
            out.append(s)
    return out


def concat_of(node: UOp) -> Concat | None:
    """`node` as a concatenation covering its whole axis (see the module docstring), or None."""
    shape = shape_of(node)
    if node.op not in (Ops.WHERE, Ops.ADD) or not all(isinstance(s, int) for s in shape):
        return None
    got = _pieces(node)
    if got is None:
        return None
    axis, pieces = got
    if pieces[0][0] != 0 or pieces[-1][0] + pieces[-1][1] != shape[axis] or len(pieces) < 2:
        return None
    for _off, size, src in pieces:
        want = shape[:axis] + (size,) + shape[axis + 1:]
        if shape_of(src) != want or src.dtype != node.dtype:
            return None
    return Concat(node, axis, pieces)


def find_concats(roots: list[UOp], outputs: list[UOp], keep: set[UOp]) -> dict[UOp, Concat]:
    """The realized concatenations among `roots` (kernel roots), each with the pieces it places (realized roots read
    by nothing but the concatenation's own PAD, no program output, none in `keep`: nodes whose kernels are
    special, a fused attention's). A concatenation in `keep`, or with no piece to place, is left whole."""
    reader_sets: dict[UOp, set[UOp]] = {}
    for out in outputs:
        for n in out.toposort():
            for s in n.src:
                reader_sets.setdefault(s, set()).add(n)
    readers = {u: len(r) for u, r in reader_sets.items()}
    root_set, outs = set(roots), set(outputs)
    found: dict[UOp, Concat] = {}
    matched = {root: c for root in roots if root not in keep
               for c in [_concat_below(root, root_set, reader_sets)] if c is not None}
    placed_anywhere: set[UOp] = set()
    for root, c in matched.items():
        if c.node.op is Ops.ADD and any(readers.get(t, 0) != 1 for t in _sum_nodes(c.node) if t is not c.node):
            continue  # a partial sum of the join read elsewhere too: its pieces keep their buffers
        pads = _pad_nodes(c.node)
        for _off, _size, src in c.pieces:
            pad_readers = [p for p in pads if p.src[0] is src]
            if len(pad_readers) != 1 or readers.get(pad_readers[0], 0) != 1:
                continue
            r = _placed_root(src, root_set, readers)
            # (a root that is itself a concatenation keeps its buffer: its own pieces may be placed into it)
            if r is not None and r not in outs and r not in keep and r not in placed_anywhere and r not in matched:
                c.placed[src] = r
                placed_anywhere.add(r)
        if c.placed:  # else one kernel copying every piece is as small, and one launch
            found[root] = c
    return found


_ELEMENTWISE = ALU | {Ops.CAST, Ops.RESHAPE}
_SAME_SHAPE = ALU | {Ops.CAST}


def _squeezed(shape: tuple) -> tuple:
    return tuple(d for d in shape if d != 1)


def _moved_axis(axis: int, src: tuple, dst: tuple) -> int:
    """`axis` of `src` (size > 1) in `dst`, a reshape that only adds or drops axes of size 1."""
    k = sum(1 for d in src[:axis] if d != 1)
    return [i for i, d in enumerate(dst) if d != 1][k]


def _concat_below(root: UOp, roots: set[UOp], readers: dict[UOp, set[UOp]]) -> Concat | None:
    """The one concatenation that kernel root `root` is, or computes elementwise (a bias and an activation after a
    split matmul's join), its value and everything on the way read by no other kernel; None where there is none or
    more than one."""
    found, stack, seen = [], [root], set()
    while stack:
        u = stack.pop()
        if u in seen or (u in roots and u is not root):
            continue
        seen.add(u)
        c = concat_of(u)
        if c is not None:
            found.append(c)
        elif u.op in _SAME_SHAPE or (u.op is Ops.RESHAPE and _squeezed(u.arg) == _squeezed(shape_of(u.src[0]))):
            stack.extend(u.src)
    if len(found) != 1 or _squeezed(shape_of(found[0].node)) != _squeezed(shape_of(root)):
        return None
    c = found[0]
    path = frozenset(u for u in seen if u.op in _SAME_SHAPE | {Ops.RESHAPE} and c.node in u.toposort()) | {c.node}
    if any(u is not root and not readers.get(u, set()) <= path for u in path):
        # its value is read by another kernel too, or in this kernel at other positions than its own (review 20:
        # `h + flip(h)` over a split matmul's join read the other piece's region, which no buffer then held)
        return None
    if any(_inline_reduction(x, roots) for u in path if u is not c.node for x in u.src if x not in path):
        return None  # a reduction computed in the epilogue (a split's rest of steps) would join each piece's loop
    c.root, c.path = root, path
    return c


def _placed_root(src: UOp, roots: set[UOp], readers: dict[UOp, int]) -> UOp | None:
    """The one kernel root that `src` computes elementwise (through ALU ops, casts and reshapes, which keep
    every element at its row-major position: each element of the root is used for one element of `src`), read by
    nothing else, not even through a node on the way; None where there is none or more than one."""
    found, stack, seen = [], [src], set()
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u in roots:
            found.append(u)
            continue
        if u.op in _ELEMENTWISE:
            stack.extend(u.src)
        elif _inline_reduction(u, roots):
            return None  # a second reduction in the producer's kernel: its loops would no longer be one matmul's
    if len(found) != 1 or readers.get(found[0], 0) != 1:
        return None
    r = found[0]
    if any(u is not r and readers.get(u, 0) != 1 and r in u.toposort() for u in seen):
        return None  # the root's values reach another reader through a node on the way (a skip connection)
    return r


def _inline_reduction(u: UOp, roots: set[UOp]) -> bool:
    """Whether computing `u` in a kernel runs a reduction of its own (one not read from a kernel root's buffer)."""
    stack, seen = [u], set()
    while stack:
        n = stack.pop()
        if n in seen or n in roots or n.op is Ops.BUFFER:
            continue
        seen.add(n)
        if n.op is Ops.REDUCE_AXIS:
            return True
        stack.extend(n.src)
    return False


def _pad_nodes(node: UOp) -> list[UOp]:
    """The PAD nodes of a concatenation's chain (the pieces' direct readers)."""
    out, stack = [], [node]
    while stack:
        u = stack.pop()
        if u.op is Ops.PAD:
            out.append(u)
            if (inner := _inner_join(u)) is not None:  # (a join inside a join: its pieces' PADs too)
                stack.append(inner)
        elif u.op in (Ops.WHERE, Ops.ADD):
            stack.extend(u.src[1:] if u.op is Ops.WHERE else u.src)
    return out
