"""Operation counts of a program as written and as its kernels execute it, and their ratio, the recompute factor.

One unit for both sides: every ALU op of the tensor graph counts 1 per element it produces (a transcendental is
one op, a cast none), and a reduction counts 1 per element it reduces. This is the graph's own count, before any
device lowering (polynomial transcendentals, vector lanes): `Kernel.flops` counts the device's instructions for
GFLOP/s; these counts say how much of the program's work a schedule repeats.

- `written_flops(outputs)`: each node of the graph once, over its own shape.
- `executed_flops(ast)`: a kernel AST (`tgc.engine.schedule`), each node once per iteration of the innermost loop
  its value depends on (a value is computed outside the loops it does not depend on, but inside every loop around
  that one): the output loops nest in axis order, outermost first; a REDUCE's loops nest inside the innermost
  loop the REDUCE itself depends on (a softmax's row max inside the row loop, not the column loop). A REDUCE
  counts each element it accumulates. Index arithmetic and the gates of
  padding (a WHERE on index arithmetic) are not the graph's ops and count nothing. A REREAD (a per-row value
  stored by its reduction's pass, `tgc.codegen.rowreuse`) counts as the load it is.
- `attention_flops(spec, match)`: a fused attention kernel: the scores' expression once per (query, key), and
  the softmax and the product with v as written (the online softmax computes each once).

The recompute factor of a program is the sum of its kernels' executed counts over its written count: 1.0 when
no kernel computes any value twice. (A CPU softmax in one pass computes `exp(x - max)` in the row's sum and
again in its output, unless the row-value reuse stores it: that recomputation is deliberate.)
"""

from __future__ import annotations

from typing import Any

from tgc.ir.kernel import INDEX
from tgc.ir.shapes import prod, shape_of
from tgc.ir.uop import ALU, Ops, RangeKind, UOp


def _node_ops(node: UOp) -> int:
    """The graph's ops of one tensor node over its own shape (0 for movement, casts, constants, buffers)."""
    if node.op in ALU:
        shape = shape_of(node)
    elif node.op is Ops.REDUCE_AXIS:
        shape = shape_of(node.src[0])
    else:
        return 0
    return prod(shape) if all(isinstance(s, int) for s in shape) else 0


def written_flops(outputs: list[UOp], exclude: set[UOp] | None = None) -> int:
    """The program's ops as written: each node reachable from `outputs` (and not in `exclude`) once."""
    seen = set(exclude or ())
    total = 0
    for node in UOp(Ops.SINK, None, tuple(outputs)).toposort():
        if node not in seen:
            seen.add(node)
            total += _node_ops(node)
    return total


def _index_valued(u: UOp, memo: dict[UOp, bool]) -> bool:
    """Index arithmetic: INDEX values, and bools computed only from them (bounds and padding conditions). By
    equality of the scalar type, not identity: a node is hash-consed by an equal dtype (`UOp.__new__`), so one
    made first with a derived INDEX (`INDEX.vec(1)`, `.scalar()`: equal, another object) is the node every later
    construction with INDEX gets, and its index math counted as the graph's ops (3x the hand count)."""
    got = memo.get(u)
    if got is None:
        if (u.dtype is not None and u.dtype.scalar() == INDEX) or u.op is Ops.RANGE:
            got = True
        elif u.dtype is not None and u.dtype.is_bool and u.op is not Ops.LOAD:
            got = all(_index_valued(s, memo) for s in u.src)
        else:
            got = False
        memo[u] = got
    return got


def executed_flops(ast: UOp, loops: tuple[UOp, ...] | None = None) -> int:
    """The graph's ops a kernel AST executes (see the module docstring). `loops` are the output loops in nesting
    order (default: the AST's LOOP ranges by id); its other RANGEs are reduction loops."""
    if loops is None:
        loops = tuple(sorted((u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] is RangeKind.LOOP),
                             key=lambda r: r.arg[0]))
    order = _postorder(ast)
    open_ranges: dict[UOp, frozenset[UOp]] = {}  # the loops a value depends on (a REDUCE closes its own)
    owner: dict[UOp, UOp] = {}  # reduction loop -> its REDUCE
    for u in order:
        if u.op is Ops.RANGE:
            open_ranges[u] = frozenset((u,))
        elif u.op is Ops.REREAD:  # the stored value is loaded; the recomputed form is never run
            open_ranges[u] = open_ranges[u.src[0]]
        else:
            deps = frozenset().union(*(open_ranges[s] for s in u.src))
            if u.op is Ops.REDUCE:
                owner.update((r, u) for r in u.src[1:])
                deps -= frozenset(u.src[1:])
            open_ranges[u] = deps
    outer = {r: prod(_size(x) for x in loops[:i + 1]) for i, r in enumerate(loops)}
    range_trips: dict[UOp, int] = {}

    def trips_of(r: UOp) -> int:
        """Iterations of loop `r` over the whole kernel: an output loop's and those around it; a reduction loop's
        times those of the place its REDUCE is computed (inside the innermost loop that REDUCE depends on)."""
        if r in outer:
            return outer[r]
        if r not in range_trips:
            red = owner.get(r)
            if red is None:  # (a loop that no REDUCE closes: nested like an output loop)
                range_trips[r] = _size(r)
            else:
                own = red.src[1:]
                base = trips_at(open_ranges[red])
                range_trips[r] = base * prod(_size(x) for x in own[:own.index(r) + 1])
        return range_trips[r]

    def trips_at(ranges: frozenset[UOp]) -> int:
        return max((trips_of(r) for r in ranges), default=1)  # (they nest: the innermost iterates the most)

    index_memo: dict[UOp, bool] = {}
    total = 0
    for u in order:
        if u.op is Ops.REDUCE:
            total += trips_of(u.src[-1])
        elif u.op in ALU and not _index_valued(u, index_memo) and \
                not (u.op is Ops.WHERE and _index_valued(u.src[0], index_memo)):
            total += trips_at(open_ranges[u])
    return total


def _size(r: UOp) -> int:
    end = r.src[0]
    return end.arg if end.op is Ops.CONST else max(int(end.vmax), 1)


def _postorder(root: UOp) -> list[UOp]:
    """Every node once, sources first; a REREAD's recomputed form (its second source) is left out."""
    order: list[UOp] = []
    seen: set[UOp] = set()
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
        u, done = stack.pop()
        if done:
            order.append(u)
            continue
        if u in seen:
            continue
        seen.add(u)
        stack.append((u, True))
        stack.extend((s, False) for s in (u.src[:1] if u.op is Ops.REREAD else u.src) if s not in seen)
    return order


def attention_flops(spec: Any, match: Any) -> int:
    """The graph's ops of one fused attention kernel (`tgc.engine.attention`): the scores `spec.x` once per
    (query row, key), `spec.v` once per (key, output column), and the chain from the scores to the output
    (softmax and the product with v) as written."""
    loops = tuple(spec.loops) + (spec.rj, spec.rdv)
    scores = executed_flops(UOp(Ops.SINK, None, (spec.x, spec.v)), loops)
    inside = {u for n in match.score_nodes for u in n.toposort()} | set(match.v.toposort())
    chain = written_flops([match.p], exclude=inside)
    return scores + chain


def recompute_factor(executed: int, written: int) -> float:
    """Executed over written ops (1.0 for a program with no ops)."""
    return executed / written if written else 1.0


__all__ = ["attention_flops", "executed_flops", "recompute_factor", "written_flops"]
