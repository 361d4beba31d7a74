"""BEAM's time (issue 14: `tgc beam` < 60 s per workload): kernels with the same AST in one program are searched
once and the others take its winner; the time budget gives a kernel whose default is a negligible share of the
program a small search (width 1, one round); the default is still always a candidate and the results match
numpy."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.codegen import search

TWO = """x: f32[N, D]
w: f32[D, D]
v: f32[D, D]
return (x @ w) @ v
"""


@pytest.fixture
def spy(monkeypatch):
    """Every `beam_search` call: (kernel name, width, rounds, candidates tried)."""
    calls: list[tuple[str, int, int, int]] = []
    real = search.beam_search

    def wrapped(ast, device, bufs, width, name="kernel", progress=None, pool=None, rounds=search.MAX_ROUNDS,
                starts=None, deadline=None, item=None):
        res = real(ast, device, bufs, width, name=name, progress=progress, pool=pool, rounds=rounds, starts=starts,
                   deadline=deadline, item=item)
        calls.append((name, width, rounds, res.tried))
        return res
    monkeypatch.setattr(search, "beam_search", wrapped)
    return calls


def test_identical_kernels_are_searched_once(spy):
    p = tgc.loads(TWO)
    dims = {"N": 16, "D": 64}
    items = [it for it in p.schedule(dims, "CPU") if it.ast.src]
    from tgc.backends import get_device
    from tgc.codegen.pipeline import prepare
    cpu = get_device("CPU")
    keys = [search.beam_key(prepare(it.ast, cpu), cpu) for it in items]
    assert len(set(keys)) < len(keys)  # the two matmuls are the same kernel
    result = p.beam("CPU", dims=dims, force=True)
    rows = result["kernels"]
    assert len(rows) == len(items) and len(spy) == len(set(keys))  # one search per distinct kernel
    searched = {r["name"]: r for r in rows if not r.get("same_as")}
    for row, key in zip(rows, keys):
        if row.get("same_as"):
            first = searched[row["same_as"]]
            assert row["opts"] == first["opts"] and row["tried"] == 0 and not row["cached"]
            assert keys[[r["name"] for r in rows].index(row["same_as"])] == key
    rng = np.random.default_rng(0)
    x, w, v = (rng.standard_normal(s).astype(np.float32) for s in ((16, 64), (64, 64), (64, 64)))
    out = p.run(x=x, w=w, v=v)
    got = out if isinstance(out, np.ndarray) else next(iter(out.values()))
    np.testing.assert_allclose(got, (x @ w) @ v, rtol=1e-4, atol=1e-3)
    # without --force, a second beam finds every kernel stored and searches nothing
    spy.clear()
    again = p.beam("CPU", dims=dims)
    assert spy == [] and all(r["cached"] for r in again["kernels"])


def test_small_search_rule():
    assert search.small_search(0.001, 1.0)  # 0.1% of the program
    assert not search.small_search(0.5, 1.0)
    assert not search.small_search(1.0, 1.0)  # a program of one kernel: always the full search
    assert not search.small_search(search.SMALL_SHARE * 1.0, 1.0)
    assert not search.small_search(None, 1.0)  # not measured: the full search
    assert not search.small_search(0.001, 0.0)


MIX = """a: f32[M, K]
b: f32[K, N]
c: f32[M, N]
return a @ b + c, c * 2.0
"""


def test_a_kernel_that_cannot_matter_gets_a_small_search(spy, monkeypatch):
    """The budget's estimate says the second kernel takes 0.1% of the program: it is searched with width 1
    over one round (fewer candidates than the full search of it tries), the first with the full width; both
    results still match numpy (with the winners of a search where every opt looks faster), and the small one's
    winner is stored under the width asked."""
    real = search.estimate_cost
    estimated: list[str] = []
    # every opt makes a candidate 20% faster (each round gains: the full search goes on), every output matches
    monkeypatch.setattr(search._Timer, "run", lambda self, cand, best, runs=3: 0.8 ** len(cand.opts))
    monkeypatch.setattr(search, "_matches", lambda out, ref, dtype: True)

    def cost(item, dev):
        estimated.append(item.name)
        return 1.0 if len(estimated) == 1 else 0.001
    monkeypatch.setattr(search, "estimate_cost", cost)
    p = tgc.loads(MIX)
    dims = {"M": 32, "K": 32, "N": 64}
    result = p.beam("CPU", dims=dims, width=2, force=True, budget_s=None)  # (a budget leaves it out: COVER)
    rows = result["kernels"]
    assert len(estimated) == 2 and len(rows) == 2
    assert [r["small"] for r in rows] == [False, True]
    assert [(w, r) for _, w, r, _ in spy] == [(2, search.MAX_ROUNDS), (search.SMALL_WIDTH, search.SMALL_ROUNDS)]
    assert all(r["width"] == 2 for r in rows)
    small_tried = spy[1][3]
    # the same kernel's full search (no budget) tries more candidates
    spy.clear()
    monkeypatch.setattr(search, "estimate_cost", real)
    monkeypatch.setattr(search, "small_search", lambda t, total: False)
    p.beam("CPU", dims=dims, width=2, force=True, budget_s=None)
    assert spy[1][3] > small_tried
    matches_numpy(p, seed=1)


def matches_numpy(p, seed: int) -> None:
    """The two-output program (`a @ b + c`, `c * 2`) recompiled (its stored winners picked up) against numpy."""
    rng = np.random.default_rng(seed)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((32, 32), (32, 64), (32, 64)))
    p._kernels.clear()
    out = p.run(a=a, b=b, c=c)
    got = list(out.values()) if isinstance(out, dict) else list(out)
    np.testing.assert_allclose(got[0], a @ b + c, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], c * 2.0, rtol=1e-6)


def test_the_default_is_a_candidate_of_the_small_search(monkeypatch):
    """Every candidate after the default is wrong and looks faster: the small search keeps the default."""
    from tgc.backends import get_device
    from tgc.codegen.pipeline import prepare
    cpu = get_device("CPU")
    item = tgc.loads("a: f32[N, M]\nreturn exp(a) * 2").schedule({"N": 16, "M": 64}, "CPU")[0]
    ast = prepare(item.ast, cpu)
    base, seeds = search._starts(ast, cpu, "k", item.bufs)
    default_opts = (seeds[-1] if seeds else base).opts
    clock = iter(range(1000, 0, -1))
    monkeypatch.setattr(search._Timer, "run", lambda self, cand, best, runs=3: next(clock) * 1e-3)
    checks = iter([True] * len(seeds) + [False] * 1000)  # the seeds match; later candidates do not
    monkeypatch.setattr(search, "_matches", lambda out, ref, dtype: next(checks))
    res = search.beam_search(ast, cpu, item.bufs, search.SMALL_WIDTH, name="k", rounds=search.SMALL_ROUNDS)
    assert res.tried > 0 and res.rejected == res.tried
    assert res.opts == default_opts


def test_the_table_says_which_kernels_took_another_s_winner_or_a_small_search():
    import io

    from rich.console import Console

    from tgc.cli import report
    rows = [{"name": "r_a", "opts": ["UPCAST(0, 4)"], "before_s": 2e-3, "after_s": 1e-3, "tried": 9},
            {"name": "r_b", "opts": ["UPCAST(0, 4)"], "before_s": 2e-3, "after_s": 1e-3, "tried": 0, "same_as": "r_a"},
            {"name": "E_c", "opts": [], "before_s": 1e-6, "after_s": 1e-6, "tried": 3, "small": True}]
    out = io.StringIO()
    Console(file=out, width=300).print(report.beam_table({"device": "CPU", "width": 4, "kernels": rows}))
    lines = out.getvalue().splitlines()
    assert "same kernel as r_a" in next(x for x in lines if "r_b" in x)
    assert "small search" in next(x for x in lines if "E_c" in x)
    assert "same kernel" not in next(x for x in lines if "r_a" in x and "r_b" not in x)


def test_a_kernel_left_out_for_heavier_ones_is_not_said_to_have_spent_the_budget(fake_clock, monkeypatch,
                                                                                tmp_path):
    """Under a budget the lightest kernels past COVER of the work are not searched (`budget_kernels`): the table
    says the budget went to heavier kernels, not that it was spent (a review found it said so at 6 s of 30)."""
    import io

    from rich.console import Console

    from tgc.cli import report
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    items, cpu = _mix_items()
    monkeypatch.setattr(search, "estimate_cost", lambda item, dev: 30.0 if item is items[0] else 1.0)
    rows, _ = search.beam_items(items, cpu, width=2, force=True, budget_s=600.0, started=0.0)
    assert not rows[0].get("skipped") and rows[1].get("skipped") and rows[1].get("lighter")
    spent = {**rows[1], "lighter": False}
    out = io.StringIO()
    Console(file=out, width=300).print(report.beam_table({"device": "CPU", "width": 2, "kernels": [rows[1]]}))
    Console(file=out, width=300).print(report.beam_table({"device": "CPU", "width": 2, "kernels": [spent]}))
    lines = [x for x in out.getvalue().splitlines() if "not searched" in x]
    assert "heavier kernels" in lines[0] and "was spent" not in lines[0]
    assert "budget was spent" in lines[1]


@pytest.mark.parametrize("limit,more_rounds", [(0.0, False), (1e9, True)])
def test_no_new_round_after_the_time_limit(monkeypatch, limit, more_rounds):
    """Every opt makes a candidate 20% faster (the search would go on): with the limit already spent, only the
    first round runs, and its winner is kept; with a generous one, further rounds."""
    from tgc.backends import get_device
    from tgc.codegen.pipeline import prepare
    cpu = get_device("CPU")
    item = tgc.loads("a: f32[N, M]\nreturn exp(a) * 2").schedule({"N": 16, "M": 64}, "CPU")[0]
    ast = prepare(item.ast, cpu)
    monkeypatch.setattr(search, "ROUND_START_LIMIT_S", limit)
    monkeypatch.setattr(search._Timer, "run", lambda self, cand, best, runs=3: 0.8 ** len(cand.opts))
    monkeypatch.setattr(search, "_matches", lambda out, ref, dtype: True)
    monkeypatch.setattr(search, "_confirm", lambda timer, best, default, deadline=None:
                        (best, default.time_s, best.time_s))
    rounds: list[int] = []
    res = search.beam_search(ast, cpu, item.bufs, 2, name="k", progress=lambda p: rounds.append(p["round"]))
    assert rounds and (max(rounds) > 0) == more_rounds
    assert res.after_s < res.before_s


# --- the whole-program budget (`tgc beam --budget SECONDS`, issue 21 item 5)


def test_the_budget_is_spread_by_each_kernels_share():
    assert search._budget_deadline(100.0, 110.0, 1.0, 4.0) == 102.5  # a quarter of the 10 s left
    assert search._budget_deadline(100.0, 110.0, 3.0, 3.0) == 110.0  # the last kernel: all that is left
    assert search._budget_deadline(100.0, 110.0, 1.0, 0.0) == 110.0
    assert search._budget_deadline(110.0, 110.0, 1.0, 4.0) is None  # spent: not searched
    assert search._budget_deadline(111.0, 110.0, 1.0, 4.0) is None


def test_kernels_reached_after_the_budget_is_spent_are_skipped_and_searched_by_a_later_run(spy):
    p = tgc.loads(MIX)
    dims = {"M": 16, "K": 16, "N": 32}
    spent = p.beam("CPU", dims=dims, width=2, force=True, budget_s=1e-9)
    assert spy == [] and spent["kernels"] and all(r.get("skipped") for r in spent["kernels"])
    again = p.beam("CPU", dims=dims, width=1, budget_s=None)  # nothing was stored: every kernel is searched now
    assert len(spy) == len(again["kernels"]) and not any(r.get("skipped") or r["cached"] for r in again["kernels"])


def test_a_small_budget_finishes_with_its_winners_stored(tmp_path):
    """`tgc beam --budget 30` on a program of small kernels: it ends, every kernel is searched or skipped, the
    searched ones are stored (a second `tgc beam` finds them cached, but for one cut short by its share:
    `search.store_result`), and a run still matches numpy."""
    import json

    from clikit import invoke

    f = tmp_path / "mix.tg"
    f.write_text(MIX)
    args = ["beam", str(f), "-D", "M=32", "-D", "K=32", "-D", "N=64", "--json", "--force", "--budget", "30",
            "--width", "1"]
    r = invoke(*args)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = doc["kernels"]
    assert doc["budget_s"] == 30
    searched = [row for row in rows if not row.get("skipped")]
    assert searched and all(row["opts"] is not None for row in searched)
    r2 = invoke(*(a for a in args if a != "--force"))
    again = {row["name"]: row for row in json.loads(r2.stdout)["kernels"]}
    # (a search cut short by its share, on a loaded machine, is stored as partial or not at all: searched again)
    assert all(again[row["name"]]["cached"] != bool(row["partial"] or not row["stored"]) for row in searched)
    rng = np.random.default_rng(2)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((32, 32), (32, 64), (32, 64)))
    out = tgc.loads(MIX).run(a=a, b=b, c=c)
    got = list(out.values()) if isinstance(out, dict) else list(out)
    np.testing.assert_allclose(got[0], a @ b + c, rtol=1e-4, atol=1e-4)


def test_a_budget_is_not_negative_and_zero_is_unbounded(tmp_path):
    import json

    from clikit import assert_clean, invoke

    f = tmp_path / "mix.tg"
    f.write_text(MIX)
    args = ["beam", str(f), "-D", "M=4", "-D", "K=4", "-D", "N=4"]
    assert_clean(invoke(*args, "--budget", "-1"), 2, "--budget")
    r = invoke(*args, "--budget", "0", "--width", "1", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["budget_s"] is None and doc["kernels"] and not any(k.get("skipped") for k in doc["kernels"])


class FakeClock:
    """`time` for the search module: a clock that only a kernel's timing advances (by the time it reports), so
    that what the budget does is exact whatever the machine's load (rendering and compiling take no time)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def fake_clock(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(search, "time", clock)

    def run(self, cand, best, runs=3):  # every opt makes a kernel 10% faster: the search would go on and on
        t = 3.0 * 0.9 ** len(cand.opts)
        clock.now += t
        return t
    monkeypatch.setattr(search._Timer, "run", run)
    monkeypatch.setattr(search, "_matches", lambda out, ref, dtype: True)
    return clock


