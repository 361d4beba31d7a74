"""One kernel from AST to binary: legalize, optimize, linearize, render, compile (through the disk cache)."""

from __future__ import annotations

import atexit
import dataclasses
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tgc import cache, profile, timings
from tgc.codegen import search
from tgc.codegen.attention import attention_kernel, is_fused_attention, lower_attention
from tgc.codegen.binaries import compile_key as compile_key  # re-exported
from tgc.codegen.index import is_index
from tgc.codegen.opt import MIN_WORK_PER_THREAD, OptError, OptKernel, OptOps
from tgc.codegen.pipeline import _COMMENT as _COMMENT  # re-exported
from tgc.codegen.pipeline import CONTRACT_TAG as CONTRACT_TAG  # re-exported
from tgc.codegen.pipeline import drop_unused_buffers as drop_unused_buffers  # re-exported
from tgc.codegen.pipeline import launch_contract as launch_contract  # re-exported
from tgc.codegen.pipeline import lower, prepare, render_renamed, render_template
from tgc.codegen.pipeline import render_kernel as render_kernel  # re-exported
from tgc.codegen.rowreuse import tee_row_values
from tgc.codegen.sizes import VAR_PREFIX
from tgc.codegen.sizes import eval_int as _eval_int
from tgc.dtype import dtypes, min_max
from tgc.engine.flops import executed_flops
from tgc.engine.realize import stored_indices
from tgc.env import debug_level, env_flag
from tgc.errors import CompileError
from tgc.interfaces import LaunchableKernel
from tgc.ir.kernel import ScheduleItem
from tgc.ir.shapes import prod, shape_of
from tgc.ir.uop import ALU, Ops, UOp, format_uops


@dataclass
class Kernel(LaunchableKernel):
    """A kernel ready to launch (or, where this machine cannot compile for the device, ready to show): a
    `LaunchableKernel` (tgc/interfaces.py), as a package's kernel is."""

    name: str
    src: str
    binary: bytes | None
    uops: list[UOp]
    ast: UOp  # the optimized AST; its DEFINE_GLOBALs number `LoweredKernel.ast_bufs` (a later fold may drop one)
    bufs: list[UOp]  # tensor nodes held by DEFINE_GLOBAL 0, 1, ...
    global_size: tuple[int, int, int] = (1, 1, 1)
    local_size: tuple[int, int, int] | None = None
    vals: tuple[int, ...] = ()
    flops: int = 0
    bytes_moved: int = 0
    graph_flops: int = 0  # the tensor graph's ops this kernel executes (`tgc.engine.flops`: the recompute factor)
    line: int | None = None
    compile_error: str | None = None
    device: Any = None
    opts: list = field(default_factory=list)
    cache_key: str | None = None  # the disk-cache key `binary` came from (None: compiled now, or not cached)
    var_names: tuple[str, ...] = ()  # a symbolic kernel's dim variables, in the order `vals` gives them
    checks: list = field(default_factory=list)  # a symbolic kernel's launch checks (`build_symbolic_kernel`)
    template: UOp | None = None  # a symbolic kernel's prepared AST before opts (its BEAM winners' key)
    grid: tuple | None = None  # a symbolic GPU kernel's work-groups per dimension, expressions of its dim variables
    deferred: bool = False  # lowered and rendered, its compile left to `compile_deferred` (`build_kernels(defer=)`)
    _program: Any = None

    def program(self):
        if self._program is None:
            if self.deferred:
                compile_deferred([self])
            if self.binary is None:
                raise CompileError(self.compile_error or f"kernel {self.name} was not compiled")
            try:
                self._program = self.device.program(self.name, self.binary)
            except Exception as e:
                if self.cache_key is None:
                    raise
                # a cached binary that does not load (truncated, or built by another loader): a miss
                self.binary = recompile(self.device, self.src, self.cache_key, f"does not load ({type(e).__name__})")
                self.cache_key = None
                self._program = self.device.program(self.name, self.binary)
        return self._program

    def uops_text(self) -> str:
        return format_uops(self.uops)

    def written(self) -> frozenset[int]:
        """The buffer indices this kernel stores to (from its AST)."""
        return stored_indices(self.ast)

    def linear_uops(self) -> list | None:
        return self.uops

    def asm(self) -> str:
        comp = self.device.compiler
        if comp is None:
            raise CompileError(self.compile_error or "no compiler for this device")
        if comp.source_assembly:
            return comp.assembly(self.src)
        if self.binary is None:
            raise CompileError(self.compile_error or "not compiled")
        return comp.disassemble(self.binary, src=self.src)


def count_work(uops: list[UOp], env: dict[str, int] | None = None, groups: bool = True) -> float:
    """Float operations one thread executes, from the loop trip counts around each ALU op.

    `env` gives kernel variables (the CPU's `core_id`) so that a loop whose end depends on them gets its
    real trip count (else the end's largest value). The combine step of a GROUP reduction counts once per thread
    of the group (its partial added once): where every thread repeats it on the same shared-memory partials (a
    value read from shared memory at an index over a combine loop of n iterations, and whatever follows from it
    without varying by thread) each op weighs 1/n; where the threads combine by a tree in shared memory or by warp
    shuffles (`opt.lower_groups`: loads of a `temp` array outside any loop, `Ops.SHUFFLE`), the whole chain counts
    one op per partial a thread contributes. A staged tile (`opt.stage_tiles`: a `tile` array) is read like any
    per-thread operand. `Ops.MMA` is its 16 x 8 x 16 multiply-adds shared by the 32 lanes (256 a lane), and adding
    its result to the accumulator is part of it. `groups=False` (the CPU, whose work-group is one thread: its
    local memory is that thread's scratch array) counts every op.
    """
    return count_work_each(uops, [env], groups)[0]


