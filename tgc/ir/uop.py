"""The one IR: `UOp(op, dtype, src, arg)`, immutable and hash-consed, plus a small pattern matcher.

Tensor-level graphs (what the front end builds), kernel ASTs (what the scheduler cuts) and the linear
lists that renderers print are all UOps; only the set of ops used differs by stage.
"""

from __future__ import annotations

import threading
import weakref
from _weakref import _remove_dead_weakref
from collections.abc import Callable, Container, Iterable, Sequence
from enum import Enum, auto
from math import copysign
from typing import Any

from tgc.dtype import DType, dtypes, min_max, truncate
from tgc.ir.symsize import SymFloat, SymSize, _refuse


class Ops(Enum):
    # --- tensor level: sources
    BUFFER = auto()  # a program input; arg = (index, name, shape)
    CONST = auto()  # a scalar constant; arg = value
    IOTA = auto()  # 0, 1, ..., n-1 (i32); arg = n
    # --- movement (tensor level only; they become index math, never copies)
    RESHAPE = auto()  # arg = new shape
    PERMUTE = auto()  # arg = order
    EXPAND = auto()  # arg = new shape (size-1 dims grow)
    PAD = auto()  # arg = (((before, after), ...), fill value)
    SHRINK = auto()  # arg = ((start, end), ...)
    FLIP = auto()  # arg = tuple of bools, one per dim
    STRIDE = auto()  # arg = positive step per dim
    WINDOW = auto()  # arg = (axis, kernel, stride, dilation): dim H -> (OH, K), h = oh*stride + k*dilation
    REDUCE_AXIS = auto()  # arg = (reduce op, axes); keeps the reduced dims as size 1
    CONTIGUOUS = auto()  # a copy with its own buffer: the scheduler always realizes it (e.g. a packed layout)
    # src = (values, indices), arg = axis: out[..., i, ...] = values[..., clamp(indices[..., i, ...]), ...]; the
    # indices (any int dtype) have the output's shape, the values the same ndim and the output's sizes off the
    # axis. An index is wrapped once if negative (i + n), then clamped into [0, n): never out of bounds.
    GATHER = auto()
    # --- unary ALU
    NEG = auto()
    NOT = auto()  # logical not for bool, bitwise not for ints
    EXP2 = auto()
    LOG2 = auto()
    SIN = auto()
    SQRT = auto()
    RECIP = auto()
    TRUNC = auto()
    CAST = auto()
    BITCAST = auto()
    # --- binary ALU
    ADD = auto()
    SUB = auto()
    MUL = auto()
    FDIV = auto()  # float division
    IDIV = auto()  # C integer division (truncating); the front end guards zero and overflow
    MOD = auto()  # C remainder
    MAX = auto()
    CMPLT = auto()
    CMPNE = auto()
    CMPEQ = auto()
    AND = auto()
    OR = auto()
    XOR = auto()
    SHL = auto()
    SHR = auto()
    # --- ternary
    WHERE = auto()
    # --- kernel level
    SINK = auto()
    DEFINE_GLOBAL = auto()  # arg = buffer index; dtype is a pointer
    DEFINE_VAR = auto()  # an integer kernel argument; arg = name
    SPECIAL = auto()  # a GPU index: arg = (name like "gidx0"/"lidx0", size)
    RANGE = auto()  # a loop variable; src = (end,), arg = (id, kind)
    LOAD = auto()  # src = (buffer, index) or (buffer, index, gate)
    STORE = auto()  # src = (buffer, index, value) or with a gate
    REDUCE = auto()  # src = (value, *ranges), arg = reduce op
    VECTORIZE = auto()
    GEP = auto()
    TEE = auto()  # src = (buffer, index, value): stores value at buffer[index] where it is computed, and is value
    REREAD = auto()  # src = (LOAD of what a TEE stored, the same value recomputed): `tgc.codegen.rowreuse`
    # --- linear (after linearization)
    ENDRANGE = auto()
    DEFINE_ACC = auto()  # a mutable accumulator; src = (initial value,)
    ACCUMULATE = auto()  # acc = op(acc, value); src = (acc, value), arg = op
    READ_ACC = auto()  # the accumulator's value
    DEFINE_LOCAL = auto()  # GPU shared memory: arg = (name, size)
    BARRIER = auto()
    # a lane's value exchanged across a warp: the value of lane `lane ^ arg` (CUDA's __shfl_xor_sync); every
    # thread of the work-group runs it (tgc.codegen.opt.lower_groups); src = (value,)
    SHUFFLE = auto()
    # a warp's 16x8 tile of A (16x16) @ B (16x8) in f32 (PTX mma.sync m16n8k16, f32 accumulate): src = the lane's
    # 8 values of A then 4 of B (f32 holding f16/bf16 values, by the PTX ISA's fragment layout), arg = "f16" or
    # "bf16"; the value is the lane's 4 floats of the result (f32 x 4, GEP 0..3). tgc.codegen.opt.tensor_core
    MMA = auto()
    # a reduce op (a REDUCE's arg, never a node's op): the online softmax, `sum_j exp(s_j - max s) v_j / sum_j
    # exp(s_j - max s)`. The REDUCE's value is VECTORIZE(s_0 .. s_{n-1}, v_0 .. v_{n-1}) (f32): n (score, value)
    # pairs per iteration, a block (`unroll_reduce` makes one of its UNROLL); its accumulator is the triple
    # (running max m, sum l, weighted sum o), rescaled by exp(m - m') when m grows (`tgc.codegen.linearize`).
    # REDUCEs of the same scores over the same ranges share m and l. A score of -inf weighs 0.
    ONLINE_SOFTMAX = auto()

    # hashed by identity (C level, no Python call): an `Ops` member is a key of every UOp's hash-consing lookup, and
    # Enum's own `__hash__` (a Python function hashing the member's name) was ~3% of a cold compile. Members are
    # singletons compared by identity, so the two agree; no order or output depends on these hash values (a
    # name's hash already differed per process)
    __hash__ = object.__hash__