def _mix_items():
    from tgc.backends import get_device
    cpu = get_device("CPU")
    return [it for it in tgc.loads(MIX).schedule({"M": 16, "K": 16, "N": 32}, "CPU") if it.ast.src], cpu


def test_the_budget_bounds_the_whole_search_confirm_included(fake_clock, monkeypatch):
    """Kernel shares 3:1 of an 80 s budget: the heavy one is searched first and stops by its share (60 s), its
    winner confirmed within it; the other takes what is left; the whole search, defaults and confirms
    included, ends within the budget."""
    items, cpu = _mix_items()
    monkeypatch.setattr(search, "estimate_cost", lambda item, dev: 3.0 if item is items[0] else 1.0)
    ends: dict[str, float] = {}
    real = search.beam_search

    def spy(*args, **kwargs):
        res = real(*args, **kwargs)
        ends[kwargs["name"]] = (fake_clock.now, kwargs["deadline"])
        return res
    monkeypatch.setattr(search, "beam_search", spy)
    rows, seconds = search.beam_items(items, cpu, width=2, force=True, budget_s=80.0, started=0.0)
    assert [r["name"] for r in rows] == [it.name for it in items] and not any(r.get("skipped") for r in rows)
    (end0, deadline0), (end1, deadline1) = ends[items[0].name], ends[items[1].name]
    assert deadline0 == 60.0 and end0 <= deadline0  # 3/4 of the budget, confirm included
    assert end0 < end1 and deadline1 == 80.0
    assert rows[0]["out_of_budget"] and rows[0]["tried"] > 0 and rows[0]["after_s"] < rows[0]["before_s"]
    assert seconds <= 80.0


