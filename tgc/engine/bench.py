"""Timing a program: each kernel and the whole program on device-resident inputs, against the machine's peak.

Peak figures are measured once per machine and kept in the disk cache (table `peak`): on the CPU by the
device's own `measure_peak()` (an FMA-bound kernel for FLOP/s; for bandwidth a threaded copy, counted as
bytes read plus written, which `gbps` and every memory share are of, and a threaded read beside it).

This module is below codegen and the backends: it times an executable (`tgc.engine.executable.Executable`,
through `tgc.engine.executable.bench`) on the device object it holds, and never compiles or looks up a device
itself (`Program.bench` does).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tgc import cache, profile
from tgc.engine.realize import Executable, LaunchPlan, graphs_enabled
from tgc.ir.shapes import prod
from tgc.version import __version__


def _stats(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    q1 = times[len(times) // 4]
    q3 = times[(3 * len(times)) // 4]
    return {"median_s": statistics.median(times), "min_s": times[0], "max_s": times[-1], "iqr_s": q3 - q1}


def bench_launches(low: Executable, arrays: dict[str, np.ndarray], repeat: int = 10, warmup: int = 1,
                   measure_peak: bool = True) -> dict[str, Any]:
    """Time an executable's launches (not chunked; `tgc.engine.executable.bench` is the one entry) on its
    device-resident inputs: `repeat` timed runs after `warmup` untimed ones;
    per-kernel and whole-program statistics, rates and the device's peak (`Program.bench` adds the rest).
    Each kernel is timed on its own (a launch that waits); the whole program runs as `Program.run` runs it:
    one device graph where the device has them (`program["graph"]` says), else every kernel launched and
    waited for once. Kernels that read only bound inputs (weights: `tgc.engine.bound`) run once before, untimed,
    as a launch plan runs them; the rows and the program's time are the kernels every run launches."""
    dev, kernels = low.device, low.kernels
    plan = LaunchPlan(low)
    try:
        plan.copy_in(arrays)
        kernels = plan.kernels  # (not the kernels on bound inputs only: they ran once, in copy_in)
        launches = [(k, k.program(), h) for k, h in zip(kernels, plan.handles)]

        def run_all(wait: bool) -> list[float]:
            ts = []
            prof = profile.active
            for k, p, handles in launches:
                if prof is not None:  # (every launch waits and is recorded: tgc/profile.py)
                    ts.append(prof.launch(k, lambda k=k, p=p, h=handles: p(
                        *h, global_size=k.global_size, local_size=k.local_size, vals=k.vals, wait=True)))
                    continue
                t = p(*handles, global_size=k.global_size, local_size=k.local_size, vals=k.vals, wait=wait)
                ts.append(t or 0.0)
            return ts

        # the whole program runs as the plan runs it in Program.run: one device graph where the device has them
        graph = plan.capture() if graphs_enabled() else None

        def run_program() -> None:
            prof = profile.active
            if graph is not None and prof is not None:
                prof.graph(dev.name, kernels, lambda: graph(wait=True))
            elif graph is not None:
                graph(wait=False)
            else:
                run_all(False)
            dev.synchronize()

        # the kernels one by one first, then the whole program in a loop of its own: interleaved, the program's
        # first run after the one-by-one launches paid for waking the device's threads from them (a 10-kernel
        # program of 0.5 ms timed at 3-7 ms)
        per_kernel: list[list[float]] = [[] for _ in kernels]
        whole: list[float] = []
        with profile.host_span(f"bench: each kernel on {dev.name}", {"warmup": warmup, "repeat": repeat}):
            with _labelled(warmup=True):
                for _ in range(warmup):
                    run_all(True)
            for _ in range(max(repeat, 1)):
                for i, t in enumerate(run_all(True)):
                    per_kernel[i].append(t)
        with profile.host_span(f"bench: whole program on {dev.name}", {"warmup": warmup, "repeat": repeat,
                                                                       "graph": graph is not None}):
            with _labelled(warmup=True):
                for _ in range(warmup):
                    run_program()
            for _ in range(max(repeat, 1)):
                st = time.perf_counter()
                run_program()
                whole.append(time.perf_counter() - st)
        buffers = dict(plan.buffers)
    finally:
        plan.free()

    peak = machine_peak(dev, measure_peak)
    # between two runs of a kernel every other kernel runs: whether its data is still in the cache depends on
    # all the program's buffers, whole (a strided read still brings in whole cache lines)
    working_set = sum(prod(b.shape) * b.dtype.itemsize for b in buffers.values())
    rows = []
    counts = [work_counts(k) for k in kernels]
    total_flops = None if any(f is None for f, _ in counts) else sum(f for f, _ in counts)
    total_bytes = None if any(b is None for _, b in counts) else sum(b for _, b in counts)
    for k, ts, (flops, nbytes) in zip(kernels, per_kernel, counts):
        st = _stats(ts)
        row = {"name": k.name, "line": k.line, "global_size": list(k.global_size),
               "local_size": list(k.local_size) if k.local_size else None, "opts": [str(o) for o in k.opts],
               "flops": flops, "graph_flops": k.graph_flops, "bytes": nbytes, **st}
        row.update(rates(flops, nbytes, st["median_s"], peak, working_set))
        rows.append(row)
    prog_stats = _stats(whole)
    program = {**prog_stats, "flops": total_flops, "bytes": total_bytes, "graph": graph is not None,
               **rates(total_flops, total_bytes, prog_stats["median_s"], peak, working_set)}
    return {"kernels": rows, "program": program, "peak": peak, "working_set_bytes": working_set}


