"""The CPU's rows form of the fused attention lowered by the pipeline's passes (issue 20 item 4 (b), branch rows):
`online_softmax_ast(rows=)` writes the query rows as an UPCAST range that the scores vary by, and `vectorize`
(`expand._vectorize_online_rows`) makes it the lanes of the scores, the values and the REDUCE (per-lane m and l),
staging q's side of the inner products per tile (`expand._stage_row_side`); the linearizer interchanges the output
columns into the key loop (o in local memory); threads are the THREAD opt. Checked against numpy on the CPU at
ragged and whole tiles of rows and blocks of keys, masked and not, and the linear UOps' structure exactly."""

from __future__ import annotations

import pytest
from test_attention_fused import check, program

from tgc.backends import get_device
from tgc.codegen import attention as attn
from tgc.codegen.attention import lower_attention
from tgc.dtype import dtypes
from tgc.ir.uop import Ops


@pytest.fixture
def rows_by_passes(monkeypatch) -> list:
    """The list gets the rows of each rows-form AST written (so a test sees that its kernel was lowered here, not
    served from a cache)."""
    calls: list = []
    real = attn.online_softmax_ast

    def spy(*a, **kw):
        if kw.get("rows"):
            calls.append(kw["rows"])
        return real(*a, **kw)

    monkeypatch.setattr(attn, "online_softmax_ast", spy)
    return calls


def _item(p, dims: dict):
    items = [it for it in p.schedule(dims=dims, device="CPU") if attn.is_fused_attention(it.ast)]
    assert len(items) == 1
    return items[0]


def test_the_rows_form_goes_through_the_passes_with_per_lane_accumulators(rows_by_passes):
    item = _item(program(True), {"B": 2, "T": 21, "D": 32, "E": 8})
    trace: list[tuple[str, str]] = []
    low = lower_attention(item, get_device("CPU"), "attn", trace=trace)
    names = [n for n, _ in trace]
    assert "vectorize" in names and "unroll_reduce" in names and "lower_attention" not in names
    assert rows_by_passes == [16]
    v16 = dtypes.f32.vec(16)
    ups = [u for u in low.uops if u.op is Ops.ACCUMULATE]
    maxes = [u for u in ups if u.arg is Ops.MAX]
    assert maxes and all(u.dtype == v16 for u in maxes)  # the running max is per row: one lane each
    assert not any(u.dtype == dtypes.f32 for u in ups)  # nothing of the online softmax is a scalar
    assert low.launch.get("global_size") in (None, (1, 1, 1), (2, 1, 1))


@pytest.mark.parametrize("masked,b,t,d,e", [(False, 2, 21, 8, 8), (True, 1, 16, 32, 16), (True, 2, 40, 16, 24)])
def test_the_rows_form_through_the_passes_matches_numpy(rows_by_passes, masked, b, t, d, e):
    """A partial last tile of rows (21, 40) and a whole one (16); a ragged last block of keys (21, 40)."""
    check(program(masked), masked, "CPU", b, t, d, e, tol=2e-5)
    assert rows_by_passes, "the program's kernel was not lowered here (a cached kernel ran)"


def test_the_columns_loop_is_interchanged_into_the_key_loop_with_o_in_local_memory(rows_by_passes):
    """One key loop for every output column: the scores, m, l and the rescale once per block; o a local array of
    E x 16 lanes zeroed, updated and stored by three loops over the columns."""
    item = _item(program(False), {"B": 1, "T": 40, "D": 32, "E": 24})
    low = lower_attention(item, get_device("CPU"), "attn")
    locals_ = [u for u in low.uops if u.op is Ops.DEFINE_LOCAL]
    assert [u.arg[1] for u in locals_ if u.arg[0] == "o_rows"] == [24 * 16]
    assert sum(u.op is Ops.ACCUMULATE and u.arg is Ops.MAX for u in low.uops) == 1
    v16 = dtypes.f32.vec(16)
    # m and l, and one partial sum per key of the block (16) for the inner products over the head dimension
    assert sum(u.op is Ops.DEFINE_ACC and u.dtype == v16 for u in low.uops) == 2 + 16
    o_rows = [u for u in locals_ if u.arg[0] == "o_rows"]
    assert sum(u.op is Ops.STORE and u.src[0] in o_rows for u in low.uops) == 2  # the zeroing and the update


def _key_loop(uops: list) -> list:
    """The linear UOps inside the outermost loop that holds the running max's update (the key loop)."""
    at = next(i for i, u in enumerate(uops) if u.op is Ops.ACCUMULATE and u.arg is Ops.MAX)
    depth, start = 0, at
    while start > 0:  # back to the RANGE that opens the loop the update is in
        start -= 1
        if uops[start].op is Ops.ENDRANGE:
            depth += 1
        elif uops[start].op is Ops.RANGE:
            if depth == 0:
                break
            depth -= 1
    end = next(i for i in range(at, len(uops)) if uops[i].op is Ops.ENDRANGE and uops[i].src[0] is uops[start])
    return uops[start:end]


def test_the_row_side_of_the_inner_products_is_staged_once_per_tile(rows_by_passes):
    """q's elements are gathered row by row once per tile of 16 rows into a local array (D x 16), before the key
    loop; inside it the inner products read one vector of it per head-dimension index, and q is not read."""
    item = _item(program(True), {"B": 1, "T": 40, "D": 32, "E": 24})
    low = lower_attention(item, get_device("CPU"), "attn")
    staged = [u for u in low.uops if u.op is Ops.DEFINE_LOCAL and u.arg[0] != "o_rows"]
    assert [u.arg[1] for u in staged] == [32 * 16]
    q = next(u for u in low.uops if u.op is Ops.DEFINE_GLOBAL and u.arg == 1)
    loop = _key_loop(low.uops)
    assert not any(u.op is Ops.LOAD and u.src[0] is q for u in loop)
    assert sum(u.op is Ops.LOAD and u.src[0] is staged[0] and u.dtype == dtypes.f32.vec(16) for u in loop) == 1
    assert not any(u.op is Ops.LOAD and u.src[0] is staged[0] and u.dtype == dtypes.f32 for u in low.uops)
    at_store = next(i for i, u in enumerate(low.uops) if u.op is Ops.STORE and u.src[0] is staged[0])
    assert at_store < low.uops.index(loop[0])  # the staging loop comes before the key loop


def test_threads_are_the_pipelines_thread_opt(rows_by_passes):
    """BEAM's THREAD(0, 2) on the rows form: `apply_opts` splits the first (batch) loop, 3 sequences in chunks of 2
    (the second thread's chunk is short): two threads, each its chunk; checked against numpy."""
    import numpy as np
    from test_attention_beam import opts, run_with
    from test_attention_fused import reference

    p = program(True)
    dims = {"B": 3, "T": 21, "D": 16, "E": 8}
    trace: list[tuple[str, str]] = []
    low = lower_attention(_item(p, dims), get_device("CPU"), "attn", opts(16, 8, 2), trace=trace)
    assert low.launch["global_size"] == (2, 1, 1) and "core_id" in low.src and "apply_opts" in dict(trace)
    (kern,), out, (q, k, v) = run_with(p, dims, opts(16, 8, 2))
    assert kern.opts == opts(16, 8, 2)
    np.testing.assert_allclose(out, reference(q, k, v, True), rtol=3e-5, atol=3e-5)
