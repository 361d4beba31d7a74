"""BEAM tunes the fused attention kernel (issue 14; issue 20 item 4: with its one driver): its choices are ordinary
opts on the kernel's axes (`tgc.codegen.attention.AttentionKernel`: UPCAST of the query row axis = rows per
vector, UNROLL of the key axis = keys per block, THREAD), each checked against numpy (with and without the causal
mask, ragged lengths, one key, f16); `search.beam_search` enumerates them with `actions`, checks candidates
against the unoptimized kernel (the per-row form), rejects one that differs, confirms the winner against the
default and stores it under the same key form as any kernel, which later compiles reuse. Also BEAM's time savings
(issue 14: `tgc beam` < 60 s per workload): duplicate sources compiled and run once, clearly slower candidates
stopped early."""

from __future__ import annotations

import numpy as np
import pytest
from test_attention_fused import inputs, program, reference

from tgc.backends import get_device
from tgc.codegen import attention as A
from tgc.codegen import kernel as kernel_mod
from tgc.codegen import search
from tgc.codegen.opt import Opt, OptError, OptOps
from tgc.engine.attention import spec_of

CPU = get_device("CPU")


def attention_item(p, dims, device: str = "CPU"):
    items = [it for it in p.schedule(dims, device) if A.is_fused_attention(it.ast)]
    assert len(items) == 1
    return items[0]


def opts(rows: int, block: int, threads: int | None = None, row_axis: int = 1) -> list[Opt]:
    """The opts choosing `rows` query rows per vector (0: the per-row form), `block` keys per block and `threads`,
    for a kernel whose output loops are a batch loop and the query row (`row_axis`; the key axis follows)."""
    out = [Opt(OptOps.UPCAST, row_axis, rows)] if rows else []
    out.append(Opt(OptOps.UNROLL, row_axis + 1, block))
    if threads:
        out.append(Opt(OptOps.THREAD, 0, threads))
    return out


HEURISTIC = [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 1, 2)]  # 16 rows per vector; its prefix: 8 rows


def run_with(p, dims, o: list[Opt] | None, device: str = "CPU", dtype=np.float32):
    """The program run with `o` stored as the attention kernel's BEAM winner (`o=None`: nothing stored)."""
    dev = get_device(device)
    item = attention_item(p, dims, device)
    if o is not None:
        search.store(search.search_ast(item, dev), dev, o, 1.0, item.name, width=4)
    p.release()
    p._kernels.clear()
    kernels = p.compile(device, dims=dims)
    q, k, v = inputs(dims["B"], dims["T"], dims["D"], dims["E"], dtype)
    out = p.run(device, dims=dims, q=q, k=k, v=v)[p.output_names[0]]
    return kernels, out, (q, k, v)


