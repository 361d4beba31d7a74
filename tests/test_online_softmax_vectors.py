"""The CPU's per-row form of the fused attention with vectors, lowered by the pipeline's passes (issue 20 item 4,
branch online4): `vectorize` takes an ONLINE_SOFTMAX store's inner products 16 lanes of their range at a time, a
block's 16 scores as one vector (its lanes' sums taken together, its exps at once) and 16 output columns as the
lanes of the REDUCE's value side (16 o accumulators in one vector sharing one m and l). Checked against numpy
(masked, ragged last block, head sizes that do and do not split into vectors, f16) and the linear UOps against
exact counts; a malformed vector online softmax is refused."""

from __future__ import annotations

import numpy as np
import pytest
from test_attention_fused import check, program

from tgc.backends import get_device
from tgc.codegen import attention as attn
from tgc.codegen.attention import AttentionKernel, lower_attention
from tgc.codegen.linearize import linearize
from tgc.dtype import dtypes
from tgc.ir.kernel import INDEX
from tgc.ir.uop import Ops, RangeKind, UOp


def _item(p, dims: dict):
    items = [it for it in p.schedule(dims=dims, device="CPU") if attn.is_fused_attention(it.ast)]
    assert len(items) == 1
    return items[0]


def _per_row_form(monkeypatch) -> list:
    """Force the unoptimized per-row form (no rows as lanes), as BEAM's reference and kv decode's one row get."""
    calls = []

    def forced(item, dev, opts=None):
        calls.append(dev.name)
        return AttentionKernel(item, dev)

    monkeypatch.setattr(attn, "attention_kernel", forced)
    return calls


def test_the_cpu_per_row_form_is_vectorized_through_the_reduce():
    p = program(True)
    item = _item(p, {"B": 1, "T": 21, "D": 32, "E": 32})
    trace: list[tuple[str, str]] = []
    low = lower_attention(item, get_device("CPU"), "attn", opts=[], trace=trace)
    names = [n for n, _ in trace]
    assert "vectorize" in names and "unroll_reduce" in names
    assert "lower_attention" not in names  # no lowering of its own
    v16 = dtypes.f32.vec(16)
    accs = [u for u in low.uops if u.op is Ops.DEFINE_ACC]
    # m and l scalars; 16 keys' inner products as 16-lane partial sums (D=32: 2 steps); E=32: two o vectors
    assert sum(a.dtype == dtypes.f32 for a in accs) == 2
    assert sum(a.dtype == v16 for a in accs) == 16 + 2
    ups = [u for u in low.uops if u.op is Ops.ACCUMULATE]
    assert sum(u.arg is Ops.MAX for u in ups) == 1  # one running max shared by the columns
    assert sum(u.arg is Ops.MUL and u.dtype == v16 for u in ups) == 2  # each o vector rescaled once per block
    assert not any(u.op is Ops.EXP2 for u in low.uops)  # the block's exps: one vector polynomial (decomposed)
    assert any(u.op is Ops.STORE and u.src[2].dtype == v16 for u in low.uops)  # the columns stored as vectors


@pytest.mark.parametrize("masked,t,d,e", [(True, 21, 32, 32), (False, 40, 20, 24), (True, 16, 48, 16)])
def test_the_cpu_per_row_form_matches_numpy(masked, t, d, e, monkeypatch):
    """Ragged last block (21, 40), one whole block (16); inner products and columns that split into 16 lanes (32,
    48, 16) and ones that do not (20, 24: scalar, the block's scores still one vector)."""
    calls = _per_row_form(monkeypatch)
    check(program(masked), masked, "CPU", 2, t, d, e, tol=2e-5)
    assert calls, "the program's kernel was not lowered here (a cached kernel ran)"


def test_the_cpu_per_row_form_with_half_inputs_matches_numpy(monkeypatch):
    calls = _per_row_form(monkeypatch)
    check(program(False, "f16"), False, "CPU", 1, 19, 32, 16, dtype=np.float16, tol=2e-2)
    assert calls


def test_a_vector_online_softmax_with_values_of_another_width_is_refused():
    r = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, 4),), (0, RangeKind.REDUCE))
    score = UOp(Ops.CAST, dtypes.f32, (r,))
    value = UOp(Ops.VECTORIZE, dtypes.f32.vec(8), (score,) * 8)
    red = UOp(Ops.REDUCE, dtypes.f32.vec(4), (UOp(Ops.VECTORIZE, dtypes.f32.vec(2), (score, value)), r),
              Ops.ONLINE_SOFTMAX)
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.f32.as_ptr(), (), 0)
    st = UOp(Ops.STORE, None, (buf, UOp.const(INDEX, 0), red))
    with pytest.raises(RuntimeError, match="ONLINE_SOFTMAX"):
        linearize(UOp(Ops.SINK, None, (st,)))