UNARY = {Ops.NEG, Ops.NOT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.TRUNC}
BINARY = {Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ,
          Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR}
ALU = UNARY | BINARY | {Ops.WHERE}
COMPARE = {Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ}
COMMUTATIVE = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR}


class RangeKind(Enum):
    LOOP = auto()  # an output loop
    REDUCE = auto()  # a reduction loop
    UPCAST = auto()  # an output loop unrolled into registers
    UNROLL = auto()  # a reduction loop unrolled
    LOCAL = auto()  # a GPU work-group index
    GROUP = auto()  # a reduction split across a work-group (shared-memory reduce)
    TILE = auto()  # a reduction's inner loop over a tile its operands are staged for in shared memory (GPUs)

    __hash__ = object.__hash__  # as `Ops`: by identity, in C (a RANGE's arg holds its kind)


class _KeyedRef(weakref.ref):
    """A weak reference to an interned UOp that knows its key (set right after it is made: no Python `__init__`)."""

    __slots__ = ("key",)


# the hash-consing table: (op, dtype, src, arg) -> a weak reference to the one node with them. What
# `weakref.WeakValueDictionary` does, inlined into `UOp.__new__` (its `get` and `__setitem__` are Python calls,
# ~5% of a cold compile): a node's entry goes when the node does (`_forget`, the stdlib's own removal, which
# keeps an entry whose key was taken meanwhile by a new node)
_INTERNED: dict[tuple, _KeyedRef] = {}


def _forget(ref: _KeyedRef, _remove: Callable = _remove_dead_weakref, _table: dict = _INTERNED) -> None:
    # (the table and the remover bound as defaults, as `WeakValueDictionary` does: nodes dying while the
    # interpreter shuts down, after this module's globals are gone, still find them)
    _remove(_table, ref.key)


# the functions Python calls as weakref callbacks: an exception raised inside one is printed and lost, so the CLI's
# Ctrl-C handler (`tgc.cli.main._on_sigint`) does not raise KeyboardInterrupt there
WEAKREF_CALLBACKS = (_forget,)


