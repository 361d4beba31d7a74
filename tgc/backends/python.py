"""PYTHON: a reference device that interprets a kernel's linear UOps with numpy, on any machine.

It receives the same kernels as the CPU (launch style "cpu") and gives them the semantics of the LLVM
renderer (`tgc.backends.llvmir`), so a lowering bug shows up here without a compiler:

- the *renderer* writes the linear UOps as JSON text, one `[op, dtype, [src indices], arg]` per line;
- the *compiler* checks that text (known ops, sources defined before use and inside their loops, balanced
  loops) and returns its bytes; nothing is ever `eval`ed: the program interprets the list;
- the *program* runs it on numpy views of the buffers (plain `uint8` numpy arrays, like the CPU's).

Speed comes from vectorizing loops instead of stepping through them: every RANGE is one numpy axis (axis
`k` for a loop nested `k` deep) and every value is an array that broadcasts over the axes of the loops it
depends on. A STORE scatters, an ACCUMULATE reduces over the axes of the loops opened since its DEFINE_ACC.
Loops are run in blocks so that no array exceeds `BLOCK_ELEMENTS` lanes: the innermost loops are vectorized
whole, the outer ones step through blocks (down to one index at a time) in Python, so the lanes of a block
are in loop order. Only an order between *different* memory operations can change: a kernel that reads a
buffer it writes runs one iteration at a time; where two STOREs write one buffer, the run watches for an
address written twice and, if one is, runs again one iteration at a time.

Semantics: every ALU op, cast and reduction is evaluated by the one ALU table (`tgc/ir/alu.py`, the LLVM
renderer's semantics: wrapping ints, C division, saturating float->int casts, nan-propagating max, bf16 as bits), which
constant folding and the float64 reference use too. Bools are bytes in memory; a gated LOAD reads 0 where its
gate is false. A LOAD or STORE outside its buffer (in a lane that runs) is a `DeviceError` naming the kernel,
the UOp and the index, not a crash: that is a lowering bug.

A kernel split across threads (`core_id`, `global_size[0] > 1`) runs each core index in turn. `cores` is 1
unless `TGC_THREADS` says otherwise, so the optimizer normally hands this device single-thread kernels.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from tgc.backends.base import Compiler, Device, HostAllocator, Program
from tgc.capabilities import Capabilities
from tgc.dtype import DType, dtypes
from tgc.env import env_int
from tgc.errors import CompileError, DeviceError
from tgc.ir.alu import AluError, bitcast, cast, const, exec_alu, reducer, reg_dtype
from tgc.ir.uop import BINARY, COMPARE, UNARY, Ops, UOp

FORMAT = "tgc-python-uops/1"
# The most lanes one vectorized block of loops may have (a few MB per temporary value).
BLOCK_ELEMENTS = 1 << 18
# Ops that produce no value.
_NO_VALUE = {Ops.STORE, Ops.ENDRANGE, Ops.SINK, Ops.BARRIER}
_REDUCE_OPS = {Ops.ADD, Ops.MUL, Ops.MAX}
_SUPPORTED = UNARY | BINARY | {Ops.WHERE, Ops.CAST, Ops.BITCAST, Ops.CONST, Ops.DEFINE_GLOBAL,
                               Ops.DEFINE_VAR, Ops.RANGE, Ops.ENDRANGE, Ops.LOAD, Ops.STORE, Ops.DEFINE_ACC,
                               Ops.ACCUMULATE, Ops.READ_ACC, Ops.SINK, Ops.BARRIER}
_NSRC: dict[Ops, tuple[int, ...]] = {
    **{op: (1,) for op in UNARY | {Ops.CAST, Ops.BITCAST, Ops.RANGE, Ops.ENDRANGE, Ops.DEFINE_ACC, Ops.READ_ACC}},
    **{op: (2,) for op in BINARY | {Ops.ACCUMULATE}},
    Ops.WHERE: (3,), Ops.LOAD: (2, 3), Ops.STORE: (3, 4),
    Ops.CONST: (0,), Ops.DEFINE_GLOBAL: (0,), Ops.DEFINE_VAR: (0,), Ops.BARRIER: (0,),
}


# ------------------------------------------------------------------------------------------------------------------
# Rendering: linear UOps -> JSON text


def _json_arg(arg: Any) -> Any:
    if isinstance(arg, Enum):
        return arg.name
    if isinstance(arg, (tuple, list)):
        return [_json_arg(a) for a in arg]
    if arg is None or isinstance(arg, (bool, int, float, str)):
        return arg
    return str(arg)


def _max_trips(end: UOp) -> int:
    """An upper bound of a loop's trip count, from the bounds of its end (used to size vectorized blocks)."""
    try:
        hi = end.vmax
    except Exception:  # bounds are a hint only
        return 1 << 62
    return int(max(0, min(hi, 1 << 62))) if isinstance(hi, (int, float)) and hi == hi else 1 << 62


