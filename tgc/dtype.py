"""Data types and the promotion lattice of DSL.md (JAX/tinygrad style, not numpy's)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, order=True)
class DType:
    """A scalar type. `count > 1` is a vector of `count` lanes; `ptr` marks a pointer to global memory."""

    priority: int  # ordering inside a kind, used by promotion
    itemsize: int
    name: str  # the DSL name: f32, i32, ...
    fmt: str | None  # numpy type string, None for bf16 (stored as uint16)
    count: int = 1
    ptr: bool = False

    def __post_init__(self) -> None:
        # the hash, computed once (the same value as the dataclass's: the hash of the fields' tuple): a DType is
        # part of every UOp's hash-consing key (`UOp.__new__`), and the dataclass's `__hash__` built and hashed
        # that tuple at every lookup (~0.23 M calls in the process lowering ResNet-50, ~0.07 s of its CPU)
        object.__setattr__(self, "_hash", hash((self.priority, self.itemsize, self.name, self.fmt, self.count,
                                                self.ptr)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def vec(self, n: int) -> DType:
        return _derived(self.priority, self.itemsize, self.name, self.fmt, n, self.ptr)

    def scalar(self) -> DType:
        return _derived(self.priority, self.itemsize, self.name, self.fmt, 1, False)

    def as_ptr(self) -> DType:
        return _derived(self.priority, self.itemsize, self.name, self.fmt, self.count, True)

    @property
    def is_float(self) -> bool:
        return self.name[0] in "fb" and self.name != "bool"

    @property
    def is_int(self) -> bool:
        return self.name[0] in "iu"

    @property
    def is_unsigned(self) -> bool:
        return self.name[0] == "u"

    @property
    def is_bool(self) -> bool:
        return self.name == "bool"

    @property
    def np(self) -> np.dtype:
        """The numpy dtype holding this type's bits (bf16 is held as uint16)."""
        return np.dtype("uint16" if self.name == "bf16" else self.fmt)

    @property
    def bits(self) -> int:
        return self.itemsize * 8

    def __repr__(self) -> str:
        s = self.name if self.count == 1 else f"{self.name}x{self.count}"
        return s + "*" if self.ptr else s


# the types `vec`, `scalar` and `as_ptr` made, by their fields: each made once (a new DType per call was ~15 k
# dataclass inits in a cold ResNet-50), equal to and hashing as a fresh one would. Never one of `dtypes`' own
# members (identity tests against them, `u.dtype is INDEX`, answer as they did for a fresh one)
_DERIVED: dict[tuple, DType] = {}


def _derived(priority: int, itemsize: int, name: str, fmt: str | None, count: int, ptr: bool) -> DType:
    key = (priority, itemsize, name, fmt, count, ptr)
    d = _DERIVED.get(key)
    if d is None:
        d = _DERIVED[key] = DType(priority, itemsize, name, fmt, count, ptr)
    return d


class dtypes:
    bool = DType(0, 1, "bool", "?")
    i8 = DType(1, 1, "i8", "b")
    u8 = DType(2, 1, "u8", "B")
    i16 = DType(3, 2, "i16", "h")
    u16 = DType(4, 2, "u16", "H")
    i32 = DType(5, 4, "i32", "i")
    u32 = DType(6, 4, "u32", "I")
    i64 = DType(7, 8, "i64", "q")
    u64 = DType(8, 8, "u64", "Q")
    f16 = DType(9, 2, "f16", "e")
    bf16 = DType(10, 2, "bf16", None)
    f32 = DType(11, 4, "f32", "f")
    f64 = DType(12, 8, "f64", "d")
    # Index arithmetic (loop variables, addresses) before codegen picks its width: every kernel's index
    # math becomes i32 or i64 (`tgc.codegen.index`). Not a DSL type: it is in neither `all` nor `by_name`.
    index = DType(7, 8, "index", "q")

    all: tuple[DType, ...] = ()
    by_name: dict[str, DType] = {}

    @staticmethod
    def from_numpy(d: np.dtype) -> DType | None:
        return _NP_TO_DTYPE.get(np.dtype(d).str[1:])


dtypes.all = (dtypes.bool, dtypes.i8, dtypes.u8, dtypes.i16, dtypes.u16, dtypes.i32, dtypes.u32, dtypes.i64,
              dtypes.u64, dtypes.f16, dtypes.bf16, dtypes.f32, dtypes.f64)
dtypes.by_name = {d.name: d for d in dtypes.all}
_NP_TO_DTYPE = {np.dtype(d.fmt).str[1:]: d for d in dtypes.all if d.fmt is not None}

_SIGNED_BY_SIZE = {1: dtypes.i8, 2: dtypes.i16, 4: dtypes.i32, 8: dtypes.i64}


class PromotionError(Exception):
    pass


def promote(a: DType, b: DType) -> DType:
    """The result type of a binary op on two tensors (DSL.md 'Promotion')."""
    a, b = a.scalar(), b.scalar()
    if a == b:
        return a
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.is_float and b.is_float:
        if {a.name, b.name} == {"f16", "bf16"}:
            return dtypes.f32
        return a if a.itemsize > b.itemsize else b
    if a.is_float:
        return a
    if b.is_float:
        return b
    if a.is_unsigned == b.is_unsigned:
        return a if a.itemsize > b.itemsize else b
    signed, unsigned = (a, b) if not a.is_unsigned else (b, a)
    if signed.itemsize > unsigned.itemsize:
        return signed
    if unsigned.itemsize >= 8:
        raise PromotionError(f"no integer type holds both {a.name} and {b.name}")
    return _SIGNED_BY_SIZE[unsigned.itemsize * 2]


def sum_dtype(d: DType) -> DType:
    """The result type of `sum`/`prod` (DSL.md 'Semantics')."""
    if d.name in ("bool", "i8", "i16"):
        return dtypes.i32
    if d.name in ("u8", "u16"):
        return dtypes.u32
    return d


def truncate(value: float | int | bool, d: DType) -> float | int | bool:
    """A Python constant as the value `d` holds (ints wrap, floats round)."""
    if d.is_bool:
        return bool(value)
    if d.is_int:
        v = int(value)
        mask = (1 << d.bits) - 1
        v &= mask
        if not d.is_unsigned and v >= 1 << (d.bits - 1):
            v -= 1 << d.bits
        return v
    if d.name == "f16":
        return float(np.float16(value))
    if d.name == "f32":
        return float(np.float32(value))
    if d.name == "bf16":
        return float(np.float32(value))  # rounded to bf16 when stored
    return float(value)


def min_max(d: DType) -> tuple[float | int, float | int]:
    if d.is_bool:
        return 0, 1
    if d.is_int:
        if d.is_unsigned:
            return 0, (1 << d.bits) - 1
        return -(1 << (d.bits - 1)), (1 << (d.bits - 1)) - 1
    return -float("inf"), float("inf")


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> f32, exactly. The one conversion this way (any shape, 0-d included)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bits (uint16), round to nearest even, nan -> 0x7FC0: the renderers' sequence. The one
    conversion this way (any shape, 0-d included)."""
    f = np.asarray(x, np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FC0), rounded)
