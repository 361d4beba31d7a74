"""BEAM's winners change only the opts of the program's kernels (branch beamcol, issue 20 item 5): the corpus
table's BEAM column ran slower than its default column where a winner changed the program around its kernel.
(1) `Program.beam` drops a winner whose kernel cannot write its output over its input where the default's memory
plan does (`Program._check_structure`: mixer's accumulating channel parts with a PADTO winner planned 1.56x and
ran in 2 chunks, the default whole); (2) the search times no candidate on fewer CPU threads than the default of
a long kernel (`search.fewer_threads`: UPCASTs that consume the outer axis leave one thread, as an explicit
THREAD does). Kernel lists, opts, sources and memory plans compared with exact expectations, values with
numpy; no timings."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.api import kernel_names
from tgc.backends import get_device
from tgc.cli import report
from tgc.codegen import search
from tgc.codegen.opt import Opt, OptOps
from tgc.engine.inputs import random_inputs
from tgc.engine.realize import inplace_pairs

CPU = get_device("CPU")
# the hidden layer in two parts (`split_hidden_chains`), the second part's matmul adding onto the first's sum in
# place (tests/test_hidden_parts.py): kernels r_77_512_64, r_77_64_512, r_77_488_64, r_77_64_488
MLP = "x: f32[M, C]\nw1: f32[C, F]\nb1: f32[F]\nw2: f32[F, C]\nreturn relu(x @ w1 + b1) @ w2\n"
DIMS = {"M": 77, "C": 64, "F": 1000}


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))


def _opts(k) -> list[str]:
    return [str(o) for o in k.opts]


def _store_winners(prog, dims, winners: dict[str, list[Opt]]) -> dict[str, object]:
    """Store each run kernel's default opts (less the automatic THREAD) as a finished width-4 winner, or the
    opts `winners` gives by name; returns the kernels' search ASTs by name."""
    live = [it for it in prog.run_schedule(dims, "CPU") if it.ast.src]
    default = {k.name: k for k in prog.compile("CPU", dims=dims, tuned=False)}
    asts = {}
    for it, name in zip(live, kernel_names(live)):
        opts = winners.get(name, [o for o in default[name].opts if o.op is not OptOps.THREAD])
        asts[name] = search.search_ast(it, CPU)
        search.store(asts[name], CPU, opts, 1e-3, name, width=4)
    return asts


def test_a_winner_equal_to_the_default_renders_the_same_source(fresh_cache):
    prog = tgc.loads(MLP)
    _store_winners(prog, DIMS, {})
    default = prog.compile("CPU", dims=DIMS, tuned=False)
    tuned = prog.compile("CPU", dims=DIMS, tuned=True)
    assert [k.name for k in tuned] == [k.name for k in default]
    assert [k.src for k in tuned] == [k.src for k in default]
    assert [k.global_size for k in tuned] == [k.global_size for k in default]


