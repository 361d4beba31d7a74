"""Wider memory ops: scalar loads and stores of one buffer at consecutive indices become one vector load or store.

Runs after `upcast_stores` (renderers with vectors). A register tile whose vector lanes are not contiguous in
memory (a convolution's 16 output channels as lanes, its image columns as UPCAST copies) leaves one scalar
store per lane and copy, and reads an epilogue operand (a residual) one scalar per lane and copy. Here:

- scalar STOREs to one global buffer, with the same gate (or none), whose indices are one base plus
  consecutive constants become one STORE of a VECTORIZE of their values (the tile transposed in registers);
- scalar LOADs of one global buffer, same gate, indices one base plus consecutive constants, outside every
  reduction (no REDUCE or UNROLL range below them: an epilogue's operands, never a reduction's inner loads),
  become one vector LOAD, each former load a GEP of it. A buffer the kernel also stores to is left alone.

- where the renderer takes vectors of any width (LLVM), a merged store's value whose lanes come from a row that
  was gathered lane by lane into the tile's columns (a residual read in rows) is computed in the row's orientation
  instead (`_Rows`): the row is used as loaded and only the accumulators are transposed, not the residual twice
  (ResNet-50's four distinct 1x1 tiles with a residual: LLVM 0.82 -> 0.40 s, the kernels 4-17% faster).

Indices are compared structurally: the terms of their ADD trees apart from the constants (the same UOps,
hash-consed) and the constants' sum. A run is cut into the widest of `widths` that fit, the rest left scalar
(`any_width`: any 2..max(widths) lanes, for renderers that take vectors of any length, as LLVM does). The
pipeline merges at most `MERGE_MAX_LANES` (4) lanes, any count up to it where the renderer takes any
(`Capabilities.memory_any_width`: LLVM; a row of 7 is 4 + 3 lanes, no scalars): 8-lane rows of a 16-lane tile
(a transpose across 128-bit halves) made LLVM compile one U-Net convolution's inner loop differently, 1.1-1.8x
slower, where 4-lane rows left it byte-identical in effect (same results, same time) and LLVM's time fell nearly
as much (docs/DESIGN.md, "Tile epilogues in vectors", "The first call"). Memory order: a merged store takes the
place of its run's first store; a run's elements are distinct, and tgc kernels store each output once, so no store
is reordered across another store to the same element."""

from __future__ import annotations

from tgc.ir.uop import ALU, Ops, RangeKind, UOp, substitute

_INNER = (RangeKind.REDUCE, RangeKind.UNROLL)
MERGE_MAX_LANES = 4  # the widest merged load or store the pipeline asks for (see the module's docstring)


def _split(idx: UOp) -> tuple[object, int]:
    """(base, constant offset) of an index: its sum's terms (an ADD tree flattened) apart from the constants,
    as a multiset, and the constants' sum."""
    terms: dict[UOp, int] = {}
    off = 0
    stack = [idx]
    while stack:
        u = stack.pop()
        if u.op is Ops.ADD:
            stack.extend(u.src)
        elif u.op is Ops.CONST:
            off += int(u.arg)
        else:
            terms[u] = terms.get(u, 0) + 1
    return (idx.dtype, frozenset(terms.items())), off


def _chunks(n: int, widths: tuple[int, ...], any_width: bool) -> list[int]:
    """The lane counts a run of `n` consecutive elements is cut into (1: left scalar)."""
    out: list[int] = []
    top = max(widths)
    while n > 0:
        if any_width:
            w = min(n, top)
        else:
            w = next((w for w in sorted(widths, reverse=True) if w <= n), 1)
        out.append(w)
        n -= w
    return out


def _runs(members: list[tuple[int, UOp]], widths: tuple[int, ...], any_width: bool) -> list[list[UOp]]:
    """Members (offset, uop) cut into runs of consecutive offsets, each run into chunks; chunks of 2+ only."""
    members = sorted(members, key=lambda m: m[0])
    if len({off for off, _ in members}) != len(members):
        return []  # two ops at one element: left as they are
    runs: list[list[UOp]] = []
    cur: list[tuple[int, UOp]] = []
    for off, u in members:
        if cur and off != cur[-1][0] + 1:
            runs.append([m[1] for m in cur])
            cur = []
        cur.append((off, u))
    if cur:
        runs.append([m[1] for m in cur])
    out = []
    for run in runs:
        i = 0
        for w in _chunks(len(run), widths, any_width):
            if w > 1:
                out.append(run[i:i + w])
            i += w
    return out