# every rows value the rows form takes, and blocks around and past the default; each run with a ragged sequence
# (its last block partial), and a few with whole blocks and with one partial block
ROWS = sorted(A.ROW_CHOICES)
BLOCKS = [2, 3, 8, 16]
CASES = [(r, b, b + 3, 2 if r == A.ROW_LANES else 1) for r in ROWS for b in BLOCKS] + \
    [(8, A.ROW_BLOCK_VALUES // 8, 70, 2), (16, 16, 7, 2), (8, 8, 16, 2), (16, 8, 33, 1), (0, A.MAX_BLOCK, 70, 2)]


@pytest.mark.parametrize("masked", [False, True])
def test_every_choice_matches_numpy(masked):
    p = program(masked)
    q, k, v = inputs(2, 1, 5, 3)  # one key: nothing is fused (the front end folds the softmax of one element)
    out = p.run("CPU", dims={"B": 2, "T": 1, "D": 5, "E": 3}, q=q, k=k, v=v)[p.output_names[0]]
    np.testing.assert_allclose(out, reference(q, k, v, masked), rtol=2e-5, atol=2e-5)
    for rows, block, t, threads in CASES:
        dims = {"B": 2, "T": t, "D": 5, "E": 3}
        (kern,), out, (q, k, v) = run_with(p, dims, opts(rows, block, threads))
        assert kern.opts == opts(rows, block, threads)
        np.testing.assert_allclose(out, reference(q, k, v, masked), rtol=2e-5, atol=2e-5,
                                   err_msg=f"rows={rows} block={block} threads={threads} T={t}")


@pytest.mark.parametrize("masked", [False, True])
def test_every_block_choice_with_f16_inputs(masked):
    """Half inputs take the per-row form: only the key block is a choice there (an UPCAST of the rows is refused)."""
    p = program(masked, "f16")
    item = attention_item(p, {"B": 2, "T": 21, "D": 8, "E": 8})
    k = A.AttentionKernel(item, CPU)
    k.heuristic()
    assert k.applied == [] and k.choices()["rows"] == 0
    with pytest.raises(OptError):
        k.apply(Opt(OptOps.UPCAST, k.row_axis, 16))
    for block in BLOCKS:
        dims = {"B": 2, "T": 21, "D": 8, "E": 8}
        _, out, (q, k, v) = run_with(p, dims, opts(0, block), dtype=np.float16)
        np.testing.assert_allclose(out.astype(np.float64), reference(q, k, v, masked), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("masked", [False, True])
def test_every_block_choice_on_the_python_device(masked, monkeypatch):
    """The PYTHON device (which checks bounds) runs the per-row form with each key block."""
    monkeypatch.setenv("TGC_VERIFY_BOUNDS", "1")
    p = program(masked)
    dims = {"B": 1, "T": 11, "D": 3, "E": 2}
    k = A.AttentionKernel(attention_item(p, dims, "PYTHON"), get_device("PYTHON"))
    k.heuristic()
    assert k.applied == [] and (k.row_axis, k.key_axis) == (0, 1)  # B=1: the query row is the only loop
    for block in (2, 3, 8, 16):
        (kern,), out, (q, k, v) = run_with(p, dims, opts(0, block, row_axis=0), device="PYTHON")
        assert kern.opts == [Opt(OptOps.UNROLL, 1, block)]
        np.testing.assert_allclose(out, reference(q, k, v, masked), rtol=2e-5, atol=2e-5)


def test_an_opt_that_does_not_apply_is_refused():
    item = attention_item(program(False), {"B": 2, "T": 40, "D": 8, "E": 8})
    for bad in ([Opt(OptOps.UPCAST, 1, 4)], [Opt(OptOps.UNROLL, 2, 1)], [Opt(OptOps.UNROLL, 1, 8)],
                [Opt(OptOps.UPCAST, 2, 16)], [Opt(OptOps.UPCAST, 0, 16)], [Opt(OptOps.UNROLL, 2, 128)],
                [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 1, 2)], [Opt(OptOps.THREAD, 0, 1)] * 2,
                [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UNROLL, 2, 32)],  # 16 rows x 32 keys: over 256 in registers
                [Opt(OptOps.UNROLL, 2, 32), Opt(OptOps.UPCAST, 1, 16)],
                [Opt(OptOps.THREAD, 0, CPU.cores + 1)], [Opt(OptOps.LOCAL, 1, 2)], [Opt(OptOps.PADTO, 2, 8)],
                [Opt(OptOps.SWAP, 0, 1)]):
        k = A.AttentionKernel(item, CPU)
        with pytest.raises(OptError):
            for o in bad:
                k.apply(o)
    # a second UPCAST or UNROLL multiplies: 8 rows x 2 = 16, 4 keys x 4 = 16; per row, 16 keys x 4 = 64
    k = A.attention_kernel(item, CPU, [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 1, 2),
                                       Opt(OptOps.UNROLL, 2, 4), Opt(OptOps.UNROLL, 2, 4)])
    assert k.choices()["rows"] == 16 and k.choices()["block"] == 16
    k = A.attention_kernel(item, CPU, [Opt(OptOps.UNROLL, 2, 16), Opt(OptOps.UNROLL, 2, 4)])
    assert k.choices()["rows"] == 0 and k.choices()["block"] == 40  # cut to the 40 keys