class PythonRenderer:
    """Linear UOps -> JSON: `{"kernel", "format", "uops": [[op, dtype, [srcs], arg], ...]}`, one UOp a line.

    A RANGE's arg is `[id, kind, max trips]`; dtypes are written as `repr(DType)` (`f32`, `f32*` for a buffer).
    """

    name = "python"
    language = "json"
    # CPU-style launches; no vectors, no panel packing (no caches to speak of), and no row value stored and read
    # back (a kernel reading a buffer it writes runs one iteration at a time here)
    caps = Capabilities(reread_rows=False)

    def render(self, name: str, uops: list[UOp]) -> str:
        # UOps are hash-consed, so one node may be emitted again in a later loop: a source is its latest copy
        index: dict[UOp, int] = {}
        lines = []
        for i, u in enumerate(uops):
            try:
                srcs = [index[s] for s in u.src]
            except KeyError:
                raise CompileError(f"PYTHON renderer: {u.op.name} in kernel {name} uses a value that is not "
                                   "computed before it") from None
            index[u] = i
            arg = [*_json_arg(u.arg)[:2], _max_trips(u.src[0])] if u.op is Ops.RANGE else _json_arg(u.arg)
            lines.append(json.dumps([u.op.name, None if u.dtype is None else repr(u.dtype), srcs, arg]))
        body = ",\n  ".join(lines)
        return (f'{{\n "kernel": {json.dumps(name)},\n "format": "{FORMAT}",\n "uops": [\n  {body}\n ]\n}}\n')


# ------------------------------------------------------------------------------------------------------------------
# Checking: JSON text -> instructions


@dataclass(frozen=True)
class Instr:
    """One linear UOp as the interpreter reads it."""

    op: Ops
    dtype: DType | None
    src: tuple[int, ...]
    arg: Any
    ptr: bool = False


def _parse_dtype(text: Any, where: str) -> tuple[DType | None, bool]:
    if text is None:
        return None, False
    if not isinstance(text, str):
        raise CompileError(f"{where}: bad dtype {text!r}")
    name, ptr = (text[:-1], True) if text.endswith("*") else (text, False)
    if name not in dtypes.by_name:
        raise CompileError(f"{where}: the PYTHON device has no dtype '{text}' (vectors are not supported)")
    return dtypes.by_name[name], ptr


def _is_half_math(ins: Instr, code: list[Instr]) -> bool:
    """bf16 values are bits: arithmetic on them must have been legalized to f32."""
    if ins.op not in UNARY | BINARY:
        return False
    types = [ins.dtype, *(code[s].dtype for s in ins.src)]
    return any(t is not None and t.name == "bf16" for t in types)