def test_kernels_past_the_budget_are_skipped_and_counted(fake_clock, monkeypatch, tmp_path):
    """A 6 s budget: the heavy kernel's reference and default timings (3 s and 2.4 s) spend its share, so it
    keeps its default for this run but tried no candidate: nothing is stored (a review found its default stored as
    a finished width-2 search, which the next `tgc beam` took as cached and never searched); the other kernel's
    share ends during its reference timing: not stored either. A later search searches both."""
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))  # (nothing stored by another test)
    items, cpu = _mix_items()
    monkeypatch.setattr(search, "estimate_cost", lambda item, dev: 3.0 if item is items[0] else 1.0)
    rows, seconds = search.beam_items(items, cpu, width=2, force=True, budget_s=6.0, started=0.0)
    assert [bool(r.get("skipped")) for r in rows] == [False, True]
    assert rows[0]["tried"] == 0 and rows[0]["out_of_budget"] and rows[0]["before_s"] == rows[0]["after_s"]
    assert search.lookup_entry(search.search_ast(items[0], cpu), cpu) is None
    assert search.lookup_entry(search.search_ast(items[1], cpu), cpu) is None
    assert rows[0]["stored"] is False and not rows[0]["partial"]
    assert seconds <= 6.0 + 3.0  # one timing (at most 3 s) may end past its share
    line = _table_line(rows[0])
    assert "before trying a candidate: not stored" in line and "searches it" in line
    again, _ = search.beam_items(items, cpu, width=2, budget_s=None, started=fake_clock.now)
    assert not any(r["cached"] or r.get("skipped") for r in again) and all(r["tried"] > 0 for r in again)


