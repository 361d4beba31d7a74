"""A bounds verifier for linear kernels: no LOAD or STORE may touch memory outside its buffer.

Contract
--------
`verify_bounds(name, uops, buffer_sizes, global_size, local_size, vals)` takes a kernel's linear UOps (what
`tgc.codegen.linearize.linearize` returns, for any device: CPU vectors, GPU SPECIALs and shared memory
included), the number of elements of each buffer (`buffer_sizes[i]` for `DEFINE_GLOBAL i`; shared memory
sizes come from the DEFINE_LOCALs) and the launch it gets. It considers every iteration the launch runs:
every value of every loop (including loops whose trip count depends on the thread), every `core_id`, every
GPU group and thread index. An access is *live* at an iteration when its gate (a LOAD's third source, a
STORE's fourth) and every enclosing loop bound hold there; a live access of width `w` (a vector
load or store) at index `i` must satisfy `0 <= i` and `i + w <= n`. The first live violation raises
`BoundsError` (a `CompileError`: exit 1) naming the kernel, the op, the buffer, the index, the bound and
the loop indices where it happens. Dead accesses (gate false) may hold any index: that is what gates are for.

How: the index and gate of each access are evaluated with numpy over the whole iteration space at once
(one array axis per loop, GPU index and core, broadcast, so an index that depends on two loops costs the
product of those two trip counts only), with the PYTHON device's ALU semantics (`tgc.backends.python`: i32
wraps, C division), not a third copy of them. No value may exceed `max_points` elements (default `1 << 22`,
`TGC_VERIFY_BOUNDS_POINTS`) and a pass may compute `8 * max_points` in all; an access over those limits is
first checked with the symbolic bounds (`UOp.vmin`/`vmax`) of its index, and where they do not prove it, the
kernel is enumerated again in chunks of its longest loop (or GPU/core index), each chunk within the limits,
up to `16 * max_points` iterations. What is left (bigger kernels whose bounds prove nothing, indices that
depend on loaded data) is counted in `STATS["unverified"]`, never silently called verified; an ungated
index whose symbolic bounds lie wholly outside its buffer is an error at any size.

`TGC_VERIFY_BOUNDS=1` makes every kernel built for any device (`tgc.codegen.pipeline.lower`: the heuristic's
kernels and the candidates of BEAM search) go through `verify_bounds`, after the structural spec check of
`tgc.codegen.spec`, before it is rendered; tests/conftest.py sets it, so the whole test suite runs under it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tgc.dtype import DType
from tgc.env import env_int, env_str
from tgc.errors import CompileError
from tgc.ir import alu  # the one ALU table (the PYTHON device's semantics)
from tgc.ir.shapes import prod, shape_of
from tgc.ir.uop import ALU, BINARY, COMPARE, UNARY, Ops, UOp

DEFAULT_MAX_POINTS = 1 << 22
KERNEL_BUDGET = 8  # a pass over a kernel may compute at most this many times max_points elements in all
CHUNKED_POINTS = 16  # kernels of up to this many times max_points iterations are enumerated in chunks
# what the verifier has done in this process (counted per access; tests read it)
STATS = {"kernels": 0, "accesses": 0, "enumerated": 0, "by_bounds": 0, "unverified": 0}


class BoundsError(CompileError):
    """A kernel would read or write outside a buffer: a code generation bug, found before it runs."""


def enabled() -> bool:
    """Whether `TGC_VERIFY_BOUNDS` (unset, 0 or 1) asks for every kernel to be verified (read through
    `tgc.env`: another value is a user error)."""
    return env_str("TGC_VERIFY_BOUNDS", "0").strip() == "1"


def max_points() -> int:
    return env_int("TGC_VERIFY_BOUNDS_POINTS", DEFAULT_MAX_POINTS)


class _Unknown:
    """A value the verifier does not enumerate: `why` is 'data' (it depends on memory) or 'size' (too big)."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why


DATA, TOO_BIG = _Unknown("data"), _Unknown("size")
Value = Any  # np.ndarray | list[np.ndarray] (vector lanes) | _Unknown


