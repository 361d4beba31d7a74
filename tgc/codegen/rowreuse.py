"""An expensive per-row value computed once: the row pass that reduces it stores it into the output row, and the
output pass reads it back from there (while the row is still in the cache) instead of computing it again.

A CPU kernel that keeps a per-row reduction in its consumer (`tgc.engine.schedule`, `fuse_rows`) runs, per
row, the reduction's loop and then the output loop. A softmax reduces `e = exp(x - max)` in the first and
computes `e / sum` in the second: written as it is scheduled, `exp` runs twice per element. Here:

- `tee_row_values` (a prepare pass) finds, in a kernel with one store `out[rows, cols] = f(.., R, ..)`, a
  reduction `R` over the row of an expensive value `v` (a transcendental, or `REUSE_COST` plain ops) whose
  per-element form `v[rows, cols]` also appears in `f`. The reduction's value becomes `TEE(out, index, v)`
  (stored at `out[rows, r]` as the loop computes it) and each use of `v[rows, cols]` in `f` becomes
  `REREAD(LOAD out[rows, cols], v[rows, cols])`.
- `resolve_row_values` (after the opts) keeps the stored form only where the loop order makes it correct:
  on a CPU-style device, the reduction's loops nest inside every loop it depends on and outside every loop
  of the columns (so it runs once per row, before that row's output loop), it depends on no unrolled or
  vector lane, it is not padded (PADTO), and a threaded kernel splits rows, not columns, across threads.
  Elsewhere (GPUs, an opt that swaps the loops) both nodes go back to the recomputed value.

The linearizer writes a TEE as a STORE inside the reduction's loop (`tgc.codegen.linearize`); REREAD never
reaches it.
"""

from __future__ import annotations

import itertools

from tgc.ir.uop import ALU, Ops, RangeKind, UOp, substitute

REUSE_COST = 10  # ALU ops per element (a transcendental counts TRANSCENDENTAL_COST) worth a store and a reload
TRANSCENDENTAL_COST = 10
_TRANSCENDENTAL = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT}
_MAX_AXES = 4  # reductions over more row axes than this are left alone (the bijection search is factorial)


def _free_ranges(u: UOp) -> set[UOp]:
    """The loop ranges a value depends on (a REDUCE binds its own)."""
    memo: dict[UOp, frozenset[UOp]] = {}
    for n in u.toposort():
        if n.op is Ops.RANGE:
            out = frozenset([n])
        else:
            out = frozenset().union(*(memo[s] for s in n.src)) if n.src else frozenset()
            if n.op is Ops.REDUCE:
                out -= set(n.src[1:])
        memo[n] = out
    return set(memo[u])


def _outside_reduces(value: UOp) -> list[UOp]:
    """The nodes of `value` computed once per output element: those reachable without entering a REDUCE (the
    REDUCE nodes themselves included)."""
    out, seen, stack = [], set(), [value]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        out.append(n)
        if n.op is not Ops.REDUCE:
            stack.extend(n.src)
    return out


def _cost(v: UOp, ranges: set[UOp]) -> int:
    """ALU ops of `v` that vary with `ranges` (what the reduction's loop computes per element)."""
    varying: set[UOp] = set()
    total = 0
    for n in v.toposort():
        if n in ranges or any(s in varying for s in n.src):
            varying.add(n)
            if n.op in ALU:
                total += TRANSCENDENTAL_COST if n.op in _TRANSCENDENTAL else 1
    return total