def _mergeable(d, any_width: bool) -> bool:
    return d is not None and d.count == 1 and (any_width or d.itemsize >= 4)


def _widen_loads(sink: UOp, widths: tuple[int, ...], any_width: bool) -> UOp:
    written = {st.src[0] for st in sink.src if st.op is Ops.STORE}
    groups: dict[tuple, list[tuple[int, UOp]]] = {}
    # the nodes that depend on an inner range, in one pass over the order (sources first): not a walk per load
    # (1334 walks of ResNet-50's convolution tiles, 0.2 s of its lowering under cProfile)
    inner: set[UOp] = set()
    for u in sink.toposort():
        if (u.op is Ops.RANGE and u.arg[1] in _INNER) or any(s in inner for s in u.src):
            inner.add(u)
        if u.op is not Ops.LOAD or u.src[0].op is not Ops.DEFINE_GLOBAL or u.src[0] in written:
            continue
        if not _mergeable(u.dtype, any_width):
            continue
        if u in inner:
            continue
        base, off = _split(u.src[1])
        groups.setdefault((u.src[0], base, u.src[2:]), []).append((off, u))
    mapping: dict[UOp, UOp] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        for chunk in _runs(members, widths, any_width):
            first = chunk[0]
            wide = UOp(Ops.LOAD, first.dtype.vec(len(chunk)), (first.src[0], first.src[1], *first.src[2:]))
            for j, ld in enumerate(chunk):
                mapping[ld] = UOp(Ops.GEP, ld.dtype, (wide,), j)
    return substitute(sink, mapping) if mapping else sink


def _widen_stores(sink: UOp, widths: tuple[int, ...], any_width: bool) -> UOp:
    groups: dict[tuple, list[tuple[int, UOp]]] = {}
    for st in sink.src:
        if st.op is not Ops.STORE or st.arg is not None or st.src[0].op is not Ops.DEFINE_GLOBAL:
            continue
        if not _mergeable(st.src[2].dtype, any_width):
            continue
        base, off = _split(st.src[1])
        groups.setdefault((st.src[0], base, st.src[3:]), []).append((off, st))
    position = {st: i for i, st in enumerate(sink.src)}
    replace: dict[UOp, UOp | None] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        for chunk in _runs(members, widths, any_width):
            first = chunk[0]
            value = UOp(Ops.VECTORIZE, first.src[2].dtype.vec(len(chunk)), tuple(st.src[2] for st in chunk))
            order = sorted(chunk, key=position.__getitem__)
            replace[order[0]] = UOp(Ops.STORE, None, (first.src[0], first.src[1], value, *first.src[3:]))
            for st in order[1:]:
                replace[st] = None
    if not replace:
        return sink
    out = [replace.get(st, st) for st in sink.src]
    return UOp(Ops.SINK, None, tuple(s for s in out if s is not None))


_Lane = tuple  # (vector, lane) for lane `lane` of a vector UOp, (scalar, None) for a scalar UOp


