"""Bounds of index divisions whose operands may be negative (issue 21, review 18): a GPU grid index of
`x[:, :C - 100]` is divided by the size `C - 100`, whose variable's range (D_C from 2) reaches 0 and below. Its
IDIV had the index dtype's range, which the MUL after it carried past 64 bits at every bound tried, so OPENCL had
no symbolic plan (CPU, with no flattened grid, had one). Now |a // b| <= |a| and |a % b| < |b| for b != 0
(`tgc.ir.uop._bounds`), checked here against every value of small ranges, floor and truncate; the program
against numpy at sizes of the class, C just above 100 included."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import tgc
from tgc.dtype import dtypes
from tgc.ir.uop import Ops, UOp

SLICE = "x: f32[T, C]\nreturn x[:, : C - 100] * 2.0\n"


def _var(name: str, lo: int, hi: int) -> UOp:
    return UOp(Ops.DEFINE_VAR, dtypes.index, (), (name, lo, hi))


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


RANGES = [(-5, 7), (0, 9), (-9, 0), (-4, -1), (3, 8), (0, 0), (-1, 1)]


@pytest.mark.parametrize("ra,rb", list(itertools.product(RANGES, RANGES)))
def test_index_division_bounds_hold_every_value_floor_and_truncate(ra, rb):
    a, b = _var("a", *ra), _var("b", *rb)
    (dlo, dhi), (mlo, mhi) = (a // b).bounds, (a % b).bounds
    for x, y in itertools.product(range(ra[0], ra[1] + 1), range(rb[0], rb[1] + 1)):
        if y == 0:
            continue  # (never executed: an index divides by a size it has threads for)
        for q in (x // y, _trunc_div(x, y)):
            assert dlo <= q <= dhi, (ra, rb, x, y, q, (dlo, dhi))
            assert mlo <= x - q * y <= mhi, (ra, rb, x, y, x - q * y, (mlo, mhi))


def test_a_divisor_reaching_zero_keeps_the_numerators_size():
    # (the kernel's index: gidx // (C - 100) % T, with C from 2; was the index dtype's range, +-2^63)
    c = _var("D_C", 2, 256) + (-100)
    g = _var("g", 0, 39935)
    assert (g // c).bounds == (-39935, 39935)
    assert (g // c % _var("D_T", 2, 256)).bounds == (-255, 255)
    assert (g // c % _var("D_T", 2, 256) * c).bounds == (-255 * 156, 255 * 156)
    # data divides by what it holds (its dtype's range: a division by 0 is no index's)
    i = UOp(Ops.DEFINE_VAR, dtypes.i32, (), ("i", -5, 7))
    assert (i // UOp(Ops.DEFINE_VAR, dtypes.i32, (), ("j", -1, 1))).bounds == (-(1 << 31), (1 << 31) - 1)


@pytest.mark.parametrize("device", ["OPENCL", "PYTHON", "CPU"])
def test_a_slice_to_c_minus_100_has_a_plan_and_matches_numpy(device):
    if device == "OPENCL":
        from langkit import device_skip_reason
        why = device_skip_reason("OPENCL")
        if why is not None:
            pytest.skip(why)
    prog = tgc.loads(SLICE)
    plan = prog.compile_symbolic(device)  # (OPENCL: "an index ... past 64 bits")
    assert plan.trusted_from == 102
    for t, c in [(3, 101), (2, 102), (7, 123), (5, 131), (40, 250), (3, 100)]:
        x = np.random.default_rng(c).standard_normal((t, c)).astype(np.float32)
        got = prog.run(device, symbolic=True, x=x)["out0"]
        assert prog.last_run == "symbolic", (t, c, prog.last_run)
        assert got.shape == (t, c - 100) and np.array_equal(got, x[:, :c - 100] * 2.0), (t, c)
    # below 100 the slice's stop counts from the end (another graph): size-specialized, right
    x = np.random.default_rng(1).standard_normal((4, 60)).astype(np.float32)
    got = prog.run(device, symbolic=True, x=x)["out0"]
    assert prog.last_run.startswith("specialized: the program's operations differ at these sizes")
    assert got.shape == (4, 20) and np.array_equal(got, x[:, :-40] * 2.0)