def parse_program(text: str | bytes) -> tuple[str, list[Instr]]:
    """(kernel name, instructions) of a rendered kernel, checked; raises CompileError on anything malformed."""
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise CompileError(f"PYTHON: the kernel is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("uops"), list):
        raise CompileError(f"PYTHON: not a kernel in the format {FORMAT}")
    name = str(doc.get("kernel", "kernel"))
    code: list[Instr] = []
    stack: list[int] = []  # open RANGEs
    scope: list[tuple[int, ...]] = []  # the open RANGEs where each value is visible
    for i, entry in enumerate(doc["uops"]):
        where = f"PYTHON: kernel {name}, uop {i}"
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)
                and isinstance(entry[2], list)):
            raise CompileError(f"{where}: expected [op, dtype, [srcs], arg], got {entry!r}")
        opname, dt, srcs, arg = entry
        op = Ops.__members__.get(opname)
        if op is None or op not in _SUPPORTED:
            raise CompileError(f"{where}: the PYTHON device does not run {opname}")
        dtype, ptr = _parse_dtype(dt, where)
        if not all(isinstance(s, int) and 0 <= s < i for s in srcs):
            raise CompileError(f"{where}: {opname} has sources {srcs} that are not earlier UOps")
        if op in _NSRC and len(srcs) not in _NSRC[op]:
            raise CompileError(f"{where}: {opname} takes {_NSRC[op]} sources, got {len(srcs)}")
        for s in srcs:
            if code[s].op in _NO_VALUE:
                raise CompileError(f"{where}: source {s} ({code[s].op.name}) has no value")
            if op is not Ops.ENDRANGE and scope[s] != tuple(stack[:len(scope[s])]):
                raise CompileError(f"{where}: {opname} uses uop {s} outside the loop that computes it")
        if op is not Ops.SINK and op not in _NO_VALUE and dtype is None:
            raise CompileError(f"{where}: {opname} needs a dtype")
        arg = _parse_arg(op, dtype, arg, where)
        ins = Instr(op, dtype, tuple(srcs), arg, ptr)
        if op in (Ops.LOAD, Ops.STORE) and code[srcs[0]].op is not Ops.DEFINE_GLOBAL:
            raise CompileError(f"{where}: {opname} needs a DEFINE_GLOBAL as its first source")
        if op in (Ops.ACCUMULATE, Ops.READ_ACC) and code[srcs[0]].op is not Ops.DEFINE_ACC:
            raise CompileError(f"{where}: {opname} needs a DEFINE_ACC as its first source")
        if _is_half_math(ins, code):
            raise CompileError(f"{where}: {opname} on bf16 bits (legalize should have computed it in f32)")
        if op is Ops.RANGE:
            stack.append(i)
        elif op is Ops.ENDRANGE:
            if not stack or stack[-1] != srcs[0]:
                raise CompileError(f"{where}: ENDRANGE does not close the innermost open loop")
            stack.pop()
        code.append(ins)
        scope.append(tuple(stack))
    if stack:
        raise CompileError(f"PYTHON: kernel {name}: loop at uop {stack[-1]} is never closed")
    return name, code


def _parse_arg(op: Ops, dtype: DType | None, arg: Any, where: str) -> Any:
    if op is Ops.ACCUMULATE:
        red = Ops.__members__.get(arg) if isinstance(arg, str) else None
        if red not in _REDUCE_OPS:
            raise CompileError(f"{where}: ACCUMULATE with {arg!r}; the PYTHON device knows ADD, MUL, MAX")
        return red
    if op is Ops.DEFINE_VAR:
        return arg[0] if isinstance(arg, list) and arg else str(arg)
    if op is Ops.DEFINE_GLOBAL:
        if not isinstance(arg, int):
            raise CompileError(f"{where}: DEFINE_GLOBAL needs a buffer index")
        return arg
    if op is Ops.CONST:
        if not isinstance(arg, (bool, int, float)):
            raise CompileError(f"{where}: bad constant {arg!r}")
        return const(arg, dtype)
    return arg


# ------------------------------------------------------------------------------------------------------------------
# Values


def mem_dtype(d: DType) -> np.dtype:
    """The numpy dtype of a value in memory: bools are bytes."""
    return np.dtype(np.uint8) if d.is_bool else d.np


# ------------------------------------------------------------------------------------------------------------------
# Planning: how each loop is run


@dataclass
class Plan:
    """Static facts about a kernel's loops, computed once per program."""

    ndim: int  # how deep loops nest: the number of axes of a value
    depth: list[int]  # per uop: how many loops are open there
    end_of: dict[int, int]  # RANGE -> its ENDRANGE
    block: dict[int, int]  # RANGE -> lanes per vectorized block
    acc_axes: dict[int, tuple[int, ...]]  # ACCUMULATE -> the axes it reduces
    sequential: bool  # one iteration at a time, in loop order


