"""Wider memory ops: scalar loads and stores of one buffer at consecutive indices become one vector load or store.

Runs after `upcast_stores` (renderers with vectors). A register tile whose vector lanes are not contiguous in
memory (a convolution's 16 output channels as lanes, its image columns as UPCAST copies) leaves one scalar
store per lane and copy, and reads an epilogue operand (a residual) one scalar per lane and copy. Here:

- scalar STOREs to one global buffer, with the same gate (or none), whose indices are one base plus
  consecutive constants become one STORE of a VECTORIZE of their values (the tile transposed in registers);
- scalar LOADs of one global buffer, same gate, indices one base plus consecutive constants, outside every
  reduction (no REDUCE or UNROLL range below them: an epilogue's operands, never a reduction's inner loads),
  become one vector LOAD, each former load a GEP of it. A buffer the kernel also stores to is left alone.

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

from tgc.ir.uop import Ops, RangeKind, UOp, substitute

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


def widen_memory(ast: UOp, widths: tuple[int, ...] = (16, 8, 4), any_width: bool = False) -> UOp:
    """Consecutive scalar loads (outside reductions) and stores of one buffer -> vector loads and stores."""
    if not widths:
        return ast
    return _widen_stores(_widen_loads(ast, widths, any_width), widths, any_width)