def kernel_times(low: Executable, arrays: dict[str, np.ndarray], runs: int = 2) -> dict[str, float]:
    """Each kernel's seconds in a run of `low` (the least of `runs` runs after one untimed, every launch waited
    for), by kernel name: only the kernels every run launches (those on bound inputs alone run once, in the
    plan's `copy_in`, and are not in the result). BEAM's budget weighs the kernels by these times
    (`Program.beam`): a few runs of the program, not a timing of each kernel on its own buffers."""
    plan = LaunchPlan(low)
    try:
        plan.copy_in(arrays)
        launches = [(k, k.program(), h) for k, h in zip(plan.kernels, plan.handles)]
        best: dict[str, float] = {}
        for r in range(max(runs, 1) + 1):
            for k, p, handles in launches:
                st = time.perf_counter()
                t = p(*handles, global_size=k.global_size, local_size=k.local_size, vals=k.vals, wait=True)
                t = t if t else time.perf_counter() - st
                if r:  # (the first run warms the caches and the threads)
                    best[k.name] = min(best.get(k.name, t), t)
        return best
    finally:
        plan.free()


def _labelled(**labels: Any) -> Any:
    """`Profile.labelled` while a profile records, else nothing."""
    prof = profile.active
    return prof.labelled(**labels) if prof is not None else contextlib.nullcontext()


def timed_runs(fn: Callable[[], Any], repeat: int, warmup: int) -> list[float]:
    """Wall-clock seconds of `repeat` calls of `fn` after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(repeat, 1)):
        st = time.perf_counter()
        fn()
        times.append(time.perf_counter() - st)
    return times


def chunked_timing(timing: dict[str, Any], whole: list[float], count: int) -> dict[str, Any]:
    """A chunked run's timing (`tgc.engine.executable.bench`): `timing` of one chunk's launches, with the whole
    program's times `whole` (every chunk, from the user's arrays to the whole outputs, each chunk's kernels as
    one device graph where the device has them, `realize.launch_all`; `program["graph"]` stays False: no launch
    plan's graph is replayed). `program["chunks"]` says how many; its FLOP and byte counts are the chunk's times
    the count."""
    prog_stats = _stats(whole)
    flops, nbytes = (None if v is None else v * count for v in (timing["program"]["flops"], timing["program"]["bytes"]))
    timing["program"] = {**prog_stats, "flops": flops, "bytes": nbytes, "graph": False, "chunks": count,
                         **rates(flops, nbytes, prog_stats["median_s"], timing["peak"], timing["working_set_bytes"])}
    return timing


def identity(prog: Any, dev: Any, dims: dict[str, int]) -> dict[str, Any]:
    """What a timing depends on beyond the kernels' code: which program (its source's hash), its dims, the
    device (its kind and model) and the tgc version. `tgc bench --baseline` compares only equal identities.
    `prog`: a `tgc.api.Program` or a program-cache entry (each has `source`, `path` and `filename`)."""

    return {"program_sha256": hashlib.sha256((prog.source or "").encode()).hexdigest(),
            "file": prog.path or prog.filename,
            "dims": dict(sorted((dims or {}).items())), "device": dev.name, "device_model": device_model(dev),
            "tgc_version": __version__}


def device_model(dev) -> str:
    """The device's model: the CPU's name from /proc/cpuinfo and its thread count, a GPU's name, else the kind."""
    if dev.kind == "CPU":
        name = ""
        try:
            with open("/proc/cpuinfo") as f:
                name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
        except OSError:
            pass
        if not name:
            name = platform.processor() or platform.machine()
        return f"{name} ({dev.cores} threads)"
    try:
        info = dev.info()
    except Exception:  # a device that cannot describe itself still has a kind
        info = {}
    model = info.get("name") or info.get("device") or ""
    if info.get("serves"):
        model = f"{info['serves']} on {info.get('server', '?')}" + (f": {model}" if model else "")
    return str(model or dev.kind)