def test_the_drivers_actions_on_the_fused_kernel():
    """`search.actions` enumerates the fused kernel's axes as any kernel's: the query row and key axes take
    every amount (the lowering masks a partial last tile or block), the batch axis only its divisors, then
    fewer threads than the automatic count; the heuristic's choice is 16 rows per vector, keys in blocks of
    `BLOCK` and the automatic threads."""
    item = attention_item(program(False), {"B": 2, "T": 41, "D": 8, "E": 8})
    k = A.AttentionKernel(item, CPU)
    acts = search.actions(k)
    assert {o.amount for o in acts if o.op is OptOps.UPCAST and o.axis == 1} == set(search.UPCAST_AMOUNTS)
    assert {o.amount for o in acts if o.op is OptOps.UNROLL and o.axis == 2} == set(search.UNROLL_AMOUNTS)
    assert {o.amount for o in acts if o.op is OptOps.UPCAST and o.axis == 0} == {2}
    applied = []
    for o in acts:
        c = k.copy()
        try:
            c.apply(o)
        except OptError:
            continue
        applied.append(o)
    assert k.applied == []  # copies: the kernel itself is unchanged
    assert applied == [Opt(OptOps.UPCAST, 1, a) for a in A.ROW_CHOICES] + \
        [Opt(OptOps.UNROLL, 2, a) for a in search.UNROLL_AMOUNTS] + \
        [Opt(OptOps.THREAD, 0, t) for t in search.thread_amounts(CPU.cores)]
    assert search.thread_amounts(2) == [1] and search.thread_amounts(8) == [1, 4] and search.thread_amounts(1) == []
    k.apply(Opt(OptOps.THREAD, 0, 1))
    assert not any(o.op is OptOps.THREAD for o in search.actions(k))  # chosen once
    seed = A.AttentionKernel(item, CPU)
    seed.heuristic()
    assert seed.applied == HEURISTIC and seed.choices()["rows"] == A.ROW_LANES
    assert seed.choices()["block"] == A.BLOCK and A.AttentionKernel(item, CPU).choices()["rows"] == 0


def test_fewer_threads_are_an_action_on_every_cpu_kernel():
    """An ordinary kernel gets the same THREAD actions (`search.thread_amounts`); where its automatic count is already
    one thread, THREAD(0, 1) renders the same source (a duplicate the search neither compiles nor runs)."""
    import tgc
    from tgc.codegen.opt import OptKernel

    if CPU.cores < 2:
        pytest.skip("one core: no thread count below the automatic one")
    item = tgc.loads("a: f32[N, M]\nreturn exp(a) * 2").schedule({"N": 8, "M": 64}, "CPU")[0]
    ast = search.search_ast(item, CPU)
    k = OptKernel(ast, CPU)
    threads = [o for o in search.actions(k) if o.op is OptOps.THREAD]
    assert threads == [Opt(OptOps.THREAD, 0, t) for t in search.thread_amounts(CPU.cores)] and threads[0].amount == 1
    plain, one = search.Candidate([], OptKernel(ast, CPU)), search.Candidate([Opt(OptOps.THREAD, 0, 1)], k.copy())
    one.kernel.apply(Opt(OptOps.THREAD, 0, 1))
    for c in (plain, one):
        search._render(c, CPU, "k", item.bufs)
    assert one.src == plain.src  # 512 elements: the automatic split keeps one thread too


def test_beam_searches_the_attention_kernel_and_its_winner_is_reused(monkeypatch):
    p = program(True)
    dims = {"B": 2, "T": 40, "D": 8, "E": 8}
    item = attention_item(p, dims)
    seen: list[list[Opt]] = []
    real = search.lower_attention

    def spy(item, device, name, opts=None):
        low = real(item, device, name, opts)
        seen.append(opts)
        return low
    monkeypatch.setattr(search, "lower_attention", spy)
    monkeypatch.setattr(kernel_mod, "lower_attention", spy)
    result = p.beam("CPU", dims=dims, width=1, force=True)
    (row,) = [r for r in result["kernels"] if r["name"] == item.name]
    heuristic = HEURISTIC
    # the reference (unoptimized: the per-row form), then the default's prefixes (8 rows, then 16: the default)
    assert seen[:3] == [[], heuristic[:1], heuristic]
    # then their neighbours (and, after the search, the default kernel lowered by the memory-plan check: opts None)
    assert all(o is None or o[:1] == heuristic[:1] for o in seen[3:]) and len(seen) > 3
    assert row["reference"] == "unoptimized" and not row["cached"]
    stored = search.lookup(item.ast, CPU)  # the plain AST's key, the one key form
    assert stored is not None and [str(o) for o in stored] == row["opts"] and stored in seen
    # later compiles use the stored winner; a second `beam` finds it cached and searches nothing
    seen.clear()
    p._kernels.clear()
    (kern,) = p.compile("CPU", dims=dims)
    assert kern.opts == stored and seen == [stored]
    again = p.beam("CPU", dims=dims, width=1)
    # (the memory-plan check lowers the default, opts None, and the winner again: nothing else)
    assert [r["cached"] for r in again["kernels"]] == [True] and all(o is None or o == stored for o in seen)
    # tuned=False (what bench shows as 'tgc default') ignores the winner
    (default,) = p.compile("CPU", dims=dims, tuned=False)
    assert default.opts == heuristic