def _table_line(row: dict) -> str:
    """The kernel's line in `tgc beam`'s table."""
    import io

    from rich.console import Console

    from tgc.cli import report
    out = io.StringIO()
    Console(file=out, width=400).print(report.beam_table({"device": "CPU", "width": 2, "kernels": [row]}))
    return next(x for x in out.getvalue().splitlines() if row["name"] in x)


def test_a_search_stopped_by_its_share_is_stored_as_partial_and_searched_again(fake_clock, monkeypatch, tmp_path):
    """The heavy kernel's share (60 s of 80) ends after some candidates: its winner (faster than the default on
    the confirm's timing) is used by a plain run (`lookup`), but stored as partial, not as a finished width-2
    search: `lookup(width=2)` (`BEAM=2`) and the next `tgc beam` search it again (a review found it listed as
    `(cached, width 2)` and never searched again); once a search of it finishes, it is cached."""
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    items, cpu = _mix_items()
    monkeypatch.setattr(search, "estimate_cost", lambda item, dev: 3.0 if item is items[0] else 1.0)
    rows, _ = search.beam_items(items, cpu, width=2, budget_s=80.0, started=0.0)
    assert rows[0]["out_of_budget"] and rows[0]["tried"] > 0 and rows[0]["after_s"] < rows[0]["before_s"]
    ast = search.search_ast(items[0], cpu)
    assert search.lookup(ast, cpu, width=1) is None and search.lookup(ast, cpu, width=2) is None
    entry = search.lookup_entry(ast, cpu)
    assert entry is not None and entry["partial"] and entry["width"] == 2 and entry["opts"]
    assert [str(o) for o in entry["opts"]] == rows[0]["opts"]
    assert search.lookup(ast, cpu) == entry["opts"]  # used by a run without BEAM
    assert rows[0]["stored"] and rows[0]["partial"]
    assert "stored as partial; a later `tgc beam` searches it again" in _table_line(rows[0])
    fake_clock.now = 0.0
    again, _ = search.beam_items(items, cpu, width=2, budget_s=None, started=0.0)
    assert not again[0]["cached"] and again[0]["tried"] > 0 and not again[0]["out_of_budget"]
    assert not again[0]["partial"] and not search.lookup_entry(ast, cpu)["partial"]
    assert search.lookup(ast, cpu, width=2) is not None
    third, _ = search.beam_items(items, cpu, width=2, budget_s=None, started=0.0)
    assert third[0]["cached"] and third[0]["width"] == 2


