"""One C-style renderer for GPU-shaped devices, with dialects for OpenCL C, CUDA C and Metal.

Every linear UOp becomes one line; a dialect supplies the kernel signature, index builtins, type names,
math function names and how half floats are stored. Half floats (f16, bf16) are floats in registers
and converted only at loads, stores and casts, so devices without half arithmetic (PoCL) work too.
"""

from __future__ import annotations

import math
import struct
from dataclasses import replace

from tgc.capabilities import Capabilities
from tgc.codegen.opt import ASYNC_COPY, ASYNC_FIRST, ASYNC_NEXT
from tgc.dtype import DType, dtypes
from tgc.errors import CompileError
from tgc.ir import alu
from tgc.ir.uop import Ops, UOp

_BINARY_SYMBOLS = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.FDIV: "/", Ops.IDIV: "/", Ops.MOD: "%",
                   Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^"}


class CStyleRenderer:
    """The shared C renderer. Subclasses are dialects; the defaults are OpenCL C's."""

    name = "c"
    language = "c"
    kernel_prefix = "__kernel void"
    global_qualifier = "__global"
    local_qualifier = "__local"
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    # launch limits checked by every opt (tgc.codegen.opt.launch_limits): OpenCL's guaranteed minimums.
    # Work-group and work-item indices are `int` in the kernel, so the grid is at most 2^31 - 1 groups wide
    # (a larger launch is refused); addresses past 2^31 use 64-bit math instead.
    max_threads_per_block = 256
    max_shared_bytes = 32768
    max_grid = (2**31 - 1, 65535, 65535)
    # Contraction into fma happens only where tgc writes one (`fma_fn`, a reduction's multiply-accumulate, as on
    # the CPU): an elementwise `x * s - max(x * s)` fused by the compiler rounds the product differently from the
    # same product elsewhere, and a softmax of large logits became nan. OpenCL C contracts by default
    # (FP_CONTRACT ON), so the prelude turns it off; NVRTC gets `--fmad=false`, Metal `-fno-fast-math`.
    contract_off = "#pragma OPENCL FP_CONTRACT OFF"
    # lanes of a warp shuffle (`Ops.SHUFFLE`); 0: none rendered, work-group reductions use a shared-memory tree
    # (OpenCL's sub-group size is not known when the kernel is written, and PoCL declares no cl_khr_subgroups)
    shuffle_width = 0
    fma_fn = "fma"

    @property
    def caps(self) -> Capabilities:
        """GPU launches within this dialect's limits (above); no vector UOps, the device's own transcendentals."""
        return Capabilities(launch="gpu", fuse_rows=False, max_threads_per_block=self.max_threads_per_block,
                            max_shared_bytes=self.max_shared_bytes, max_grid=self.max_grid[0],
                            shuffle_width=self.shuffle_width)
    float_suffix = "f"
    # index builtins by SPECIAL name prefix
    group_index = "get_group_id({})"
    local_index = "get_local_id({})"
    types = {"bool": "bool", "i8": "char", "u8": "uchar", "i16": "short", "u16": "ushort", "i32": "int",
             "u32": "uint", "i64": "long", "u64": "ulong", "f16": "float", "bf16": "float", "f32": "float",
             "f64": "double"}
    # how each dtype is held in memory (bools are bytes; half floats per dialect)
    mem_types = {"bool": "uchar", "f16": "half", "bf16": "ushort"}

    def ctype(self, d: DType) -> str:
        return self.types[d.name] + (str(d.count) if d.count > 1 else "")  # float4: a 16-byte load (STAGE's copies)

    def vector_load(self, d: DType, buf: str, idx: str) -> str:
        """`d.count` adjacent elements from `buf[idx]`, `idx` a multiple of the count (`opt.stage_tiles` checks)."""
        return f"vload{d.count}(0, {buf} + {idx})"

    def mtype(self, d: DType) -> str:
        return self.mem_types.get(d.name, self.types[d.name])

    # ---- pieces a dialect may override
    def prelude(self, uops: list[UOp]) -> list[str]:
        lines = [self.contract_off] if self.contract_off else []
        if any(u.dtype is not None and u.dtype.name == "f64" for u in uops):
            lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
        lines += [
            "inline float tg_f16(float x) { ushort b; vstore_half(x, 0, (half*)&b); return vload_half(0, (half*)&b); }",
            "inline ushort tg_f16_bits(float x) { ushort b; vstore_half(x, 0, (half*)&b); return b; }",
            "inline float tg_bits_f16(ushort b) { return vload_half(0, (half*)&b); }",
            "inline ushort tg_f2bf(float x) { uint u = as_uint(x); if (isnan(x)) return (ushort)0x7fc0;"
            " return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }",
            "inline float tg_bf2f(ushort h) { return as_float(((uint)h) << 16); }",
        ]
        return lines

    def param(self, u: UOp, written: bool) -> str:
        const = "" if written else "const "
        return f"{self.global_qualifier} {const}{self.mtype(u.dtype)}* restrict data{u.arg}"

    def signature(self, name: str, params: list[str], uops: list[UOp]) -> str:
        return f"{self.kernel_prefix} {name}({', '.join(params)})"

    # Half floats are floats in registers, converted where memory holds them by two functions per type: (16 bits
    # -> float, float -> 16 bits); bools are bytes. `u16` and `u8` write a cast to those storage types. A dialect
    # that reads, writes or converts a half otherwise says how in `half_special`: (what, dtype name) -> a template
    # over the buffer {b}, index {i} and value {v}.
    half_fns = {"f16": ("tg_bits_f16", "tg_f16_bits"), "bf16": ("tg_bf2f", "tg_f2bf")}
    u16, u8 = "(ushort)({})", "(uchar)({})"
    half_special = {("load", "f16"): "vload_half({i}, {b})", ("store", "f16"): "vstore_half({v}, {i}, {b});",
                    ("round", "f16"): "tg_f16({v})"}

    def _half(self, what: str, d: DType, default: str, **parts: str) -> str:
        t = self.half_special.get((what, d.name))
        return t.format(**parts) if t is not None else default

    def load(self, d: DType, buf: str, idx: str) -> str:
        if d.is_bool:
            return f"({buf}[{idx}] != 0)"
        if d.name not in self.half_fns:
            return f"{buf}[{idx}]"
        return self._half("load", d, f"{self.half_fns[d.name][0]}({buf}[{idx}])", b=buf, i=idx)

    def store(self, d: DType, buf: str, idx: str, val: str) -> str:
        if d.is_bool:
            return f"{buf}[{idx}] = {self.u8.format(val)};"
        if d.name not in self.half_fns:
            return f"{buf}[{idx}] = {val};"
        return self._half("store", d, f"{buf}[{idx}] = {self.half_fns[d.name][1]}({val});", b=buf, i=idx, v=val)

    def round_half(self, d: DType, val: str) -> str:
        """A float value rounded to the precision of f16 or bf16."""
        to_float, to_half = self.half_fns[d.name]
        return self._half("round", d, f"{to_float}({to_half}({val}))", v=val)

    def half_bits(self, d: DType, x: str) -> str:
        """The 16 storage bits of a half value held as a float."""
        return self._half("bits", d, f"{self.half_fns[d.name][1]}({x})", v=x)

    def half_from_bits(self, d: DType, bits: str) -> str:
        return self._half("from_bits", d, f"{self.half_fns[d.name][0]}({self.u16.format(bits)})", v=bits)

    def math(self, op: Ops, d: DType, x: str) -> str:
        fn = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc"}[op]
        return f"{fn}({x})"

    def fmax(self, d: DType, a: str, b: str) -> str:
        """Integer MAX (a float MAX is `combine`'s nan-propagating select)."""
        return f"max({a}, {b})"

    def fmod(self, d: DType, a: str, b: str) -> str:
        """Float MOD: C's fmod (exact, the dividend's sign)."""
        return f"fmod({a}, {b})"

    def exp2_flushed(self, d: DType, x: str) -> str:
        """f32 exp2 with results below 2**-126 as 0, the CPU's polynomial semantics (`transcendental.exp2_f32`):
        exp2(x) < 2**-126 exactly where x < -126; nan and -inf go the same way as there."""
        return f"(({x}) < {self.literal(-126.0, d)} ? {self.literal(0.0, d)} : {self.math(Ops.EXP2, d, x)})"

    cast_fmt = "convert_{t}({x})"  # a value `x` converted to the type `t`
    bitcast_fmt = "as_{t}({x})"  # the bits of `x` read as the type `t`

    def bitcast(self, src: DType, d: DType, x: str) -> str:
        if src.is_bool or d.is_bool:  # a bool has no bits of a fixed width: a conversion
            return self.cast(src, d, x)
        return self.bitcast_fmt.format(t=self.ctype(d), x=x)

    def cast(self, src: DType, d: DType, x: str) -> str:
        return self.cast_fmt.format(t=self.ctype(d), x=x) if not d.is_bool else f"({x} != 0)"

    def literal(self, value, d: DType) -> str:
        """A constant as an operand: a negative one (`-5.5f`, `-0.0f`, `-INFINITY`, `-3`) in parentheses, so that
        no operator before it can fuse with its sign (`-` then `-5.5f` would be `--5.5f`, a decrement)."""
        text = self.const(value, d)
        return f"({text})" if text.startswith("-") else text

    def const(self, value, d: DType) -> str:
        if d.is_bool:
            return "true" if value else "false"
        if d.is_int:
            v = int(value)
            if d.bits == 64:
                if d.is_unsigned:
                    return f"{v}ul"
                return f"{v}l" if v != -(1 << 63) else f"({v + 1}l - 1l)"
            if d.is_unsigned:
                return f"{v}u"
            return str(v) if v != -(1 << 31) else f"({v + 1} - 1)"
        return self.float_const(float(value), d)

    def float_const(self, v: float, d: DType) -> str:
        suffix = "" if d.name == "f64" else self.float_suffix
        if d.name in ("f16", "bf16"):  # registers hold floats: a half constant is its value rounded to the half
            v = float(alu.cast(alu.const(v, d), d, dtypes.f32))
        if not math.isfinite(v):  # NAN and INFINITY are floats: an f64 one is cast (fmod(double, float) is ambiguous)
            text = "NAN" if math.isnan(v) else "INFINITY" if v > 0 else "-INFINITY"
            return f"((double){text})" if d.name == "f64" else text
        if d.name != "f64":
            v = struct.unpack("f", struct.pack("f", v))[0]
        return f"{v!r}{suffix}" if "e" in repr(v) or "." in repr(v) else f"{v!r}.0{suffix}"

    def special(self, name: str) -> str:
        kind, axis = name[:4], int(name[-1])
        return (self.group_index if kind == "gidx" else self.local_index).format(axis)

    # ---- the walk
    def render(self, name: str, uops: list[UOp]) -> str:
        written = {u.src[0] for u in uops if u.op is Ops.STORE}
        params, lines = [], []
        names: dict[UOp, str] = {}
        depth = 1
        counter = 0

        def ref(u: UOp) -> str:
            if u.op is Ops.CONST:
                return self.literal(u.arg, u.dtype)
            return names[u]

        def line(text: str) -> None:
            lines.append("  " * depth + text)

        def guard(store: UOp, stmt: str) -> str:
            """A gated store (a fourth source) writes only where its gate is on."""
            return f"if ({ref(store.src[3])}) {{ {stmt} }}" if len(store.src) > 3 else stmt

        def define(u: UOp, expr: str) -> None:
            nonlocal counter
            counter += 1
            var = f"v{counter}"
            names[u] = var
            line(f"{self.ctype(u.dtype)} {var} = {expr};")

        for u in uops:
            if u.op is Ops.DEFINE_GLOBAL:
                names[u] = f"data{u.arg}"
                params.append(self.param(u, u in written))
            elif u.op is Ops.DEFINE_VAR:
                names[u] = u.arg[0] if isinstance(u.arg, tuple) else str(u.arg)
                params.append(f"int {names[u]}")
        fused = self._fused_products(uops)  # products written as the fma of the accumulate that uses them
        # STAGE's asynchronous tile copies (`opt.stage_tiles`): the 4-lane LOAD is the copy's source address only
        copies = {u.src[2] for u in uops if is_async_copy(u)}
        ahead = any(u.arg == ASYNC_NEXT for u in uops if is_async_copy(u))  # copies issued a step ahead
        last_copy = None  # the kind of the last asynchronous copy rendered (each kind its own group)
        for u in uops:
            op, d = u.op, u.dtype
            if op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.CONST, Ops.SINK):
                continue
            if u in fused:
                names[u] = ", ".join(ref(s) for s in u.src)  # the fma's first two arguments
                continue
            if op is Ops.SPECIAL:  # always i32 (tgc.codegen.index), cast to i64 in a wide kernel
                names[u] = u.arg[0]
                line(f"int {u.arg[0]} = {self.special(u.arg[0])}; /* {u.arg[1]} */")
            elif op is Ops.RANGE:
                var = f"ridx{u.arg[0]}"
                names[u] = var
                line(f"for ({self.ctype(d)} {var} = 0; {var} < {ref(u.src[0])}; {var}++) {{")
                depth += 1
            elif op is Ops.ENDRANGE:
                depth -= 1
                line("}")
            elif op is Ops.DEFINE_ACC:
                var = f"acc{u.arg}"
                names[u] = var
                line(f"{self.ctype(d)} {var} = {ref(u.src[0])};")
            elif op is Ops.ACCUMULATE and u.src[1] in fused:
                acc = names[u.src[0]]
                line(f"{acc} = {self.fma(d, ref(u.src[1]), acc)};")
            elif op is Ops.ACCUMULATE:
                acc, v = names[u.src[0]], ref(u.src[1])
                line(f"{acc} = {self.combine(u.arg, d, acc, v)};")
            elif op is Ops.READ_ACC:
                define(u, names[u.src[0]])
            elif op is Ops.DEFINE_LOCAL:
                names[u] = u.arg[0]
                line(self.define_local(u.arg[0], self.ctype(d), int(u.arg[1]), uops))
            elif op is Ops.BARRIER:
                if copies:  # a thread's own copies land before the barrier publishes the tile
                    line(self.async_copy_wait(1 if ahead else 0))
                    last_copy = None
                line(self.barrier)
            elif op is Ops.SHUFFLE:
                define(u, self.shuffle(ref(u.src[0]), int(u.arg)))
            elif op is Ops.GEP:
                define(u, f"{ref(u.src[0])}.{'xyzw'[u.arg]}")
            elif op is Ops.MMA:
                define(u, self.mma(str(u.arg), [ref(s) for s in u.src]))
            elif u in copies:
                names[u] = f"{names[u.src[0]]} + {ref(u.src[1])}"
            elif is_async_copy(u):
                if last_copy is not None and u.arg != last_copy:  # the first step's copies: a group of their own
                    line(self.async_copy_commit())
                last_copy = u.arg
                line(guard(u, self.async_copy(f"{names[u.src[0]]} + {ref(u.src[1])}", ref(u.src[2]),
                                              u.src[2].dtype.itemsize * u.src[2].dtype.count)))
            elif op is Ops.LOAD and d.count > 1:
                define(u, self.vector_load(d, names[u.src[0]], ref(u.src[1])))
            elif op is Ops.LOAD and u.src[0].op is Ops.DEFINE_LOCAL:
                define(u, f"{names[u.src[0]]}[{ref(u.src[1])}]")
            elif op is Ops.STORE and u.src[0].op is Ops.DEFINE_LOCAL:
                line(guard(u, f"{names[u.src[0]]}[{ref(u.src[1])}] = {ref(u.src[2])};"))
            elif op is Ops.LOAD:
                buf, idx = names[u.src[0]], ref(u.src[1])
                expr = self.load(d, buf, idx)
                if len(u.src) > 2:
                    expr = f"({ref(u.src[2])} ? {expr} : {self.literal(0, d)})"
                define(u, expr)
            elif op is Ops.STORE:
                line(guard(u, self.store(u.src[2].dtype, names[u.src[0]], ref(u.src[1]), ref(u.src[2]))))
            else:
                define(u, self.alu(u, [ref(s) for s in u.src]))
        body = [self.signature(name, params, uops) + " {", *lines, "}"]
        return "\n".join(self.prelude(uops) + [""] + body) + "\n"

    def shuffle(self, value: str, offset: int) -> str:
        """The value of lane `lane ^ offset` of the warp (only dialects with `shuffle_width`)."""
        raise CompileError(f"the {self.name} dialect renders no warp shuffle (a tgc bug)")

    def mma(self, kind: str, args: list[str]) -> str:
        """A warp's m16n8k16 multiply (`Ops.MMA`; only dialects with tensor cores)."""
        raise CompileError(f"the {self.name} dialect renders no tensor-core multiply (a tgc bug)")

    def async_copy(self, dst: str, src: str, nbytes: int) -> str:
        """A copy of `nbytes` from global to shared memory issued without waiting (only dialects with
        `async_copy`)."""
        raise CompileError(f"the {self.name} dialect renders no asynchronous copy (a tgc bug)")

    def async_copy_commit(self) -> str:
        """Close this thread's asynchronous copies issued since the last commit into one group."""
        raise CompileError(f"the {self.name} dialect renders no asynchronous copy (a tgc bug)")

    def async_copy_wait(self, pending: int) -> str:
        """Commit, then wait for this thread's asynchronous copies but those of the last `pending` groups."""
        raise CompileError(f"the {self.name} dialect renders no asynchronous copy (a tgc bug)")

    def define_local(self, name: str, ctype: str, count: int, uops: list[UOp]) -> str:
        """The declaration of a shared array of `count` elements."""
        return f"{self.local_qualifier} {ctype} {name}[{count}];"

    @staticmethod
    def _fused_products(uops: list[UOp]) -> set[UOp]:
        """Float products whose only use is a sum reduction's accumulate: rendered as one fma there."""
        uses: dict[UOp, int] = {}
        for u in uops:
            for s in u.src:
                uses[s] = uses.get(s, 0) + 1
        return {u.src[1] for u in uops
                if u.op is Ops.ACCUMULATE and u.arg is Ops.ADD and u.dtype is not None and u.dtype.is_float
                and u.src[1].op is Ops.MUL and u.src[1].dtype == u.dtype and uses.get(u.src[1]) == 1}

    def fma(self, d: DType, product_args: str, acc: str) -> str:
        """`a * b + acc` rounded once (`product_args` is "a, b")."""
        return f"{self.fma_fn}({product_args}, {acc})"

    def combine(self, op: Ops, d: DType, a: str, b: str) -> str:
        if op is Ops.ADD:
            return f"({a} || {b})" if d.is_bool else f"({a} + {b})"
        if op is Ops.MUL:
            return f"({a} && {b})" if d.is_bool else f"({a} * {b})"
        if d.is_float:  # numpy's maximum: a nan on either side wins (C's fmax drops it); operands are names
            return f"((({a}) > ({b}) || ({a}) != ({a})) ? ({a}) : ({b}))"  # or literals, so no double evaluation
        return f"({a} || {b})" if d.is_bool else self.fmax(d, a, b)

    def alu(self, u: UOp, s: list[str]) -> str:
        op, d = u.op, u.dtype
        if op in (Ops.ADD, Ops.MUL) and d.is_bool:
            return self.combine(op, d, *s)
        if op is Ops.MOD and d.is_float:
            return self.fmod(d, *s)
        if op in _BINARY_SYMBOLS:
            return f"({s[0]} {_BINARY_SYMBOLS[op]} {s[1]})"
        if op is Ops.MAX and d.is_float and u.src[0].op is Ops.CONST and isinstance(u.src[0].arg, (int, float)):
            # a literal on the left: its `a != a` is a constant (PoCL warns of `||` with one)
            if u.src[0].arg != u.src[0].arg:
                return s[0]  # nan wins
            return f"((({s[0]}) > ({s[1]})) ? ({s[0]}) : ({s[1]}))"  # (a nan b fails the test: b wins)
        if op is Ops.MAX:
            return self.combine(op, d, *s)
        if op in (Ops.SHL, Ops.SHR):
            bits = d.bits
            sym = "<<" if op is Ops.SHL else ">>"
            big = "0" if op is Ops.SHL or d.is_unsigned else f"({s[0]} >> {bits - 1})"
            return f"(({s[1]}) >= {bits} ? {big} : ({s[0]} {sym} {s[1]}))"
        if op is Ops.NEG:
            return f"(-{s[0]})"
        if op is Ops.NOT:
            return f"(!{s[0]})" if d.is_bool else f"(~{s[0]})"
        if op is Ops.EXP2 and d.name == "f32":
            return self.exp2_flushed(d, s[0])
        if op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC):
            return self.math(op, d, s[0])
        if op is Ops.RECIP:
            return f"({self.literal(1.0, d)} / {s[0]})"
        if op is Ops.WHERE:
            return f"({s[0]} ? {s[1]} : {s[2]})"
        if op is Ops.CAST:
            src = u.src[0].dtype
            if d.name in ("f16", "bf16"):  # registers hold floats: rounding is the whole cast
                return self.round_half(d, s[0] if src.is_float else f"(float)({s[0]})")
            if src.name in ("f16", "bf16"):
                return s[0] if d.name == "f32" else self.cast(src, d, s[0])
            if src.is_bool and not d.is_bool:
                return f"(({self.ctype(d)})({s[0]} ? 1 : 0))"
            return self.cast(src, d, s[0])
        if op is Ops.BITCAST:
            src = u.src[0].dtype
            if src.name in ("f16", "bf16") or d.name in ("f16", "bf16"):
                bits = self.half_bits(src, s[0]) if src.name in ("f16", "bf16") else f"({self.ctype(src)})({s[0]})"
                return self.half_from_bits(d, bits) if d.name in ("f16", "bf16") else f"(({self.ctype(d)})({bits}))"
            return self.bitcast(src, d, s[0])
        raise NotImplementedError(f"{self.name} renderer: {op}")