def count_work_each(uops: list[UOp], envs: list[dict[str, int] | None], groups: bool = True) -> list[float]:
    """`count_work` for each of `envs` (the CPU's cores): the walk over the ops (what varies by thread, the
    weights) is done once; only the loops' trip counts are evaluated per env, the sums taken in the same order
    (the same floats as one `count_work` per env)."""
    loops: list[tuple[int, UOp]] = []  # (enclosing loop nest's index + 1, RANGE): nest i + 1 is loops[i]
    terms: list[tuple[int, int, int]] = []  # (loop nest, ops, weight) of each counted op, in order
    nest = [0]
    varying: dict[UOp, bool] = {}  # differs between the threads of a work-group
    factor: dict[UOp, int] = {}  # how many threads of the group compute the same value
    serial = {u.src[0] for u in uops if u.op is Ops.LOAD and u.src and u.src[0].op is Ops.DEFINE_LOCAL
              and len(u.src) > 1 and prod_ranges(u.src[1]) > 1}  # shared arrays read in a combine loop
    combined: set[UOp] = set()  # values of a tree or shuffle combine
    for u in uops:
        if u.op is Ops.RANGE:
            loops.append((nest[-1], u))
            nest.append(len(loops))
            continue
        if u.op is Ops.ENDRANGE:
            nest.pop()
            continue
        if u.op is Ops.SPECIAL:
            varying[u] = str(u.arg[0]).startswith("lidx")
            continue
        local = u.src[0] if u.op in (Ops.LOAD, Ops.STORE) and u.src and u.src[0].op is Ops.DEFINE_LOCAL else None
        name = str(local.arg[0]) if local is not None else ""
        if groups and (u.op is Ops.SHUFFLE or (u.op is Ops.LOAD and name.startswith("temp") and local not in serial)):
            combined.add(u)
        elif groups and u.op is Ops.STORE and name.startswith("temp") and local not in serial:
            if u.src[2] not in combined:  # a partial enters the combine: its one op
                terms.append((nest[-1], 1, 1))
            continue
        if u in combined or any(s in combined for s in u.src if u.op in ALU):
            combined.add(u)
            if u.op is Ops.SHUFFLE and u.src[0] not in combined:  # a partial enters the shuffles: its one op
                terms.append((nest[-1], 1, 1))
            varying[u] = True
            continue
        if groups and u.op is Ops.LOAD and local is not None and not name.startswith("tile"):
            varying[u] = False
            factor[u] = max(prod_ranges(u.src[1]), 1) if len(u.src) > 1 else 1
        else:
            varying[u] = any(varying.get(s, False) for s in u.src) or (local is not None and groups)
            factor[u] = max((factor.get(s, 1) for s in u.src), default=1)
        if u.op is Ops.ACCUMULATE:  # the accumulator carries what goes into it to its READ_ACC
            acc = u.src[0]
            varying[acc] = varying.get(acc, False) or varying[u]
            factor[acc] = max(factor.get(acc, 1), factor[u])
            if (u.src[1].op is Ops.GEP and u.src[1].src[0].op is Ops.MMA) or u.src[1].op is Ops.READ_ACC:
                continue  # the MMA's own accumulate; an inner reduction's sum into the outer one (STAGE's tiles)
        if u.op is Ops.MMA:
            terms.append((nest[-1], 2 * 16 * 8 * 16 // 32, 1))  # 256 multiply-adds a lane
        elif (u.op in ALU and u.dtype is not None and u.dtype.is_float) or u.op is Ops.ACCUMULATE:
            ops = u.dtype.count if u.dtype is not None else 1
            terms.append((nest[-1], ops, 1 if varying[u] else factor[u]))
    out = []
    for env in envs:
        trips = [1]
        for parent, r in loops:
            end = r.src[0]
            n = end.arg if end.op is Ops.CONST else _eval_int(end, env or {})
            trips.append(trips[parent] * (n if n is not None else max(int(end.vmax), 1)))
        flops = 0.0
        for at, ops, weight in terms:
            flops += trips[at] * ops / weight
        out.append(flops)
    return out


def prod_ranges(index: UOp) -> int:
    """The product of the trip counts of the loops an index expression uses."""
    out = 1
    for n in index.toposort():
        if n.op is Ops.RANGE:
            out *= int(n.vmax) + 1
    return out


def kernel_flops(uops: list[UOp], device: Any, launch: dict) -> int:
    """Float operations of a whole launch. On GPUs every thread of the grid runs the per-thread program:
    the work is multiplied by every global (work-groups) and local (threads per group) dimension. On the
    CPU `global_size[0]` threads each run their slice of the outer loop (its end depends on `core_id`)."""
    gsize = tuple(launch.get("global_size", (1, 1, 1)))
    if device.caps.gpu:
        threads = 1
        for n in (*gsize, *(launch.get("local_size") or ())):
            threads *= int(n)
        return round(count_work(uops) * threads)
    return round(sum(count_work_each(uops, [{"core_id": c} for c in range(max(int(gsize[0]), 1))], groups=False)))


def graph_flops(item: ScheduleItem, device: Any) -> int:
    """The tensor graph's ops a kernel executes (`tgc.engine.flops.executed_flops`), where a CPU-style device
    keeps an expensive per-row value from its reduction's pass (`tgc.codegen.rowreuse`): counted as loaded."""
    if device.caps.reread_rows and not device.caps.gpu:
        return executed_flops(tee_row_values(item.ast))
    return item.meta.get("graph_flops", 0) or executed_flops(item.ast)


def prepare_ast(ast: UOp, device: Any) -> UOp:
    """The device-independent passes every kernel gets before optimization (`pipeline.PREPARE`)."""
    return prepare(ast, device)


def build_kernel(item: ScheduleItem, device: Any, beam: int = 0, name: str | None = None, tuned: bool = True,
                 progress: Any = None) -> Kernel:
    """`tuned=False` ignores stored BEAM winners (what `make bench` shows as 'tgc default'). With `beam=W`
    a stored winner is used only if its search was at least W wide, else the kernel is searched again;
    `progress` gets the search's events (see `tgc.cli.report.progress_bar`). Lowering is `pipeline.lower`.
    Its phases are timed (`tgc.timings`: `tgc compile --timings`, DEBUG=2)."""
    name = name or item.name
    with timings.kernel(name):
        return _build_kernel(item, device, beam, name, tuned, progress)


def _build_kernel(item: ScheduleItem, device: Any, beam: int, name: str, tuned: bool, progress: Any,
                  compile_src: Any = None, templates: dict | None = None, same: tuple | None = None) -> Kernel:
    """`compile_src(device, src)` -> (binary, error, cache key): `_compile_cached`, or `build_kernels`' deferral.
    With `templates`, the kernel's source template (`pipeline.render_template`) is kept there under `same`: the
    first kernel of a group of identical ones renders it, the others (`_renamed`) only put their names in."""
    compile_src = compile_src or _compile_cached
    fused = is_fused_attention(item.ast)  # one online-softmax kernel (tgc/codegen/attention.py)
    with timings.phase("prepare"):
        ast = search.search_ast(item, device)
    opts = None
    if tuned and device.compiler is not None and not env_flag("NOOPT"):
        with timings.phase("beam"):
            opts = search.lookup(ast, device, width=beam)  # a BEAM winner stored earlier (wide enough)
            if opts is None and beam > 0 and not search.dropped(ast, device, beam):  # (dropped: its default)
                res = search.beam_search(ast, device, item.bufs, beam, name=name, progress=progress, item=item)
                search.store_result(ast, device, res, name, beam)  # (Ctrl-C: partial, or nothing)
                opts = res.opts
            elif opts is not None and progress is not None:
                progress({"kernel": name, "cached": True})
    if fused:
        try:
            low = lower_attention(item, device, name, opts)
        except OptError:  # a stored winner this version does not apply: the heuristic's choice
            low = lower_attention(item, device, name)
        binary, err, key = compile_src(device, low.src)
        with timings.phase("count"):
            flops, nbytes = kernel_flops(low.uops, device, low.launch), bytes_touched(low.ast, low.bufs)
        return Kernel(name=name, src=low.src, binary=binary, uops=low.uops, ast=low.ast, bufs=low.bufs,
                      global_size=low.launch.get("global_size", (1, 1, 1)), local_size=low.launch.get("local_size"),
                      vals=low.launch.get("vals", ()), flops=flops, bytes_moved=nbytes, line=item.line,
                      graph_flops=item.meta.get("graph_flops", 0),
                      compile_error=err, device=device, opts=low.applied, cache_key=key)
    low = lower(ast, device, item.bufs, name, opts=opts, template=templates is not None)
    if templates is not None:
        templates[same] = low.template
    binary, err, key = compile_src(device, low.src)
    with timings.phase("count"):
        nbytes = bytes_touched(low.ast, [b if b in low.bufs else None for b in low.ast_bufs])
        flops = kernel_flops(low.uops, device, low.launch)
    launch = low.launch
    return Kernel(name=name, src=low.src, binary=binary, uops=low.uops, ast=low.ast, bufs=low.bufs,
                  global_size=launch.get("global_size", (1, 1, 1)), local_size=launch.get("local_size"),
                  vals=launch.get("vals", ()), flops=flops, bytes_moved=nbytes, line=item.line, compile_error=err,
                  device=device, opts=low.applied, cache_key=key, graph_flops=graph_flops(item, device))


def build_kernels(items: list[tuple[ScheduleItem, str]], device: Any, beam: int = 0, tuned: bool = True,
                  progress: Any = None, jobs: int | None = None, defer: bool = False) -> list[Kernel]:
    """`build_kernel` for every (item, name) of a program, in order, with the compiles on every core: kernels are
    lowered here one after the other (Python), and each large source (`PARALLEL_MIN_SOURCE` bytes or more) the
    disk cache lacks goes to `jobs` worker processes (`Device.compile_pool`, `tgc.backends.compile_worker`: LLVM
    in another process, kept for the process) while the next kernels are lowered; smaller sources (until the
    program has sent a large one: then they follow it), and the first large one where no worker runs yet (a
    program of one large kernel never waits for a worker to start), compile here. The binaries are the
    compiler's for the same sources, byte for byte; kernels whose sources are equal but for their names
    (`Device.canonical_source`: ResNet's repeated blocks) share one compile and one binary.
    `jobs` (default `search.compile_jobs()`: `TGC_JOBS`, else the cores) of 1, or a device without a pool,
    compiles every kernel here. `progress(event)` gets `{"kernel", "index", "total", "stage"}` per kernel
    lowered ("lowered") and compiled in a worker ("compiled"). `defer=True` lowers and renders only: the
    kernels are `deferred` until `compile_deferred` (a memory plan needs no binaries)."""
    total = len(items)
    keys = [_same_kernel(item) for item, _ in items]
    # (None keys are never shared: each is a kernel of its own)
    distinct = len({key for key in keys if key is not None}) + sum(key is None for key in keys)
    compiles = _Compiles(device, jobs, distinct)
    records: list[timings.KernelTimes | None] = []
    kernels: list[Kernel] = []

    def compile_src(dev: Any, src: str) -> tuple[bytes | None, str | None, str | None]:
        if defer and dev.compiler is not None:
            return None, None, None
        return compiles.submit(src, len(kernels))

    lowered: dict[tuple, tuple[ScheduleItem, Kernel]] = {}  # `_same_kernel` key -> the first item and kernel
    templates: dict[tuple, str | None] = {}  # `_same_kernel` key -> its kernels' source template (`_renamed`)
    # the keys of more than one item: their first kernel's source is rendered as the group's template (once,
    # rather than again under a placeholder name when the second kernel of the group comes)
    repeated = {key for key, n in Counter(k for k in keys if k is not None).items() if n > 1}
    for i, (item, name) in enumerate(items):
        def report(event: dict, i: int = i) -> None:
            progress({**event, "index": i, "total": total})

        same = keys[i]
        with timings.kernel(name) as rec:
            if same in lowered:  # lowered already under another name (ResNet's repeated blocks): renamed
                kernels.append(_renamed(*lowered[same], item, name, compile_src, templates, same))
            else:
                kernels.append(_build_kernel(item, device, beam, name, tuned, report if progress else None,
                                             compile_src, templates if same in repeated else None, same))
                if same is not None:
                    lowered[same] = (item, kernels[-1])
        kernels[-1].deferred = defer and device.compiler is not None
        records.append(rec)
        if progress is not None:
            progress({"kernel": name, "index": i, "total": total, "stage": "lowered"})
    compiles.finish(kernels, records, progress)
    return kernels


def _same_kernel(item: ScheduleItem) -> tuple | None:
    """What lowering reads of a schedule item, where two items with equal keys lower to the same kernel but for
    its name and the tensor nodes its buffers hold: the AST (interned: equal ASTs are one object) and each
    buffer's op, dtype and shape (lowering reads nothing else of them). None (never shared) for the fused
    attention (its own lowering) and for items that pass one buffer twice (which positions a kernel keeps would
    be ambiguous)."""
    if is_fused_attention(item.ast) or len({id(b) for b in item.bufs}) != len(item.bufs):
        return None
    return item.ast, tuple((b.op, b.dtype, shape_of(b)) for b in item.bufs)


def _renamed(first_item: ScheduleItem, first: Kernel, item: ScheduleItem, name: str, compile_src: Any,
             templates: dict[tuple, str | None] | None = None, same: tuple | None = None) -> Kernel:
    """`first` (the kernel of `first_item`) as the kernel of `item` (equal `_same_kernel` keys `same`): the same
    UOps rendered under `name` (the group's source template in `templates`, rendered at its first renamed kernel,
    with the name put in: `pipeline.render_template`), its buffers `item`'s at the same positions; its compile is
    `compile_src`'s (the canonical source is the same: one binary)."""
    position = {id(b): i for i, b in enumerate(first_item.bufs)}
    bufs = [item.bufs[position[id(b)]] for b in first.bufs]
    launch = {"global_size": first.global_size, "vals": first.vals}
    if first.local_size is not None:
        launch["local_size"] = first.local_size
    template = None
    if templates is not None and same is not None:
        if same not in templates:  # (buffer sizes, hence the launch contract, are equal within a group)
            templates[same] = render_template(first.device, first.uops, bufs, launch)
        template = templates[same]
    src = render_renamed(first.device, name, first.uops, bufs, launch, template)
    binary, err, key = compile_src(first.device, src)
    return dataclasses.replace(first, name=name, src=src, binary=binary, bufs=bufs, line=item.line,
                               compile_error=err, cache_key=key, _program=None)


def compile_deferred(kernels: list[Kernel], jobs: int | None = None) -> None:
    """Compile the kernels `build_kernels(defer=True)` left `deferred` (in place), as `build_kernels` would have:
    through the disk cache, on the workers, each canonical source once."""
    todo = [k for k in kernels if k.deferred]
    if not todo:
        return
    compiles = _Compiles(todo[0].device, jobs)
    if sum(len(k.src) >= PARALLEL_MIN_SOURCE for k in todo) > 1:
        compiles.misses = 1  # nothing to lower meanwhile: every large source to the workers at once
    for i, k in enumerate(todo):
        k.binary, k.compile_error, k.cache_key = compiles.submit(k.src, i)
        k.deferred = False
    compiles.finish(todo, [None] * len(todo), None)


class _Compiles:
    """The compiles of one program's kernels (`build_kernels`): `submit(src, index)` compiles the `index`-th
    kernel's source here, finds it in the disk cache or in this program's earlier kernels, or sends it to a worker
    or, for a compiler that builds several sources at once (`Compiler.batch_max`: PoCL), keeps it for a batch (then
    (None, None, None)); `finish` builds the batches, waits for the workers and fills in their binaries."""

    def __init__(self, device: Any, jobs: int | None, distinct: int = 0) -> None:
        self.device = device
        self.jobs = search.compile_jobs() if jobs is None else jobs
        # a program of many distinct kernels: its first large source the disk cache lacks starts the workers and
        # goes to them (`_new`), as the small ones after it
        self.many = distinct >= MANY_KERNELS
        self.pool: Any = None
        # a cluster's workers (`search.use_evaluator`) compile every source the disk cache lacks, small ones too
        evaluator = search.current_evaluator()
        self.cluster_pool = evaluator.compile_pool(device) if evaluator is not None and device.compiler is not None \
            else None
        self.misses = 0  # large sources compiled here (the first: a program of one large kernel starts no worker)
        # canonical source (`Device.canonical_source`: kernels equal but for their names share one binary) ->
        # (future, kernel indices, cache key, the source sent)
        self.waiting: dict[str, tuple[Any, list[int], str | None, str]] = {}
        self.done: dict[str, tuple[bytes | None, str | None, str | None]] = {}  # canonical source -> result
        # a compiler with batches: the cache misses wait in `waiting` (with no future) for `finish` to build them
        # `batch_max` at a time (a cluster's workers compile each source on its own)
        self.batch = device.compiler.batch_max if device.compiler is not None and self.cluster_pool is None else 1

    def submit(self, src: str, index: int) -> tuple[bytes | None, str | None, str | None]:
        """(binary, error, cache key of a hit) as `_compile_cached`, or (None, None, None) while a worker has it."""
        dev = self.device
        if dev.compiler is None:
            return _compile_cached(dev, src)
        canon = dev.canonical_source(src)
        if canon in self.done:  # an identical kernel of this program was compiled (or found in the cache) already
            timings.cache_result("shared")
            return self.done[canon]
        if canon in self.waiting:  # ... or is being compiled in a worker
            self.waiting[canon][1].append(index)
            timings.cache_result("shared")
            return None, None, None
        result = self._new(src, canon, index)
        if result[0] is not None:
            self.done[canon] = result
        return result

    def _new(self, src: str, canon: str, index: int) -> tuple[bytes | None, str | None, str | None]:
        dev, jobs = self.device, self.jobs
        # a small source compiles here, unless this program has sent a large one to the workers already: then
        # its small ones follow (a model's weight packings and fills: ~1.4 s of ResNet-50's LLVM, which kept
        # this process, the one lowering, busiest while the workers waited)
        small = len(src) < PARALLEL_MIN_SOURCE and not self.waiting
        if self.cluster_pool is None and self.batch <= 1 and (jobs <= 1 or small):
            return _compile_cached(dev, src)
        key = compile_key(dev, src, canon)
        hit = cache.get("compile", key) if key is not None else None
        if hit is not None:
            timings.cache_result(True)
            return hit, None, key
        if self.batch > 1:
            timings.cache_result(False)
            self.waiting[canon] = (None, [index], key, src)
            return None, None, None
        if self.pool is None and self.cluster_pool is not None:
            self.pool = self.cluster_pool
        if self.pool is None:  # workers already running, else from the second large miss on (one compiled here),
            # or from the first in a program of many kernels (its workers start while it lowers the next kernels)
            self.pool = _POOLS.get((dev.kind, jobs)) or (_shared_pool(dev, jobs) if self.misses or self.many
                                                         else None)
        if self.pool is None:
            self.misses += 1
            return _compile_cached(dev, src)
        timings.cache_result(False)
        self.waiting[canon] = (self.pool.submit(dev.kind, src), [index], key, src)
        return None, None, None

    def _build_batches(self) -> dict[str, tuple[bytes, float]]:
        """The sources waiting for a batch (`submit`), built `batch` at a time: canonical source -> (binary, its
        share of the batch's seconds), each binary stored in the disk cache under its own source's key."""
        todo = [(canon, key, src) for canon, (fut, _, key, src) in self.waiting.items() if fut is None]
        built: dict[str, tuple[bytes, float]] = {}
        for at in range(0, len(todo), self.batch):
            group = todo[at:at + self.batch]
            start = time.perf_counter_ns()
            libs = self.device.compiler.compile_batch([src for _, _, src in group])
            end = time.perf_counter_ns()
            seconds = (end - start) / 1e9 / len(group)
            if profile.active is not None:  # the compile track of a profile trace, as `timings.phase` writes it
                prof = profile.active
                prof.span(profile.HOST, prof.host_thread("compile"), "compile", start, end, "compile",
                          {"kernels": len(group)})
            COMPILE_COUNTER["compiles"] += len(group)
            for (canon, key, src), lib in zip(group, libs):
                if key is not None:
                    cache.put("compile", key, lib, meta=_meta(self.device, src))
                built[canon] = (lib, seconds)
            if debug_level() >= 2:
                print(f"*** compiled {len(group)} kernels as one build: {timings.fmt_s(seconds * len(group))}",
                      file=sys.stderr)
        return built

    def finish(self, kernels: list[Kernel], records: list[timings.KernelTimes | None], progress: Any) -> None:
        device = self.device
        built = self._build_batches()
        for n, (canon, (fut, indices, key, src)) in enumerate(self.waiting.items()):
            if fut is None:  # built in a batch, here
                lib, seconds = built[canon]
                _deliver(kernels, records, indices, lib, seconds)
                if progress is not None:
                    progress({"kernel": kernels[indices[0]].name, "index": n, "total": len(self.waiting),
                              "stage": "compiled"})
                continue
            why = ""
            waited = time.perf_counter_ns()
            try:
                lib = fut.result()
            except Exception as e:  # noqa: BLE001 - the worker's message (or it died): compile here for the error
                lib = None
                why = str(e)
            if lib is None:
                try:
                    binary, _, _ = _compile_cached(device, src)
                except CompileError:
                    raise
                except Exception as e:
                    raise CompileError(f"kernel {kernels[indices[0]].name}: {why or e}") from None
                lib = binary
            else:
                COMPILE_COUNTER["compiles"] += 1
                if key is not None:
                    cache.put("compile", key, lib, meta=_meta(device, src))
            seconds = getattr(fut, "seconds", 0.0)
            if profile.active is not None:  # the compile track of a profile trace: the wait, the worker's own time
                prof = profile.active
                prof.span(profile.HOST, prof.host_thread("compile"),
                          f"compiled in a worker: {kernels[indices[0]].name}", waited, time.perf_counter_ns(),
                          "compile", {"cache": "miss", "worker_ms": seconds * 1e3})
            _deliver(kernels, records, indices, lib, seconds)
            if progress is not None:
                progress({"kernel": kernels[indices[0]].name, "index": n, "total": len(self.waiting),
                          "stage": "compiled"})
            if debug_level() >= 2:
                print(f"*** compiled {kernels[indices[0]].name} in a worker process: {timings.fmt_s(seconds)}",
                      file=sys.stderr)


def _deliver(kernels: list[Kernel], records: list[timings.KernelTimes | None], indices: list[int], lib: bytes,
             seconds: float) -> None:
    """Gives the kernels at `indices` (one source) their binary and adds its compile seconds to their records."""
    for j in indices:
        kernels[j].binary = lib
        rec = records[j]
        if rec is not None:
            rec.phases["compile"] = rec.phases.get("compile", 0.0) + seconds
            rec.total += seconds


# sources shorter than this compile in this process (LLVM takes ~10-20 ms on them: less than sending them to a
# worker and back on a busy machine); the large ones (matmul tiles, the fused attention) go to the workers
PARALLEL_MIN_SOURCE = 16 << 10

# a program lowering at least this many distinct kernels (`_same_kernel` keys) sends its first large source the
# disk cache lacks to the workers too, starting them then: with that many kernels to lower, the workers' start
# overlaps their lowering (ResNet-50's first convolution, ~0.1 s of LLVM, compiled here while the other core
# idled). A program of fewer keeps the rule above (one large kernel never waits for a worker's start); a program
# with no large source starts no worker whatever its count (the workers' start, ~0.1 s of CPU each, costs more
# than its small compiles: `kernels/small_kernels.tg`'s 20, all sent, took 0.2-0.3 s more CPU in all)
MANY_KERNELS = 8

# the worker processes of `build_kernels`, by (device kind, jobs): started on first need and kept for the process
# (a test session or a program compiling many programs starts them once); forgotten in a forked child (their pipes
# are the parent's), shut down at exit
_POOLS: dict[tuple[str, int], Any] = {}


def _shared_pool(device: Any, jobs: int) -> Any:
    key = (device.kind, jobs)
    if key not in _POOLS:
        _POOLS[key] = device.compile_pool(jobs)
    return _POOLS[key]


def _shutdown_pools() -> None:
    for pool in _POOLS.values():
        if pool is not None:
            try:
                pool.shutdown()
            except Exception:  # noqa: BLE001 - at exit: a worker that is gone already
                pass
    _POOLS.clear()


atexit.register(_shutdown_pools)
os.register_at_fork(after_in_child=_POOLS.clear)


def _var_names(nodes: list[UOp]) -> list[str]:
    """The dim variables (not `core_id`) of a kernel's nodes, in their kernel-argument order."""
    vs = sorted({u.arg for u in nodes if u.op is Ops.DEFINE_VAR and u.arg[0] != "core_id"}, key=str)
    return [v[0][len(VAR_PREFIX):] for v in vs]


def build_symbolic_kernel(item: ScheduleItem, device: Any, probe: dict[str, int], name: str,
                          opts: list | None = None, compile: bool = True) -> Kernel:
    """A kernel whose sizes are dim variables (`tgc.codegen.sizes`), checked by the bounds verifier at the
    `probe` sizes. Without `opts` it is the general kernel (no optimization: valid for every size); with
    them (the heuristic's choice at a representative size) it holds `checks`, what a launch must satisfy
    (sizes its splits divide, the least work its threads need), and `probe` must satisfy them. `vals` holds
    the probe values; a launch replaces them with the dims' values in the order of `Kernel.var_names`.
    OptError when an opt does not apply to the symbolic kernel. `compile=False`: lowered only (no binary: its
    template, name and source, for who needs no launch)."""

    if is_fused_attention(item.ast):
        return _symbolic_attention(item, device, probe, name, opts, compile)
    ast = prepare_ast(item.ast, device)
    checks: list[tuple[str, UOp, int]] = value_checks(item.ast)
    if opts:
        k = OptKernel(ast, device)
        for o in opts:
            k.apply(o)
        checks += [("divides", expr, amt) for expr, amt in k.assumptions]
        if any(o.op is OptOps.THREAD for o in opts):
            work = UOp.const(dtypes.index, 1)
            for r in OptKernel(ast, device).ranges():
                work = work * r.src[0]
            checks.append(("at least", work, 2 * MIN_WORK_PER_THREAD))
    return _symbolic_kernel(
        lambda vals: lower(ast, device, item.bufs, name, opts=list(opts or []), vals=vals),
        ast, item, device, probe, name, checks, compile)


def _symbolic_kernel(lower_at: Callable[[tuple[int, ...]], Any], template: UOp, item: ScheduleItem, device: Any,
                     probe: dict[str, int], name: str, checks: list, compile: bool) -> Kernel:
    """A symbolic kernel from `lower_at(vals)` (a lowering at the probe's values of the template's variables, in
    their order): lowered again when a pass folded a variable away, compiled, its grid at the probe sizes."""
    names = _var_names(template.toposort())
    low = lower_at(tuple(probe[n] for n in names))
    final = _var_names(low.uops)
    if final != names:  # a pass folded a variable away: lower again with the values in their final order
        names = final
        low = lower_at(tuple(probe[n] for n in names))
    binary, err, key = _compile_cached(device, low.src) if compile else (None, "not compiled", None)
    launch = low.launch
    grid = launch.get("grid")
    kern = Kernel(name=name, src=low.src, binary=binary, uops=low.uops, ast=low.ast, bufs=low.bufs,
                  global_size=launch.get("global_size", (1, 1, 1)), local_size=launch.get("local_size"),
                  vals=tuple(probe[n] for n in names), flops=0, bytes_moved=0, line=item.line, compile_error=err,
                  device=device, opts=low.applied, cache_key=key, var_names=tuple(names), checks=checks,
                  template=template, grid=grid)
    if grid is not None:  # the grid at the probe sizes, as `vals` holds the probe values
        kern.global_size = symbolic_grid(kern, probe)
    return kern


def _symbolic_attention(item: ScheduleItem, device: Any, probe: dict[str, int], name: str, opts: list | None,
                        compile: bool) -> Kernel:
    """`build_symbolic_kernel` of a fused attention (`attention.is_fused_attention`: the head dims constants, the
    batch axes, query rows or keys dims): `lower_attention`'s online-softmax kernel, whose partial row tiles and
    key blocks are masked at any size. Without `opts` the heuristic's form without threads; with them (an
    `AttentionKernel`'s, THREAD included) a launch checks that the work is enough for the threads."""
    checks: list[tuple[str, UOp, int]] = value_checks(item.ast)
    if opts and any(o.op is OptOps.THREAD for o in opts):
        k = attention_kernel(item, device, opts)  # (OptError where one does not apply)
        work = UOp.const(dtypes.index, 4 * max(k.spec.dv, 1))
        for r in (*k.spec.loops, k.spec.rj):
            work = work * r.src[0]
        checks.append(("at least", work, 2 * MIN_WORK_PER_THREAD))
    return _symbolic_kernel(lambda vals: lower_attention(item, device, name, opts or None, vals=vals),
                            item.ast, item, device, probe, name, checks, compile)


def symbolic_grid(k: Kernel, dims: dict[str, int]) -> tuple[int, int, int]:
    """A symbolic kernel's `global_size` at these dims: its grid expressions evaluated (GPUs), else as built."""
    if k.grid is None:
        return k.global_size
    env = {VAR_PREFIX + n: v for n, v in dims.items()}
    vals = [_eval_int(e, env) for e in k.grid]
    if any(v is None for v in vals):
        raise CompileError(f"kernel {k.name}: its grid depends on values the launch does not give")
    return (int(vals[0]), int(vals[1]), int(vals[2]))  # type: ignore[arg-type]


def symbolic_work(k: Kernel, dims: dict[str, int], bufs: list[UOp]) -> tuple[int, int]:
    """(flops, bytes moved) of a symbolic kernel's launch at these dims (`Kernel.flops`, `bytes_moved`)."""
    env = {VAR_PREFIX + n: v for n, v in dims.items()}
    if k.device.caps.gpu:  # every thread of the grid runs the per-thread program (`kernel_flops`)
        threads = 1
        for n in (*symbolic_grid(k, dims), *(k.local_size or ())):
            threads *= int(n)
        return round(count_work(k.uops, env) * threads), bytes_touched(k.ast, bufs)
    cores = max(int(k.global_size[0]), 1)
    flops = round(sum(count_work_each(k.uops, [{**env, "core_id": c} for c in range(cores)], groups=False)))
    return flops, bytes_touched(k.ast, bufs)


def value_checks(ast: UOp) -> list[tuple[str, UOp, int]]:
    """("at most", expr, limit) for every size a symbolic kernel casts to a narrower integer type, as a value
    rather than an index (argmax's count n, a dim used as a number): where the size may pass that type's
    largest value, a launch must check it, else the cast would wrap where a kernel compiled for the size
    computes in a wider type (argmax over more than 2^31 - 1 elements gives i64). A loop index cast so is
    checked by its loop's last value; a cast of other index arithmetic involving loops is not checked."""
    limits: dict[UOp, int] = {}  # expression -> the largest value it may take (the least over its casts)
    for u in ast.toposort():
        if u.op is not Ops.CAST or u.dtype is None or u.dtype.count != 1 or not u.dtype.is_int or \
                is_index(u.dtype) or not is_index(u.src[0].dtype):
            continue
        src, limit = u.src[0], int(min_max(u.dtype)[1])
        if src.op is Ops.RANGE:  # its values 0 .. end - 1 fit where end <= limit + 1
            expr, limit = src.src[0], limit + 1
        elif any(n.op in (Ops.RANGE, Ops.SPECIAL) for n in src.toposort()):
            continue
        else:
            expr = src
        if any(n.op is Ops.DEFINE_VAR for n in expr.toposort()) and expr.vmax > limit:
            limits[expr] = min(limits.get(expr, limit), limit)
    return [("at most", expr, limit) for expr, limit in limits.items()]


def launch_allows(k: Kernel, dims: dict[str, int]) -> bool:
    """Whether a symbolic kernel's launch checks hold at these dims (`build_symbolic_kernel`)."""
    return failed_check(k, dims) is None


def failed_check(k: Kernel, dims: dict[str, int]) -> tuple[str, UOp, int, int | None] | None:
    """The first of a symbolic kernel's launch checks that fails at these dims, with the value it found (None
    where the value cannot be computed), or None when they all hold."""
    env = {VAR_PREFIX + n: v for n, v in dims.items()}
    for what, expr, value in k.checks:
        got = _eval_int(expr, env)
        if got is None or (got % value if what == "divides" else got > value if what == "at most" else got < value):
            return what, expr, value, got
    return None


def size_text(u: UOp) -> str:
    """A launch check's expression of the dims as text (`M * N - 1`)."""
    if u.op is Ops.DEFINE_VAR:
        name = u.arg[0] if isinstance(u.arg, tuple) else u.arg
        return name[len(VAR_PREFIX):] if name.startswith(VAR_PREFIX) else name
    if u.op is Ops.CONST:
        return str(u.arg)
    if u.op is Ops.ADD and u.src[1].op is Ops.CONST and isinstance(u.src[1].arg, int) and u.src[1].arg < 0:
        return f"{size_text(u.src[0])} - {-u.src[1].arg}"
    words = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%"}
    if u.op in words and len(u.src) == 2:
        a, b = (size_text(x) if x.op in (Ops.DEFINE_VAR, Ops.CONST, Ops.MUL) or x.op is u.op else
                f"({size_text(x)})" for x in u.src)
        return f"{a} {words[u.op]} {b}"
    return "(a size)"


def check_failure_text(failed: tuple[str, UOp, int, int | None]) -> str:
    """Why a launch check (`failed_check`) fails, in words."""
    what, expr, value, got = failed
    have = f"{size_text(expr)} = {got}" if got is not None else f"{size_text(expr)} (not computable here)"
    if what == "at most":
        return f"{have} passes {value}, the largest value of the type the kernel computes it in"
    if what == "divides":
        return f"{have} is not a multiple of {value}"
    return f"{have} is below {value}"


def bytes_touched(ast: UOp, bufs: list[UOp | None]) -> int:
    """Bytes a launch reads and writes, counting each element it can reach once (what GB/s is computed from).

    Per buffer: the smallest of its size and the sum, over its loads and stores, of the elements each can
    reach: at most one per combination of the loop, thread and kernel variables its index uses, and at most
    the span of the index inside the buffer (a gated load outside the buffer reads nothing). An upper
    bound: a strided slice `x[::16]` counts a sixteenth of `x`, a matmul's operands once each.
    """
    reach: dict[int, int] = {}
    for u in ast.toposort():
        if u.op not in (Ops.LOAD, Ops.STORE) or not u.src or u.src[0].op is not Ops.DEFINE_GLOBAL:
            continue
        i = u.src[0].arg
        if not isinstance(i, int) or not 0 <= i < len(bufs) or bufs[i] is None:
            continue  # (None: a buffer whose loads the lowering folded away later)
        size = prod(shape_of(bufs[i]))
        index = u.src[1]
        nodes = index.toposort()
        lo, hi = index.vmin, index.vmax
        width = (u.dtype if u.op is Ops.LOAD else u.src[2].dtype).count  # a vector access: its lanes
        span = size
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and abs(lo) != INF and abs(hi) != INF:
            span = max(min(int(hi) + width - 1, size - 1) - max(int(lo), 0) + 1, 0)
        if any(n.op is Ops.LOAD for n in nodes):  # a data-dependent index: anything in its span
            count = span
        else:
            combos = 1
            for n in nodes:
                if n.op in (Ops.RANGE, Ops.SPECIAL, Ops.DEFINE_VAR):
                    combos *= max(int(n.vmax) - int(n.vmin) + 1, 0)
            count = min(combos * width, span)
        reach[i] = min(reach.get(i, 0) + count, size)
    return sum(n * bufs[i].dtype.itemsize for i, n in reach.items())


INF = float("inf")


COMPILE_COUNTER = {"compiles": 0}


# a kernel's name in its source: the PYTHON device's JSON, LLVM IR's kernel (helpers are `define internal`), or
# an OpenCL, CUDA or Metal kernel function
_KERNEL_NAME = re.compile(r'"kernel":\s*"([^"\\]+)"|^define void @"?([\w.$]+)"?\s*\(|'
                          r'(?:__kernel|__global__|\bkernel)\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s+)?(\w+)\s*\(',
                          re.M)


def _meta(device: Any, src: str) -> str:
    """What `tgc cache list` shows of a compiled kernel: its device and name (else its source's first line)."""
    m = _KERNEL_NAME.search(src or "")
    name = next((g for g in m.groups() if g), "") if m else ""
    return f"{device.kind} {name or (src[:60].splitlines()[0] if src else '')}"


def recompile(device: Any, src: str, key: str, why: str) -> bytes:
    """Compile `src` again because the cached binary under `key` was unusable: drop it, store the new one."""
    cache.invalidate("compile", key, why)
    COMPILE_COUNTER["compiles"] += 1
    lib = device.compiler.compile(src)
    cache.put("compile", key, lib, meta=_meta(device, src))
    return lib


def _compile_cached(device: Any, src: str) -> tuple[bytes | None, str | None, str | None]:
    """(binary, None, key of the cache hit or None) or (None, why not, None)."""
    comp = device.compiler
    if comp is None:
        device.lint(src)  # a device that cannot compile here may still check (METAL)
        return None, device.compile_error or f"no compiler for {device.kind} on this machine", None
    key = compile_key(device, src)
    if key is not None:
        hit = cache.get("compile", key)
        if hit is not None:
            timings.cache_result(True)
            return hit, None, key
    COMPILE_COUNTER["compiles"] += 1
    timings.cache_result(False)
    with timings.phase("compile"):
        lib = comp.compile(src)
    if key is not None:
        cache.put("compile", key, lib, meta=_meta(device, src))
    return lib, None, None
