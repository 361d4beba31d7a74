"""Renders linear UOps as LLVM IR text (no llvmlite needed to render; only to compile).

The kernel is `void NAME(ptr %data0, ..., i32 %core_id)`: on the CPU each thread receives its index
as the last argument. Accumulators live in allocas (LLVM's mem2reg makes them registers); loops are
header/body/exit blocks with a phi for the index. Bools are i1 in registers and i8 in memory; bf16 is
i16 bits.
"""

from __future__ import annotations

import math
import struct

from tgc.dtype import DType, dtypes
from tgc.ir.uop import Ops, UOp

_TYPES = {"bool": "i1", "i8": "i8", "u8": "i8", "i16": "i16", "u16": "i16", "i32": "i32", "u32": "i32", "i64": "i64",
          "u64": "i64", "f16": "half", "bf16": "i16", "f32": "float", "f64": "double"}


def ltype(d: DType) -> str:
    return _TYPES[d.name]


def mtype(d: DType) -> str:
    """Type in memory: bools are bytes."""
    return "i8" if d.is_bool else ltype(d)


def lconst(value, d: DType) -> str:
    if d.is_bool:
        return "true" if value else "false"
    if d.is_int or d.name == "bf16":
        return str(int(value))
    if d.name == "f16":
        return "0xH" + struct.pack(">e", value).hex().upper()
    if d.name == "f32":
        value = struct.unpack("f", struct.pack("f", value))[0] if math.isfinite(value) else value
    return "0x" + struct.pack(">d", value).hex().upper()


def _fname(d: DType) -> str:
    return {"f16": "f16", "f32": "f32", "f64": "f64"}[d.name]


class LLVMRenderer:
    """Linear UOps -> LLVM IR. `device` is the device name shown in comments."""

    name = "llvm"
    language = "llvm"
    has_threads = True
    supports_float16 = True

    def render(self, name: str, uops: list[UOp]) -> str:
        return _Renderer(name, uops).run()