@dataclass
class _Axis:
    name: str  # how a report names it: "r0" for a loop, "gidx0", "core_id"
    size: int
    offset: int = 0  # the first value (a chunked pass enumerates part of a loop)


def _sources(uops: list[UOp]) -> list[list[int | None]]:
    """The position of each uop's sources: the latest copy before it (a hash-consed value computed in two
    loops appears twice), as renderers resolve them; None for a source that is not in the list."""
    pos: dict[UOp, int] = {}
    out = []
    for i, u in enumerate(uops):
        out.append([pos.get(s) for s in u.src])
        pos[u] = i
    return out


def _needed(uops: list[UOp], srcs: list[list[int | None]]) -> set[int]:
    """Positions of the uops that indices, gates and loop ends depend on."""
    stack: list[int | None] = []
    for i, u in enumerate(uops):
        if u.op in (Ops.LOAD, Ops.STORE):
            stack.append(srcs[i][1])
            if _gate(u) is not None:
                stack.append(srcs[i][2 if u.op is Ops.LOAD else 3])
        elif u.op is Ops.RANGE:
            stack.append(srcs[i][0])
    need: set[int] = set()
    while stack:
        j = stack.pop()
        if j is None or j in need:
            continue
        need.add(j)
        if uops[j].op not in (Ops.LOAD, Ops.READ_ACC, Ops.DEFINE_ACC, Ops.ACCUMULATE):
            stack.extend(srcs[j])
    return need


def _gate(u: UOp) -> UOp | None:
    """A LOAD's or STORE's gate, if it has one (a shared-memory load's BARRIER source is an ordering edge)."""
    k = 2 if u.op is Ops.LOAD else 3
    if len(u.src) > k and u.src[k].dtype is not None and u.src[k].dtype.scalar().is_bool:
        return u.src[k]
    return None


def _lanes(v: Value, n: int) -> list[Any]:
    return v if isinstance(v, list) else [v] * n