def test_a_search_after_a_partial_one_resumes_from_its_winner(fake_clock, monkeypatch, tmp_path):
    """Every opt makes a kernel 10% faster (`fake_clock`): a search cut short by an 80 s budget stores a shallow
    winner as partial; a deeper winner stored as partial (as a longer search cut short would have) is a candidate
    of the next search, under the same budget, which keeps it or goes deeper from it, instead of the shallow
    winner its own few candidates reach (the partial store first replaced a 1.43x winner of an interrupted
    search by the default of a budgeted one). A stored winner that no longer applies is left out."""
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    items, cpu = _mix_items()
    monkeypatch.setattr(search, "estimate_cost", lambda item, dev: 3.0 if item is items[0] else 1.0)
    ast = search.search_ast(items[0], cpu)
    shallow, _ = search.beam_items(items, cpu, width=2, budget_s=80.0, started=0.0)
    assert shallow[0]["partial"]  # (what a cut-short search alone finds)
    k = search.OptKernel(ast, cpu)  # a winner 3 opts deeper than that, as a longer search would have found
    for o in search.lookup_entry(ast, cpu)["opts"]:
        k.apply(o)
    for _ in range(3):
        for o in search.actions(k):
            try:
                deeper = k.copy()
                deeper.apply(o)
            except search.OptError:
                continue
            k = deeper
            break
    deep = list(k.applied)
    assert len(deep) == len(shallow[0]["opts"]) + 3
    search.store(ast, cpu, deep, 1.0, items[0].name, 2, partial=True)
    fake_clock.now = 0.0
    rows, _ = search.beam_items(items, cpu, width=2, budget_s=80.0, started=0.0)
    assert not rows[0]["cached"] and rows[0]["tried"] > 0
    assert search.lookup_entry(ast, cpu)["opts"][:len(deep)] == deep  # (kept, or a deeper one from it)
    search.store(ast, cpu, deep + [deep[0]] * 20, 1.0, items[0].name, 2, partial=True)  # (does not apply)
    fake_clock.now = 0.0
    rows, _ = search.beam_items(items, cpu, width=2, budget_s=80.0, started=0.0)
    assert rows[0]["tried"] > 0 and search.lookup_entry(ast, cpu)["opts"] != deep + [deep[0]] * 20


