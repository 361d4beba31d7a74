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
    """The budget's measurement says the second kernel takes 0.1% of the program: it is searched with width 1
    over one round (fewer candidates than the full search of it tries), the first with the full width; both
    results still match numpy (with the winners of a search where every opt looks faster), and the small one's
    winner is stored under the width asked."""
    real = search._time_defaults
    measured: list[int] = []
    # every opt makes a candidate 20% faster (each round gains: the full search goes on), every output matches
    monkeypatch.setattr(search._Timer, "run", lambda self, cand, best, runs=3: 0.8 ** len(cand.opts))
    monkeypatch.setattr(search, "_matches", lambda out, ref, dtype: True)

    def times(todo, dev, pool):
        starts, t = real(todo, dev, pool)
        measured.append(len(todo))
        return starts, {j: (1.0 if j == 0 else 0.001) for j in t}
    monkeypatch.setattr(search, "_time_defaults", times)
    p = tgc.loads(MIX)
    dims = {"M": 32, "K": 32, "N": 64}
    result = p.beam("CPU", dims=dims, width=2, force=True)
    rows = result["kernels"]
    assert measured == [2] and len(rows) == 2
    assert [r["small"] for r in rows] == [False, True]
    assert [(w, r) for _, w, r, _ in spy] == [(2, search.MAX_ROUNDS), (search.SMALL_WIDTH, search.SMALL_ROUNDS)]
    assert all(r["width"] == 2 for r in rows)
    small_tried = spy[1][3]
    # the same kernel's full search (no budget) tries more candidates
    spy.clear()
    monkeypatch.setattr(search, "_time_defaults", real)
    monkeypatch.setattr(search, "small_search", lambda t, total: False)
    p.beam("CPU", dims=dims, width=2, force=True)
    assert spy[1][3] > small_tried
    rng = np.random.default_rng(1)
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
    monkeypatch.setattr(search, "_confirm", lambda timer, best, default: (best, default.time_s, best.time_s))
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
    again = p.beam("CPU", dims=dims, width=1, budget_s=2.0)  # nothing was stored: every kernel is searched now
    assert len(spy) == len(again["kernels"]) and not any(r.get("skipped") or r["cached"] for r in again["kernels"])


def test_a_small_budget_finishes_with_its_winners_stored(tmp_path):
    """`tgc beam --budget 3` on a program of several kernels: it ends, every kernel is searched or skipped, the
    searched ones are stored (a second `tgc beam` finds them cached), and a run still matches numpy."""
    import json

    from clikit import invoke

    f = tmp_path / "mix.tg"
    f.write_text(MIX)
    args = ["beam", str(f), "-D", "M=32", "-D", "K=32", "-D", "N=64", "--json", "--force", "--budget", "3"]
    r = invoke(*args)
    assert r.exit_code == 0, r.stderr
    rows = json.loads(r.stdout)["kernels"]
    searched = [row for row in rows if not row.get("skipped")]
    assert searched and all(row["opts"] is not None for row in searched)
    r2 = invoke(*(a for a in args if a != "--force"))
    again = {row["name"]: row for row in json.loads(r2.stdout)["kernels"]}
    assert all(again[row["name"]]["cached"] for row in searched)
    rng = np.random.default_rng(2)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((32, 32), (32, 64), (32, 64)))
    out = tgc.loads(MIX).run(a=a, b=b, c=c)
    got = list(out.values()) if isinstance(out, dict) else list(out)
    np.testing.assert_allclose(got[0], a @ b + c, rtol=1e-4, atol=1e-4)


def test_a_budget_must_be_positive(tmp_path):
    from clikit import assert_clean, invoke

    f = tmp_path / "mix.tg"
    f.write_text(MIX)
    assert_clean(invoke("beam", str(f), "-D", "M=4", "-D", "K=4", "-D", "N=4", "--budget", "0"), 2, "--budget")
