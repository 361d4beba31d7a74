"""Symbolic sizes: a program's kernels compiled once for every size of its dims, the sizes passed as integer
kernel arguments (DEFINE_VAR).

How: the program is traced and scheduled twice at *probe* dims, distinct primes of at least 211 (the first
probe ascending, the second another set in descending order, so that no order between two dims holds at
both). In each kernel AST every integer constant that factors over the probe primes (a size, a stride, a
product of sizes, times a coefficient) becomes that product of dim variables; an integral float constant the
same, cast. When both probes give the *same* symbolic ASTs, buffer shapes and buffer roles, those kernels are
the program's kernels for every size of its size class; otherwise (a reshape that needs divisibility, a
constant such as `N - 1` or `1 / N` that is not a product of dims, a schedule that changes with the size) the
program has no symbolic form and is compiled per size, as before.

Size classes: each dim is `0`, `1` or `n` (2 or more). Dims of size 0 or 1 change the program's graph
(broadcasting a size-1 axis needs no EXPAND), so they are part of the class and compiled as constants; every
size of 2 or more of a dim shares one kernel. A dim variable is bounded by `fitted_bound` (the products of dims
the kernels form must fit the 64-bit index math; some dims get a bound of their own above the common one); a
larger size is checked at launch and runs the size-specialized kernels instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tgc import sizeexpr
from tgc.codegen.opt import OptOps
from tgc.dtype import dtypes
from tgc.ir.shapes import shape_of
from tgc.ir.symbolic import simplify
from tgc.ir.symsize import (
    INDEX_LIMIT,
    SMALLEST,
    Mono,
    SymFloat,
    SymSize,
    atom_parts,
    hidden_named,
    hidden_spelling,
    value_of,
)
from tgc.ir.uop import Ops, PatternMatcher, RangeKind, UOp, UPat, graph_rewrite, substitute

INDEX = dtypes.index
VAR_PREFIX = "D_"  # kernel argument names: upper case, so they sort before the CPU's core_id (linearize order)


def _primes(n: int, start: int = 211) -> list[int]:
    out: list[int] = []
    k = start
    while len(out) < n:
        if all(k % p for p in range(2, int(k ** 0.5) + 1)):
            out.append(k)
        k += 1
    return out


SizeClass = tuple[tuple[str, str], ...]
SYMBOLIC = ("n", "32n")  # the classes whose dims are kernel arguments


def size_class(names: Sequence[str], dims: Mapping[str, int]) -> SizeClass:
    """Each dim as "0", "1", "32n" (a multiple of 32) or "n" (any other size of 2 or more): the sizes one
    symbolic compile serves (the rule is `tgc.sizeexpr.size_class`, which the program cache's warm path reads)."""
    return sizeexpr.size_class(names, dims)


def class_text(cls: SizeClass) -> str:
    return sizeexpr.class_text(cls)


def probes(cls: SizeClass) -> tuple[dict[str, int], dict[str, int]]:
    """Two probe dims for a class: fixed dims at their size, symbolic ones at primes (ascending, then another
    set descending), times 32 for "32n" dims."""
    sym = [n for n, c in cls if c in SYMBOLIC]
    primes = _primes(2 * len(sym))
    unit = {n: UNIT if c == "32n" else 1 for n, c in cls}
    first, second = primes[:len(sym)], primes[len(sym):][::-1]
    fixed = {n: int(c) for n, c in cls if c not in SYMBOLIC}
    return ({**fixed, **{n: p * unit[n] for n, p in zip(sym, first)}},
            {**fixed, **{n: p * unit[n] for n, p in zip(sym, second)}})


def var_bound(k: int) -> int:
    """The largest size a dim variable may take when a kernel has k of them: their product fits 62 bits."""
    return min(2 ** 31 - 1, 2 ** (62 // max(k, 1)))


def _dim_of(u: UOp) -> str | None:
    """The dim a kernel's dim variable (`D_name`) stands for; None for any other node."""
    if u.op is Ops.DEFINE_VAR and isinstance(u.arg, tuple) and str(u.arg[0]).startswith(VAR_PREFIX):
        return str(u.arg[0])[len(VAR_PREFIX):]
    return None


def _with_bound(asts: Sequence[UOp], bound: int, raised: Mapping[str, int] | None = None) -> list[UOp]:
    """`asts` with every dim variable's upper end `bound`, or its own in `raised` (its least size kept)."""
    raised = raised or {}
    out = []
    for ast in asts:
        mapping = {}
        for u in ast.toposort():
            if (dim := _dim_of(u)) is not None:
                hi = raised.get(dim, bound)
                if u.arg[2] != hi:
                    mapping[u] = UOp(Ops.DEFINE_VAR, u.dtype, u.src, (u.arg[0], u.arg[1], hi))
        out.append(substitute(ast, mapping) if mapping else ast)
    return out


def _index_fits(asts: Sequence[UOp], limit: int = (1 << 63) - 1) -> bool:
    return all(widest <= limit for widest, _ in _index_ranges(asts))


def _index_ranges(asts: Sequence[UOp]) -> list[tuple[int, int]]:
    """Per AST, (the largest magnitude of an index value, of a loop's end)."""
    out = []
    for ast in asts:
        widest = ends = 0
        for u in ast.toposort():
            if u.dtype is not None and u.dtype.scalar() == INDEX and u.dtype.count == 1:
                lo, hi = u.bounds
                widest = max(widest, abs(lo), abs(hi))
                if u.op is Ops.RANGE:
                    ends = max(ends, abs(u.src[0].vmax))
        out.append((widest, ends))
    return out


def _keeps_widths(before: list[tuple[int, int]], after: list[tuple[int, int]]) -> bool:
    """Every index value within `RAISE_MARGIN` after; each AST's loop ends that were 32-bit before still 32-bit (a
    split loop's derived kernel argument is a 32-bit launch value: `split_remainders`)."""
    i32 = (1 << 31) - 1
    return all(w1 <= RAISE_MARGIN and (e0 > i32 or e1 <= i32)
               for (w0, e0), (w1, e1) in zip(before, after))


RAISE_LIMIT = 1 << 15  # a dim raised above the common bound stays at most this (see `fitted_bound`)
# a raised dim keeps its kernels' index values within 2^62 (lowering adds to them: a tail kernel's loop shifted by
# its main part passed 2^63 where the AST's values were just within it, and a fast variant or tail that does not
# lower is dropped, not an error)
RAISE_MARGIN = 1 << 62


def fitted_bound(asts: Sequence[UOp], bound: int, raise_dims: bool = True
                 ) -> tuple[int, dict[str, int], list[UOp]]:
    """(the dim variables' common bound, the dims raised above it with their own bounds, `asts` with them).

    The common bound: the largest power of two up to `bound` (`bound` itself where it fits) at which every index
    value of the symbolic kernel ASTs (buffer sizes, strides, loop ends and the address sums of loop indices
    times strides, by their `vmin`/`vmax` with every dim at the bound) fits 64 bits, as
    `codegen.index.index_width` checks each lowered kernel: the bound is set by the products of dims the
    kernels really form, not by the count of dims. At least 2 (an index past 64 bits even there is
    `index_width`'s error, as ever).

    Then (`raise_dims`, where the common bound is below `RAISE_LIMIT`) each dim's own bound is raised one bit
    at a time, round robin in name order, while every index value still fits 64 bits with the other dims at
    theirs and a kernel whose index values (or loop ends) were 32-bit at the common bound keeps them 32-bit (its
    i32 narrowing, and the odd-size splits' derived loop ends, 32-bit launch values), up to `RAISE_LIMIT`
    (2^15): a dim that the largest products hold to the common bound stays there, one that
    only smaller products form gets more (llama_gqa_block: `wq: [C, C]` with C = 2 * (C // D // KH) * KH * (D //
    2) multiplies six dims, which hold the common bound at 2^10, while F appears only in products with C and
    B * T). Lowering checks each kernel again (`codegen.index.index_width`): an index past 64 bits there
    drops the raised bounds, then cuts the common one (`Program._build_symbolic_bounded`)."""
    if _index_fits(_with_bound(asts, bound)):
        chosen = bound
    else:
        lo, hi = 1, max(1, (bound - 1).bit_length() - 1)  # (2^hi: the largest power of two below `bound`)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _index_fits(_with_bound(asts, 1 << mid)):
                lo = mid
            else:
                hi = mid - 1
        chosen = min(bound, max(2, 1 << lo))
    raised: dict[str, int] = {}
    if raise_dims and chosen < RAISE_LIMIT:
        growing = sorted({d for a in asts for u in a.toposort() if (d := _dim_of(u)) is not None})
        base = _index_ranges(_with_bound(asts, chosen))
        while growing:
            for n in list(growing):
                up = min(RAISE_LIMIT, 2 * raised.get(n, chosen))
                if up > raised.get(n, chosen) and \
                        _keeps_widths(base, _index_ranges(_with_bound(asts, chosen, {**raised, n: up}))):
                    raised[n] = up
                if raised.get(n, chosen) >= RAISE_LIMIT or raised.get(n, chosen) != up:
                    growing.remove(n)
    return chosen, raised, _with_bound(asts, chosen, raised)


MAX_OFFSET = 4  # `N - 1`, `N + 2`: a product of dims plus or minus at most this much
UNIT = sizeexpr.UNIT  # class "32n": a multiple of this, which kernels may assume (vector widths, packed layouts)


def _prime(n: str, probe: Mapping[str, int]) -> tuple[int, int]:
    """(the probe's prime, the dim's unit): a "32n" dim is probed at UNIT * prime."""
    p = probe[n]
    return (p // UNIT, UNIT) if p % UNIT == 0 else (p, 1)


def _product(v: int, probe: Mapping[str, int], symbolic: Sequence[str]) -> tuple[int, tuple[str, ...], int]:
    names: list[str] = []
    sign, v = (-1 if v < 0 else 1), abs(v)
    div = 1
    if v:
        for n in symbolic:
            p, unit = _prime(n, probe)
            while v % p == 0:
                v //= p
                div *= unit
                names.append(n)
    g = _gcd(v, div)
    return sign * (v // g), tuple(sorted(names)), div // g


def _gcd(a: int, b: int) -> int:
    import math
    return math.gcd(a, b) or 1


def factor(v: int, probe: Mapping[str, int], symbolic: Sequence[str]) -> Mono:
    """`v` as coef * product of the symbolic dims // div + a small offset (`(v, (), 0, 1)` when it is not one;
    div > 1 only for "32n" dims, which it divides exactly). The first fit wins; a wrong one (a literal 212
    read as N + 1) is caught by the second probe. A `SymSize` (traced once) is its own monomial."""
    if isinstance(v, SymSize):
        return v.mono
    for off in sorted(range(-MAX_OFFSET, MAX_OFFSET + 1), key=abs):
        coef, names, div = _product(v - off, probe, symbolic)
        if names:
            return coef, names, off, div
    return v, (), 0, 1


def eval_int(u: UOp, env: Mapping[str, int]) -> int | None:
    """The value of an integer expression of constants and named kernel variables, or None."""
    if u.op is Ops.CONST:
        return int(u.arg)
    if u.op is Ops.DEFINE_VAR:
        name = u.arg[0] if isinstance(u.arg, tuple) else u.arg
        return env.get(name)
    vals = [eval_int(s, env) for s in u.src]
    if any(v is None for v in vals):
        return None
    if u.op is Ops.WHERE:
        return vals[1] if vals[0] else vals[2]
    a, b = (vals + [0, 0])[:2]
    ops = {Ops.ADD: lambda: a + b, Ops.SUB: lambda: a - b, Ops.MUL: lambda: a * b, Ops.MAX: lambda: max(a, b),
           Ops.CMPLT: lambda: int(a < b), Ops.CMPNE: lambda: int(a != b), Ops.CMPEQ: lambda: int(a == b),
           Ops.IDIV: lambda: _cdiv(a, b), Ops.MOD: lambda: a - b * _cdiv(a, b) if b else None,
           Ops.CAST: lambda: a, Ops.NEG: lambda: -a}
    f = ops.get(u.op)
    return f() if f is not None else None


def _cdiv(a: int, b: int) -> int | None:
    """C's integer division (truncating), None for a zero divisor."""
    if not b:
        return None
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def mono_value(m: Mono, dims: Mapping[str, int]) -> int:
    out = m[0]
    for n in m[1]:
        out *= value_of(n, dims)  # (a dim, or a floor division of one: `symsize.atom`)
    return out // m[3] + m[2]


def dim_var(name: str, bound: int, low: int = 2) -> UOp:
    return UOp(Ops.DEFINE_VAR, INDEX, (), (VAR_PREFIX + name, low, bound))


def _name_uop(name: str, bound: int, lows: Mapping[str, int]) -> UOp:
    """A dim's variable, or an atom's expression of it (`(a * D_N + r) // k`, `symsize.atom`)."""
    parts = atom_parts(name) if "/" in name else None
    if parts is None:
        return dim_var(name, bound, lows.get(name, 2))
    a, dim, r, k = parts
    v = dim_var(dim, bound, lows.get(dim, 2))
    v = v if a == 1 else v * UOp.const(INDEX, a)
    return (v if r == 0 else v + UOp.const(INDEX, r)) // UOp.const(INDEX, k)


def _mono_uop(m: Mono, bound: int, lows: Mapping[str, int]) -> UOp:
    out = _name_uop(m[1][0], bound, lows)
    for n in m[1][1:]:
        out = out * _name_uop(n, bound, lows)
    out = out if m[0] == 1 else out * UOp.const(INDEX, m[0])
    out = out if m[3] == 1 else out // UOp.const(INDEX, m[3])
    return out if m[2] == 0 else out + UOp.const(INDEX, m[2])


def _terms_uop(terms: Sequence[tuple[tuple[str, ...], int]], bound: int, lows: Mapping[str, int],
               mono: Callable[[Mono], Mono]) -> UOp:
    """A polynomial of the dims (a `SymSize`'s `terms`) as the sum of its products' expressions, each written as
    a monomial is (`mono`: in a class with 32n dims, in units, each exact at every size of the class)."""
    out: UOp | None = None
    const = 0
    for names, coef in terms:
        if not names:
            const = coef
            continue
        m = _mono_uop(mono((coef, names, 0, 1)), bound, lows)
        out = m if out is None else out + m
    assert out is not None
    return out if const == 0 else out + UOp.const(INDEX, const)


def _reciprocal(v: float) -> int | None:
    """m when v is exactly the double 1.0 / m (how the front end writes a mean's 1 / n)."""
    if not 0 < abs(v) < 1:
        return None
    m = round(1.0 / v)
    return m if m and 1.0 / m == v else None


def symbolize_ast(ast: UOp, probe: Mapping[str, int], symbolic: Sequence[str], bound: int) -> UOp:
    """Every constant of `ast` that is a product of probe sizes (plus a small offset), as that expression of
    dim variables; an integral float constant the same, cast; a float 1 / (such a product) as a division."""
    mapping: dict[UOp, UOp] = {}
    for u in ast.toposort():
        if u.op is not Ops.CONST or u.dtype is None or u.dtype.is_bool or u.dtype.count != 1:
            continue
        v, recip = u.arg, False
        if isinstance(v, float):
            if v.is_integer() and abs(v) < 2 ** 53:
                v = int(v)
            elif (r := _reciprocal(v)) is not None:
                v, recip = r, True
            else:
                continue
        if not isinstance(v, int) or isinstance(v, bool):
            continue
        m = factor(v, probe, symbolic)
        if not m[1]:
            continue
        expr = _mono_uop(m, bound, {n: max(2, _prime(n, probe)[1]) for n in symbolic})
        if recip:
            expr = UOp(Ops.FDIV, u.dtype, (UOp.const(u.dtype, 1.0), UOp(Ops.CAST, u.dtype, (expr,))))
        mapping[u] = expr if u.dtype == INDEX else expr if recip else UOp(Ops.CAST, u.dtype, (expr,))
    return substitute(ast, mapping) if mapping else ast


def symbolize_tagged(ast: UOp, bound: int, lows: Mapping[str, int] | None = None,
                     mono: Callable[[Mono], Mono] | None = None) -> UOp | str:
    """A kernel AST scheduled from a trace whose dims are `SymSize`s (`tgc.ir.symsize`: traced once), with each
    size constant as its expression of dim variables, written as `symbolize_ast` writes it from the probes;
    or why it has no symbolic form: a size left in another node's arg, or a plain constant that is a product
    of the representative sizes (a size whose dims were lost, or a literal that looks like one). `lows`: each
    dim's least size where it is not 2 (a `32n` dim's variable starts at 32, as `symbolize_ast` writes it).
    `mono`: each size's monomial as the probe path writes it (a `32n` class: `N // 32` is `N / 32`)."""
    lows = lows or {}
    mono = mono or (lambda m: m)
    mapping: dict[UOp, UOp] = {}
    for u in ast.toposort():
        if u.op is not Ops.CONST:
            if _holds_size(u.arg):
                return "a kernel holds a size of the dims in an operation's fixed settings, where no dim variable " \
                       "can stand"
            continue
        v = u.arg
        if isinstance(v, SymSize):
            if sum(1 for n, _ in v.terms if n) > 1:  # a sum of products (a stride T*C, T = IMG_P*IMG_P + 1)
                expr = _terms_uop(v.terms, bound, lows, mono)
            else:
                expr = _mono_uop(mono(v.mono), bound, lows)
            mapping[u] = expr if u.dtype == INDEX else UOp(Ops.CAST, u.dtype, (expr,))
        elif isinstance(v, SymFloat):
            expr = UOp(Ops.CAST, u.dtype, (_mono_uop(mono(v.mono), bound, lows),))
            mapping[u] = expr if v.kind == "size" else UOp(Ops.FDIV, u.dtype, (UOp.const(u.dtype, 1.0), expr))
    return substitute(ast, mapping) if mapping else ast


def lost_sizes(ast: UOp, rep: Mapping[str, int], symbolic: Sequence[str]) -> str | None:
    """Why a symbolic AST made by `symbolize_tagged` cannot be trusted, or None: a plain constant that is a
    product of the traced sizes (plus a small offset), or a float that is one times or over a small integer (1
    to 16: `0.5 * n`, `2 / n`), as the probe path would see it change between its probes (a size that lost its
    dims through code reading the raw number: Python's `0.5 * n` asks float's multiplication first)."""
    def size_like(v: int) -> bool:  # a size, or a size plus a small offset (`N - 1`), as `factor` reads it
        return abs(v) >= SMALLEST and bool(factor(v, rep, symbolic)[1])

    def product_like(v: int) -> bool:  # times or over a small integer: only an exact product of sizes
        m = factor(v, rep, symbolic)
        return abs(v) >= SMALLEST and bool(m[1]) and m[2] == 0

    for u in ast.toposort():
        if u.op is not Ops.CONST or u.dtype is None or u.dtype.is_bool or u.dtype.count != 1:
            continue
        v = u.arg
        if isinstance(v, bool) or not isinstance(v, (int, float)) or isinstance(v, (SymSize, SymFloat)):
            continue
        if isinstance(v, int):
            lost = size_like(v)
        elif not math.isfinite(v) or v == 0:
            lost = False
        else:
            lost = _near_int(v, size_like) or _near_int(1 / v, size_like) or \
                any(_near_int(v * b, product_like) or _near_int(b / v, product_like) for b in range(2, 17))
        if lost:
            return f"a kernel's constant {u.arg} equals a size of the dims at the traced sizes (a size read as a " \
                   "plain number loses its dims)"
    return None


def _near_int(w: float, test: Any) -> bool:
    """Whether `w` is an integer up to rounding (a float computed from one) that passes `test`."""
    r = round(w) if abs(w) < 2 ** 53 else 0
    return bool(r) and abs(w - r) <= 1e-9 * abs(w) and test(r)


def _holds_size(v: Any) -> bool:
    if isinstance(v, tuple):
        return any(_holds_size(x) for x in v)
    return isinstance(v, (SymSize, SymFloat))


def symbolize_value(v: Any, probe: Mapping[str, int], symbolic: Sequence[str]) -> Any:
    """A nested arg (tuples of ints, floats, bools, strings) with every int as a Mono."""
    if isinstance(v, tuple):
        return tuple(symbolize_value(x, probe, symbolic) for x in v)
    if isinstance(v, SymSize):
        return ("#", v.mono)
    if isinstance(v, SymFloat):
        return ("#f" if v.kind == "size" else "#r", v.mono)
    if isinstance(v, int) and not isinstance(v, bool):
        return ("#", factor(v, probe, symbolic))
    if isinstance(v, float) and v.is_integer() and abs(v) < 2 ** 53 and factor(int(v), probe, symbolic)[1]:
        return ("#f", factor(int(v), probe, symbolic))
    if isinstance(v, float) and (r := _reciprocal(v)) is not None and factor(r, probe, symbolic)[1]:
        return ("#r", factor(r, probe, symbolic))
    return v


def instantiate_value(v: Any, dims: Mapping[str, int]) -> Any:
    """`symbolize_value`'s result at these dims (the value the arg has there)."""
    if isinstance(v, tuple) and len(v) == 2 and v[0] == "#":
        return mono_value(v[1], dims)
    if isinstance(v, tuple) and len(v) == 2 and v[0] == "#f":
        return float(mono_value(v[1], dims))
    if isinstance(v, tuple) and len(v) == 2 and v[0] == "#r":
        n = mono_value(v[1], dims)
        return 1.0 / n if n else None
    if isinstance(v, tuple):
        return tuple(instantiate_value(x, dims) for x in v)
    return v


_NAN = float("nan")  # (every NaN of a signature is this one object: tuples compare items by identity first)


def _same_nan(v: Any) -> Any:
    """`v` with each float NaN in it replaced by `_NAN`, so two signatures holding a NaN constant (a mask's fill,
    ONNX's `ConstantOfShape(nan)`) compare equal: NaN == NaN is False, `_NAN is _NAN` is True."""
    if isinstance(v, tuple):
        return tuple(_same_nan(x) for x in v)
    return _NAN if isinstance(v, float) and v != v else v


def graph_signature(outs: Sequence[UOp], probe: Mapping[str, int] | None = None,
                    symbolic: Sequence[str] = ()) -> tuple:
    """The tensor graph as a tuple of (op, dtype, arg, sources by position) in topological order; with a
    probe, every int in the args as a Mono (so the signature holds for every size of the class). Every NaN in
    an arg is one object (`_same_nan`), so a graph with a NaN constant equals itself."""
    order: dict[UOp, int] = {}
    rows = []
    for o in outs:
        for u in o.toposort():
            if u in order:
                continue
            order[u] = len(order)
            arg = _same_nan(u.arg if probe is None else symbolize_value(u.arg, probe, symbolic))
            rows.append((u.op, u.dtype, arg, tuple(order[s] for s in u.src)))
    rows.append(("outs", tuple(order[o] for o in outs)))
    return tuple(rows)


def instantiate_signature(sig: tuple, dims: Mapping[str, int]) -> tuple:
    return tuple(r if r[0] == "outs" else (r[0], r[1], instantiate_value(r[2], dims), r[3]) for r in sig)


def same_graph(a: tuple, b: tuple) -> bool:
    """Whether two graph signatures are one graph once the operations equal on each are merged: the plan's
    signature at dims where two dims are equal (T = D = 16) has two rows that the graph traced there holds as
    one node (`cast(D)` and `cast(T)` the same constant), and merging them changes no value."""
    table: dict[tuple, int] = {}

    def outs(sig: tuple) -> tuple | None:
        ids: list[int] = []
        for r in sig:
            if r[0] == "outs":
                return tuple(ids[i] for i in r[1])
            ids.append(table.setdefault((r[0], r[1], r[2], tuple(ids[i] for i in r[3])), len(table)))
        return None

    got = outs(a)
    return got is not None and got == outs(b)


def signature_max_constant(sig: tuple) -> int:
    """The largest plain integer (not a size of the dims) in a symbolic graph signature's arguments, below the
    i32 limit: a constant at or past it (argmax's score for the other elements, the index type's minimum) is no
    size a served dim reaches, and a product of dims that passes it is refused by every symbolic kernel's launch
    checks on its indices (`symsize.INDEX_LIMIT`, as `decided_upto`)."""
    best = 0

    def keep(c: int) -> None:
        nonlocal best
        if abs(c) < INDEX_LIMIT:
            best = max(best, abs(c))

    def walk(v: Any) -> None:
        if isinstance(v, tuple) and len(v) == 2 and v[0] in ("#", "#f", "#r"):
            if not v[1][1]:  # a Mono without dims: a plain constant
                keep(int(v[1][0]))
            return
        if isinstance(v, tuple):
            for x in v:
                walk(x)
        elif isinstance(v, int) and not isinstance(v, bool):
            keep(v)

    for row in sig:
        if row[0] is Ops.BUFFER:
            walk(row[2][2])  # (an input's index and name are no sizes: its shape)
        elif row[0] != "outs":
            walk(row[2])
    return best


def trusted_from(sig: tuple, slots: Sequence[Slot] = ()) -> int:
    """The least size from which every symbolic dim is trusted without the source (`T`): at the probes (primes of
    211 and more) every dim exceeds every plain constant of the graph and every size offset, and so it does at
    every size of at least T. Below T a slice or index may clamp, or the scheduler cut another kernel. A floor
    division of a dim by k among the buffers' sizes (`symsize.atom`, traced once: pooling's `H//2`) exceeds
    them from k * T on (`slots`: the plan's `Slot`s)."""
    return max(2, signature_max_constant(sig) + MAX_OFFSET + 1) * signature_divisor(sig, slots)


def signature_divisor(sig: tuple, slots: Sequence[Slot] = ()) -> int:
    """The largest divisor of a floor division of a dim (`symsize.atom`) among a signature's sizes and these
    buffers' shapes, else 1."""
    monos = [m for slot in slots for m in slot.shape]

    def walk(v: Any) -> None:  # (a signature's arg: ("#", mono) for a size, `symbolize_value`)
        if isinstance(v, tuple) and len(v) == 2 and v[0] in ("#", "#f", "#r"):
            monos.append(v[1])
        elif isinstance(v, tuple):
            for x in v:
                walk(x)

    for row in sig:
        if row[0] != "outs":
            walk(row[2])
    divisors = [atom_parts(n)[3] for m in monos for n in m[1] if "/" in n and atom_parts(n) is not None]
    return max(divisors, default=1)


@dataclass
class Slot:
    """A buffer of the launch plan: an input (`input` its declaration index) or a buffer a kernel writes."""
    dtype: Any
    shape: tuple[Mono, ...]
    input: int | None = None


def slots_of(items: Sequence[Any], outs: Sequence[UOp], probe: Mapping[str, int], symbolic: Sequence[str]
             ) -> tuple[list[Slot], list[list[int]], list[int]]:
    """(slots, per kernel its buffers as slot numbers, per output its slot)."""
    index: dict[UOp, int] = {}
    slots: list[Slot] = []

    def slot(node: UOp) -> int:
        if node not in index:
            index[node] = len(slots)
            shape = tuple(factor(s if isinstance(s, SymSize) else int(s), probe, symbolic) for s in shape_of(node))
            inp = node.arg[0] if node.op is Ops.BUFFER else None
            slots.append(Slot(node.dtype, shape, inp))
        return index[node]

    per_kernel = [[slot(b) for b in item.bufs] for item in items]
    return slots, per_kernel, [slot(o) for o in outs]


def same_slots(a: list[Slot], b: list[Slot]) -> bool:
    return [(s.dtype, s.shape, s.input) for s in a] == [(s.dtype, s.shape, s.input) for s in b]


# the size of each symbolic dim where the heuristic picks a symbolic kernel's opts, by class
def instantiate_ast(ast: UOp, dims: Mapping[str, int]) -> UOp:
    """A symbolic AST with its dim variables replaced by these sizes, simplified (the kernel the scheduler cuts
    at these sizes, when the symbolic form is right for them)."""
    mapping = {u: UOp.const(u.dtype, dims[u.arg[0][len(VAR_PREFIX):]]) for u in ast.toposort()
               if u.op is Ops.DEFINE_VAR and u.arg[0].startswith(VAR_PREFIX)}
    if not mapping:
        return ast
    # constants first (a size cast to i32 or f32 is the constant of that dtype the scheduler wrote), then the
    # folds the scheduler's own simplification made
    out = graph_rewrite(substitute(ast, mapping), _fold_casts)
    return simplify(out)


def _cast_const(x: UOp, c: UOp) -> UOp | None:
    if c.dtype != INDEX or x.dtype is None or x.dtype.count != 1 or x.dtype.is_bool:
        return None  # only the casts symbolize_ast wrote (of index-typed sizes)
    return UOp.const(x.dtype, float(c.arg) if x.dtype.is_float else int(c.arg))


def _recip_const(x: UOp, one: UOp, c: UOp) -> UOp | None:
    """`1.0 / n` as symbolize_ast wrote a mean's reciprocal: the double the front end computed."""
    return UOp.const(x.dtype, 1.0 / c.arg) if one.arg == 1.0 and c.arg else None


def _size_const(x: UOp, a: UOp, b: UOp) -> UOp | None:
    """A size expression of the dims substituted (`D_H * D_W`, `(D_H + 0) // 2`) as its constant, so a size
    cast to a float (a mean's `1 / (H * W)`) folds as the scheduler folded it."""
    if x.dtype != INDEX or not isinstance(a.arg, int) or not isinstance(b.arg, int):
        return None
    if x.op is Ops.IDIV:
        return UOp.const(INDEX, a.arg // b.arg) if b.arg > 0 and a.arg >= 0 else None
    return UOp.const(INDEX, a.arg * b.arg if x.op is Ops.MUL else a.arg + b.arg)


_fold_casts = PatternMatcher([
    (UPat((Ops.MUL, Ops.ADD, Ops.IDIV), src=(UPat.cvar("a"), UPat.cvar("b")), name="x"), _size_const),
    (UPat(Ops.CAST, src=(UPat.cvar("c"),), name="x"), _cast_const),
    (UPat(Ops.FDIV, src=(UPat.cvar("one"), UPat.cvar("c")), name="x"), _recip_const),
])


REPRESENTATIVE = {"n": 509, "32n": 512}


@dataclass
class Split:
    """A kernel of class `n` split for its upcasts: the *main* kernel runs each split output loop over the
    largest multiple of its split (a derived kernel argument `<key>m<i>` = end // split * split), with every
    opt; one *tail* kernel per split loop runs its remainder (`<key>r<i>` = end - main, its loop shifted by the
    main part), earlier split loops over their main part, later ones whole, with the opts of the loops that
    divide there. `derived` maps each derived argument to (kind "main"/"rest", end expression, split)."""
    main: UOp
    main_opts: list
    tails: list[tuple[UOp, list]]
    derived: dict[str, tuple[str, UOp, int]]


def split_remainders(ast: UOp, opts: list, key: str, bound: int) -> Split | None:
    """`ast` (prepared, symbolic) and the opts the heuristic picks for it where its sizes divide, as a main
    kernel and tail kernels (`Split`); None when no output loop of symbolic size is split, an opt does not
    fit (a split reduction, a SWAP or LOCAL) or a reduction is shared along a split loop."""
    ranges = sorted({u for u in ast.toposort() if u.op is Ops.RANGE}, key=lambda r: r.arg[0])
    loops = [r for r in ranges if r.arg[1] is RangeKind.LOOP]
    reduces = [r for r in ranges if r.arg[1] is RangeKind.REDUCE]
    per_axis: dict[int, int] = {}
    for o in opts:
        if o.op is OptOps.THREAD:
            continue
        if o.op is OptOps.UPCAST and o.axis < len(loops):
            per_axis[o.axis] = per_axis.get(o.axis, 1) * o.amount
        elif o.op is OptOps.UNROLL and len(loops) <= o.axis < len(loops) + len(reduces) \
                and reduces[o.axis - len(loops)].src[0].op is Ops.CONST:
            continue
        else:
            return None
    split = [i for i in sorted(per_axis) if loops[i].src[0].op is not Ops.CONST]
    if not split:
        return None
    # a reduction shared along a split loop (softmax's row max, fused into its columns' kernel) would be
    # computed again by the tail: not worth it
    for red in (u for u in ast.toposort() if u.op is Ops.REDUCE):
        if any(loops[i] not in red.toposort() for i in split):
            return None
    derived: dict[str, tuple[str, UOp, int]] = {}
    main_var: dict[int, UOp] = {}
    rest_var: dict[int, UOp] = {}
    for i in split:
        end, m = loops[i].src[0], per_axis[i]
        hi = min(int(end.vmax), 2 ** 62)
        derived[f"{key}m{i}"] = ("main", end, m)
        derived[f"{key}r{i}"] = ("rest", end, m)
        main_var[i] = UOp(Ops.DEFINE_VAR, INDEX, (), (VAR_PREFIX + f"{key}m{i}", 0, hi))
        rest_var[i] = UOp(Ops.DEFINE_VAR, INDEX, (), (VAR_PREFIX + f"{key}r{i}", 0, m - 1))

    def over(i: int, end: UOp) -> UOp:
        return UOp(Ops.RANGE, INDEX, (end,), loops[i].arg)

    main = substitute(ast, {loops[i]: over(i, main_var[i]) for i in split})
    tails = []
    for t in split:
        mapping = {loops[i]: over(i, main_var[i]) for i in split if i < t}
        mapping[loops[t]] = over(t, rest_var[t]) + main_var[t]
        keep = [o for o in opts if o.op is not OptOps.THREAD and
                not (o.op is OptOps.UPCAST and o.axis in split and o.axis >= t)]
        tails.append((substitute(ast, mapping), keep))
    return Split(main, list(opts), tails, derived)


def derived_values(derived: Mapping[str, tuple[str, UOp, int]], dims: Mapping[str, int]) -> dict[str, int]:
    """The derived kernel arguments of `Split`s at these dims (with the dims themselves)."""
    env = {VAR_PREFIX + n: v for n, v in dims.items()}
    out = dict(dims)
    for name, (kind, end, m) in derived.items():
        n = eval_int(end, env)
        if n is None:
            raise ValueError(f"the size {name} depends on values the launch does not give")
        out[name] = n // m * m if kind == "main" else n - n // m * m
    return out


def name_shape(name: str) -> str:
    """A kernel name with its sizes blanked (`r_512_512` -> `r_#_#`): kernels of one shape at two sizes."""
    return "_".join("#" if part.isdigit() else part for part in name.split("_"))


def symbolic_name(name: str, probe: Mapping[str, int], symbolic: Sequence[str],
                  hidden: Mapping[str, tuple[str, str | int]] | None = None) -> str:
    """A kernel name whose probe sizes read as the dims' names (`r_101_103` -> `r_N_D`); `hidden`: a narrowed
    class's hidden dims, read as the program's (`symsize.hidden_named`: `C_D * D` is C, `C_D` alone `CdD`)."""
    hidden = hidden or {}
    by_value = {str(probe[n]): hidden_spelling(n, hidden) for n in symbolic}
    by_value.update({str(probe[n] // UNIT): f"{n}d{UNIT}" for n in symbolic if probe[n] % UNIT == 0})

    def part_name(part: str) -> str:
        if part in by_value or not part.isdigit():
            return by_value.get(part, part)
        coef, names, off, div = factor(int(part), probe, symbolic)  # `3 * C` at the probe: `3C`, not `669`
        if not names or off or div != 1 or coef <= 0:
            return part
        if hidden:
            ((names, coef),) = hidden_named(SymSize(int(part), ((tuple(names), coef),)), hidden).terms
        return (str(coef) if coef != 1 else "") + "".join(names)
    return "_".join(part_name(part) for part in name.split("_"))


__all__ = ["SizeClass", "size_class", "class_text", "probes", "var_bound", "fitted_bound", "factor", "mono_value",
           "symbolize_ast",
           "graph_signature", "instantiate_signature", "signature_max_constant", "trusted_from", "Slot", "slots_of",
           "same_graph", "same_slots", "symbolic_name", "symbolize_tagged", "lost_sizes",
           "VAR_PREFIX"]
