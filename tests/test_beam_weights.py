"""Where BEAM's budget goes on a whole program (issue 23: "after `tgc beam` >= 1.0x onnxruntime"): each kernel
weighs what it costs a run of the program (`search.kernel_weights`): its default's time in one run where the
program was run before the search (`Program._per_call_costs`, `bench.kernel_times`), else its estimate; kernels
that run once per program (the prelude on bound weights: `tgc.engine.bound`) weigh nothing and are not
searched; the heaviest kernels are searched first. The search itself is replaced by a recorder here (the order
and the rows are what is tested, deterministically: no clock, no timing threshold)."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.api import Program
from tgc.backends import get_device
from tgc.codegen import search

# three distinct kernels: a matmul, a reduction and an elementwise one (estimates in that order, heaviest first)
THREE = """x: f32[M, K]
w: f32[K, N]
return x @ w, x.sum(axis=1), x * 2.0
"""
DIMS = {"M": 32, "K": 64, "N": 48}


@pytest.fixture
def searched(monkeypatch, tmp_path):
    """The kernels `beam_items` searches, in order; no candidate is rendered, compiled or timed."""
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    order: list[str] = []

    def fake_search(ast, device, bufs, width, name="kernel", **kw):
        order.append(name)
        return search.SearchResult([], 1e-3, 1e-3)

    def no_starts(*a, **kw):
        raise RuntimeError("not rendered in this test")

    monkeypatch.setattr(search, "beam_search", fake_search)
    monkeypatch.setattr(search, "_starts", no_starts)
    monkeypatch.setattr(search, "make_pool", lambda dev: None)
    return order


def _items():
    items = [it for it in tgc.loads(THREE).schedule(DIMS, "CPU") if it.ast.src]
    assert len({it.name for it in items}) == 3
    return items, get_device("CPU")


def test_measured_times_order_the_search_not_the_estimate(searched):
    items, cpu = _items()
    estimates = [search.estimate_cost(it, cpu) for it in items]
    by_estimate = [items[i].name for i in sorted(range(3), key=lambda i: -estimates[i])]
    # measured times in the reverse order of the estimates: the one estimated lightest took longest
    rank = sorted(range(3), key=lambda i: estimates[i])
    measured = [0.0] * 3
    for r, i in enumerate(rank):
        measured[i] = [3e-3, 2e-3, 1e-3][r]
    search.beam_items(items, cpu, width=1, force=True, budget_s=None, measured=measured)
    assert searched == by_estimate[::-1]
    searched.clear()
    search.beam_items(items, cpu, width=1, force=True, budget_s=None)  # no times: the estimate's order
    assert searched == by_estimate


def test_kernels_that_run_once_are_not_searched_nor_stored(searched):
    items, cpu = _items()
    rows, _ = search.beam_items(items, cpu, width=1, force=True, budget_s=None, measured=[1e-3, None, 2e-3])
    assert searched == [items[2].name, items[0].name]
    once = rows[1]
    assert once["name"] == items[1].name and once["skipped"] and once["once"] and once["tried"] == 0
    assert search.lookup(search.search_ast(items[1], cpu), cpu) is None
    assert search.lookup(search.search_ast(items[0], cpu), cpu) is not None


def test_kernel_weights_sum_copies_and_fall_back_to_the_estimate():
    items, cpu = _items()
    keys = ["a", "b", "a"]  # items 0 and 2 as one kernel: its weight is both copies' time
    w = search.kernel_weights(items, keys, [0, 1], cpu, [1e-3, 5e-4, 2e-3])
    assert w == pytest.approx({0: 3e-3, 1: 5e-4})
    assert search.kernel_weights(items, keys, [0, 1], cpu, [None, 5e-4, None]) == {0: 0.0, 1: 5e-4}
    assert search.kernel_weights(items, keys, [0, 1], cpu, [1e-3, 0.0, None])[1] > 0  # under the clock's tick
    estimate = {0: 2 * search.estimate_cost(items[0], cpu), 1: search.estimate_cost(items[1], cpu)}
    assert search.kernel_weights(items, keys, [0, 1], cpu, None) == estimate
    assert search.kernel_weights(items, keys, [0, 1], cpu, [1e-3, 5e-4]) == estimate  # not one per item
    assert search.kernel_weights(items, ["a", "b", "c"], [0, 1, 2], cpu, [1e-3, None, None]) == {
        0: 1e-3, 1: 0.0, 2: 0.0}


WEIGHTED = "x: f32[4, 16]\nw: f32[8, 16]\ny = x @ w.T + w.sum(axis=1)\nreturn y\n"


def test_a_programs_costs_mark_the_prelude_and_are_measured_after_a_run(searched):
    w = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    prog = Program(WEIGHTED, weights={"w": w})
    cpu = get_device("CPU")
    dims = prog.resolve_dims({})
    items = prog.schedule(dims, "CPU")
    live = [i for i, it in enumerate(items) if it.ast.src]
    before = prog._per_call_costs(cpu, dims, items)
    once = [i for i in live if before[i] is None]
    assert len(once) == 1  # w.sum(axis=1): it reads only the bound weight
    assert all(before[i] == search.estimate_cost(items[i], cpu) for i in live if i not in once)
    x = np.ones((4, 16), np.float32)
    np.testing.assert_allclose(prog.run(device="CPU", x=x)["y"], x @ w.T + w.sum(axis=1), rtol=1e-5, atol=1e-5)
    after = prog._per_call_costs(cpu, dims, items)
    assert [i for i in live if after[i] is None] == once
    assert all(0 < after[i] < 1.0 for i in live if i not in once)  # seconds now, not the estimate's FLOPs
    result = prog.beam("CPU", dims=dims, width=1, force=True, budget_s=None)
    assert [r["name"] for r in result["kernels"] if r.get("once")] == [items[once[0]].name]
    assert searched == [items[i].name for i in live if i not in once]


def test_a_budget_goes_to_the_heaviest_kernels_only():
    weights = {0: 1.0, 1: 50.0, 2: 30.0, 3: 10.0, 4: 9.0}  # 100 in all
    assert search.budget_kernels(weights, False) == [1, 2, 3, 4, 0]  # unbounded: every kernel, heaviest first
    assert search.budget_kernels(weights, True) == [1, 2, 3]  # the fewest that hold COVER (0.9) of the weight
    assert search.budget_kernels({0: 1.0, 1: 1.0, 2: 1.0}, True) == [0, 1, 2]  # ties: in order
    assert search.budget_kernels({0: 5.0}, True) == [0]


def test_the_lightest_queued_kernels_are_dropped_until_a_share_can_try_candidates():
    weights = {1: 50.0, 2: 30.0, 3: 10.0, 4: 9.0}
    # 60 s left for kernel 1 (half of the 100 still queued: 30 s); it needs 36 s: kernel 4, then 3 dropped
    assert search._drop_for_share(1, [2, 3, 4], weights, 99.0, 60.0, 36.0) == [4, 3]
    assert search._drop_for_share(1, [2, 3, 4], weights, 99.0, 60.0, 30.0) == []  # its share suffices
    assert search._drop_for_share(1, [2, 3, 4], weights, 99.0, 10.0, 30.0) == [4, 3, 2]  # alone, at most


def test_kernels_the_budget_leaves_out_are_skipped_and_not_stored(searched):
    items, cpu = _items()
    rows, _ = search.beam_items(items, cpu, width=1, force=True, budget_s=60.0, measured=[1e-3, 30e-3, 2e-3])
    assert searched == [items[1].name]  # 30 of 33 ms hold COVER: the other two are left out
    assert [bool(r.get("skipped")) for r in rows] == [True, False, True]
    assert search.lookup(search.search_ast(items[0], cpu), cpu) is None
    assert search.lookup(search.search_ast(items[1], cpu), cpu) is not None