class _Renderer:
    def __init__(self, name: str, uops: list[UOp]):
        self.name, self.uops = name, uops
        self.lines: list[str] = []
        self.allocas: list[str] = []
        self.names: dict[UOp, str] = {}
        self.counter = 0
        self.block = "entry"
        self.loops: list[dict] = []
        self.decls: set[str] = set()

    def tmp(self) -> str:
        self.counter += 1
        return f"%v{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append("  " + line)

    def declare(self, decl: str) -> None:
        self.decls.add(decl)

    def ref(self, u: UOp) -> str:
        if u.op is Ops.CONST:
            return lconst(u.arg, u.dtype)
        return self.names[u]

    def intrinsic(self, base: str, d: DType, nargs: int = 1) -> str:
        t = ltype(d)
        suffix = _fname(d) if d.is_float else f"i{d.bits}"
        fn = f"@llvm.{base}.{suffix}"
        self.declare(f"declare {t} {fn}({', '.join([t] * nargs)})")
        return fn

    def run(self) -> str:
        params = []
        for u in self.uops:
            if u.op is Ops.DEFINE_GLOBAL:
                self.names[u] = f"%data{u.arg}"
                params.append(f"ptr noalias align 16 %data{u.arg}")
            elif u.op is Ops.DEFINE_VAR:
                self.names[u] = f"%{u.arg if isinstance(u.arg, str) else u.arg[0]}"
                params.append(f"i32 {self.names[u]}")
        if not any(u.op is Ops.DEFINE_VAR for u in self.uops):
            params.append("i32 %core_id")
        for u in self.uops:
            if u.op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.CONST):
                continue
            self.render_uop(u)
        body = ["entry:"] + ["  " + a for a in self.allocas] + self.lines + ["  ret void"]
        head = f'define void @{self.name}({", ".join(params)}) #0 {{'
        attrs = 'attributes #0 = { nounwind "prefer-vector-width"="512" "no-trapping-math"="true" }'
        return "\n".join([*sorted(self.decls), "", head, *body, "}", "", attrs, ""])

    def render_uop(self, u: UOp) -> None:
        op, d = u.op, u.dtype
        if op is Ops.RANGE:
            n = len([x for x in self.names if x.op is Ops.RANGE])
            label = f"loop{n}"
            self.emit(f"br label %{label}_head")
            self.lines.append(f"{label}_head:")
            var = f"%r{n}"
            self.names[u] = var
            phi_at = len(self.lines)
            self.emit("PHI")
            end = self.ref(u.src[0])
            cond = self.tmp()
            self.emit(f"{cond} = icmp slt i32 {var}, {end}")
            self.emit(f"br i1 {cond}, label %{label}_body, label %{label}_exit")
            self.lines.append(f"{label}_body:")
            self.loops.append({"range": u, "label": label, "phi_at": phi_at, "entry_block": self.block, "var": var})
            self.block = f"{label}_body"
            return
        if op is Ops.ENDRANGE:
            loop = self.loops.pop()
            nxt = self.tmp()
            self.emit(f"{nxt} = add nuw nsw i32 {loop['var']}, 1")
            self.emit(f"br label %{loop['label']}_head")
            self.lines[loop["phi_at"]] = (f"  {loop['var']} = phi i32 [ 0, %{loop['entry_block']} ], "
                                          f"[ {nxt}, %{self.block} ]")
            self.lines.append(f"{loop['label']}_exit:")
            self.block = f"{loop['label']}_exit"
            return
        if op is Ops.DEFINE_ACC:
            name = f"%acc{u.arg}"
            self.names[u] = name
            self.allocas.append(f"{name} = alloca {ltype(d)}")
            self.emit(f"store {ltype(d)} {self.ref(u.src[0])}, ptr {name}")
            return
        if op is Ops.ACCUMULATE:
            acc, v = u.src
            cur = self.tmp()
            self.emit(f"{cur} = load {ltype(d)}, ptr {self.names[acc]}")
            new = self.binary(u.arg, d, cur, self.ref(v), reduction=True)
            self.emit(f"store {ltype(d)} {new}, ptr {self.names[acc]}")
            return
        if op is Ops.READ_ACC:
            out = self.tmp()
            self.emit(f"{out} = load {ltype(d)}, ptr {self.names[u.src[0]]}")
            self.names[u] = out
            return
        if op is Ops.LOAD:
            self.names[u] = self.load(u)
            return
        if op is Ops.STORE:
            buf, idx, val = u.src[:3]
            vd = val.dtype
            ptr = self.tmp()
            self.emit(f"{ptr} = getelementptr inbounds {mtype(vd)}, ptr {self.ref(buf)}, i32 {self.ref(idx)}")
            v = self.ref(val)
            if vd.is_bool:
                z = self.tmp()
                self.emit(f"{z} = zext i1 {v} to i8")
                v = z
            self.emit(f"store {mtype(vd)} {v}, ptr {ptr}")
            return
        if op is Ops.SINK:
            return
        self.names[u] = self.alu(u)

    def load(self, u: UOp) -> str:
        buf, idx = u.src[0], self.ref(u.src[1])
        gate = u.src[2] if len(u.src) > 2 else None
        d = u.dtype
        if gate is not None:
            safe = self.tmp()
            self.emit(f"{safe} = select i1 {self.ref(gate)}, i32 {idx}, i32 0")
            idx = safe
        ptr, val = self.tmp(), self.tmp()
        self.emit(f"{ptr} = getelementptr inbounds {mtype(d)}, ptr {self.ref(buf)}, i32 {idx}")
        self.emit(f"{val} = load {mtype(d)}, ptr {ptr}")
        if d.is_bool:
            b = self.tmp()
            self.emit(f"{b} = icmp ne i8 {val}, 0")
            val = b
        if gate is not None:
            g = self.tmp()
            self.emit(f"{g} = select i1 {self.ref(gate)}, {ltype(d)} {val}, {ltype(d)} {lconst(0, d)}")
            val = g
        return val

    def binary(self, op: Ops, d: DType, a: str, b: str, reduction: bool = False) -> str:
        t, out = ltype(d), self.tmp()
        fl = d.is_float
        fm = "reassoc nsz contract " if reduction else ""
        if op is Ops.ADD:
            self.emit(f"{out} = {'fadd ' + fm if fl else 'add '}{t} {a}, {b}" if not d.is_bool else
                      f"{out} = or i1 {a}, {b}")
        elif op is Ops.MUL:
            self.emit(f"{out} = {'fmul ' + fm if fl else 'mul '}{t} {a}, {b}" if not d.is_bool else
                      f"{out} = and i1 {a}, {b}")
        elif op is Ops.SUB:
            self.emit(f"{out} = {'fsub' if fl else 'sub'} {t} {a}, {b}")
        elif op is Ops.FDIV:
            self.emit(f"{out} = fdiv {t} {a}, {b}")
        elif op is Ops.IDIV:
            self.emit(f"{out} = {'udiv' if d.is_unsigned or d.is_bool else 'sdiv'} {t} {a}, {b}")
        elif op is Ops.MOD:
            self.emit(f"{out} = {'urem' if d.is_unsigned or d.is_bool else 'srem'} {t} {a}, {b}")
        elif op is Ops.MAX:
            if fl:
                fn = self.intrinsic("maxnum", d, 2)
                self.emit(f"{out} = call {fm}{t} {fn}({t} {a}, {t} {b})")
            elif d.is_bool:
                self.emit(f"{out} = or i1 {a}, {b}")
            else:
                fn = self.intrinsic("umax" if d.is_unsigned else "smax", d, 2)
                self.emit(f"{out} = call {t} {fn}({t} {a}, {t} {b})")
        elif op in (Ops.AND, Ops.OR, Ops.XOR):
            self.emit(f"{out} = {op.name.lower()} {t} {a}, {b}")
        elif op in (Ops.SHL, Ops.SHR):
            # shifting by the width or more gives 0 (or the sign) instead of LLVM's poison
            inst = "shl" if op is Ops.SHL else ("lshr" if d.is_unsigned else "ashr")
            big, clamped, raw = self.tmp(), self.tmp(), self.tmp()
            self.emit(f"{big} = icmp uge {t} {b}, {d.bits}")
            self.emit(f"{clamped} = select i1 {big}, {t} {d.bits - 1}, {t} {b}")
            self.emit(f"{raw} = {inst} {t} {a}, {clamped}")
            if inst == "ashr":
                return raw
            self.emit(f"{out} = select i1 {big}, {t} 0, {t} {raw}")
        else:
            raise NotImplementedError(op)
        return out

    def alu(self, u: UOp) -> str:
        op, d = u.op, u.dtype
        srcs = [self.ref(s) for s in u.src]
        if op in (Ops.ADD, Ops.MUL, Ops.SUB, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL,
                  Ops.SHR):
            return self.binary(op, d, *srcs)
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
            self.emit(f"{out} = fneg {t} {srcs[0]}" if d.is_float else f"{out} = sub {t} 0, {srcs[0]}")
        elif op is Ops.NOT:
            self.emit(f"{out} = xor {t} {srcs[0]}, {'true' if d.is_bool else -1}")
        elif op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC):
            fn = self.intrinsic(op.name.lower(), d)
            self.emit(f"{out} = call {t} {fn}({t} {srcs[0]})")
        elif op is Ops.RECIP:
            self.emit(f"{out} = fdiv {t} {lconst(1.0, d)}, {srcs[0]}")
        elif op is Ops.WHERE:
            self.emit(f"{out} = select i1 {srcs[0]}, {t} {srcs[1]}, {t} {srcs[2]}")
        elif op is Ops.MULACC:
            fn = self.intrinsic("fmuladd", d, 3)
            self.emit(f"{out} = call {t} {fn}({t} {srcs[0]}, {t} {srcs[1]}, {t} {srcs[2]})")
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
            self.emit(f"{out} = fcmp une {st} {v}, {lconst(0.0, s)}" if s.is_float and s.name != "bf16" else
                      f"{out} = icmp ne {st} {v}, 0")
            return out
        if s.name == "bf16":  # bits -> f32 (legalize guarantees d is f32)
            w, sh = self.tmp(), self.tmp()
            self.emit(f"{w} = zext i16 {v} to i32")
            self.emit(f"{sh} = shl i32 {w}, 16")
            self.emit(f"{out} = bitcast i32 {sh} to float")
            return out
        if d.name == "bf16":  # f32 -> bits, rounding to nearest even; nan stays nan
            bits, lsb, bias, added, top, isnan = (self.tmp() for _ in range(6))
            self.emit(f"{bits} = bitcast float {v} to i32")
            self.emit(f"{lsb} = lshr i32 {bits}, 16")
            self.emit(f"{bias} = and i32 {lsb}, 1")
            self.emit(f"{added} = add i32 {bits}, 32767")
            added2 = self.tmp()
            self.emit(f"{added2} = add i32 {added}, {bias}")
            self.emit(f"{top} = lshr i32 {added2}, 16")
            tr = self.tmp()
            self.emit(f"{tr} = trunc i32 {top} to i16")
            self.emit(f"{isnan} = fcmp uno float {v}, 0.0")
            self.emit(f"{out} = select i1 {isnan}, i16 32704, i16 {tr}")
            return out
        if s.is_bool:
            self.emit(f"{out} = uitofp i1 {v} to {dt}" if d.is_float else f"{out} = zext i1 {v} to {dt}")
        elif s.is_float and d.is_float:
            self.emit(f"{out} = {'fpext' if d.itemsize > s.itemsize else 'fptrunc'} {st} {v} to {dt}")
        elif s.is_float:
            fn = f"@llvm.fpto{'u' if d.is_unsigned else 's'}i.sat.i{d.bits}.{_fname(s)}"
            self.declare(f"declare {dt} {fn}({st})")
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


_ = dtypes
