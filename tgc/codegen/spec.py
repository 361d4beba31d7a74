"""The structural spec of linear UOps (what `tgc.codegen.linearize.linearize` returns), checked per kernel.

`verify_spec(name, uops)` raises `SpecError` (a `CompileError`) at the first UOp that breaks one of:

- order: every source is defined earlier in the list;
- scope: RANGE and ENDRANGE nest (an ENDRANGE closes the innermost open RANGE, none is left open), and a value
  computed inside a loop is used only while that loop is open (an accumulator carries values out: DEFINE_ACC
  before the loop, ACCUMULATE inside, READ_ACC after);
- arity: each op has the number of sources it is printed with;
- types: every value has one (pointers for buffers, integers for loops, launch indices and kernel variables);
  a RANGE's end and every index is an integer; unary and binary ALU sources have the result's type (shifts aside),
  comparisons take equal types and give bool; WHERE takes a bool condition and arms of its type; ACCUMULATE
  and READ_ACC have their accumulator's type; a STORE has no type;
- memory: LOAD and STORE address a DEFINE_GLOBAL or DEFINE_LOCAL, their gate (a LOAD's third source, a STORE's
  fourth) is a bool, except a shared-memory LOAD's ordering edge to its BARRIER.

Whether a gated access stays in bounds is `tgc.codegen.verify`'s job (it enumerates the iterations). Both run,
under `TGC_VERIFY_BOUNDS=1`, on every kernel `tgc.codegen.pipeline.lower` produces: every device, every BEAM
candidate (tests/conftest.py sets it). tinygrad's `uop/spec.py` is the model.
"""

from __future__ import annotations

from tgc.errors import CompileError
from tgc.ir.uop import BINARY, COMPARE, UNARY, Ops, UOp

STATS = {"kernels": 0}

_ARITY: dict[Ops, tuple[int, ...]] = {
    **{op: (1,) for op in UNARY | {Ops.CAST, Ops.BITCAST, Ops.RANGE, Ops.ENDRANGE, Ops.DEFINE_ACC, Ops.READ_ACC,
                                   Ops.SHUFFLE}},
    Ops.BARRIER: tuple(range(1, 257)),
    Ops.MMA: (12,),  # after every store it orders (the staged tiles' copies)
    **{op: (2,) for op in BINARY | {Ops.ACCUMULATE}},
    Ops.WHERE: (3,), Ops.LOAD: (2, 3), Ops.STORE: (3, 4), Ops.GEP: (1,),
    Ops.CONST: (0,), Ops.DEFINE_GLOBAL: (0,), Ops.DEFINE_VAR: (0,), Ops.SPECIAL: (0,), Ops.DEFINE_LOCAL: (0,),
}
_SHIFTS = {Ops.SHL, Ops.SHR}
_MEMORY = (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL)


class SpecError(CompileError):
    """Linear UOps that break the spec: a code generation bug, found before the kernel is rendered."""


def _is_int(u: UOp) -> bool:
    return u.dtype is not None and u.dtype.is_int


def verify_spec(name: str, uops: list[UOp]) -> None:
    """Check `uops` against the module's spec; SpecError naming the kernel, the UOp and the rule."""
    STATS["kernels"] += 1
    where: dict[UOp, int] = {}  # uop -> its position
    scope_of: dict[UOp, tuple[UOp, ...]] = {}  # uop -> the ranges open where it is defined
    open_ranges: list[UOp] = []

    def fail(i: int, u: UOp, why: str) -> None:
        raise SpecError(f"kernel {name}: uop {i} ({u.op.name} {u.dtype}): {why}")

    for i, u in enumerate(uops):
        arity = (u.dtype.count,) if u.op is Ops.VECTORIZE and u.dtype is not None else _ARITY.get(u.op)
        if arity is None:
            fail(i, u, "this op does not belong in linear UOps")
        elif len(u.src) not in arity:
            fail(i, u, f"{len(u.src)} sources, expected {' or '.join(map(str, arity))}")
        for s in u.src:
            if s not in where:
                fail(i, u, f"a source ({s.op.name}) is not defined before it")
            inner = scope_of[s]
            if inner and (len(inner) > len(open_ranges) or tuple(open_ranges[:len(inner)]) != inner):
                fail(i, u, f"uses {s.op.name} (uop {where[s]}) after the loop it was computed in closed")
        _check_types(i, u, fail)
        if u.op is Ops.ENDRANGE:
            if not open_ranges or u.src[0] is not open_ranges[-1]:
                fail(i, u, "does not close the innermost open RANGE")
            open_ranges.pop()
        where[u] = i
        scope_of[u] = () if u.op in (Ops.DEFINE_ACC, Ops.ENDRANGE) else tuple(open_ranges)
        if u.op is Ops.RANGE:
            open_ranges.append(u)
    if open_ranges:
        r = open_ranges[-1]
        fail(where[r], r, "this RANGE is never closed")


