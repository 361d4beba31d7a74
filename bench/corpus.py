"""The model-corpus table of `make bench` (issue 20, items 3 and 5): every program of bench/models/ (listed with
its dims in `models.CORPUS`) timed with tgc's default kernels, with tgc's kernels after `tgc beam` and with XLA
(`jax.jit` of its twin in bench/models.py), in one run, with its recompute factor and its peak memory against
inputs + outputs (+ weights: every weight of these programs is an input), each target met or not and what
limits a miss.

Targets, per model: default kernels >= 0.8x XLA, after BEAM >= 1.0x XLA, recompute factor <= 1.05, peak memory
<= 1.5x inputs + outputs. "tgc beam" times the kernels with the winners stored by `tgc beam` (the BEAM cache);
without `--corpus-beam` no search runs, and a kernel with no stored winner runs its default (the column says
how many kernels had one). What limits a miss is measured, not guessed: the kernel taking the largest share of
the program's time, with its GFLOP/s; `KNOWN_LIMITS` adds what reading a model's kernels found.

    corpus_rows(quick, beam_search, peak_memory, xla_timer) -> rows;  print_corpus(rows)
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
from tgc.engine.inputs import random_inputs  # noqa: E402

MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
DEFAULT_TARGET = 0.8  # default kernels: XLA's time / tgc's
BEAM_TARGET = 1.0  # after `tgc beam`
RECOMPUTE_TARGET = 1.05
MEMORY_TARGET = 1.5  # peak memory / (inputs + outputs + weights)
ROUNDS = 3  # default and BEAM timings alternate this many times, the best of each counts
# what reading a model's kernels found (the measured top kernel is printed beside it)
KNOWN_LIMITS = {
    "kv decode": "recompute: the fused attention reads k and v through `repeat` of the 4 key/value heads over the 16 "
                 "query heads, so `cat(cache, new)`'s select runs once per query head (4x) for every key; "
                 "realizing the concatenated caches (a 2 MiB copy per step) gives 1.00 but measured slower "
                 "(RECOMPUTE_LIMIT=1: the kernels 1.23-1.31 ms against 1.01-1.03 ms, best of 200 alternating "
                 "rounds), so the select stays fused",
    "unet": "memory: one image's conv over `cat(up, skip)` needs its input (2 MiB) and output (1 MiB) at once, "
            "beside 4.2 MiB of inputs + outputs: >= 1.71x even in chunks of one image (the batch, B=2, is the only "
            "axis chunked); the realized `cat` copy (not written in place by its producers) adds the rest",
    "mixer": "memory: the packed copies of the channel MLP's weights (4 MiB, one slot shared by both) do not shrink "
             "with chunks, and chunks of one image would be under MIN_CHUNK_BYTES; unpacked, the block ran 3.4x "
             "slower",
    "bert odd": "memory: too small to chunk (B=3: 0.5 MiB of sliced inputs + outputs per image); the packed "
                "weights (1.1 MiB slot) and the column split's main part beside its joined copy (0.9 MiB each) "
                "are live together around the feed-forward layer",
}


def corpus_dims(entry: dict[str, Any], quick: bool) -> dict[str, int]:
    """The dims a corpus entry runs at: its own, or in a quick run its small (or odd) test dims."""
    if not quick:
        return entry["dims"]
    return entry.get("small") or _small_of(entry["file"])


def _small_of(file: str) -> dict[str, int]:
    return next(e["small"] for e in models.CORPUS if e["file"] == file and "small" in e)


def beam_coverage(prog: tgc.Program, dims: dict[str, int], device: str = "CPU") -> tuple[int, int]:
    """(kernels with a winner stored by `tgc beam`, kernels) of the program at `dims`."""
    from tgc.backends import get_device
    from tgc.codegen.search import lookup_entry, search_ast
    dev = get_device(device)
    items = [it for it in prog.schedule(dims, dev.name) if it.ast.src]
    found = 0
    for it in items:
        found += lookup_entry(search_ast(it, dev), dev) is not None
    return found, len(items)


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
    ks = result["kernels"]
    total = sum(k["median_s"] for k in ks) or 1.0
    k = max(ks, key=lambda k: k["median_s"])
    return (f"kernel {k['name']} (line {k['line']}) takes {100 * k['median_s'] / total:.0f}% of the kernels' time "
            f"at {k['gflops']:.1f} GFLOP/s")


def corpus_rows(quick: bool, beam_search: bool, peak_memory: Callable, xla_timer: Callable | None,
                timeit: Callable, only: str | None = None, log: Callable = print) -> list[dict[str, Any]]:
    """One row per corpus entry (see the module docstring). `peak_memory(prog, inputs, dims)` gives (peak
    bytes, inputs + outputs bytes); `xla_timer(fn, inputs, names)` a timed callable or None; `timeit(fn)` a
    median in seconds."""
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
        beam_s = None
        if beam_search:
            st = time.perf_counter()
            prog.beam(dims=dims)
            beam_s = time.perf_counter() - st
        have, kernels = beam_coverage(prog, dims)
        results: dict[bool, dict] = {}
        for _ in range(ROUNDS):  # alternate: both see the same load on a shared machine
            for tuned in (False, True):
                r = prog.bench(inputs=inputs, dims=dims, repeat=5, tuned=tuned)
                if tuned not in results or r["program"]["median_s"] < results[tuned]["program"]["median_s"]:
                    results[tuned] = r
        default_s = results[False]["program"]["median_s"]
        beam_time = results[True]["program"]["median_s"]
        xla = xla_timer(lambda xp, *a, fn=e["model"]: fn(xp, *a), inputs, names) if xla_timer else None
        xla_s = timeit(xla) if xla is not None else None
        mem, io = peak_memory(prog, inputs, dims)
        rec = results[False]["recompute"]["factor"]
        row = {"name": e["name"], "file": e["file"], "dims": dims, "xla_ms": None if xla_s is None else xla_s * 1e3,
               "default_ms": default_s * 1e3, "beam_ms": beam_time * 1e3, "beam_kernels": [have, kernels],
               "beam_search_s": beam_s, "recompute": rec, "recompute_beam": results[True]["recompute"]["factor"],
               "peak_mem_ratio": mem / io,
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
            limits.append(f"beam ({have}/{kernels} kernels tuned): {_top_kernel(results[True])}")
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
        print(f"| {r['name']} | {dims} | {ms(r['xla_ms'])} | {ms(r['default_ms'])} | {ms(r['beam_ms'])} "
              f"({r['beam_kernels'][0]}/{r['beam_kernels'][1]}) | {x(r['default_ratio'])} | {x(r['beam_ratio'])} | "
              f"{r['recompute']:.3f} | {r['peak_mem_ratio']:.2f} | {_yes(m['default'])}, {_yes(m['beam'])}, "
              f"{_yes(m['recompute'])}, {_yes(m['memory'])} |")
    missed = [r for r in rows if r["limit"]]
    if missed:
        print("\nCorpus targets missed and what limits them:")
        for r in missed:
            print(f"- {r['name']}: {r['limit']}")
    searched = [r for r in rows if r["beam_search_s"] is not None]
    if searched:
        print("`tgc beam` search time: " + ", ".join(f"{r['name']} {r['beam_search_s']:.0f} s" for r in searched))


__all__ = ["corpus_dims", "corpus_rows", "print_corpus", "beam_coverage", "largest_intermediates"]