def test_a_winner_that_cannot_write_in_place_is_dropped(fresh_cache):
    prog = tgc.loads(MLP)
    default = prog.lower("CPU", DIMS, tuned=False)
    acc = default.kernels[-1]
    assert acc.name == "r_77_64_488"
    kept = default.memory_plan().inplace
    assert kept and all(p in inplace_pairs(acc) for p in kept)  # the second part's sum is written in place
    # its default opts and one more row split: the rows padded to 8 are then gated as the in-place rule refuses
    bad = [o for o in acc.opts if o.op is not OptOps.THREAD] + [Opt(OptOps.UPCAST, 0, 2)]
    asts = _store_winners(prog, DIMS, {acc.name: bad})
    tuned = prog.lower("CPU", DIMS, tuned=True)
    t_acc = tuned.kernels[-1]
    assert _opts(t_acc)[:len(bad)] == [str(o) for o in bad] and not inplace_pairs(t_acc)  # (what is checked)
    assert tuned.memory_plan().peak_bytes > default.memory_plan().peak_bytes
    prog.release()

    result = prog.beam("CPU", dims=DIMS, width=1, budget_s=None)  # (every kernel has a finished winner: cached)
    assert set(result["structure_check"]) == {acc.name}
    assert [r["name"] for r in result["kernels"] if r.get("dropped")] == [acc.name]
    assert search.lookup(asts[acc.name], CPU) is None  # runs its default
    assert "over its input" in search.lookup_entry(asts[acc.name], CPU)["dropped"]
    assert all(search.lookup(a, CPU) is not None for n, a in asts.items() if n != acc.name)

    line = report.structure_check_line(result)
    assert line is not None and line.startswith("memory-plan check: 1 winner dropped") and acc.name in line
    assert report.structure_check_line({"structure_check": {}}) is None

    after = prog.lower("CPU", DIMS, tuned=True)
    assert [k.name for k in after.kernels] == [k.name for k in default.kernels]
    assert [_opts(k) for k in after.kernels] == [_opts(k) for k in default.kernels]
    assert after.memory_plan().inplace == kept
    assert after.memory_plan().peak_bytes == default.memory_plan().peak_bytes
    inputs = random_inputs(prog, DIMS, seed=5)
    x, w1, b1, w2 = (inputs[k].astype(np.float64) for k in ("x", "w1", "b1", "w2"))
    want = np.maximum(x @ w1 + b1, 0) @ w2
    got = prog.run(**inputs)["out0"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_winners_that_keep_the_plan_are_kept(fresh_cache):
    prog = tgc.loads(MLP)
    default = prog.compile("CPU", dims=DIMS, tuned=False)
    first = default[0]  # r_77_512_64: writes a fresh buffer, no in-place pair to lose
    other = [o for o in first.opts if o.op is not OptOps.THREAD][:2]  # (a prefix of its default: another kernel)
    asts = _store_winners(prog, DIMS, {first.name: other})
    result = prog.beam("CPU", dims=DIMS, width=1, budget_s=None)
    assert result["structure_check"] == {}
    assert search.lookup(asts[first.name], CPU) == other
    assert _opts(prog.compile("CPU", dims=DIMS, tuned=True)[0])[:len(other)] == [str(o) for o in other]


def _candidate(threads: int) -> search.Candidate:
    return search.Candidate([], None, src="rendered", launch={"global_size": (threads, 1, 1)} if threads > 1 else {})


def test_fewer_threads_rule():
    long_s, short_s = 2 * search.FEWER_THREADS_MAX_S, search.FEWER_THREADS_MAX_S / 2
    assert search.fewer_threads(_candidate(1), _candidate(2), long_s, CPU)
    assert not search.fewer_threads(_candidate(1), _candidate(2), short_s, CPU)  # a short kernel may win on one
    assert not search.fewer_threads(_candidate(2), _candidate(2), long_s, CPU)
    assert not search.fewer_threads(_candidate(4), _candidate(2), long_s, CPU)


def test_a_long_kernels_search_times_no_candidate_on_fewer_threads(fresh_cache, monkeypatch):
    """16 rows in tiles of 8: UPCAST(0, 2) leaves the outer axis one tile, one thread, though no THREAD is tried."""
    if CPU.cores < 2:
        pytest.skip("one core: every kernel runs on one thread")
    monkeypatch.setattr(search, "FEWER_THREADS_MAX_S", 0.0)  # (every kernel counts as long)
    prog = tgc.loads("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b")
    dims = {"M": 16, "K": 128, "N": 512}
    (item,) = [it for it in prog.schedule(dims, "CPU") if it.ast.src]
    (default,) = prog.compile("CPU", dims=dims, tuned=False)
    assert default.global_size[0] >= 2
    timed: list[int] = []
    run = search._Timer.run

    def record(self, cand, best, runs=3):
        timed.append(search.launch_threads(cand))
        return run(self, cand, best, runs)

    monkeypatch.setattr(search._Timer, "run", record)
    res = search.beam_search(search.search_ast(item, CPU), CPU, list(item.bufs), width=4, name=item.name, rounds=1)
    assert res.tried > 0 and len(timed) > 2
    assert min(timed[1:]) >= default.global_size[0]  # (the first: the unoptimized reference)