class UOp:
    """An immutable, hash-consed node. Build with `UOp(op, dtype, src, arg)`; equal nodes are the same object."""

    # `_bounds` and `_shape` cache values derived from the node alone (its op, dtype, arg and sources), set on first
    # use; a node has no other state, and nothing else may be attached to a node shared by every graph using it
    # hashed and compared by identity (object's own C-level `__hash__`/`__eq__`: no Python call in a dict or set
    # lookup, the compiler's most frequent operation): hash-consing makes equal nodes one object
    __slots__ = ("op", "dtype", "src", "arg", "_bounds", "_shape", "__weakref__")

    def __new__(cls, op: Ops, dtype: DType | None = None, src: tuple[UOp, ...] = (), arg: Any = None):
        key = (op, dtype, src, arg)
        if type(arg) is float and arg == 0.0 and copysign(1.0, arg) < 0:  # -0.0 == 0.0 (same hash): its own node
            key = (op, dtype, src, arg, "-0")
        try:
            ref = _INTERNED.get(key)
        except TypeError:  # unhashable arg
            raise TypeError(f"UOp arg must be hashable, got {arg!r}") from None
        if ref is not None:
            hit = ref()
            if hit is not None:
                return hit
        self = object.__new__(cls)
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "src", src)
        object.__setattr__(self, "arg", arg)
        ref = _KeyedRef(self, _forget)
        ref.key = key
        _INTERNED[key] = ref
        return self

    def __setattr__(self, name, value):
        if name in ("op", "dtype", "src", "arg"):
            raise AttributeError("UOp is immutable")
        object.__setattr__(self, name, value)

    def __reduce__(self):
        return UOp, (self.op, self.dtype, self.src, self.arg)

    def __repr__(self) -> str:
        return pretty(self)

    def replace(self, **kw) -> UOp:
        return UOp(kw.get("op", self.op), kw.get("dtype", self.dtype), kw.get("src", self.src), kw.get("arg", self.arg))

    # --- building helpers (used by later passes; the front end has its own typed layer)
    @staticmethod
    def const(dtype: DType, value: Any) -> UOp:
        return UOp(Ops.CONST, dtype, (), _normalize_const(dtype, value))

    def alu(self, op: Ops, *others: UOp) -> UOp:
        out_dtype = dtypes.bool if op in COMPARE else (others[-1].dtype if op is Ops.WHERE else self.dtype)
        return UOp(op, out_dtype, (self, *others))

    def __add__(self, x): return self.alu(Ops.ADD, self._c(x))
    def __radd__(self, x): return self._c(x).alu(Ops.ADD, self)
    def __sub__(self, x): return self.alu(Ops.SUB, self._c(x))
    def __mul__(self, x): return self.alu(Ops.MUL, self._c(x))
    def __rmul__(self, x): return self._c(x).alu(Ops.MUL, self)
    def __floordiv__(self, x): return self.alu(Ops.IDIV, self._c(x))
    def __mod__(self, x): return self.alu(Ops.MOD, self._c(x))
    def __lt__(self, x): return self.alu(Ops.CMPLT, self._c(x))
    def ne(self, x): return self.alu(Ops.CMPNE, self._c(x))
    def eq(self, x): return self.alu(Ops.CMPEQ, self._c(x))
    def logical_and(self, x): return self.alu(Ops.AND, self._c(x))
    def where(self, a, b): return self.alu(Ops.WHERE, self._c(a), self._c(b))

    def _c(self, x) -> UOp:
        return x if isinstance(x, UOp) else UOp.const(self.dtype, x)

    # --- analysis
    def toposort(self) -> list[UOp]:
        """Every node reachable from this one, sources before users (a new list: the caller may change it)."""
        order = _TOPO_RECENT.get(self)
        if order is None:
            order = tuple(postorder(self, _NOTHING))
            with _TOPO_LOCK:
                _TOPO_RECENT[self] = order
                while len(_TOPO_RECENT) > _TOPO_KEEP:
                    del _TOPO_RECENT[next(iter(_TOPO_RECENT))]
        return list(order)

    @property
    def vmin(self) -> int | float:
        return self.bounds[0]

    @property
    def vmax(self) -> int | float:
        return self.bounds[1]

    @property
    def bounds(self) -> tuple[Any, Any]:
        """Conservative (min, max) of an integer index expression; used by symbolic simplification."""
        try:
            return self._bounds
        except AttributeError:
            self._bounds = b = _bounds(self)
            return b


def _normalize_const(dtype: DType, value: Any) -> Any:
    if dtype is None:
        return value
    if isinstance(value, (SymSize, SymFloat)):  # a size of the dims (tgc.ir.symsize): kept as such
        if dtype.is_bool:
            return True
        if isinstance(value, SymSize):
            return value if dtype.is_int else value.as_float()
        return value if not dtype.is_int else _refuse(value, "int()", None)
    if dtype.is_bool:
        return bool(value)
    if dtype.is_int:
        return truncate(value, dtype)
    v = float(value)
    return v


INF = float("inf")


