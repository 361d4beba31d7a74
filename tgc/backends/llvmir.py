"""Renders linear UOps as LLVM IR text (no llvmlite needed to render; only to compile).

The kernel is `void NAME(ptr %data0, ..., i32 %core_id)`: on the CPU each thread receives its index
as the last argument. Loop variables and addresses are i32, or i64 in kernels whose indices may pass
2^31 (`tgc.codegen.index`). Accumulators live in allocas (LLVM's mem2reg makes them registers); loops are
header/body/exit blocks with a phi for the index. Bools are i1 in registers and i8 in memory; bf16 is
i16 bits. A dtype with `count > 1` is an LLVM vector (`<16 x float>`); scalars used with vectors are
splatted by VECTORIZE.
"""

from __future__ import annotations

import math
import re
import struct

from tgc.capabilities import Capabilities
from tgc.dtype import DType, dtypes, f32_to_bf16
from tgc.ir.uop import Ops, UOp

_TYPES = {"bool": "i1", "i8": "i8", "u8": "i8", "i16": "i16", "u16": "i16", "i32": "i32", "u32": "i32", "i64": "i64",
          "u64": "i64", "f16": "half", "bf16": "i16", "f32": "float", "f64": "double"}
# Contraction into fma: a product may fuse only into a reduction's accumulate (`_REASSOC`: the inner product of a
# matmul, where the fused form is faster and only more accurate). An elementwise `a * b - c` is not contracted:
# fused, it rounds `a * b` differently from the same product computed elsewhere in the kernel, so `x * s - max(x *
# s)` at the largest element is the product's rounding error (up to ~1e3 at 3e10), not 0, and a softmax of large
# logits became exp(-1e3) everywhere, 0 / 0 = nan (`tests/test_lang_numpy_semantics.py`). Reductions may reassociate.
# every buffer parameter is declared `align PARAM_ALIGN`: the CPU runs a user's array in place only when its data
# address is a multiple of it (`CPUAllocator.zero_copy_align`), else it copies
PARAM_ALIGN = 16
_CONTRACT = "contract "
# No `nnan` anywhere: a max must give nan wherever a nan is among its elements (DSL semantics, numpy's max), and
# with `nnan` LLVM may take any value for one (maxnum's or poison), fold a later `x != x` check of an accumulated
# value to false, and a max reduction's answer depended on where the nan sat. Float MAX is `llvm.maximum` (nan-
# propagating): LLVM's loop vectorizer reduces it without `nnan` (an fmaximum recurrence); `nsz` stays (which zero
# max(-0.0, 0.0) gives is unspecified), so x86 lowers max(x, 0.0) to one vmaxps.
_REASSOC = "reassoc nsz contract "
# A register tile's epilogue (the straight-line code after its reduction's loops that ends the enclosing loop's body:
# scale, bias, residual, activation, the stores) with at least this many loads and stores of buffers is rendered as
# a function of its own (`_Renderer.outline`), called once per tile. LLVM's loop passes (IndVarSimplify, LoopIdiom,
# LSR: scalar evolution over every address of a loop nest, a cost per memory op) no longer see those memory ops:
# a convolution tile's channels x columns, stored in rows of 3-4 lanes (64-132 memory ops on ResNet-50), took ~35%
# less LLVM time. A matmul tile's rows are whole vectors (8-16 stores): not worth a call, and a kernel of one
# function is one a REMOTE server can prove short (`shortproof`).
OUTLINE_MIN_MEMORY_OPS = 32
_EPILOGUE_ATTRS = 'attributes #1 = { noinline nounwind "prefer-vector-width"="512" "no-trapping-math"="true" }'


_DEF = re.compile(r"  (%[\w.]+) = ")  # a line defining a value
_VALUE = re.compile(r"%[\w.]+")  # a local name (values only in straight-line code: no labels)
_ACC_READ = re.compile(r"  %[\w.]+ = load [^,]+, ptr %acc\d+$")  # READ_ACC
_MEMORY_OP = re.compile(r"  (?:%[\w.]+ = load |store |%[\w.]+ = call [^@]*@llvm\.masked\.)")


def _vec(base: str, d: DType) -> str:
    return f"<{d.count} x {base}>" if d.count > 1 else base


def ltype(d: DType) -> str:
    return _vec(_TYPES[d.name], d)


def mtype(d: DType) -> str:
    """Type in memory: bools are bytes."""
    return _vec("i8" if d.is_bool else _TYPES[d.name], d)


