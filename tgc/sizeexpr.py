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
                raise ExprError(f"{where}: dim {x} is unknown", hint=f"give its size (-D {x}=INT)")
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


def combine(op: str, terms: list[Expr]) -> Expr:
    """The `+` (or `max`) of `terms` as one expression that stays shallow for any number of terms: the integer
    terms folded into one, equal terms counted once for `max` (and as `term * count` for `+`), the rest joined
    as a balanced tree (a left-deep chain of hundreds of buffers would pass `MAX_DEPTH`)."""
    assert op in ("+", "max") and terms
    const: int | None = None
    rest: list[Expr] = []
    counts: list[int] = []
    for t in terms:
        if isinstance(t, int):
            const = t if const is None else const + t if op == "+" else max(const, t)
        elif t in rest:
            counts[rest.index(t)] += 1
        else:
            rest.append(t)
            counts.append(1)
    parts: list[Expr] = [t if op == "max" or c == 1 else ["*", t, c] for t, c in zip(rest, counts)]
    if const is not None and (op == "max" or const != 0 or not parts):
        parts.append(const)
    while len(parts) > 1:
        parts = [[op, parts[i], parts[i + 1]] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]


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


def made_classes(multiples: Any, hidden: Mapping[str, str]) -> dict[str, str]:
    """The class of every dim of a narrowed class (`multiples` as `with_quotients`), its kernels' dims' classes
    `hidden` given: each X, a middle quotient too (C_D of `C // D // KH`, replaced by C_D_KH), "32n" where its
    Q or Y is (a constant Y where `UNIT` divides it), else "n"."""
    classes = dict(hidden)
    for x, y, q in reversed(list(multiples)):
        cy = classes.get(y) if isinstance(y, str) else "32n" if y % UNIT == 0 else "n"
        classes[x] = "32n" if "32n" in (classes.get(q), cy) else "n"
    return classes


def written(multiples: Any) -> list[tuple[str, str | int]]:
    """Per multiple (X, Y, Q) of a narrowed class (`with_quotients`), X and Y as the program's dims write them: a
    hidden dim as its quotient (`C // D` for C_D), a divisor that is one in parentheses (`(D // 2)` for D_2)."""
    spelled: dict[str, str] = {}
    out = []
    for x, y, q in multiples:
        x, y = spelled.get(x, x), f"({spelled[y]})" if isinstance(y, str) and y in spelled else y
        spelled[q] = f"{x} // {y}"
        out.append((x, y))
    return out


def quotients(multiples: Any) -> dict[str, str]:
    """Each hidden dim Q of a narrowed class as the program's dims write it (`written`): `C // D` for C_D."""
    return {q: f"{x} // {y}" for (x, y), (_, _, q) in zip(written(multiples), multiples)}


def class_text(cls: Any) -> str:
    """A size class ((name, "1" | "n" | "32n" | size), ...) as people read it: `B >= 2, C=1, T a multiple of 32`
    (`tgc.codegen.sizes.class_text`; here, below the compiler, for a loaded package's classes)."""
    words = {"n": " >= 2", "32n": " a multiple of 32"}
    return ", ".join(f"{n}{words.get(c, '=' + str(c))}" for n, c in cls) or "(no dims)"