CACHE_FACTOR = 4  # working sets up to this many times the last-level cache count as (partly) cache-resident


def work_counts(k: Any) -> tuple[int | None, int | None]:
    """A launched kernel's (flops, bytes moved), None for counts that are not known. A symbolic package (or a
    program-cache entry of a size class) saves a launch's counts only where each is one product of dims and 0
    otherwise (a matmul at odd sizes, a GPU grid rounded up, a split kernel's main part): as a kernel that runs
    always moves some bytes, 0 bytes means neither count is known, rather than a rate of 0."""
    if k.bytes_moved <= 0:
        return None, None
    return k.flops, k.bytes_moved


def rates(flops: int | None, nbytes: int | None, seconds: float, peak: dict, working_set: int) -> dict[str, Any]:
    """GFLOP/s, GB/s and the share of the peak they reach (None where the peak or the count is unknown).

    A program whose buffers (`working_set` bytes) fit the device's last-level cache (`peak["cache_bytes"]`)
    keeps its data in that cache between the timed runs; up to CACHE_FACTOR times that size, caches that do
    not evict in strict LRU order (AMD's L3) still serve part of it. Either way its GB/s is not a share of
    the memory peak: `in_cache` is set and `mem_share` is None. `peak_share` is the larger of the two
    shares, `bound` says which ("compute", "memory") or None.
    """
    gflops = None if flops is None else flops / seconds / 1e9 if seconds > 0 else 0.0
    gbps = None if nbytes is None else nbytes / seconds / 1e9 if seconds > 0 else 0.0
    cache = peak.get("cache_bytes")
    in_cache = bool(cache) and 0 < working_set <= CACHE_FACTOR * cache
    flop_share = gflops / peak["gflops"] if peak.get("gflops") and flops else None
    mem_share = gbps / peak["gbps"] if peak.get("gbps") and nbytes and not in_cache else None
    shares = [(v, what) for v, what in ((flop_share, "compute"), (mem_share, "memory")) if v is not None]
    best = max(shares, key=lambda t: t[0]) if shares else (None, None)
    return {"gflops": gflops, "gbps": gbps, "flop_share": flop_share, "mem_share": mem_share,
            "peak_share": best[0], "bound": best[1], "in_cache": in_cache}


def valid_peak(value: Any) -> bool:
    """A stored peak is usable: {"gflops": >0, "gbps": >0, ...} with finite numbers (else it is measured again)."""

    return isinstance(value, dict) and all(
        isinstance(value.get(k), (int, float)) and not isinstance(value.get(k), bool) and math.isfinite(value[k])
        and value[k] > 0 for k in ("gflops", "gbps"))