def test_a_cut_short_search_keeps_a_finished_winner_stored_before(fake_clock, monkeypatch, tmp_path):
    """A finished width-1 search's winner is stored; a width-2 search cut short by its share (and a --force one)
    is confirmed against the default only: it must not replace that winner (a review saw a 1.42x width-1 winner
    replaced by the default, stored as partial); it starts from it (--force from the start); the table says the
    winner is kept."""
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    items, cpu = _mix_items()
    monkeypatch.setattr(search, "estimate_cost", lambda item, dev: 3.0 if item is items[0] else 1.0)
    ast = search.search_ast(items[0], cpu)
    default = search._starts(ast, cpu, "k", items[0].bufs)[1][-1].opts
    finished = search._starts(ast, cpu, "k", items[0].bufs)[1][0].opts  # (a shallower kernel than the default)
    assert finished != default
    search.store(ast, cpu, finished, 1.0, items[0].name, 1)
    seen: list = []
    real = search._starts

    def starts(*a, **kw):
        if a[0] is ast:
            seen.append(a[5] if len(a) > 5 else kw.get("resume"))
        return real(*a, **kw)
    monkeypatch.setattr(search, "_starts", starts)
    for force in (False, True):
        fake_clock.now = 0.0
        rows, _ = search.beam_items(items, cpu, width=2, budget_s=80.0, started=0.0, force=force)
        assert rows[0]["out_of_budget"] and rows[0]["tried"] > 0 and rows[0]["stored"] is False and rows[0]["kept"]
        entry = search.lookup_entry(ast, cpu)
        assert entry["opts"] == finished and entry["width"] == 1 and not entry["partial"]
        assert seen[-1] == (None if force else finished)  # (it started from it, --force from the start)
        assert "an earlier finished search's winner is kept" in _table_line(rows[0])
    fake_clock.now = 0.0
    rows, _ = search.beam_items(items, cpu, width=2, budget_s=None, started=0.0)  # one that finishes replaces it
    assert not rows[0]["out_of_budget"] and rows[0]["stored"]
    assert search.lookup_entry(ast, cpu)["width"] == 2 and not search.lookup_entry(ast, cpu)["partial"]