def short_text(e: Expr, limit: int = 120, positive: Any = ()) -> str | None:
    """`e` as a sum of products (`64*B*T*C_4 + 1024*C_4^2 + 16`), or None where that is longer than `limit`
    characters. Every dim is a size (at least 0), those in `positive` at least 1 (and a product's factors written
    in their order): a `max` (`min`) keeps only the
    terms no other is provably at least (at most), a product being at least another it contains times sizes of
    at least 1; a `max`, `min`, `//` or `%` that stays is written as one term."""
    Poly = dict[tuple[str, ...], int]
    sizes: set[str] = set()  # the dims and the terms kept whole that are at least 0
    ones: set[str] = set(positive)  # (those at least 1)
    rank = {n: i for i, n in enumerate(positive)}  # (a product's factors in this order, then by name)

    def key(t: str) -> tuple[int, str]:
        return rank.get(t, len(rank)), t

    def add(a: Poly, b: Poly, sign: int = 1) -> Poly:
        out = dict(a)
        for m, c in b.items():
            out[m] = out.get(m, 0) + sign * c
        return {m: c for m, c in out.items() if c}

    def mul(a: Poly, b: Poly) -> Poly:
        if len(a) * len(b) > MAX_NODES:  # (a product of long sums: no short text)
            raise ExprError("too many terms")
        out: Poly = {}
        for ma, ca in a.items():
            for mb, cb in b.items():
                m = tuple(sorted(ma + mb, key=key))
                out[m] = out.get(m, 0) + ca * cb
        return {m: c for m, c in out.items() if c}

    def contains(m: tuple[str, ...], sub: tuple[str, ...]) -> bool:  # m = sub times factors of at least 1
        rest = list(m)
        for t in sub:
            if t not in rest:
                return False
            rest.remove(t)
        return all(t in ones for t in rest)

    def at_least(a: Poly, b: Poly) -> bool:
        """a >= b at every size: each negative term of a - b covered by positive ones that contain it."""
        d = add(a, b, -1)
        pos = {m: c for m, c in d.items() if c > 0}
        for m, c in sorted(((m, -c) for m, c in d.items() if c < 0), key=lambda mc: -len(mc[0])):
            if any(t not in sizes for t in m):
                return False
            for big in [b for b in pos if contains(b, m)]:
                used = min(pos[big], c)
                pos[big] -= used
                c -= used
            if c:
                return False
        return all(t in sizes for m in pos for t in m)

    def at_least_0(p: Poly) -> bool:  # (no negative coefficient, every term a product of sizes)
        return all(c > 0 and all(t in sizes for t in m) for m, c in p.items())

    def term(t: str, known_at_least_0: bool) -> Poly:
        if known_at_least_0:
            sizes.add(t)
        return {(t,): 1}

    def flat(op: str, x: Expr) -> list[Expr]:
        return flat(op, x[1]) + flat(op, x[2]) if isinstance(x, list) and x[0] == op else [x]

    def poly(x: Expr) -> Poly:
        if isinstance(x, int):
            return {(): x} if x else {}
        if isinstance(x, str):
            return term(x, True)
        op = x[0]
        if op in ("max", "min"):
            keep: list[Poly] = []
            for p in (poly(y) for y in flat(op, x)):
                if any(at_least(k, p) if op == "max" else at_least(p, k) for k in keep):
                    continue
                keep = [k for k in keep if not (at_least(p, k) if op == "max" else at_least(k, p))] + [p]
            if len(keep) == 1:
                return keep[0]
            return term(f"{op}({', '.join(poly_text(k) for k in keep)})",
                        (any if op == "max" else all)(at_least_0(k) for k in keep))
        a, b = poly(x[1]), poly(x[2])
        if op == "+":
            return add(a, b)
        if op == "-":
            return add(a, b, -1)
        if op == "*":
            return mul(a, b)
        # (a product before `//` reads as one operand, as in Python; after it, only a constant or one term does)
        left = poly_text(a) if len(a) <= 1 else f"({poly_text(a)})"
        right = poly_text(b) if len(b) == 1 and [(m, c) for m, c in b.items() if m == () or c == 1 and len(m) == 1] \
            else f"({poly_text(b)})"
        return term(f"({left} {op} {right})", at_least_0(a) and at_least_0(b) and bool(b))

    def mono_text(m: tuple[str, ...], c: int) -> str:
        names = [t if m.count(t) == 1 else f"{t}^{m.count(t)}" for t in dict.fromkeys(m)]
        return "*".join(([str(c)] if c != 1 or not m else []) + names)

    def poly_text(p: Poly) -> str:
        if not p:
            return "0"
        order = sorted(p, key=lambda m: (-len(m), [key(t) for t in m]))
        out = mono_text(order[0], p[order[0]]) if p[order[0]] > 0 else "-" + mono_text(order[0], -p[order[0]])
        for m in order[1:]:
            out += (" + " + mono_text(m, p[m])) if p[m] > 0 else (" - " + mono_text(m, -p[m]))
        return out

    try:
        validate(e)
        s = poly_text(poly(e))
    except (ExprError, RecursionError):
        return None
    return s if len(s) <= limit else None