def _check_types(i: int, u: UOp, fail) -> None:
    op, d = u.op, u.dtype
    if op not in (Ops.STORE, Ops.ENDRANGE, Ops.BARRIER) and d is None:
        fail(i, u, "a value without a type")
    if op in _MEMORY and not d.ptr:
        fail(i, u, "a buffer must have a pointer type")
    if op in (Ops.SPECIAL, Ops.DEFINE_VAR) and not _is_int(u):
        fail(i, u, "a launch index or kernel variable must be an integer")
    if op is Ops.GEP:
        src = u.src[0].dtype
        if src is None or not isinstance(u.arg, int) or not 0 <= u.arg < src.count or d != src.scalar():
            fail(i, u, f"lane {u.arg!r} of a {src}")
    elif op in UNARY and op is not Ops.CAST:
        if u.src[0].dtype != d:
            fail(i, u, f"a source of type {u.src[0].dtype}, expected {d}")
    elif op is Ops.RANGE:
        if not _is_int(u) or not _is_int(u.src[0]):
            fail(i, u, "a RANGE and its end must be integers")
    elif op is Ops.VECTORIZE:
        if any(s.dtype != d.scalar() for s in u.src):
            fail(i, u, f"lanes of types {', '.join(sorted({str(s.dtype) for s in u.src}))}, expected {d.scalar()}")
    elif op in BINARY and op not in COMPARE and op not in _SHIFTS:
        if any(s.dtype != d for s in u.src):
            fail(i, u, f"sources of types {', '.join(str(s.dtype) for s in u.src)}, expected {d}")
    elif op in COMPARE:
        if u.src[0].dtype != u.src[1].dtype:
            fail(i, u, f"compares {u.src[0].dtype} with {u.src[1].dtype}")
        if d is None or not d.is_bool:
            fail(i, u, "a comparison gives bool")
    elif op is Ops.WHERE:
        c, a, b = u.src
        if c.dtype is None or not c.dtype.is_bool:
            fail(i, u, f"a condition of type {c.dtype}")
        if a.dtype != d or b.dtype != d:
            fail(i, u, f"arms of types {a.dtype} and {b.dtype}, expected {d}")
    elif op in (Ops.ACCUMULATE, Ops.READ_ACC):
        if u.src[0].op is not Ops.DEFINE_ACC or u.src[0].dtype != d:
            fail(i, u, "must name a DEFINE_ACC of its own type")
        if op is Ops.ACCUMULATE and u.src[1].dtype != d:
            fail(i, u, f"accumulates a {u.src[1].dtype} into a {d}")
    elif op in (Ops.LOAD, Ops.STORE):
        buf, idx = u.src[0], u.src[1]
        if buf.op not in _MEMORY:
            fail(i, u, f"addresses a {buf.op.name}, not a buffer")
        if not _is_int(idx):
            fail(i, u, f"an index of type {idx.dtype}")
        if op is Ops.STORE and d is not None:
            fail(i, u, "a STORE has no type")
        gate = u.src[2] if op is Ops.LOAD and len(u.src) == 3 else u.src[3] if op is Ops.STORE and len(u.src) == 4 \
            else None
        if gate is not None and not (gate.dtype is not None and gate.dtype.is_bool):
            if not (op is Ops.LOAD and gate.op is Ops.BARRIER and buf.op is Ops.DEFINE_LOCAL):
                fail(i, u, f"a gate of type {gate.dtype}")