def machine_peak(dev, measure: bool = True) -> dict[str, Any]:
    """Peak FLOP/s and bandwidth of a device, measured once per machine and cached on disk (CPU), from the
    device's own figures (GPUs), else None each (`source` "unknown": PYTHON, REMOTE). `cache_bytes` is
    the last-level cache where known (see `rates`). A damaged cache entry is measured again. Without
    `measure` (a package's bench, which compiles nothing) an uncached CPU peak is None each ("not measured")."""
    info = dev.info()
    if dev.kind != "CPU":
        gflops, gbps = info.get("peak_gflops") or None, info.get("peak_gbps") or None
        return {"gflops": gflops, "gbps": gbps, "source": "device" if gflops or gbps else "unknown",
                "cache_bytes": info.get("cache_bytes") or None}
    key = peak_key(dev)
    peak = cache.get_json("peak", key, valid_peak)
    if peak is None and not measure:
        return {"gflops": None, "gbps": None, "source": "not measured (a package compiles nothing)",
                "cache_bytes": dev.cache_bytes()}
    if peak is None:
        peak = dev.measure_peak()
        cache.put("peak", key, json.dumps(peak).encode(), meta=f"{dev.kind} peak")
    return {**peak, "cache_bytes": dev.cache_bytes()}


def stored_peak(dev) -> dict[str, Any] | None:
    """The CPU peak an earlier `tgc bench` measured and stored on this machine (`machine_peak`), with `measured`
    (when: Unix time), or None: none stored (nothing is measured here, and no cache is created)."""
    if dev.kind != "CPU" or dev.compiler is None or cache.absent():
        return None
    key = peak_key(dev)
    peak = cache.get_json("peak", key, valid_peak)
    if peak is None:
        return None
    when = next((r["created"] for r in cache.entries("peak") if key.startswith(r["key"])), None)
    return {"gflops": peak["gflops"], "gbps": peak["gbps"], "measured": when}


def peak_key(dev) -> str:
    """The cache key of a CPU device's measured peak (4: `gbps` is the copy's, bytes read plus written, of a
    buffer 8 times the last-level cache)."""
    return cache.make_key("peak", 4, dev.kind, dev.compiler.cache_key, dev.cores, __version__)




def program_rounds(lows: list[Executable], arrays: dict[str, np.ndarray], rounds: int = 5, runs: int = 3,
                   deadline: float | None = None, min_rounds: int = 1) -> list[dict[str, list]]:
    """Several executables of one program (the same inputs and outputs: BEAM's winners and the default kernels,
    `Program.beam`) timed against each other, alternating: each round runs every one (in turn, the order
    reversed every other round, so that none always follows the same one) as `run` runs it (the device graph,
    `runs` times after one untimed run, the least counting) and then each kernel launched and waited for in
    order (`kernel_times`: its time inside the program, the other kernels' data in the caches as in a run).
    Returns per executable {"program": [seconds per round], "kernels": [{kernel name: seconds} per round]}.
    With a `deadline` (a `time.perf_counter()` value), a round past the first `min_rounds` starts only where the
    last one's time fits before it."""
    plans = []
    out: list[dict[str, list]] = [{"program": [], "kernels": []} for _ in lows]
    try:
        for low in lows:
            plan = LaunchPlan(low)
            plans.append(plan)
            plan.copy_in(arrays)
        launches = [[(k, k.program(), h) for k, h in zip(p.kernels, p.handles)] for p in plans]
        graphs = [p.capture() if graphs_enabled() else None for p in plans]

        def whole(j: int) -> None:
            if graphs[j] is not None:
                graphs[j](wait=False)
            else:
                for k, p, h in launches[j]:
                    p(*h, global_size=k.global_size, local_size=k.local_size, vals=k.vals, wait=False)
            plans[j].device.synchronize()

        last = 0.0
        for r in range(max(rounds, 1)):
            if r >= max(min_rounds, 1) and deadline is not None and time.perf_counter() + last > deadline:
                break
            began = time.perf_counter()
            order = list(range(len(plans)))
            for j in (order if r % 2 == 0 else order[::-1]):
                times = []
                for n in range(max(runs, 1) + 1):
                    st = time.perf_counter()
                    whole(j)
                    if n:  # (the first run wakes the threads after the other executable's)
                        times.append(time.perf_counter() - st)
                out[j]["program"].append(min(times))
                per: dict[str, float] = {}
                for n in range(2):
                    for k, p, h in launches[j]:
                        st = time.perf_counter()
                        t = p(*h, global_size=k.global_size, local_size=k.local_size, vals=k.vals, wait=True)
                        t = t if t else time.perf_counter() - st
                        if n:
                            per[k.name] = t
                out[j]["kernels"].append(per)
            last = time.perf_counter() - began
        return out
    finally:
        for p in plans:
            p.free()
