"""Sizes as expressions of the dims, in JSON: what a package stores for shapes, buffer sizes and launch sizes.

An expression is an integer, a dim name (a string), or `[op, a, b]` with `op` one of `+ - * // % max min`
(`//` and `%` floor, as in Python; a zero divisor is an error). `evaluate` walks it with explicit limits (depth,
node count, the size of every intermediate value): it is data, never code, and never goes near `eval`.
Sizes compiled with every dim given are plain integers; symbolic sizes use the names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tgc.errors import TgcError

Expr = int | str | list  # (Python 3.10 evaluates this union at run time)

OPS = {"+", "-", "*", "//", "%", "max", "min"}
MAX_DEPTH = 32
MAX_NODES = 1024
LIMIT = 1 << 62  # every value, intermediate ones included, stays inside int64


class ExprError(TgcError):
    """A malformed or out-of-range size expression."""


def _is_name(s: str) -> bool:
    return s.isidentifier() and s.isascii() and len(s) <= 64


def validate(e: Any, where: str = "size") -> Expr:
    """`e` itself when it is a well-formed expression; else ExprError naming `where`."""
    nodes = [0]

    def walk(x: Any, depth: int) -> None:
        nodes[0] += 1
        if nodes[0] > MAX_NODES or depth > MAX_DEPTH:
            raise ExprError(f"{where}: the size expression is too large")
        if isinstance(x, bool):
            raise ExprError(f"{where}: {x!r} is not a size")
        if isinstance(x, int):
            if not -LIMIT < x < LIMIT:
                raise ExprError(f"{where}: {x} is out of range")
            return
        if isinstance(x, str):
            if not _is_name(x):
                raise ExprError(f"{where}: {x[:40]!r} is not a dim name")
            return
        if isinstance(x, list) and len(x) == 3 and isinstance(x[0], str) and x[0] in OPS:
            walk(x[1], depth + 1)
            walk(x[2], depth + 1)
            return
        raise ExprError(f"{where}: {str(x)[:40]} is not a size expression")

    walk(e, 0)
    return e


def evaluate(e: Expr, dims: Mapping[str, int], where: str = "size") -> int:
    """The integer value of a (validated) expression with `dims`."""
    validate(e, where)

    def ev(x: Expr) -> int:
        if isinstance(x, int):
            return x
        if isinstance(x, str):
            if x not in dims:
                raise ExprError(f"{where}: dim {x} is unknown", hint=f"give its size (-D {x}=...)")
            return int(dims[x])
        op, a, b = x[0], ev(x[1]), ev(x[2])
        if op in ("//", "%") and b == 0:
            raise ExprError(f"{where}: division by zero")
        v = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "//": lambda: a // b,
             "%": lambda: a % b, "max": lambda: max(a, b), "min": lambda: min(a, b)}[op]()
        if not -LIMIT < v < LIMIT:
            raise ExprError(f"{where}: the size is out of range")
        return v

    return ev(e)


def names(e: Expr) -> set[str]:
    """The dim names an expression uses."""
    if isinstance(e, str):
        return {e}
    if isinstance(e, list):
        return names(e[1]) | names(e[2])
    return set()


def text(e: Expr) -> str:
    """`N`, `3 * C`, `max(N, 4)`: an expression as people write it."""
    if isinstance(e, (int, str)):
        return str(e)
    op, a, b = e
    if op in ("max", "min"):
        return f"{op}({text(a)}, {text(b)})"

    def wrap(x: Expr) -> str:
        return f"({text(x)})" if isinstance(x, list) and x[0] not in ("max", "min") else text(x)

    return f"{wrap(a)} {op} {wrap(b)}"


UNIT = 32  # size class "32n": a multiple of this (kernels of the class may assume it)


def size_class(names: Any, dims: Mapping[str, int]) -> tuple[tuple[str, str], ...]:
    """Each dim as "0", "1", "32n" (a multiple of `UNIT`) or "n" (any other size of 2 or more): the sizes one
    symbolic compile serves (`tgc.codegen.sizes.size_class`; here, below the compiler, for the program cache's
    warm path, which keys a symbolic entry by it)."""
    return tuple((n, "0" if dims[n] == 0 else "1" if dims[n] == 1 else "32n" if dims[n] % UNIT == 0 else "n")
                 for n in names)


def with_quotients(multiples: Any, dims: Mapping[str, int]) -> tuple[dict[str, int], int | None]:
    """A narrowed class's dims (`multiples`: (X, Y, Q), X a multiple of Y, a dim or an int, Q = X // Y a hidden
    dim, in the order made) from the program's: `dims` with each Q added, and None; or, where a Y does not
    divide its X (or is not positive), the dims so far and that multiple's index. The one check of a narrowed
    class, in memory (`tgc.api.SymbolicPlan.class_dims`) and in a package (`tgc.package.SizeClassPlan`)."""
    d = dict(dims)
    for i, (x, y, q) in enumerate(multiples):
        xv, yv = d[x], (d[y] if isinstance(y, str) else y)
        if yv <= 0 or xv % yv:
            return d, i
        d[q] = xv // yv
    return d, None
