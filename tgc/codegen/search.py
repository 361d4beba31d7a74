"""BEAM search over kernel optimizations, and the on-disk store of its winners.

Each round extends every kernel in the beam by every applicable opt, compiles the new candidates (in
worker processes on the CPU, with a per-candidate timeout), times each on real buffers (stopping early
when a candidate is clearly slower than the best), and keeps the fastest `width`. A candidate whose
output differs from the unoptimized kernel's is rejected: a fast wrong kernel never wins. The search
ends when a round brings no improvement. The default (hand-coded) kernel is always a candidate, and the
winner is timed again against it, alternating, before it is kept (`_confirm`): BEAM never stores a kernel
slower than what a run without it gets. The winner's opts are stored in the disk cache (table `beam`)
under the kernel's AST, device, compiler and tgc version, so later compiles reuse them.

A fused attention kernel (an AST of REDUCE(ONLINE_SOFTMAX) over keys: `attention.is_fused_attention`) is searched
by this same driver: its search state is a `tgc.codegen.attention.AttentionKernel` (ordinary opts on its row and
key axes) in place of an `OptKernel`, lowered by `lower_attention`, and stored under its AST (`search_ast`).

Where a candidate evaluator is in use (`use_evaluator`: a Ray cluster, `tgc.backends.cluster`), the one search
above hands each batch of rendered candidates to it instead of compiling and timing them here: it compiles,
checks and times them elsewhere and sets each candidate's `time_s` and `binary`. The reference output is still
computed here, and the winner is still timed again here against the default (`_confirm`) and stored as above.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import numpy as np

from tgc import cache
from tgc.codegen.attention import AttentionKernel, is_fused_attention, lower_attention
from tgc.codegen.heuristic import hand_coded
from tgc.codegen.opt import Opt, OptError, OptKernel, OptOps, launch_limits, remember
from tgc.codegen.pipeline import lower
from tgc.codegen.pipeline import prepare as prepare_ast
from tgc.dtype import bf16_to_f32
from tgc.engine.compare import matches
from tgc.engine.flops import executed_flops
from tgc.engine.inputs import random_values
from tgc.env import env_int
from tgc.errors import CompileError
from tgc.ir.kernel import ScheduleItem, kernel_names
from tgc.ir.shapes import prod, shape_of
from tgc.ir.uop import RangeKind, UOp, pretty
from tgc.version import __version__

COMPILE_TIMEOUT_S = 20.0
MIN_ROUND_GAIN = 0.03  # a round must beat the previous beam's best by this share for the search to go on
REFERENCE_MAX_WORK = 1 << 28  # loop iterations above which the unoptimized kernel is too slow to run
UPCAST_AMOUNTS = (2, 3, 4, 8, 16)
UNROLL_AMOUNTS = (2, 4, 8, 16)
LOCAL_AMOUNTS = (2, 4, 8, 16, 32)
PAD_AMOUNTS = (8, 16, 32)
STAGE_AMOUNTS = (8, 16, 32)  # reduction steps of a tile staged in shared memory (GPUs)
# threads of a work-group that share one reduction (GPUs, GROUP and GROUPTOP): powers of two, which
# `opt.lower_groups` combines by warp shuffles (CUDA) or a shared-memory tree (the serial loop it falls back to
# for other sizes is never faster); amounts past the device's threads per work-group are not offered
GROUP_AMOUNTS = (16, 32, 64, 128, 256)
# the time budget: a kernel whose default takes under this share of the program's default time (the sum over the
# kernels searched) cannot matter to the program: it gets a small search (SMALL_WIDTH, SMALL_ROUNDS rounds after
# the default and its prefixes) instead of the full one
SMALL_SHARE = 0.02
SMALL_WIDTH = 1
SMALL_ROUNDS = 1
MAX_ROUNDS = 32
# no new round starts once one kernel's search has run this long (the first round always runs, and the round in
# progress ends): on a loaded machine a single-kernel search that keeps finding >3% gains (layernorm 4096^2:
# ~110 candidates over 5 rounds) would otherwise take minutes
ROUND_START_LIMIT_S = 30.0
# the whole-program budget (`tgc beam --budget`, `Program.beam(budget_s=)`): seconds from `started` (the CLI: its
# process start) to the end of `beam_items`. Before anything is compiled or timed, each kernel's share is decided
# from a cheap estimate (`estimate_cost`: its FLOPs, or its bytes times MACHINE_BALANCE where that is more); each
# kernel renders, compiles and times its default inside its share, compiles wait no longer than the deadline (the
# queued ones are cancelled), a kernel whose share is spent stops at once with its best so far, and the confirm
# step (`_confirm`) runs as many rounds as fit (none: the default is kept). Kernels reached after the budget is
# spent are not searched and not stored. `Program.beam` keeps FINISH_SHARE of the budget for its own finish.
DEFAULT_BUDGET_S = 20.0
# `Program.beam`'s own finish after the search (storing the winners of the dims' size class builds the program's
# symbolic kernels: seconds for a transformer block) gets this share of the budget; it is skipped where the search
# did not end in time
FINISH_SHARE = 0.25
MACHINE_BALANCE = 8.0  # FLOPs a CPU core does in the time it moves one byte from memory (the estimate's roofline)
# fewer threads than the automatic count (`thread_amounts`) are tried only for a kernel whose default takes under
# this: a longer one amortizes starting its threads, so where one thread timed faster, the machine's other
# cores were busy while it was timed (a shared machine), and the stored winner would run at half speed on an idle
# one (llama odd's 400-650 us matmuls won with one thread at load 6; BEAM 0.78x XLA vs the default's 0.94x on a
# quiet machine)
FEWER_THREADS_MAX_S = 100e-6
# under a budget, only the heaviest kernels are searched (`budget_kernels`): the fewest that hold COVER of the
# program's weight; and before each kernel's search, the lightest still queued are dropped until its share is at
# least SETUP_MULTIPLE times the median setup of the kernels before it (rendering, compiling and timing the
# reference and the default's prefixes), so that a share can try candidates. Spread over every kernel, a 90 s
# search of SqueezeNet's 38 kernels (load ~6) gave each a share that its setup (2-5 s) spent: 17 of the 19
# kernels it reached tried no candidate
COVER = 0.9
SETUP_MULTIPLE = 3.0


# ------------------------------------------------------------------------------------------- another evaluator

# Where set, BEAM's batches of candidates are compiled, checked and timed by this object instead of here, and a
# program's kernels are compiled through its `compile_pool()` (`tgc.backends.cluster.ClusterSession`). It offers
# `kernel(device, timer) -> batch` (the reference output and inputs of one kernel, sent once), where
# `batch.evaluate(cands, best_s, on_result)` sets each candidate's `time_s` and `binary` and calls
# `on_result(cand, status)` (status "ok", "failed" or "rejected") as each finishes, `best_s()` giving the best
# time so far (a candidate faster than it is checked against the reference output), and `batch.close()`.
_EVALUATOR: ContextVar[Any] = ContextVar("tgc_beam_evaluator", default=None)


@contextmanager
def use_evaluator(evaluator: Any) -> Iterator[None]:
    """Within this block, BEAM evaluates candidates through `evaluator` and compiles go to its pool."""
    token = _EVALUATOR.set(evaluator)
    try:
        yield
    finally:
        _EVALUATOR.reset(token)


def current_evaluator() -> Any:
    """The evaluator `use_evaluator` set, or None (candidates are compiled and timed in this process)."""
    return _EVALUATOR.get()


# ------------------------------------------------------------------------------------------- the winners' store


# the rules a stored winner was searched under, in its key: winners of older rules are a clean miss (searched again).
# 2: a candidate on fewer CPU threads than the default is not timed for a long kernel (`fewer_threads`), and the
# winners are checked against the program's memory plan after the search (`Program.beam`: in-place writes)
WINNER_RULES = 2


def beam_key(ast: UOp, device: Any) -> str:
    """A kernel's key in the `beam` table (`search_ast` says which AST)."""
    comp = device.compiler
    return cache.make_key("beam", device.kind, comp.cache_key if comp else "none", __version__, WINNER_RULES,
                          pretty(ast))