def _scalar_const(value, d: DType) -> str:
    if d.is_bool:
        return "true" if value else "false"
    if d.name == "bf16":  # the 16 bits of the value, rounded to nearest even
        import numpy as np

        return str(int(f32_to_bf16(np.array([value], np.float32))[0]))
    if d.is_int:
        return str(int(value))
    if d.name == "f16":  # a finite value past f16's range is +-inf, as numpy rounds it (struct would raise)
        value = value if not math.isfinite(value) or abs(value) < 65520.0 else math.copysign(math.inf, value)
        return "0xH" + struct.pack(">e", value).hex().upper()
    if d.name == "f32":
        value = struct.unpack("f", struct.pack("f", value))[0] if math.isfinite(value) else value
    return "0x" + struct.pack(">d", value).hex().upper()


def lconst(value, d: DType) -> str:
    """A literal of type `d`: scalars as themselves, vectors as a splat."""
    lit = _scalar_const(value, d)
    return f"splat ({_TYPES[d.name]} {lit})" if d.count > 1 else lit


def _suffix(d: DType) -> str:
    base = {"f16": "f16", "f32": "f32", "f64": "f64"}.get(d.name, f"i{d.bits}")
    return f"v{d.count}{base}" if d.count > 1 else base


def _core_mask(u: UOp) -> int | None:
    """For the CPU thread index `core_id` (a DEFINE_VAR over [0, threads - 1], which the runtime always passes in
    range): the mask 2^k - 1 >= threads - 1 that the kernel ANDs it with before any use (`%core`), else None.

    The AND changes no value the runtime passes, but it tells LLVM that the index is small and non-negative.
    Without it, `core_id * chunk + r` (a thread's rows, `tgc.codegen.opt.split_threads`) may wrap for all LLVM
    knows, so no i32 index derived from it is widened to a 64-bit induction variable: every address of the loop
    body was sign-extended and recomputed (ShuffleNet's 1x1 group convolutions 646 instructions instead of 263,
    3-10x slower per thread than the same kernel unsplit)."""
    if not isinstance(u.arg, tuple) or len(u.arg) != 3 or u.arg[0] != "core_id":
        return None
    lo, hi = u.arg[1], u.arg[2]
    if not (isinstance(lo, int) and isinstance(hi, int)) or lo < 0 or hi < 0:
        return None
    return (1 << max(int(hi).bit_length(), 1)) - 1


def _no_signed_wrap(u: UOp, memo: dict | None = None) -> bool:
    """Whether a signed integer ADD, SUB or MUL provably does not wrap: its operands' and its own intervals
    (`_interval`: exact interval arithmetic over the loop ranges, launch values and constants) lie in its dtype's
    range. Index arithmetic is such (it is i32 only where every value fits, `tgc.codegen.index`); LLVM is told
    so (`nsw`), which lets it widen i32 addresses to 64-bit induction variables and divide as unsigned where the
    operands are non-negative: without it, a thread's chunk (`core_id * chunk + r`) made every address of a loop
    body a sign extension and a recomputation (ShuffleNet's 1x1 group convolutions 3-10x slower per thread than
    unsplit). Arithmetic on loaded values is never marked (their interval is unknown): it wraps as before."""
    d = u.dtype
    if u.op not in (Ops.ADD, Ops.SUB, Ops.MUL) or d is None or not d.is_int or d.is_unsigned or d.count != 1:
        return False
    return _interval(u, {} if memo is None else memo) is not None


