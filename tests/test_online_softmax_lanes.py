"""REDUCE(ONLINE_SOFTMAX) with scores that vary by lane (issue 20 item 4, branch online5): the linearizer's piece
of the rows form through the passes. Its value is a VECTORIZE of n score vectors then n value vectors, all f32 x w
like the REDUCE; lane i of the result is the online softmax of lane i of every score and value (w independent
rows: per-lane m and l accumulators). Built by hand here (no pass makes one yet), run on the CPU and checked
against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from tgc.backends import get_device
from tgc.codegen.index import narrow_index
from tgc.codegen.linearize import linearize
from tgc.codegen.pipeline import finish
from tgc.dtype import dtypes
from tgc.ir.kernel import INDEX
from tgc.ir.uop import Ops, RangeKind, UOp

W = 16  # lanes (query rows)


def _kernel(t: int, n: int) -> tuple[UOp, list[UOp]]:
    """out[0:W] = the lane-wise online softmax of scores S[t, W] weighting values V[t, W], keys in blocks of `n`
    (a REDUCE range of t // n blocks, each iteration n score and n value vectors)."""
    out, s, v = (UOp(Ops.DEFINE_GLOBAL, dtypes.f32.as_ptr(), (), i) for i in range(3))
    r = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, t // n),), (0, RangeKind.REDUCE))
    vt = dtypes.f32.vec(W)
    rows = [(r * UOp.const(INDEX, n) + UOp.const(INDEX, k)) * UOp.const(INDEX, W) for k in range(n)]
    scores = [UOp(Ops.LOAD, vt, (s, at)) for at in rows]
    values = [UOp(Ops.LOAD, vt, (v, at)) for at in rows]
    red = UOp(Ops.REDUCE, vt, (UOp(Ops.VECTORIZE, dtypes.f32.vec(2 * n * W), (*scores, *values)), r),
              Ops.ONLINE_SOFTMAX)
    return UOp(Ops.SINK, None, (UOp(Ops.STORE, None, (out, UOp.const(INDEX, 0), red)),)), [out, s, v]


@pytest.mark.parametrize("n", [1, 4])
def test_scores_varying_by_lane_give_each_lane_its_own_softmax_on_the_cpu(n):
    dev = get_device("CPU")
    t = 12
    ast, bufs = _kernel(t, n)
    ast = narrow_index(ast)
    uops = linearize(ast, dev.caps.decompose_transcendentals)
    accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
    assert [a.dtype for a in accs] == [dtypes.f32.vec(W)] * 3  # m, l and o: one lane per row
    tensors = [UOp(Ops.BUFFER, dtypes.f32, (), (i, name, shape))
               for i, (name, shape) in enumerate([("out", (W,)), ("s", (t, W)), ("v", (t, W))])]
    low = finish(dev, "lanes", ast, uops, tensors, {}, ast_bufs=bufs)
    rng = np.random.default_rng(0)
    s = (rng.standard_normal((t, W)) * 4).astype(np.float32)
    s[:5, 3] = -np.inf  # a lane whose first keys are masked: its running max starts at -inf
    s[:, 7] += 80.0  # a lane of large scores (exp would overflow without the max)
    v = rng.standard_normal((t, W)).astype(np.float32)
    e = np.exp(s - s.max(axis=0))
    want = (e * v).sum(axis=0) / e.sum(axis=0)
    alloc = dev.allocator
    hs = [alloc.alloc(t * W * 4), alloc.alloc(t * W * 4)]
    ho = alloc.alloc(W * 4)
    try:
        hs[0].view(np.float32)[:] = s.ravel()
        hs[1].view(np.float32)[:] = v.ravel()
        dev.program(low.name, dev.compiler.compile(low.src))(ho, *hs, global_size=(1, 1, 1), local_size=(1, 1, 1),
                                                             vals=())
        got = ho.view(np.float32).copy()
    finally:
        alloc.free(ho, W * 4)
        for h in hs:
            alloc.free(h, t * W * 4)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def test_scores_of_another_width_than_the_values_are_refused():
    """Scores and values of lanes but not all of the REDUCE's type: a tgc bug, never a kernel."""
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.f32.as_ptr(), (), 0)
    r = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, 3),), (0, RangeKind.REDUCE))
    s8 = UOp(Ops.LOAD, dtypes.f32.vec(8), (buf, r))
    v4 = UOp(Ops.LOAD, dtypes.f32.vec(4), (buf, r))
    red = UOp(Ops.REDUCE, dtypes.f32.vec(4), (UOp(Ops.VECTORIZE, dtypes.f32.vec(12), (s8, v4)), r), Ops.ONLINE_SOFTMAX)
    st = UOp(Ops.STORE, None, (buf, UOp.const(INDEX, 0), red))
    with pytest.raises(RuntimeError, match="ONLINE_SOFTMAX"):
        linearize(UOp(Ops.SINK, None, (st,)))