def make_plan(code: list[Instr], budget: int | None = None, sequential: bool = False) -> Plan:
    """Axes and block sizes of a kernel's loops (at most `budget` lanes, default `BLOCK_ELEMENTS`);
    `sequential` (or a buffer both read and written) steps every loop one index at a time."""
    budget = BLOCK_ELEMENTS if budget is None else budget
    depth, end_of, children, parent = [], {}, {}, {}
    stack: list[int] = []
    roots: list[int] = []
    for i, ins in enumerate(code):
        if ins.op is Ops.RANGE:
            depth.append(len(stack))
            (children[stack[-1]] if stack else roots).append(i)
            parent[i] = stack[-1] if stack else None
            children[i] = []
            stack.append(i)
        elif ins.op is Ops.ENDRANGE:
            end_of[stack.pop()] = i
            depth.append(len(stack))
        else:
            depth.append(len(stack))
    acc_axes = {i: tuple(range(depth[ins.src[0]], depth[i])) for i, ins in enumerate(code)
                if ins.op is Ops.ACCUMULATE}
    # a buffer both read and written makes the order of iterations visible
    loaded = {ins.src[0] for ins in code if ins.op is Ops.LOAD}
    sequential = sequential or bool(loaded & {ins.src[0] for ins in code if ins.op is Ops.STORE})
    # a loop whose index decides another loop's trip count runs one index at a time
    deps: list[frozenset[int]] = []
    for i, ins in enumerate(code):
        if ins.op is Ops.RANGE:
            deps.append(frozenset([i]))
        elif ins.op is Ops.READ_ACC:
            deps.append(frozenset(r for r in parent if r < i and end_of[r] > i))  # every open loop
        else:
            deps.append(frozenset().union(*(deps[s] for s in ins.src)) if ins.src else frozenset())
    stepped = set().union(*(deps[code[r].src[0]] for r in children)) if children else set()
    # a loop that reads an accumulator defined outside it (an online softmax's running max) carries a value from
    # one iteration to the next: it runs one index at a time
    stepped |= {r for i, ins in enumerate(code) if ins.op is Ops.READ_ACC
                for r in parent if ins.src[0] < r < i < end_of[r]}

    block: dict[int, int] = {}

    def size_up(r: int) -> tuple[int, bool]:
        """(lanes of this loop's vectorized block times its inner loops', whether all of it is vectorized)."""
        inner, whole = 1, True
        for c in children[r]:
            lanes, c_whole = size_up(c)
            inner, whole = max(inner, lanes), whole and c_whole
        trips = max(1, int(code[r].arg[2]) if isinstance(code[r].arg, list) and len(code[r].arg) > 2 else 1 << 31)
        if sequential or r in stepped or not whole:  # vectorized loops stay innermost: loop order is kept
            block[r] = 1
        else:
            block[r] = max(1, min(trips, budget // inner))
        return block[r] * inner, whole and block[r] >= trips

    for r in roots:
        size_up(r)
    ndim = max((depth[r] + 1 for r in children), default=0)
    return Plan(ndim, depth, end_of, block, acc_axes, sequential)


@functools.lru_cache(maxsize=64)
def _parse_checked(lib: bytes) -> tuple[str, tuple[Instr, ...]]:
    """`parse_program` of a kernel's bytes, remembered for the last 64 kernels: a cold compile checks the
    text and the program built from the same bytes right after reuses that parse (Instrs are frozen)."""
    name, code = parse_program(lib)
    return name, tuple(code)


# ------------------------------------------------------------------------------------------------------------------
# Running


class _Overlap(Exception):
    """Two STOREs of a vectorized run wrote one address, so the order of the writes matters."""


class PythonProgram(Program):
    """A checked kernel, interpreted on each launch."""

    def __init__(self, device: PythonDevice, name: str, lib: bytes):
        super().__init__(device, name, lib)
        self.kernel, code = _parse_checked(bytes(lib))
        self.code = list(code)
        self.plan = make_plan(self.code)
        self._sequential_plan: Plan | None = None
        self.vars = [ins.arg for ins in self.code if ins.op is Ops.DEFINE_VAR]
        stored = [ins.src[0] for ins in self.code if ins.op is Ops.STORE]
        # buffers written by several STOREs: a vectorized run checks that no address is written twice
        self.shared_outputs = {b for b in stored if stored.count(b) > 1}

    @property
    def sequential_plan(self) -> Plan:
        if self._sequential_plan is None:
            self._sequential_plan = make_plan(self.code, sequential=True)
        return self._sequential_plan

    def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1),
                 local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
                 wait: bool = False) -> float | None:
        st = time.perf_counter()
        cores = max(1, int(global_size[0])) if "core_id" in self.vars else 1
        others = [v for v in self.vars if v != "core_id"]
        if len(vals) < len(others):
            raise DeviceError(f"kernel {self.name} takes {len(others)} values ({', '.join(others)}), got {len(vals)}")
        with np.errstate(all="ignore"):
            for core in range(cores):
                env_vars = {**dict(zip(others, vals)), "core_id": core}
                try:
                    _Run(self, self.plan, bufs, env_vars).block(0, len(self.code))
                except _Overlap:  # run again in loop order: every address gets its last write again
                    _Run(self, self.sequential_plan, bufs, env_vars).block(0, len(self.code))
        return time.perf_counter() - st if wait else None