def _bounds(u: UOp) -> tuple[Any, Any]:
    if u.op is Ops.CONST:
        return (u.arg, u.arg) if not isinstance(u.arg, bool) else (int(u.arg), int(u.arg))
    if u.op is Ops.RANGE:
        return 0, u.src[0].vmax - 1
    if u.op is Ops.SPECIAL:
        return 0, u.arg[1] - 1
    if u.op is Ops.DEFINE_VAR and isinstance(u.arg, tuple):
        return u.arg[1], u.arg[2]
    if u.dtype is not None and u.dtype.is_bool:
        return 0, 1
    if u.op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX) and u.dtype is not None and u.dtype.is_int:
        (a0, a1), (b0, b1) = u.src[0].bounds, u.src[1].bounds
        if u.op is Ops.ADD:
            return a0 + b0, a1 + b1
        if u.op is Ops.SUB:
            return a0 - b1, a1 - b0
        if u.op is Ops.MUL:
            prods = [a0 * b0, a0 * b1, a1 * b0, a1 * b1]
            return min(prods), max(prods)
        if u.op is Ops.MAX:
            return max(a0, b0), max(a1, b1)
        if u.op is Ops.IDIV and b0 == b1 and b0 > 0 and a0 >= 0:
            return a0 // b0, a1 // b0
        if u.op is Ops.IDIV and b0 == b1 and b0 > 0 and a0 > -INF and a1 < INF:  # monotone (floor or truncate)
            return a0 // b0, -(-a1 // b0)
        if u.op is Ops.MOD and b0 == b1 and b0 > 0:
            if a0 >= 0:
                return (a0, a1) if a1 < b0 else (0, b0 - 1)
            return -(b0 - 1), b0 - 1
        # a divisor that is a kernel variable (a symbolic size): both sides non-negative, the divisor positive
        if u.op is Ops.IDIV and b0 > 0 and a0 >= 0:
            return a0 // b1, a1 // b0
        if u.op is Ops.MOD and b0 > 0 and a0 >= 0:
            return 0, min(a1, b1 - 1)
        # an index of any other sign (a GPU grid index divided by a size `C - 100`, whose variable's range reaches
        # 0 and below while a launch only divides by a size it has threads for): |a // b| <= |a| for every b != 0,
        # floor or truncate, and |a % b| < |b| (floor's sign of b, truncate's of a); an index never divides by 0
        # (data may: its division keeps its dtype's range)
        if u.dtype.scalar() == dtypes.index:
            m = max(-a0, a1)
            if u.op is Ops.IDIV and m < INF:
                return -m if a0 < 0 or b0 < 0 else 0, m if a1 > 0 or b0 < 0 else 0
            if u.op is Ops.MOD and max(-b0, b1) < INF:
                k = max(max(-b0, b1) - 1, 0)
                return -k if a0 < 0 or b0 < 0 else 0, k if a1 > 0 or b1 > 0 else 0
    if u.op is Ops.WHERE:
        (a0, a1), (b0, b1) = u.src[1].bounds, u.src[2].bounds
        c = u.src[0]
        if c.op is Ops.CMPLT and c.src == u.src[1:]:  # (a < b).where(a, b) is min(a, b)
            return min(a0, b0), min(a1, b1)
        return min(a0, b0), max(a1, b1)
    if u.op is Ops.CAST and u.src[0].dtype is not None and u.src[0].dtype.is_int and u.dtype.is_int:
        return u.src[0].bounds
    return min_max(u.dtype) if u.dtype is not None else (-INF, INF)


def format_uops(uops: Sequence[UOp]) -> str:
    """The one UOp listing: one line per node, `   4 ADD            f32 (%2, %3)`, sources named by position
    (`?` for a source outside the list). `--emit uops`, `DEBUG` and `repr(UOp)` all print this."""
    lines, names = [], {}
    for i, u in enumerate(uops):
        names[u] = f"%{i}"
        srcs = ", ".join(names.get(s, "?") for s in u.src)
        arg = "" if u.arg is None else f" {u.arg!r}"
        lines.append(f"{i:4d} {u.op.name:<14} {str(u.dtype):<6}{arg} ({srcs})")
    return "\n".join(lines)


def pretty(u: UOp) -> str:
    """A graph listed in topological order (`format_uops`), for debugging and cache keys."""
    return format_uops(u.toposort())


# ------------------------------------------------------------------------------------------------------------------
# Pattern matching


