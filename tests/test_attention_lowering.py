"""The fused attention kernel's lowering cost (issues 14 and 21): the rows form (`online_softmax_ast(rows=)`
through the pipeline's passes) keeps the head dimension and the output columns as loops (the query side staged
once per tile of rows into a local array, the output accumulators in another), so its linear UOps and the work of
lowering it do not grow with the head dimension; threads are the pipeline's THREAD opt. Checked exactly: the UOps
and rule attempts at D=32 and D=256 are the same, a shared simplify memo's results against fresh ones, the staged
query side, and wide heads (D=128, 96, 256) against numpy, threaded and not."""

from __future__ import annotations

import numpy as np
import pytest
from test_attention_beam import attention_item, opts, run_with
from test_attention_fused import program, reference

import tgc
from tgc.backends import get_device
from tgc.codegen import attention as A
from tgc.codegen import expand
from tgc.codegen.lanes import lane_sums
from tgc.dtype import dtypes
from tgc.ir import uop
from tgc.ir.kernel import INDEX
from tgc.ir.symbolic import simplify, symbolic
from tgc.ir.uop import Ops, RangeKind, UOp, graph_rewrite, substitute

CPU = get_device("CPU")


def _count_rewrites(monkeypatch) -> list[int]:
    n = [0]
    real = uop.PatternMatcher.rewrite

    def spy(self, u, ctx=None):
        n[0] += 1
        return real(self, u, ctx)

    monkeypatch.setattr(uop.PatternMatcher, "rewrite", spy)
    return n


@pytest.mark.parametrize("masked", [False, True])
def test_the_rows_kernel_does_not_grow_with_the_head_dimension(masked, monkeypatch):
    """16 rows x 16 keys, 2 threads: the same number of linear UOps and of rule attempts at D=32 and D=256
    (written out, as before, D=128 took ~105,000 rule attempts and D=256 twice that); the head dimension is a
    loop of the kernel (a RANGE of that length), and the query side and output accumulators are local arrays."""
    n = _count_rewrites(monkeypatch)
    sizes = []
    for d in (32, 256):
        item = attention_item(program(masked), {"B": 2, "T": 20, "D": d, "E": d})
        n[0] = 0
        low = A.lower_attention(item, CPU, "attn", opts(16, 16, 2))
        sizes.append((len(low.uops), n[0]))
        assert low.launch["global_size"] == (2, 1, 1)
        assert "core_id" in low.src
        assert any(u.op is Ops.RANGE and u.src[0].op is Ops.CONST and u.src[0].arg == d for u in low.uops)
        assert sorted(u.arg for u in low.uops if u.op is Ops.DEFINE_LOCAL) == [("o_rows", d * 16), ("rows0", d * 16)]
    assert sizes[0] == sizes[1], sizes
    assert sizes[0][1] < 10_000, sizes


def test_a_shared_memo_gives_the_same_results_and_skips_what_it_holds(monkeypatch):
    r = UOp(Ops.RANGE, INDEX, (UOp.const(INDEX, 16),), (0, RangeKind.LOOP))
    a = (r * UOp.const(INDEX, 4) + UOp.const(INDEX, 0)) // UOp.const(INDEX, 4)  # folds to r
    exprs = [(a + UOp.const(INDEX, i) * UOp.const(INDEX, 1)) % UOp.const(INDEX, 64) for i in range(6)]
    fresh = [simplify(e) for e in exprs]
    memo: dict = {}
    shared = [graph_rewrite(e, symbolic, memo=memo) for e in exprs]
    assert shared == fresh
    assert fresh[0] is r  # (r*4)//4 + 0 with r < 16: r
    n = _count_rewrites(monkeypatch)
    graph_rewrite(exprs[0] + UOp.const(INDEX, 0), symbolic, memo=memo)
    assert n[0] <= 3  # only the new ADD (and what it folds to): the rest is in the memo, not walked again
    # substitute (a rebuild seeded with the mapping) still replaces below the seeded nodes' users
    assert simplify(substitute(exprs[1], {r: UOp.const(INDEX, 3)})) is UOp.const(INDEX, 4)


def test_the_thread_split_is_the_pipelines_thread_opt():
    """Rows form and per-row form, 2 threads, a batch loop: both split by `apply_opts` (their THREAD opt)."""
    item = attention_item(program(True), {"B": 3, "T": 40, "D": 8, "E": 8})
    for o in (opts(16, 16, 2), opts(0, 16, 2)):
        trace: list = []
        low = A.lower_attention(item, CPU, "attn", o, trace=trace)
        assert low.launch["global_size"] == (2, 1, 1) and "apply_opts" in dict(trace) and "core_id" in low.src


@pytest.mark.parametrize(("d", "masked"), [(128, True), (96, False), (256, True)])
def test_wide_heads_match_numpy(d, masked):
    """16 rows x 16 keys, 2 threads, a ragged last block and a partial row tile; D=256 (the
    largest head fused) fills the CPU's 32 KiB of local arrays exactly."""
    p = program(masked)
    dims = {"B": 3, "T": 21, "D": d, "E": d}
    (kern,), out, (q, k, v) = run_with(p, dims, opts(16, 16, 2))
    assert kern.opts == opts(16, 16, 2)
    np.testing.assert_allclose(out, reference(q, k, v, masked), rtol=3e-5, atol=3e-5, err_msg=f"D={d}")