def search_ast(item: ScheduleItem, device: Any) -> UOp:
    """The AST a schedule item's kernel is searched and stored under: a fused attention kernel's plain AST (the
    chain it computes, which no unfused kernel has: there the softmax's output is a buffer), else the prepared
    AST (`pipeline.prepare`)."""
    return item.ast if is_fused_attention(item.ast) else prepare_ast(item.ast, device)


def lookup_entry(ast: UOp, device: Any) -> dict[str, Any] | None:
    """The stored winner of a kernel: {"opts": [Opt, ...], "width": the beam width searched (0 when an
    older entry did not record it), "time_s": ..., "dropped": why the program check dropped it, or None,
    "partial": whether the search was cut short (`store_result`)}, or None. A `"dropped"` that is present but not a
    non-empty string (True, 5, a list: not written by `store`) counts as dropped: the kernel runs its default; a
    `"partial"` that is present and not false counts as partial: the kernel is searched again."""
    raw = cache.get("beam", beam_key(ast, device))
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        width = doc.get("width", 0)
        dropped = doc.get("dropped")
        if "dropped" in doc and not (isinstance(dropped, str) and dropped):
            # (written by something else than `store`: a flag that says nothing is taken as dropped, the
            # conservative reading: the kernel runs its default rather than a winner the check may have refused)
            dropped = f"dropped (the stored flag {json.dumps(dropped)[:40]} gives no reason)"
        return {"opts": [Opt.from_json(o) for o in doc["opts"]], "width": width if isinstance(width, int) else 0,
                "time_s": doc.get("time_s"), "dropped": dropped if isinstance(dropped, str) else None,
                "partial": "partial" in doc and doc["partial"] is not False}
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def finished(entry: dict[str, Any], width: int) -> bool:
    """Whether a stored entry (`lookup_entry`) stands for a finished search at least `width` wide (any entry for
    `width` 0): one cut short (`"partial"`: its share of the budget spent, or Ctrl-C) is searched again."""
    return width <= 0 or (entry["width"] >= width and not entry["partial"])


def lookup(ast: UOp, device: Any, width: int = 0) -> list[Opt] | None:
    """A stored winner's opts; with `width`, only one found by a finished search at least that wide (a narrower
    search may have missed what a wider one finds, a search cut short what the rest of it finds: `finished`).
    None for a winner the program check dropped (`drop`): the kernel runs the heuristic's opts, as without a
    search."""
    entry = lookup_entry(ast, device)
    if entry is None or not finished(entry, width) or entry["dropped"]:
        return None
    return entry["opts"]


def dropped(ast: UOp, device: Any, width: int = 0) -> bool:
    """Whether the program check dropped the kernel's stored winner (`drop`) after a finished search at least
    `width` wide: the kernel runs its default and an inline search (`BEAM=W`, `build_kernel`) does not search it
    again."""
    entry = lookup_entry(ast, device)
    return entry is not None and bool(entry["dropped"]) and finished(entry, width)


def store(ast: UOp, device: Any, opts: list[Opt], seconds: float, name: str, width: int = 0,
          dropped: str | None = None, partial: bool = False) -> None:
    """Store a kernel's winner; with `dropped` (why), a winner the program check dropped (`drop`); `partial`: the
    winner of a search cut short (`store_result`), used but searched again by the next search of its width."""
    doc: dict[str, Any] = {"opts": [o.to_json() for o in opts], "time_s": seconds, "width": width}
    if dropped:
        doc["dropped"] = dropped
    if partial:
        doc["partial"] = True
    cache.put("beam", beam_key(ast, device), json.dumps(doc).encode(),
              meta=f"{device.kind} {name} width {width}: {' '.join(map(str, opts))}" + (" (dropped)" if dropped
                                                                                         else "")
              + (" (partial)" if partial else ""))


def store_result(ast: UOp, device: Any, res: SearchResult, name: str, width: int) -> str:
    """Store a search's winner under `width`; what was done: "finished" (stored), "partial", "kept" or "nothing".
    A search cut short (its share of the budget spent: `res.out_of_budget`; Ctrl-C: `res.interrupted`) is not a
    finished search of that width: its winner (the default unless it beat it on the confirm's timing) is stored
    as "partial" (`lookup` with no width uses it; the next `tgc beam` or `BEAM=W` searches the kernel again, from
    it); "nothing" is stored where it tried no candidate or its best could not be confirmed (`res.unconfirmed`),
    and a finished search's winner stored before (a narrower width's) is "kept"."""
    partial = res.out_of_budget or res.interrupted
    if partial and (res.tried == 0 or res.unconfirmed):  # (it showed nothing: an earlier partial winner stays,
        return "nothing"  # and the next search resumes from it)
    prior = lookup_entry(ast, device) if partial else None
    if prior is not None and not prior["partial"] and not prior["dropped"]:
        # a finished search's winner (a narrower width's, or the one `--force` searches again) stays: this one,
        # cut short, was confirmed against the default only (a review saw a 1.42x width-1 winner replaced by the
        # default); the next search resumes from it (`beam_items`), and one that finishes replaces it
        return "kept"
    store(ast, device, res.opts, res.after_s, name, width, partial=partial)
    return "partial" if partial else "finished"


def drop(ast: UOp, device: Any, why: str, name: str = "") -> bool:
    """Mark a kernel's stored winner as dropped by the program check (`Program.beam`): kept in the store (its
    width says it was searched, so a later `tgc beam` does not search it again without --force, unless the search
    was cut short: `"partial"` is kept) but not used: `lookup` gives None and the kernel runs its default. False
    where nothing is stored."""
    entry = lookup_entry(ast, device)
    if entry is None:
        return False
    store(ast, device, entry["opts"], entry.get("time_s") or 0.0, name, entry["width"], dropped=why,
          partial=entry["partial"])
    return True


def undrop(ast: UOp, device: Any, name: str = "") -> None:
    """Undo `drop` (a program check interrupted between its two timings: no half decision is left stored)."""
    entry = lookup_entry(ast, device)
    if entry is not None:
        store(ast, device, entry["opts"], entry.get("time_s") or 0.0, name, entry["width"], partial=entry["partial"])


# ------------------------------------------------------------------------------------------- the program check

# After a search, `Program.beam` times the whole program with the winners against its default kernels
# (`tgc.engine.bench.program_rounds`: alternating, PROGRAM_ROUNDS rounds of PROGRAM_RUNS runs, the least of a
# round's runs counting, the median of the rounds' ratios deciding: `paired_ratio`): a kernel timed alone in a hot
# loop (its inputs in the caches, the machine's other core idle or busy by chance) can win there and lose inside
# the program. Where the
# program is slower with the winners, the winners of the kernels whose own time inside the program (each launch
# waited for, after the kernels before it) is not less are dropped (`drop`), the program is timed again, and where
# it is still slower every winner of this search is dropped.
# Under a budget the check gets CHECK_SHARE of it (out of the search's: compiling the program twice takes most of
# it, 2.5 s for llama odd's 20 kernels on the 2-core machine) and ends its rounds by its deadline, but never with
# fewer than PROGRAM_MIN_ROUNDS (one round decides by chance on a shared machine; a round of a 40 ms program takes
# about half a second, which the finish's share absorbs).
# The program counts as slower with the winners only where the paired ratio is over 1 + NOISE_MARGIN: on the
# shared 2-core machine the same unchanged cache checked 4 times read 1.004, 0.866, 0.925 and 1.022, and winners
# that differ from the defaults by nothing read 0.98-1.05x (docs/DESIGN.md, "BEAM's program check"); a drop is
# permanent, so noise must not decide it.
PROGRAM_ROUNDS = 5
PROGRAM_MIN_ROUNDS = 3
PROGRAM_RUNS = 3
CHECK_SHARE = 0.1
NOISE_MARGIN = 0.05
# what one round of the check runs, in runs of the program: per executable one untimed run, PROGRAM_RUNS timed
# ones and the kernels launched one by one (about one run)
CHECK_ROUND_RUNS = 2 * (PROGRAM_RUNS + 2)