class OpenCLRenderer(CStyleRenderer):
    name = "opencl"

    def fmax(self, d: DType, a: str, b: str) -> str:
        # OpenCL's integer max has one overload per type: narrow ints need both sides of that type
        return f"max(({self.ctype(d)})({a}), ({self.ctype(d)})({b}))"

    def alu(self, u: UOp, s: list[str]) -> str:
        # PoCL compiles `c ? -0.0f : x` with c = x < 0 (or 0 < x) as a min/max that gives -0.0 for x = +0.0
        # (where(x < 0, -0.0, x) was -0.0 at 0.0, numpy 0.0); the builtin select keeps the choice exact
        if (u.op is Ops.WHERE and u.dtype.is_float and u.dtype.count == 1
                and any(a.op is Ops.CONST and a.arg == 0 and math.copysign(1.0, a.arg) < 0 for a in u.src[1:])):
            return f"select({s[2]}, {s[1]}, ({'long' if u.dtype.name == 'f64' else 'int'})({s[0]}))"
        return super().alu(u, s)

    def cast(self, src: DType, d: DType, x: str) -> str:
        if d.is_bool:
            return f"({x} != 0)"
        if src.is_float and not d.is_float:
            return f"convert_{self.ctype(d)}_sat_rtz({x})"  # defined for out-of-range and nan
        return f"({self.ctype(d)})({x})"


