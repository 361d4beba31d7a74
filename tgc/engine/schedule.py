"""The scheduler: cut a tensor graph into kernels, and write each kernel as an AST over loop ranges.

Which nodes get a buffer of their own ("realized"):
- every program output;
- a reduction whose result is read more than once per output element of its consumer: behind an EXPAND
  or WINDOW (a broadcast reuses it), or inside another reduction, or shared by several kernels;
- a reduction read at an index other than its own (behind a slice, shift, pad, flip or stride:
  `moves_index`), or that a kernel would evaluate at two indices (`_Lowerer.recomputed_reductions`, checked
  after lowering, then the schedule is made again): a matmul or a norm's statistics is never recomputed;
- elementwise work that a broadcast would make its consumer recompute, where that costs more than a round
  trip through memory: its ALU cost (a transcendental counts `TRANSCENDENTAL_COST`) times the extra times it
  would be recomputed (the broadcast factor minus one) is at least `RECOMPUTE_LIMIT`. The GELU before a
  matmul (`gelu(x @ w1 + b1) @ w2`) is computed once, not once per output column; a per-row value a
  CPU kernel computes once per row is not a recomputation;
- inside a consumer's reduction (`_stored_for_reuse`): a concatenation read at moved indices or through a
  broadcast (a pool's or a conv's window: it becomes one buffer its producers write in place,
  `tgc.engine.placement`); the elementwise epilogue of a reduction (a conv's bias, batch norm, relu) read at
  least `EPILOGUE_REUSE` times per element (a pool's window or slices: stored once, not recomputed per read;
  the reduction below would get a buffer anyway).
- elementwise work over a transpose that two or more kernels compute, of at least `TRANSPOSED_MIN_ELEMENTS`
  elements (`_transposed_shared`): stored once in its readers' order instead of read at a stride of a row per
  element by each (the MLP-Mixer's `x + token_mlp(...).transpose(1, 2)`, read by a layernorm and a residual).
Everything else is fused: elementwise chains, elementwise work before a reduction (inside its loop) and
after it (once per output), and movement ops, which become index arithmetic. Constants and broadcasts
are never materialized.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping

from tgc.capabilities import Capabilities
from tgc.dtype import DType, dtypes, min_max
from tgc.engine import attention, packrule
from tgc.engine.flops import attention_flops, executed_flops
from tgc.engine.placement import concat_of, find_concats
from tgc.errors import TgcError
from tgc.ir.kernel import INDEX, ScheduleItem, flat_index, identity
from tgc.ir.shapes import prod, shape_of, strides_for
from tgc.ir.symbolic import simplify
from tgc.ir.symsize import SymSize, hidden_named, multiple_at_every_size, speed_choice, unit_name
from tgc.ir.uop import ALU, Ops, RangeKind, UOp, postorder, rebuild, substitute
from tgc.ir.walk import drive

_EXPANDING = {Ops.EXPAND, Ops.WINDOW}
TRANSCENDENTAL_COST = 10  # exp2, log2, sin, sqrt become ~10-25 ops (polynomials on the CPU)
_TRANSCENDENTAL = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT}
RECOMPUTE_LIMIT = 64  # ALU ops recomputed per element above which the value gets its own buffer
_REP_CAP = 1 << 20
EPILOGUE_REUSE = 2  # reads per element of a reduction's epilogue inside a reduction above which it is stored
TRANSPOSED_MIN_ELEMENTS = 1 << 16  # elements of a transposed value read by several kernels from which it is stored


def _costs_at_least(node: UOp, realized: set[UOp], need: int) -> bool:
    """Whether computing `node` from buffers and realized values takes at least `need` ALU ops (each fused node
    counted once; a transcendental counts TRANSCENDENTAL_COST). A value that reads no buffer costs nothing
    (constants fold; index arithmetic is cheaper to recompute than to load). The walk stops once it knows."""
    total, stack, seen, reads = 0, [node], set(), False
    while stack:
        n = stack.pop()
        if n in seen or n.op is Ops.CONST:
            continue
        if n.op is Ops.BUFFER or (n in realized and n is not node):
            reads = True
            if total >= need:
                return True
            continue
        seen.add(n)
        if n.op in ALU:
            total += TRANSCENDENTAL_COST if n.op in _TRANSCENDENTAL else 1
            if reads and total >= need:
                return True
        stack.extend(n.src)
    return reads and total >= need


def _broadcast_factor(node: UOp, child: UOp | None = None) -> int:
    """How many times an EXPAND or WINDOW reads each element of its source, or a GATHER each element of its
    values on average (1 for other nodes)."""
    if node.op is Ops.GATHER:
        if child is not node.src[0]:
            return 1
    elif node.op not in _EXPANDING:
        return 1
    if node.op is Ops.WINDOW:  # (a 3x3 stride-2 pool reads each element 1.5 times along its axis: twice, rounded up)
        return max(1, -(-prod(shape_of(node)) // max(1, prod(shape_of(node.src[0])))))
    return max(1, prod(shape_of(node)) // max(1, prod(shape_of(node.src[0]))))


def _trailing(axes: tuple[int, ...], ndim: int) -> bool:
    return bool(axes) and tuple(axes) == tuple(range(ndim - len(axes), ndim))


def _row_axes(e: UOp) -> tuple[int, ...] | None:
    """The trailing axes an EXPAND broadcasts a per-row value along (a softmax max, a layernorm mean),
    or None when it broadcasts along other axes."""
    if e.op is not Ops.EXPAND:
        return None
    src = shape_of(e.src[0])
    axes = tuple(i for i, (a, b) in enumerate(zip(src, e.arg)) if a != b)
    if not _trailing(axes, len(src)) or any(src[i] != 1 for i in range(axes[0], len(src))):
        return None
    return tuple(range(axes[0], len(src)))


def find_realized(outputs: list[UOp], fuse_rows: bool = False,
                  fused: dict[UOp, attention.Match] | None = None, forced: set[UOp] | None = None,
                  sized: bool = True) -> list[UOp]:
    """Kernel roots in dependency order (each after the roots it reads): `_find_realized`'s, then, where some
    elementwise value over a transpose is read by several of those kernels (`_transposed_shared`), made again with
    it (and the concatenation its transpose reads, if any) realized: its readers then read it in their own
    order, and a reduction below it that several kernels read through it is computed in its kernel. Not for a
    size class's kernels (`sized=False`: `create_schedule`'s `split_columns=False`): the rule is a speed choice
    over sizes, and their plan is the same at every size of the class."""
    pieces = _concat_pieces(outputs)
    roots = _find_realized(outputs, pieces, fuse_rows, fused, forced)
    if not sized:
        return roots
    shared = _transposed_shared(roots, pieces)
    return _find_realized(outputs, pieces, fuse_rows, fused, (forced or set()) | shared) if shared else roots


def _transposed_shared(roots: list[UOp], pieces: set[UOp]) -> set[UOp]:
    """The elementwise nodes over a transpose (`_transposed_read`) that two or more of the kernels rooted at
    `roots` compute, with the concatenations of computed pieces their transposes read (each becomes one buffer
    its pieces write in place, so the node's kernel reads no gated pieces)."""
    realized = set(roots)
    reached: dict[UOp, int] = {}
    memo: dict[UOp, bool] = {}
    for root in roots:
        stack, seen = [root], set()
        while stack:
            n = stack.pop()
            if n in seen or n.op is Ops.BUFFER or (n in realized and n is not root):
                continue
            seen.add(n)
            if n is not root and n.op in ALU and _transposed_read(n, realized, memo):
                reached[n] = reached.get(n, 0) + 1
            stack.extend(n.src)
    out: set[UOp] = set()
    for n, count in reached.items():
        if count > 1:
            joins: set[UOp] = set()
            _transposed_read(n, realized, {}, joins)
            out |= {n} | (joins - pieces)
    return out


def _find_realized(outputs: list[UOp], pieces: set[UOp], fuse_rows: bool = False,
                   fused: dict[UOp, attention.Match] | None = None, forced: set[UOp] | None = None) -> list[UOp]:
    """Kernel roots in dependency order (each after the roots it reads), by the module docstring's rules.
    `pieces`: `_concat_pieces(outputs)` (found once by the caller, which walks twice where it stores a value).

    With `fuse_rows` (CPU-style devices, where a kernel's outer loops run in order), a per-row reduction
    that is broadcast back along its own row stays in the consumer's kernel: the linearizer computes it
    once per row before the row's inner loop (softmax and layernorm become one kernel).

    `fused` (attention.find) marks the `softmax(X) @ v` chains computed by one fused kernel: the walk reads
    their operands (q, k, v, a mask) instead of the chain, each as a value read many times. `forced` are nodes
    realized whatever the walk decides (the reductions `_schedule` found computed at two indices)."""
    fused = fused or {}
    realized: set[UOp] = set(o for o in outputs)
    realized |= {n for o in outputs for n in o.toposort() if n.op is Ops.CONTIGUOUS}
    realized |= forced or set()
    reads = _moved_reads(outputs)
    changed = True
    while changed:
        changed = False
        reached_from: dict[UOp, set[UOp]] = {}
        for root in list(realized):
            # state: None (each value computed once per output), ("row", shape, axes) (inside a per-row
            # reduction: only per-row values stay unrecomputed), or "general" (values recomputed)
            # rep: how many times a broadcast on the way down makes the consumer recompute this value
            stack: list[tuple[UOp, object, int]] = [(root, None, 1)]
            seen: set[tuple[UOp, object, int]] = set()
            while stack:
                node, state, rep = stack.pop()
                if state == "general" and node is not root and node not in realized:
                    if _stored_for_reuse(node, reads.get(node, 0), realized):
                        realized.add(node)
                        changed = True
                        continue
                if (node, state, rep) in seen or node.op is Ops.BUFFER:
                    continue
                seen.add((node, state, rep))
                if node in realized and node is not root:
                    continue
                if node.op is Ops.REDUCE_AXIS and node is not root:
                    reached_from.setdefault(node, set()).add(root)
                    if state is not None or len(reached_from[node]) > 1:
                        realized.add(node)
                        changed = True
                        continue
                if (rep > 1 and node is not root and (node.op in ALU or node.op is Ops.CAST)
                        and _costs_at_least(node, realized, -(-RECOMPUTE_LIMIT // (rep - 1)))):
                    realized.add(node)
                    changed = True
                    continue
                if node in fused:  # one fused kernel (of its own): its operands are read many times each
                    if node is not root and attention.output_of(root, fused) is not node:
                        realized.add(node)
                        changed = True
                        continue
                    stack.extend((child, "general", rep) for child in fused[node].operands)
                    continue
                for child in node.src:
                    child_state = _child_state(node, child, state, fuse_rows)
                    if child_state == "general" and child not in realized and child not in pieces \
                            and _moved_concat(node, child):
                        realized.add(child)
                        changed = True
                    row_fused = fuse_rows and node.op is Ops.EXPAND and _row_axes(node) is not None \
                        and child_state is None
                    factor = 1 if row_fused else _broadcast_factor(node, child)
                    stack.append((child, child_state, min(rep * factor, _REP_CAP)))
    # order: toposort of the whole graph restricted to realized nodes
    order: list[UOp] = []
    seen_nodes: set[UOp] = set()
    for out in outputs:
        for node in out.toposort():
            if node in realized and node not in seen_nodes:
                seen_nodes.add(node)
                order.append(node)
    return order


def _mapped_axis(shape: tuple, new_shape: tuple, axis: int) -> int | None:
    """The axis of `shape` that a RESHAPE to `new_shape` keeps whole as its `axis` (the same size after the same
    number of elements), or None where the reshape splits or merges it."""
    if not all(type(s) is int for s in (*shape, *new_shape)):  # (a symbolic size decides nothing here)
        return None
    before = prod(new_shape[:axis])
    for i, s in enumerate(shape):
        if s == new_shape[axis] and prod(shape[:i]) == before:
            return i
    return None


def _computed_join(n: UOp) -> bool:
    """Whether `n` is a concatenation with a computed piece (a split matmul's parts joined)."""
    c = concat_of(n)
    return c is not None and any(not _stored(src) for _off, _size, src in c.pieces)


def _transposed_read(node: UOp, realized: set[UOp], memo: dict[UOp, bool], joins: set[UOp] | None = None) -> bool:
    """Whether elementwise `node`, of at least TRANSPOSED_MIN_ELEMENTS elements, reads a stored value (a buffer, a
    realized node or a reduction, which gets one) whose innermost axis is not the one along `node`'s innermost
    axis (a transpose of it): each kernel reading `node` along its rows would step through that value at a
    stride of a row per element (a cache line each). A broadcast along the innermost axis reads one element."""
    if node in memo and joins is None:
        return memo[node]
    shape = shape_of(node)
    out = False
    # (a speed choice over concrete sizes only: with symbolic ones (a SymSize is an int) every comparison would
    # be a size decision of the class's trace, so a symbolic plan keeps the value fused, as it computes the same)
    if shape and all(type(s) is int for s in shape) and prod(shape) >= TRANSPOSED_MIN_ELEMENTS \
            and shape[-1] > 1:
        # (n, the axis of n along node's innermost one, whether a PERMUTE on the way moved it): the computed
        # values above the transpose are the readers' own, so until one is crossed only movement ops are followed
        # (the lowest elementwise node over the transpose is the one stored, whatever order the walk takes)
        stack, seen = [(s, len(shape) - 1, False) for s in node.src if shape_of(s) == shape], set()
        while stack and not out:
            n, axis, crossed = stack.pop()
            if (n, axis, crossed) in seen:
                continue
            seen.add((n, axis, crossed))
            sh = shape_of(n)
            if not all(type(s) is int for s in sh):
                continue
            if n.op is Ops.BUFFER or n.op is Ops.REDUCE_AXIS or n in realized:
                inner = max((i for i, s in enumerate(sh) if s != 1), default=axis)
                out = crossed and axis != inner
            elif n.op in ALU or n.op is Ops.CAST:
                if crossed and joins is not None and n.op in (Ops.WHERE, Ops.ADD) and _computed_join(n):
                    joins.add(n)  # (one buffer its pieces write in place: its reader then reads no gated pieces)
                    out = True
                elif crossed:
                    stack.extend((s, axis, True) for s in n.src if s.op is not Ops.CONST and shape_of(s) == sh)
            elif n.op is Ops.PERMUTE:
                a = n.arg[axis]
                stack.append((n.src[0], a, crossed or a != len(sh) - 1))
            elif n.op is Ops.EXPAND:
                if shape_of(n.src[0])[axis] != 1:  # (broadcast along it: one element per row, nothing to step)
                    stack.append((n.src[0], axis, crossed))
            elif n.op in (Ops.SHRINK, Ops.PAD, Ops.FLIP, Ops.STRIDE):
                stack.append((n.src[0], axis, crossed))
            elif n.op is Ops.RESHAPE:
                a = _mapped_axis(shape_of(n.src[0]), sh, axis)
                if a is not None:
                    stack.append((n.src[0], a, crossed))
    memo[node] = out
    return out


def _stored_for_reuse(node: UOp, reads: int, realized: set[UOp]) -> bool:
    """Whether `node`, read inside a consumer's reduction and `reads` times per element over all its readers
    (`_moved_reads`), gets a buffer (the module docstring's epilogue rule; the concatenation's is `_moved_concat`)."""
    if node.op not in ALU:
        return False
    return reads >= EPILOGUE_REUSE and _epilogue_of_reduction(node, realized)


_MOVEMENT = {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.SHRINK, Ops.STRIDE, Ops.PAD, Ops.FLIP, Ops.WINDOW}


def _moved_reads(outputs: list[UOp]) -> dict[UOp, int]:
    """For each node read through movement ops that move or broadcast its indices: about how many times each of
    its elements is read, summed over its readers (a 3x3 stride-2 pool of nine strided slices: nine; a window:
    its broadcast factor, rounded up). A chain of movement ops counts once, at the node below it."""
    out: dict[UOp, int] = {}
    for n in {u for o in outputs for u in o.toposort()}:
        if n.op in _MOVEMENT:
            continue
        for s in n.src:
            moved, factor = False, 1
            while s.op in _MOVEMENT:
                moved = moved or s.op in _EXPANDING or moves_index(s)
                factor = min(factor * _broadcast_factor(s), _REP_CAP)
                s = s.src[0]
            if moved and isinstance(factor, int):
                out[s] = out.get(s, 0) + factor
    return out


def _concat_pieces(outputs: list[UOp]) -> set[UOp]:
    """The concatenations that are themselves a piece of an enclosing one (a split matmul's parts joined, then
    joined with its remainder): read through that one's PAD, which places them (`tgc.engine.placement`), not a
    moved read that needs a buffer of their own."""
    out: set[UOp] = set()
    for n in {u for o in outputs for u in o.toposort()}:
        if n.op not in (Ops.WHERE, Ops.ADD) or not any(x.op is Ops.PAD for x in n.src) or concat_of(n) is None:
            continue  # (a join's sums have a PAD term: a long sum of other terms is not walked once per ADD)
        stack = list(n.src)
        while stack:
            u = stack.pop()
            if u.op in (Ops.WHERE, Ops.ADD) and shape_of(u) == shape_of(n):
                stack.extend(u.src)
            elif u.op is Ops.PAD and u.src[0].op in (Ops.WHERE, Ops.ADD) and concat_of(u.src[0]) is not None:
                out.add(u.src[0])
    return out


def _moved_concat(node: UOp, child: UOp) -> bool:
    """Whether `child` is a concatenation that `node` reads at moved indices or through a broadcast (a pad, a
    window): it gets a buffer its pieces' producers write in place (`tgc.engine.placement`). Only where some piece
    is computed: pieces that are all the program's inputs would only be copied (the reader reads them in place)."""
    if not ((node.op in _EXPANDING or moves_index(node)) and child.op in ALU):
        return False
    c = concat_of(child)
    return c is not None and any(not _stored(src) for _off, _size, src in c.pieces)


def _stored(node: UOp) -> bool:
    """Whether `node` is a buffer or a constant seen through movement ops (nothing to compute)."""
    while node.op in _MOVEMENT:
        node = node.src[0]
    return node.op in (Ops.BUFFER, Ops.CONST)


def _epilogue_of_reduction(node: UOp, realized: set[UOp]) -> bool:
    """Whether elementwise `node` computes over a reduction of its own (through ALU ops, casts and reshapes: a
    conv's or a matmul's epilogue), one not already a buffer."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n in seen or n.op is Ops.BUFFER or (n in realized and n is not node):
            continue
        seen.add(n)
        if n.op is Ops.REDUCE_AXIS:
            return True
        if n.op in ALU or n.op in (Ops.CAST, Ops.RESHAPE):
            stack.extend(n.src)
    return False


def _child_state(node: UOp, child: UOp, state: object, fuse_rows: bool) -> object:
    if node.op in ALU or node.op in (Ops.CAST, Ops.BITCAST):
        return state
    if node.op is Ops.GATHER:  # indices are read once per output; values anywhere, any number of times
        return state if child is node.src[1] and child is not node.src[0] else "general"
    if node.op is Ops.REDUCE_AXIS:
        shape, axes = shape_of(child), node.arg[1]
        if fuse_rows and _trailing(axes, len(shape)) and state in (None, ("row", shape, axes)):
            return ("row", shape, axes)
        return "general"
    row_axes = _row_axes(node) if fuse_rows else None
    if row_axes is not None:
        if state is None or state == ("row", tuple(node.arg), row_axes):
            return None  # the row value is computed once per row: treat it as fresh
        return "general"
    if node.op in _EXPANDING or moves_index(node):
        return "general"
    return state if state is None else "general"


def moves_index(node: UOp) -> bool:
    """Whether a movement op reads its source at an index other than its own: a slice or shift (SHRINK), a pad,
    a flip or a stride that changes something (RESHAPE, PERMUTE and EXPAND only relabel or broadcast). A symbolic
    size counts as a change."""
    if node.op is Ops.SHRINK:
        return any((b, e) != (0, s) for (b, e), s in zip(node.arg, shape_of(node.src[0])))
    if node.op is Ops.PAD:
        return any(p != (0, 0) for p in node.arg[0])
    if node.op is Ops.FLIP:
        return any(f and _above_one(s) for f, s in zip(node.arg, shape_of(node.src[0])))
    if node.op is Ops.STRIDE:
        return any(st != 1 and _above_one(s) for st, s in zip(node.arg, shape_of(node.src[0])))
    return False


def _above_one(size: object) -> bool:
    return not isinstance(size, int) or size > 1


class _Lowerer:
    """Writes one kernel: the value of `root` at an index vector, as index math over RANGEs."""

    def __init__(self, root: UOp, realized: set[UOp]):
        self.root, self.realized = root, realized
        self.bufs: list[UOp] = [root]
        self.globals: dict[UOp, UOp] = {}
        self.memo: dict[tuple, UOp] = {}
        # one `simplify` memo for the kernel's index math: its indices share their ranges and most of their terms,
        # and each was simplified again from its leaves (a third of the scheduler's time on ResNet-50)
        self.simplified: dict[UOp, UOp] = {}
        self.range_id = 0
        self.placeholders = 0  # `bounded_indices`
        self.flops = 0

    def recomputed_reductions(self) -> set[UOp]:
        """The reductions this kernel computes inline at more than one index (or under more than one gate): each
        would be computed again for every read. (Called after `build`.)"""
        count: dict[UOp, int] = {}
        for node, _idx, valid in self.memo:
            if valid.op is Ops.CONST and not valid.arg:  # (padding that is never read: nothing computed)
                continue
            if node.op is Ops.REDUCE_AXIS and node is not self.root and node not in self.realized:
                shape = shape_of(node.src[0])
                if not all(isinstance(shape[a], int) and shape[a] <= 1 for a in node.arg[1]):
                    count[node] = count.get(node, 0) + 1
        return {node for node, n in count.items() if n > 1}

    def bounded_indices(self, idx: list[UOp], shape: tuple, pads: tuple) -> list[UOp]:
        """A pad's source indices for the walk below it: each padded axis's index (which runs past the source
        where the gate is false) as a placeholder bounded to the source, [0, size), so the index math below
        (a reshape's `//` and `%`) simplifies as for an unpadded read; `PAD` puts the indices back after. The
        value below only counts where the gate holds, and every load there is gated."""
        out = []
        for j, s, (b, e) in zip(idx, shape, pads):
            lo, hi = j.bounds
            if (b or e) and isinstance(s, int) and isinstance(lo, int) and isinstance(hi, int) and \
                    j.op is not Ops.CONST and (lo < 0 or hi >= s) and max(lo, 0) <= min(hi, s - 1):
                self.placeholders += 1
                j = UOp(Ops.DEFINE_VAR, INDEX, (), (f"padded_index_{self.placeholders}", max(lo, 0), min(hi, s - 1)))
            out.append(j)
        return out

    def simplify(self, u: UOp) -> UOp:
        return simplify(u, self.simplified)

    def new_range(self, size: int, kind: RangeKind) -> UOp:
        r = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, size),), (self.range_id, kind))
        self.range_id += 1
        return r

    def buffer(self, node: UOp) -> UOp:
        if node not in self.globals:
            idx = self.bufs.index(node) if node in self.bufs else len(self.bufs)
            if node not in self.bufs:
                self.bufs.append(node)
            self.globals[node] = UOp(Ops.DEFINE_GLOBAL, mem_dtype(node.dtype).as_ptr(), (), idx)
        return self.globals[node]

    def build(self) -> UOp:
        shape = shape_of(self.root)
        idx = tuple(self.new_range(s, RangeKind.LOOP) if s != 1 else UOp.const(INDEX, 0) for s in shape)
        out = self.buffer(self.root)
        value = self.value(self.root, idx, UOp.const(dtypes.bool, True), top=True)
        store = UOp(Ops.STORE, None, (out, flat_index(idx, shape, self.simplified), value))
        return UOp(Ops.SINK, None, (store,))

    def build_into(self, target: UOp, axis: int, offset: int, top: bool) -> UOp:
        """A kernel storing `root`'s values into its slice of `target` (a concatenation: `root`'s shape but along
        `axis`, where it starts at `offset`; `tgc.engine.placement`). `top`: `root` is computed here (a placed
        piece), else read from its buffer where it is realized."""
        shape = shape_of(self.root)
        idx = tuple(self.new_range(s, RangeKind.LOOP) if s != 1 else UOp.const(INDEX, 0) for s in shape)
        self.bufs = [target]
        out = self.buffer(target)
        value = self.value(self.root, idx, UOp.const(dtypes.bool, True), top=top)
        at = tuple(simplify(i + UOp.const(INDEX, offset)) if a == axis and offset else i for a, i in enumerate(idx))
        store = UOp(Ops.STORE, None, (out, flat_index(at, shape_of(target)), value))
        return UOp(Ops.SINK, None, (store,))

    def value(self, node: UOp, idx: tuple[UOp, ...], valid: UOp, top: bool = False) -> UOp:
        """`node`'s value at index `idx` under the gate `valid` (memoized per (node, idx, valid)); a walk of any
        depth (`tgc.ir.walk.drive`: `_value` yields the sources' requests in the order a recursion would)."""
        first = (node, idx, valid)
        return drive(first, lambda req: self._value(*req, top and req is first), self.memo)

    def _value(self, node: UOp, idx: tuple[UOp, ...], valid: UOp,
               top: bool) -> Generator[tuple[UOp, tuple[UOp, ...], UOp], UOp, UOp]:
        op, arg = node.op, node.arg
        if valid.op is Ops.CONST and not valid.arg:  # never read (padding): any value will do, and no load
            return UOp.const(node.dtype, 0)
        if node.op is Ops.BUFFER or (node in self.realized and not top):
            index = flat_index(idx, shape_of(node), self.simplified)
            src = (self.buffer(node), index) if valid.op is Ops.CONST else (self.buffer(node), index, valid)
            return UOp(Ops.LOAD, node.dtype, src)
        if op is Ops.CONST:
            return node
        if op is Ops.IOTA:
            return UOp(Ops.CAST, node.dtype, (idx[0],))
        if op is Ops.CONTIGUOUS:  # the root of its own kernel: a plain copy of its source
            return (yield (node.src[0], idx, valid))
        if op in ALU or op in (Ops.CAST, Ops.BITCAST):
            srcs = []
            for s in node.src:
                srcs.append((yield (s, idx, valid)))
            return UOp(op, node.dtype, tuple(srcs))
        if op is Ops.REDUCE_AXIS:
            reduce_op, axes = arg
            src_shape = shape_of(node.src[0])
            ranges, inner = [], list(idx)
            for a in axes:
                if src_shape[a] == 1:
                    inner[a] = UOp.const(INDEX, 0)
                else:
                    r = self.new_range(src_shape[a], RangeKind.REDUCE)
                    ranges.append(r)
                    inner[a] = r
            inner_value = (yield (node.src[0], tuple(inner), valid))
            if prod(src_shape[a] for a in axes) == 0:
                return UOp.const(node.dtype, identity(reduce_op, node.dtype))
            if not ranges:
                return inner_value
            return UOp(Ops.REDUCE, node.dtype, (inner_value, *ranges), reduce_op)
        src = node.src[0]
        src_shape = shape_of(src)
        if op is Ops.GATHER:  # a real indexed load: the index along `arg` is read from the index tensor
            j = _clamped_index((yield (node.src[1], idx, valid)), src_shape[arg])
            return (yield (src, idx[:arg] + (j,) + idx[arg + 1:], valid))
        if op is Ops.RESHAPE:
            flat = flat_index(idx, shape_of(node), self.simplified)
            new_idx = []
            for s, st in zip(src_shape, strides_for(src_shape)):
                new_idx.append(UOp.const(INDEX, 0) if s == 1 else self.simplify((flat // UOp.const(INDEX, st)) %
                                                                           UOp.const(INDEX, s)))
            return (yield (src, tuple(new_idx), valid))
        if op is Ops.PERMUTE:
            new_idx = [None] * len(arg)
            for i, a in enumerate(arg):
                new_idx[a] = idx[i]
            return (yield (src, tuple(new_idx), valid))
        if op is Ops.EXPAND:
            return (yield (src, tuple(UOp.const(INDEX, 0) if s == 1 else i for i, s in zip(idx, src_shape)), valid))
        if op is Ops.SHRINK:
            return (yield (src, tuple(self.simplify(i + UOp.const(INDEX, b)) if b else i
                                         for i, (b, _) in zip(idx, arg)), valid))
        if op is Ops.FLIP:
            return (yield (src, tuple(self.simplify(UOp.const(INDEX, s - 1) - i) if f else i
                                         for i, s, f in zip(idx, src_shape, arg)), valid))
        if op is Ops.STRIDE:
            return (yield (src, tuple(self.simplify(i * UOp.const(INDEX, st)) if st != 1 else i
                                         for i, st in zip(idx, arg)), valid))
        if op is Ops.WINDOW:
            axis, _, stride, dil = arg
            h = self.simplify(idx[axis] * UOp.const(INDEX, stride) + idx[axis + 1] * UOp.const(INDEX, dil))
            return (yield (src, idx[:axis] + (h,) + idx[axis + 2:], valid))
        if op is Ops.PAD:
            pads, fill = arg
            new_idx, cond = [], None
            for i, s, (b, _) in zip(idx, src_shape, pads):
                j = self.simplify(i - UOp.const(INDEX, b)) if b else i
                new_idx.append(j)
                if b or _:
                    c = self.simplify(UOp(Ops.AND, dtypes.bool, (_ge0(j), j < UOp.const(INDEX, s))))
                    cond = c if cond is None else self.simplify(UOp(Ops.AND, dtypes.bool, (cond, c)))
            if cond is None or (cond.op is Ops.CONST and cond.arg):
                return (yield (src, tuple(new_idx), valid))
            if cond.op is Ops.CONST:  # only padding is read here: the fill value, and no load at all
                return UOp.const(node.dtype, fill)
            inner_valid = cond if valid.op is Ops.CONST else self.simplify(UOp(Ops.AND, dtypes.bool, (valid, cond)))
            bounded = self.bounded_indices(new_idx, src_shape, pads)
            inner = (yield (src, tuple(bounded), inner_valid))
            if bounded != new_idx:  # the placeholders back to the padded indices
                inner = self.simplify(substitute(inner, {b: j for b, j in zip(bounded, new_idx) if b is not j}))
            return UOp(Ops.WHERE, node.dtype, (cond, inner, UOp.const(node.dtype, fill)))
        raise NotImplementedError(f"cannot lower {op}")


def _clamped_index(j: UOp, n: int) -> UOp:
    """A gathered index of any int dtype as an INDEX in [0, n): negative values wrap once (j + n), then the
    result is clamped (`j < 0` -> 0, `j >= n` -> n - 1). Written as MAX and `(a < b).where(a, b)` so that the
    symbolic bounds (`UOp.vmin`/`vmax`) prove every gathered load in bounds."""
    top = UOp.const(INDEX, n - 1)
    if j.dtype.is_unsigned:  # no negatives; clamp in its own dtype first (a u64 above 2^63 is no i64)
        cap = UOp.const(j.dtype, min(n - 1, int(min_max(j.dtype)[1])))
        j = UOp(Ops.WHERE, j.dtype, (UOp(Ops.CMPLT, dtypes.bool, (j, cap)), j, cap))
        j = UOp(Ops.CAST, INDEX, (j,))
    else:
        j = UOp(Ops.CAST, INDEX, (j,))
        if j.vmax > (1 << 62):  # an i64 index: clamp from above first, so that j + n has 64-bit bounds
            j = UOp(Ops.WHERE, INDEX, (UOp(Ops.CMPLT, dtypes.bool, (j, top)), j, top))
        j = UOp(Ops.WHERE, INDEX, (UOp(Ops.CMPLT, dtypes.bool, (j, UOp.const(INDEX, 0))),
                                   j + UOp.const(INDEX, n), j))
        j = UOp(Ops.MAX, INDEX, (j, UOp.const(INDEX, 0)))
    return UOp(Ops.WHERE, INDEX, (UOp(Ops.CMPLT, dtypes.bool, (j, top)), j, top))


def _ge0(j: UOp) -> UOp:
    """j >= 0 written as not (j < 0), folded when the bounds decide it."""
    if j.vmin >= 0:
        return UOp.const(dtypes.bool, True)
    if j.vmax < 0:
        return UOp.const(dtypes.bool, False)
    return UOp(Ops.NOT, dtypes.bool, (j < UOp.const(INDEX, 0),))


def mem_dtype(d: DType) -> DType:
    """How a dtype is held in memory (bools as one byte; renderers map `bool` to u8 storage)."""
    return d


def _size_in_name(size: object, hidden: Mapping[str, tuple[str, str | int]] | None = None) -> str:
    """A loop's size as a kernel name shows it: the number, or a size variable's product of dims (`N`, `3C`); a
    sum of terms (`N-2`) is no part of a name (kernel names are identifiers in every dialect and in a package's
    manifest), so it shows the size it was traced at, as the probe path's names do. A product of dims with a
    name longer than one letter, which a message writes `HID*SEQ`, is `HIDSEQ` in a name, as before. `hidden`:
    a narrowed class's hidden dims (`symsize.hidden_named`: `C_D * D` shows as C, `C_D` as `CdD`)."""
    if (unit := unit_name(size)) is not None:
        return unit  # (`N // 32` of a 32n dim: the probe path's `Nd32`)
    if hidden and isinstance(size, SymSize):
        size = hidden_named(size, hidden)
    text = str(size).replace("*", "") if isinstance(size, SymSize) else str(size)
    return text if text.isalnum() or not isinstance(size, SymSize) else str(size.value)


def kernel_name(ast: UOp, hidden: Mapping[str, tuple[str, str | int]] | None = None) -> str:
    """`r_`/`E_` and the loops' sizes (`_size_in_name`; `hidden`: a narrowed class's hidden dims)."""
    ranges = sorted({u for u in ast.toposort() if u.op is Ops.RANGE}, key=lambda r: r.arg[0])
    has_reduce = any(u.op is Ops.REDUCE for u in ast.toposort())
    sizes = [_size_in_name(r.src[0].arg, hidden) for r in ranges] or ["1"]
    return ("r_" if has_reduce else "E_") + "_".join(sizes)


# a reduction of at least this many elements into a handful of outputs is split in two stages, so
# that the first stage has enough independent rows for threads (and for GPU work-groups)
SPLIT_REDUCE_MIN = 1 << 16
SPLIT_REDUCE_MAX_OUTPUTS = 16


def _split_size(n: int) -> int:
    """How many partial results to make of n elements: a divisor of n, at most 256, rows of >= 1024."""
    for groups in range(256, 1, -1):
        # (traced once: only a divisor at every size of the class, so the split is exact there; not splitting is
        # right at every size)
        if multiple_at_every_size(n, groups) and n // groups >= 1024:
            return groups
    return 0


def _split_reduce(new: UOp) -> UOp:
    """A node rebuilt on its new sources, as a two-stage reduction when it is a large one into few outputs."""
    if new.op is not Ops.REDUCE_AXIS:
        return new
    src = new.src[0]
    shape = shape_of(src)
    op, axes = new.arg
    n = prod(shape[a] for a in axes)
    # (the outputs' count first: a convolution's `9C >= 65536` differs between a 32n class's probes, while its
    # thousands of outputs are no split's at any size; the same answer for every concrete size)
    groups = _split_size(n) if prod(shape_of(new)) <= SPLIT_REDUCE_MAX_OUTPUTS and n >= SPLIT_REDUCE_MIN else 0
    if not groups:
        return new
    keep = [i for i in range(len(shape)) if i not in axes]
    order = tuple(keep + list(axes))
    x = UOp(Ops.PERMUTE, src.dtype, (src,), order) if order != tuple(range(len(shape))) else src
    kept = tuple(shape[i] for i in keep)
    x = UOp(Ops.RESHAPE, src.dtype, (x,), kept + (groups, n // groups))
    part = UOp(Ops.REDUCE_AXIS, src.dtype, (x,), (op, (len(keep) + 1,)))
    total = UOp(Ops.REDUCE_AXIS, src.dtype, (part,), (op, (len(keep),)))
    return UOp(Ops.RESHAPE, src.dtype, (total,), shape_of(new))


def split_large_reduces(outputs: list[UOp]) -> list[UOp]:
    """sum(x) over millions of elements -> sum(sum(x.reshape(G, n/G), 1)): the first stage parallelizes.
    One bottom-up pass (`rebuild`), not a rewrite to a fixed point: the stages it makes are not split again."""
    memo: dict[UOp, UOp] = {}
    return [rebuild(o, memo, _split_reduce) for o in outputs]


MAX_ELEMENTS = (1 << 63) - 1  # flat indices of every tensor must fit the 64-bit index math


def check_sizes(outputs: list[UOp]) -> None:
    """A tensor with more elements than 64-bit index math addresses is refused (never indexed modulo 2^64)."""
    seen: set[UOp] = set()
    for out in outputs:
        for node in postorder(out, seen):  # (outputs sharing a graph: each node walked once)
            if node in seen:
                continue
            seen.add(node)
            shape = shape_of(node)
            if isinstance(prod(shape), SymSize):
                # (traced once: the count is a polynomial of the dims, past 2^63 at the probes of a class whose
                # width is a product of three dims, `C = C_D_KH * KH * D`. Not decided: a symbolic kernel's index
                # math is proved to fit 64 bits over its dims' whole range (`codegen.index.index_width`, which
                # cuts the plan's bound where it does not), so no count is indexed modulo 2^64 there either)
                continue
            if prod(shape) > MAX_ELEMENTS:
                raise TgcError(f"a tensor of shape {list(shape)} has {prod(shape)} elements, more than the "
                               f"2^63 - 1 that tgc can index", hint="use smaller dims")


PACK_PANEL = 32  # matmul: right-hand sides are packed into panels of this many columns ...
PACK_MIN_ELEMENTS = 1 << 18  # ... when they have at least this many elements ...
PACK_MIN_ROWS = 16  # ... and at least this many rows read each (fewer: one register tile of rows reads it once in
# any layout, and a packing copy would double its memory traffic and hold a copy of it: a GRU step, a decode),
# unless it is transposed (the copy makes its column vectors contiguous)


def _broadcast(u: UOp) -> list[UOp] | None:
    """[EXPAND, RESHAPE] or [RESHAPE] (an expand to the same shape is no node): the nodes that broadcast an
    operand into a matmul's (..., m, k, n) product, top first; None for anything else."""
    chain = [u] if u.op is Ops.EXPAND else []
    last = u.src[0] if chain else u
    return chain + [last] if last.op is Ops.RESHAPE else None


def _matmul_rhs(r: UOp) -> list[UOp] | None:
    """The nodes broadcasting the right-hand side b of a matmul `r` (as `Tensor.matmul` builds it: the sum
    over k of a[..., m, k, 1] * b[..., 1, k, n], both expanded to (..., m, k, n)), top first, or None when
    `r` is not a matmul."""
    if r.op is not Ops.REDUCE_AXIS or r.arg[0] is not Ops.ADD or r.src[0].op is not Ops.MUL:
        return None
    shape = shape_of(r.src[0])
    if len(shape) < 3 or r.arg[1] != (len(shape) - 2,):
        return None
    x, y = (_broadcast(u) for u in r.src[0].src)
    if x is None or y is None:
        return None
    xs, ys = shape_of(x[-1].src[0]), shape_of(y[-1].src[0])
    if shape_of(x[-1]) != xs + (1,) or shape_of(y[-1]) != ys[:-2] + (1,) + ys[-2:]:
        return None
    return y


def _packed_columns(b: UOp, panel: int = PACK_PANEL, min_elements: int = PACK_MIN_ELEMENTS) -> UOp | None:
    """`b` (..., k, n) read from a copy laid out as panels of `panel` columns, each panel contiguous over the
    rows: a matmul kernel then streams its right-hand side sequentially instead of one row stride (often a
    page) per step. None where it is not worth its copy (under `min_elements`) or does not apply."""
    *batch, k, n = shape_of(b)
    if n % panel or k * n < min_elements or n == panel:
        return None
    nb = len(batch)
    split = UOp(Ops.RESHAPE, b.dtype, (b,), tuple(batch) + (k, n // panel, panel))
    order = tuple(range(nb)) + (nb + 1, nb, nb + 2)
    packed = UOp(Ops.CONTIGUOUS, b.dtype, (UOp(Ops.PERMUTE, b.dtype, (split,), order),))  # (..., n/panel, k, panel)
    return UOp(Ops.RESHAPE, b.dtype, (UOp(Ops.PERMUTE, b.dtype, (packed,), order),), tuple(batch) + (k, n))


def _pack_pays(b: UOp, rows: int) -> bool:
    """Whether packing `b` pays (`tgc.engine.packrule.pack_pays`) where it is an input read in place (a program
    input, or a slice of one: its row stride is the input's): elsewhere the copy also realizes a computed
    operand, which the matmul would otherwise compute again per row block, so it is kept."""
    base = b  # (through slices, and reshapes that keep the last axis: the row stride stays the input's)
    while base.op is Ops.SHRINK or (base.op is Ops.RESHAPE and shape_of(base)[-1:] == shape_of(base.src[0])[-1:]):
        base = base.src[0]
    if base.op is not Ops.BUFFER or len(shape_of(base)) < 2:
        return True
    k, n = shape_of(b)[-2], shape_of(base)[-1]
    return packrule.pack_pays(k, n, b.dtype.itemsize, rows)


def _in_place_base(b: UOp) -> UOp:
    """The node `b` reads in place through slices and reshapes that keep its last axis (its row stride is the
    base's)."""
    while b.op is Ops.SHRINK or (b.op is Ops.RESHAPE and shape_of(b)[-1:] == shape_of(b.src[0])[-1:]):
        b = b.src[0]
    return b


def _rows_off_lines(b: UOp) -> bool:
    """Whether `b` is read in place from a program input whose rows do not start on cache lines (its row stride
    no multiple of the private cache's line: `packrule.rows_on_lines`)."""
    base = _in_place_base(b)
    if base.op is not Ops.BUFFER or len(shape_of(base)) < 2 or not isinstance(shape_of(base)[-1], int):
        return False
    return not packrule.rows_on_lines(shape_of(base)[-1], b.dtype.itemsize)


def _packed_rhs(node: UOp, whole: bool = False) -> tuple[list[UOp], UOp] | None:
    """(the broadcasts and reshapes above the right-hand side b of matmul `node`, top first; b's packed copy)
    where `pack_matmul_operands` packs it, else None. `whole`: `node` is a part of a matmul whose copy was
    split (`split_large_copies`): packed whatever its size, as the whole one was."""
    chain = _matmul_rhs(node)  # then the broadcasts and reshapes above b that keep its last two axes
    if chain is None:
        return None
    kn, b = shape_of(chain[0])[-2:], chain[-1].src[0]
    while b.op in (Ops.EXPAND, Ops.RESHAPE) and shape_of(b.src[0])[-2:] == kn:
        chain.append(b)
        b = b.src[0]
    if whole:
        packed = _packed_columns(b, min_elements=0)
    else:
        rows = prod(shape_of(node.src[0])[:-2]) // max(1, prod(shape_of(b)[:-2]))  # (batch, row) pairs per operand
        # (a transposed operand is copied whatever its rows: read in place, each column vector is a gather)
        # (an operand whose rows start off cache lines, read by many rows, is packed whatever its size: read in
        # place, each vector load of a row spans two lines; 1365 x 1000 x 197's 992 columns: 3.85 -> 3.27 ms)
        with speed_choice():  # (traced once: answered at the representative size; speed only)
            floor = 0 if rows >= packrule.PACK_IN_PLACE_MAX_ROWS and _rows_off_lines(b) else PACK_MIN_ELEMENTS
            pack = b.op is Ops.PERMUTE or (rows >= PACK_MIN_ROWS and _pack_pays(b, rows))
        packed = _packed_columns(b, min_elements=floor) if pack else None
    return None if packed is None else (chain, packed)


def pack_matmul_operands(outputs: list[UOp], whole: frozenset[UOp] = frozenset()
                         ) -> tuple[list[UOp], dict[UOp, UOp], dict[UOp, UOp]]:
    """A CPU cache choice (`caps.pack_matmul`): every large matmul reads its right-hand side from a copy packed
    into column panels (`_packed_columns`), one packing kernel per operand; the column parts in `whole`
    (`split_large_copies`) are packed whatever their size. Returns the new outputs, the original node of every
    rebuilt one, and for each packed copy the matmul it serves (for its .tg line)."""
    replace: dict[UOp, UOp] = {}
    serves: dict[UOp, UOp] = {}
    for node in UOp(Ops.SINK, None, tuple(outputs)).toposort():
        got = _packed_rhs(node, node in whole)
        if got is None or got[0][0] in replace:
            continue
        chain, packed = got
        serves.setdefault(packed.src[0].src[0], node)
        new = packed
        for u in reversed(chain):
            new = u.replace(src=(new,))
        replace[chain[0]] = new
    if not replace:
        return outputs, {}, {}
    memo: dict[UOp, UOp] = dict(replace)
    rebuild(UOp(Ops.SINK, None, tuple(outputs)), memo)
    original = {new: old for old, new in memo.items() if new is not old and old not in replace}
    return [memo[o] for o in outputs], original, serves


MEMORY_LIMIT = 1.5  # the memory target: a program's planned peak at most this many times its inputs + outputs
# (`tgc.engine.chunk` chunks a program over it); a packed copy that would take a matmul over it is made in parts
COPY_PART_MIN_COLUMNS = 4 * PACK_PANEL  # ... of at least this many columns (narrower parts reread the left-hand
# side too often for the memory they save): where the target needs narrower ones, the copy stays whole


def _nbytes(u: UOp) -> int | None:
    shape = shape_of(u)
    return prod(shape) * u.dtype.itemsize if all(isinstance(d, int) for d in shape) and u.dtype else None


def _read_in_place(u: UOp) -> bool:
    """Whether `u` is a program input seen through movement ops (no buffer of its own)."""
    while u.op in (Ops.SHRINK, Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND):
        u = u.src[0]
    return u.op is Ops.BUFFER


def copy_parts(r: UOp, copy_bytes: int, io: int, is_output: bool = False) -> int:
    """How many column parts the packed copy (`copy_bytes`) of matmul `r`'s right-hand side is made in, in a
    program of `io` bytes of inputs + outputs: 1 where the copy fits beside what the matmul itself needs at the
    memory target (MEMORY_LIMIT x io: io, `r`'s output unless it is a program output (`is_output`: counted in
    io) and its left-hand side unless read in place from an input); else the fewest parts that each fit, each at
    least COPY_PART_MIN_COLUMNS wide (1 where none would fit)."""
    out = 0 if is_output else _nbytes(r)
    a = _broadcast(r.src[0].src[0])[-1].src[0]  # type: ignore[index]
    lhs = 0 if _read_in_place(a) else _nbytes(a)
    if out is None or lhs is None:
        return 1
    room = int(MEMORY_LIMIT * io) - io - out - lhs
    if copy_bytes <= room:
        return 1
    n = shape_of(r)[-1]
    panels = n // PACK_PANEL
    most = panels // (COPY_PART_MIN_COLUMNS // PACK_PANEL)  # (arithmetic only: no search over sizes)
    parts = -(-copy_bytes // room) if room > 0 else most + 1
    return parts if 1 < parts <= most else 1


def _part_join(r: UOp, parts: list[UOp], bounds: list[tuple[int, int]]) -> UOp:
    """`r` from its column parts (`bounds[i]`: part i's columns), a sum of each padded to `r`'s columns
    (`tgc.engine.placement` stores each part straight into its slice of the joined buffer)."""
    nd = len(shape_of(r))
    n = shape_of(r)[-1]
    out = None
    for part, (lo, hi) in zip(parts, bounds):
        pad = UOp(Ops.PAD, r.dtype, (part,), (((0, 0),) * (nd - 1) + ((lo, n - hi),), 0.0))
        out = pad if out is None else UOp(Ops.ADD, r.dtype, (out, pad))
    assert out is not None
    return out


def split_large_copies(outputs: list[UOp]) -> tuple[list[UOp], dict[UOp, UOp], dict[UOp, UOp], frozenset[UOp]]:
    """Every matmul whose packed right-hand side (`_packed_rhs`) would take the program over its memory target
    (`copy_parts`) computed as column parts of whole panels, each reading a packed copy of its own columns only,
    joined in the consumer (the parts' copies live one at a time, so the memory plan gives them one slot). A rule
    over sizes and the memory target. Returns the new outputs, the original node of every rebuilt one, for each
    part the matmul it computes, and the parts (`pack_matmul_operands` packs them whatever their size)."""
    sink = UOp(Ops.SINK, None, tuple(outputs))
    sizes = [_nbytes(u) for u in sink.toposort() if u.op is Ops.BUFFER] + [_nbytes(o) for o in outputs]
    if any(s is None for s in sizes):
        return outputs, {}, {}, frozenset()
    io = sum(s for s in sizes if s is not None)
    outs = set()  # the outputs, and what they reshape (a matmul rebuilt on split operands is another node: its
    for o in outputs:  # output counted again, conservatively)
        outs.add(o)
        while o.op is Ops.RESHAPE:
            o = o.src[0]
            outs.add(o)
    serves: dict[UOp, UOp] = {}

    def split(new: UOp) -> UOp:
        got = _packed_rhs(new)
        copy = None if got is None else _nbytes(got[1])
        if copy is None or not _splittable_columns(new):
            return new
        count = copy_parts(new, copy, io, new in outs)
        if count == 1:
            return new
        panels = shape_of(new)[-1] // PACK_PANEL
        per = -(-panels // count) * PACK_PANEL
        bounds = [(lo, min(lo + per, panels * PACK_PANEL)) for lo in range(0, panels * PACK_PANEL, per)]
        parts = [_column_part(new, lo, hi) for lo, hi in bounds]
        for p in parts:
            serves[p] = new
        return _part_join(new, parts, bounds)

    memo: dict[UOp, UOp] = {}
    new_outputs = [rebuild(o, memo, split) for o in outputs]
    if not serves:
        return outputs, {}, {}, frozenset()
    original = {new: old for old, new in memo.items() if new is not old}
    return new_outputs, original, {p: original.get(r, r) for p, r in serves.items()}, frozenset(serves)


HIDDEN_PART_MIN = COPY_PART_MIN_COLUMNS  # a hidden-dim part (`split_hidden_chains`) at least this wide


def _consumers(outputs: list[UOp]) -> dict[UOp, list[UOp]]:
    """Every node's users in the graph of `outputs` (each user once)."""
    users: dict[UOp, list[UOp]] = {}
    for node in UOp(Ops.SINK, None, tuple(outputs)).toposort():
        for s in dict.fromkeys(node.src):
            users.setdefault(s, []).append(node)
    return users


def _hidden_chain(r2: UOp, users: dict[UOp, list[UOp]], outs: set[UOp]) -> tuple[UOp, UOp, set[UOp]] | None:
    """(H, R1, f's nodes) where matmul `r2` reads as its left-hand side H = f(R1), R1 = X @ W1 a matmul and f
    elementwise per element (ALU ops and casts of H's shape down to R1; every other leaf free of reductions, read
    at the element's own index), with H, R1 and f's nodes read nowhere else and no program output; else None."""
    x = _broadcast(r2.src[0].src[0])
    if x is None:
        return None
    h = x[-1].src[0]
    shape = shape_of(h)
    if h in outs or len(users.get(h, [])) != 1 or any(len(users.get(u, [])) != 1 for u in x):
        return None
    region: set[UOp] = set()
    r1 = None
    stack = [h]
    while stack:
        node = stack.pop()
        if node in region:
            continue
        if node.op is Ops.RESHAPE and _matmul_rhs(node.src[0]) is not None and shape_of(node) == shape \
                and shape_of(node.src[0])[-1] == shape[-1]:  # (the matmul's (..., m, 1, n) as (..., m, n))
            if r1 not in (None, node.src[0]):
                return None  # (two matmuls: not one chain)
            r1 = node.src[0]
            region.add(node)
        elif (node.op in ALU or node.op is Ops.CAST) and shape_of(node) == shape:
            stack.extend(node.src)
            region.add(node)
            continue
        elif any(u.op is Ops.REDUCE_AXIS for u in node.toposort()):
            return None  # (a leaf with a reduction: a softmax or a norm over the hidden axis is not per element)
    if r1 is None or not _splittable_columns(r1):
        return None
    inner = region | {r1}
    for u in inner:
        if u in outs or any(v not in region and v is not x[-1] for v in users.get(u, [])):
            return None  # (read elsewhere too: it would be needed whole)
    return h, r1, region


def _hidden_part(h: UOp, r1: UOp, region: set[UOp], lo: int, hi: int) -> UOp:
    """H = f(R1) over its last axis lo..hi only: R1's column part, every other leaf of f shrunk."""
    shape = shape_of(h)
    bounds = tuple((0, d) for d in shape[:-1]) + ((lo, hi),)
    memo: dict[UOp, UOp] = {r1: _column_part(r1, lo, hi)}
    for node in region:
        for s in node.src:  # (a leaf of f: of H's shape, as every operand of an elementwise op)
            if s not in region and s is not r1 and s not in memo:
                memo[s] = UOp(Ops.SHRINK, s.dtype, (s,), bounds)
        if node.op is Ops.RESHAPE:  # (R1's reshape to H's shape)
            memo[node] = UOp(Ops.RESHAPE, node.dtype, (memo[node.src[0]],), shape[:-1] + (hi - lo,))
    return rebuild(h, memo)  # (f's own nodes on the parts)


def hidden_parts(h_bytes: int, copy_bytes: int, room: int, width: int) -> int:
    """How many parts of its hidden axis (`width` wide) a chain H = f(X @ W1), H @ W2 is computed in: 1 where H
    (`h_bytes`) fits in `room` (what the memory target leaves beside the chain's other buffers); else the fewest
    parts whose hidden part and the larger packed weight part (`copy_bytes` whole) fit, each at least
    HIDDEN_PART_MIN wide (1 where none would fit)."""
    if h_bytes <= room:
        return 1
    most = width // HIDDEN_PART_MIN
    parts = -(-(h_bytes + copy_bytes) // room) if room > 0 else most + 1
    return parts if 1 < parts <= most else 1


def split_hidden_chains(outputs: list[UOp]) -> tuple[list[UOp], dict[UOp, UOp], frozenset[UOp]]:
    """Every chain OUT = f(X @ W1) @ W2 (f elementwise per element, its result H read only by the second matmul)
    whose H would take the program over its memory target computed in parts of the hidden axis: part p's
    H_p = f(X @ W1[:, p]) is consumed by H_p @ W2[p, :] added onto the previous parts' sum (a realized buffer the
    next part's matmul reads in its epilogue at the index it writes: the memory plan writes it in place) before
    part p + 1 is computed, so one H_p lives at a time. A rule over sizes and the memory target (`hidden_parts`).
    Returns the new outputs, the original node of every rebuilt one and the matmul parts (packed whatever their
    size, as the whole was)."""
    sink = UOp(Ops.SINK, None, tuple(outputs))
    sizes = [_nbytes(u) for u in sink.toposort() if u.op is Ops.BUFFER] + [_nbytes(o) for o in outputs]
    if any(s is None for s in sizes):
        return outputs, {}, frozenset()
    io = sum(s for s in sizes if s is not None)
    parts_made: set[UOp] = set()
    original: dict[UOp, UOp] = {}
    while True:  # one chain at a time (a chain's X may hold another chain: the graph is walked again)
        got = _split_one_chain(outputs, io)
        if got is None:
            return outputs, original, frozenset(parts_made)
        outputs, original_c, made = got
        original = {new: original.get(old, old) for new, old in original_c.items()} | original
        parts_made |= made


def _split_one_chain(outputs: list[UOp], io: int) -> tuple[list[UOp], dict[UOp, UOp], set[UOp]] | None:
    """The first chain (`split_hidden_chains`) to split, split: the new outputs, the original node of every rebuilt
    one and its matmul parts; else None."""
    outs = set()  # the outputs, and what they reshape
    for o in outputs:
        outs.add(o)
        while o.op is Ops.RESHAPE:
            o = o.src[0]
            outs.add(o)
    users = _consumers(outputs)
    parts_made: set[UOp] = set()
    for r2 in UOp(Ops.SINK, None, tuple(outputs)).toposort():
        if _matmul_rhs(r2) is None or r2.dtype is None or not r2.dtype.is_float:
            continue
        if shape_of(r2)[-1] % SPLIT_COLUMNS:  # (odd output columns: each part's sum would be a join of column
            continue  # pieces (`split_odd_sizes`), not read in place; mixer's token MLP split: 1.43x -> 1.52x)
        got = _hidden_chain(r2, users, outs)
        if got is None:
            continue
        h, r1, region = got
        width = shape_of(h)[-1]
        a = _broadcast(r1.src[0].src[0])[-1].src[0]  # type: ignore[index]
        out, hb, lhs = _nbytes(r2), _nbytes(h), 0 if _read_in_place(a) else _nbytes(a)
        if out is None or hb is None or lhs is None:
            continue
        packed = [_packed_rhs(r) for r in (r1, r2)]
        copies = max((_nbytes(p[1]) or 0) if p is not None else 0 for p in packed)
        # (beside the part: the left-hand side X, the parts' sum so far and the next one, unless an output)
        room = int(MEMORY_LIMIT * io) - io - out - (0 if r2 in outs else out) - lhs
        count = hidden_parts(hb, copies, room, width)
        if count == 1:
            continue
        per = -(-width // (count * PACK_PANEL)) * PACK_PANEL  # (whole panels; the last part may be odd)
        acc = None
        for lo in range(0, width, per):
            hi = min(lo + per, width)
            hp = _hidden_part(h, r1, region, lo, hi)
            part = _matmul_part(r2, steps=(lo, hi))
            bounds = tuple((0, d) for d in shape_of(h)[:-1]) + ((lo, hi),)
            part = substitute(part, {UOp(Ops.SHRINK, h.dtype, (h,), bounds): hp})
            if h in part.toposort():  # (not read through the slice `_matmul_part` makes: leave the chain whole)
                acc = None
                break
            parts_made |= {p for p, whole in ((part, packed[1]), (_column_part(r1, lo, hi), packed[0])) if whole}
            acc = part if acc is None else UOp(Ops.ADD, r2.dtype, (UOp(Ops.CONTIGUOUS, r2.dtype, (acc,)), part))
        if acc is None:
            continue
        memo = {r2: acc}
        new_outputs = [rebuild(o, memo) for o in outputs]
        return new_outputs, {new: old for old, new in memo.items() if new is not old}, parts_made
    return None


def _splittable_columns(r: UOp) -> bool:
    """Whether a column part of `r` can be written (`_matmul_part`): a float matmul of constant sizes whose
    right-hand side has the column axis."""
    if r.dtype is None or not r.dtype.is_float or not all(isinstance(d, int) for d in shape_of(r.src[0])):
        return False
    b = _broadcast(r.src[0].src[1])[-1].src[0]  # type: ignore[index]
    return len(shape_of(b)) >= 2


SPLIT_COLUMNS = 32  # a matmul's output columns that are no multiple of this are split into a part that is ...
SPLIT_REDUCE = 8  # ... (its reduction: a vector's worth of steps, where it has at most ...
SPLIT_REDUCE_MAX_OUTPUTS = 4096  # ... this many outputs: a reduction-bound matmul, its steps shared by threads) ...
SPLIT_MIN_PRODUCTS = 1 << 22  # ... and the rest, for a matmul of at least this many multiply-adds
REST_COLUMNS = 16  # the rest is computed as this many columns (or twice), the last ones of the matmul
# Odd rows are not split: the CPU's register tile pads them to whole tiles (heuristic `padded_rows`, at most 7 rows
# wasted of 64 or more) and a GPU's grid rounds them up. The row split it replaced (rows 0..m - m % 8 and the last
# 8, joined) cost a second pass over the packed operand for 8 rows plus a join over the whole output
# (1365x512x512, one thread: 4.6 ms split, 4.3 ms padded; 1365x1000x197: 5.1 ms, 3.8 ms).


def _matmul_part(r: UOp, steps: tuple[int, int] | None = None, columns: tuple[int, int] | None = None) -> UOp:
    """The matmul `r` (as `_matmul_rhs` recognises it) over its reduction steps and output columns in the given
    ranges only (None: all; its rows are never split): the same product of the left-hand side's rows and steps
    with the right-hand side's steps and columns, written as `Tensor.matmul` writes one."""
    mul = r.src[0]
    x, y = _broadcast(mul.src[0]), _broadcast(mul.src[1])
    shape = shape_of(mul)
    m, k, n = shape[-3:]
    rows, steps, columns = (0, m), steps or (0, k), columns or (0, n)
    full = shape[:-3] + (rows[1] - rows[0], steps[1] - steps[0], columns[1] - columns[0])

    def shrunk(u: UOp, last_two: tuple[tuple[int, int], tuple[int, int]]) -> UOp:
        dims = shape_of(u)
        if u.op is Ops.EXPAND and shape_of(u.src[0])[-2:] == dims[-2:]:
            # an operand broadcast over batch axes (a weight under a batch of rows): its source is shrunk and
            # broadcast again, so the part (and a packed copy of it) holds the operand once, not once per batch
            inner = shrunk(u.src[0], last_two)
            return u if inner is u.src[0] else UOp(Ops.EXPAND, u.dtype, (inner,), dims[:-2] + shape_of(inner)[-2:])
        bounds = tuple((0, d) for d in dims[:-2]) + tuple(rng if d > 1 else (0, 1)
                                                          for d, rng in zip(dims[-2:], last_two))
        return u if all(b == (0, d) for b, d in zip(bounds, dims)) else UOp(Ops.SHRINK, u.dtype, (u,), bounds)

    a, b = x[-1].src[0], y[-1].src[0]
    a_part, b_part = shrunk(a, (rows, steps)), shrunk(b, (steps, columns))
    lhs = UOp(Ops.RESHAPE, a.dtype, (a_part,), shape_of(a_part) + (1,))
    ys = shape_of(b_part)
    rhs = UOp(Ops.RESHAPE, b.dtype, (b_part,), ys[:-2] + (1,) + ys[-2:])
    lhs, rhs = (u if shape_of(u) == full else UOp(Ops.EXPAND, u.dtype, (u,), full) for u in (lhs, rhs))
    return UOp(Ops.REDUCE_AXIS, r.dtype, (UOp(Ops.MUL, mul.dtype, (lhs, rhs)),), r.arg)


def _column_part(r: UOp, lo: int, hi: int) -> UOp:
    """The matmul `r` over its output columns lo..hi only (`_matmul_part`)."""
    return _matmul_part(r, columns=(lo, hi))


def _splittable(r: UOp) -> bool:
    """Whether `r` is a float matmul of constant sizes large enough to split (SPLIT_MIN_PRODUCTS), whose
    operands each have the axes a part shrinks (the left-hand side's rows unless broadcast, and so on)."""
    if _matmul_rhs(r) is None or r.dtype is None or not r.dtype.is_float:
        return False
    shape = shape_of(r.src[0])
    if not all(isinstance(d, int) for d in shape) or prod(shape) < SPLIT_MIN_PRODUCTS:
        return False
    a, b = _broadcast(r.src[0].src[0])[-1].src[0], _broadcast(r.src[0].src[1])[-1].src[0]
    return len(shape_of(a)) >= 2 and len(shape_of(b)) >= 2 and shape_of(a)[-1] == shape_of(b)[-2] == shape[-2]


def _join(r: UOp, axis: int, main_part: UOp, rest: UOp, main: int, size: int, wide: int) -> UOp:
    """`r` (its output axis `axis` of `size`) from the part over 0..main and the part `rest` over the last
    `wide` (>= size - main), joined by two pads and an add in the consumer (the pads realize both parts)."""
    nd = len(shape_of(r))
    out_shape = shape_of(rest)
    keep = tuple((0, d) for d in out_shape)
    keep = keep[:axis] + ((wide - size + main, wide),) + keep[axis + 1:]
    tail = UOp(Ops.SHRINK, r.dtype, (rest,), keep) if wide != size - main else rest
    before = ((0, 0),) * axis
    after = ((0, 0),) * (nd - axis - 1)
    left = UOp(Ops.PAD, r.dtype, (main_part,), (before + ((0, size - main),) + after, 0.0))
    right = UOp(Ops.PAD, r.dtype, (tail,), (before + ((main, 0),) + after, 0.0))
    return UOp(Ops.ADD, r.dtype, (left, right))


def split_odd_matmul(r: UOp, serves: dict[UOp, UOp], top: UOp | None = None) -> UOp:
    """`r` if it is no large matmul (`_splittable`) or its sizes are multiples of what the register tile and the
    packing take; else the same values as a sum of parts, each a matmul of its own (recorded in `serves`, with
    `top`, the matmul as written), split by one rule over its sizes, in this order:
    - an odd reduction length k (no multiple of SPLIT_REDUCE) of a matmul with few outputs (at most
      SPLIT_REDUCE_MAX_OUTPUTS: reduction-bound, where a GPU shares the steps among a work-group only over a
      divisible length): the steps 0..k - k % SPLIT_REDUCE as a matmul of its own (itself split further by
      the rules below, else made a kernel by a CONTIGUOUS), plus the rest's steps as a second partial sum, a
      reduction the consumer computes while it reads the main part (no buffer, no copy of the operands:
      k % SPLIT_REDUCE multiply-adds per output element). With more outputs the register tile runs over any
      k at full speed and the rest's extra pass over the outputs is pure cost (a third of a 1365x1000x197
      matmul's time on the CPU);
    - odd output columns n (no multiple of SPLIT_COLUMNS, more than that): the columns 0..n - n % 32 and the
      rest computed as the last 16 or 32 columns (a vector's worth, overlapping the main part's last ones),
      joined by pads and an add (`_join`, which `tgc.engine.placement` writes in place).
    Odd rows are never split (the kernel's padding takes them: see above REST_COLUMNS). Each part goes through
    the same rules (the reduction's main part with odd columns is split by its columns)."""
    if not _splittable(r):
        return r
    top = top if top is not None else r
    _, k, n = shape_of(r.src[0])[-3:]
    if k > SPLIT_REDUCE and k % SPLIT_REDUCE and prod(shape_of(r)) <= SPLIT_REDUCE_MAX_OUTPUTS:
        main = k - k % SPLIT_REDUCE
        head = split_odd_matmul(_matmul_part(r, steps=(0, main)), serves, top)
        if head.op is Ops.REDUCE_AXIS:
            head = UOp(Ops.CONTIGUOUS, r.dtype, (head,))
            serves[head] = top
        return UOp(Ops.ADD, r.dtype, (head, _matmul_part(r, steps=(main, k))))
    if n > SPLIT_COLUMNS and n % SPLIT_COLUMNS:
        wide = -(-(n % SPLIT_COLUMNS) // REST_COLUMNS) * REST_COLUMNS  # a multiple of 16 (a vector)
        return _split_in_two(r, serves, top, n, n - n % SPLIT_COLUMNS, wide)
    return r


def _split_in_two(r: UOp, serves: dict[UOp, UOp], top: UOp, size: int, main: int, rest: int) -> UOp:
    """Matmul `r` as its first `main` output columns (of `size`) and its last `rest` ones, each split further
    (`split_odd_matmul`) and joined; a part that is a reduction serves `top`."""
    first = split_odd_matmul(_column_part(r, 0, main), serves, top)
    last = split_odd_matmul(_column_part(r, size - rest, size), serves, top)
    for part in (first, last):
        if part.op is Ops.REDUCE_AXIS:
            serves[part] = top
    return _join(r, len(shape_of(r)) - 1, first, last, main, size, rest)


def split_odd_sizes(outputs: list[UOp], keep: set[UOp]) -> tuple[list[UOp], dict[UOp, UOp], dict[UOp, UOp]]:
    """Every large matmul with odd sizes computed as parts that the register tile and the packing take whole
    (`split_odd_matmul`), on every device: a rule over sizes. Matmuls in `keep` (a fused attention's) are left
    alone. Returns the new outputs, the original node of every rebuilt one, and for each part the matmul it
    computes."""
    serves: dict[UOp, UOp] = {}
    def split(new: UOp) -> UOp:
        return split_odd_matmul(new, serves)

    memo: dict[UOp, UOp] = {}
    # a fused attention's own reductions stay whole, rebuilt on their operands' new nodes (sources first, so the
    # memo holds each before the rebuild reaches it; the scheduler finds the attention again on the new graph);
    # what they read (the projection q, k and v are slices of) is split
    for node in UOp(Ops.SINK, None, tuple(outputs)).toposort():
        if node in keep:
            memo[node] = node.replace(src=tuple(rebuild(s, memo, split) for s in node.src))
    new_outputs = [rebuild(o, memo, split) for o in outputs]
    if not serves:
        return outputs, {}, {}
    original = {new: old for old, new in memo.items() if new is not old}
    return new_outputs, original, {part: original.get(r, r) for part, r in serves.items()}


split_odd_columns = split_odd_sizes  # (its name before rows and the reduction were split too)


CONV_LANES = 16  # conv2d: output channels per vector of the packed weights (one AVX-512 vector of f32) ...
# ... for a convolution of at least this many multiply-adds (2M: a 13x13 image's 3x3 conv of 48 -> 192 channels,
# SqueezeNet's late layers, ran 4.4x faster packed, min 2.53 -> 0.58 ms; a 28x28 one of 32 -> 32 channels 3.8x;
# the copy of their weights takes microseconds. It was 16M: those layers got no tile at all)
CONV_MIN_FLOPS = 1 << 21


def _conv_operands(r: UOp) -> tuple[UOp, UOp] | None:
    """For a conv2d `r` as `Tensor.conv2d` builds it (the sum over Ci, KH, KW of windows of the padded input
    (N, G, 1, Ci, OH, OW, KH, KW) times the weight reshaped to (1, G, Og, Ci, 1, 1, KH, KW), cast to f32 first
    for half floats): (the weight
    node (O, Ci, KH, KW), the node the windows are taken of (the padded input)); None for anything else."""
    if r.op is not Ops.REDUCE_AXIS or r.arg[0] is not Ops.ADD or r.arg[1] != (3, 6, 7):
        return None
    mul = r.src[0].src[0] if r.src[0].op is Ops.CAST else r.src[0]  # half floats: summed in f32
    if mul.op is not Ops.MUL or len(full := shape_of(mul)) != 8:
        return None
    w = x = None
    for u in mul.src:
        v = u.src[0] if u.op is Ops.EXPAND else u
        if v.op is not Ops.RESHAPE:
            return None
        src = v.src[0]
        if v.arg == (1, full[1], full[2], full[3], 1, 1, full[6], full[7]) and \
                shape_of(src) == (full[1] * full[2], full[3], full[6], full[7]):
            w = src
        elif src.op is Ops.PERMUTE and src.src[0].op is Ops.WINDOW and src.src[0].src[0].op is Ops.WINDOW:
            x = src.src[0].src[0].src[0]
    return (w, x) if w is not None and x is not None else None


def _packed_lanes(w: UOp, lanes: int) -> UOp:
    """`w` (O, Ci, KH, KW) read from a copy laid out (O/lanes, Ci, KH, KW, lanes): the `lanes` output channels
    that share an input value are one contiguous vector for every (ci, kh, kw)."""
    o, *rest = shape_of(w)
    split = UOp(Ops.RESHAPE, w.dtype, (w,), (o // lanes, lanes, *rest))
    packed = UOp(Ops.CONTIGUOUS, w.dtype, (UOp(Ops.PERMUTE, w.dtype, (split,), (0, 2, 3, 4, 1)),))
    return UOp(Ops.RESHAPE, w.dtype, (UOp(Ops.PERMUTE, w.dtype, (packed,), (0, 4, 1, 2, 3)),), tuple(shape_of(w)))


def _conv_part(r: UOp, lo: int, hi: int) -> UOp:
    """The conv2d `r` (as `_conv_operands` recognises it, one group) over its output channels lo..hi only: the
    same windows of the input times the weight's channels lo..hi."""
    cast = r.src[0] if r.src[0].op is Ops.CAST else None
    mul = cast.src[0] if cast is not None else r.src[0]
    full = shape_of(mul)
    part_full = full[:2] + (hi - lo,) + full[3:]
    w = _conv_operands(r)[0]
    srcs = []
    for u in mul.src:
        v = u.src[0] if u.op is Ops.EXPAND else u
        if v.src[0] is w:
            shrunk = UOp(Ops.SHRINK, w.dtype, (w,), ((lo, hi),) + tuple((0, d) for d in shape_of(w)[1:]))
            v = UOp(Ops.RESHAPE, w.dtype, (shrunk,), v.arg[:2] + (hi - lo,) + v.arg[3:])
        srcs.append(v if shape_of(v) == part_full else UOp(Ops.EXPAND, v.dtype, (v,), part_full))
    new_mul = UOp(Ops.MUL, mul.dtype, tuple(srcs))
    inner = UOp(Ops.CAST, cast.dtype, (new_mul,)) if cast is not None else new_mul
    return UOp(Ops.REDUCE_AXIS, r.dtype, (inner,), r.arg)


def split_odd_channels(outputs: list[UOp]) -> tuple[list[UOp], dict[UOp, UOp], dict[UOp, UOp]]:
    """A CPU choice (with `caps.pack_matmul`, before `pack_conv_operands`): a large conv2d of one group whose
    output channels o are no multiple of CONV_LANES (and more than that) is computed as the channels
    0..o - o % 16, whose weight is then packed into lanes, and the last 16 channels (overlapping), joined by
    pads and an add in the consumer, as `split_odd_matmul` joins columns. Returns the new outputs, the
    original node of every rebuilt one, and for each part the conv it computes."""
    serves: dict[UOp, UOp] = {}

    def split(new: UOp) -> UOp:
        ops = _conv_operands(new)
        if ops is None or not (new.dtype is not None and new.dtype.is_float):
            return new
        full = shape_of(new.src[0])
        o = full[2]
        if full[1] != 1 or o <= CONV_LANES or o % CONV_LANES == 0 or prod(full) < CONV_MIN_FLOPS:
            return new
        main = o - o % CONV_LANES
        first, rest = _conv_part(new, 0, main), _conv_part(new, o - CONV_LANES, o)
        serves[first] = serves[rest] = new
        return _join(new, 2, first, rest, main, o, CONV_LANES)

    memo: dict[UOp, UOp] = {}
    new_outputs = [rebuild(o, memo, split) for o in outputs]
    if not serves:
        return outputs, {}, {}
    original = {new: old for old, new in memo.items() if new is not old}
    return new_outputs, original, {part: original.get(r, r) for part, r in serves.items()}


def _reading_weight(r: UOp, w: UOp, copy: UOp) -> tuple[UOp, dict[UOp, UOp]]:
    """The conv2d `r` (as `_conv_operands` recognises it, its weight `w`) reading `copy` in place of `w`: only the
    nodes from `r` down to the weight's reshape are rebuilt, never the input's windows or what is below them (an
    earlier layer that reads the same weight, through its own copy, stays the node it was). Returns the new conv
    and, for each node rebuilt below it, the node it replaces."""
    cast = r.src[0] if r.src[0].op is Ops.CAST else None
    mul = cast.src[0] if cast is not None else r.src[0]
    replaced: dict[UOp, UOp] = {}

    def rebuilt(old: UOp, src: tuple[UOp, ...]) -> UOp:
        new = old.replace(src=src)
        replaced[new] = old
        return new

    srcs = []
    for u in mul.src:
        v = u.src[0] if u.op is Ops.EXPAND else u
        if v.src[0] is w:  # the weight's reshape (the input's is a reshape of its windows' permute)
            v_new = substitute(v, {w: copy})  # (w is not walked: nothing below it is rebuilt)
            replaced[v_new] = v
            u = v_new if u is v else rebuilt(u, (v_new,))
        srcs.append(u)
    inner = rebuilt(mul, tuple(srcs))
    if cast is not None:
        inner = rebuilt(cast, (inner,))
    return r.replace(src=(inner,)), replaced


def _reading_padded_copy(r: UOp, x: UOp, inside: dict[UOp, UOp]) -> UOp:
    """The conv `r` reading its padded input `x` (a PAD) from a copy of it (CONTIGUOUS: a kernel of its own that
    writes the zeros once), not through the pad's gates. Read in place, every input value a lane tile broadcasts
    is a gated load whose gate (the window's row and column inside the image) LLVM recomputed per channel and
    window row, with spills: ~100 scalar instructions around 48 FMAs in SqueezeNet's 3x3 inner loop. The copy
    reads and writes the input once; the conv reads each value Og * KH * KW times. Records each rebuilt node's
    original in `inside`."""
    memo: dict[UOp, UOp] = {x: UOp(Ops.CONTIGUOUS, x.dtype, (x,))}
    out = rebuild(r, memo)
    for old, new in memo.items():
        if new is not old:  # (the copy stands for the pad: its kernel writes the pad's values, the conv reads them)
            inside[new] = inside.get(old, old)
    return out


def pack_conv_operands(outputs: list[UOp]) -> tuple[list[UOp], dict[UOp, UOp], dict[UOp, UOp]]:
    """A CPU choice (with `caps.pack_matmul`): a large conv2d whose output channels per group are a multiple of
    CONV_LANES reads its weight from a copy packed into vectors of CONV_LANES output channels (`_packed_lanes`,
    one small kernel per weight), so that the conv kernel takes output channels as vector lanes and broadcasts
    each input value (`tgc.codegen.heuristic.lane_tile`). A padded input is read from a padded copy
    (`_reading_padded_copy`: the pad's gates leave the conv's inner loop; this once measured slower, before the
    lane tile, and is 1.4-2.2x faster on the light models' 3x3 and 7x7 convs now). A grouped convolution is
    packed where its output channels per group are a multiple of CONV_LANES:
    its input channel group (o // Og) then folds to a lane-free value (`symbolic._split_low`).
    One copy per distinct weight: convs that share a weight node (a tied weight, or ONNX's light models' one
    constant-filled weight per shape) all read the one copy, and only the nodes from each conv down to its
    weight are rebuilt (`_reading_weight`): the layers below, and the weight itself, are computed once.
    Returns the new outputs, the original node of every rebuilt one (those inside a conv included), and for
    each copy the first conv it serves."""
    serves: dict[UOp, UOp] = {}
    copies: dict[UOp, UOp] = {}  # weight -> its packed copy
    inside: dict[UOp, UOp] = {}  # a node `_reading_weight` rebuilt -> the one it replaces

    def pack(new: UOp) -> UOp:  # `new` is rebuilt on its sources' new nodes: a conv inside x is packed too
        ops = _conv_operands(new)
        full = shape_of(new.src[0]) if ops is not None else ()  # (a CAST keeps the shape)
        if ops is None or full[2] % CONV_LANES or prod(full) < CONV_MIN_FLOPS:
            return new
        w = ops[0]
        first = w not in copies
        if first:
            copies[w] = _packed_lanes(w, CONV_LANES)
        out, replaced = _reading_weight(new, w, copies[w])
        inside.update(replaced)
        if ops[1].op is Ops.PAD:
            out = _reading_padded_copy(out, ops[1], inside)
        if first:
            serves[copies[w].src[0].src[0]] = out
        return out

    memo: dict[UOp, UOp] = {}
    new_outputs = [rebuild(o, memo, pack) for o in outputs]
    if not serves:
        return outputs, {}, {}
    original = {new: old for old, new in memo.items() if new is not old}
    given = {new: old for old, new in memo.items()}  # (a node inside a conv, as `pack` was given it -> its original)
    for new, old in inside.items():
        if new not in original and new is not old:
            original[new] = given.get(old, old)
    return new_outputs, original, {copy: original.get(conv, conv) for copy, conv in serves.items()}


CROWD_MIN_ELEMENTS = PACK_MIN_ELEMENTS  # a matmul reading computed operands of this many elements or more ...


def _computed_operand_elements(mm: UOp, realized: set[UOp]) -> int:
    """The elements of the computed (realized: not the program's inputs) buffers matmul `mm` reads."""
    total, stack, seen = 0, list(mm.src), set()
    while stack:
        node = stack.pop()
        if node in seen or node.op is Ops.BUFFER:
            continue
        seen.add(node)
        if node in realized:
            total += prod(shape_of(node))
            continue
        stack.extend(node.src)
    return total


def crowded_matmuls(root: UOp, realized: set[UOp]) -> set[UOp]:
    """The matmuls to realize where the kernel of `root` would compute two or more that each read at least
    CROWD_MIN_ELEMENTS of computed operands (a packed copy of a weight, a hidden layer): a sum of products
    (the experts of a mixture, `a @ w1 + b @ w2`) computed in one kernel keeps every operand live at once, so
    its peak memory holds all of them; realized, each matmul is a kernel of its own whose operands die with it
    (the memory plan reuses their slots) and whose register tile covers one reduction. Matmuls over the
    program's inputs only (a GRU's `x @ w_x + h @ w_h`) stay fused: they hold no extra memory."""
    found, stack, seen = [], [root], set()
    while stack:
        node = stack.pop()
        if node in seen or node.op is Ops.BUFFER or (node in realized and node is not root):
            continue
        seen.add(node)
        if _matmul_rhs(node) is not None and _computed_operand_elements(node, realized) >= CROWD_MIN_ELEMENTS:
            found.append(node)
        stack.extend(node.src)
    return {m for m in found if m is not root} if len(found) > 1 else set()


def create_schedule(outputs: list[UOp], caps: Capabilities | None = None, split_columns: bool = True
                    ) -> list[ScheduleItem]:
    """The kernels computing `outputs`, in launch order, for a device that declares `caps` (its row fusion and
    matmul packing; None: neither). The tensor graph itself is device-neutral. Each item's `bufs` are nodes
    of the graph given (a packed copy is a node of its own). `split_columns=False` keeps matmuls with odd
    columns and packed copies whole (`split_odd_columns` and `split_large_copies` depend on the sizes: kernels
    compiled for a size class do not)."""
    check_sizes(outputs)
    fuse_rows, pack_matmul = (caps.fuse_rows, caps.pack_matmul) if caps is not None else (False, False)
    original: dict[UOp, UOp] = {}
    serves: dict[UOp, UOp] = {}
    hidden: frozenset[UOp] = frozenset()
    if pack_matmul and split_columns:  # (a host's memory target: before the odd split, which splits odd parts)
        outputs, original, hidden = split_hidden_chains(outputs)
    if split_columns:  # every device: a rule over sizes (tgc.codegen.opt's tiles want divisors everywhere)
        keep = {u for m in attention.find(outputs).values() for u in (m.p, *m.inline)}
        outputs, original_o, serves = split_odd_sizes(outputs, keep)
        original = {new: original.get(old, old) for new, old in original_o.items()} | original
        hidden = hidden | {new for new, old in original_o.items() if old in hidden}  # (rebuilt on new operands)
    if pack_matmul:
        parts: frozenset[UOp] = frozenset()
        if split_columns:  # (a size class's kernels keep the copy whole: the part count depends on the sizes)
            outputs, original_m, serves_m, parts = split_large_copies(outputs)
            parts |= hidden | {new for new, old in original_m.items() if old in hidden}
            original = {new: original.get(old, old) for new, old in original_m.items()} | original
            serves |= {part: serves.get(mm) or original.get(mm, mm) for part, mm in serves_m.items()}  # (a part's)
        outputs, original_p, serves_p = pack_matmul_operands(outputs, parts)
        original = {new: original.get(old, old) for new, old in original_p.items()} | original
        serves |= {copy: serves.get(mm) or original.get(mm, mm) for copy, mm in serves_p.items()}  # (a part's)
        if split_columns:
            outputs, original_s, serves_s = split_odd_channels(outputs)
            original = {new: original.get(old, old) for new, old in original_s.items()} | original
            serves |= {part: original.get(conv, conv) for part, conv in serves_s.items()}
        outputs, original_c, serves_c = pack_conv_operands(outputs)
        original = {new: original.get(old, old) for new, old in original_c.items()} | original
        serves |= {copy: serves.get(conv) or original.get(conv, conv)  # (a part's: its conv's line)
                   for copy, conv in serves_c.items()}  # through both maps
    items = _schedule(outputs, fuse_rows, split_columns)
    for item in items:
        item.bufs = [original.get(b, b) for b in item.bufs]
        if item.output in serves:
            item.meta["serves"] = original.get(serves[item.output], serves[item.output])
    return items


def _piece_copies(roots: list[UOp], lowered: dict, concats: dict, realized: set[UOp]) -> dict[int, list[ScheduleItem]]:
    """The kernels writing the pieces of each concatenation that are not placed (`tgc.engine.placement`), keyed by
    the position in `roots` after which each runs: right after the last other kernel reading what it copies
    where that is before the concatenation's own position (its sources then die at the copy instead of living
    beside the concatenated buffer), else at that position (the concatenated buffer lives the shortest)."""
    pos = {r: i for i, r in enumerate(roots)}
    last_read: dict[UOp, int] = {}
    for r, (low, _ast) in lowered.items():
        if r not in concats:
            for b in low.bufs[1:]:
                last_read[b] = max(last_read.get(b, -1), pos[r])
    out: dict[int, list[ScheduleItem]] = {}
    for c in concats.values():
        for off, n, src in c.pieces:
            if src in c.placed:
                continue
            value = c.piece_value(off, n, src)
            low = _Lowerer(value, realized)
            ast = low.build_into(c.root, c.root_axis, off, top=value is not src)
            item = ScheduleItem(ast, low.bufs, name=kernel_name(ast))
            item.meta["graph_flops"] = executed_flops(ast)
            deps = [b for b in low.bufs[1:] if b in pos]
            at = max((max(pos[d], last_read.get(d, -1)) for d in deps), default=pos[c.root])
            out.setdefault(at if at < pos[c.root] else pos[c.root], []).append(item)
    return out


def _schedule(outputs: list[UOp], fuse_rows: bool, sized: bool = True) -> list[ScheduleItem]:
    fused = attention.find(outputs)
    forced: set[UOp] = set()
    while True:  # a reduction a kernel would compute at two indices gets a buffer; then the kernels again
        roots = find_realized(outputs, fuse_rows, fused, forced, sized)
        realized = set(roots)
        lowered: dict[UOp, tuple[_Lowerer, UOp]] = {}
        recomputed: set[UOp] = set()
        for root in roots:
            if root in lowered or prod(shape_of(root)) == 0:
                continue
            low = _Lowerer(root, realized)
            lowered[root] = (low, low.build())
            if attention.output_of(root, fused) is None:  # (a fused attention computes its chain once per score)
                recomputed |= low.recomputed_reductions()
                recomputed |= crowded_matmuls(root, realized)
        if not recomputed:
            break
        forced |= recomputed
    keep = {u for p, m in fused.items() for u in (p, *m.inline, *m.operands)} | \
        {r for r in roots if attention.output_of(r, fused) is not None}
    concats = find_concats([r for r in roots if r in lowered], outputs, keep)
    placed_in = {c.placed[src]: (src, n, c, off) for c in concats.values() for off, n, src in c.pieces
                 if src in c.placed}
    copies_after = _piece_copies(roots, lowered, concats, realized)
    pos = {r: i for i, r in enumerate(roots)}
    waiting: dict[int, list[ScheduleItem]] = {}  # placed pieces' kernels launched after the root at that position
    items: list[ScheduleItem] = []
    done: dict[UOp, ScheduleItem] = {}
    for i, root in enumerate(roots):
        if root in done:
            items.extend(waiting.pop(i, []))
            continue
        if root in placed_in:  # computed straight into its slice of the concatenation: no buffer of its own
            src, n, c, off = placed_in[root]
            low = _Lowerer(c.piece_value(off, n, src), realized - {root})
            ast = low.build_into(c.root, c.root_axis, off, top=True)
            item = done[root] = ScheduleItem(ast, low.bufs, name=kernel_name(ast))
            item.meta["graph_flops"] = executed_flops(ast)
            # the epilogue above the join reads other kernels' buffers (`x @ w2 + a`: `a`), which may come later in
            # `roots` than this piece's own root: launched after the last of them (each before `c.root`, which reads
            # them too), behind the copies run there (a concatenation read is whole once its position and the
            # copies after it are passed: its placed pieces wait only for roots before it)
            at = max([i] + [pos[b] for b in low.bufs[1:] if b in pos])
            if at == i:
                items.append(item)
            else:
                waiting.setdefault(at, []).append(item)
        elif root in concats:  # its pieces' kernels write it (`copies_after`)
            done[root] = ScheduleItem(UOp(Ops.SINK, None, ()), [root], name="empty")
        if root in done:
            items.extend(copies_after.get(i, []) + waiting.pop(i, []))
            continue
        if root not in lowered:
            item = ScheduleItem(UOp(Ops.SINK, None, ()), [root], name="empty")
        else:
            low, ast = lowered[root]
            item = ScheduleItem(ast, low.bufs, name=kernel_name(ast))
            p = attention.output_of(root, fused)
            if p is not None:  # one online-softmax kernel: its AST the REDUCE(ONLINE_SOFTMAX) (tgc.engine.attention)
                sp = attention.spec(low, root, fused[p])  # (the buffers numbered as the plain lowering's)
                item.ast = attention.kernel_ast(sp)
                # the plain lowering (the row max and sum as nested reductions): what a kernel for symbolic sizes
                # compiles (`Program` symbolic plans: the fused lowering needs constant sizes)
                item.meta["unfused_ast"] = ast
                item.bufs = low.bufs
                item.name = "attn_" + item.name  # (the plain lowering's name)
                item.meta["graph_flops"] = attention_flops(sp, fused[p])
            else:
                item.meta["graph_flops"] = executed_flops(ast)
        done[root] = item
        items.append(item)
        items.extend(copies_after.get(i, []) + waiting.pop(i, []))
    assert not waiting, "a placed piece's kernel was never launched"  # (each waits for a position the walk passes)
    return items