def test_a_computed_query_is_staged_once_per_row_tile():
    """q computed in the kernel (scaled and shifted, with a broadcast bias): what the inner products read of the
    row is computed in the staging loop, before the key loop, not again for every key; checked against numpy."""
    p = tgc.loads("q: f32[B, T, D]\nk: f32[B, T, D]\nv: f32[B, T, E]\nbias: f32[D]\n"
                  "return softmax((q * 1.5 + bias) @ k.transpose(-2, -1), axis=-1) @ v\n")
    dims = {"B": 2, "T": 19, "D": 24, "E": 8}
    item = attention_item(p, dims)
    low = A.lower_attention(item, CPU, "attn", opts(16, 8))
    uops = low.uops
    first_acc = next(i for i, u in enumerate(uops) if u.op is Ops.DEFINE_ACC)  # the accumulators, then the keys

    def is_scale(u: UOp) -> bool:  # the constant 1.5, or a vector of it
        return (u.op is Ops.CONST and u.arg == 1.5) or (u.op is Ops.VECTORIZE and all(is_scale(s) for s in u.src))

    scaled = [i for i, u in enumerate(uops) if u.op is Ops.MUL and any(is_scale(s) for s in u.src)]
    assert scaled and all(i < first_acc for i in scaled), (scaled, first_acc)
    assert sum(u.op is Ops.DEFINE_LOCAL for u in uops) == 2
    rng = np.random.default_rng(1)
    q, k, bias = (rng.standard_normal(s).astype(np.float32) for s in ((2, 19, 24), (2, 19, 24), (24,)))
    v = rng.standard_normal((2, 19, 8)).astype(np.float32)
    out = p.run("CPU", dims=dims, q=q, k=k, v=v, bias=bias)[p.output_names[0]]
    s = (q.astype(np.float64) * 1.5 + bias) @ k.swapaxes(-1, -2)
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out, (e / e.sum(-1, keepdims=True)) @ v, rtol=3e-5, atol=3e-5)


@pytest.mark.parametrize(("t", "masked"), [(37, False), (16, True), (5, True)])
def test_one_query_row_scores_a_block_as_one_vector(t, masked, monkeypatch):
    """One query row (a decoding step: the per-row form, inner products 16 lanes of the head dimension): the 16
    keys' lane sums are taken together (`lanes.lane_sums` in `vectorize`: a shuffle
    tree, then one permutation) and the scale and an
    added mask computed with the keys as lanes; against numpy at a ragged, a whole and a partial block."""
    src = "q: f32[B, 1, D]\nk: f32[B, T, D]\nv: f32[B, T, E]\n" + ("m: f32[B, 1, T]\n" if masked else "") + \
        f"return softmax(q @ k.transpose(-2, -1) * 0.3{' + m' if masked else ''}, axis=-1) @ v\n"
    p = tgc.loads(src)
    dims = {"B": 3, "T": t, "D": 32, "E": 16}
    item = attention_item(p, dims)
    calls = []
    real = expand.lane_sums
    monkeypatch.setattr(expand, "lane_sums", lambda vs: calls.append(len(vs)) or real(vs))
    A.lower_attention(item, CPU, "attn")
    assert A.attention_kernel(item, CPU).choices()["rows"] == 0 and calls == [min(t, 16)] if t >= 16 else calls == []
    rng = np.random.default_rng(t)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((3, 1, 32), (3, t, 32), (3, t, 16)))
    m = (rng.standard_normal((3, 1, t)) * 2).astype(np.float32)
    out = p.run("CPU", dims=dims, q=q, k=k, v=v, **({"m": m} if masked else {}))[p.output_names[0]]
    s = q.astype(np.float64) @ k.swapaxes(-1, -2) * 0.3 + (m if masked else 0)
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out, (e / e.sum(-1, keepdims=True)) @ v, rtol=3e-5, atol=3e-5)


def _value(u: UOp, memo: dict | None = None):
    """A constant vector expression's value (CONST, VECTORIZE, GEP, ADD), each node evaluated once."""
    memo = {} if memo is None else memo
    if u not in memo:
        if u.op is Ops.CONST:
            memo[u] = float(u.arg)
        elif u.op is Ops.VECTORIZE:
            memo[u] = [_value(s, memo) for s in u.src]
        elif u.op is Ops.GEP:
            memo[u] = _value(u.src[0], memo)[u.arg]
        else:
            assert u.op is Ops.ADD, u.op
            a, b = _value(u.src[0], memo), _value(u.src[1], memo)
            memo[u] = [x + y for x, y in zip(a, b)] if isinstance(a, list) else a + b
    return memo[u]


def test_lane_sums_give_each_vectors_sum_in_its_lane():
    """`lane_sums` of 16 vectors of 16 lanes: lane i is the sum of vector i's lanes (exact on small integers)."""
    vals = np.arange(256, dtype=np.float32).reshape(16, 16) % 7 - 3 + np.arange(16)[:, None] * 100
    vs = [UOp(Ops.VECTORIZE, dtypes.f32.vec(16), tuple(UOp.const(dtypes.f32, float(x)) for x in row)) for row in vals]
    assert _value(lane_sums(vs)) == vals.sum(1).tolist()


def test_the_rows_kernel_counts_all_its_work():
    """The CPU's local arrays are the thread's own (not a work-group's shared memory, whose loads `count_work`
    weighs 1/n): the kernel's counted ops cover at least the two matmuls' multiply-adds (4 B T^2 D)."""
    from tgc.codegen.kernel import kernel_flops
    dims = {"B": 2, "T": 32, "D": 32, "E": 32}
    low = A.lower_attention(attention_item(program(False), dims), CPU, "attn", opts(16, 16, 2))
    assert kernel_flops(low.uops, CPU, low.launch) >= 4 * 2 * 32 * 32 * 32
