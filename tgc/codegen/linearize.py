"""Kernel AST -> a linear list of UOps that a renderer prints top to bottom.

Loops are explicit: RANGE opens one, ENDRANGE closes it. A REDUCE becomes DEFINE_ACC before its loops,
ACCUMULATE inside them and READ_ACC after. Values are computed in the innermost open loop that is
current when first needed; a value computed inside a loop is not reused after the loop closes.
"""

from __future__ import annotations

from tgc.dtype import dtypes
from tgc.engine.schedule import identity
from tgc.ir.uop import Ops, RangeKind, UOp


class _Linearizer:
    def __init__(self) -> None:
        self.out: list[UOp] = []
        self.scopes: list[dict[UOp, UOp]] = [{}]
        self.open_ranges: list[UOp] = []
        self.acc_count = 0

    def lookup(self, u: UOp) -> UOp | None:
        for scope in reversed(self.scopes):
            if u in scope:
                return scope[u]
        return None

    def push(self, u: UOp) -> UOp:
        self.out.append(u)
        return u

    def open_range(self, r: UOp) -> None:
        end = self.emit(r.src[0])
        lin = r.replace(src=(end,))
        self.push(lin)
        self.scopes.append({r: lin})
        self.open_ranges.append(r)

    def close_range(self) -> None:
        r = self.open_ranges.pop()
        scope = self.scopes.pop()
        self.push(UOp(Ops.ENDRANGE, None, (scope[r],)))

    def emit(self, u: UOp) -> UOp:
        found = self.lookup(u)
        if found is not None:
            return found
        if u.op is Ops.RANGE:
            raise RuntimeError(f"range {u.arg} used outside its loop")
        if u.op is Ops.REDUCE:
            value, ranges = u.src[0], u.src[1:]
            init = self.emit(UOp.const(u.dtype, identity(u.arg, u.dtype)))
            acc = self.push(UOp(Ops.DEFINE_ACC, u.dtype, (init,), self.acc_count))
            self.acc_count += 1
            for r in ranges:
                self.open_range(r)
            v = self.emit(value)
            self.push(UOp(Ops.ACCUMULATE, u.dtype, (acc, v), u.arg))
            for _ in ranges:
                self.close_range()
            lin = self.push(UOp(Ops.READ_ACC, u.dtype, (acc,)))
        else:
            srcs = tuple(self.emit(s) for s in u.src)
            lin = self.push(u.replace(src=srcs))
        self.scopes[-1][u] = lin
        return lin


def linearize(ast: UOp) -> list[UOp]:
    """The linear program of a kernel AST (a SINK of STOREs)."""
    lin = _Linearizer()
    nodes = ast.toposort()
    for g in sorted((u for u in nodes if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg):
        lin.scopes[0][g] = lin.push(g)
    for v in sorted((u for u in nodes if u.op is Ops.DEFINE_VAR), key=lambda u: str(u.arg)):
        lin.scopes[0][v] = lin.push(v)
    for s in (u for u in nodes if u.op is Ops.SPECIAL):
        lin.scopes[0][s] = lin.push(s)
    reduce_ranges = {r for u in nodes if u.op is Ops.REDUCE for r in u.src[1:]}
    outer = sorted((u for u in nodes if u.op is Ops.RANGE and u not in reduce_ranges), key=lambda r: r.arg[0])
    for r in outer:
        lin.open_range(r)
    for store in ast.src:
        lin.emit(store)
    while lin.open_ranges:
        lin.close_range()
    return lin.out


def range_kind(r: UOp) -> RangeKind:
    return r.arg[1]


__all__ = ["linearize", "dtypes"]