class UPat:
    """A pattern over UOps. `UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c")))` matches x + const and binds x, c.

    `op` may be one op or a set; `src` a tuple matched in order (both orders are tried for commutative ops);
    `arg` must be equal when given; `name` binds the matched node; `dtype` restricts the dtype (a set or a
    predicate string "int"/"float"/"bool").
    """

    __slots__ = ("ops", "src", "arg", "name", "dtype")

    def __init__(self, op: Ops | Iterable[Ops] | None = None, src: tuple[UPat, ...] | None = None,
                 arg: Any = None, name: str | None = None, dtype: Any = None):
        self.ops = None if op is None else (frozenset([op]) if isinstance(op, Ops) else frozenset(op))
        self.src, self.arg, self.name, self.dtype = src, arg, name, dtype

    @staticmethod
    def var(name: str, dtype: Any = None) -> UPat:
        return UPat(name=name, dtype=dtype)

    @staticmethod
    def cvar(name: str, dtype: Any = None) -> UPat:
        return UPat(Ops.CONST, name=name, dtype=dtype)

    def match(self, u: UOp, bound: dict[str, UOp]) -> bool:
        """Whether `u` matches, binding the names into `bound`. On a failure `bound` may hold some bindings of the
        failed attempt: a caller drops it (`PatternMatcher.rewrite` starts each pattern with a new dict; the two
        orders of a commutative node are each tried on a copy)."""
        if self.ops is not None and u.op not in self.ops:
            return False
        if self.arg is not None and u.arg != self.arg:
            return False
        if self.dtype is not None and not _dtype_ok(self.dtype, u.dtype):
            return False
        if self.name is not None:
            prev = bound.get(self.name)
            if prev is not None and prev is not u:
                return False
        if self.src is not None:
            if len(self.src) != len(u.src):
                return False
            if u.op in COMMUTATIVE and len(u.src) == 2:  # both orders, each on a copy of the bindings
                for srcs in (u.src, (u.src[1], u.src[0])):
                    trial = dict(bound)
                    if all(p.match(s, trial) for p, s in zip(self.src, srcs)):
                        bound.update(trial)
                        break
                else:
                    return False
            else:
                for p, s in zip(self.src, u.src):  # (a loop, not all(...): no generator per node tried)
                    if not p.match(s, bound):
                        return False
        if self.name is not None:
            bound[self.name] = u
        return True


def _dtype_ok(want: Any, d: DType | None) -> bool:
    if d is None:
        return False
    if want == "int":
        return d.is_int
    if want == "float":
        return d.is_float
    if want == "bool":
        return d.is_bool
    return d in want if isinstance(want, (set, frozenset, tuple)) else d == want


class PatternMatcher:
    """An ordered list of (pattern, rewrite function). The function gets the bound names as keyword
    arguments and returns a replacement UOp, or None to decline."""

    def __init__(self, rules: list[tuple[UPat, Callable[..., UOp | None]]]):
        self.rules = rules
        self.by_op: dict[Ops | None, list[tuple[UPat, Callable]]] = {}
        for pat, fn in rules:
            for op in (pat.ops or [None]):
                self.by_op.setdefault(op, []).append((pat, fn))
        # the rules tried on a node of each op, in order: those of its op, then those of any op (built once), each
        # with the ops its pattern's sources must have (`_source_ops`)
        anyop = self.by_op.get(None, [])
        self._tried: dict[Ops, list[tuple[UPat, Callable, tuple | None]]] = {
            op: [(pat, fn, _source_ops(pat)) for pat, fn in self.by_op.get(op, []) + anyop] for op in Ops}

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules)

    def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
        src = u.src
        for pat, fn, want in self._tried[u.op]:
            if want is not None:  # a pattern whose sources cannot match (their count, their ops) is not tried:
                # `UPat.match` would refuse it; most nodes a rule set sees match none of its sourced patterns
                if len(src) != len(want):
                    continue
                if len(want) == 2 and u.op in COMMUTATIVE:  # (either order, as `match` tries)
                    a, b = want
                    x, y = src[0].op, src[1].op
                    if not (((a is None or x in a) and (b is None or y in b))
                            or ((a is None or y in a) and (b is None or x in b))):
                        continue
                elif any(w is not None and s.op not in w for w, s in zip(want, src)):
                    continue
            bound: dict[str, UOp] = {}
            if pat.match(u, bound):
                out = fn(ctx, **bound) if ctx is not None else fn(**bound)
                if out is not None and out is not u:
                    return out
        return None


