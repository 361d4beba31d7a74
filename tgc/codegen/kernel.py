"""One kernel from AST to binary: legalize, optimize, linearize, render, compile (through the disk cache)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from tgc.codegen import verify
from tgc.codegen.legalize import legalize
from tgc.codegen.linearize import linearize
from tgc.engine.schedule import ScheduleItem
from tgc.errors import CompileError
from tgc.ir.uop import ALU, Ops, UOp, pretty


@dataclass
class Kernel:
    """A kernel ready to launch (or, where this machine cannot compile for the device, ready to show)."""

    name: str
    src: str
    binary: bytes | None
    uops: list[UOp]
    ast: UOp
    bufs: list[UOp]  # tensor nodes held by DEFINE_GLOBAL 0, 1, ...
    global_size: tuple[int, int, int] = (1, 1, 1)
    local_size: tuple[int, int, int] | None = None
    vals: tuple[int, ...] = ()
    flops: int = 0
    bytes_moved: int = 0
    line: int | None = None
    compile_error: str | None = None
    device: Any = None
    opts: list = field(default_factory=list)
    _program: Any = None

    def program(self):
        if self._program is None:
            if self.binary is None:
                raise CompileError(self.compile_error or f"kernel {self.name} was not compiled")
            self._program = self.device.program(self.name, self.binary)
        return self._program

    def uops_text(self) -> str:
        lines = []
        names: dict[UOp, str] = {}
        for i, u in enumerate(self.uops):
            names[u] = f"%{i}"
            srcs = ", ".join(names.get(s, "?") for s in u.src)
            arg = "" if u.arg is None else f" {u.arg!r}"
            lines.append(f"{i:4d} {u.op.name:<14} {str(u.dtype):<6}{arg} ({srcs})")
        return "\n".join(lines)

    def ast_text(self) -> str:
        return pretty(self.ast)

    def asm(self) -> str:
        comp = self.device.compiler
        if comp is None:
            raise CompileError(self.compile_error or "no compiler for this device")
        if hasattr(comp, "assembly"):
            return comp.assembly(self.src)
        if self.binary is None:
            raise CompileError(self.compile_error or "not compiled")
        try:
            return comp.disassemble(self.binary, src=self.src)  # compilers that regenerate text from source
        except TypeError:
            return comp.disassemble(self.binary)


def count_work(uops: list[UOp]) -> int:
    """Arithmetic operations executed, from the loop trip counts around each ALU op."""
    flops, trips = 0, [1]
    for u in uops:
        if u.op is Ops.RANGE:
            end = u.src[0]
            trips.append(trips[-1] * (end.arg if end.op is Ops.CONST else max(int(end.vmax), 1)))
        elif u.op is Ops.ENDRANGE:
            trips.pop()
        elif (u.op in ALU and u.dtype is not None and u.dtype.is_float) or u.op is Ops.ACCUMULATE:
            flops += trips[-1] * (u.dtype.count if u.dtype is not None else 1)
    return flops


def prepare_ast(ast: UOp, device: Any) -> UOp:
    """The device-independent rewrites every kernel gets before optimization."""
    ast = legalize(ast)
    if getattr(device.renderer, "decompose_transcendentals", False):
        from tgc.codegen.transcendental import decompose_transcendentals
        ast = decompose_transcendentals(ast)
    return ast


def build_kernel(item: ScheduleItem, device: Any, beam: int = 0, name: str | None = None, tuned: bool = True
                 ) -> Kernel:
    """`tuned=False` ignores stored BEAM winners (what `make bench` shows as 'tgc default')."""
    from tgc.codegen import search
    from tgc.codegen.opt import optimize
    from tgc.ir.shapes import prod, shape_of

    name = name or item.name
    ast = prepare_ast(item.ast, device)
    opts = None
    if tuned and device.compiler is not None and os.environ.get("NOOPT", "") in ("", "0"):
        opts = search.lookup(ast, device)  # a BEAM winner stored earlier
        if opts is None and beam > 0:
            res = search.beam_search(ast, device, item.bufs, beam, name=name)
            search.store(ast, device, res.opts, res.after_s, name)
            opts = res.opts
    ast, launch, applied = optimize(ast, device, opts=opts)
    ast, bufs = drop_unused_buffers(ast, item.bufs)
    uops = linearize(ast, vectors=getattr(device.renderer, "supports_vectors", False))
    name = name or item.name
    if verify.enabled():
        verify.verify_kernel(name, uops, bufs, launch)
    src = device.renderer.render(name, uops)
    binary, err = compile_cached(device, src)
    nbytes = sum(prod(shape_of(b)) * b.dtype.itemsize for b in bufs)
    flops = count_work(uops) * launch.get("global_size", (1, 1, 1))[0]
    return Kernel(name=name, src=src, binary=binary, uops=uops, ast=ast, bufs=bufs,
                  global_size=launch.get("global_size", (1, 1, 1)), local_size=launch.get("local_size"),
                  vals=launch.get("vals", ()), flops=flops, bytes_moved=nbytes, line=item.line, compile_error=err,
                  device=device, opts=applied)


def drop_unused_buffers(ast: UOp, bufs: list[UOp]) -> tuple[UOp, list[UOp]]:
    """Buffers whose loads folded away (`a % -1` is 0) are not kernel parameters: renumber the rest."""
    from tgc.ir.uop import substitute
    used = sorted({u.arg for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL})
    if used == list(range(len(bufs))):
        return ast, bufs
    mapping = {u: u.replace(arg=used.index(u.arg)) for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL}
    return substitute(ast, mapping), [bufs[i] for i in used]


COMPILE_COUNTER = {"compiles": 0}


def compile_cached(device: Any, src: str) -> tuple[bytes | None, str | None]:
    """(binary, None) or (None, why not). Compiler errors in the kernel itself raise CompileError."""
    comp = device.compiler
    if comp is None:
        getattr(device, "lint", lambda src: None)(src)  # a device that cannot compile here may still check (METAL)
        return None, device.compile_error or f"no compiler for {device.kind} on this machine"
    from tgc import __version__, cache
    use_cache = os.environ.get("DISABLE_COMPILER_CACHE", "") in ("", "0")
    key = cache.make_key(device.kind, comp.name, comp.cache_key, __version__, src) if use_cache else None
    if key is not None:
        hit = cache.get("compile", key)
        if hit is not None:
            return hit, None
    COMPILE_COUNTER["compiles"] += 1
    lib = comp.compile(src)
    if key is not None:
        cache.put("compile", key, lib, meta=f"{device.kind} {src[:60].splitlines()[0] if src else ''}")
    return lib, None