# f16/bf16 <-> f32 conversions for CUDA C by inline PTX (NVRTC has no cuda_fp16.h without the toolkit headers)
HALF_HELPERS = r"""
__device__ __forceinline__ float tgc_half2float(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short tgc_float2half(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float tgc_bf162float(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ unsigned short tgc_float2bf16(float f) {
  unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
"""


# `Ops.MMA` on CUDA: the lane's fragments packed two halves to a .b32 register (the lower index in the low half),
# `mma.sync.aligned.m16n8k16.row.col.f32.<t>.<t>.f32` with C = 0 (tests/cuda_standin.py removes these for the stand-in,
# whose kernel.h emulates them)
MMA_HELPERS = "\n".join(
    f"""__device__ __forceinline__ unsigned tgc_pack_{t}(float lo, float hi) {{
  return (unsigned)tgc_float2{cvt}(lo) | ((unsigned)tgc_float2{cvt}(hi) << 16); }}
__device__ __forceinline__ float4 tgc_mma_{t}(float a0, float a1, float a2, float a3, float a4, float a5, float a6,
    float a7, float b0, float b1, float b2, float b3) {{
  float d0, d1, d2, d3;
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, "
               "{{%10, %10, %10, %10}};" : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
               : "r"(tgc_pack_{t}(a0, a1)), "r"(tgc_pack_{t}(a2, a3)), "r"(tgc_pack_{t}(a4, a5)),
                 "r"(tgc_pack_{t}(a6, a7)), "r"(tgc_pack_{t}(b0, b1)), "r"(tgc_pack_{t}(b2, b3)), "f"(0.0f));
  return make_float4(d0, d1, d2, d3); }}""" for t, cvt in (("f16", "half"), ("bf16", "bf16")))


