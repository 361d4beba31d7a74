"""CPU graphs: every kernel of a launch plan run by one native call, without a Python-level launch per kernel.

One small function, `tgc_graph_run`, written here in LLVM IR and compiled once per machine (then loaded from
the disk cache like a kernel, so a cached run never imports llvmlite), walks a table of launches:

    row i = [entry address, chunks, after the previous row?, nargs, arg 0, ..., arg MAX_ARGS-1]   (int64 words)

and calls each kernel as `entry(arg 0, ..., arg nargs-1, core_id)`. It calls every entry with MAX_ARGS 64-bit
arguments, the core id stored into slot `nargs`: under the x86-64 System V ABI the caller owns the stack
arguments and a callee reads only its own (an `i32` from the low half of its slot), so one compiled function
calls kernels of any arity up to MAX_ARGS - 1. Kernels with more arguments make no graph (per-kernel launches).

Parallel kernels stay parallel: a graph whose widest kernel is split in C chunks (its global size, the core ids
it splits its outer loop by) is run by T = min(C, the device's cores) threads at once, each calling
`tgc_graph_run` with its core id (core 0 on the calling thread, the others on the device's pool, one hand-off
per graph run instead of one per kernel). The chunks are claimed, not assigned: each row has a run state of
three counters (chunks claimed, chunks done, threads asleep waiting for them), and a thread at a row claims
chunk ids with an atomic add until none is left, calling the kernel with each (every chunk id runs exactly once,
by whichever thread claims it: the same kernels on the same chunks, so the same bits). Before claiming from a
row, a thread waits until the previous row's chunks are all done (not until every thread arrives: a thread late
by a time slice holds up the others only when it holds a chunk); it waits spinning with `pause`, then yielding,
then sleeping on the done counter's futex (so that threads oversubscribing the cores do not spin away the time of
the thread they wait for), woken by whoever finishes the row's last chunk.

A run's state is zeroed and the run opened (its ticket, odd, stored in the gate) by the calling thread before it
hands out the workers. A worker enters by counting itself in the gate, then reading the ticket: a worker that
starts after its run closed (its pool thread was busy or descheduled) finds another ticket, counts itself out
and returns, having touched nothing else (the pool's task keeps the state's array alive). The calling thread,
done with the last row, closes the gate (ticket + 1) and waits until no worker is counted in: when
`tgc_graph_run` returns on it, every chunk is done and no thread touches this run's table or counters, so the
next run (or a Ctrl-C, held back on the calling thread during the native call) finds nothing running. Only one
multi-thread graph runs at a time on a device (the device's `graph_lock`); a run from another Python thread
waits for it.

On a busy machine a graph runs on the calling thread alone (`oversubscribed`): while the other runnable tasks
(`/proc/loadavg`'s count, sampled at most every LOAD_SAMPLE_S) and the graph's threads together exceed the
cores, a worker would often start a time slice late or lose its core while holding a chunk. The calling thread
then walks the same table alone (ticket 0: no gate, no counters), calling each kernel with every core id in turn:
the same kernels on the same chunks in the same order, so the results are the same bits. SqueezeNet at load ~13
on 2 cores, runs interleaved in one process (with the barrier this replaced): median 131 ms threaded, 35 ms
serial (onnxruntime 38 ms).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from array import array
from typing import Any

import numpy as np

MAX_ARGS = 64
HEAD = 4  # entry, chunks, after the previous row, nargs
ROW = HEAD + MAX_ARGS
STATE_ROW = 16  # int32 words of a run's state per row (claimed, done, sleepers; a cache line), and its head
IR_VERSION = 3  # bump when the IR below changes (the compiled object is cached under it)
# a wait (for a row's chunks done, for the workers to leave a run): SPINS rounds of `pause`, then sched_yield until
# YIELDS rounds, then sleep on a futex (Linux x86-64: syscall 202; FUTEX_WAIT/WAKE with FUTEX_PRIVATE_FLAG)
SPINS, YIELDS = 64, 96
SYS_FUTEX, FUTEX_WAIT, FUTEX_WAKE = 202, 128, 129
SYMBOL = "tgc_graph_run"
LOAD_SAMPLE_S = 0.05  # how long one reading of the runnable tasks (`oversubscribed`) is used


def runnable_tasks(loadavg: str) -> int | None:
    """The tasks runnable now, from the text of `/proc/loadavg` ("0.50 0.40 0.30 3/1234 5678": the 3, which
    counts the reader itself), or None where the text has no such field."""
    parts = loadavg.split()
    if len(parts) < 4 or "/" not in parts[3]:
        return None
    try:
        return int(parts[3].split("/")[0])
    except ValueError:
        return None


_SAMPLE: list[float] = [-1.0, 0.0]  # (when read, the runnable tasks other than the reader)


def oversubscribed(threads: int, cores: int) -> bool:
    """Whether `threads` more threads would oversubscribe the machine: the other runnable tasks (sampled at most
    every LOAD_SAMPLE_S; never where `/proc/loadavg` cannot be read) plus `threads` exceed `cores`."""
    now = time.monotonic()
    if now - _SAMPLE[0] > LOAD_SAMPLE_S:
        try:
            with open("/proc/loadavg") as f:
                n = runnable_tasks(f.read())
        except OSError:
            n = None
        _SAMPLE[0], _SAMPLE[1] = now, float(max((n or 1) - 1, 0))
    return _SAMPLE[1] + threads > cores


def _cores() -> int:
    """The cores this process may run on (a device's `cores` may be more: `TGC_THREADS`)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _wait_ir(name: str, ok: str) -> str:
    """The IR of `name(ptr word, i32 need, ptr sleepers)`: a wait until `ok` holds of %cur (the word's value):
    SPINS rounds of `pause`, then sched_yield until YIELDS rounds, then sleep on the word's futex (the sleepers
    word counted up while asleep, for whoever changes the word to see and wake)."""
    return f"""
define internal void @{name}(ptr %word, i32 %need, ptr %sleepp) {{
entry:
  br label %spin
spin:
  %k = phi i32 [0, %entry], [%k1, %again]
  %cur = load atomic i32, ptr %word acquire, align 4
  %ok = {ok}
  br i1 %ok, label %out, label %wait
wait:
  %k1 = add i32 %k, 1
  %few = icmp ult i32 %k1, {SPINS}
  br i1 %few, label %pause, label %notfew
notfew:
  %some = icmp ult i32 %k1, {YIELDS}
  br i1 %some, label %yield, label %sleep
pause:
  call void @llvm.x86.sse2.pause()
  br label %again
yield:
  %y = call i32 @sched_yield()
  br label %again
sleep:
  %s0 = atomicrmw add ptr %sleepp, i32 1 seq_cst
  %z = call i64 (i64, ...) @syscall(i64 {SYS_FUTEX}, ptr %word, i32 {FUTEX_WAIT}, i32 %cur, ptr null)
  %s1 = atomicrmw sub ptr %sleepp, i32 1 seq_cst
  br label %again
again:
  br label %spin
out:
  ret void
}}
"""


def graph_ir() -> str:
    """The LLVM IR of `tgc_graph_run(ptr table, i64 n, i64 core, ptr state, i64 ticket)` (module docstring)."""
    args = []
    lines = []
    for j in range(MAX_ARGS):
        lines += [f"  %p{j} = getelementptr i64, ptr %row, i64 {HEAD + j}",
                  f"  %r{j} = load i64, ptr %p{j}, align 8",
                  f"  %is{j} = icmp eq i64 %na, {j}",
                  f"  %a{j} = select i1 %is{j}, i64 %chunk, i64 %r{j}"]
        args.append(f"i64 %a{j}")
    loads = "\n".join(lines)
    wake = f"call i64 (i64, ...) @syscall(i64 {SYS_FUTEX}, ptr %%W, i32 {FUTEX_WAKE}, i32 2147483647)"
    return f"""
declare i32 @sched_yield()
declare i64 @syscall(i64, ...)
declare void @llvm.x86.sse2.pause()
{_wait_ir("tgc_wait_done", "icmp sge i32 %cur, %need")}
{_wait_ir("tgc_wait_left", "icmp eq i32 %cur, 0")}
define internal void @tgc_call(ptr %row, i64 %chunk) {{
entry:
  %fnp = load ptr, ptr %row, align 8
  %nap = getelementptr i64, ptr %row, i64 3
  %na = load i64, ptr %nap, align 8
{loads}
  call void %fnp({", ".join(args)})
  ret void
}}

define void @{SYMBOL}(ptr %tab, i64 %n, i64 %core, ptr %st, i64 %ticket) {{
entry:
  %alone = icmp eq i64 %ticket, 0
  br i1 %alone, label %aloop, label %enter
aloop:
  %ai = phi i64 [0, %entry], [%ainext, %anext]
  %adone = icmp uge i64 %ai, %n
  br i1 %adone, label %exit, label %abody
abody:
  %aoff = mul i64 %ai, {ROW}
  %arow = getelementptr i64, ptr %tab, i64 %aoff
  %atp = getelementptr i64, ptr %arow, i64 1
  %athr = load i64, ptr %atp, align 8
  br label %aclaim
aclaim:
  %ac = phi i64 [0, %abody], [%acn, %acall]
  %amore = icmp ult i64 %ac, %athr
  br i1 %amore, label %acall, label %anext
acall:
  call void @tgc_call(ptr %arow, i64 %ac)
  %acn = add i64 %ac, 1
  br label %aclaim
anext:
  %ainext = add i64 %ai, 1
  br label %aloop
enter:
  %t32 = trunc i64 %ticket to i32
  %genp = getelementptr i32, ptr %st, i64 1
  %closerp = getelementptr i32, ptr %st, i64 2
  %worker = icmp ne i64 %core, 0
  br i1 %worker, label %register, label %loop
register:
  %e0 = atomicrmw add ptr %st, i32 1 seq_cst
  %g = load atomic i32, ptr %genp seq_cst, align 4
  %open = icmp eq i32 %g, %t32
  br i1 %open, label %loop, label %leave
loop:
  %i = phi i64 [0, %enter], [0, %register], [%inext, %next]
  %end = icmp uge i64 %i, %n
  br i1 %end, label %finish, label %body
body:
  %off = mul i64 %i, {ROW}
  %row = getelementptr i64, ptr %tab, i64 %off
  %tp = getelementptr i64, ptr %row, i64 1
  %chunks = load i64, ptr %tp, align 8
  %c32 = trunc i64 %chunks to i32
  %cw = mul i64 %i, {STATE_ROW}
  %cw1 = add i64 %cw, {STATE_ROW}
  %claimp = getelementptr i32, ptr %st, i64 %cw1
  %donep = getelementptr i32, ptr %claimp, i64 1
  %sleepp = getelementptr i32, ptr %claimp, i64 2
  %bp = getelementptr i64, ptr %row, i64 2
  %bb = load i64, ptr %bp, align 8
  %after = icmp ne i64 %bb, 0
  br i1 %after, label %waitprev, label %claim
waitprev:
  %pdone = getelementptr i32, ptr %claimp, i64 {1 - STATE_ROW}
  %psleep = getelementptr i32, ptr %claimp, i64 {2 - STATE_ROW}
  %poff = sub i64 %off, {ROW}
  %ptp = getelementptr i64, ptr %tab, i64 %poff
  %ptp1 = getelementptr i64, ptr %ptp, i64 1
  %pchunks = load i64, ptr %ptp1, align 8
  %pc32 = trunc i64 %pchunks to i32
  call void @tgc_wait_done(ptr %pdone, i32 %pc32, ptr %psleep)
  br label %claim
claim:
  %c = atomicrmw add ptr %claimp, i32 1 seq_cst
  %more = icmp slt i32 %c, %c32
  br i1 %more, label %call, label %next
call:
  %c64 = sext i32 %c to i64
  call void @tgc_call(ptr %row, i64 %c64)
  %old = atomicrmw add ptr %donep, i32 1 seq_cst
  %old1 = add i32 %old, 1
  %last = icmp eq i32 %old1, %c32
  br i1 %last, label %wakeq, label %claim
wakeq:
  %sl = load atomic i32, ptr %sleepp seq_cst, align 4
  %anysl = icmp ne i32 %sl, 0
  br i1 %anysl, label %wake, label %claim
wake:
  %w = {wake.replace("%%W", "%donep")}
  br label %claim
next:
  %inext = add i64 %i, 1
  br label %loop
finish:
  br i1 %worker, label %leave, label %close
leave:
  %lo = atomicrmw sub ptr %st, i32 1 seq_cst
  %lastout = icmp eq i32 %lo, 1
  br i1 %lastout, label %leaveq, label %exit
leaveq:
  %cs = load atomic i32, ptr %closerp seq_cst, align 4
  %anyc = icmp ne i32 %cs, 0
  br i1 %anyc, label %lwake, label %exit
lwake:
  %lw = {wake.replace("%%W", "%st")}
  br label %exit
close:
  %shut = add i32 %t32, 1
  store atomic i32 %shut, ptr %genp seq_cst, align 4
  call void @tgc_wait_left(ptr %st, i32 0, ptr %closerp)
  br label %exit
exit:
  ret void
}}
"""


_LOCK = threading.Lock()
_RUNNER: tuple[Any, Any] | None = None  # (the loaded object, its ctypes function), once per process
ABI = {"ir_version": IR_VERSION, "max_args": MAX_ARGS, "row": ROW}  # what a packaged runner object must match


def runner_key(compiler: Any) -> str:
    from tgc import cache
    return cache.make_key("cpu-graph", IR_VERSION, MAX_ARGS, SPINS, YIELDS, compiler.cache_key)


def runner_object(compiler: Any) -> bytes:
    """The compiled object of `tgc_graph_run` (from the disk cache, else compiled now and stored there): what a
    CPU package ships so that it runs as a graph where the cache lacks it, without llvmlite."""
    from tgc import cache
    from tgc.backends.elf import load_object
    key = runner_key(compiler)
    lib = cache.get("compile", key)
    if lib is not None:
        try:
            load_object(lib)
            return bytes(lib)
        except ValueError:
            cache.invalidate("compile", key, "does not load")
    lib = compiler.compile(graph_ir())
    cache.put("compile", key, lib, meta="CPU graph runner")
    return bytes(lib)


def runner(compiler: Any, obj: bytes | None = None, may_compile: bool = True) -> Any:
    """The ctypes function of `tgc_graph_run`: the one loaded already in this process, else from the disk cache,
    else `obj` (the runner object a package ships, loaded by tgc.backends.elf), else (with `may_compile`)
    compiled by `compiler` (the CPU device's LLVM compiler) and stored in the cache.
    Raises an exception (CompileError, ElfLoadError, ImportError, RuntimeError) when it can be neither loaded
    nor compiled."""
    global _RUNNER
    with _LOCK:
        if _RUNNER is None:
            from tgc import cache
            from tgc.backends.elf import load_object
            key = runner_key(compiler)
            lib = cache.get("compile", key)
            image = None
            if lib is not None:
                try:
                    image = load_object(lib)
                except ValueError:
                    cache.invalidate("compile", key, "does not load")
            if image is None and obj is not None:
                image = load_object(obj)  # (an ElfLoadError: no graph, per-kernel launches)
            if image is None:
                if not may_compile:
                    raise RuntimeError("no compiled CPU graph runner here (not in the compile cache, not in the "
                                       "package), and a package run does not compile")
                lib = compiler.compile(graph_ir())
                cache.put("compile", key, lib, meta="CPU graph runner")
                image = load_object(lib)
            proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                     ctypes.c_int64)
            _RUNNER = (image, proto(image.address(SYMBOL)))
        return _RUNNER[1]