def test_a_stored_winner_changes_the_kernel():
    p = program(False)
    dims = {"B": 2, "T": 40, "D": 8, "E": 8}
    (default,), _, _ = run_with(p, dims, None)
    (tuned,), out, (q, k, v) = run_with(p, dims, opts(8, 8, 1))
    assert tuned.opts == opts(8, 8, 1) and tuned.src != default.src and tuned.global_size == (1, 1, 1)
    np.testing.assert_allclose(out, reference(q, k, v, False), rtol=2e-5, atol=2e-5)


def test_a_stale_stored_winner_falls_back_to_the_heuristic():
    """A stored entry naming opts this kernel refuses (an older version's) gives the heuristic's kernel."""
    p = program(False)
    dims = {"B": 2, "T": 40, "D": 8, "E": 8}
    (kern,), out, (q, k, v) = run_with(p, dims, [Opt(OptOps.UNROLL, 0, 16)])
    assert kern.opts == HEURISTIC
    np.testing.assert_allclose(out, reference(q, k, v, False), rtol=2e-5, atol=2e-5)


def _search(item, **kw):
    return search.beam_search(search.search_ast(item, CPU), CPU, item.bufs, 1, name=item.name, rounds=1,
                              item=item, **kw)


def test_a_wrong_candidate_is_rejected_and_the_default_kept(monkeypatch):
    """Every candidate looks faster than the last, and every output after the starts' checks is wrong:
    each one is rejected and the default stays."""
    item = attention_item(program(False), {"B": 2, "T": 40, "D": 8, "E": 8})
    clock = iter(range(1000, 0, -1))
    monkeypatch.setattr(search._Timer, "run", lambda self, cand, best, runs=3: next(clock) * 1e-3)
    checks = iter([True, True] + [False] * 100)  # the two starts (8 rows, 16 rows) pass
    monkeypatch.setattr(search, "_matches", lambda out, ref, dtype: next(checks))
    res = _search(item)
    assert res.tried > 0 and res.rejected == res.tried and res.failed == 0
    assert res.opts == HEURISTIC and res.reference == "unoptimized"


def test_the_winner_is_timed_again_against_the_default(monkeypatch):
    """A candidate that only looked faster once loses the confirmation and the default is stored."""
    item = attention_item(program(False), {"B": 2, "T": 40, "D": 8, "E": 8})
    default = HEURISTIC

    def fake(self, cand, best, runs=3):  # in the search every candidate looks faster; confirming, none is
        return 2.0 if cand.opts == default else (1.0 if runs == 3 else 3.0)
    monkeypatch.setattr(search._Timer, "run", fake)
    res = _search(item)
    assert res.opts == default and res.after_s == res.before_s == 2.0


def test_a_wide_head_is_searched_in_the_rows_form():
    """The rows form keeps the head dimension and the output columns as loops: a 128-wide head's every block is a
    small kernel, so each is a candidate."""
    item = attention_item(program(False), {"B": 2, "T": 40, "D": 128, "E": 128})
    for block in search.UNROLL_AMOUNTS:
        k = A.attention_kernel(item, CPU, [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UNROLL, 2, block)])
        assert A._terms(spec_of(item.ast), k.choices()) <= A.MAX_SEARCH_TERMS


def test_a_wide_head_bounds_the_per_row_forms_block():
    """The per-row form (half inputs) writes each key's term of every value column out: a 256-wide head's block is
    bounded by `MAX_SEARCH_TERMS` (each larger one takes many seconds to compile), as an ordinary kernel's unrolled
    values are; its default (no opts) is not bounded."""
    item = attention_item(program(False, "f16"), {"B": 2, "T": 40, "D": 256, "E": 256})
    k = A.AttentionKernel(item, CPU)
    assert A._terms(spec_of(item.ast), k.choices()) > A.MAX_SEARCH_TERMS
    A.attention_kernel(item, CPU, [Opt(OptOps.UNROLL, 2, 4)])
    with pytest.raises(OptError, match="terms"):
        A.attention_kernel(item, CPU, [Opt(OptOps.UNROLL, 2, 8)])