# STAGE's tile copies on sm_80+ (`opt.stage_tiles` with caps `async_copy`): `cp.async.cg` moves 16 bytes from global
# to shared memory without a register (and past L1); `cp.async.commit_group` closes this thread's copies issued
# since the last commit into a group, `cp.async.wait_group N` waits for all its groups but the N most recent; the
# barrier after the wait publishes everyone's. tests/cuda_standin.py swaps these for kernel.h's.
CP_ASYNC_HELPERS = """__device__ __forceinline__ void tgc_cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" ::
               "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src) : "memory"); }
__device__ __forceinline__ void tgc_cp_async_commit() { asm volatile("cp.async.commit_group;\\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void tgc_cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\\n" :: "n"(N) : "memory"); }"""


def is_async_copy(u: UOp) -> bool:
    """A STORE to shared memory that STAGE issues as an asynchronous copy of the LOAD it stores."""
    return u.op is Ops.STORE and u.arg in (ASYNC_COPY, ASYNC_FIRST, ASYNC_NEXT) and u.src[0].op is Ops.DEFINE_LOCAL


class CUDARenderer(CStyleRenderer):
    name = "cuda"
    kernel_prefix = 'extern "C" __global__ void'
    global_qualifier = ""
    local_qualifier = "__shared__"
    barrier = "__syncthreads();"
    group_index = "blockIdx.{}"
    local_index = "threadIdx.{}"
    max_threads_per_block = 1024
    max_shared_bytes = 48 * 1024  # static __shared__ arrays; more needs dynamic shared memory
    shuffle_width = 32

    @property
    def caps(self) -> Capabilities:
        """The C dialects' caps, with tensor cores and asynchronous copies (`mma.sync` and `cp.async` need sm_80:
        `CUDADevice.caps` drops both for an older architecture)."""
        return replace(super().caps, tensor_cores=True, async_copy=True)
    types = {**CStyleRenderer.types, "i8": "signed char", "u8": "unsigned char", "u16": "unsigned short",
             "u32": "unsigned int", "i64": "long long", "u64": "unsigned long long"}
    mem_types = {"bool": "unsigned char", "f16": "unsigned short", "bf16": "unsigned short"}

    def special(self, name: str) -> str:
        return (self.group_index if name.startswith("gidx") else self.local_index).format("xyz"[int(name[-1])])

    def shuffle(self, value: str, offset: int) -> str:
        return f"__shfl_xor_sync(0xffffffffu, {value}, {offset})"

    def vector_load(self, d: DType, buf: str, idx: str) -> str:
        return f"*reinterpret_cast<const {self.ctype(d)}*>({buf} + {idx})"

    def mma(self, kind: str, args: list[str]) -> str:
        return f"tgc_mma_{kind}({', '.join(args)})"

    def async_copy(self, dst: str, src: str, nbytes: int) -> str:
        if nbytes != 16:
            raise CompileError(f"cp.async of {nbytes} bytes: tgc issues only 16-byte copies (a tgc bug)")
        return f"tgc_cp_async16({dst}, {src});"

    def async_copy_commit(self) -> str:
        return "tgc_cp_async_commit();"

    def async_copy_wait(self, pending: int) -> str:
        return f"tgc_cp_async_commit(); tgc_cp_async_wait_group<{pending}>();"

    def prelude(self, uops: list[UOp]) -> list[str]:
        return [
            "#define INFINITY __int_as_float(0x7f800000)",
            "#define NAN __int_as_float(0x7fffffff)",
            HALF_HELPERS.strip(),
            "template <class T, class F> __device__ __forceinline__ T tg_bitcast(F x) "
            "{ union { F from; T to; } u; u.from = x; return u.to; }",
            *([MMA_HELPERS] if any(u.op is Ops.MMA for u in uops) else []),
            *([CP_ASYNC_HELPERS] if any(is_async_copy(u) for u in uops) else []),
        ]

    def param(self, u: UOp, written: bool) -> str:
        const = "" if written else "const "
        return f"{const}{self.mtype(u.dtype)}* __restrict__ data{u.arg}"

    contract_off = ""  # NVRTC contracts unless told `--fmad=false` (tgc.backends.cuda.NVRTCCompiler.options)

    def fma(self, d: DType, product_args: str, acc: str) -> str:
        return f"fma{'' if d.name == 'f64' else 'f'}({product_args}, {acc})"

    half_fns = {"f16": ("tgc_half2float", "tgc_float2half"), "bf16": ("tgc_bf162float", "tgc_float2bf16")}
    u16, u8 = "(unsigned short)({})", "(unsigned char)({})"
    half_special: dict[tuple[str, str], str] = {}

    def math(self, op: Ops, d: DType, x: str) -> str:
        fn = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc"}[op]
        return f"{fn}{'' if d.name == 'f64' else 'f'}({x})"

    def fmod(self, d: DType, a: str, b: str) -> str:
        return f"fmod{'' if d.name == 'f64' else 'f'}({a}, {b})"

    def fmax(self, d: DType, a: str, b: str) -> str:
        return f"({a} > {b} ? {a} : {b})"

    def float_const(self, v: float, d: DType) -> str:
        if d.name == "f64" and not math.isfinite(v):
            return f"__longlong_as_double({struct.unpack('<q', struct.pack('<d', v))[0]}ll)"
        return super().float_const(v, d)

    def const(self, value, d: DType) -> str:
        if d.is_int and d.bits == 64:
            v = int(value)
            return f"{v}ull" if d.is_unsigned else (f"{v}ll" if v != -(1 << 63) else f"({v + 1}ll - 1ll)")
        return super().const(value, d)

    cast_fmt = "(({t})({x}))"
    bitcast_fmt = "tg_bitcast<{t}>({x})"

    def signature(self, name: str, params: list[str], uops: list[UOp]) -> str:
        local = 1
        for u in uops:
            if u.op is Ops.SPECIAL and u.arg[0].startswith("lidx"):
                local *= u.arg[1]
        sig = f"{self.kernel_prefix} __launch_bounds__({local}) {name}({', '.join(params)})"
        dynamic = dynamic_shared_bytes(uops)
        if not dynamic:
            return sig
        # shared memory past the 48 KiB of static arrays is dynamic: one extern array the shared arrays are carved
        # from (`define_local`), and its size in a module global that the runtime reads at load time to pass it
        # at each launch (after raising the function's limit: tgc.backends.cuda.CUDAProgram)
        return "\n".join([f'extern "C" __constant__ unsigned int {DYNAMIC_SHARED_SYMBOL}{name} = {dynamic}u;',
                           f"extern __shared__ __align__(16) unsigned char {DYNAMIC_SHARED_ARRAY}[];", sig])

    def define_local(self, name: str, ctype: str, count: int, uops: list[UOp]) -> str:
        if not dynamic_shared_bytes(uops):
            if any(is_async_copy(u) for u in uops):  # cp.async's 16-byte copies need 16-byte-aligned arrays
                return f"{self.local_qualifier} __align__(16) {ctype} {name}[{count}];"
            return super().define_local(name, ctype, count, uops)
        offset = 0
        for u in uops:  # this array's offset: the arrays before it, each rounded up to 16 bytes
            if u.op is Ops.DEFINE_LOCAL:
                if u.arg[0] == name:
                    break
                offset += _local_bytes(u)
        return f"{ctype}* {name} = ({ctype}*)({DYNAMIC_SHARED_ARRAY} + {offset});"