def paired_ratio(default_s: list[float], tuned_s: list[float]) -> float | None:
    """The median over rounds of a round's tuned time over its default time (`program_rounds` times the two one
    after the other in each round): on a shared machine the load moves between rounds (the same program took 4, 7
    or 15 ms in consecutive rounds, with the other core idle, busy, or both busy), so each round's pair is compared
    within itself, and the median of the rounds decides. None where no round has both."""
    pairs = [t / d for d, t in zip(default_s, tuned_s) if d > 0]
    return median(pairs) if pairs else None


def slower_in_program(default_s: list[float], tuned_s: list[float]) -> bool:
    """Whether the program with the winners is slower than with its default kernels beyond the noise
    (`paired_ratio` over 1 + NOISE_MARGIN); not slower where no round timed both."""
    ratio = paired_ratio(default_s, tuned_s)
    return ratio is not None and ratio > 1.0 + NOISE_MARGIN


def program_seconds(rows: list[dict[str, Any]]) -> float:
    """An estimate of one run of the program from `beam_items`'s rows: each kernel's default timed alone
    (`before_s`), the median of those for a kernel not timed (cached, not searched), nothing for one that runs
    once per program."""
    timed = [r["before_s"] for r in rows if isinstance(r.get("before_s"), float) and math.isfinite(r["before_s"])]
    untimed = sum(1 for r in rows if r.get("before_s") is None and not r.get("once"))
    return sum(timed) + (median(timed) * untimed if timed else 0.0)


def check_cost(setup_s: list[float], kernels: int, program_s: float) -> float:
    """An estimate of the program check's seconds, before it starts: compiling the program twice (`kernels`
    distinct kernels, each at the median of what the search took to compile and time a kernel's default:
    `setup_s`, an over-estimate where the compile cache has them) and PROGRAM_MIN_ROUNDS rounds of a program
    whose run takes `program_s` (CHECK_ROUND_RUNS runs a round)."""
    per_kernel = median(setup_s) if setup_s else 0.0
    return 2 * per_kernel * kernels + PROGRAM_MIN_ROUNDS * CHECK_ROUND_RUNS * program_s


def kernels_slower_in_program(default_k: list[dict[str, float]], tuned_k: list[dict[str, float]],
                              keys: dict[str, str]) -> set[str]:
    """The store keys (`keys`: a kernel's name in the program -> its key, for the kernels whose winner differs from
    their default) whose time inside the program, summed over the kernels of the key, is not less with the winner
    than with the default (`paired_ratio` of the rounds' per-kernel times, `program_rounds`, at least 1). A key
    whose kernels were not timed in every round of both is counted slower (nothing says it won)."""
    def per_round(rounds: list[dict[str, float]], names: list[str]) -> list[float] | None:
        sums = []
        for r in rounds:
            if any(n not in r for n in names):
                return None
            sums.append(sum(r[n] for n in names))
        return sums or None

    slower = set()
    for key in set(keys.values()):
        names = [n for n, k in keys.items() if k == key]
        d, t = per_round(default_k, names), per_round(tuned_k, names)
        ratio = None if d is None or t is None else paired_ratio(d, t)
        if ratio is None or ratio >= 1.0:
            slower.add(key)
    return slower


# ------------------------------------------------------------------------------------------- candidates


def actions(k: OptKernel | AttentionKernel) -> list[Opt]:
    """The opts one round tries on `k`: splits by the amounts that divide an axis (any amount on an axis whose
    kernel masks a partial last split itself, `ragged_axes`), PADTO of a reduction and on the CPU of an output axis
    (odd rows rounded up to a tile, as the heuristic's `padded_rows` does), SWAP, on the CPU fewer threads than the
    automatic count (`thread_amounts`; the search drops them for long kernels: `FEWER_THREADS_MAX_S`), and on GPUs
    LOCAL, STAGE, GROUP/GROUPTOP (`group_amounts`) and TC."""
    out: list[Opt] = []
    gpu = k.device.caps.gpu
    loops, reduces = k.loops(), k.reduces()
    ragged = getattr(k, "ragged_axes", frozenset())
    for i, r in enumerate(loops):
        out += [Opt(OptOps.UPCAST, i, a) for a in UPCAST_AMOUNTS if r.src[0].arg % a == 0 or i in ragged]
        if not gpu and i not in ragged and isinstance(r.src[0].arg, int):
            out += [Opt(OptOps.PADTO, i, a) for a in PAD_AMOUNTS if r.src[0].arg % a and r.src[0].arg > a]
        if gpu:
            out += [Opt(OptOps.LOCAL, i, a) for a in LOCAL_AMOUNTS if r.src[0].arg % a == 0]
    for j, r in enumerate(reduces):
        axis = len(loops) + j
        out += [Opt(OptOps.UNROLL, axis, a) for a in UNROLL_AMOUNTS if r.src[0].arg % a == 0 or axis in ragged]
        out += [Opt(OptOps.PADTO, axis, a) for a in PAD_AMOUNTS if r.src[0].arg % a and r.src[0].arg > a]
        if gpu and len(reduces) == 1:  # (STAGE stages a reduction of one loop)
            out += [Opt(OptOps.STAGE, axis, a) for a in STAGE_AMOUNTS if r.src[0].arg % a == 0 and r.src[0].arg > a]
        if gpu and isinstance(k, OptKernel):
            out += [Opt(op, axis, a) for op in (OptOps.GROUP, OptOps.GROUPTOP) for a in group_amounts(k)
                    if r.src[0].arg % a == 0]
    for a in range(len(loops)):
        for b in range(a + 1, len(loops)):
            out.append(Opt(OptOps.SWAP, a, b))
    if not gpu and loops and not any(o.op is OptOps.THREAD for o in k.applied):
        out += [Opt(OptOps.THREAD, 0, t) for t in thread_amounts(k.device.cores)]
    if gpu and k.device.caps.tensor_cores and not k.applied:  # (TC is a kernel's first opt; it refuses non-matmuls)
        out.append(Opt(OptOps.TC, 0, 0))
    return out


def group_amounts(k: OptKernel) -> list[int]:
    """The GROUP sizes a round offers `k` (a GPU kernel): `GROUP_AMOUNTS` that fit the device's threads per
    work-group beside the LOCAL threads `k` has; none where it has a GROUP or a staged tile already (one a kernel)
    or tensor cores (the warp is the work-group). Shared memory is checked when a candidate is applied."""
    kinds = [r.arg[1] for r in k.ranges()]
    if RangeKind.GROUP in kinds or RangeKind.TILE in kinds or any(o.op is OptOps.TC for o in k.applied):
        return []
    threads = prod(r.src[0].arg for r in k.ranges() if r.arg[1] is RangeKind.LOCAL)
    return [a for a in GROUP_AMOUNTS if a * threads <= launch_limits(k.device).threads]