def _work(fn: Any, tab: int, n: int, core: int, state: int, ticket: int, keep: tuple) -> None:
    """A pool worker's part of a graph run. `keep` (the run state's array and the runner's loaded object) stays
    alive while the worker is queued: one that starts after its run ended still runs the runner's code, which
    reads the state's gate (module docstring)."""
    fn(tab, n, core, state, ticket)


class ArgGroup:
    """Buffer arguments of a graph that always point at one buffer (`CPUGraph.bind_args`): their table words and
    the buffer they point at now (held alive here)."""

    __slots__ = ("words", "handle")

    def __init__(self, words: np.ndarray, handle: Any):
        self.words, self.handle = words, handle


class CPUGraph:
    """A fixed list of CPU launches `(program, buffers, global_size, local_size, vals)` run by one native call per
    thread. The buffers are bound when the graph is built: it must be built again for other buffers.
    `defer_sigint` is tgc.backends.cpu's _sigint_deferred (Ctrl-C handling: a run's threads are out of it when
    the native call on the calling thread returns, so nothing is left running, unlike a launch's threads,
    `ABANDONED`), `address` its `data_address` (a buffer handle's data address)."""

    last_serial = False  # whether the last run went serially (a busy machine)

    def __init__(self, device: Any, launches: list[tuple], defer_sigint: Any, address: Any,
                 runner_object: bytes | None = None, compile_runner: bool = True):
        self.device, self.defer_sigint = device, defer_sigint
        self.fn = runner(device.compiler, runner_object, compile_runner)
        # the loaded code `fn` runs, held by every worker this graph queues (`_work`): a worker that starts after
        # the graph is gone, or after the process's runner was built again (tests do), still calls it
        self.runner_image = _RUNNER[0] if _RUNNER is not None and _RUNNER[1] is self.fn else None
        self.programs = [launch[0] for launch in launches]  # keep the loaded code alive while the graph lives
        # each launch's buffers (kept alive while the graph may run them; `rebind` replaces some)
        self.launch_bufs = [list(launch[1]) for launch in launches]
        self.address = address
        n = len(launches)
        table = np.zeros((max(n, 1), ROW), dtype=np.int64)
        chunks = [max(1, int(gs[0])) for _, _, gs, _, _ in launches]
        self.chunks = max(chunks, default=1)
        # the threads that claim the chunks: as many as the widest kernel's, at most the device's cores (a kernel
        # split in more chunks than that is claimed chunk by chunk all the same)
        self.threads = max(1, min(self.chunks, int(device.cores or 1)))
        # the rows' words as Python ints, made one array at once (a row's `np.array` cost more than its kernel's
        # launch); each buffer's address taken once: a buffer read by several kernels (a weight, an intermediate)
        # and a view, whose address is numpy's `.ctypes.data` (microseconds a call), come back for every kernel
        addrs: dict[int, int] = {}
        rows = []
        for i, (prog, bufs, _gs, _ls, vals) in enumerate(launches):
            args = [addrs[id(b)] if id(b) in addrs else addrs.setdefault(id(b), address(b)) for b in bufs] + \
                [int(v) for v in vals]
            if len(args) >= MAX_ARGS:
                raise ValueError(f"kernel {prog.name} takes {len(args) + 1} arguments; a CPU graph calls at most "
                                 f"{MAX_ARGS}")
            rows.append([prog.address, chunks[i], int(i > 0), len(args), *args])
        if rows:
            width = max(len(r) for r in rows)
            words = array("Q", [w for r in rows for w in r + [0] * (width - len(r))])
            table[:n, :width] = np.frombuffer(words, dtype=np.int64).reshape(n, width)
        self.table, self.n = table, n
        self.words = table.reshape(-1)  # (the table's words in one row: `rebind` writes some)
        # a run's state (module docstring): the gate (threads in the run, the open run's ticket, the closer
        # asleep), then per row its claimed chunks, its chunks done and the threads asleep waiting for them
        self.state = np.zeros(STATE_ROW * (n + 1), dtype=np.int32)
        self.ticket = 1  # odd: the open run's; ticket + 1 once it closed
        self.kernels = n
        self._args = (table.ctypes.data, n)  # (numpy's .ctypes costs a microsecond a call: taken once)
        self._state = self.state.ctypes.data

    def __call__(self, wait: bool = False) -> float | None:
        st = time.perf_counter()
        tab = self._args[0]
        self.last_serial = False
        if self.threads == 1:
            self.fn(tab, self.n, 0, self._state, 0)
        elif oversubscribed(self.threads, max(_cores(), int(self.device.cores or 1))):
            self.last_serial = True
            self.fn(tab, self.n, 0, self._state, 0)
        else:
            self._parallel(tab)
        return time.perf_counter() - st if wait else None

    def _parallel(self, tab: int) -> None:
        dev, t = self.device, self.threads
        with dev.graph_lock:
            pool = dev.pool(t)
            self.ticket = ticket = (self.ticket + 2) & 0x3FFFFFFF  # (stays odd)
            self.state[STATE_ROW:] = 0  # (every thread of the last run is out of it: see the module docstring)
            self.state[1] = ticket  # the run is open
            with self.defer_sigint():
                try:
                    for core in range(1, t):
                        try:
                            pool.submit(_work, self.fn, tab, self.n, core, self._state, ticket,
                                        (self.state, self.runner_image))
                        except RuntimeError:  # a pool shut down (the interpreter's exit): this thread claims the rest
                            break
                finally:
                    # (a Ctrl-C delivered to another thread of the process surfaces here at Python's next check,
                    # possibly inside `submit` after its work was queued: this thread still claims what is left,
                    # closes the run and waits for its workers, so no chunk runs after the call is gone)
                    self.fn(tab, self.n, 0, self._state, ticket)

    def bind_args(self, uses: list[tuple[int, int]], handle: Any) -> Any:
        """Buffer arguments `uses` ((launch, argument) pairs, all on `handle` now) as one group for `rebind`
        (their table words; the group, not the graph, holds the handle alive from now on)."""
        group = ArgGroup(np.array([i * ROW + HEAD + j for i, j in uses], dtype=np.intp), handle)
        for i, j in uses:
            self.launch_bufs[i][j] = None
        return group

    def rebind(self, group: Any, handle: Any) -> None:
        """Point a group of buffer arguments (`bind_args`) at `handle` (a buffer as large as the one it replaces):
        the next run reads or writes it there. Only between runs (the caller's run holds the graph: a chunked
        run's `realize.ChunkRuns` lock)."""
        self.words[group.words] = self.address(handle)
        group.handle = handle

    def free(self) -> None:
        pass