def _source_ops(pat: UPat) -> tuple[frozenset[Ops] | None, ...] | None:
    """What `pat` needs of a node's sources before `match` is worth calling: one entry per source, the ops that
    source must have (None: any), or None where the pattern says nothing of the sources."""
    return None if pat.src is None else tuple(p.ops for p in pat.src)


_NOTHING: frozenset = frozenset()

# the orders of the last few roots `toposort` walked: the passes ask for the same kernel AST's order again and
# again (the optimizer's `ranges`, the heuristic, flop and byte counts); a few strong references, not one per node
# (orders of every node of a chain would take memory quadratic in its length)
_TOPO_KEEP = 8
_TOPO_RECENT: dict[UOp, tuple[UOp, ...]] = {}
_TOPO_LOCK = threading.Lock()


def postorder(root: UOp, skip: Container[UOp]) -> list[UOp]:
    """The nodes reachable from `root`, sources before users, not entering a node in `skip` (`toposort`: none;
    `rebuild`: those its memo already has)."""
    order: list[UOp] = []
    seen: set[UOp] = set()
    stack: list[tuple[UOp, bool]] = [(root, False)]
    pop, push, emit, mark = stack.pop, stack.append, order.append, seen.add  # (bound once: the hottest loop)
    while stack:
        node, expanded = pop()
        if expanded:
            emit(node)
            continue
        if node in seen:
            continue
        mark(node)
        push((node, True))
        for s in reversed(node.src):
            if s not in seen and s not in skip:
                push((s, False))
    return order


MAX_REWRITE_DEPTH = 150


def rebuild(root: UOp, memo: dict[UOp, UOp], fn: Callable[[UOp], UOp] | None = None) -> UOp:
    """The one bottom-up rebuild: every node below `root` not yet in `memo`, sources first, is rebuilt on its
    sources' new nodes and `fn` (if given) picks what it becomes; `memo` maps each old node to its new one and
    may be seeded with replacements. `graph_rewrite`, `substitute` and the scheduler's graph edits all use it."""
    if root in memo:
        return memo[root]
    for node in postorder(root, memo):  # memo's subtrees are not walked
        if node in memo:
            continue
        new = UOp(node.op, node.dtype, tuple(memo[s] for s in node.src), node.arg) if node.src else node
        memo[node] = new if fn is None else fn(new)
    return memo[root]


def graph_rewrite(root: UOp, pm: PatternMatcher, ctx: Any = None, memo: dict[UOp, UOp] | None = None) -> UOp:
    """Rewrite bottom-up until no rule applies anywhere (a fixed point). `memo` (node -> its fixed point) may be
    shared by calls with the same `pm` and `ctx`: subtrees rewritten by an earlier call are not walked again."""
    memo = {} if memo is None else memo
    return rebuild(root, memo, rewrite_step(pm, ctx, memo))


def rewrite_step(pm: PatternMatcher, ctx: Any, memo: dict[UOp, UOp]) -> Callable[[UOp], UOp]:
    """`graph_rewrite`'s step: a node whose sources are at their fixed points -> its own fixed point (recorded in
    `memo`, as `graph_rewrite` with that memo records it). For a caller that builds such nodes itself
    (`expand._copies`: a graph's copies with constants in, built on the fixed points of their sources, without
    first building each copy as it is and walking it again)."""
    depth = [0]  # rewrites of rewrites' results in progress: rules that never settle must not overflow the stack

    def settle(u: UOp) -> UOp:
        # u's sources are already rewritten; apply rules to u until none fires
        if depth[0] > MAX_REWRITE_DEPTH:
            raise RuntimeError(f"graph_rewrite did not converge on {u.op}")
        depth[0] += 1
        try:
            for _ in range(1000):
                out = pm.rewrite(u, ctx)
                if out is None:
                    return u
                u = rebuild(out, memo, step)
        finally:
            depth[0] -= 1
        raise RuntimeError(f"graph_rewrite did not converge on {u.op}")

    def step(new: UOp) -> UOp:
        result = memo[new] if new in memo else settle(new)
        memo.setdefault(result, result)
        return result

    return step


def substitute(root: UOp, mapping: dict[UOp, UOp]) -> UOp:
    """Replace nodes by others everywhere below `root` (once: no rule runs on the result)."""
    return rebuild(root, dict(mapping))
