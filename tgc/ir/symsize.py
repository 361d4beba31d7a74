"""Sizes that remember their dims: a program's dims as front-end variables, traced once for a size class.

A `SymSize` is an `int` (its value at the size class's representative size, so code that only needs a number
keeps working) that also carries a *monomial* of the dims, `coef * product of dims // div + offset` (the
`tgc.codegen.sizes.Mono` tuple: `(coef, names sorted, offset, div)`). It is hashable and compares equal only to
a `SymSize` of the same monomial, so the nodes whose args hold it (BUFFER shapes, RESHAPE/EXPAND shapes, PAD and
SHRINK bounds, the scheduler's index constants) are the general nodes of the class, never merged with a literal
that happens to have the same value, and two dims of equal value stay two dims.

The one trace runs at the size class's first probe (distinct primes of 211 and more, `sizes.probes`): a
decision against a plain number (a threshold of the scheduler, a slice bound) is answered at that size, as the
probe path answers it; a decision between sizes of different dims is answered only where it holds for every
size of the class (a size of a part of another's dims is the smaller), else refused.

Contract: arithmetic that stays a monomial (`*` by an int or another offset-free size, `+`/`-` an int or a size of
the same dims, `//` and `%` by an int that divides exactly) gives a `SymSize`; `float(s)` and `1.0 / s` give a
`SymFloat` (the float a mean or a cast of a size writes). Every decision the class does not answer raises
`NotTraceable`: a floor division of a dim that does not divide, a product of sizes with offsets, an order
between sizes of unrelated dims, equality with a plain int of the same value, `int(s)` (a size made a plain
number, its dims lost), float arithmetic on a size. The one-trace path (`tgc.api.Program._build_one_trace`)
catches it and takes the probe path instead; a plain constant that still equals a size (a dim lost through code
that reads the raw number) is caught after scheduling (`tgc.codegen.sizes.lost_sizes`).
"""

from __future__ import annotations

from types import NotImplementedType
from typing import Any

Mono = tuple[int, tuple[str, ...], int, int]  # coef * product of dims // div + offset (names sorted, repeated)
SMALLEST = 207  # the probe path's least probe (211) less its largest offset: the size every dim is assumed to pass


class NotTraceable(Exception):
    """A size decision the size class does not answer: the program takes the probe path."""


def _mono_text(m: Mono) -> str:
    coef, names, off, div = m
    text = (str(coef) if coef != 1 else "") + "".join(names)
    if div != 1:
        text += f"d{div}"
    if off:
        text += f"{off:+d}"
    return text