class _Rows:
    """A merged store's value, VECTORIZE(GEP(v_0, c), ..., GEP(v_n-1, c)) (lane c of n column vectors: a tile
    transposed in registers), computed in the row's orientation where that undoes a transpose: lane-wise ops are
    applied to rows (VECTORIZE(op(a_j, b_j)) = op(VECTORIZE(a_j), VECTORIZE(b_j))), and a row that is a whole
    merged load (a residual read in rows, then gathered into the columns lane by lane) is that load again. The
    same operations on the same values, lanes permuted: results are bit-identical. Lanes are walked as (vector,
    lane) pairs; UOps are made only for a row that undoes a transpose (the walk runs on every tile's stores)."""

    def __init__(self) -> None:
        self.memo: dict[tuple[_Lane, ...], UOp | None] = {}
        self.ops = 0  # lane-wise ops made in rows (each a new instruction), so far
        self.rows = 0  # gathered rows used whole instead, so far

    @staticmethod
    def lane(u: UOp) -> _Lane:
        return (u.src[0], u.arg) if u.op is Ops.GEP else (u, None)

    @staticmethod
    def plain(items: tuple[_Lane, ...]) -> UOp:
        vals = tuple(v if k is None else UOp(Ops.GEP, v.dtype.scalar(), (v,), k) for v, k in items)
        return UOp(Ops.VECTORIZE, vals[0].dtype.vec(len(vals)), vals)

    def resolve(self, items: tuple[_Lane, ...]) -> tuple[_Lane, ...]:
        """Lanes of VECTORIZEs as the values they gather."""
        while all(k is not None and v.op is Ops.VECTORIZE for v, k in items):
            items = tuple(self.lane(v.src[k]) for v, k in items)
        return items

    def row(self, items: tuple[_Lane, ...]) -> UOp | None:
        """A vector equal to the lanes `items`, where a gathered row became a whole vector in it; else None."""
        if items in self.memo:
            return self.memo[items]
        got = self.memo[items] = self._row(items)
        return got

    def _row(self, items: tuple[_Lane, ...]) -> UOp | None:
        n = len(items)
        if any(k is None for _, k in items):
            return None
        srcs, lanes = [v for v, _ in items], [k for _, k in items]
        s0 = srcs[0]
        if all(s is s0 for s in srcs):
            if lanes == list(range(n)) and s0.dtype.count == n:
                self.rows += 1
                return s0  # the whole vector, in order
            return None  # lanes of one vector (a broadcast): as it is
        if s0.op not in ALU or any(s.op is not s0.op or s.arg != s0.arg or len(s.src) != len(s0.src) for s in srcs):
            return None
        parts = []
        for j in range(len(s0.src)):
            ops = tuple((s.src[j], None) if s.src[j].op is Ops.CONST and s.src[j].dtype.count == 1 else (s.src[j], k)
                        for s, k in items)
            if any(k is not None and v.dtype.count != s0.dtype.count for v, k in ops):
                return None
            parts.append(self.resolve(ops))
        rows = [self.row(ops) for ops in parts]
        if all(r is None for r in rows):
            return None
        operands = []
        for ops, r in zip(parts, rows):
            if r is not None:
                operands.append(r)
            elif all(v.op is Ops.CONST for v, _ in ops) and len({v.arg for v, _ in ops}) == 1:
                c = UOp.const(ops[0][0].dtype.scalar(), ops[0][0].arg)
                operands.append(UOp(Ops.VECTORIZE, c.dtype.vec(n), (c,) * n))
            else:
                operands.append(self.plain(ops))
        self.ops += 1
        return UOp(s0.op, s0.dtype.scalar().vec(n), tuple(operands), s0.arg)


def _stores_in_rows(sink: UOp) -> UOp:
    rows = _Rows()
    out, changed = [], False
    for st in sink.src:
        if st.op is Ops.STORE and st.src[2].op is Ops.VECTORIZE:
            ops, whole = rows.ops, rows.rows
            value = rows.row(rows.resolve(tuple(rows.lane(v) for v in st.src[2].src)))
            undone = value is not None
            # worth it where the ops it adds in rows are no more than the lane moves it saves: each row used whole
            # was n lane reads and n lane writes into the columns (a residual added, a ReLU: 3 ops a row against 6-8
            # moves; a long chain, a GELU after a residual, stays in the columns: 12+ ops a row, 1.3-1.6x slower)
            if undone and rows.ops - ops <= 2 * len(st.src[2].src) * (rows.rows - whole):
                st = UOp(Ops.STORE, None, (st.src[0], st.src[1], value, *st.src[3:]), st.arg)
                changed = True
        out.append(st)
    return UOp(Ops.SINK, None, tuple(out), sink.arg) if changed else sink


def widen_memory(ast: UOp, widths: tuple[int, ...] = (16, 8, 4), any_width: bool = False) -> UOp:
    """Consecutive scalar loads (outside reductions) and stores of one buffer -> vector loads and stores."""
    if not widths:
        return ast
    loaded = _widen_loads(ast, widths, any_width)
    out = _widen_stores(loaded, widths, any_width)
    # rows only where loads were merged (a row to use whole) and the renderer takes vector ops of any width (LLVM)
    return _stores_in_rows(out) if any_width and loaded is not ast else out