def tee_row_values(ast: UOp) -> UOp:
    """The kernel with one expensive row value stored by its reduction's pass and reread by the output pass
    (see the module docstring); the kernel unchanged where no such value is found."""
    if ast.op is not Ops.SINK or len(ast.src) != 1:
        return ast
    store = ast.src[0]
    if store.op is not Ops.STORE or len(store.src) != 3 or store.src[0].op is not Ops.DEFINE_GLOBAL:
        return ast
    buf, idx, value = store.src
    if any(n.op in (Ops.TEE, Ops.REREAD) for n in value.toposort()):
        return ast  # prepared already
    loops = {n for n in idx.toposort() if n.op is Ops.RANGE}
    if not loops or any(r.arg[1] is not RangeKind.LOOP for r in loops):
        return ast
    outside = _outside_reduces(value)
    inside = set(outside)
    best: tuple[int, UOp, UOp, dict[UOp, UOp]] | None = None
    for red in (n for n in outside if n.op is Ops.REDUCE):
        v, rranges = red.src[0], red.src[1:]
        if v.dtype is None or v.dtype.count != 1 or v.dtype != buf.dtype.scalar() or not v.dtype.is_float:
            continue
        if len(rranges) > _MAX_AXES or any(r.arg[1] is not RangeKind.REDUCE for r in rranges):
            continue
        rows = _free_ranges(red)
        cols = loops - rows
        if not rows <= loops or len(cols) != len(rranges):
            continue
        cost = _cost(v, set(rranges))
        if cost < REUSE_COST or (best is not None and cost <= best[0]):
            continue
        for perm in itertools.permutations(sorted(cols, key=lambda r: r.arg[0])):
            if any(r.src[0] is not c.src[0] for r, c in zip(rranges, perm)):
                continue
            sigma = dict(zip(rranges, perm))
            target = substitute(v, sigma)
            if target in inside and cols <= _free_ranges(target):
                best = (cost, red, target, sigma)
                break
    if best is None:
        return ast
    _, red, target, sigma = best
    tee_idx = substitute(idx, {c: r for r, c in sigma.items()})
    v = red.src[0]
    new_red = UOp(Ops.REDUCE, red.dtype, (UOp(Ops.TEE, v.dtype, (buf, tee_idx, v)), *red.src[1:]), red.arg)
    reread = UOp(Ops.REREAD, v.dtype, (UOp(Ops.LOAD, v.dtype, (buf, idx)), target))
    new_value = substitute(value, {red: new_red, target: reread})
    return UOp(Ops.SINK, ast.dtype, (store.replace(src=(buf, idx, new_value)),), ast.arg)


def _users(nodes: list[UOp], u: UOp) -> list[UOp]:
    return [n for n in nodes if any(s is u for s in n.src)]


def stored_form_is_safe(ast: UOp) -> bool:
    """Whether the TEE/REREAD pair of an optimized CPU kernel computes what the recomputed form does (see the
    module docstring for the conditions)."""
    nodes = ast.toposort()
    tees = [n for n in nodes if n.op is Ops.TEE]
    if len(tees) != 1 or len(ast.src) != 1 or ast.src[0].op is not Ops.STORE:
        return False
    tee = tees[0]
    owners = _users(nodes, tee)
    if not owners or any(o.op is not Ops.REDUCE or o.src[0] is not tee for o in owners):
        return False  # the value is used beyond its reduction (a PADTO's mask around it): padded iterations
    store = ast.src[0]
    store_ranges = {n for n in store.src[1].toposort() if n.op is Ops.RANGE}
    loop_ids = {r.arg[0] for r in store_ranges if r.arg[1] is RangeKind.LOOP}
    core = [n for n in nodes if n.op is Ops.DEFINE_VAR and n.arg[0] == "core_id"]
    for red in owners:
        rows = _free_ranges(red)
        if any(r.arg[1] is not RangeKind.LOOP for r in rows):
            return False  # per vector lane or unrolled copy: the copies' order is the renderer's
        cols = {r.arg[0] for r in store_ranges - rows if r.arg[1] is RangeKind.LOOP}
        if not cols or not {r.arg[0] for r in rows} <= loop_ids:
            return False
        if rows and max(r.arg[0] for r in rows) > min(cols):
            return False  # a column loop outside the row loops (SWAP): the reduction would rerun per column
        if core and core[0] not in red.toposort():
            return False  # threads split the columns: every thread would store the whole row
    return True


def resolve_row_values(ast: UOp, gpu: bool) -> UOp:
    """After the opts: TEE/REREAD kept as a store and a load where `stored_form_is_safe`, else both back to the
    value they stand for (always with `gpu`: GPUs, and devices that do not declare `caps.reread_rows`)."""
    nodes = ast.toposort()
    marks = [n for n in nodes if n.op in (Ops.TEE, Ops.REREAD)]
    if not marks:
        return ast
    keep = not gpu and stored_form_is_safe(ast)
    mapping: dict[UOp, UOp] = {}
    for n in marks:
        if n.op is Ops.REREAD:
            mapping[n] = n.src[0] if keep else n.src[1]
        elif not keep:
            mapping[n] = n.src[2]
    return substitute(ast, mapping)


__all__ = ["REUSE_COST", "resolve_row_values", "stored_form_is_safe", "tee_row_values"]
