"""The model-corpus table of `make bench` (issue 20, items 3 and 5): every program of bench/models/ (listed with
its dims in `models.CORPUS`) timed with tgc's default kernels, with tgc's kernels after `tgc beam` and with XLA
(`jax.jit` of its twin in bench/models.py), in one run, with its recompute factor and its peak memory against
inputs + outputs (+ weights: every weight of these programs is an input), each target met or not and what
limits a miss.

Targets, per model: default kernels >= 0.8x XLA, after BEAM >= 1.0x XLA, recompute factor <= 1.05, peak memory
<= 1.5x inputs + outputs. "tgc beam" times the kernels with the winners stored by `tgc beam` (the BEAM cache);
without `--corpus-beam` no search runs, and a kernel with no stored winner runs its default (the column says
how many kernels had one). What limits a miss is measured, not guessed: the kernel taking the largest share of
the program's time, with its GFLOP/s, and for a BEAM miss what the search did with
that kernel (`search_outcome`: kept its default, stopped at its share of the budget, not reached, ...) and the
share of the time in kernels that compute nothing (copies: packed weights, joins); `KNOWN_LIMITS` adds what
reading a model's kernels found.

Timing on a shared machine: default kernels, BEAM kernels and XLA alternate `ROUNDS` times in one run, each
round's median of a few runs, default and BEAM in turn first (the order reversed every other round); the best
round of each counts (all three see the same load). The load average at the start and end of a model's rounds is
kept in its row. Where the stored winners leave every kernel as the default renders it (each winner is its
kernel's default, or none is stored: `same_program`), the program is one executable and is timed once for both
columns (`beam_same`): timing it twice measured only the load (gru with its 2 winners both the default's opts:
1.59 ms default, 11.75 ms "tuned" in one run at load 3.4). Else the BEAM column is the default's time times the
paired ratio of the two programs (`paired_ratio`: `beam_paired_ratio`; the best of the BEAM rounds alone is kept
as `beam_rounds_ms`): the load moves between a program's rounds by more than winners change it (llama odd's
winners read 0.64x the default's speed in one table and 0.995x paired, 30 rounds, the same cache).

    corpus_rows(quick, beam_search, peak_memory, xla_timer, timeit, beam_budget_s=...) -> rows;  print_corpus(rows)
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

import tgc  # noqa: E402
from tgc.api import kernel_names  # noqa: E402  (the names a program's kernels carry)
from tgc.codegen.search import SMALL_SHARE  # noqa: E402
from tgc.engine.inputs import random_inputs  # noqa: E402

MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
DEFAULT_TARGET = 0.8  # default kernels: XLA's time / tgc's
BEAM_TARGET = 1.0  # after `tgc beam`
RECOMPUTE_TARGET = 1.05
MEMORY_TARGET = 1.5  # peak memory / (inputs + outputs + weights)
ROUNDS = 3  # default, BEAM and XLA timings alternate this many times, the best of each counts
# the BEAM column where a winner changed a kernel: the default's time x the median of this many rounds' paired
# ratios (`paired_ratio`: both executables bound at once, alternating run by run, as `tgc beam`'s program check
# times them); each program's best of ROUNDS rounds alone read the same executable at 1.59 and 11.75 ms (load 3.4)
PAIRED_ROUNDS = 7
# `--corpus-beam`'s search per model (`Program.beam(budget_s=)`, `python bench/bench.py --corpus-beam-budget`):
# longer than `tgc beam`'s default (search.DEFAULT_BUDGET_S, 20 s): the larger blocks have 12-22 distinct kernels,
# and at 20 s (load 6) llama odd reached 9 of its 13 distinct kernels, 6 of them stopping at their share
BEAM_BUDGET_S = 60.0
COPY_SHARE_NOTE = 0.10  # a miss names the copies (kernels of no FLOPs) where they take at least this share
# what reading a model's kernels found (the measured top kernel is printed beside it)
KNOWN_LIMITS = {
    "kv decode": "recompute: the fused attention reads k and v through `repeat` of the 4 key/value heads over the 16 "
                 "query heads, so `cat(cache, new)`'s select runs once per query head (4x) for every key; "
                 "realizing the concatenated caches (a 2 MiB copy per step) gives 1.00 but measured slower "
                 "(RECOMPUTE_LIMIT=1: the kernels 1.23-1.31 ms against 1.01-1.03 ms, best of 200 alternating "
                 "rounds), so the select stays fused",
    "unet": "memory: per image (B=2 is the only axis chunked), `cat(up, skip)` (2 MiB) lives beside the padded "
            "copy of the upsampled `bottom` that `up`'s conv reads (2.13 MiB, 4x what it copies), then beside "
            "its own padded copy (2.13 MiB); 1.5x leaves 2.1 MiB per image, less than the concatenation alone: "
            "chunks inside an image (rows of the convs) would be needed; `up`'s conv without the copy (through "
            "the pad's gates) measured 3.6 -> 7.3 ms, through a copy of the padded `bottom` 9.4 ms",
}


def corpus_dims(entry: dict[str, Any], quick: bool) -> dict[str, int]:
    """The dims a corpus entry runs at: its own, or in a quick run its small (or odd) test dims."""
    if not quick:
        return entry["dims"]
    return entry.get("small") or _small_of(entry["file"])


def _small_of(file: str) -> dict[str, int]:
    return next(e["small"] for e in models.CORPUS if e["file"] == file and "small" in e)


def beam_coverage(prog: tgc.Program, dims: dict[str, int], device: str = "CPU") -> tuple[int, int]:
    """(kernels with a winner stored by `tgc beam` and used, kernels) of the program at `dims`: the kernels that
    run (one chunk's where it runs in chunks); a winner the program check dropped (`search.drop`) does not count."""
    from tgc.backends import get_device
    from tgc.codegen.search import lookup_entry, search_ast
    dev = get_device(device)
    items = [it for it in prog.run_schedule(dims, dev.name) if it.ast.src]  # (a chunk's, where it runs chunked)
    found = 0
    for it in items:
        entry = lookup_entry(search_ast(it, dev), dev)
        found += entry is not None and not entry["dropped"]
    return found, len(items)


def same_program(prog: tgc.Program, dims: dict[str, int], device: str = "CPU") -> bool:
    """Whether the program runs the same kernels with the stored winners as without (same sources, in the same
    chunks): then `tuned=True` and `tuned=False` time one executable."""
    runs = []
    for tuned in (False, True):
        ch = prog.chunking(device, dims, tuned=tuned)
        exe = ch.low if ch is not None else prog.lower(device, dims=dims, tuned=tuned, defer=True)
        runs.append(((ch.dim, ch.count) if ch is not None else None, [k.src for k in exe.kernels]))
    return runs[0] == runs[1]


def paired_ratio(prog: tgc.Program, dims: dict[str, int], inputs: dict[str, Any], rounds: int = PAIRED_ROUNDS,
                 device: str = "CPU") -> float | None:
    """The program's time with the stored winners over its time with the default kernels, paired: both
    executables as `run` launches them (one chunk's, on the first chunk's inputs, where it runs in chunks) bound
    at once and timed alternating (`tgc.engine.bench.program_rounds`, 3 runs a round, the order reversed every
    other round), the median of the rounds' ratios (`search.paired_ratio`). None where the two run in other
    chunks (nothing to pair)."""
    from tgc.codegen.search import paired_ratio as median_ratio
    from tgc.engine import bench as tgc_bench
    from tgc.engine.executable import first_chunk_inputs
    dims, arrays = prog.bind(inputs, dims, cast=True)
    chs = [prog.chunking(device, dims, tuned=tuned) for tuned in (False, True)]
    if len({None if ch is None else (ch.dim, ch.count) for ch in chs}) > 1:
        return None
    lows = [prog.lower(device, dims=dims, tuned=tuned) if ch is None else ch.low
            for tuned, ch in zip((False, True), chs)]
    part = arrays if chs[0] is None else first_chunk_inputs(chs[0].low.inputs, arrays, chs[0].count, chs[0].sliced)
    timed = tgc_bench.program_rounds(lows, part, rounds, 3)
    return median_ratio(timed[0]["program"], timed[1]["program"])


def largest_intermediates(prog: tgc.Program, dims: dict[str, int], top: int = 3) -> str:
    """The largest slots of the memory plan that runs (one chunk's where the run is chunked) that hold no input
    or output, each with the kernel that writes the largest buffer it holds."""
    chunking = prog.chunking("CPU", dims)
    exe = chunking.low if chunking is not None else prog.lower("CPU", dims=dims)
    plan = exe.memory_plan()
    io = {key for key, _ in exe.inputs} | {key for _, key in exe.outputs}
    io_slots = {plan.slot_of[k] for k in io if k in plan.slot_of}
    writer: dict[int, str] = {}
    largest: dict[int, int] = {}
    for k in exe.kernels:
        slot = plan.slot_of.get(k.bufs[0]) if k.bufs else None
        if slot is not None and slot not in io_slots and plan.sizes[k.bufs[0]] > largest.get(slot, -1):
            largest[slot], writer[slot] = plan.sizes[k.bufs[0]], k.name
    slots = sorted((s for s in range(len(plan.slots)) if s not in io_slots), key=lambda s: -plan.slots[s])[:top]
    how = f" (chunked: {chunking.count} chunks along {chunking.dim})" if chunking is not None else ""
    return "largest intermediates" + how + ": " + ", ".join(
        f"{plan.slots[s] / 2 ** 20:.2f} MiB ({writer.get(s, '?')})" for s in slots)


def _top_kernel(result: dict[str, Any]) -> str:
    k = _top(result)
    total = sum(x["median_s"] for x in result["kernels"]) or 1.0
    return (f"kernel {k['name']} (line {k['line']}) takes {100 * k['median_s'] / total:.0f}% of the kernels' time "
            f"at {k['gflops']:.1f} GFLOP/s")


def _top(result: dict[str, Any]) -> dict[str, Any]:
    return max(result["kernels"], key=lambda k: k["median_s"])


def search_outcome(row: dict[str, Any] | None, budget_s: float | None) -> str:
    """What BEAM did with one kernel, from its row of `Program.beam`'s result (None: no search ran here)."""
    if row is None:
        return "no search in this run (its stored winner, if any, counts)"
    if row.get("skipped"):
        return (f"not searched: the budget ({budget_s:.0f} s) was spent before it (kernels are searched heaviest "
                f"first)" if budget_s else "not searched")
    if row.get("cached"):
        return f"its winner was stored by an earlier search (width {row.get('width')})"
    if row.get("same_as"):
        first = {k: v for k, v in row.items() if k != "same_as"}
        return f"searched as {row['same_as']} (the same kernel): " + search_outcome(first, budget_s)
    tried = row.get("tried", 0)
    if row.get("dropped"):
        return (f"its winner ({row.get('speedup', 1.0):.2f}x its default alone, after {tried} candidates) was dropped "
                f"by the program check: the program was slower with it (it runs its default)")
    if row.get("out_of_budget"):
        return (f"its search stopped at its share of the {budget_s:.0f} s budget after {tried} candidates "
                f"(best {row.get('speedup', 1.0):.2f}x its default); a longer --corpus-beam-budget searches further")
    if row.get("small"):
        return f"a small search (under {100 * SMALL_SHARE:.0f}% of the program's estimated cost)"
    if row.get("speedup", 1.0) <= 1.0:
        return (f"BEAM kept its default: none of {tried} candidates in its space was faster (what it lacks is "
                f"outside the opts it searches)")
    return f"BEAM's winner ran {row['speedup']:.2f}x faster than its default alone, after {tried} candidates"


def search_rows(prog: tgc.Program, dims: dict[str, int], result: dict[str, Any] | None) -> dict[str, dict]:
    """`Program.beam`'s rows by the name each kernel is timed under ({} where they cannot be matched: its rows are
    the schedule's kernels in order)."""
    if not result:
        return {}
    items = [it for it in prog.run_schedule(dims, "CPU") if it.ast.src]
    rows = result.get("kernels", [])
    names = kernel_names(items)
    if len(rows) != len(items) or any(r["name"] != n for r, n in zip(rows, names)):
        return {}
    searched: dict[str, dict] = {}  # a name's first row that was searched (a copy's row has tried = 0)
    for r in rows:
        if not r.get("same_as"):
            searched.setdefault(r["name"], r)
    rows = [{**searched[r["same_as"]], "same_as": r["same_as"]} if r.get("same_as") in searched else r for r in rows]
    return dict(zip(names, rows))


def copy_share(result: dict[str, Any]) -> float:
    """The share of the kernels' time in kernels that compute nothing (0 FLOPs: packed weight copies, joins,
    concatenations)."""
    total = sum(k["median_s"] for k in result["kernels"]) or 1.0
    return sum(k["median_s"] for k in result["kernels"] if not k.get("flops")) / total


def beam_limit(default: dict[str, Any], tuned: dict[str, Any], searched: dict[str, dict],
               budget_s: float | None) -> str:
    """What limits a BEAM miss: the largest kernel after BEAM, its time with its default kernel in the same run,
    what the search did with it, and the copies' share where it is large."""
    k = _top(tuned)
    before = next((d for d in default["kernels"] if d["name"] == k["name"]), None)
    out = _top_kernel(tuned)
    if before is not None:
        same = " (the default's opts)" if before.get("opts") == k.get("opts") else ""
        out += f"; {before['median_s'] * 1e6:.0f} us with default kernels, {k['median_s'] * 1e6:.0f} us tuned{same}"
    out += "; " + search_outcome(searched.get(k["name"]), budget_s)
    share = copy_share(tuned)
    if share >= COPY_SHARE_NOTE:
        out += f"; copies (kernels of no FLOPs: packed weights, joins) take {100 * share:.0f}% of the kernels' time"
    return out


def corpus_rows(quick: bool, beam_search: bool, peak_memory: Callable, xla_timer: Callable | None,
                timeit: Callable, only: str | None = None, log: Callable = print,
                beam_budget_s: float | None = BEAM_BUDGET_S) -> list[dict[str, Any]]:
    """One row per corpus entry (see the module docstring). `peak_memory(prog, inputs, dims)` gives (peak
    bytes, inputs + outputs bytes); `xla_timer(fn, inputs, names)` a timed callable or None; `timeit(fn)` a
    median in seconds; `beam_budget_s` each model's search with `beam_search` (None: unbounded)."""
    rows = []
    for e in models.CORPUS:
        if only and only not in e["name"]:
            continue
        prog = tgc.load(os.path.join(MODELS_DIR, e["file"]))
        dims = corpus_dims(e, quick)
        names = [d.name for d in prog.inputs]
        shapes = {k: v.shape for k, v in random_inputs(prog, dims, seed=0).items()}
        inputs = models.corpus_inputs(shapes, seed=0)
        log(f"... corpus {e['name']} {dims}")
        beam_s, searched = None, {}
        if beam_search:
            st = time.perf_counter()
            found = prog.beam(dims=dims, budget_s=beam_budget_s)
            beam_s = time.perf_counter() - st
            searched = search_rows(prog, dims, found)
        have, kernels = beam_coverage(prog, dims)
        xla = xla_timer(lambda xp, *a, fn=e["model"]: fn(xp, *a), inputs, names) if xla_timer else None
        same = same_program(prog, dims)
        load = [os.getloadavg()[0]]
        results: dict[bool, dict] = {}
        xla_s = None
        for i in range(ROUNDS):  # alternate: all three see the same load on a shared machine
            for tuned in ((False,) if same else (False, True) if i % 2 == 0 else (True, False)):
                r = prog.bench(inputs=inputs, dims=dims, repeat=5, tuned=tuned)
                if tuned not in results or r["program"]["median_s"] < results[tuned]["program"]["median_s"]:
                    results[tuned] = r
            if xla is not None:
                t = timeit(xla)
                xla_s = t if xla_s is None else min(xla_s, t)
        if same:  # (one executable: its time is both columns')
            results[True] = results[False]
        default_s = results[False]["program"]["median_s"]
        beam_rounds_s = beam_time = results[True]["program"]["median_s"]
        paired = None if same else paired_ratio(prog, dims, inputs)
        if paired is not None:
            beam_time = default_s * paired
        load.append(os.getloadavg()[0])
        mem, io = peak_memory(prog, inputs, dims)
        rec = results[False]["recompute"]["factor"]
        row = {"name": e["name"], "file": e["file"], "dims": dims, "xla_ms": None if xla_s is None else xla_s * 1e3,
               "default_ms": default_s * 1e3, "beam_ms": beam_time * 1e3, "beam_kernels": [have, kernels],
               "beam_same": same, "beam_paired_ratio": paired, "beam_rounds_ms": beam_rounds_s * 1e3,
               "beam_search_s": beam_s, "beam_budget_s": beam_budget_s if beam_search else None,
               "recompute": rec, "recompute_beam": results[True]["recompute"]["factor"],
               "peak_mem_ratio": mem / io, "load": load,
               "default_ratio": None if xla_s is None else xla_s / default_s,
               "beam_ratio": None if xla_s is None else xla_s / beam_time}
        checks = {"default": None if xla_s is None else row["default_ratio"] >= DEFAULT_TARGET,
                  "beam": None if xla_s is None else row["beam_ratio"] >= BEAM_TARGET,
                  "recompute": rec <= RECOMPUTE_TARGET, "memory": mem / io <= MEMORY_TARGET}
        row["met"] = checks
        limits = []
        if checks["default"] is False:
            limits.append(f"default: {_top_kernel(results[False])}")
        if checks["beam"] is False:
            budget = beam_budget_s if beam_search else None
            same_note = "; every winner is its kernel's default: the default kernels' time" if same else ""
            limits.append(f"beam ({have}/{kernels} kernels tuned): "
                          f"{beam_limit(results[False], results[True], searched, budget)}{same_note}")
        if checks["recompute"] is False:
            limits.append(f"recompute {rec:.3f}: executed {results[False]['recompute']['executed']} ops for "
                          f"{results[False]['recompute']['written']} written")
        if checks["memory"] is False:
            limits.append(f"memory: {(mem - io) / 2 ** 20:.1f} MiB of intermediates beside "
                          f"{io / 2 ** 20:.1f} MiB of inputs + outputs; {largest_intermediates(prog, dims)}")
        if e["name"] in KNOWN_LIMITS and not all(v is not False for v in checks.values()):
            limits.append(KNOWN_LIMITS[e["name"]])
        row["limit"] = "; ".join(limits)
        rows.append(row)
        prog.release()
    return rows


def _yes(v: bool | None) -> str:
    return "-" if v is None else "yes" if v else "no"


def print_corpus(rows: list[dict[str, Any]], quick: bool = False) -> None:
    print(f"\nModel corpus (bench/models/*.tg{', quick sizes' if quick else ''}): XLA, tgc default kernels, tgc "
          f"after `tgc beam`; targets default >= {DEFAULT_TARGET}x XLA, beam >= {BEAM_TARGET}x XLA, recompute <= "
          f"{RECOMPUTE_TARGET}, peak memory <= {MEMORY_TARGET}x inputs+outputs+weights")
    head = ("| model | dims | XLA | tgc default | tgc beam (tuned kernels) | default / XLA | beam / XLA | recompute |"
            " peak mem / io | targets met (default, beam, recompute, memory) |")
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.1f} us" if v < 0.1 else f"{v:.2f} ms"

    def x(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}x"
    for r in rows:
        m = r["met"]
        dims = " ".join(f"{k}={v}" for k, v in r["dims"].items())
        same = ", the default's kernels" if r.get("beam_same") else ""
        print(f"| {r['name']} | {dims} | {ms(r['xla_ms'])} | {ms(r['default_ms'])} | {ms(r['beam_ms'])} "
              f"({r['beam_kernels'][0]}/{r['beam_kernels'][1]}{same}) | {x(r['default_ratio'])} | "
              f"{x(r['beam_ratio'])} | "
              f"{r['recompute']:.3f} | {r['peak_mem_ratio']:.2f} | {_yes(m['default'])}, {_yes(m['beam'])}, "
              f"{_yes(m['recompute'])}, {_yes(m['memory'])} |")
    missed = [r for r in rows if r["limit"]]
    if missed:
        print("\nCorpus targets missed and what limits them:")
        for r in missed:
            print(f"- {r['name']}: {r['limit']}")
    searched = [r for r in rows if r["beam_search_s"] is not None]
    if searched:
        print(f"`tgc beam` search time (budget {searched[0]['beam_budget_s']} s per model): "
              + ", ".join(f"{r['name']} {r['beam_search_s']:.0f} s" for r in searched))
    loads = [v for r in rows for v in r.get("load", [])]
    if loads:
        print(f"Load average (1 min) during the timings: {min(loads):.1f}-{max(loads):.1f}; default, BEAM and XLA "
              f"alternate {ROUNDS} times per model, the best of each counts; the BEAM column is the default's time "
              f"x the paired ratio of {PAIRED_ROUNDS} alternating rounds of both programs (\"the default's "
              f"kernels\": every winner renders its kernel's default, one executable timed once)")


__all__ = ["corpus_dims", "corpus_rows", "same_program", "paired_ratio", "print_corpus", "beam_coverage",
           "largest_intermediates", "search_outcome", "search_rows", "kernel_names", "copy_share", "beam_limit"]
