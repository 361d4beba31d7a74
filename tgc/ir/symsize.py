"""Sizes that remember their dims: a program's dims as front-end variables, traced once for a size class.

A `SymSize` is an `int` (its value at the traced sizes, so code that only needs a number keeps working) that
also carries a polynomial of the dims with integer coefficients (`terms`: (names sorted, coef) pairs, the
constant under `()`); a size is a monomial, `coef * product of dims + offset` (`mono`, the `Mono` tuple
`(coef, names, offset, 1)`, defined here and used by `tgc.codegen.sizes`), while bounds of index math
(`(M - 1) * N`) may be
sums of them. It is hashable and equal only to a `SymSize` of the same polynomial and traced value, so the
nodes whose args hold it (BUFFER shapes, RESHAPE/EXPAND shapes, PAD and SHRINK bounds, the scheduler's index
constants) are the general nodes of the class, never merged with a literal of the same value, two dims of equal
value stay two, and a trace of another class (other probe sizes) never reuses this one's nodes.

The one trace runs at the size class's first probe (distinct primes of 211 and more, `sizes.probes`), and each
size decision (an order, an equality) is answered where it is the same at both probes (`checked_at`: the
values a second probe would have given, computed from the polynomial without tracing again), as the probe path
answers it by agreeing; a decision the two probes answer differently is refused.

Contract: `+`, `-` and `*` give a `SymSize`; `//` and `%` by an int (or a size) that divides every term exactly
too; `float` constants of a size and `1.0 / s` are `SymFloat`s (the float a mean or a cast of a size writes).
Every decision the class does not answer raises `NotTraceable`: a floor division of a dim that does not divide,
an order or equality that differs between the probes, `int(s)` or `float(s)` (a size made a plain number, its
dims lost), float arithmetic on a size. The one-trace path (`tgc.api.Program._build_one_trace`) catches it and
takes the probe path instead; a plain constant that still equals a size (a dim lost through code that reads
the raw number) is caught after scheduling (`tgc.codegen.sizes.lost_sizes`).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

Mono = tuple[int, tuple[str, ...], int, int]  # coef * product of dims // div + offset (names sorted, repeated)
Terms = tuple[tuple[tuple[str, ...], int], ...]  # a polynomial: (names sorted, coef), sorted, no zero coefs
SMALLEST = 207  # the probe path's least probe (211) less its largest offset: the size every dim is assumed to pass
UNIT = 32  # class 32n: the multiples of this (`tgc.sizeexpr.UNIT`)

# the dims' values at which each decision must come out the same (the probes); empty: the traced value alone
_POINTS: contextvars.ContextVar[tuple[Mapping[str, int], ...]] = contextvars.ContextVar("points", default=())


# within `recording`: the front end's decisions (a quotient kept the same is a bound there: `_kept_quotient`)
_FRONT: contextvars.ContextVar[bool] = contextvars.ContextVar("front", default=False)

# within `answering_at`: the dims at which every size decision is answered instead (nothing checked or recorded)
_AT: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("at", default=None)

# the decisions answered within `checked_at`: (the polynomial, its sign at the traced sizes and the probes)
_DECIDED: contextvars.ContextVar[list[tuple[dict[tuple[str, ...], int], int]] | None] = \
    contextvars.ContextVar("decided", default=None)

# within `wanted_multiples`: each floor division `X // Y` of a plain dim X by another dim Y, or by a constant k > 1,
# that the trace asked (`(X, Y)`, `(X, k)`): the divisibility a class would need for it to be exact
_WANTED: contextvars.ContextVar[list[tuple[str, str | int]] | None] = contextvars.ContextVar("wanted", default=None)


@contextlib.contextmanager
def wanted_multiples() -> Iterator[list[tuple[str, str | int]]]:
    """Within: the floor divisions of a dim by a dim or a constant that the trace meets (`_WANTED`) go to the
    list yielded, in the order met (`tgc.api.Program._build_symbolic` retries a class that has no plan with X a
    multiple of Y: `C // D` heads)."""
    token = _WANTED.set([])
    try:
        yield _WANTED.get()  # type: ignore[misc]
    finally:
        _WANTED.reset(token)


def _want(a: Any, b: Any) -> None:
    """Record `a // b` in `_WANTED` where the program divides (the front end, `recording`; the scheduler's
    divisions choose the speed) a size by a plain dim Y or an int k above 1, and X a multiple of it would make the
    division exact: `X // Y` and `(X + Y * ...) // Y` (a stride-P window's count `(IMG - P) // P + 1`) for a plain
    dim X; `(a * X + r) // k` (a pooling's `(S - 2) // 2 + 1`: `a * Q + r // k` with X = Q * k)."""
    out = _WANTED.get()
    if out is None or not _FRONT.get() or not isinstance(a, SymSize):  # (the program's own)
        return
    y = None
    if isinstance(b, SymSize):
        if len(b.terms) != 1 or b.terms[0][1] != 1 or len(b.terms[0][0]) != 1 or "/" in b.terms[0][0][0]:
            return
        y = b.terms[0][0][0]
        if dict(a.terms).get((), 0):
            return  # (a constant over a dim: exact at no multiple)
    elif not isinstance(b, int) or isinstance(b, bool) or b <= 1:
        return
    lead = [(names, coef) for names, coef in a.terms if names and (y is None or y not in names)]
    if len(lead) != 1:
        return
    (names, coef), = lead
    if len(names) != 1 or "/" in names[0] or names[0] == y or (coef != 1 if y is not None else coef % b == 0):
        return
    want: tuple[str, str | int] = (names[0], y if y is not None else int(b))
    if want not in out:
        out.append(want)


@contextlib.contextmanager
def checked_at(points: Sequence[Mapping[str, int]]) -> Iterator[list[tuple[dict[tuple[str, ...], int], int]]]:
    """Within: every size decision must come out the same at each of these dims (the probes). Yields the list
    of the decisions answered (a polynomial of the dims and its sign), for `decided_from`."""
    decided: list[tuple[dict[tuple[str, ...], int], int]] = []
    token, token2 = _POINTS.set(tuple(points)), _DECIDED.set(decided)
    try:
        yield decided
    finally:
        _POINTS.reset(token)
        _DECIDED.reset(token2)


def decided_from(decided: Sequence[tuple[Mapping[tuple[str, ...], int], int]]) -> int:
    """The least size from which every symbolic dim keeps the answers of these decisions, as far as they are
    bounds from below: a polynomial whose every term of the dims has the sign it had (`N - 100 > 0`, `200 - N <
    0`, `N != 100`) keeps it wherever every dim exceeds its constant. (A slice of `y[-100:100]` clamps otherwise:
    the plan is checked against the source below it.) Bounds from above (`N < 300`): `decided_upto`."""
    least = 2
    for t, s in decided:
        lead = [c for k, c in t.items() if k]
        if s and lead and all((c > 0) == (s > 0) for c in lead):
            # (an atom `(a * N + r) // k` exceeds the constant where N exceeds k times it)
            scale = max([_divisor(k) for k, c in t.items() if k and c] or [1])
            least = max(least, scale * (abs(t.get((), 0)) + 1))
        elif s and any(c for c in lead) and _monotone(t) == s:
            # terms of both signs that grow together in the answer's direction over the class (`MN - N - 100`:
            # N(M - 1) - 100): kept from the least size that keeps it with every dim there
            lo, hi = 1, 1 << 40  # not kept with every dim at lo (or lo = 1), kept at hi (as at the probes)
            if not _kept_at(t, s, hi):
                continue
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if _kept_at(t, s, mid) else (mid, hi)
            least = max(least, hi)
    return least


def _monotone(t: Mapping[tuple[str, ...], int]) -> int:
    """1 (-1) where the polynomial grows (shrinks) with each dim over the class's sizes (every dim at least 2):
    its terms, each variable written as its least value in the class plus a variable from 0 (`N = 2 + n`; an
    atom, nondecreasing in its dim, at its value there), all of that sign but the constant; else 0. (`MN - N` is
    `2 + 2m + n + mn`: 1; `2M - N` is `2 + 2m - n`: 0.)"""
    out: dict[tuple[str, ...], int] = {}
    for names, coef in t.items():
        terms: dict[tuple[str, ...], int] = {(): coef}
        for n in names:
            low = value_of(n, {base_dim(n): 2})
            nxt: dict[tuple[str, ...], int] = {}
            for k, c in terms.items():
                nxt[k] = nxt.get(k, 0) + c * low
                k2 = tuple(sorted(k + (n,)))
                nxt[k2] = nxt.get(k2, 0) + c
            terms = nxt
        for k, c in terms.items():
            out[k] = out.get(k, 0) + c
    signs = {c > 0 for k, c in out.items() if k and c}
    return 0 if len(signs) != 1 else (1 if signs == {True} else -1)


INDEX_LIMIT = 2 ** 31 - 1  # decisions at this size or past it choose an index width, not a result


def decided_upto(decided: Sequence[tuple[Mapping[tuple[str, ...], int], int]]) -> int | None:
    """The largest size up to which every symbolic dim keeps the answers of these decisions, as far as they are
    bounds from above (`N - 300 < 0`: a slice `x[:300]` that is all of x at the probes; `N != 300` is read as
    one too), or None where none bounds. A polynomial whose every term of the dims has the sign opposite to its
    answer's keeps it on the box of dims 2..B where it keeps it with every dim at B (its terms grow with each
    dim). Give it only the front end's decisions (`recording`): the scheduler's thresholds choose speed, not
    the result, and must not bound the plan."""
    top: int | None = None
    for t, s in decided:
        lead = [(k, c) for k, c in t.items() if k and c]
        if not s or not lead or not (all((c > 0) != (s > 0) for _, c in lead) or _monotone(t) == -s):
            continue
        if abs(t.get((), 0)) >= INDEX_LIMIT:  # an index's width (argmax's i32 result, `N * M < 2^31`): every
            continue  # symbolic kernel's launch checks refuse sizes whose indices pass i32 (a box bound of sqrt)
        lo, hi = 1, 1 << 64  # kept with every dim at lo (or lo = 1: none kept), not at hi
        if _kept_at(t, s, hi):
            continue
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if _kept_at(t, s, mid) else (lo, mid)
        top = lo if top is None else min(top, lo)
    return top


class Unanswered(dict):  # type: ignore[type-arg]
    """A decision list's marker (an empty polynomial, skipped by the bounds) for a size decision the probes
    cannot stand for: a remainder of a dim (`N % 3`, 0 at N = 12 where both probes, primes, say not), or a floor
    division of a dim the trace refused (`N // 4 * 4`, which the probes 211 and 223 read as `N - 3`). In the
    front end's decisions it leaves the class without a symbolic form (`decided_across`), on the probe path
    too."""

    def __init__(self, why: str):
        super().__init__()
        self.why = why


def _unanswered(why: str) -> None:
    decided = _DECIDED.get()
    if decided is not None:
        decided.append((Unanswered(why), 0))


class Written(dict):  # type: ignore[type-arg]
    """A recorded decision's polynomial that also carries how the decision reads in the program (`text`, e.g.
    `N // (N//64+1)` for the decisions that keep a quotient): a reason names that, not the polynomial
    (`-63(N//64)+N-62`)."""

    def __init__(self, t: Mapping[tuple[str, ...], int], text: str):
        super().__init__(t)
        self.text = text


def _decision_text(t: Mapping[tuple[str, ...], int], consts: bool = True) -> str:
    """A recorded decision as a reason names it: its `Written` text, else its polynomial."""
    if isinstance(t, Written):
        return t.text
    return _terms_text(tuple(sorted((k, c) for k, c in t.items() if c and (consts or k))))


def decided_across(decided: Sequence[tuple[Mapping[tuple[str, ...], int], int]]) -> str | None:
    """Why no range of sizes keeps these decisions' answers, or None: a decision whose dim terms have both signs
    (`2M - N > 0` of `x[:2 * M]` from a tensor of N; `M == N` in `a if M == N else b`) holds on no box of dims
    from 2 up nor from a size up (at M = 2, N = B it is false for every large B), so `decided_from` and
    `decided_upto` cannot bound it and the plan would give the probes' answer where it flips (`x[:2 * M]` was
    all of x at N = 100, M = 30: 100 elements, numpy 60). Not one whose terms grow together over the class
    (`MN - N`, `N(M - 1)`: `_monotone`), which `decided_from` and `decided_upto` bound. A remainder of a dim or a
    refused floor division (`Unanswered`) holds on no range either. Give it only the front end's decisions
    (`recording`)."""
    for t, s in decided:
        if isinstance(t, Unanswered):
            return t.why
        lead = [c for k, c in t.items() if k and c]
        if any(c > 0 for c in lead) and any(c < 0 for c in lead) and not _monotone(t) \
                and not _holds_everywhere(t, s):
            if (why := decided_by_remainder([(t, s)])) is not None:
                return why  # (a dim with its own floor division: `N - 4 * (N//4)`)
            return f"a size decision on {_decision_text(t)} compares dims with each other (no range of sizes " \
                   "keeps its answer)"
    return None


def decided_by_remainder(decided: Sequence[tuple[Mapping[tuple[str, ...], int], int]]) -> str | None:
    """Why a decision may depend on a remainder, or None: one with dim terms of both signs that holds a
    floor division of a dim (`atom`) with that dim or another of its floor divisions (`H - 2 * (H//2) > 0` is
    true at the odd probes, false at every even H). Any decision of the trace counts (the scheduler's and the
    simplifier's too: a gate dropped by one is a wrong result at the sizes where it flips)."""
    for t, s in decided:
        lead = [(k, c) for k, c in t.items() if k and c]
        if not (any(c > 0 for _, c in lead) and any(c < 0 for _, c in lead)) or _holds_everywhere(t, s):
            continue
        names = {n for k, _ in lead for n in k}
        atoms: dict[str, set[str]] = {}
        for n in names:
            if "/" in n:
                atoms.setdefault(base_dim(n), set()).add(n)
        if any(b in names or len(over) > 1 for b, over in atoms.items()):
            if abs(t.get((), 0)) >= INDEX_LIMIT:  # (an index's width, not a size decision of the program)
                poly = _decision_text(t, consts=False)
                return f"an index width check (whether {poly} stays below {_limit_text(abs(t[()]))}) holds " \
                       "floor divisions of a dim that no range of sizes bounds"
            return f"a size decision on {_decision_text(t)} depends on a remainder of a dim"
    return None


def _limit_text(c: int) -> str:
    """An index width's limit as it reads in a message: `2^31`, `2^63` (the constant is 2^k - 1)."""
    return f"2^{(c + 1).bit_length() - 1}" if (c + 1) & c == 0 else str(c)


def _atom_bound(t: Mapping[tuple[str, ...], int], s: int) -> dict[tuple[str, ...], int] | None:
    """A polynomial of the dims alone, times the product of the atoms' divisors, that bounds `t` on the side of
    its answer `s` (below it for s > 0, above for s < 0) at every size: each atom `(a * N + r) // k` in a term
    replaced by its least value `(a * N + r - k + 1) / k` where the term works for the answer, by `(a * N + r)
    / k` where it works against it (the other factors of a term are dims, positive); None where a term holds
    more than one atom."""
    ks = sorted({atom_parts(n)[3] for k in t for n in k if "/" in n})  # type: ignore[index]
    scale = 1
    for k in ks:
        scale *= k
    out: dict[tuple[str, ...], int] = {}
    for names, coef in t.items():
        at = [n for n in names if "/" in n]
        if len(at) > 1:
            return None
        rest = tuple(n for n in names if "/" not in n)
        if not at:
            out[rest] = out.get(rest, 0) + coef * scale
            continue
        a, dim, r, k = atom_parts(at[0])  # type: ignore[misc]
        e = k - 1 if coef * s > 0 else 0
        c = coef * (scale // k)
        k1 = tuple(sorted(rest + (dim,)))
        out[k1] = out.get(k1, 0) + c * a
        out[rest] = out.get(rest, 0) + c * (r - e)
    return {k: c for k, c in out.items() if c}


def _holds_everywhere(t: Mapping[tuple[str, ...], int], s: int) -> bool:
    """Whether a decision on atoms keeps its answer `s` at every size of the class: its bound (`_atom_bound`)
    moves with every dim in the answer's direction (`_monotone`) and keeps it with every dim at 2 (`N//2 - N <
    0`: its bound N/2 - N; not `H - 2(H//2) > 0`, whose bound is 0), or against it and keeps it with every dim
    at `INDEX_LIMIT`, past every dim a plan serves (an index width's check, `N - N//2 < 2^63 - 1`)."""
    if not s or not any("/" in n for k in t for n in k):
        return False
    b = _atom_bound(t, s)
    if b is None or not any(k for k in b):
        return False
    way = _monotone(b)
    return (way == s and _kept_at(b, s, 2)) or (way == -s and _kept_at(b, s, INDEX_LIMIT))


def _kept_at(t: Mapping[tuple[str, ...], int], s: int, size: int) -> bool:
    """Whether the polynomial `t` has the sign `s` with every dim at `size`."""
    v = _eval(dict(t), {base_dim(n): size for k in t for n in k})
    return (v > 0) - (v < 0) == s


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[dict[tuple[str, ...], int], int]]]:
    """Within: the decisions answered go to a fresh list (yielded), not to the enclosing `checked_at`'s: the
    front end's own decisions (a slice's clamp), which change the program's meaning, told apart from the
    scheduler's heuristics (a split-reduce threshold), which change only its speed."""
    decided: list[tuple[dict[tuple[str, ...], int], int]] = []
    token, token2 = _DECIDED.set(decided), _FRONT.set(True)
    try:
        yield decided
    finally:
        _DECIDED.reset(token)
        _FRONT.reset(token2)


@contextlib.contextmanager
def answering_at(dims: Mapping[str, int]) -> Iterator[None]:
    """Within: each order or equality of sizes is answered at these dims (nothing checked at the probes,
    nothing recorded): what a scheduler rule would decide there (which attentions fuse at the representative
    size), without tracing there."""
    token = _AT.set(dict(dims))
    try:
        yield
    finally:
        _AT.reset(token)


# within `representative`: the dims at which `speed_choice` answers a heuristic's size decisions (the one trace)
_REP: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("rep", default=None)


@contextlib.contextmanager
def representative(dims: Mapping[str, int]) -> Iterator[None]:
    """Within: `speed_choice` answers at these dims (the class's representative size, as the heuristic picks
    the fast variants' opts there)."""
    token = _REP.set(dict(dims))
    try:
        yield
    finally:
        _REP.reset(token)


@contextlib.contextmanager
def speed_choice() -> Iterator[None]:
    """Within: a rule that only chooses the speed (the scheduler's matmul packing: `T >= 256` rows, a copy that
    pays) answers its size decisions at the representative size where one is given (`representative`), nothing
    checked or recorded, as `answering_at`: its answer may differ between the probes (T at 223 and 269) while
    either answer computes the same values at every size of the class. Elsewhere, as every decision."""
    rep = _REP.get()
    if rep is None:
        yield
        return
    with answering_at(rep):
        yield


class NotTraceable(Exception):
    """A size decision the size class does not answer: the program takes the probe path."""


class NotProbeable(NotTraceable):
    """A size the probe path cannot check either (a slice's step that depends on the dims: its length,
    `(N - 1) // (N // 32 + 1) + 1`, can be the same at both probes and differ below them): the class runs
    size-specialized kernels."""


def _terms_text(t: Terms) -> str:
    parts: list[str] = []
    for names, coef in sorted(t, key=lambda nc: (-len(nc[0]), nc[0])):  # the highest degree first
        if not names:
            parts.append(f"{coef:+d}")
            continue
        product = _product_text(names, coef)
        starred = "*" in product or any(len(n) > 1 for n in names if "/" not in n)  # (`4*SEQ`, as `HID*SEQ`)
        text = ("-" if coef == -1 else (f"{coef}*" if starred else str(coef)) if coef != 1 else "") + product
        parts.append(text if not parts or text.startswith("-") else "+" + text)
    return "".join(parts) or "0"


def _product_text(names: tuple[str, ...], coef: int) -> str:
    """A product of dims and floor divisions of dims as a user reads it: `MN`, `M(N//2)`, `(N+1)//2` (an
    atom's name, `(1*N+1)//2`, is the polynomials' variable, not a text for a message). Where a dim's name is
    longer than one letter, the factors are joined with `*` (`HID*SEQ`, `SEQ*(HID//4)`: `HIDSEQ` read as one
    name, and dims A, B and AB made `AABB`)."""
    dims = [n for n in names if "/" not in n]
    atoms = [_atom_text(n) for n in names if "/" in n]
    if len(atoms) == 1 and not dims and coef == 1:
        return atoms[0]
    if _long_names(names):
        return "*".join([*dims, *(f"({a})" for a in atoms)])
    return "".join(dims) + "".join(f"({a})" for a in atoms)


def _long_names(names: tuple[str, ...]) -> bool:
    """Whether a product of `names` is written with `*`: one of its dims' names, or of the traced class's (the
    check points'), is longer than one letter (with dims A, B and AB, A*B is not `AB`)."""
    return any(len(base_dim(n) if "/" in n else n) > 1 for n in names) or \
        any(len(d) > 1 for pt in _POINTS.get()[:1] for d in pt)


def _positive_everywhere(t: Mapping[tuple[str, ...], int]) -> bool:
    """Whether the polynomial `t` is above 0 at every size of the class (every dim at least 2): a constant above
    0, or one that grows with every dim (`_monotone`) and is above 0 with every dim at 2 (`N - 1`)."""
    if not any(k and c for k, c in t.items()):
        return t.get((), 0) > 0
    return _monotone(t) == 1 and _kept_at(t, 1, 2)


def _atom_text(name: str) -> str:
    """`(a * N + r) // k` as it reads in a program: `N//2`, `(N+1)//2`, `(2N+1)//3`."""
    parts = atom_parts(name)
    if parts is None:
        return name
    a, dim, r, k = parts
    head = dim if a == 1 else f"{a}*{dim}" if len(dim) > 1 else f"{a}{dim}"
    return f"{head}//{k}" if not r and a == 1 else f"({head}{'+' + str(r) if r else ''})//{k}"


def _terms(v: Any) -> dict[tuple[str, ...], int]:
    if isinstance(v, SymSize):
        return dict(v.terms)
    return {(): int(v)} if v else {}


_ATOM = re.compile(r"\((\d+)\*([A-Za-z_][A-Za-z0-9_]*)\+(\d+)\)//(\d+)")


def atom(a: int, dim: str, r: int, k: int) -> str:
    """The name of the size `(a * dim + r) // k` (1 <= a < k, 0 <= r < k): a floor division of a dim by a
    constant, a variable of the polynomials of its own whose value at any dims is known (`atom_parts`)."""
    return f"({a}*{dim}+{r})//{k}"


@functools.cache
def atom_parts(name: str) -> tuple[int, str, int, int] | None:
    """(a, dim, r, k) of an `atom` name, or None for a dim's own name."""
    m = _ATOM.fullmatch(name)
    return None if m is None else (int(m[1]), m[2], int(m[3]), int(m[4]))


def value_of(name: str, dims: Mapping[str, int]) -> int:
    """A dim's or an atom's value at these dims."""
    parts = atom_parts(name) if "/" in name else None
    if parts is None:
        return dims[name]
    a, dim, r, k = parts
    return (a * dims[dim] + r) // k


def base_dim(name: str) -> str:
    """The dim an atom divides (a dim itself)."""
    parts = atom_parts(name) if "/" in name else None
    return name if parts is None else parts[1]


def _divisor(names: Sequence[str]) -> int:
    """The product of the divisors of these names' atoms (1 for dims): how much larger the dims must be than a
    bound on the product."""
    out = 1
    for n in names:
        parts = atom_parts(n) if "/" in n else None
        if parts is not None:
            out *= parts[3]
    return out


def _eval(t: Terms | dict, dims: Mapping[str, int]) -> int:
    out = 0
    for names, coef in (t.items() if isinstance(t, dict) else t):
        for n in names:
            coef *= value_of(n, dims)
        out += coef
    return out


def _in_units(t: dict[tuple[str, ...], int]) -> dict[tuple[str, ...], int]:
    """`t` with each dim of a `32n` class and each exact atom of one (`_exact_atom`) written as its multiple of
    the unit `N // 32`: N is `32 * (N//32)` and `(a*N+r) // k` (k dividing 32) is `(32a/k) * (N//32)` at every
    size of the class, exactly (N a multiple of 32). So `CT % T(C//4)` is `32uT % 8uT` with u = C//32, whose
    common factor uT cancels (`SymSize._cancelled`). Unchanged in a class of no 32n dims."""
    if not _POINTS.get():
        return t
    out: dict[tuple[str, ...], int] = {}
    for names, coef in t.items():
        key = []
        for n in names:
            if "/" not in n and _unit_dim(n):
                key.append(atom(1, n, 0, UNIT))
                coef *= UNIT
            elif "/" in n and _exact_atom(n):
                a, dim, _, k = atom_parts(n)  # type: ignore[misc]
                key.append(atom(1, dim, 0, UNIT))
                coef *= UNIT * a // k
            else:
                key.append(n)
        k2 = tuple(sorted(key))
        out[k2] = out.get(k2, 0) + coef
    return {k: c for k, c in out.items() if c}


def _from_units(t: dict[tuple[str, ...], int]) -> dict[tuple[str, ...], int]:
    """`t` of `_in_units` written with the atoms the front end writes: `32 * (N//32)` is N (`_whole_units`), and
    `g * (N//32)` for g dividing 32 is `N // (32/g)` (`8 * (C//32)` is `C//4`, the heads' atom), exact at every
    size of the class (N a multiple of 32)."""
    t = _whole_units(dict(t))
    out: dict[tuple[str, ...], int] = {}
    for names, coef in t.items():
        key = []
        for n in names:
            parts = atom_parts(n) if "/" in n else None
            g = math.gcd(coef, UNIT)
            if parts is not None and parts[0] == 1 and parts[2] == 0 and parts[3] == UNIT and g > 1 \
                    and _exact_atom(n):
                key.append(atom(1, parts[1], 0, UNIT // g))
                coef //= g
            else:
                key.append(n)
        k2 = tuple(sorted(key))
        out[k2] = out.get(k2, 0) + coef
    return {k: c for k, c in out.items() if c}


def gcd(*values: Any) -> Any:
    """A common divisor of ints and sizes, positive (0 where all are 0): `math.gcd` where no size is among them
    (int's own would read a size's traced value: `gcd(4(M//32)(N//32), 4(N//32))` was the plain 892 at the
    probe, and the simplifier then divided by it); else the gcd of every coefficient times the dims and atoms
    common to every term (`_in_units` first: `C` and `C//4` of a 32n C share `C//32`). It divides each value at
    every size of the class: each term is its coefficient, a multiple of the gcd, times a product holding the
    common factors, and the factors are integers (an atom is a floor). It may be smaller than the greatest
    there (`gcd(N, 6)` is 1, 6 at N = 12), which the simplifier's rules take as any common divisor: `(g * a)
    // (g * b)` is `a // b` for every g > 0. An atom that may be 0 in the class (`N//4` of a class-n N at 2) is
    left out, so the divisor is at least 1."""
    if not any(isinstance(v, SymSize) for v in values):
        return math.gcd(*values)
    polys = [p for p in (_in_units(_terms(v)) for v in values) if p]
    g, common = 0, None
    for p in polys:
        for names, c in p.items():
            g = math.gcd(g, c)
            counts = collections.Counter(names)
            common = counts if common is None else common & counts
    names = tuple(sorted(n for n in (common or collections.Counter()).elements()
                         if "/" not in n or value_of(n, {base_dim(n): UNIT if _unit_dim(base_dim(n)) else 2}) >= 1))
    pts = _POINTS.get()
    if not names or not g:
        return g
    if not pts or any(isinstance(v, SymSize) and _eval(v.terms, pts[0]) != v.value for v in values):
        return _refuse(values[0], "gcd", values[1] if len(values) > 1 else None)  # (not at the traced sizes)
    return _make(_eval({names: g}, pts[0]), {names: g})


def _make(value: int, t: dict[tuple[str, ...], int]) -> int:
    """A SymSize, or a plain int where no dims are left."""
    t = _whole_units({k: c for k, c in t.items() if c})
    if not any(k for k in t):
        return t.get((), 0)
    return SymSize(value, tuple(sorted(t.items())))


def _whole_units(t: dict[tuple[str, ...], int]) -> dict[tuple[str, ...], int]:
    """`t` with each exact atom (`_exact_atom`: `(a * N + 0) // k` of a `32n` dim N, k one of UNIT's divisors,
    which is `a * N / k` at every size of the class) in a term whose coefficient k divides written as its dim:
    `32 * (N // 32)` is N, so `(N // 32) * 32 % N` is 0 there as at every probe."""
    if not _POINTS.get() or not any("/" in n for k in t for n in k):
        return t
    while True:
        hit = next(((k, c, n) for k, c in t.items() for n in k if "/" in n and _exact_atom(n)
                    and c % atom_parts(n)[3] == 0 and atom_parts(n)[2] == 0), None)  # type: ignore[index]
        if hit is None:
            return t
        names, coef, name = hit
        a, dim, _, k = atom_parts(name)  # type: ignore[misc]
        rest = list(names)
        rest.remove(name)
        key = tuple(sorted(rest + [dim]))
        del t[names]
        t[key] = t.get(key, 0) + coef // k * a
        t = {key2: c for key2, c in t.items() if c}


def _sign(value: int, t: dict[tuple[str, ...], int], a: Any, op: str, b: Any) -> int:
    """The sign of a polynomial (value: at the traced sizes), where it is the same at every check point."""
    if (at := _AT.get()) is not None:
        v = _eval(t, at)
        return (v > 0) - (v < 0)
    s = (value > 0) - (value < 0)
    for pt in _POINTS.get():
        v = _eval(t, pt)
        if (v > 0) - (v < 0) != s:
            return _refuse(a, op, b)
    _decided(t, s)
    return s


def _decided(t: dict[tuple[str, ...], int], s: int, text: str | None = None) -> None:
    """Record the decision `t` > 0 (s 1), < 0 (-1) or == 0 (0); `text`: how it reads in the program."""
    decided = _DECIDED.get()
    if decided is not None:
        exact = _exact(dict(t))
        decided.append((exact if text is None else Written(exact, text), s))


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class SymSize(int):
    """An int at the traced sizes that carries its polynomial of the dims (module docstring)."""

    terms: Terms

    def __new__(cls, value: int, terms: Terms) -> SymSize:
        self = super().__new__(cls, value)
        self.terms = terms
        return self

    @staticmethod
    def dim(name: str, value: int) -> SymSize:
        return SymSize(value, (((name,), 1),))

    @property
    def mono(self) -> Mono:
        """`coef * product of dims + offset` (refused for a sum of several products)."""
        lead = [(n, c) for n, c in self.terms if n]
        if len(lead) != 1:
            return _refuse(self, "as a product of dims", None)
        return (lead[0][1], lead[0][0], dict(self.terms).get((), 0), 1)

    @property
    def value(self) -> int:
        return int.__int__(self)

    # identity: by polynomial and traced value (a node interned by one trace is not another trace's, whose dims
    # have other values: a class with a dim of 1 traces the others at other probes)
    def __hash__(self) -> int:
        return hash(("SymSize", self.terms, self.value))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SymSize) and other.terms == self.terms:
            return other.value == self.value
        if not _num(other):
            return NotImplemented
        if isinstance(other, float) and not other.is_integer():
            return False
        diff = _terms(self)
        for k, c in _terms(int(other) if not isinstance(other, SymSize) else other).items():
            diff[k] = diff.get(k, 0) - c
        if (at := _AT.get()) is not None:
            return _eval(diff, at) == 0
        value = self.value - (other.value if isinstance(other, SymSize) else int(other))
        if value == 0 or any(_eval(diff, pt) == 0 for pt in _POINTS.get()):
            return _refuse(self, "==", other)
        _decided(diff, (value > 0) - (value < 0))
        return False

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def _cmp(self, other: Any, op: str) -> int:
        if isinstance(other, float):
            v = float(self.value) - other
            if _POINTS.get():
                return _refuse(self, op, other)
            return (v > 0) - (v < 0)
        if not _num(other):
            return _refuse(self, op, other)
        diff = _terms(self)
        for k, c in _terms(other).items():
            diff[k] = diff.get(k, 0) - c
        return _sign(self.value - (other.value if isinstance(other, SymSize) else int(other)), diff, self, op, other)

    def __lt__(self, other: Any) -> bool: return self._cmp(other, "<") < 0
    def __le__(self, other: Any) -> bool: return self._cmp(other, "<=") <= 0
    def __gt__(self, other: Any) -> bool: return self._cmp(other, ">") > 0
    def __ge__(self, other: Any) -> bool: return self._cmp(other, ">=") >= 0
    def __bool__(self) -> bool: return self != 0

    # arithmetic: polynomials
    def __add__(self, other: Any) -> Any:
        if isinstance(other, float):
            return _refuse(self, "+", other)
        if not _num(other):
            return NotImplemented
        t = _terms(self)
        for k, c in _terms(other).items():
            t[k] = t.get(k, 0) + c
        return _make(self.value + (other.value if isinstance(other, SymSize) else int(other)), t)

    __radd__ = __add__

    def __neg__(self) -> Any:
        return _make(-self.value, {k: -c for k, c in self.terms})

    def __pos__(self) -> Any:
        return self

    def __sub__(self, other: Any) -> Any:
        if not _num(other):
            return NotImplemented
        return self + (-other)

    def __rsub__(self, other: Any) -> Any:
        if not _num(other):
            return NotImplemented
        return (-self) + other

    def __mul__(self, other: Any) -> Any:
        if isinstance(other, float):
            return _refuse(self, "*", other)
        if not _num(other):
            return NotImplemented
        t: dict[tuple[str, ...], int] = {}
        for k1, c1 in self.terms:
            for k2, c2 in _terms(other).items():
                k = tuple(sorted(k1 + k2))
                t[k] = t.get(k, 0) + c1 * c2
        return _make(self.value * (other.value if isinstance(other, SymSize) else int(other)), t)

    __rmul__ = __mul__

    def _divided(self, other: Any) -> dict[tuple[str, ...], int] | None:
        """The polynomial divided by `other` (a positive int or a one-term size), where each term divides; or by a
        size of several terms where the polynomial is it times one term (`6BF(T + 1) // 6B(T + 1)`, a broadcast's
        read count over a token count `IMG_P*IMG_P + 1`: F at every size where the divisor is not 0)."""
        if isinstance(other, SymSize) and len(other.terms) > 1:
            return self._multiple_of(other)
        if isinstance(other, SymSize):
            if len(other.terms) != 1 or not other.terms[0][0] or other.terms[0][1] <= 0:
                return None
            (dnames, dcoef), = other.terms
        elif isinstance(other, int) and not isinstance(other, bool) and other > 0:
            dnames, dcoef = (), other
        else:
            return None
        out = {}
        for names, coef in self.terms:
            rest = list(names)
            for n in dnames:
                if n not in rest:
                    return None
                rest.remove(n)
            if coef % dcoef:
                return None
            out[tuple(rest)] = coef // dcoef
        return out

    def _multiple_of(self, other: SymSize) -> dict[tuple[str, ...], int] | None:
        """The polynomial q with `self` = q * `other` exactly, integer coefficients (so `self // other` is q and
        `self % other` is 0 wherever `other` is not 0: a ratio of products of shapes, `(T*T*X) // (T*X)` with T =
        IMG_P*IMG_P + 1), or None: long division in the lexicographic order of the dims' exponents (a monomial
        order, so each step removes self's leading term), none left over."""
        names = sorted({n for k, _ in self.terms + other.terms for n in k})

        def key(k: tuple[str, ...]) -> tuple[int, ...]:
            return tuple(k.count(n) for n in names)

        (lnames, lcoef) = max(other.terms, key=lambda kc: key(kc[0]))
        rest, q = dict(self.terms), {}
        for _ in range(64):  # (a quotient of more terms than a program's sizes hold: refused)
            if not rest:
                return q
            tnames, tcoef = max(rest.items(), key=lambda kc: key(kc[0]))
            left = list(tnames)
            if tcoef % lcoef or any(n not in left or left.remove(n) for n in lnames):  # type: ignore[func-returns-value]
                return None
            qn, qc = tuple(left), tcoef // lcoef
            q[qn] = q.get(qn, 0) + qc
            for names_o, coef_o in other.terms:
                k = tuple(sorted(names_o + qn))
                rest[k] = rest.get(k, 0) - coef_o * qc
                if not rest[k]:
                    del rest[k]
        return None

    def __floordiv__(self, other: Any) -> Any:
        q = self._divided(other)
        if q is not None:
            return _make(self.value // (other.value if isinstance(other, SymSize) else other), q)
        _want(self, other)  # (not exact: a class where self is a multiple of other would make it so)
        if isinstance(other, int) and not isinstance(other, (bool, SymSize)) and other > 0:
            pts = _POINTS.get()
            value = self.value // other
            if pts and all(_eval(self.terms, pt) // other == value for pt in pts):
                return _kept_quotient(self, other, value)  # (as `_same_quotient`)
            floor = self._floor_atom(other)
            if floor is None:
                floor = self._unit_quotient(other)
            if floor is not None:
                return floor
        if (common := self._cancelled(other)) is not None:  # (proof: `_cancelled`)
            a, b, _, r, _ = common
            return a // b if not r else a // b + (0 if r > 0 else -1)
        if (poly := self._over_sum(other)) is not None:  # (proof: `_over_sum`)
            q, r = poly
            return q if r >= 0 else q - 1
        return self._same_quotient(other)

    def _over_sum(self, other: Any) -> tuple[Any, int] | None:
        """`(q, r)` where `self` is `q * other + r` as polynomials, `other` a sum of products of plain dims with
        positive coefficients (an index bound's `(KH * C_D_KH * (P + 1) - 1) // (C_D_KH * (P + 1))`), r a
        constant with -least <= r < least, least the value of `other` with every dim at its least size in the
        class (2; 32 for a dim of a `32n` class): `other` grows with every dim, so least <= other at every
        size. Then, as in `_cancelled`, `self // other` is q where r >= 0 and q - 1 where r < 0 (-other <= r <
        0), and `self % other` is r, or r + other. Else None."""
        if not isinstance(other, SymSize) or sum(1 for k, _ in other.terms if k) < 2:
            return None
        if any(c <= 0 or any("/" in n for n in k) for k, c in other.terms):
            return None
        least = _eval(dict(other.terms), {n: UNIT if _unit_dim(n) else 2 for k, _ in other.terms for n in k})
        r = dict(self.terms).get((), 0)
        if not -least <= r < least:
            return None
        rest = _make(self.value - r, {k: c for k, c in self.terms if k})
        if not isinstance(rest, SymSize) or (q := rest._multiple_of(other)) is None:
            return None
        return _make((self.value - r) // other.value, q), r

    def _cancelled(self, other: Any) -> tuple[Any, int, Any, int, int] | None:
        """`(a, b, m, r, least)` where `self` is `a * m + r` and `other` is `b * m`: b a positive int, m a product
        of dims and atoms (other's, whole; `_in_units` first, so `C` and `C//4` of a 32n C are multiples of
        `C//32`), r a constant (0 unless b divides every coefficient of a), and `least` the least value of
        `b * m` over the class (at least b); else None. Every dim of m is at least 2 over the class (class n; a
        dim of 0 or 1 is a class of its own, a constant in the trace), and a unit `N//32` of a 32n dim at least
        1; an atom `(a * N + r) // k` is nondecreasing in N, so its least is its value at the least N, and an
        m holding an atom that may be 0 (`N//4` of a class-n N, 0 at N = 2) gives None. With m >= 1, at every
        size of the class (callers: `__floordiv__`, `__mod__`):
        - r = 0: floor(a * m / (b * m)) = floor(a / b) for every integer a (m > 0 cancels from the ratio of
          reals), and a * m - b * m * floor(a / b) = (a % b) * m. (`BCTT // 4BTT` is `C // 4`.)
        - a = b * a': (b a' m + r) // (b m) = a' + r // (b m), and r // (b m) is 0 where 0 <= r < least <= b m,
          -1 where -least <= r < 0 (then -b m <= r < 0); the remainder is r, or r + b m. (`(MN - 1) // N`,
          a bound of an index, is M - 1 at every N >= 2.)"""
        if not isinstance(other, SymSize):
            return None
        dterms, terms = _in_units(dict(other.terms)), _in_units(dict(self.terms))
        if len(dterms) != 1:
            return None
        (dnames, dcoef), = dterms.items()
        if not dnames or dcoef <= 0:
            return None
        least = dcoef
        for n in dnames:
            low = value_of(n, {base_dim(n): UNIT if _unit_dim(base_dim(n)) else 2}) if "/" in n else 2
            if low < 1:
                return None
            least *= low
        t: dict[tuple[str, ...], int] = {}
        r = terms.pop((), 0)
        for names, coef in terms.items():
            rest = list(names)
            for n in dnames:
                if n not in rest:
                    return None
                rest.remove(n)
            t[tuple(rest)] = coef
        if r and (any(c % dcoef for c in t.values()) or not -least <= r < least):
            return None
        m_value = other.value // dcoef
        if m_value <= 0 or (self.value - r) % m_value:
            return None  # (not the traced sizes' product: never, for a size of these terms)
        a_value = (self.value - r) // m_value
        if r or not any(c % dcoef for c in t.values()):  # (a // b exactly: divided here, in units)
            t, a_value, dcoef = {k: c // dcoef for k, c in t.items()}, a_value // dcoef, 1
        m = _make(m_value, _from_units({dnames: 1}))
        return _make(a_value, _from_units(t)), dcoef, m, r, least

    def _unit_quotient(self, k: int) -> Any:
        """`self // k` exact in a class of `32n` dims (`_unit_of`: `MN // 256` at M, N = 32m, 32n): each 32n dim
        written as 32 times its exact atom `(1*N+0)//32`, the coefficients divided by k, and the atoms folded
        back into their dims where 32 divides (`_whole_units`): `4 * (M//32) * (N//32)`; else None."""
        r = dict(self.terms).get((), 0)
        if r % k:  # (`(64m - 1) // 32` is `2m - 1`: the rest a multiple of k at every size, the constant floored)
            if not all((c * _unit_of(names)) % k == 0 for names, c in self.terms if names):
                return None
            rest = _make(self.value - r, {n: c for n, c in self.terms if n})
            q = rest._unit_quotient(k) if isinstance(rest, SymSize) else None
            return None if q is None else q + r // k
        if not all((c * _unit_of(names)) % k == 0 for names, c in self.terms):
            return None
        t: dict[tuple[str, ...], int] = {}
        for names, coef in self.terms:
            out = []
            for n in names:
                if "/" not in n and _unit_dim(n):
                    out.append(atom(1, n, 0, UNIT))
                    coef *= UNIT
                else:
                    out.append(n)
            key = tuple(sorted(out))
            if coef % k:
                return None  # (an atom of an atom: `_unit_of` counted it, the substitution does not reach it)
            t[key] = t.get(key, 0) + coef // k
        return _make(self.value // k, t)

    def _floor_atom(self, k: int) -> Any:
        """`self // k` for an int k that does not divide every term: the terms k divides, divided, plus an
        `atom` `(a * N + r) // k` for the rest, where the rest is one dim times a coefficient plus a constant
        (`(H - 2) // 2` is `H//2 - 1`, a slice's length `(C + 1) // 2`); else None."""
        whole: dict[tuple[str, ...], int] = {}
        rest: list[tuple[tuple[str, ...], int]] = []
        const_r = 0
        for names, coef in self.terms:
            q, r = divmod(coef, k)
            if q:
                whole[names] = q
            if r and names:
                rest.append((names, r))
            elif r:
                const_r = r
        if not rest:  # (`(2N + 1) // 2` is N: the constant's remainder is below k)
            return _make(self.value // k, whole)
        if len(rest) != 1 or len(rest[0][0]) != 1 or "/" in rest[0][0][0]:
            return None
        (dim,), a = rest[0]
        name = atom(a, dim, const_r, k)
        whole[(name,)] = whole.get((name,), 0) + 1
        return _make(self.value // k, whole)

    def _same_quotient(self, other: Any) -> int:
        """`self // other` that does not divide exactly: a plain int where it is the same at the traced sizes
        and at every check point (a ratio of sizes, as a heuristic's read-count, that the probes agree on); a
        quotient that differs between them (a floor division of a dim, `N // 2`) is refused."""
        pts = _POINTS.get()
        positive = isinstance(other, SymSize) or (isinstance(other, int) and not isinstance(other, bool))
        if not pts or not positive or not other > 0:
            return _refuse(self, "//", other)
        q = self.value // (other.value if isinstance(other, SymSize) else other)
        for pt in pts:
            d = _eval(other.terms, pt) if isinstance(other, SymSize) else other
            if d <= 0 or _eval(self.terms, pt) // d != q:
                return _refuse(self, "//", other)
        return _kept_quotient(self, other, q)

    def __mod__(self, other: Any) -> Any:
        if self._divided(other) is not None:
            return 0
        if (common := self._cancelled(other)) is not None:  # (proof: `_cancelled`)
            a, b, m, r, _ = common
            if r:
                return r if r > 0 else other + r
            rest = a % b  # (a remainder the class knows only as not 0 stays that: m >= 1, below `other`)
            return _Nonzero(f"{_text(self)} % {_text(other)}", other) if isinstance(rest, _Nonzero) else rest * m
        if (poly := self._over_sum(other)) is not None:  # (proof: `_over_sum`)
            return poly[1] if poly[1] >= 0 else other + poly[1]
        if isinstance(other, SymSize) and _positive_everywhere(_terms(self)) \
                and _positive_everywhere(_terms(other - self)):
            return self  # (0 < self < other at every size of the class: `(N - 1) % N` is N - 1 for N >= 2)
        if isinstance(other, int) and not isinstance(other, (bool, SymSize)) and other > 0:
            lead = {k: c for k, c in self.terms if k}
            const = dict(self.terms).get((), 0)
            if all(c % other == 0 for c in lead.values()):
                return const % other
            if all(c * _unit_of(k) % other == 0 for k, c in lead.items()):
                return const % other  # (every term a multiple of 32 times its coefficient: a dim of class 32n)
            if other % UNIT == 0 and const == 0 and list(lead.values()) == [1] and len(next(iter(lead))) == 1 \
                    and "/" not in next(iter(lead))[0] and not _unit_dim(next(iter(lead))[0]):
                return NONZERO  # a dim of class n is no multiple of 32 (those are class 32n; an atom may be)
        if isinstance(other, int) and not isinstance(other, bool) and other > 0 and _POINTS.get():
            # a remainder that is not 0 at either probe: the probe path reads it as "does not divide"
            if all(_eval(self.terms, pt) % (_eval(other.terms, pt) if isinstance(other, SymSize) else other)
                   for pt in _POINTS.get()):
                # (only a heuristic may read it: in the front end, the class has no symbolic form)
                _unanswered(f"a size decision on {_text(self)} % {_text(other)} depends on a remainder of a dim")
                return _Nonzero(f"{_text(self)} % {_text(other)}")
        return _refuse(self, "%", other)

    def _rquotient(self, other: Any, op: str) -> int:
        """`other // self` for a plain int, where it is the same at every check point."""
        if not isinstance(other, int) or isinstance(other, bool) or not self:
            return _refuse(other, op, self)
        q = other // self.value
        for pt in _POINTS.get():
            d = _eval(self.terms, pt)
            if not d or other // d != q:
                return _refuse(other, op, self)
        return _kept_quotient(other, self, q) if self.value > 0 else q

    def __rfloordiv__(self, other: Any) -> Any:
        return self._rquotient(other, "//")

    def __rmod__(self, other: Any) -> Any:
        return other - self._rquotient(other, "%") * self

    # (int's own divmod would give the traced sizes' plain ints, the dims lost: the simplifier's `divmod(const,
    # d)` of an index's constant C by a size 3C made a plain 7264, `C` at the probe, in a kernel's index bounds)
    def __divmod__(self, other: Any) -> Any:
        return self // other, self % other

    def __rdivmod__(self, other: Any) -> Any:
        return other // self, other % self

    def __invert__(self) -> Any:
        return _refuse(self, "~", None)

    def __trunc__(self) -> Any:
        return self

    __floor__ = __ceil__ = __trunc__

    def __round__(self, ndigits: Any = None) -> Any:
        return self if ndigits is None or ndigits >= 0 else _refuse(self, "round()", ndigits)

    def __truediv__(self, other: Any) -> Any:
        return _refuse(self, "/", other)

    def __rtruediv__(self, other: Any) -> Any:
        if _num(other) and other == 1 and len([n for n, _ in self.terms if n]) == 1 and self > 0:
            return SymFloat(1.0 / self.value, self.mono, "recip")
        return _refuse(other, "/", self)

    def as_float(self) -> SymFloat:
        """The float constant of this size (a size cast to a float dtype)."""
        return SymFloat(float(self.value), self.mono, "size")

    def __float__(self) -> float:
        return _refuse(self, "float()", None)

    def __int__(self) -> int:
        return _refuse(self, "int()", None)

    def __pow__(self, other: Any, mod: Any = None) -> Any:
        return _refuse(self, "**", other)

    def __abs__(self) -> Any:
        return self if self >= 0 else -self

    def __and__(self, other: Any) -> Any: return _refuse(self, "&", other)
    def __or__(self, other: Any) -> Any: return _refuse(self, "|", other)
    def __xor__(self, other: Any) -> Any: return _refuse(self, "^", other)
    def __lshift__(self, other: Any) -> Any: return _refuse(self, "<<", other)
    def __rshift__(self, other: Any) -> Any: return _refuse(self, ">>", other)
    __rand__, __ror__, __rxor__ = __and__, __or__, __xor__

    def __repr__(self) -> str:
        """The size as the probe path names it in a kernel name (`N`, `3C`, `DN`; a sum written out)."""
        return _terms_text(self.terms)

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self) if not spec else format(self.value, spec)

    def __reduce__(self) -> Any:
        return (SymSize, (self.value, self.terms))


class SymFloat(float):
    """A float made from a size: `float(n)` (kind "size") or `1.0 / n` (kind "recip", a mean's scale). Compares
    equal only to the same kind of the same monomial; arithmetic on it is refused (`NotTraceable`)."""

    mono: Mono
    kind: str

    def __new__(cls, value: float, mono: Mono, kind: str) -> SymFloat:
        self = super().__new__(cls, value)
        self.mono, self.kind = mono, kind
        return self

    def __hash__(self) -> int:
        return hash(("SymFloat", self.kind, self.mono, float.__float__(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SymFloat):
            return (self.kind, self.mono, float.__float__(self)) == (other.kind, other.mono, float.__float__(other))
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            if other in (0, 1) and self.kind == "size":
                return False  # a size is at least 2
            return _refuse(self, "==", other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        coef, names, off, _ = self.mono
        return ("1/" if self.kind == "recip" else "") + _terms_text(tuple(sorted({names: coef, (): off}.items())))

    __str__ = __repr__

    def __reduce__(self) -> Any:
        return (SymFloat, (float.__float__(self), self.mono, self.kind))


def _refuse_float(self: SymFloat, *args: Any) -> Any:
    return _refuse(self, "float arithmetic", args[0] if args else None)


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__", "__neg__", "__lt__",
              "__le__", "__gt__", "__ge__", "__float__", "__int__", "__abs__", "__round__", "__trunc__"):
    setattr(SymFloat, _name, _refuse_float)


class _Nonzero:
    """A remainder the class says is not 0 (and says nothing more of): truthy, unequal to 0, nothing else; any
    arithmetic on it, a comparison or a use as a number is refused (`NotTraceable`, with the remainder's text),
    not a TypeError inside the trace (`x[N - 1] + x[-N]` added 1 to it)."""

    def __init__(self, text: str = "a size % a number", below: Any = None) -> None:
        self.text, self.below = text, below  # (below: its divisor, positive at every size of the class)

    def _use(self, *args: Any) -> Any:
        why = f"the remainder {self.text} is used as a number, and the class says only that it is not 0"
        _unanswered(why)
        raise NotTraceable(why)

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __floordiv__ = __rfloordiv__ = _use
    __mod__ = __rmod__ = __truediv__ = __rtruediv__ = __neg__ = __pos__ = __abs__ = __index__ = __int__ = _use
    __float__ = __le__ = __gt__ = __and__ = __or__ = __lshift__ = __rshift__ = _use

    def __lt__(self, other: Any) -> bool:
        """Below its own divisor (the simplifier's `coef % d < d`): a remainder `a % b` of a b > 0 is in [0, b)
        at every size, whatever it is; no other order is answered."""
        if self.below is not None and type(other) is type(self.below) and other == self.below:
            return True
        return self._use(other)

    def __ge__(self, other: Any) -> bool:
        """At least 0 (a remainder by a positive divisor, as `__lt__`)."""
        if self.below is not None and type(other) is int and other == 0:
            return True
        return self._use(other)

    def __bool__(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return False if other == 0 else _refuse(self, "==", other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "(a remainder that is not 0)"


NONZERO = _Nonzero()


def type_text(v: Any) -> str:
    """A value's kind in a message (a remainder the class answers only as not 0, not the class's name)."""
    if isinstance(v, _Nonzero):
        return f"a remainder of a dim ({v.text})"
    if isinstance(v, SymFloat):
        return f"the float {v!r} of a size"
    return "a size of the dims" if isinstance(v, SymSize) else type(v).__name__


def _kept_quotient(a: Any, b: Any, q: int) -> int:
    """`a // b` (sizes or ints, b positive), the same int `q` at the traced sizes and every check point: q,
    with the decisions that keep it recorded (`q * b <= a < (q + 1) * b`), so a plan is trusted only where
    they hold (`N // 1000` is 0 at the probes: the plan stops at N = 999; `decided_upto`). In the front end
    only: a heuristic's ratio of sizes (`W // (2 * (W//2))`) chooses the speed, not the result."""
    if not _FRONT.get():
        return q
    lo = a - q * b + 1  # (> 0: a >= q * b)
    hi = (q + 1) * b - a  # (> 0)
    for t in (lo, hi):
        if isinstance(t, SymSize):
            _decided(_terms(t), 1, f"{_text(a)} // {_text(b)} (which is {q} at the traced sizes)")
    return q


_USES = {"float()": "read as a plain float", "int()": "read as a plain int", "float arithmetic": "used in float "
         "arithmetic", "as a product of dims": "used where a product of dims is needed"}


def _refuse(a: Any, op: str, b: Any) -> Any:
    if b is None:  # (a use of one size, not a decision between two values)
        why = f"the size {_text(a, operand=False)} is {_USES.get(op, op)}, which loses its dims"
    elif op == "float arithmetic":
        why = f"float arithmetic on {_text(a)} and {_text(b)} depends on the dims' values"
    else:
        why = f"the size decision {_text(a)} {op} {_text(b)} depends on the dims' values"
    if (op in ("//", "%") or any(isinstance(v, _Nonzero) or (isinstance(v, SymSize) and any(
            "/" in n for k, _ in v.terms for n in k)) for v in (a, b))) and not _of_units(a, op, b):
        _unanswered(why)  # (a remainder or a floor division: the probes would read it as a size: `N // 4 * 4`)
    raise NotTraceable(why)


def _unit_dim(name: str) -> bool:
    """Whether a dim is a multiple of `UNIT` at every probe (a `32n` class: its probes are, and so is every
    size it serves; a class n's probes are primes)."""
    pts = _POINTS.get()
    return bool(pts) and all(pt.get(name, 1) % UNIT == 0 for pt in pts)


def multiple_at_every_size(n: Any, k: int) -> bool:
    """Whether the size `n` is a multiple of the int k > 0 at every size of the class (each term a multiple of
    k, a dim of a `32n` class counted as a multiple of 32: `_unit_of`), asking nothing of the probes; a plain
    int, whether k divides it. A remainder the class does not know (`2 * C_D_KH * D_2 * KH % 251`: 0 at one
    probe) is False: a rule that only needs some divisor (`schedule._split_size`) then takes another."""
    if not isinstance(n, SymSize):
        return int(n) % k == 0
    return all((c * _unit_of(names) if names else c) % k == 0 for names, c in n.terms)


def _unit_of(names: Sequence[str]) -> int:
    """What a product of these dims is a multiple of at every size of the class: UNIT for each dim of a `32n`
    class in it (`_unit_dim`), 32a/k for an exact atom of one (`C // 4` at C = 32n: 8), 1 for the others (`N % 32`
    is 0 at N = 32n, `NM % 64` too where both are)."""
    out = 1
    for n in names:
        if "/" not in n and _unit_dim(n):
            out *= UNIT
        elif "/" in n and _exact_atom(n):  # (`a * N / k`: a multiple of 32 * a / k)
            a, _, _, k = atom_parts(n)  # type: ignore[misc]
            out *= UNIT * a // k
    return out


def _exact_atom(name: str) -> bool:
    """An atom `(a * N + r) // k` that is `a * N / k` at every size of the class: N of a `32n` class, k one
    of UNIT's divisors (`C // 4` heads at C = 32n)."""
    parts = atom_parts(name) if "/" in name else None
    return parts is not None and UNIT % parts[3] == 0 and _unit_dim(parts[1])


def _of_units(a: Any, op: str, b: Any) -> bool:
    """Whether the class answers this refused decision as the probes do, no remainder left: every atom in it
    exact (`_exact_atom`), and for `//` or `%` by an int k of UNIT's divisors, every term that k does not
    divide holds a dim of a `32n` class."""
    for v in (a, b):
        if isinstance(v, _Nonzero):
            return False
        if isinstance(v, SymSize) and not all(_exact_atom(n) for k, _ in v.terms for n in k if "/" in n):
            return False
    if op in ("//", "%"):
        if not isinstance(b, int) or isinstance(b, SymSize) or b <= 0 or UNIT % b or not isinstance(a, SymSize):
            return False
        return all(c % b == 0 or any(_unit_dim(base_dim(n)) for n in k) for k, c in a.terms)
    return any(isinstance(v, SymSize) for v in (a, b))


def unit_name(v: Any) -> str | None:
    """`Nd32` for `N // 32` of a dim of a `32n` class (exact there: `_exact_atom`), as the probe path names the
    size `N / 32` in a kernel name (`sizes.symbolic_name`); else None."""
    if not isinstance(v, SymSize) or len(v.terms) != 1 or v.terms[0][1] != 1 or len(v.terms[0][0]) != 1:
        return None
    name = v.terms[0][0][0]
    parts = atom_parts(name) if "/" in name else None
    if parts is None or parts[0] != 1 or parts[3] != UNIT or not _exact_atom(name):
        return None
    return f"{parts[1]}d{UNIT}"


def hidden_spelling(name: str, hidden: Mapping[str, tuple[str, str | int]]) -> str:
    """A hidden dim Q of a narrowed class (`hidden[Q] = (X, Y)`: X traced as Q * Y) as a kernel name spells it:
    `XdY` (`CdD` for `C // D`, `Cd12` for `C // 12`, `CdDdKH` for `C // D // KH`), as the probe path spells
    `N // 32` (`Nd32`); the hidden name `C_D` would read as two sizes in a name whose sizes `_` separates."""
    if name not in hidden:
        return name
    x, y = hidden[name]
    return f"{hidden_spelling(x, hidden)}d{hidden_spelling(y, hidden) if isinstance(y, str) else y}"


def hidden_named(v: SymSize, hidden: Mapping[str, tuple[str, str | int]]) -> SymSize:
    """`v` with its products of a narrowed class's hidden dims written as the program's dims: Q * Y as X (`C_D *
    D` is C; `C_12 * 12` is C), a Q left over as `hidden_spelling` (`CdD`): what a kernel name shows."""
    terms: dict[tuple[str, ...], int] = {}
    for names, coef in v.terms:
        rest = list(names)
        changed = True
        while changed:
            changed = False
            for q, (x, y) in hidden.items():
                if q in rest and (y in rest if isinstance(y, str) else coef % y == 0):
                    rest.remove(q)
                    if isinstance(y, str):
                        rest.remove(y)
                    else:
                        coef //= y
                    rest.append(x)
                    changed = True
        key = tuple(sorted(hidden_spelling(n, hidden) for n in rest))
        terms[key] = terms.get(key, 0) + coef
    return SymSize(v.value, tuple(sorted((k, c) for k, c in terms.items() if c)))


def _exact(t: dict[tuple[str, ...], int]) -> dict[tuple[str, ...], int]:
    """`t` with each exact atom (`_exact_atom`) written as its dim, the polynomial times the atoms' divisors
    (the same sign): what a decision of a `32n` class says of its dims."""
    while True:
        name = next((n for k in t for n in k if "/" in n and _exact_atom(n)), None)
        if name is None:
            return t
        a, dim, _, k = atom_parts(name)  # type: ignore[misc]
        out: dict[tuple[str, ...], int] = {}
        for names, coef in t.items():
            if name in names:
                rest = list(names)
                rest.remove(name)
                key, c = tuple(sorted(rest + [dim])), coef * a
            else:
                key, c = names, coef * k
            out[key] = out.get(key, 0) + c
        t = {key: c for key, c in out.items() if c}


def _text(v: Any, operand: bool = True) -> str:
    """A size in a reason, as the program writes it: a sum in brackets, and a floor division too where it is an
    `operand` (`((N+1)//2+1) // 2`, `(N//32) % 2`: `N//32 % 2` read as N // (32 % 2))."""
    t = repr(v)
    return f"({t})" if isinstance(v, SymSize) and (len(v.terms) > 1 or (operand and "//" in t)) else t


def is_symbolic(v: Any) -> bool:
    return isinstance(v, (SymSize, SymFloat))


__all__ = ["INDEX_LIMIT", "Mono", "SMALLEST", "NotProbeable", "NotTraceable", "SymSize", "SymFloat", "checked_at",
           "decided_from",
           "decided_across", "decided_by_remainder", "decided_upto", "answering_at", "is_symbolic",
           "recording", "type_text", "unit_name", "hidden_named", "hidden_spelling"]