class SymSize(int):
    """An int at the representative size that carries its monomial of the dims (module docstring)."""

    mono: Mono

    def __new__(cls, value: int, mono: Mono) -> SymSize:
        self = super().__new__(cls, value)
        self.mono = mono
        return self

    @staticmethod
    def dim(name: str, value: int) -> SymSize:
        return SymSize(value, (1, (name,), 0, 1))

    @staticmethod
    def make(value: int, mono: Mono) -> int:
        """A SymSize, or a plain int where the monomial has no dims left (a coefficient of 0)."""
        return int.__int__(value) if mono[0] == 0 else SymSize(value, mono)

    # identity: by monomial
    def __hash__(self) -> int:
        return hash(("SymSize", self.mono))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SymSize):
            return self.mono == other.mono
        if isinstance(other, bool) or not isinstance(other, int):
            return NotImplemented if not isinstance(other, float) else _refuse(self, "==", other)
        if other != int.__int__(self):
            return False  # as at the probes: a size differs from a constant it is not
        return _refuse(self, "==", other)

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    # order: the same dims compare exactly; a size of a subset of another's dims is the smaller
    def _cmp(self, other: Any) -> int:
        if isinstance(other, SymSize):
            a, b = self.mono, other.mono
            if a[3] != 1 or b[3] != 1:
                return _refuse(self, "<", other)
            if a[1] == b[1]:
                return (a[0] > b[0]) - (a[0] < b[0]) or (a[2] > b[2]) - (a[2] < b[2])
            if a[0] > 0 and b[0] > 0 and abs(a[2]) < SMALLEST and abs(b[2]) < SMALLEST:
                if _sub(a[1], b[1]) and max(a[0], 1) < SMALLEST:
                    return -1
                if _sub(b[1], a[1]) and max(b[0], 1) < SMALLEST:
                    return 1
            return _refuse(self, "<", other)
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            v = int.__int__(self)  # against a plain number: answered at the traced size, as the probes answer it
            return (v > other) - (v < other)
        return _refuse(self, "<", other)

    def __lt__(self, other: Any) -> bool: return self._cmp(other) < 0
    def __le__(self, other: Any) -> bool: return self._cmp(other) <= 0
    def __gt__(self, other: Any) -> bool: return self._cmp(other) > 0
    def __ge__(self, other: Any) -> bool: return self._cmp(other) >= 0
    def __bool__(self) -> bool: return True

    # arithmetic that stays a monomial
    def __mul__(self, other: Any) -> Any:
        if isinstance(other, SymSize):
            a, b = self.mono, other.mono
            if a[2] or b[2] or a[3] != 1 or b[3] != 1:
                return _refuse(self, "*", other)
            return SymSize(int.__int__(self) * int.__int__(other), (a[0] * b[0], tuple(sorted(a[1] + b[1])), 0, 1))
        if isinstance(other, int) and not isinstance(other, bool):
            c, names, off, div = self.mono
            if div != 1:
                return _refuse(self, "*", other)
            return SymSize.make(int.__mul__(self, other), (c * other, names, off * other, 1))
        if isinstance(other, float):
            return _refuse(self, "*", other)
        return NotImplemented

    __rmul__ = __mul__

    def __add__(self, other: Any) -> Any:
        if isinstance(other, SymSize):
            a, b = self.mono, other.mono
            if a[1] != b[1] or a[3] != 1 or b[3] != 1:
                return _refuse(self, "+", other)
            return SymSize.make(int.__int__(self) + int.__int__(other), (a[0] + b[0], a[1], a[2] + b[2], 1))
        if isinstance(other, int) and not isinstance(other, bool):
            c, names, off, div = self.mono
            return SymSize(int.__add__(self, other), (c, names, off + other, div)) if other else self
        if isinstance(other, float):
            return _refuse(self, "+", other)
        return NotImplemented

    __radd__ = __add__

    def __neg__(self) -> Any:
        c, names, off, div = self.mono
        if div != 1:
            return _refuse(self, "-", 0)
        return SymSize(-int.__int__(self), (-c, names, -off, 1))

    def __sub__(self, other: Any) -> Any:
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return self + (-other)
        return NotImplemented

    def __rsub__(self, other: Any) -> Any:
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return (-self) + other
        return NotImplemented

    def __floordiv__(self, other: Any) -> Any:
        c, names, off, div = self.mono
        if isinstance(other, int) and not isinstance(other, SymSize) and other > 0 and c % other == 0 \
                and off % other == 0:
            return SymSize.make(int.__floordiv__(self, other), (c // other, names, off // other, div))
        if isinstance(other, SymSize) and other.mono == self.mono:
            return 1
        if isinstance(other, SymSize) and not (off or other.mono[2]) and div == 1 == other.mono[3] \
                and other.mono[0] > 0 and c % other.mono[0] == 0 and _sub(other.mono[1], names):
            rest = list(names)
            for n in other.mono[1]:
                rest.remove(n)
            return SymSize(int.__int__(self) // int.__int__(other), (c // other.mono[0], tuple(rest), 0, 1))
        return _refuse(self, "//", other)

    def __mod__(self, other: Any) -> Any:
        c, names, off, div = self.mono
        if isinstance(other, int) and not isinstance(other, SymSize) and other > 0 and c % other == 0 \
                and div == 1:
            return off % other
        if isinstance(other, SymSize) and other.mono == self.mono:
            return 0
        if isinstance(other, SymSize) and not isinstance(self.__floordiv__(other), NotImplementedType):
            return 0  # (divides exactly, else refused)
        if isinstance(other, int) and not isinstance(other, SymSize) and other % UNIT == 0 and c == 1 \
                and len(names) == 1 and off == 0 and div == 1:
            return NONZERO  # a dim of class n is no multiple of 32 (those are class 32n)
        return _refuse(self, "%", other)

    def __rfloordiv__(self, other: Any) -> Any:
        if isinstance(other, int) and abs(other) < SMALLEST and self.mono[0] > 0 and other >= 0:
            return 0
        return _refuse(other, "//", self)

    def __rmod__(self, other: Any) -> Any:
        if isinstance(other, int) and 0 <= other < SMALLEST and self.mono[0] > 0:
            return other
        return _refuse(other, "%", self)

    def __truediv__(self, other: Any) -> Any:
        return _refuse(self, "/", other)

    def __rtruediv__(self, other: Any) -> Any:
        if isinstance(other, (int, float)) and not isinstance(other, bool) and other == 1 \
                and self.mono[2] == 0 and self.mono[3] == 1:
            return SymFloat(1.0 / int.__int__(self), self.mono, "recip")
        return _refuse(other, "/", self)

    def as_float(self) -> SymFloat:
        """The float constant of this size (a size cast to a float dtype)."""
        return SymFloat(float(int.__int__(self)), self.mono, "size")

    def __float__(self) -> float:
        return _refuse(self, "float()", None)

    def __int__(self) -> int:
        return _refuse(self, "int()", None)

    def __pow__(self, other: Any, mod: Any = None) -> Any:
        return _refuse(self, "**", other)

    def __abs__(self) -> Any:
        return self if self.mono[0] > 0 else -self

    def __and__(self, other: Any) -> Any: return _refuse(self, "&", other)
    def __or__(self, other: Any) -> Any: return _refuse(self, "|", other)
    def __xor__(self, other: Any) -> Any: return _refuse(self, "^", other)
    def __lshift__(self, other: Any) -> Any: return _refuse(self, "<<", other)
    def __rshift__(self, other: Any) -> Any: return _refuse(self, ">>", other)
    __rand__, __ror__, __rxor__ = __and__, __or__, __xor__

    def __repr__(self) -> str:
        return _mono_text(self.mono)

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return _mono_text(self.mono) if not spec else format(int.__int__(self), spec)

    def __reduce__(self) -> Any:
        return (SymSize, (int.__int__(self), self.mono))


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
        return hash(("SymFloat", self.kind, self.mono))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SymFloat):
            return (self.kind, self.mono) == (other.kind, other.mono)
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
        return ("1/" if self.kind == "recip" else "") + _mono_text(self.mono)

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
    """A remainder the class says is not 0 (and says nothing more of): truthy, unequal to 0, nothing else."""

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
UNIT = 32  # class 32n: the multiples of this (`tgc.sizeexpr.UNIT`)


def _sub(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether the multiset a is a proper part of b."""
    rest = list(b)
    for n in a:
        if n not in rest:
            return False
        rest.remove(n)
    return bool(rest)


def _refuse(a: Any, op: str, b: Any) -> Any:
    raise NotTraceable(f"the size decision {a!r} {op} {b!r} depends on the dims' values")


def is_symbolic(v: Any) -> bool:
    return isinstance(v, (SymSize, SymFloat))


__all__ = ["Mono", "SMALLEST", "NotTraceable", "SymSize", "SymFloat", "is_symbolic"]