def test_a_cut_short_search_whose_best_could_not_be_confirmed_stores_nothing(fake_clock, monkeypatch, tmp_path):
    """The heavy kernel's first candidate (faster alone) takes its timing past its share's deadline: no confirm
    round fits, so the default is kept for the run, but nothing showed it faster than the candidate: nothing is
    stored, and a partial winner stored earlier stays (a budgeted run on a loaded machine replaced a 1.43x
    partial winner with the default this way); the table says why."""
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    items, cpu = _mix_items()
    monkeypatch.setattr(search, "estimate_cost", lambda item, dev: 3.0 if item is items[0] else 1.0)
    ast = search.search_ast(items[0], cpu)
    n_default = len(search._starts(ast, cpu, "k", items[0].bufs)[1][-1].opts)

    def run(self, cand, best, runs=3):  # a round's candidate (deeper than the default) overruns the share
        t = 3.0 * 0.9 ** len(cand.opts)
        fake_clock.now += t + (100.0 if len(cand.opts) > n_default else 0.0)
        return t
    monkeypatch.setattr(search._Timer, "run", run)
    rows, _ = search.beam_items(items, cpu, width=2, budget_s=80.0, started=0.0)
    assert rows[0]["out_of_budget"] and rows[0]["tried"] == 1 and rows[0]["after_s"] == rows[0]["before_s"]
    assert search.lookup_entry(ast, cpu) is None and rows[0]["stored"] is False
    assert "before its best could be confirmed: not stored" in _table_line(rows[0])
    prior = search._starts(ast, cpu, "k", items[0].bufs)[1][0].opts  # (a partial winner of an earlier search)
    search.store(ast, cpu, prior, 1.0, items[0].name, 2, partial=True)
    fake_clock.now = 0.0
    rows, _ = search.beam_items(items, cpu, width=2, budget_s=80.0, started=0.0)
    assert rows[0]["stored"] is False and search.lookup_entry(ast, cpu)["opts"] == prior