class _Run:
    """One launch on one core: `env[i]` is the current value of uop i."""

    def __init__(self, prog: PythonProgram, plan: Plan, bufs: tuple[Any, ...], var_values: dict[str, int]):
        self.prog, self.code, self.plan = prog, prog.code, plan
        self.bufs = bufs
        self.views: dict[tuple[int, np.dtype], np.ndarray] = {}
        self.watch = set() if plan.sequential else prog.shared_outputs
        self.written: dict[tuple[int, np.dtype], np.ndarray] = {}
        self.vals = var_values
        self.env: list[Any] = [None] * len(self.code)
        self.sizes = [1] * self.plan.ndim  # the current block's length on each axis
        self.dispatch: dict[Ops, Callable[[int, Instr], Any]] = {
            Ops.CONST: lambda i, ins: ins.arg, Ops.DEFINE_GLOBAL: lambda i, ins: ins.arg,
            Ops.DEFINE_VAR: self.define_var, Ops.LOAD: self.load, Ops.STORE: self.store,
            Ops.DEFINE_ACC: lambda i, ins: self.env[ins.src[0]], Ops.ACCUMULATE: self.accumulate,
            Ops.READ_ACC: lambda i, ins: self.env[ins.src[0]], Ops.SINK: lambda i, ins: None,
            Ops.BARRIER: lambda i, ins: None, Ops.CAST: self.cast, Ops.BITCAST: self.bitcast,
        }

    def fail(self, i: int, msg: str) -> DeviceError:
        return DeviceError(f"kernel {self.prog.name}, uop {i} ({self.code[i].op.name}): {msg}")

    # --- control flow

    def block(self, start: int, stop: int) -> None:
        code, env, dispatch = self.code, self.env, self.dispatch
        i = start
        while i < stop:
            ins = code[i]
            if ins.op is Ops.RANGE:
                self.loop(i, ins)
                i = self.plan.end_of[i] + 1
                continue
            handler = dispatch.get(ins.op)
            if handler is not None:
                env[i] = handler(i, ins)
            else:
                d = code[ins.src[0]].dtype if ins.op in COMPARE else ins.dtype
                try:
                    env[i] = exec_alu(ins.op, d, [env[s] for s in ins.src])
                except AluError as e:
                    raise CompileError(f"PYTHON: {e}") from None
            i += 1

    def loop(self, i: int, ins: Instr) -> None:
        end = np.asarray(self.env[ins.src[0]])
        if end.size != 1:
            raise self.fail(i, "the loop's end differs between lanes")
        n, axis, step = int(end.reshape(-1)[0]), self.plan.depth[i], self.plan.block[i]
        shape = [1] * self.plan.ndim
        for lo in range(0, n, step):
            hi = min(lo + step, n)
            shape[axis] = self.sizes[axis] = hi - lo
            self.env[i] = np.arange(lo, hi, dtype=reg_dtype(ins.dtype)).reshape(shape)
            self.block(i + 1, self.plan.end_of[i])
        self.sizes[axis] = 1

    # --- values

    @staticmethod
    def typed(x: Any, d: DType | None) -> np.ndarray:
        x = np.asarray(x)
        want = reg_dtype(d) if d is not None else x.dtype
        return x if x.dtype == want else x.astype(want)

    def define_var(self, i: int, ins: Instr) -> np.ndarray:
        if ins.arg not in self.vals:
            raise self.fail(i, f"no value for the kernel variable '{ins.arg}'")
        return np.array(self.vals[ins.arg], reg_dtype(ins.dtype))

    def cast(self, i: int, ins: Instr) -> np.ndarray:
        return self.typed(cast(self.env[ins.src[0]], self.code[ins.src[0]].dtype, ins.dtype), ins.dtype)

    def bitcast(self, i: int, ins: Instr) -> np.ndarray:
        src = self.code[ins.src[0]].dtype
        if src.itemsize != ins.dtype.itemsize:
            raise self.fail(i, f"bitcast from {src.name} to {ins.dtype.name} changes the size")
        return self.typed(bitcast(self.env[ins.src[0]], src, ins.dtype), ins.dtype)

    # --- memory

    def view(self, i: int, buf: int, d: DType) -> np.ndarray:
        md = mem_dtype(d)
        key = (buf, md)
        if key not in self.views:
            if buf >= len(self.bufs):
                raise self.fail(i, f"buffer {buf} was not passed ({len(self.bufs)} buffers)")
            raw = self.bufs[buf]
            if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.ndim != 1:
                raise self.fail(i, "buffers must be 1-d uint8 numpy arrays (from this device's allocator)")
            self.views[key] = raw[:raw.size - raw.size % md.itemsize].view(md)
        return self.views[key]

    def check_bounds(self, i: int, idx: np.ndarray, n: int, what: str) -> None:
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = idx[(idx < 0) | (idx >= n)].reshape(-1)[0]
            raise self.fail(i, f"{what} out of bounds: index {int(bad)} of a buffer of {n} elements")

    def load(self, i: int, ins: Instr) -> np.ndarray:
        buf = self.view(i, self.env[ins.src[0]], ins.dtype)
        idx = np.asarray(self.env[ins.src[1]])
        gate = np.asarray(self.env[ins.src[2]]) if len(ins.src) > 2 else None
        if gate is not None:
            shape = np.broadcast(idx, gate).shape
            live = np.broadcast_to(gate, shape)
            idx = np.broadcast_to(idx, shape)
            self.check_bounds(i, idx[live], buf.size, "LOAD")
            out = np.zeros(shape, mem_dtype(ins.dtype))
            out[live] = buf[idx[live]]
        else:
            self.check_bounds(i, idx, buf.size, "LOAD")
            out = buf[idx]
        return out != 0 if ins.dtype.is_bool else np.asarray(out)

    def store(self, i: int, ins: Instr) -> None:
        val_dtype = self.code[ins.src[2]].dtype
        buf = self.view(i, self.env[ins.src[0]], val_dtype)
        idx, val = np.asarray(self.env[ins.src[1]]), np.asarray(self.env[ins.src[2]])
        if val_dtype.is_bool:
            val = val.astype(np.uint8)
        if len(ins.src) > 3:
            idx, val, gate = np.broadcast_arrays(idx, val, np.asarray(self.env[ins.src[3]]))
            idx, val = idx[gate], val[gate]
        else:
            idx, val = np.broadcast_arrays(idx, val)
        idx, val = idx.reshape(-1), val.reshape(-1)
        self.check_bounds(i, idx, buf.size, "STORE")
        if ins.src[0] in self.watch:
            seen = self.written.setdefault((ins.src[0], buf.dtype), np.zeros(buf.size, np.bool_))
            if seen[idx].any():
                raise _Overlap
            seen[idx] = True
        buf[idx] = val  # repeated indices: the last, in loop order, wins

    def accumulate(self, i: int, ins: Instr) -> None:
        acc_i, v_i = ins.src
        try:
            fn, ident = reducer(ins.arg, ins.dtype)
        except AluError as e:
            raise CompileError(f"PYTHON: {e}") from None
        v = np.asarray(self.env[v_i])
        axes = self.plan.acc_axes[i]
        if axes:
            if v.ndim == 0:
                v = v.reshape((1,) * self.plan.ndim)
            full = list(v.shape)
            for a in axes:
                full[a] = self.sizes[a]
            v = np.broadcast_to(v, full)
            kw = {"dtype": v.dtype} if not ins.dtype.is_bool else {}
            v = fn.reduce(v, axis=axes, keepdims=True, initial=ident, **kw)
        self.env[acc_i] = self.typed(fn(self.env[acc_i], v), ins.dtype)