def candidate_group(pool: Any) -> int:
    """How many of a round's candidates are compiled before they are timed: one per compile worker of `pool` (its
    `procs`, else `compile_jobs()`); 1 where there is no pool (compiled in this process, one at a time anyway)."""
    if pool is None:
        return 1
    procs = getattr(pool, "procs", None)
    return max(1, len(procs) if procs else compile_jobs())


def round_actions(k: OptKernel | AttentionKernel, default_s: float) -> list[Opt]:
    """The opts a round of the search tries on `k`, whose default kernel took `default_s`: `actions`, without
    fewer threads where the default takes over `FEWER_THREADS_MAX_S`."""
    acts = actions(k)
    if default_s > FEWER_THREADS_MAX_S:
        acts = [o for o in acts if o.op is not OptOps.THREAD]
    return acts


def launch_threads(c: Candidate) -> int:
    """The CPU threads a rendered candidate runs on (its launch's first global size: `pipeline`'s `(threads, 1,
    1)`, none for one thread)."""
    return int(c.launch.get("global_size", (1, 1, 1))[0])


def fewer_threads(c: Candidate, default: Candidate, default_s: float, device: Any) -> bool:
    """Whether a rendered candidate runs on fewer CPU threads than the default kernel where the default takes over
    `FEWER_THREADS_MAX_S`: not timed (`round_actions` leaves out THREAD for such a kernel, but other opts can take
    the threads too: UPCASTs that consume the whole outer axis leave one thread. gru's r_8_3072_1024 upcast its 8
    rows to run on one thread, 1.30x faster alone at load ~3, 1.66x slower inside the program)."""
    if device.caps.gpu or default_s <= FEWER_THREADS_MAX_S or not c.src or not default.src:
        return False
    return launch_threads(c) < launch_threads(default)