# CUDA's static shared arrays may hold 48 KiB; a kernel that needs more declares it dynamic (CUDARenderer.signature)
STATIC_SHARED_BYTES = 48 * 1024
DYNAMIC_SHARED_SYMBOL = "tgc_dynamic_shared_"  # + the kernel's name: the module global holding its size in bytes
DYNAMIC_SHARED_ARRAY = "tgc_smem"


def _local_bytes(u: UOp) -> int:
    """A DEFINE_LOCAL's bytes as rendered (half floats are floats), rounded up to 16."""
    size = 4 if u.dtype.name in ("f16", "bf16") else u.dtype.itemsize
    return -(-int(u.arg[1]) * size * u.dtype.count // 16) * 16


def dynamic_shared_bytes(uops: list[UOp]) -> int:
    """The dynamic shared memory a CUDA kernel declares: its shared arrays' bytes when they pass the static
    limit, else 0 (static arrays)."""
    total = sum(_local_bytes(u) for u in uops if u.op is Ops.DEFINE_LOCAL)
    return total if total > STATIC_SHARED_BYTES else 0


class MetalRenderer(CStyleRenderer):
    name = "metal"
    kernel_prefix = "kernel void"
    global_qualifier = "device"
    local_qualifier = "threadgroup"
    barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);"
    max_threads_per_block = 1024
    max_shared_bytes = 32768
    contract_off = ""  # Metal compiles with fast math off instead (tgc.backends.metal: -fno-fast-math)
    types = {**CStyleRenderer.types, "i64": "long", "u64": "ulong"}
    mem_types = {"bool": "uchar", "f16": "half", "bf16": "ushort"}

    def prelude(self, uops: list[UOp]) -> list[str]:
        return [
            "#include <metal_stdlib>",
            "using namespace metal;",
            "inline ushort tg_f2bf(float x) { uint u = as_type<uint>(x); if (isnan(x)) return ushort(0x7fc0);"
            " return ushort((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }",
            "inline float tg_bf2f(ushort h) { return as_type<float>(uint(h) << 16); }",
        ]

    def param(self, u: UOp, written: bool) -> str:
        const = "" if written else "const "
        return f"{self.global_qualifier} {const}{self.mtype(u.dtype)}* data{u.arg} [[buffer({u.arg})]]"

    def vector_load(self, d: DType, buf: str, idx: str) -> str:
        return f"*((device const {self.ctype(d)}*)({buf} + {idx}))"

    half_fns = {"f16": ("float", "half"), "bf16": ("tg_bf2f", "tg_f2bf")}  # f16 is Metal's own `half`
    u16, u8 = "ushort({})", "uchar({})"
    half_special = {("bits", "f16"): "as_type<ushort>(half({v}))",
                    ("from_bits", "f16"): "float(as_type<half>(ushort({v})))"}

    def render(self, name: str, uops: list[UOp]) -> str:
        if any(u.dtype is not None and u.dtype.name == "f64" for u in uops):
            raise CompileError(f"Metal has no 64-bit floats: kernel '{name}' uses f64",
                               hint="cast to f32 in the program, or run on a device with f64 (CPU, CUDA)")
        return super().render(name, uops)

    def signature(self, name: str, params: list[str], uops: list[UOp]) -> str:
        extra = ["uint3 gid [[threadgroup_position_in_grid]]", "uint3 lid [[thread_position_in_threadgroup]]"]
        vals = [p for p in params if p.startswith("int ")]
        bufs = [p for p in params if not p.startswith("int ")]
        n = len(bufs)
        consts = [f"constant int& {p[4:]} [[buffer({n + i})]]" for i, p in enumerate(vals)]
        return f"{self.kernel_prefix} {name}({', '.join(bufs + consts + extra)})"

    def special(self, name: str) -> str:
        return f"int(({'gid' if name.startswith('gidx') else 'lid'}).{'xyz'[int(name[-1])]})"

    def math(self, op: Ops, d: DType, x: str) -> str:
        if d.name == "f64":
            raise NotImplementedError("Metal has no 64-bit floats")
        return super().math(op, d, x)

    def fmax(self, d: DType, a: str, b: str) -> str:
        t = self.ctype(d)  # Metal's max takes one integer type: an int literal next to a char does not deduce
        return f"max({t}({a}), {t}({b}))"

    cast_fmt = "{t}({x})"
    bitcast_fmt = "as_type<{t}>({x})"