def test_beam_compiles_and_runs_each_distinct_source_once():
    """Two orders of the same opts, or a source an earlier round already had, render the same kernel: the
    second is marked a duplicate and neither compiled nor run (`_render_compile`)."""
    from concurrent.futures import Future

    import tgc
    from tgc.codegen.opt import OptKernel
    from tgc.codegen.pipeline import prepare

    item = tgc.loads("a: f32[N, M]\nreturn exp(a) * 2").schedule({"N": 8, "M": 64}, "CPU")[0]
    ast = prepare(item.ast, CPU)

    def cand(*o: Opt) -> search.Candidate:
        k = OptKernel(ast, CPU)
        for x in o:
            k.apply(x)
        return search.Candidate(list(o), k)

    class Pool:
        submitted: list[str] = []

        def submit(self, kind, src):
            self.submitted.append(src)
            f: Future = Future()
            f.set_result(b"bin")
            return f
    a, b, c = cand(Opt(OptOps.UPCAST, 1, 4)), cand(Opt(OptOps.UPCAST, 1, 4)), cand(Opt(OptOps.UPCAST, 1, 8))
    earlier = cand(Opt(OptOps.UPCAST, 1, 2))
    search._render(earlier, CPU, "k", item.bufs)
    sources = {earlier.src}
    d = cand(Opt(OptOps.UPCAST, 1, 2))
    pool = Pool()
    search._render_compile([a, b, c, d], CPU, "k", item.bufs, pool, sources)
    assert [x.duplicate for x in (a, b, c, d)] == [False, True, False, True]
    assert pool.submitted == [a.src, c.src] and a.src != c.src
    assert a.binary == c.binary == b"bin" and b.binary is None and d.binary is None
    assert sources == {earlier.src, a.src, c.src}


def _scripted_timer(times: list[float]):
    """A `search._Timer` whose kernel launches take the given times, in order; returns it and the launch log."""
    launches: list[float] = []
    it = iter(times)

    class Dev:
        caps = CPU.caps

        def program(self, name, binary):
            def run(*bufs, **launch):
                t = next(it)
                launches.append(t)
                return t
            return run
    timer = search._Timer.__new__(search._Timer)
    timer.device, timer.handles = Dev(), []
    return timer, launches


def test_a_clearly_slower_candidate_stops_early():
    c = search.Candidate([], None, name="k", binary=b"")  # type: ignore[arg-type]
    timer, launches = _scripted_timer([5.0])  # its untimed first launch is over 4x the best (1.0): done
    assert timer.run(c, 1.0) == 5.0 and launches == [5.0]
    timer, launches = _scripted_timer([5.0, 0.5, 0.6, 0.7])
    timer.device.caps = type("Caps", (), {"gpu": True})()
    assert timer.run(c, 1.0) == 0.5 and launches == [5.0, 0.5, 0.6, 0.7]  # GPUs: a slow first launch is lazy loading
    timer, launches = _scripted_timer([3.0, 2.5])  # within 4x at first, then over 2x: one timed run
    assert timer.run(c, 1.0) == 2.5 and launches == [3.0, 2.5]
    timer, launches = _scripted_timer([1.5, 1.2, 0.9, 1.1])  # close to the best: every timed run
    assert timer.run(c, 1.0) == 0.9 and launches == [1.5, 1.2, 0.9, 1.1]


@pytest.mark.parametrize("gain,more_rounds", [(0.01, False), (0.2, True)])
def test_a_round_within_the_noise_ends_the_search(monkeypatch, gain, more_rounds):
    """Every opt makes a candidate `gain` faster: a 1% gain (within `MIN_ROUND_GAIN`) ends the search after
    its first round, keeping that round's winner; a 20% gain goes on to further rounds."""
    import tgc
    from tgc.codegen.pipeline import prepare

    item = tgc.loads("a: f32[N, M]\nreturn exp(a) * 2").schedule({"N": 16, "M": 64}, "CPU")[0]
    ast = prepare(item.ast, CPU)
    monkeypatch.setattr(search._Timer, "run", lambda self, cand, best, runs=3: (1 - gain) ** len(cand.opts))
    monkeypatch.setattr(search, "_matches", lambda out, ref, dtype: True)
    monkeypatch.setattr(search, "_confirm", lambda timer, best, default, deadline=None:
                        (best, default.time_s, best.time_s))
    rounds: list[int] = []
    res = search.beam_search(ast, CPU, item.bufs, 2, name="k", progress=lambda p: rounds.append(p["round"]))
    assert rounds and (max(rounds) > 0) == more_rounds
    assert res.after_s < res.before_s