def thread_amounts(cores: int) -> list[int]:
    """The CPU thread counts a round tries besides the automatic one (which a kernel without THREAD gets): one
    thread and half the cores (a small kernel, or a machine whose other cores are busy, can be faster with fewer;
    a count equal to the automatic one renders the same source and is neither compiled nor run again)."""
    return sorted({t for t in (1, cores // 2) if 1 <= t < cores})


@dataclass
class Candidate:
    opts: list[Opt]
    kernel: OptKernel | AttentionKernel
    src: str = ""
    name: str = ""
    launch: dict = field(default_factory=dict)
    buf_index: list[int] = field(default_factory=list)  # which of the kernel's buffers it takes, in order
    binary: bytes | None = None
    time_s: float = float("inf")
    duplicate: bool = False  # renders the same source as a candidate the search already has: not run again
    excluded: bool = False  # on fewer threads than the default of a long kernel (`fewer_threads`): not run


def _render(cand: Candidate, device: Any, name: str, bufs: list[UOp]) -> None:
    """A candidate's source, through the one lowering every kernel takes (`pipeline.lower`; the fused attention's
    own, `attention.lower_attention`)."""
    if isinstance(cand.kernel, AttentionKernel):
        low = lower_attention(cand.kernel.item, device, name, opts=cand.opts)
    else:
        if cand.kernel is not None and cand.kernel.applied == cand.opts:
            remember(cand.kernel)  # its lowering starts from the state the search already built
        low = lower(cand.kernel.base, device, bufs, name, opts=cand.opts)
    cand.buf_index = [bufs.index(b) for b in low.bufs]
    cand.src, cand.launch, cand.name = low.src, low.launch, name


class _Timer:
    """Buffers for one kernel and a reference output from its unoptimized version."""

    def __init__(self, device: Any, bufs: list[UOp], seed: int = 0):
        self.device, self.bufs = device, bufs
        self.handles, self.sizes = [], []
        for i, node in enumerate(bufs):
            n = max(prod(shape_of(node)) * node.dtype.itemsize, 1)
            h = device.allocator.alloc(n)
            if i > 0:
                data = random_values(node.dtype, shape_of(node), seed, i)
                device.allocator.copyin(h, memoryview(data).cast("B"))
            self.handles.append(h)
            self.sizes.append(n)
        self.reference: np.ndarray | None = None

    def output(self) -> np.ndarray:
        node = self.bufs[0]
        out = np.empty(shape_of(node), dtype=node.dtype.np)
        if out.nbytes:
            self.device.allocator.copyout(memoryview(out).cast("B"), self.handles[0])
        return out

    def _launcher(self, cand: Candidate) -> Callable[[], float]:
        prog = self.device.program(cand.name, cand.binary)
        bufs = [self.handles[i] for i in cand.buf_index]
        launch = {"global_size": cand.launch.get("global_size", (1, 1, 1)), "local_size": cand.launch.get("local_size"),
                  "vals": cand.launch.get("vals", ())}
        return lambda: prog(*bufs, **launch, wait=True)

    def checked_output(self, cand: Candidate) -> np.ndarray:
        """The candidate's output from one launch into an output buffer first filled with 0xFF bytes (NaN for
        floats): values an earlier candidate left there never pass for ones this candidate did not write."""
        if self.sizes[0]:
            self.device.allocator.copyin(self.handles[0], memoryview(np.full(self.sizes[0], 0xFF, np.uint8)).cast("B"))
        self._launcher(cand)()
        return self.output()

    def run(self, cand: Candidate, best: float, runs: int = 3) -> float:
        once = self._launcher(cand)
        # a first, untimed launch: lazy module loading (CUDA), first-touch page faults and cold caches are not
        # the kernel's speed (the output buffer takes the same values again)
        first = once()
        # on the CPU (no lazy module loading) a first launch over 4x the best is clearly worse: not run again
        if first > 4 * best and not self.device.caps.gpu:
            return first
        times = []
        for _ in range(runs):
            t = once()
            times.append(t)
            if t > 2 * best:  # clearly worse: stop early
                break
        return min(times)

    def free(self) -> None:
        for h, n in zip(self.handles, self.sizes):
            self.device.allocator.free(h, n)


def _matches(out: np.ndarray, ref: np.ndarray, dtype) -> bool:
    if dtype.name == "bf16":
        out, ref = bf16_to_f32(out), bf16_to_f32(ref)
    return matches(out, ref, dtype.name)


@dataclass
class SearchResult:
    opts: list[Opt]
    before_s: float
    after_s: float
    tried: int = 0
    rejected: int = 0
    failed: int = 0
    interrupted: bool = False
    reference: str = "unoptimized"
    out_of_budget: bool = False  # the kernel's share of the budget ran out: the search stopped early
    started: float = 0.0  # when the search began (`time.perf_counter()`)
    setup_s: float | None = None  # seconds from then until its default was timed (None: it never was)
    # a winner over the default that the confirm had no time (its deadline) or was interrupted before it could time
    # against the default: the default is kept, though nothing showed it faster (`store_result` stores nothing)
    unconfirmed: bool = False


def _time_candidate(timer: _Timer, c: Candidate, best_s: float, result: SearchResult) -> bool:
    """Time a compiled candidate into `c.time_s`; False (counted in `result`) where it did not compile, failed
    to run, or, faster than `best_s`, gave a wrong answer from an output buffer filled with NaN first (only a
    potential winner needs the correctness check)."""
    if c.binary is None:
        result.failed += 1
        return False
    try:
        c.time_s = timer.run(c, best_s)
    except Exception:
        result.failed += 1
        return False
    if c.time_s < best_s and not _matches(timer.checked_output(c), timer.reference, timer.bufs[0].dtype):
        result.rejected += 1
        c.time_s = float("inf")
        return False
    return True


def beam_search(ast: UOp, device: Any, bufs: list[UOp], width: int, name: str = "kernel",
                progress: Callable[[dict], None] | None = None, pool: Any = None, rounds: int = MAX_ROUNDS,
                starts: tuple[Candidate, list[Candidate]] | None = None,
                deadline: float | None = None, item: ScheduleItem | None = None) -> SearchResult:
    """BEAM over one kernel: at most `rounds` rounds of `width`. `starts`: the search's first candidates
    (`_starts`: the reference and the default's prefixes), already rendered and perhaps compiled (by
    `beam_items`' time budget, which times the default first). `deadline` (a `time.perf_counter()` value): no
    round starts after it, and the round in progress times no more candidates. `item`: the schedule item, whose
    fused attention (`attention.is_fused_attention(item.ast)`) is searched as an `AttentionKernel` (`ast` is then
    `item.ast`)."""
    timer = _Timer(device, bufs)
    try:
        return _search(ast, device, timer, width, name, progress, pool, rounds, starts, deadline, item)
    finally:
        timer.free()


def _new_kernel(ast: UOp, device: Any, item: ScheduleItem | None) -> OptKernel | AttentionKernel:
    """The search state of a kernel with no opts: the fused attention's where `item` has one, else an OptKernel."""
    if item is not None and is_fused_attention(item.ast):
        return AttentionKernel(item, device)
    return OptKernel(ast, device)


def _starts(ast: UOp, device: Any, name: str, bufs: list[UOp], item: ScheduleItem | None = None,
            resume: list[Opt] | None = None) -> tuple[Candidate, list[Candidate]]:
    """The search's first candidates, rendered (not compiled): the reference (the unoptimized kernel, or the
    hand-coded one where the unoptimized would take many seconds) and the hand-coded heuristic's choice with its
    prefixes (the last one is the default: what a run without BEAM gets); with `resume` (the winner of an earlier
    search cut short: `store_result`), that winner first, where it applies and is none of those."""
    base = Candidate([], _new_kernel(ast, device, item))
    seed = _new_kernel(ast, device, item)
    if isinstance(seed, AttentionKernel):
        seed.heuristic()
    else:
        hand_coded(seed)
    # The reference output comes from the unoptimized kernel. Where that kernel would take many seconds
    # (a 2048^3 matmul: minutes), the hand-coded kernel serves instead; the language suite checks it
    # against numpy. The result says which one was used.
    work = prod(r.src[0].arg for r in base.kernel.ranges())
    reference = seed if seed.applied and work > REFERENCE_MAX_WORK else base.kernel
    base = Candidate(list(reference.applied), reference)
    _render(base, device, name, bufs)
    seeds = []
    for n in range(1, len(seed.applied) + 1):
        if reference is seed and n == len(seed.applied):  # the reference is the default: rendered once
            seeds.append(Candidate(list(base.opts), base.kernel, src=base.src, name=base.name, launch=base.launch,
                                   buf_index=base.buf_index, binary=base.binary))
            continue
        k = _new_kernel(ast, device, item)
        for o in seed.applied[:n]:
            k.apply(o)
        c = Candidate(list(seed.applied[:n]), k)
        _render(c, device, name, bufs)
        seeds.append(c)
    if resume and tuple(resume) not in {tuple(c.opts) for c in [base, *seeds]}:
        # (its neighbours are where the search left off; a search cut short again keeps it where nothing beat it)
        try:
            k = _new_kernel(ast, device, item)
            for o in resume:
                k.apply(o)
            c = Candidate(list(resume), k)
            _render(c, device, name, bufs)
            if not seeds:  # (the default is the last seed: here the reference, which has no opts)
                seeds.append(Candidate(list(base.opts), base.kernel, src=base.src, name=base.name,
                                       launch=base.launch, buf_index=base.buf_index, binary=base.binary))
            seeds.insert(0, c)
        except Exception:  # noqa: BLE001 - a stored winner this version does not apply: the search without it
            pass
    return base, seeds


def _compile_here(c: Candidate, device: Any) -> None:
    if c.binary is None:
        c.binary = device.compiler.compile(c.src)


def _search(ast, device, timer: _Timer, width, name, progress, pool, rounds: int = MAX_ROUNDS,
            starts: tuple[Candidate, list[Candidate]] | None = None, deadline: float | None = None,
            item: ScheduleItem | None = None) -> SearchResult:
    start = time.perf_counter()
    base, seeds = starts if starts is not None else _starts(ast, device, name, timer.bufs, item)
    if _past(deadline):  # its share ran out while its first candidates compiled: nothing timed, nothing kept
        return SearchResult(list(base.opts), float("inf"), float("inf"), out_of_budget=True)
    _compile_here(base, device)
    base.time_s = timer.run(base, float("inf"), runs=1)
    timer.reference = timer.output()
    evaluator = current_evaluator()
    batch = evaluator.kernel(device, timer) if evaluator is not None else None
    try:
        return _search_from(ast, device, timer, width, name, progress, pool, rounds, start, base, seeds, batch,
                            deadline)
    finally:
        if batch is not None:
            batch.close()


def _search_from(ast, device, timer: _Timer, width, name, progress, pool, rounds: int, start: float,
                 base: Candidate, seeds: list[Candidate], batch: Any, deadline: float | None = None) -> SearchResult:
    best = base
    default = seeds[-1] if seeds else base  # what a run without BEAM gets: always a candidate
    # start from the hand-coded heuristic's choice and its prefixes: their neighbours are the promising ones
    # (the unoptimized kernel's neighbours are mostly as slow as it is, and each costs a full run)
    if batch is not None:  # timed where the round's candidates are, the reference included, so that times compare
        for c in seeds:
            if c.binary is None and c.src == base.src:
                c.binary = base.binary
        ok: list[Candidate] = []
        batch.evaluate([base, *seeds], lambda: float("inf"), lambda c, status: ok.append(c) if status == "ok" else 0)
        for c in seeds:
            if c in ok and c.time_s < best.time_s and not fewer_threads(c, default, default.time_s, device):
                best = c
    # under a budget the default first, so that a kernel whose share runs out has what a run without BEAM gets
    order = seeds if deadline is None else seeds[-1:] + seeds[:-1]
    for c in order if batch is None else []:
        if c.binary is None and c.src == base.src:
            c.binary = base.binary
        if _past(deadline):  # its share is spent: the default, if timed, is its best so far
            break
        _compile_here(c, device)
        c.time_s = timer.run(c, best.time_s)
        if c.time_s < best.time_s and _matches(timer.checked_output(c), timer.reference, timer.bufs[0].dtype):
            best = c
    if best is not default and best is not base and default.time_s < float("inf") \
            and fewer_threads(best, default, default.time_s, device):  # (a prefix of the default on fewer threads)
        best = default
    beam = sorted(seeds, key=lambda c: c.time_s)[:width] if seeds else [base]
    seen = {tuple(c.opts) for c in [base, *seeds]}
    sources = {c.src for c in [base, *seeds]}  # every source rendered so far: another opt order that gives one
    default_s = default.time_s

    def exclude(c: Candidate) -> bool:
        return fewer_threads(c, default, default_s, device)
    result = SearchResult(list(base.opts), default_s, default_s, reference="unoptimized" if not base.opts
                          else "hand-coded")
    result.started = start
    if default_s < float("inf"):
        result.setup_s = time.perf_counter() - start
    if default_s == float("inf") and _past(deadline):  # not even its default was timed within its share
        result.opts, result.out_of_budget = list(default.opts), True
        return result
    # candidates are timed until the deadline less what confirming a winner against the default takes
    # (a default another evaluator failed to time, e.g. a cluster's late task, has no known cost: none is kept)
    confirm_s = 2 * CONFIRM_ROUNDS * default_s if default_s < float("inf") else 0.0
    timing_deadline = None if deadline is None else deadline - confirm_s
    try:
        for _round in range(rounds):
            if _round and time.perf_counter() - start > ROUND_START_LIMIT_S:
                break
            if _past(timing_deadline):
                result.out_of_budget = True
                break
            cands: list[Candidate] = []
            for parent in beam:
                for opt in round_actions(parent.kernel, default_s):
                    key = tuple(parent.opts + [opt])
                    if key in seen:
                        continue
                    seen.add(key)
                    k = parent.kernel.copy()
                    try:
                        k.apply(opt)
                    except OptError:
                        continue
                    cands.append(Candidate(parent.opts + [opt], k))
            if not cands:
                break
            if batch is not None:
                best = _evaluate_round(batch, cands, device, name, timer.bufs, sources, best, result,
                                       progress, _round, base, start, exclude)
            # under a budget, compiled and timed one candidate per compile worker at a time (never both at once:
            # the workers would load the cores while a candidate is timed): a deadline reached while a round
            # compiles keeps the candidates timed so far, where compiling the whole round first (40-90 candidates:
            # minutes on a loaded machine) left every large kernel of a block with none. Without a deadline the
            # whole round is compiled at once (the workers never wait for a timing)
            group = candidate_group(pool) if timing_deadline is not None else max(len(cands), 1)
            for g in range(0, len(cands) if batch is None else 0, group):
                _render_compile(cands[g:g + group], device, name, timer.bufs, pool, sources, timing_deadline,
                                exclude)
                for i, c in enumerate(cands[g:g + group], start=g):
                    if c.duplicate or c.excluded:
                        continue
                    if _past(timing_deadline):  # its share is spent: stop at once with the best so far
                        result.out_of_budget = True
                        break
                    result.tried += 1
                    if not _time_candidate(timer, c, best.time_s, result):
                        continue
                    if c.time_s < best.time_s:
                        best = c
                    if progress:
                        elapsed = time.perf_counter() - start
                        progress({"kernel": name, "round": _round, "tried": result.tried, "rejected": result.rejected,
                                  "best_s": best.time_s, "base_s": base.time_s, "candidate": i + 1,
                                  "candidates": len(cands), "elapsed_s": elapsed})
                if result.out_of_budget:
                    break
            ranked = sorted((c for c in cands if c.time_s < float("inf")), key=lambda c: c.time_s)[:width]
            # another round only for a real gain: one within the timing noise of this machine ends the search
            # (its winner is kept); chasing it took most of the rounds on small kernels
            if not ranked or ranked[0].time_s >= min(b.time_s for b in beam) * (1 - MIN_ROUND_GAIN):
                break
            beam = ranked
    except KeyboardInterrupt:
        result.interrupted = True
    if default.binary is None:  # another evaluator lost it (its workers gone): compiled here to confirm against
        _compile_here(default, device)
        default.time_s = timer.run(default, float("inf"))
        result.before_s = result.after_s = default.time_s
    contender = best is not default and best.opts != default.opts
    result.unconfirmed = contender and deadline is not None and \
        time.perf_counter() + default.time_s + best.time_s > deadline  # (`_confirm` times no round)
    try:
        best, result.before_s, result.after_s = _confirm(timer, best, default, deadline)
    except KeyboardInterrupt:  # interrupted while confirming: the default is the safe choice
        result.interrupted = True
        result.unconfirmed = contender
        best, result.after_s = default, default.time_s
    result.opts = best.opts
    return result


def _evaluate_round(batch: Any, cands: list[Candidate], device: Any, name: str, bufs: list[UOp], sources: set[str],
                    best: Candidate, result: SearchResult, progress: Callable[[dict], None] | None, round_: int,
                    base: Candidate, start: float,
                    exclude: Callable[[Candidate], bool] | None = None) -> Candidate:
    """One round's candidates rendered here and evaluated by `batch` (another evaluator: `use_evaluator`), counted
    in `result` as the local round counts them; returns the best candidate so far. A candidate `exclude` names
    (`fewer_threads`) is not sent."""
    for c in cands:
        try:
            _render(c, device, name, bufs)
        except Exception:  # an opt combination the renderer cannot express: counted as failed, as here
            c.src = ""
            continue
        if c.src in sources:
            c.duplicate = True
            continue
        sources.add(c.src)
        c.excluded = exclude is not None and exclude(c)
    live = [c for c in cands if not c.duplicate and not c.excluded]
    state = {"best": best, "done": 0}

    def on_result(c: Candidate, status: str) -> None:
        result.tried += 1
        state["done"] += 1
        if status == "failed":
            result.failed += 1
        elif status == "rejected":
            result.rejected += 1
        elif c.time_s < state["best"].time_s:
            state["best"] = c
        if progress:
            progress({"kernel": name, "round": round_, "tried": result.tried, "rejected": result.rejected,
                      "best_s": state["best"].time_s, "base_s": base.time_s, "candidate": state["done"],
                      "candidates": len(live), "elapsed_s": time.perf_counter() - start})

    for c in live:
        if not c.src:
            c.binary, c.time_s = None, float("inf")
            on_result(c, "failed")
    batch.evaluate([c for c in live if c.src], lambda: state["best"].time_s, on_result)
    return state["best"]


CONFIRM_ROUNDS = 5


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() >= deadline


def _confirm(timer: _Timer, best: Candidate, default: Candidate,
             deadline: float | None = None) -> tuple[Candidate, float, float]:
    """The search's winner timed again against the default (hand-coded) kernel, alternating on the same
    buffers in this run: a winner that only looked faster (one lucky measurement, a busy machine while the
    default ran) never replaces the default. Returns (the faster of the two, the default's time, its time).
    With a `deadline`, only the rounds that fit before it run (each takes about the two kernels' times); where
    not one fits, the default is kept."""
    if best is default or best.opts == default.opts:
        return default, default.time_s, default.time_s
    inf = float("inf")
    d, w = [], []
    for _ in range(CONFIRM_ROUNDS):
        if deadline is not None and time.perf_counter() + default.time_s + best.time_s > deadline:
            break
        d.append(timer.run(default, inf, runs=1))
        w.append(timer.run(best, inf, runs=1))
    if not d:
        return default, default.time_s, default.time_s
    return (best, min(d), min(w)) if min(w) < min(d) else (default, min(d), min(d))


def _render_compile(cands: list[Candidate], device: Any, name: str, bufs: list[UOp], pool: Any,
                    sources: set[str], deadline: float | None = None,
                    exclude: Callable[[Candidate], bool] | None = None) -> None:
    """Render every candidate (in this process) and hand each to the compile workers as soon as it is rendered,
    so that rendering overlaps compiling. A candidate whose source is in `sources` (rendered before, from
    another order of the same opts) is marked `duplicate` and neither compiled nor run; `sources` grows; one
    `exclude` names (`fewer_threads`) is marked `excluded`, neither compiled nor run. Past `deadline` no more
    candidates are rendered and no compile is waited for (those left have no binary)."""
    futures = []
    for c in cands:
        if _past(deadline):
            break
        try:
            _render(c, device, name, bufs)
        except Exception:  # an opt combination the renderer cannot express
            c.src = ""
            continue
        if c.src in sources:
            c.duplicate = True
            continue
        sources.add(c.src)
        if exclude is not None and exclude(c):
            c.excluded = True
            continue
        if pool is not None:
            futures.append((c, pool.submit(device.kind, c.src)))
    if pool is None:
        _compile_all([c for c in cands if not c.duplicate and not c.excluded], device, None, deadline=deadline)
        return
    for c, fut in futures:
        c.binary = _wait(fut, deadline)


def _compile_all(cands: list[Candidate], device: Any, pool: Any, timeout: float = COMPILE_TIMEOUT_S,
                 deadline: float | None = None) -> None:
    if pool is not None:
        futures = [(c, pool.submit(device.kind, c.src)) for c in cands if c.src]
        for c, fut in futures:
            try:
                c.binary = fut.result(timeout=timeout)
            except (CompileError, FutureTimeout, Exception):
                c.binary = None
        return
    for c in cands:
        if not c.src or _past(deadline):
            continue
        try:
            c.binary = device.compiler.compile(c.src)
        except Exception:
            c.binary = None


def compile_jobs() -> int:
    """How many worker processes compile at once: `TGC_JOBS` (`--jobs`), else the cores tgc may run on (at most
    8)."""
    jobs = env_int("TGC_JOBS", 0)
    if jobs >= 1:
        return jobs
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, 8))


def make_pool(device: Any):
    """Worker processes for compiling CPU candidates (GPU drivers compile in-process); an evaluator's compile pool
    where one is in use (`use_evaluator`)."""
    evaluator = current_evaluator()
    if evaluator is not None:
        return evaluator.compile_pool(device)
    return device.compile_pool(compile_jobs())


# ------------------------------------------------------------------------------------------- the whole program


def estimate_cost(item: ScheduleItem, device: Any) -> float:
    """A kernel's cost in the budget's units, from its AST alone (nothing compiled or run): its FLOPs
    (`meta["graph_flops"]` where the scheduler counted them, else `engine.flops.executed_flops`), or the bytes of its
    buffers times `MACHINE_BALANCE` where that is more (a copy, a layernorm: memory-bound). Only ratios between
    kernels of one program matter."""
    try:  # a fused attention's own count (its plain AST's would count the unfused chain's work)
        flops = float(item.meta.get("graph_flops") or executed_flops(item.ast))
    except Exception:  # noqa: BLE001 - an AST the counter does not know: weighed by its bytes alone
        flops = 0.0
    nbytes = float(sum(prod(shape_of(b)) * b.dtype.itemsize for b in item.bufs))
    return max(flops, MACHINE_BALANCE * nbytes, 1.0)


def _wait(fut: Any, deadline: float | None) -> bytes | None:
    """A compile's binary, waiting at most COMPILE_TIMEOUT_S and never past `deadline`; None where it failed or
    the wait ran out (the future is then cancelled, if it has not started)."""
    timeout = COMPILE_TIMEOUT_S if deadline is None else min(COMPILE_TIMEOUT_S, deadline - time.perf_counter())
    try:
        return fut.result(timeout=max(timeout, 0.0))
    except (CompileError, FutureTimeout, Exception):
        fut.cancel()
        return None


def _compile_starts(starts: tuple[Candidate, list[Candidate]], device: Any, pool: Any,
                    deadline: float | None) -> None:
    """A kernel's first candidates handed to the compile workers together (each source once), each waited for
    no later than `deadline`; without a pool, the search compiles them itself."""
    if pool is None:
        return
    base, seeds = starts
    futures: dict[str, Any] = {}
    for c in [base, *seeds]:
        if c.src and c.src not in futures:
            futures[c.src] = pool.submit(device.kind, c.src)
    binaries = {src: _wait(fut, deadline) for src, fut in futures.items()}
    for c in [base, *seeds]:
        c.binary = binaries.get(c.src)


def kernel_weights(items: list[ScheduleItem], keys: list[str], todo: list[int], dev: Any,
                   measured: list[float | None] | None = None) -> dict[int, float]:
    """Each kernel to search's weight in the budget (`todo`: indices of `items`, one per key; `keys[i]`: item i's
    key in the store). With `measured` (per item, the seconds its default took in one run of the program; None
    for a kernel that does not run at every call: the prelude on a model's weights, `tgc.engine.bound`), a
    kernel weighs the time all its copies (the items of its key) take per call: what a search could win back;
    a kernel whose copies all run once weighs 0 (not searched). The caller gives every kernel that runs at
    every call a cost in one unit (`Program._per_call_costs`: all measured, or all estimated). Without
    `measured` (or not one per item), every weight is the estimate (`estimate_cost` times the copies)."""
    count = {k: keys.count(k) for k in set(keys)}
    if measured is not None and len(measured) == len(items):
        per_call = {}
        for i, key in enumerate(keys):
            if measured[i] is not None:
                per_call[key] = per_call.get(key, 0.0) + max(float(measured[i]), 1e-9)  # (0: under the clock's tick)
        return {i: per_call.get(keys[i], 0.0) for i in todo}
    return {i: estimate_cost(items[i], dev) * count[keys[i]] for i in todo}


def budget_kernels(weights: dict[int, float], bounded: bool) -> list[int]:
    """The kernels a search reaches, heaviest first (ties: the earlier kernel): every one without a bound; under
    a budget the fewest heaviest that hold COVER of the total weight (the lightest rest is not searched and not
    stored: a later search with more time finds it)."""
    order = sorted(weights, key=lambda i: (-weights[i], i))
    if not bounded:
        return order
    total = sum(weights.values())
    chosen: list[int] = []
    held = 0.0
    for i in order:
        if chosen and held >= COVER * total:
            break
        chosen.append(i)
        held += weights[i]
    return chosen


def _drop_for_share(i: int, queued: list[int], weights: dict[int, float], weight_left: float, seconds_left: float,
                    need_s: float) -> list[int]:
    """The kernels to drop, lightest first, from `queued` (those after kernel `i`, heaviest first) so that `i`'s
    share of `seconds_left` (its weight over `weight_left`, its own and the queued ones') is at least `need_s`."""
    dropped: list[int] = []
    rest = list(queued)
    while rest and weight_left > 0 and seconds_left * weights[i] / weight_left < need_s:
        j = rest.pop()
        dropped.append(j)
        weight_left -= weights[j]
    return dropped


def small_search(time_s: float | None, total_s: float) -> bool:
    """Whether a kernel whose default takes `time_s` of a program's `total_s` gets the small search: it cannot
    matter (under `SMALL_SHARE` of the program: a search could win back less than that)."""
    if time_s is None or total_s <= 0:
        return False
    return time_s < SMALL_SHARE * total_s


def _budget_deadline(now: float, deadline_all: float, weight: float, weight_left: float) -> float | None:
    """When one kernel's search must stop: the time left to the whole search's deadline times the kernel's share
    (`weight` of the `weight_left` still to search); None when no time is left."""
    if now >= deadline_all:
        return None
    share = weight / weight_left if weight_left > 0 else 1.0
    return now + (deadline_all - now) * min(1.0, max(share, 0.0))


def beam_items(items: list[ScheduleItem], dev: Any, width: int = 4, progress: Callable[[dict], None] | None = None,
               force: bool = False, budget_s: float | None = DEFAULT_BUDGET_S,
               started: float | None = None, measured: list[float | None] | None = None
               ) -> tuple[list[dict[str, Any]], float]:
    """Search every kernel of a schedule on `dev`; store the winners; rows of before/after per kernel and the
    seconds it took (`Program.beam` schedules, calls this and drops its compiled kernels).

    Kernels with the same AST (the same key in the store: a block's two layernorms, a repeated matmul shape) are
    searched once; the others take the first one's winner (`same_as`). Each kernel's weight (`kernel_weights`)
    is the time its copies took in one run of the program where `measured` gives it (per item of `items`: its
    default's seconds, None for a kernel that runs once, not at every call), else its estimated cost
    (`estimate_cost`, times its copies); kernels are searched heaviest first; one of weight 0 (it runs once per
    program: packing a weight) is not searched (`"skipped": true, "once": true`); one under `SMALL_SHARE` of the
    program's (`small_search`) gets a search of width `SMALL_WIDTH` over `SMALL_ROUNDS` rounds
    (`"small": true`).

    `budget_s` (None: no bound) bounds the time from `started` (a `time.perf_counter()` value; default: now) to
    the end of this call: only the heaviest kernels holding COVER of the weight are searched (`budget_kernels`),
    the lightest of them dropped where a share would be under SETUP_MULTIPLE setups (`_drop_for_share`); each
    kernel searched gets the budget left times its share of the weight still to search (`_budget_deadline`)
    and renders, compiles and times its default and its candidates within it; a kernel left out, reached after
    the budget is spent, or whose default could not be timed within its share, is not searched and not stored
    (`"skipped": true`: a later run searches it)."""

    if dev.compiler is None:
        raise CompileError(dev.compile_error or f"cannot compile for {dev.kind} here, so it cannot be tuned here")
    start = time.perf_counter() if started is None else started
    deadline_all = None if budget_s is None else start + budget_s
    kept = [i for i, it in enumerate(items) if it.ast.src]
    if measured is not None:
        measured = [measured[i] for i in kept] if len(measured) == len(items) else None
    items = [items[i] for i in kept]
    rows: list[dict[str, Any] | None] = [None] * len(items)
    pool = make_pool(dev)
    try:
        asts = [search_ast(item, dev) for item in items]
        keys = [beam_key(ast, dev) for ast in asts]
        first: dict[str, int] = {}  # a key's first kernel: the one searched
        for i, item in enumerate(items):
            first.setdefault(keys[i], i)
            entry = None if force else lookup_entry(asts[i], dev)
            if entry is not None and finished(entry, width):  # (one cut short, `"partial"`, is searched again)
                rows[i] = {"name": item.name, "opts": [str(o) for o in entry["opts"]], "cached": True,
                           "width": entry["width"]}
                if entry["dropped"]:  # (a program check dropped it: the kernel runs its default)
                    rows[i]["dropped"] = True
                if progress:
                    progress({"kernel": item.name, "index": i, "total": len(items), "cached": True})
        todo = [i for i in range(len(items)) if rows[i] is None and first[keys[i]] == i]
        # each kernel's weight in the budget and in the small-search rule: its time per call, measured or
        # estimated (`kernel_weights`); the heaviest are searched first, so that a budget spent leaves out the
        # kernels that matter least
        weights = kernel_weights(items, keys, todo, dev, measured)
        for i in [i for i in todo if weights[i] <= 0]:  # runs once per program, not at every call: not searched
            rows[i] = {"name": items[i].name, "opts": [], "width": width, "tried": 0, "cached": False,
                       "skipped": True, "once": True}
            todo.remove(i)
        total = sum(weights.values())
        # under a budget, the heaviest kernels only, each with a share that can try candidates (`budget_kernels`,
        # `_drop_for_share`); the others are skipped
        order = budget_kernels({i: weights[i] for i in todo}, deadline_all is not None)
        left_out = set(todo) - set(order)
        weight_left = sum(weights[i] for i in order)
        setup: list[float] = []  # the seconds each kernel searched so far took to render, compile and time its default
        done = sum(1 for r in rows if r is not None)  # kernels reported so far (the progress bar's position)
        for i in sorted(todo, key=lambda i: (-weights[i], i)):
            item = items[i]
            if deadline_all is not None and setup and i not in left_out:
                queued = [j for j in order[order.index(i) + 1:] if j not in left_out]
                dropped = _drop_for_share(i, queued, weights, weight_left, deadline_all - time.perf_counter(),
                                          SETUP_MULTIPLE * median(setup))
                left_out.update(dropped)
                weight_left -= sum(weights[j] for j in dropped)

            def report(p: dict, pos=done) -> None:
                if progress:
                    progress({**p, "index": pos, "total": len(items), "elapsed_total_s": time.perf_counter() - start})

            done += 1
            small = small_search(weights[i], total)
            skipped = {"name": item.name, "opts": [], "width": width, "tried": 0, "cached": False, "skipped": True}
            if i in left_out:  # (`budget_kernels`: the budget goes to the heavier kernels)
                rows[i] = {**skipped, "lighter": True}
                continue
            deadline = None
            if deadline_all is not None:
                now = time.perf_counter()
                deadline = _budget_deadline(now, deadline_all, weights[i], weight_left)
                weight_left -= weights[i]
                # not searched: the budget is spent, or it cannot matter (`small`) and its share is shorter than any
                # kernel before it took to time its default (it would spend its share and keep nothing)
                if deadline is None or (small and setup and deadline - now < min(setup)):
                    rows[i] = skipped
                    continue
            began = time.perf_counter()
            # a stored winner (of a search cut short, or a finished narrower one; not one the program check
            # dropped) is one of this search's first candidates; --force searches from the start (the winner it
            # searches again is kept where this search is cut short: `store_result`)
            prior = lookup_entry(asts[i], dev)
            resume = prior["opts"] if prior is not None and not prior["dropped"] and not force else None
            try:
                starts = _starts(asts[i], dev, item.name, item.bufs, item, resume)
            except Exception:  # noqa: BLE001 - the search renders it again and reports what fails
                starts = None
            if starts is not None:
                _compile_starts(starts, dev, pool, deadline)
            res = beam_search(asts[i], dev, item.bufs, SMALL_WIDTH if small else width, name=item.name,
                              progress=report, pool=pool, rounds=SMALL_ROUNDS if small else MAX_ROUNDS,
                              starts=starts, deadline=deadline, item=item)
            if res.setup_s is not None:
                setup.append(res.setup_s + (res.started - began))
            if res.before_s == float("inf"):  # its share ran out before its default was timed: as if not reached
                rows[i] = {**skipped, "interrupted": res.interrupted}
                if res.interrupted:
                    break
                continue
            # stored under the width asked: the small search is what this width gives a kernel that cannot matter;
            # one cut short as partial (searched again by the next run), or not at all where it tried nothing
            stored = store_result(asts[i], dev, res, item.name, width)
            rows[i] = {"name": item.name, "opts": [str(o) for o in res.opts], "width": width,
                       "stored": stored in ("finished", "partial"), "partial": stored == "partial",
                       "kept": stored == "kept",  # (cut short, not stored: a finished search's winner stays)
                       "before_s": res.before_s, "after_s": res.after_s,
                       "speedup": res.before_s / res.after_s if res.after_s else 0.0,
                       "tried": res.tried, "rejected": res.rejected, "failed": res.failed, "cached": False,
                       "reference": res.reference, "small": small, "out_of_budget": res.out_of_budget,
                       "interrupted": res.interrupted, "setup_s": res.setup_s}
            if res.interrupted:
                break
        for i, item in enumerate(items):  # the same kernel as one searched in this run: its winner
            if rows[i] is None and first[keys[i]] != i and rows[first[keys[i]]] is not None:
                src = rows[first[keys[i]]] or {}
                rows[i] = {**src, "name": item.name, "tried": 0, "rejected": 0, "failed": 0, "same_as": src.get("name")}
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    # each row under the name its kernel runs by (`kernel_names`: a repeated name gets n1, n2, ...), and a copy's
    # `same_as` names the row it copies the same way
    names = kernel_names(items)
    for i, row in enumerate(rows):
        if row is not None:
            row["name"] = names[i]
            if row.get("same_as"):
                row["same_as"] = names[first[keys[i]]]
    return [r for r in rows if r is not None], time.perf_counter() - start
