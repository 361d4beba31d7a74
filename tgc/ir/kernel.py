"""One kernel's AST as the scheduler hands it to codegen (`ScheduleItem`), and the small IR helpers both
sides build kernel ASTs with: a row-major flat index, a reduction's identity element."""

from __future__ import annotations

from dataclasses import dataclass, field

from tgc.dtype import DType, dtypes, min_max
from tgc.ir.shapes import strides_for
from tgc.ir.symbolic import simplify
from tgc.ir.uop import Ops, UOp

INDEX = dtypes.index  # 64-bit while scheduling and optimizing; narrowed to i32 per kernel where it provably fits


@dataclass
class ScheduleItem:
    """One kernel: `ast` is SINK(STORE(DEFINE_GLOBAL 0, index, value)); `bufs[i]` is the tensor node held
    by DEFINE_GLOBAL i (bufs[0] is the output)."""

    ast: UOp
    bufs: list[UOp]
    name: str = ""
    line: int | None = None
    meta: dict = field(default_factory=dict)

    @property
    def output(self) -> UOp:
        return self.bufs[0]


def kernel_names(items: list[ScheduleItem]) -> list[str]:
    """The names a program's kernels get (`Program.compile`, `tgc beam`'s rows, profiles): a schedule item's name,
    with `n1`, `n2`, ... after its repeats."""
    seen: dict[str, int] = {}
    names = []
    for item in items:
        n = seen.get(item.name, 0)
        seen[item.name] = n + 1
        names.append(f"{item.name}n{n}" if n else item.name)
    return names


def flat_index(idx: tuple[UOp, ...], shape: tuple[int, ...], memo: dict[UOp, UOp] | None = None) -> UOp:
    """The row-major element offset of index `idx` in a tensor of `shape` (simplified; `memo`: `simplify`'s)."""
    out = UOp.const(INDEX, 0)
    for i, st, s in zip(idx, strides_for(shape), shape):
        if s != 1:
            out = out + i * UOp.const(INDEX, st)
    return simplify(out, memo)


def identity(op: Ops, dtype: DType) -> int | float | bool:
    """The identity element of a reduction (`ADD` 0, `MUL` 1, `MAX` the dtype's lowest value). `ONLINE_SOFTMAX`
    has none (its accumulator is a triple): a ValueError."""
    if op is Ops.ONLINE_SOFTMAX:
        raise ValueError("ONLINE_SOFTMAX has no identity element (its accumulator is the triple m, l, o)")
    if op is Ops.ADD:
        return 0
    if op is Ops.MUL:
        return 1
    lo, _ = min_max(dtype)
    return lo