def test_a_resumed_winner_of_a_kernel_with_no_default_opts_leaves_the_default_last():
    """The default is the search's last first candidate (`_search_from`); where the heuristic picks no opts there
    were none, and the default was the reference: with a winner to resume from, the reference is added as the
    last one, so the default stays a kernel with no opts, and the resumed winner is searched from."""
    from tgc.backends import get_device
    from tgc.codegen.opt import Opt, OptOps
    cpu = get_device("CPU")
    item = next(i for i in tgc.loads("a: f32[N, M]\nreturn a * 2").schedule({"N": 3, "M": 5}, "CPU") if i.ast.src)
    ast = search.search_ast(item, cpu)
    assert search._starts(ast, cpu, "k", item.bufs)[1] == []  # (the heuristic picks nothing here)
    base, seeds = search._starts(ast, cpu, "k", item.bufs, resume=[Opt(OptOps.UPCAST, 0, 3)])
    assert [[str(o) for o in c.opts] for c in seeds] == [["UPCAST(0, 3)"], []] and seeds[1].src == base.src
    assert search._starts(ast, cpu, "k", item.bufs, resume=[Opt(OptOps.UPCAST, 0, 7)])[1] == []  # (no longer applies)
    res = search.beam_search(ast, cpu, item.bufs, 2, name="k", rounds=1,
                             starts=search._starts(ast, cpu, "k", item.bufs, resume=[Opt(OptOps.UPCAST, 0, 3)]))
    assert res.before_s < float("inf") and res.after_s <= res.before_s


def test_an_interrupted_search_is_stored_as_partial(fake_clock, monkeypatch, tmp_path):
    """Ctrl-C during a kernel's search after some candidates: its best so far is stored as partial (the next
    search searches it again) and the run stops there; Ctrl-C before its default was timed stores nothing."""
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path))
    items, cpu = _mix_items()
    real = search._Timer.run
    calls = {"n": 0, "at": 6}

    def run(self, cand, best, runs=3):
        calls["n"] += 1
        if calls["n"] == calls["at"]:
            raise KeyboardInterrupt
        return real(self, cand, best, runs)
    monkeypatch.setattr(search._Timer, "run", run)
    rows, _ = search.beam_items(items[:1], cpu, width=2, budget_s=None, started=0.0)
    assert rows[0]["interrupted"] and rows[0]["tried"] > 0
    ast = search.search_ast(items[0], cpu)
    assert search.lookup(ast, cpu, width=2) is None and search.lookup_entry(ast, cpu)["partial"]
    assert rows[0]["partial"]
    assert "interrupted: stored as partial" in _table_line(rows[0])
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "other"))
    calls.update(n=0, at=1)  # (the reference's timing)
    with pytest.raises(KeyboardInterrupt):
        search.beam_items(items[:1], cpu, width=2, budget_s=None, started=0.0)
    assert search.lookup_entry(ast, cpu) is None


def test_the_confirm_step_runs_only_the_rounds_that_fit(fake_clock):
    from tgc.codegen.search import Candidate, _confirm

    class Timer:
        def run(self, cand, best, runs=3):
            fake_clock.now += cand.time_s
            return cand.time_s
    default, best = Candidate([], None, time_s=1.0), Candidate(["x"], None, time_s=0.5)
    assert _confirm(Timer(), best, default, deadline=3.0)[0] is best  # two rounds of 1.5 s fit
    assert fake_clock.now == 3.0
    assert _confirm(Timer(), best, default, deadline=4.0) == (default, 1.0, 1.0)  # none fits: the default
    assert fake_clock.now == 3.0


def test_the_estimate_weighs_flops_or_bytes():
    from tgc.backends import get_device
    cpu = get_device("CPU")
    mm = tgc.loads("a: f32[N, N]\nb: f32[N, N]\nreturn a @ b").schedule({"N": 64}, "CPU")[0]
    copy = tgc.loads("a: f32[N, N]\nreturn a * 2").schedule({"N": 64}, "CPU")[0]
    assert search.estimate_cost(mm, cpu) >= 2 * 64 ** 3 * 0.9  # a multiply and an add per term
    assert search.estimate_cost(copy, cpu) == search.MACHINE_BALANCE * 2 * 64 * 64 * 4  # memory-bound