class PythonCompiler(Compiler):
    """Checks the JSON kernel and returns its bytes: there is nothing to translate."""

    name = "numpy-interpreter"
    version = FORMAT

    def compile(self, src: str) -> bytes:
        lib = src.encode()
        _parse_checked(lib)  # the program built from these bytes next finds them parsed
        return lib

    def disassemble(self, lib: bytes, src: str | None = None) -> str:
        return lib.decode()


class PythonAllocator(HostAllocator):
    """Host memory for the interpreter (numpy views of it are what the kernels read and write)."""


class PythonDevice(Device):
    kind = "PYTHON"
    launch_style = "cpu"

    def __init__(self, index: int = 0):
        super().__init__(index)
        self.renderer = PythonRenderer()
        self.compiler = PythonCompiler()
        self.allocator = PythonAllocator()

    @classmethod
    def device_count(cls) -> int:
        """PYTHON:0 .. PYTHON:7 (each an interpreter like the others, for device lists)."""
        return 8

    @property
    def cores(self) -> int:
        """1 (single-thread kernels) unless TGC_THREADS asks the optimizer to split work across cores."""

        return env_int("TGC_THREADS", 1)

    def program(self, name: str, lib: bytes) -> PythonProgram:
        return PythonProgram(self, name, lib)

    def info(self) -> dict[str, Any]:
        return {"renderer": "JSON UOps", "compiler": f"none: interpreted with numpy {np.__version__}",
                "cores": self.cores}