def verify_bounds(name: str, uops: list[UOp], buffer_sizes: list[int], global_size: tuple[int, ...] = (1, 1, 1),
                  local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
                  buffer_names: list[str] | None = None, points: int | None = None) -> None:
    """Raise BoundsError if any live LOAD or STORE of the kernel would be outside its buffer (see the module doc)."""
    points = max_points() if points is None else points
    args = (name, uops, buffer_sizes, tuple(global_size), None if local_size is None else tuple(local_size),
            tuple(vals), buffer_names, points)
    STATS["kernels"] += 1
    first = _Verifier(*args)
    deferred = first.run()
    if not deferred:
        return
    # values too big to hold at once: enumerate again in chunks of the largest loop (or GPU/core index)
    sizes = {**{pos: first.axes[k].size for pos, k in first.axis_of.items()}, **first.big_ranges}
    total = int(np.prod(list(sizes.values()), dtype=np.float64))
    split = max(sizes, key=lambda pos: sizes[pos], default=None)
    left = set(deferred)
    if split is not None and total <= CHUNKED_POINTS * points:
        step = max(1, sizes[split] * points // max(total, 1))  # each chunk has at most `points` iterations
        left = set()
        for lo in range(0, sizes[split], step):
            left |= set(_Verifier(*args, restrict=(split, lo, lo + step), only=set(deferred)).run())
    STATS["unverified"] += len(left)
    STATS["enumerated"] += len(set(deferred) - left)


class _IndexSum:
    """An address `a + b` (two integer arrays, broadcast) that only accesses read as their index, left unbuilt:
    the grid of every iteration's address is the largest array of most passes, and its bounds are
    min(a) + min(b) .. max(a) + max(b). Where those lie in the buffer (and in the dtype: nothing wraps) the access
    passes without it; elsewhere (`np.asarray`) it is built as the ALU computes it and checked point by point."""

    __slots__ = ("a", "b", "make", "shape", "dtype", "_built")

    def __init__(self, a: np.ndarray, b: np.ndarray, dtype: np.dtype, make: Any):
        self.a, self.b, self.dtype, self.make = a, b, dtype, make
        self.shape = np.broadcast_shapes(a.shape, b.shape)
        self._built: np.ndarray | None = None

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self._built is None:
            self._built = np.asarray(self.make())
        return self._built if dtype is None else self._built.astype(dtype)

    def bounds(self) -> tuple[int, int] | None:
        """(lowest, highest) value, or None where some value could wrap (or there are none)."""
        if self.a.size == 0 or self.b.size == 0:
            return None
        lo, hi = int(self.a.min()) + int(self.b.min()), int(self.a.max()) + int(self.b.max())
        info = np.iinfo(self.dtype)
        return (lo, hi) if info.min <= lo and hi <= info.max else None


def _index_only(uops: list[UOp], src_pos: list[list[int | None]]) -> set[int]:
    """Positions of the values that every reader reads as a LOAD's or STORE's index (source 1), and only so."""
    ok: dict[int, bool] = {}
    for i, js in enumerate(src_pos):
        access = uops[i].op in (Ops.LOAD, Ops.STORE)
        for k, j in enumerate(js):
            if j is not None:
                ok[j] = ok.get(j, True) and access and k == 1
    return {j for j, v in ok.items() if v}


class _Verifier:
    def __init__(self, name: str, uops: list[UOp], sizes: list[int], global_size: tuple[int, ...],
                 local_size: tuple[int, ...] | None, vals: tuple[int, ...], names: list[str] | None, points: int,
                 restrict: tuple[int, int, int] | None = None, only: set[int] | None = None):
        self.interp = alu
        self.name, self.uops, self.sizes, self.names = name, uops, sizes, names
        self.global_size, self.local_size, self.vals, self.points = global_size, local_size, vals, points
        self.axes: list[_Axis] = []
        self.spent = 0  # elements computed so far
        # a chunked pass: (uop position, start, stop) of the one loop or index it enumerates in part, and the
        # accesses it checks
        self.restrict, self.only = restrict, only
        self.big_ranges: dict[int, int] = {}  # loops too long to enumerate at once -> their trip counts
        self.deferred: list[int] = []  # accesses too big for this pass that the symbolic bounds do not prove
        self.axis_of: dict[int, int] = {}  # uop position -> its axis
        # the ndim of every value: one axis per RANGE, SPECIAL and enumerated DEFINE_VAR
        self.ndim = sum(1 for u in uops if u.op in (Ops.RANGE, Ops.SPECIAL, Ops.DEFINE_VAR))
        self.index_only: set[int] = set()  # values only read as indices (`_index_only`, set by `run`)

    # --- values

    def new_axis(self, i: int, name: str, values: np.ndarray) -> np.ndarray:
        offset = 0
        if self.restrict is not None and self.restrict[0] == i:
            offset = self.restrict[1]
            values = values[self.restrict[1]:self.restrict[2]]
        k = len(self.axes)
        self.axes.append(_Axis(name, len(values), offset))
        self.axis_of[i] = k
        shape = [1] * self.ndim
        shape[k] = len(values)
        return values.reshape(shape)

    def too_big(self, *arrays: Any) -> bool:
        """Whether a value computed from these would be over the cap, or the kernel's budget is spent (each
        value computed counts against `KERNEL_BUDGET * points`)."""
        try:
            shape = np.broadcast_shapes(*(np.shape(a) for a in arrays))
        except ValueError:
            return True
        size = int(np.prod(shape, dtype=np.int64))
        if size > self.points or self.spent + size > KERNEL_BUDGET * self.points:
            return True
        self.spent += size
        return False

    def evaluate(self, u: UOp, srcs: list[Value], lazy: bool = False) -> Value:
        op, d = u.op, u.dtype
        if any(s is DATA for s in srcs):
            return DATA
        if any(s is TOO_BIG for s in srcs):
            return TOO_BIG
        if lazy and op is Ops.ADD and d is not None and d.count == 1 and \
                all(isinstance(s, np.ndarray) for s in srcs):
            want = self.interp.reg_dtype(d)
            if want.kind in "iu" and all(s.dtype.kind in "iu" for s in srcs):
                if self.too_big(*srcs):
                    return TOO_BIG
                return _IndexSum(srcs[0], srcs[1], want, lambda: self.interp.exec_alu(op, d, srcs))
        if op is Ops.CONST:
            return self.interp.const(u.arg, d.scalar())
        if op is Ops.VECTORIZE:
            return [s[0] if isinstance(s, list) else s for s in srcs]
        if op is Ops.GEP:
            return _lanes(srcs[0], u.src[0].dtype.count)[u.arg]
        src_dtypes = [s.dtype.scalar() if s.dtype is not None else None for s in u.src]
        if d is not None and d.count > 1:  # a vector op, lane by lane
            lanes = [self.alu(op, d.scalar(), src_dtypes, [_lanes(s, d.count)[j] for s in srcs])
                     for j in range(d.count)]
            return TOO_BIG if any(x is TOO_BIG for x in lanes) else lanes
        return self.alu(op, d, src_dtypes, srcs)

    def alu(self, op: Ops, d: DType, src_dtypes: list[DType | None], srcs: list[Any]) -> Value:
        ip = self.interp
        if self.too_big(*srcs):
            return TOO_BIG
        if op in COMPARE:
            return ip.exec_alu(op, src_dtypes[0], srcs)
        if op in BINARY or op in UNARY or op is Ops.WHERE:
            return ip.exec_alu(op, d, srcs)
        if op is Ops.CAST:
            return self.typed(ip.cast(srcs[0], src_dtypes[0], d), d)
        if op is Ops.BITCAST:
            return self.typed(ip.bitcast(srcs[0], src_dtypes[0], d), d)
        return DATA  # anything else (loads, accumulators) is data

    def typed(self, x: Any, d: DType) -> np.ndarray:
        x = np.asarray(x)
        want = self.interp.reg_dtype(d)
        return x if x.dtype == want else x.astype(want)

    def launch_dim(self, name: str, size: int) -> int:
        """How many values a GPU index takes in this launch (the launch, not the kernel's belief, is what runs)."""
        dim = int(name[-1]) if name[-1].isdigit() else 0
        if name.startswith("gidx"):
            return int(self.global_size[dim]) if dim < len(self.global_size) else size
        if name.startswith("lidx") and self.local_size is not None:
            return int(self.local_size[dim]) if dim < len(self.local_size) else size
        return size

    # --- the walk

    def run(self) -> list[int]:
        """Check every access (or those of `only`); returns the accesses left for a chunked pass."""
        uops = self.uops
        src_pos = _sources(uops)
        need = _needed(uops, src_pos)
        self.index_only = _index_only(uops, src_pos)
        env: dict[int, Value] = {}
        masks: list[Value] = []  # loop bounds that hold around the current uop
        open_masks: list[int] = []  # how many masks each open RANGE pushed
        others = [u for u in uops if u.op is Ops.DEFINE_VAR and _var_name(u) != "core_id"]
        var_values = dict(zip((_var_name(u) for u in others), self.vals))
        last_use: dict[int, int] = {}
        for i, js in enumerate(src_pos):
            for j in js:
                if j is not None:
                    last_use[j] = i
        with np.errstate(all="ignore"):
            for i, u in enumerate(uops):
                srcs = [DATA if j is None else env.get(j, DATA) for j in src_pos[i]]
                if u.op is Ops.RANGE:
                    env[i] = self.open_range(i, u, srcs[0], masks, open_masks)
                elif u.op is Ops.ENDRANGE:
                    for _ in range(open_masks.pop()):
                        masks.pop()
                elif u.op is Ops.SPECIAL:
                    n = self.launch_dim(u.arg[0], int(u.arg[1]))
                    env[i] = self.new_axis(i, u.arg[0], np.arange(n, dtype=np.int32))
                elif u.op is Ops.DEFINE_VAR:
                    env[i] = self.define_var(i, u, var_values)
                elif u.op in (Ops.LOAD, Ops.STORE):
                    self.check(i, u, srcs, masks)
                elif i in need and (u.op in ALU or u.op in (Ops.CONST, Ops.CAST, Ops.BITCAST, Ops.VECTORIZE,
                                                            Ops.GEP)):
                    env[i] = self.evaluate(u, srcs, lazy=i in self.index_only)
                for j in src_pos[i]:  # values no later uop reads are freed (they may be large)
                    if j is not None and last_use.get(j) == i:
                        env.pop(j, None)
        return self.deferred

    def define_var(self, i: int, u: UOp, var_values: dict[str, int]) -> Value:
        name = _var_name(u)
        if name == "core_id":  # a CPU kernel split across threads runs every core index of its launch
            return self.new_axis(i, name, np.arange(max(1, int(self.global_size[0])), dtype=np.int32))
        if name in var_values:
            return np.array(var_values[name], self.interp.reg_dtype(u.dtype))
        if isinstance(u.arg, tuple) and len(u.arg) == 3:  # every value it may take
            lo, hi = int(u.arg[1]), int(u.arg[2])
            if hi - lo + 1 <= self.points:
                return self.new_axis(i, name, np.arange(lo, hi + 1, dtype=np.int64).astype(
                    self.interp.reg_dtype(u.dtype)))
        return DATA

    def open_range(self, i: int, u: UOp, end: Value, masks: list[Value], open_masks: list[int]) -> Value:
        if isinstance(end, (_Unknown, list)):
            open_masks.append(0)
            return end if isinstance(end, _Unknown) else DATA
        end = np.asarray(end)
        n = max(0, int(end.max())) if end.size else 0
        if n > self.points and not (self.restrict is not None and self.restrict[0] == i):
            self.big_ranges[i] = n
            open_masks.append(0)
            return TOO_BIG
        r = self.new_axis(i, f"r{u.arg[0]}" if isinstance(u.arg, tuple) else f"r{i}",
                          np.arange(n, dtype=self.interp.reg_dtype(u.dtype)))
        if end.ndim == 0 or end.size == 1:
            open_masks.append(0)  # the axis is exactly the loop: no mask
        else:
            masks.append(r < end)
            open_masks.append(1)
        return r

    # --- the check

    def check(self, i: int, u: UOp, srcs: list[Value], masks: list[Value]) -> None:
        if self.only is not None and i not in self.only:
            return
        if self.only is None:
            STATS["accesses"] += 1
        buf = u.src[0]
        if buf.op is Ops.DEFINE_LOCAL:
            n, what = int(buf.arg[1]), f"shared memory '{buf.arg[0]}'"
        elif buf.op is Ops.DEFINE_GLOBAL and 0 <= buf.arg < len(self.sizes):
            n = int(self.sizes[buf.arg])
            label = self.names[buf.arg] if self.names and buf.arg < len(self.names) else None
            what = f"buffer {buf.arg}" + (f" ({label})" if label else "")
        else:
            raise BoundsError(f"kernel {self.name}: {u.op.name} (uop {i}) of a buffer that is not a kernel "
                              f"parameter ({buf.op.name} {buf.arg!r}; the kernel has {len(self.sizes)})")
        width = (u.dtype if u.op is Ops.LOAD else u.src[2].dtype).count
        idx_src = u.src[1]
        idx = srcs[1]
        gate_u = _gate(u)
        gate = srcs[2 if u.op is Ops.LOAD else 3] if gate_u is not None else None
        lane_gates = None
        if isinstance(gate, list) and not isinstance(idx, list) and len(gate) == width and \
                not any(isinstance(g, list) or g is DATA or g is TOO_BIG for g in gate):
            # a gate per lane (a masked vector access: a padded row's border): lane j reads index + j where
            # gate[j] holds, each lane checked on its own
            lane_gates, gate = gate, None
            idx = idx if idx is DATA or idx is TOO_BIG else [np.asarray(idx) + j for j in range(width)]
        parts = [idx, *([gate] if gate is not None else []), *masks]
        lanes = idx if isinstance(idx, list) else None
        data = any(p is DATA for p in parts) or any(isinstance(p, list) for p in parts[1:])
        if data or any(p is TOO_BIG for p in parts) or (lanes is None and self.too_big(*parts)) or \
                (lanes is not None and any(self.too_big(x, *parts[1:]) for x in lanes)):
            if self.only is None and self.by_bounds(i, u, idx_src, n, width, what):
                STATS["by_bounds"] += 1
            elif data:
                STATS["unverified"] += 1
            else:
                self.deferred.append(i)
            return
        if self.only is None:
            STATS["enumerated"] += 1
        if self.in_range(lanes if lanes is not None else [idx], n - (1 if lanes is not None else width)):
            return  # every index in bounds, live or not: no mask to compute
        live = None
        for m in parts[1:]:
            live = m if live is None else np.logical_and(live, m)
        for lane, ix in enumerate(lanes if lanes is not None else [idx]):
            ix = np.asarray(ix).astype(np.int64)
            bad = (ix < 0) | (ix > n - (1 if lanes is not None else width))
            if live is not None:
                bad = np.logical_and(bad, live)
            if lane_gates is not None:
                bad = np.logical_and(bad, lane_gates[lane])
            if np.any(bad):
                shape = np.shape(bad)
                at = tuple(int(c[0]) for c in np.nonzero(bad)) if shape else ()
                value = int(np.broadcast_to(ix, shape)[at])
                where = ", ".join(f"{a.name}={at[k] + a.offset}" for k, a in enumerate(self.axes)
                                  if k < len(shape) and shape[k] > 1)
                span = f"index {value}" if width == 1 or lanes is not None else \
                    f"indices {value}..{value + width - 1} ({width} lanes)"
                lane_txt = f" lane {lane}" if lanes is not None else ""
                raise BoundsError(f"kernel {self.name}: {u.op.name} (uop {i}){lane_txt} of {what} at {span}, "
                                  f"outside [0, {n})" + (f" (at {where})" if where else ""))

    @staticmethod
    def in_range(indices: list[Any], hi: int) -> bool:
        """Whether every value of these integer index arrays lies in [0, hi]: then no iteration is out of bounds,
        whatever the gates and loop bounds (two reductions per array, in its own dtype: the check below widens
        each index to int64 and masks it, ~4x the work, only where some value is outside)."""
        for ix in indices:
            if isinstance(ix, _IndexSum):
                b = ix.bounds()
                if b is not None and b[0] >= 0 and b[1] <= hi:
                    continue
            ix = np.asarray(ix)
            if ix.dtype.kind not in "iub":
                return False
            if ix.size and (int(ix.min()) < 0 or int(ix.max()) > hi):
                return False
        return True

    def by_bounds(self, i: int, u: UOp, idx: UOp, n: int, width: int, what: str) -> bool:
        """Too big to enumerate, or data-dependent: whether the index's symbolic bounds prove it in bounds (an
        ungated index whose bounds lie wholly outside the buffer is an error)."""
        try:
            lo, hi = idx.vmin, idx.vmax
        except Exception:  # bounds of an unusual node: not provable
            lo, hi = -1, n
        if idx.dtype is not None and idx.dtype.count > 1:
            lo, hi = min(s.vmin for s in idx.src), max(s.vmax for s in idx.src)
            width = 1
        if lo >= 0 and hi + width <= n:
            return True
        if _gate(u) is None and (lo >= n or hi < 0):  # every iteration is outside
            raise BoundsError(f"kernel {self.name}: {u.op.name} (uop {i}) of {what} at indices in [{lo}, {hi}], "
                              f"outside [0, {n})")
        return False


def _var_name(u: UOp) -> str:
    return str(u.arg[0]) if isinstance(u.arg, tuple) else str(u.arg)


def buffer_label(node: UOp, i: int) -> str:
    """How a report names a kernel's buffer: an input's name, else its role, with its dtype and shape."""
    shape = ", ".join(str(s) for s in shape_of(node))
    kind = node.arg[1] if node.op is Ops.BUFFER and isinstance(node.arg, tuple) else ("output" if i == 0 else
                                                                                      "intermediate")
    return f"{kind}: {node.dtype}[{shape}]"


def verify_kernel(name: str, uops: list[UOp], bufs: list[UOp], launch: dict) -> None:
    """`verify_bounds` for a kernel of `build_kernel` (its buffers as tensor nodes, its launch dict)."""
    verify_bounds(name, uops, [prod(shape_of(b)) for b in bufs], launch.get("global_size", (1, 1, 1)),
                  launch.get("local_size"), launch.get("vals", ()),
                  buffer_names=[buffer_label(b, i) for i, b in enumerate(bufs)])