def _interval(u: UOp, memo: dict) -> tuple[int, int] | None:
    """(lo, hi) of a scalar signed integer value built from constants, loop ranges, launch values (their declared
    ranges), +, -, *, // and % by positive constants, max, where, and integer casts, where every value on the way
    lies in its dtype's range; else None (a loaded value, an op outside this list, a value that may pass its type).
    Saturating: never builds the huge intervals of, say, an integer power's repeated products."""
    if u in memo:
        return memo[u]
    memo[u] = None  # (an operand cycle cannot happen; this also bounds the work)
    d, res = u.dtype, None
    if d is not None and d.count == 1 and (d.is_int and not d.is_unsigned):
        lo_t, hi_t = -(1 << (d.bits - 1)), (1 << (d.bits - 1)) - 1
        op = u.op
        if op is Ops.CONST and isinstance(u.arg, int) and not isinstance(u.arg, bool):
            res = (u.arg, u.arg)
        elif op is Ops.RANGE:
            n = _interval(u.src[0], memo)
            res = (0, max(n[1] - 1, 0)) if n is not None else None
        elif op is Ops.SPECIAL and isinstance(u.arg, tuple) and isinstance(u.arg[1], int):
            res = (0, u.arg[1] - 1)
        elif op is Ops.DEFINE_VAR and isinstance(u.arg, tuple) and all(isinstance(v, int) for v in u.arg[1:]):
            res = (u.arg[1], u.arg[2])
        elif op is Ops.CAST and u.src[0].dtype is not None and u.src[0].dtype.is_int:
            res = _interval(u.src[0], memo)
        elif op is Ops.WHERE:
            a, b = _interval(u.src[1], memo), _interval(u.src[2], memo)
            res = (min(a[0], b[0]), max(a[1], b[1])) if a is not None and b is not None else None
        elif op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.IDIV, Ops.MOD) and len(u.src) == 2:
            a, b = _interval(u.src[0], memo), _interval(u.src[1], memo)
            if a is not None and b is not None:
                if op is Ops.ADD:
                    res = (a[0] + b[0], a[1] + b[1])
                elif op is Ops.SUB:
                    res = (a[0] - b[1], a[1] - b[0])
                elif op is Ops.MUL:
                    p = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
                    res = (min(p), max(p))
                elif op is Ops.MAX:
                    res = (max(a[0], b[0]), max(a[1], b[1]))
                elif b[0] == b[1] and b[0] > 0 and a[0] >= 0:  # (non-negative // and % by a positive constant)
                    res = (a[0] // b[0], a[1] // b[0]) if op is Ops.IDIV else (0, min(a[1], b[0] - 1))
        if res is not None and not (lo_t <= res[0] <= res[1] <= hi_t):
            res = None
    memo[u] = res
    return res


class LLVMRenderer:
    """Linear UOps -> LLVM IR."""

    name = "llvm"
    language = "llvm"
    # polynomial exp2/log2/sin vectorize, libm calls do not; a large matmul's operand is packed for the caches
    caps = Capabilities(vectors=True, decompose_transcendentals=True, fuse_rows=True, pack_matmul=True,
                        memory_any_width=True)

    def render(self, name: str, uops: list[UOp]) -> str:
        return _Renderer(name, uops).run()


class _Renderer:
    def __init__(self, name: str, uops: list[UOp]):
        self.name, self.uops = name, uops
        self.lines: list[str] = []
        self.allocas: list[str] = []
        self.entry: list[str] = []  # instructions of the entry block before the body (after the allocas)
        self.intervals: dict[UOp, tuple[int, int] | None] = {}  # `_interval`'s memo
        self.names: dict[UOp, str] = {}
        self.counter = 0
        self.block = "entry"
        self.loops: list[dict] = []
        self.decls: set[str] = set()
        self.range_count = 0
        self.types: dict[str, str] = {}  # an SSA value's LLVM type, for the parameters of an outlined epilogue
        self.exit_at: int | None = None  # where the lines of the current loop-exit block begin
        self.functions: list[str] = []  # outlined epilogues (`outline`), after the kernel
        # gated scalar loads as a branch around the load in kernels without a reduction loop (elementwise: a pad,
        # a concatenation, the join of a split matmul's parts): LLVM's loop vectorizer turns the branch into a
        # masked vector load of consecutive elements, where the select form (index 0 where the gate is off) is a
        # gather. Inside reductions (a padded convolution's taps) the select form stays: no branch in the hot loop.
        self.branch_loads = not any(u.op is Ops.RANGE and getattr(u.arg[1], "name", "") == "REDUCE" for u in uops)

    def tmp(self) -> str:
        self.counter += 1
        return f"%v{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append("  " + line)

    def ref(self, u: UOp) -> str:
        if u.op is Ops.CONST:
            return lconst(u.arg, u.dtype)
        return self.names[u]

    def intrinsic(self, base: str, d: DType, nargs: int = 1) -> str:
        t = ltype(d)
        fn = f"@llvm.{base}.{_suffix(d)}"
        self.decls.add(f"declare {t} {fn}({', '.join([t] * nargs)})")
        return fn

    def run(self) -> str:
        params = []
        for u in self.uops:
            if u.op is Ops.DEFINE_GLOBAL:
                self.names[u] = f"%data{u.arg}"
                self.types[self.names[u]] = "ptr"
                params.append(f"ptr noalias align {PARAM_ALIGN} %data{u.arg}")
            elif u.op is Ops.DEFINE_VAR:
                self.names[u] = f"%{u.arg if isinstance(u.arg, str) else u.arg[0]}"
                self.types[self.names[u]] = ltype(u.dtype)
                params.append(f"{ltype(u.dtype)} {self.names[u]}")
                mask = _core_mask(u)
                if mask is not None:  # the thread index, its range stated to LLVM (see _core_mask)
                    self.entry.append(f"%core = and {ltype(u.dtype)} {self.names[u]}, {mask}")
                    self.names[u] = "%core"
                    self.types["%core"] = ltype(u.dtype)
        if not any(u.op is Ops.DEFINE_VAR and (u.arg if isinstance(u.arg, str) else u.arg[0]) == "core_id"
                   for u in self.uops):  # the runtime passes the core index last (after dim variables)
            params.append("i32 %core_id")
            self.types["%core_id"] = "i32"
        for u in self.uops:
            if u.op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.CONST, Ops.SINK):
                continue
            self.render_uop(u)
            name = self.names.get(u)
            if name is not None and name.startswith("%v") and name not in self.types:
                self.types[name] = ltype(u.dtype)
        body = ["entry:"] + ["  " + a for a in self.allocas + self.entry] + self.lines + ["  ret void"]
        head = f'define void @{self.name}({", ".join(params)}) #0 {{'
        attrs = ['attributes #0 = { nounwind "prefer-vector-width"="512" "no-trapping-math"="true" }']
        if self.functions:
            attrs.append(_EPILOGUE_ATTRS)
        return "\n".join([*sorted(self.decls), "", head, *body, "}", *self.functions, "", *attrs, ""])

    def outline(self, start: int) -> None:
        """Move the lines from `start` (a loop-exit block that ends its enclosing loop's body, before the latch's
        increment) into an internal function the kernel calls there, where they are straight-line code of at least
        `OUTLINE_MIN_MEMORY_OPS` buffer loads and stores: a register tile's epilogue, run once per tile. Its reads
        of accumulators stay in the kernel (their allocas must not escape) and are passed as values, as is every
        other value it uses from the kernel; buffers keep `noalias`. The function's one block has the exit
        block's name (`needs_slp` reads it as code after a loop). Left in place otherwise."""
        run = self.lines[start:]
        if any(not ln.startswith("  ") or ln.startswith(("  br ", "  ret")) for ln in run):
            return  # not straight-line (a gated store's or load's blocks, a loop)
        acc_reads = [ln for ln in run if _ACC_READ.match(ln)]
        body = [ln for ln in run if not _ACC_READ.match(ln)]
        if any("%acc" in ln or "%local" in ln for ln in body):
            return
        if sum(1 for ln in body if _MEMORY_OP.match(ln)) < OUTLINE_MIN_MEMORY_OPS:
            return
        defined: set[str] = set()
        used: list[str] = []
        for ln in body:
            m = _DEF.match(ln)
            for v in _VALUE.findall(ln[m.end():] if m else ln):
                if v not in defined and v not in used:
                    used.append(v)
            if m:
                defined.add(m.group(1))
        if any(v not in self.types for v in used):
            return  # a value of unknown type: keep the code where it is
        fn = f"@tgc_epilogue{len(self.functions)}"
        params = ", ".join(f"{self.types[v]}{' noalias' if v.startswith('%data') else ''} {v}" for v in used)
        args = ", ".join(f"{self.types[v]} {v}" for v in used)
        self.functions += ["", f"define internal void {fn}({params}) #1 {{", f"{self.block}:", *body, "  ret void", "}"]
        self.lines[start:] = [*acc_reads, f"  call void {fn}({args})"]

    def render_uop(self, u: UOp) -> None:
        op, d = u.op, u.dtype
        if op is Ops.RANGE:
            label, var = f"loop{self.range_count}", f"%r{self.range_count}"
            self.range_count += 1
            self.emit(f"br label %{label}_head")
            self.lines.append(f"{label}_head:")
            self.names[u] = var
            phi_at = len(self.lines)
            self.emit("PHI")
            cond, t = self.tmp(), ltype(d)  # i32, or i64 in a kernel whose indices may pass 2^31
            self.emit(f"{cond} = icmp slt {t} {var}, {self.ref(u.src[0])}")
            self.emit(f"br i1 {cond}, label %{label}_body, label %{label}_exit")
            self.lines.append(f"{label}_body:")
            self.loops.append({"label": label, "phi_at": phi_at, "entry_block": self.block, "var": var, "type": t})
            self.types[var] = t
            self.block = f"{label}_body"
        elif op is Ops.ENDRANGE:
            loop = self.loops.pop()
            if self.exit_at is not None and self.block.endswith("_exit"):
                self.outline(self.exit_at)
            self.exit_at = None
            nxt = self.tmp()
            self.emit(f"{nxt} = add nuw nsw {loop['type']} {loop['var']}, 1")
            self.emit(f"br label %{loop['label']}_head")
            self.lines[loop["phi_at"]] = (f"  {loop['var']} = phi {loop['type']} [ 0, %{loop['entry_block']} ], "
                                          f"[ {nxt}, %{self.block} ]")
            self.lines.append(f"{loop['label']}_exit:")
            self.block = f"{loop['label']}_exit"
            self.exit_at = len(self.lines)
        elif op is Ops.DEFINE_ACC:
            name = f"%acc{u.arg}"
            self.names[u] = name
            self.allocas.append(f"{name} = alloca {ltype(d)}")
            self.emit(f"store {ltype(d)} {self.ref(u.src[0])}, ptr {name}")
        elif op is Ops.DEFINE_LOCAL:  # a thread's own scratch array (the CPU's work-group is one thread)
            name = f"%local{len(self.allocas)}"
            self.names[u] = name
            self.allocas.append(f"{name} = alloca [{u.arg[1]} x {mtype(d.scalar())}], align 64")
        elif op is Ops.ACCUMULATE:
            acc, v = u.src
            cur = self.tmp()
            self.emit(f"{cur} = load {ltype(d)}, ptr {self.names[acc]}")
            new = self.binary(u.arg, d, cur, self.ref(v), flags=_REASSOC)
            self.emit(f"store {ltype(d)} {new}, ptr {self.names[acc]}")
        elif op is Ops.READ_ACC:
            out = self.tmp()
            self.emit(f"{out} = load {ltype(d)}, ptr {self.names[u.src[0]]}")
            self.names[u] = out
        elif op is Ops.LOAD:
            self.names[u] = self.load(u)
        elif op is Ops.STORE:
            self.store(u)
        elif op is Ops.VECTORIZE:
            self.names[u] = self.vectorize(u)
        elif op is Ops.GEP:
            out = self.tmp()
            self.emit(f"{out} = extractelement {ltype(u.src[0].dtype)} {self.ref(u.src[0])}, i32 {u.arg}")
            self.names[u] = out
        else:
            self.names[u] = self.alu(u)

    def vectorize(self, u: UOp) -> str:
        d, scalar = u.dtype, u.dtype.scalar()
        if all(s.op is Ops.CONST for s in u.src):
            if all(s is u.src[0] for s in u.src):  # one constant in every lane: 1/16 of the text to parse
                return f"splat ({ltype(scalar)} {_scalar_const(u.src[0].arg, scalar)})"
            return "<" + ", ".join(f"{ltype(scalar)} {_scalar_const(s.arg, scalar)}" for s in u.src) + ">"
        if all(s is u.src[0] for s in u.src):  # a splat
            one, out = self.tmp(), self.tmp()
            self.emit(f"{one} = insertelement {ltype(d)} poison, {ltype(scalar)} {self.ref(u.src[0])}, i32 0")
            self.emit(f"{out} = shufflevector {ltype(d)} {one}, {ltype(d)} poison, <{d.count} x i32> zeroinitializer")
            return out
        cur = "poison"
        for i, s in enumerate(u.src):
            nxt = self.tmp()
            self.emit(f"{nxt} = insertelement {ltype(d)} {cur}, {ltype(scalar)} {self.ref(s)}, i32 {i}")
            cur = nxt
        return cur

    def splat_gate(self, gate: UOp, count: int) -> str:
        one, out = self.tmp(), self.tmp()
        self.emit(f"{one} = insertelement <{count} x i1> poison, i1 {self.ref(gate)}, i32 0")
        self.emit(f"{out} = shufflevector <{count} x i1> {one}, <{count} x i1> poison, <{count} x i32> "
                  "zeroinitializer")
        return out

    def masked(self, kind: str, d: DType) -> str:
        """`llvm.masked.load`/`store` for memory type `mtype(d)` (with the i32 alignment operand, which
        LLVM 22 still reads and upgrades)."""
        m = mtype(d)
        scalar = m.split(" x ")[1].rstrip(">")
        suffix = f"v{d.count}{'f' + str(d.itemsize * 8) if scalar in ('half', 'float', 'double') else scalar}"
        fn = f"@llvm.masked.{kind}.{suffix}.p0"
        mask = f"<{d.count} x i1>"
        self.decls.add(f"declare {m} {fn}(ptr, i32, {mask}, {m})" if kind == "load"
                       else f"declare void {fn}({m}, ptr, i32, {mask})")
        return fn

    def load(self, u: UOp) -> str:
        """A gated scalar load reads index 0 where its gate is off (in bounds: a buffer has an element) and
        selects 0; a gated vector load is a masked load, which reads nothing where its gate is off (a vector
        from index 0 could pass the end of a buffer shorter than the vector)."""
        buf, idx, it = u.src[0], self.ref(u.src[1]), ltype(u.src[1].dtype)
        gate = u.src[2] if len(u.src) > 2 else None
        d = u.dtype
        if gate is not None and d.count == 1 and self.branch_loads:
            return self.branch_load(buf, idx, it, gate, d)
        lane_gates = gate is not None and gate.dtype.count > 1
        if gate is not None and not lane_gates:
            safe = self.tmp()
            self.emit(f"{safe} = select i1 {self.ref(gate)}, {it} {idx}, {it} 0")
            idx = safe
        ptr, val = self.tmp(), self.tmp()
        # a gate per lane (a padded row's border): the masked-off lanes' addresses may lie outside the buffer,
        # never read, so the address is a plain (wrapping) getelementptr, not an inbounds one
        self.emit(f"{ptr} = getelementptr{'' if lane_gates else ' inbounds'} {mtype(d.scalar())}, "
                  f"ptr {self.ref(buf)}, {it} {idx}")
        if gate is not None and d.count > 1:
            mask = self.ref(gate) if lane_gates else self.splat_gate(gate, d.count)
            self.emit(f"{val} = call {mtype(d)} {self.masked('load', d)}(ptr {ptr}, i32 {d.itemsize}, "
                      f"<{d.count} x i1> {mask}, {mtype(d)} zeroinitializer)")
        else:
            self.emit(f"{val} = load {mtype(d)}, ptr {ptr}, align {d.itemsize}")
        if d.is_bool:
            b = self.tmp()
            self.emit(f"{b} = icmp ne {mtype(d)} {val}, zeroinitializer")
            val = b
        if gate is not None and d.count == 1:
            g = self.tmp()
            self.emit(f"{g} = select i1 {self.ref(gate)}, {ltype(d)} {val}, {ltype(d)} zeroinitializer")
            val = g
        return val

    def branch_load(self, buf: UOp, idx: str, it: str, gate: UOp, d: DType) -> str:
        """A gated scalar load in a block its gate branches to (no address formed where it is off); 0 else."""
        self.counter += 1
        label, before = f"load{self.counter}", self.block
        done = f"{label}_done"
        self.emit(f"br i1 {self.ref(gate)}, label %{label}, label %{done}")
        self.lines.append(f"{label}:")
        self.block = label
        ptr, val = self.tmp(), self.tmp()
        self.emit(f"{ptr} = getelementptr inbounds {mtype(d)}, ptr {self.ref(buf)}, {it} {idx}")
        self.emit(f"{val} = load {mtype(d)}, ptr {ptr}, align {d.itemsize}")
        if d.is_bool:
            b = self.tmp()
            self.emit(f"{b} = icmp ne {mtype(d)} {val}, zeroinitializer")
            val = b
        self.emit(f"br label %{done}")
        self.lines.append(f"{done}:")
        self.block = done
        out = self.tmp()
        self.emit(f"{out} = phi {ltype(d)} [ {val}, %{label} ], [ zeroinitializer, %{before} ]")
        return out

    def _store_operands(self, buf: UOp, idx: UOp, val: UOp, inbounds: bool) -> tuple[str, str]:
        """A store's address (`inbounds` unless masked-off lanes may lie outside the buffer) and its value as
        memory holds it (bools widened to bytes)."""
        vd, ptr = val.dtype, self.tmp()
        self.emit(f"{ptr} = getelementptr{' inbounds' if inbounds else ''} {mtype(vd.scalar())}, "
                  f"ptr {self.ref(buf)}, {ltype(idx.dtype)} {self.ref(idx)}")
        v = self.ref(val)
        if vd.is_bool:
            z = self.tmp()
            self.emit(f"{z} = zext {ltype(vd)} {v} to {mtype(vd)}")
            v = z
        return ptr, v
    def store(self, u: UOp) -> None:
        """A gated store (a fourth source) runs in a block its gate branches to: nothing is written, and no
        address is formed, where the gate is off."""
        buf, idx, val = u.src[:3]
        gate = u.src[3] if len(u.src) > 3 else None
        vd = val.dtype
        if gate is not None and gate.dtype.count > 1:  # a gate per lane: a masked store (nothing where it is off)
            ptr, v = self._store_operands(buf, idx, val, inbounds=False)
            self.emit(f"call void {self.masked('store', vd)}({mtype(vd)} {v}, ptr {ptr}, "
                      f"i32 {vd.itemsize}, <{vd.count} x i1> {self.ref(gate)})")
            return
        done = ""
        if gate is not None:
            label = f"store{self.counter + 1}"
            self.counter += 1
            done = f"{label}_done"
            self.emit(f"br i1 {self.ref(gate)}, label %{label}, label %{done}")
            self.lines.append(f"{label}:")
        ptr, v = self._store_operands(buf, idx, val, inbounds=True)
        self.emit(f"store {mtype(vd)} {v}, ptr {ptr}, align {vd.itemsize}")
        if gate is not None:
            self.emit(f"br label %{done}")
            self.lines.append(f"{done}:")
            self.block = done

    def binary(self, op: Ops, d: DType, a: str, b: str, flags: str = "", int_flags: str = "") -> str:
        t, out = ltype(d), self.tmp()
        fl = d.is_float
        if d.is_bool and op in (Ops.ADD, Ops.MAX):
            op = Ops.OR
        elif d.is_bool and op is Ops.MUL:
            op = Ops.AND
        if op in (Ops.ADD, Ops.SUB, Ops.MUL):
            name = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul"}[op]
            if fl and op is Ops.MUL and not flags:
                flags = _CONTRACT  # a product may fuse into an accumulate that allows it (see _CONTRACT)
            self.emit(f"{out} = f{name} {flags}{t} {a}, {b}" if fl else f"{out} = {name} {int_flags}{t} {a}, {b}")
        elif op is Ops.FDIV:
            self.emit(f"{out} = fdiv {t} {a}, {b}")
        elif op is Ops.IDIV:
            self.emit(f"{out} = {'udiv' if d.is_unsigned else 'sdiv'} {t} {a}, {b}")
        elif op is Ops.MOD:
            self.emit(f"{out} = {'frem' if fl else 'urem' if d.is_unsigned else 'srem'} {t} {a}, {b}")
        elif op is Ops.MAX:
            fn = self.intrinsic("maximum" if fl else ("umax" if d.is_unsigned else "smax"), d, 2)
            self.emit(f"{out} = call {'nsz ' if fl else ''}{t} {fn}({t} {a}, {t} {b})")  # never nnan (_REASSOC)
        elif op in (Ops.AND, Ops.OR, Ops.XOR):
            self.emit(f"{out} = {op.name.lower()} {t} {a}, {b}")
        elif op in (Ops.SHL, Ops.SHR):
            # shifting by the width or more gives 0 (or the sign) instead of LLVM's poison
            inst = "shl" if op is Ops.SHL else ("lshr" if d.is_unsigned else "ashr")
            big, clamped, raw = self.tmp(), self.tmp(), self.tmp()
            cond_t = ltype(dtypes.bool.vec(d.count))
            self.emit(f"{big} = icmp uge {t} {b}, {lconst(d.bits, d)}")
            self.emit(f"{clamped} = select {cond_t} {big}, {t} {lconst(d.bits - 1, d)}, {t} {b}")
            self.emit(f"{raw} = {inst} {t} {a}, {clamped}")
            if inst == "ashr":
                return raw
            self.emit(f"{out} = select {cond_t} {big}, {t} zeroinitializer, {t} {raw}")
        else:
            raise NotImplementedError(op)
        return out

    def alu(self, u: UOp) -> str:
        op, d = u.op, u.dtype
        srcs = [self.ref(s) for s in u.src]
        if op in (Ops.ADD, Ops.MUL, Ops.SUB, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL,
                  Ops.SHR):
            return self.binary(op, d, *srcs, int_flags="nsw " if _no_signed_wrap(u, self.intervals) else "")
        out = self.tmp()
        t = ltype(d)
        if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
            sd = u.src[0].dtype
            st = ltype(sd)
            if sd.is_float:
                pred = {Ops.CMPLT: "olt", Ops.CMPNE: "une", Ops.CMPEQ: "oeq"}[op]
                self.emit(f"{out} = fcmp {pred} {st} {srcs[0]}, {srcs[1]}")
            else:
                lt = "ult" if sd.is_unsigned or sd.is_bool else "slt"
                pred = {Ops.CMPLT: lt, Ops.CMPNE: "ne", Ops.CMPEQ: "eq"}[op]
                self.emit(f"{out} = icmp {pred} {st} {srcs[0]}, {srcs[1]}")
        elif op is Ops.NEG:
            self.emit(f"{out} = fneg {t} {srcs[0]}" if d.is_float else f"{out} = sub {t} zeroinitializer, {srcs[0]}")
        elif op is Ops.NOT:
            self.emit(f"{out} = xor {t} {srcs[0]}, {lconst(True if d.is_bool else -1, d)}")
        elif op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC):
            fn = self.intrinsic(op.name.lower(), d)
            self.emit(f"{out} = call {t} {fn}({t} {srcs[0]})")
        elif op is Ops.RECIP:
            self.emit(f"{out} = fdiv {t} {lconst(1.0, d)}, {srcs[0]}")
        elif op is Ops.WHERE:
            self.emit(f"{out} = select {ltype(u.src[0].dtype)} {srcs[0]}, {t} {srcs[1]}, {t} {srcs[2]}")
        elif op is Ops.CAST:
            return self.cast(u.src[0].dtype, d, srcs[0])
        elif op is Ops.BITCAST:
            sd = u.src[0].dtype
            if sd.is_bool or d.is_bool:
                return self.cast(sd, d, srcs[0])
            self.emit(f"{out} = bitcast {ltype(sd)} {srcs[0]} to {t}")
        else:
            raise NotImplementedError(f"LLVM renderer: {op}")
        return out

    def cast(self, s: DType, d: DType, v: str) -> str:
        if s == d:
            return v
        st, dt = ltype(s), ltype(d)
        out = self.tmp()
        if d.is_bool:
            if s.is_float and s.name != "bf16":
                self.emit(f"{out} = fcmp une {st} {v}, zeroinitializer")
            else:
                self.emit(f"{out} = icmp ne {st} {v}, zeroinitializer")
            return out
        if s.name == "bf16":  # bits -> f32 (legalize guarantees d is f32)
            w, sh = self.tmp(), self.tmp()
            i32 = _vec("i32", d)
            self.emit(f"{w} = zext {st} {v} to {i32}")
            self.emit(f"{sh} = shl {i32} {w}, {_vec_lit(16, 'i32', d)}")
            self.emit(f"{out} = bitcast {i32} {sh} to {dt}")
            return out
        if d.name == "bf16":  # f32 -> bits, rounding to nearest even; nan stays nan
            i32, i16 = _vec("i32", d), _vec("i16", d)
            bits, lsb, bias, added, added2, top, tr, isnan = (self.tmp() for _ in range(8))
            self.emit(f"{bits} = bitcast {st} {v} to {i32}")
            self.emit(f"{lsb} = lshr {i32} {bits}, {_vec_lit(16, 'i32', d)}")
            self.emit(f"{bias} = and {i32} {lsb}, {_vec_lit(1, 'i32', d)}")
            self.emit(f"{added} = add {i32} {bits}, {_vec_lit(32767, 'i32', d)}")
            self.emit(f"{added2} = add {i32} {added}, {bias}")
            self.emit(f"{top} = lshr {i32} {added2}, {_vec_lit(16, 'i32', d)}")
            self.emit(f"{tr} = trunc {i32} {top} to {i16}")
            self.emit(f"{isnan} = fcmp uno {st} {v}, zeroinitializer")
            self.emit(f"{out} = select {_vec('i1', d)} {isnan}, {i16} {_vec_lit(32704, 'i16', d)}, {i16} {tr}")
            return out
        if s.is_bool:
            self.emit(f"{out} = uitofp {st} {v} to {dt}" if d.is_float else f"{out} = zext {st} {v} to {dt}")
        elif s.is_float and d.is_float:
            self.emit(f"{out} = {'fpext' if d.itemsize > s.itemsize else 'fptrunc'} {st} {v} to {dt}")
        elif s.is_float:
            fn = f"@llvm.fpto{'u' if d.is_unsigned else 's'}i.sat.{_suffix(d)}.{_suffix(s)}"
            self.decls.add(f"declare {dt} {fn}({st})")
            self.emit(f"{out} = call {dt} {fn}({st} {v})")
        elif d.is_float:
            self.emit(f"{out} = {'uitofp' if s.is_unsigned else 'sitofp'} {st} {v} to {dt}")
        elif d.itemsize == s.itemsize:
            return v
        elif d.itemsize < s.itemsize:
            self.emit(f"{out} = trunc {st} {v} to {dt}")
        else:
            self.emit(f"{out} = {'zext' if s.is_unsigned else 'sext'} {st} {v} to {dt}")
        return out


def _vec_lit(value: int, base: str, like: DType) -> str:
    return f"splat ({base} {value})" if like.count > 1 else str(value)
