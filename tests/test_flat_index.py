"""A flattened image read as a vector: the simplifier folds the digits of a reshaped index back into the index
(`tgc.ir.symbolic.div_mod_sum_rule`), so a matrix-vector product over a flattened pooled image reads it
contiguously (AlexNet's first fully connected layer); checked exhaustively on the index and against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from langkit import device_skip_reason

import tgc
from tgc.codegen.opt import _stride
from tgc.dtype import dtypes
from tgc.ir.symbolic import simplify
from tgc.ir.uop import Ops, RangeKind, UOp


def _range(n: int) -> UOp:
    return UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, n),), (0, RangeKind.REDUCE))


def _value(u: UOp, r: UOp, v: int) -> int:
    """`u` at r = v, by Python's integer arithmetic (floor division and remainder: v >= 0 here)."""
    vals: dict[UOp, int] = {}
    for n in u.toposort():
        if n is r:
            vals[n] = v
        elif n.op is Ops.CONST:
            vals[n] = int(n.arg)
        else:
            a, b = (vals[s] for s in n.src[:2])
            vals[n] = a + b if n.op is Ops.ADD else a * b if n.op is Ops.MUL else a // b if n.op is Ops.IDIV else a % b
    return vals[u]


def test_the_digits_of_an_index_fold_back_into_it():
    r = _range(9216)
    c = lambda n: UOp.const(dtypes.index, n)  # noqa: E731
    flat = (r // c(36)) * c(36) + ((r // c(6)) % c(6)) * c(6) + r % c(6)
    assert simplify(flat) is r
    two = ((r // c(6)) % c(6)) * c(6) + r % c(6)  # the low two digits: a remainder
    got = simplify(two)
    assert got.op is Ops.MOD and got.src[1].arg == 36
    scaled = ((r // c(6)) % c(6)) * c(12) + (r % c(6)) * c(2) + c(5)  # a common coefficient and a constant
    got = simplify(scaled)
    assert all(_value(got, r, v) == _value(scaled, r, v) for v in range(0, 9216, 7))
    assert len(got.toposort()) < len(scaled.toposort())
    assert _stride(simplify((r // c(36)) * c(36) + r % c(36)), r) == 1
    mixed = ((r // c(6)) % c(5)) * c(6) + r % c(6)  # mixed radix: r % 30
    got = simplify(mixed)
    assert got.op is Ops.MOD and got.src[1].arg == 30
    other = ((r // c(6)) % c(5)) * c(7) + r % c(6)  # a digit's weight that is not the divisor: no fold
    got = simplify(other)
    assert all(_value(got, r, v) == _value(other, r, v) for v in range(0, 9216, 5))
    assert got.op is Ops.ADD


FLAT_MATVEC = "x: f32[1, C, S, S]\nw: f32[N, C * S * S]\nreturn reshape(x, (1, C * S * S)) @ transpose(w, 1, 0)"


@pytest.mark.parametrize("device", ["CPU", "PYTHON", "OPENCL"])
def test_a_matvec_over_a_flattened_image_against_numpy(device):
    if why := device_skip_reason(device):
        pytest.skip(why)
    rng = np.random.default_rng(5)
    dims = {"C": 5, "S": 3, "N": 7} if device == "PYTHON" else {"C": 40, "S": 6, "N": 70}
    c, s, n = dims["C"], dims["S"], dims["N"]
    x = rng.standard_normal((1, c, s, s)).astype(np.float32)
    w = rng.standard_normal((n, c * s * s)).astype(np.float32)
    got = tgc.loads(FLAT_MATVEC).run(device=device, x=x, w=w)["out0"]
    np.testing.assert_allclose(got, x.reshape(1, -1) @ w.T, rtol=1e-4, atol=1e-4)
