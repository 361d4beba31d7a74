"""CPU graphs: every kernel of a launch plan run by one native call, without a Python-level launch per kernel.

One small function, `tgc_graph_run`, written here in LLVM IR and compiled once per machine (then loaded from
the disk cache like a kernel, so a cached run never imports llvmlite), walks a table of launches:

    row i = [entry address, threads, barrier before?, nargs, arg 0, ..., arg MAX_ARGS-1]   (int64 words)

and calls each kernel as `entry(arg 0, ..., arg nargs-1, core_id)`. It calls every entry with MAX_ARGS 64-bit
arguments, the core id stored into slot `nargs`: under the x86-64 System V ABI the caller owns the stack
arguments and a callee reads only its own (an `i32` from the low half of its slot), so one compiled function
calls kernels of any arity up to MAX_ARGS - 1. Kernels with more arguments make no graph (per-kernel launches).

Parallel kernels stay parallel: a graph whose widest kernel runs on T threads is run by T threads at once,
each calling `tgc_graph_run` with its core id (core 0 on the calling thread, the others on the device's pool,
one hand-off per graph run instead of one per kernel). Thread c runs the kernels with more than c threads;
a barrier (a counter and a generation word; spinning with `pause`, then yielding, then sleeping on a futex,
so that threads oversubscribing the cores do not spin away the time of the thread they wait for) separates two kernels
unless both run on core 0 alone. Only one multi-thread graph runs at a time on a device: two graphs sharing
the pool could otherwise each hold workers that wait at a barrier for a thread queued behind the other.

On a busy machine a graph runs on the calling thread alone (`oversubscribed`): while the other runnable tasks
(`/proc/loadavg`'s count, sampled at most every LOAD_SAMPLE_S) and the graph's threads together exceed the
cores, each barrier would wait for a thread the kernel's scheduler has put aside, often for a whole time
slice. The graph then walks a second table (`serial`) in which a kernel of T threads is T rows, one per core
id (the id stored as the row's last argument, so the same compiled `tgc_graph_run` calls it: the core id it
injects lands one slot past what the kernel reads), with no barriers: the same kernels on the same chunks in
the same order, so the results are the same bits. SqueezeNet at load ~13 on 2 cores, runs interleaved in one
process: median 131 ms threaded, 35 ms serial (onnxruntime 38 ms).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any

import numpy as np

MAX_ARGS = 64
HEAD = 4  # entry, threads, barrier before, nargs
ROW = HEAD + MAX_ARGS
IR_VERSION = 2  # bump when the IR below changes (the compiled object is cached under it)
# the barrier's wait: SPINS rounds of `pause`, then sched_yield until YIELDS rounds, then sleep on a futex
# (Linux x86-64: syscall 202; FUTEX_WAIT/WAKE with FUTEX_PRIVATE_FLAG) until the generation word changes
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


def graph_ir() -> str:
    """The LLVM IR of `tgc_graph_run(ptr table, i64 n, i64 core, ptr barrier, i64 nthreads)`."""
    args = []
    lines = []
    for j in range(MAX_ARGS):
        lines += [f"  %p{j} = getelementptr i64, ptr %row, i64 {HEAD + j}",
                  f"  %r{j} = load i64, ptr %p{j}, align 8",
                  f"  %is{j} = icmp eq i64 %na, {j}",
                  f"  %a{j} = select i1 %is{j}, i64 %core, i64 %r{j}"]
        args.append(f"i64 %a{j}")
    loads = "\n".join(lines)
    return f"""
declare i32 @sched_yield()
declare i64 @syscall(i64, ...)
declare void @llvm.x86.sse2.pause()

define internal void @tgc_barrier(ptr %bar, i64 %n) {{
entry:
  %genp = getelementptr i32, ptr %bar, i64 1
  %sleepp = getelementptr i32, ptr %bar, i64 2
  %g = load atomic i32, ptr %genp acquire, align 4
  %old = atomicrmw add ptr %bar, i32 1 acq_rel
  %n32 = trunc i64 %n to i32
  %last = sub i32 %n32, 1
  %islast = icmp eq i32 %old, %last
  br i1 %islast, label %release, label %spin
release:
  store atomic i32 0, ptr %bar monotonic, align 4
  %x = atomicrmw add ptr %genp, i32 1 seq_cst
  %sleepers = load atomic i32, ptr %sleepp seq_cst, align 4
  %anyone = icmp ne i32 %sleepers, 0
  br i1 %anyone, label %wake, label %done
wake:
  %w = call i64 (i64, ...) @syscall(i64 {SYS_FUTEX}, ptr %genp, i32 {FUTEX_WAKE}, i32 2147483647)
  br label %done
done:
  ret void
spin:
  %k = phi i32 [0, %entry], [%k1, %again]
  %cur = load atomic i32, ptr %genp acquire, align 4
  %same = icmp eq i32 %cur, %g
  br i1 %same, label %wait, label %out
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
  %z = call i64 (i64, ...) @syscall(i64 {SYS_FUTEX}, ptr %genp, i32 {FUTEX_WAIT}, i32 %g, ptr null)
  %s1 = atomicrmw sub ptr %sleepp, i32 1 seq_cst
  br label %again
again:
  br label %spin
out:
  ret void
}}

define void @{SYMBOL}(ptr %tab, i64 %n, i64 %core, ptr %bar, i64 %nthreads) {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%inext, %next]
  %done = icmp uge i64 %i, %n
  br i1 %done, label %exit, label %body
body:
  %off = mul i64 %i, {ROW}
  %row0 = getelementptr i64, ptr %tab, i64 %off
  %bp = getelementptr i64, ptr %row0, i64 2
  %bb = load i64, ptr %bp, align 8
  %needb = icmp ne i64 %bb, 0
  br i1 %needb, label %barrier, label %run
barrier:
  call void @tgc_barrier(ptr %bar, i64 %nthreads)
  br label %run
run:
  %tp = getelementptr i64, ptr %row0, i64 1
  %thr = load i64, ptr %tp, align 8
  %mine = icmp ult i64 %core, %thr
  br i1 %mine, label %call, label %next
call:
  %row = getelementptr i64, ptr %tab, i64 %off
  %fnp = load ptr, ptr %row, align 8
  %nap = getelementptr i64, ptr %row, i64 3
  %na = load i64, ptr %nap, align 8
{loads}
  call void %fnp({", ".join(args)})
  br label %next
next:
  %inext = add i64 %i, 1
  br label %loop
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


class CPUGraph:
    """A fixed list of CPU launches `(program, buffers, global_size, local_size, vals)` run by one native call per
    thread. The buffers are bound when the graph is built: it must be built again for other buffers.
    `abandoned` and `defer_sigint` are tgc.backends.cpu's ABANDONED and _sigint_deferred (Ctrl-C handling),
    `address` its `data_address` (a buffer handle's data address)."""

    serial: np.ndarray | None = None  # the launches as rows for the calling thread alone (module docstring)
    last_serial = False  # whether the last run went serially (a busy machine)

    def __init__(self, device: Any, launches: list[tuple], abandoned: Any, defer_sigint: Any, address: Any,
                 runner_object: bytes | None = None, compile_runner: bool = True):
        self.device, self.abandoned, self.defer_sigint = device, abandoned, defer_sigint
        self.fn = runner(device.compiler, runner_object, compile_runner)
        self.programs = [launch[0] for launch in launches]  # keep the loaded code alive while the graph lives
        self.bufs = [b for launch in launches for b in launch[1]]
        n = len(launches)
        table = np.zeros((max(n, 1), ROW), dtype=np.int64)
        threads = [max(1, int(gs[0])) for _, _, gs, _, _ in launches]
        self.threads = max(threads, default=1)
        for i, (prog, bufs, _gs, _ls, vals) in enumerate(launches):
            args = [address(b) for b in bufs] + [int(v) for v in vals]
            if len(args) >= MAX_ARGS:
                raise ValueError(f"kernel {prog.name} takes {len(args) + 1} arguments; a CPU graph calls at most "
                                 f"{MAX_ARGS}")
            table[i, 0] = prog.address
            table[i, 1] = threads[i]
            table[i, 2] = int(self.threads > 1 and i > 0 and not (threads[i - 1] == 1 and threads[i] == 1))
            table[i, 3] = len(args)
            table[i, HEAD:HEAD + len(args)] = np.array(args, dtype=np.uint64).view(np.int64)
        self.table, self.n = table, n
        self.barrier = np.zeros(4, dtype=np.int32)  # arrivals, generation, sleepers
        self.kernels = n
        self._args = (table.ctypes.data, n)  # (numpy's .ctypes costs a microsecond a call: taken once)
        self._bar = self.barrier.ctypes.data
        # the same launches on the calling thread alone (module docstring): a row per kernel and core id
        if self.threads > 1 and all(table[i, 3] + 1 < MAX_ARGS for i in range(n)):
            rows = []
            for i in range(n):
                for core in range(threads[i]):
                    row = table[i].copy()
                    row[1], row[2] = 1, 0
                    if threads[i] > 1:
                        row[HEAD + row[3]] = core
                        row[3] += 1
                    rows.append(row)
            self.serial = np.stack(rows)

    def __call__(self, wait: bool = False) -> float | None:
        st = time.perf_counter()
        tab, bar = self._args[0], self._bar
        self.last_serial = False
        if self.threads == 1:
            self.fn(tab, self.n, 0, bar, 1)
        elif self.serial is not None and oversubscribed(self.threads, max(_cores(), int(self.device.cores or 1))):
            self.last_serial = True
            self.fn(self.serial.ctypes.data, len(self.serial), 0, bar, 1)
        else:
            self._parallel(tab, bar)
        return time.perf_counter() - st if wait else None

    def _parallel(self, tab: int, bar: int) -> None:
        dev, t = self.device, self.threads
        with dev.graph_lock:
            pool = dev.pool(t)
            futures: list[Any] = []
            try:
                with self.defer_sigint():
                    for core in range(1, t):
                        futures.append(pool.submit(self.fn, tab, self.n, core, bar, t))
                    self.fn(tab, self.n, 0, bar, t)
                for f in futures:
                    f.result()
            except BaseException:  # Ctrl-C while waiting: the threads run on; keep what they use alive
                running = [f for f in futures if not f.done()]
                if running:
                    self.abandoned.add(self, list(self.bufs), running)
                raise

    def free(self) -> None:
        pass
