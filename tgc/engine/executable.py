"""One executable (issue 21 item 0): what every single-device way of running a program produces, and the one
`run` and one `bench` that consume it.

An `Executable` (defined beside the realizer that runs it, `tgc.engine.realize`, and re-exported here with
its step types) is a device (or a device list), a list of steps over planned buffers, and the names the inputs
and outputs come under:

- `Launch(kernel)`: launch a `LaunchableKernel` (tgc/interfaces.py: a compiled `Kernel` or a package's
  `PackagedKernel`) on its buffers (`kernel.bufs`: buffer keys, tensor nodes or `BufferSpec`s) with its
  launch sizes and `vals` (a symbolic kernel's sizes are bound into them when it is made, at launch time);
- the buffers are placed by the executable's memory plan (`memory_plan()`: computed on first use, or the one a
  package carries);
- on a device list (`Executable.across`, made by `tgc.engine.multi.build_executable`), `Launch(kernel, d)` on
  device d's buffers, `Copy` steps between buffers (of one device or two) and `Collective` steps (a ring
  all-reduce, a gather) over the devices' buffers; `InputPart`s say which rows of an input each device gets,
  `OutputPart`s which buffers an output is put together from; each device has a memory plan of its own;
- `chunks` (a `Chunks`, or None): the steps are one chunk of the program, repeated over equal axis-0 slices of
  the inputs it names (`tgc.engine.chunk`), each chunk's outputs written into the whole outputs.

Who makes one: `Program.lower` (one device, the program's kernels), `Program.lower_multi` (a device list),
`Program.lower_symbolic` (the size class's kernels bound to the dims), `Chunking.executable()` (a chunked run),
`Package.lower` (a package's saved form: kernels, buffers and memory plan; see docs/DESIGN.md "One
executable"), the program cache's entry (a package, plus its chunks). `run(exe, arrays)` runs it once; with
`replay` (a program's or package's `LaunchPlans` and a key) the executable is kept bound to buffers of its own
and replayed as one device graph from its second run (`tgc.engine.realize.LaunchPlan`); `bench(exe, arrays)`
times it as `run` runs it. A device list's executable runs by one walk over its steps (`_run_steps`):
consecutive launches run on all devices at once (a host thread per device), a copy or collective waits for
every device first. Its `bench` times the replay (`StepsPlan`: buffers allocated once, each device's runs of
launches as its device graph), as a list run again runs.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tgc import profile
from tgc.engine import realize
from tgc.engine.realize import (
    Buffer,
    Chunks,
    Collective,
    Copy,
    Executable,
    InputPart,
    Launch,
    OutputPart,
    buffer_type,
    to_user_array,
)
from tgc.env import debug_level
from tgc.errors import DeviceError, TgcError
from tgc.ir.shapes import prod

if TYPE_CHECKING:  # (device lists only: tgc.engine.multi, ~4 ms to import, is loaded by the walk that needs it)
    from tgc.engine.multi import Transfers


def run(exe: Executable, arrays: dict[str, np.ndarray], replay: realize.LaunchPlans | None = None,
        key: Any = None) -> dict[str, np.ndarray]:
    """Run `exe` on `arrays` (by input name); {output name: array}. On a device list: each device's part of the
    inputs copied in, every step in order, outputs brought back whole (`_run_steps`). Chunked: every chunk, from
    the user's arrays into the whole outputs (`realize.run_chunked`). Else with `replay` (launch plans kept
    between runs) at `key`: the first run at a key runs once (zero-copy where the device allows), the second
    binds the executable to buffers of its own and from then on replays it as one device graph; without
    `replay`, once."""
    if exe.multi:
        if replay is not None:
            return replay.run(key, lambda: exe, arrays, once=lambda low, a: _run_steps(low, a).outputs,
                              make=StepsPlan)
        return _run_steps(exe, arrays).outputs
    if exe.chunks is not None:
        return realize.run_chunked(exe, exe.chunks.count, set(exe.chunks.sliced), arrays)
    if replay is not None:
        return replay.run(key, lambda: exe, arrays)
    return realize.run_program(exe, arrays)


MAX_REPEAT = 1_000_000  # timed runs of one bench (a million 1 us launches take a second)


def counts_ok(repeat: Any, warmup: Any) -> bool:
    """Whether `repeat` is an integer in 1..MAX_REPEAT and `warmup` one in 0..MAX_REPEAT (a float or a bool is not)."""
    ints = all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in (repeat, warmup))
    return ints and 1 <= repeat <= MAX_REPEAT and 0 <= warmup <= MAX_REPEAT


def first_chunk_inputs(inputs: Any, arrays: dict[str, Any], count: int, sliced: Any) -> dict[str, Any]:
    """The inputs of a program's first chunk of `count`: `arrays` by the names of `inputs` (`(buffer, name)`
    pairs), the `sliced` ones cut to their first `1/count` rows (views), the rest whole."""
    part = {}
    for _b, name in inputs:
        arr = arrays[name]
        part[name] = arr[:arr.shape[0] // count] if name in sliced else arr
    return part


def bench(exe: Executable, arrays: dict[str, np.ndarray], repeat: int = 10, warmup: int = 1,
          measure_peak: bool = True) -> dict[str, Any]:
    """Time `exe` as `run` runs it: each kernel on its own and the whole program (one device graph where the
    device has them, `tgc.engine.bench.bench_launches`); chunked, each kernel as it runs on one chunk and the
    whole program in chunks (`program["chunks"]`); a device list's, per device and the collectives, replayed
    as a list run again is (`_bench_steps`; no peak figures). `repeat` is 1..MAX_REPEAT, `warmup` 0..MAX_REPEAT
    (else a TgcError, exit 2: a count past that is a typo that would time for days)."""
    from tgc.engine import bench as bench_mod  # (not on a warm run's start-up: it imports statistics)

    if not counts_ok(repeat, warmup):
        raise TgcError(f"cannot time {repeat} runs after {warmup} warm-up runs: the counts are 1..{MAX_REPEAT} and "
                       f"0..{MAX_REPEAT}", hint="use a smaller --repeat")

    if exe.multi:
        return _bench_steps(exe, arrays, repeat=repeat, warmup=warmup)
    if exe.chunks is None:
        return bench_mod.bench_launches(exe, arrays, repeat=repeat, warmup=warmup, measure_peak=measure_peak)
    count = exe.chunks.count
    part = first_chunk_inputs(exe.inputs, arrays, count, exe.chunks.sliced)
    timing = bench_mod.bench_launches(exe.one_chunk(), part, repeat=repeat, warmup=warmup,
                                      measure_peak=measure_peak)
    whole = bench_mod.timed_runs(lambda: run(exe, arrays), repeat, warmup)
    return bench_mod.chunked_timing(timing, whole, count)


@dataclass
class StepsRun:
    """A device list's run: its outputs, the bytes its collectives moved, and (timed) each device's kernel time,
    the collectives' time, and the compute time (inputs on the devices .. every step done; outputs not read)."""

    outputs: dict[str, np.ndarray]
    transfers: Transfers
    kernel_seconds: list[float]
    collective_seconds: float
    compute_seconds: float


class StepsPlan:
    """A device list's executable bound to buffers of its own on every device (allocated once, by each device's
    memory plan), for running it again and again (`run(exe, arrays, replay, key)` makes one at a key's second
    run, as `realize.LaunchPlans` does for one device). Each device's run of consecutive launches (between two
    copies or collectives) is that device's launch plan: captured once as a device graph over the plan's
    buffers (`Device.graph`; `graph_error` per run where the device has none or refused it, then its kernels
    launch one by one), and replayed on every later run; copies and collectives run as steps between them.
    One run at a time (`lock`); `free()` gives the graphs and buffers back."""

    def __init__(self, exe: Executable):
        self.low, self.exe = exe, exe
        self.buffers: list[dict[Any, Buffer]] = [{} for _ in exe.devices]
        self.graphs: dict[tuple[int, int], Any] = {}  # (run of launches, device) -> its graph, or None
        self.graph_errors: dict[tuple[int, int], str] = {}
        self.lock = threading.Lock()
        self.runs = 0
        self.broken = False
        try:
            for d in range(len(exe.devices)):
                realize.allocate_device(exe, d, self.buffers[d])
        except BaseException:
            self.free()
            raise

    def graph(self, segment: int, d: int, kernels: list) -> Any:
        """Device `d`'s graph of its launches in run `segment` (captured on first use), or None."""
        at = (segment, d)
        if at not in self.graphs:
            dev = self.exe.devices[d]
            launches = [(k.program(), [self.buffers[d][key].handle for key in k.bufs], k.global_size,
                         k.local_size, k.vals) for k in kernels]
            graph = None
            try:
                graph = dev.graph(launches, **(self.exe.graph_options_of[d] or {})) if realize.graphs_enabled() \
                    else None
                if graph is None:
                    self.graph_errors[at] = f"{dev.name} has no device graphs" if realize.graphs_enabled() \
                        else "TGC_GRAPH=0"
            except TgcError as e:
                self.graph_errors[at] = e.msg
            except Exception as e:  # no graph (too many arguments, no runner): launch each kernel
                self.graph_errors[at] = f"{type(e).__name__}: {e}"
            if at in self.graph_errors and debug_level() >= 2:
                print(f"*** {dev.name:<8} no graph for {len(kernels)} kernels: {self.graph_errors[at]}",
                      file=sys.stderr)
            self.graphs[at] = graph
        return self.graphs[at]

    def capture(self) -> None:
        """Capture every device's graph of every run of launches now (else on first use): `bench` does this
        before its clock starts, as a one-device bench captures its launch plan's graph. Not under `DEBUG>=2`,
        which launches one by one."""
        if debug_level() >= 2:
            return
        segment = 0
        for step in _schedule(self.exe):
            if isinstance(step, list):
                for d, kernels in enumerate(step):
                    if kernels:
                        self.graph(segment, d, kernels)
                segment += 1

    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            self.runs += 1
            return _run_steps(self.exe, arrays, plan=self).outputs
        except BaseException:
            self.broken = True
            raise

    def free(self) -> None:
        graphs, self.graphs = self.graphs, {}
        for g in graphs.values():
            if g is not None:
                try:
                    g.free()
                except Exception:
                    pass
        buffers, self.buffers = self.buffers, []
        for bufs in buffers:
            for buf in bufs.values():
                try:
                    buf.free()
                except Exception:  # a device that lost its memory: nothing to give back
                    pass

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:  # interpreter shutdown
            pass


def _schedule(exe: Executable) -> list[Any]:
    """A device list's steps as `_walk` takes them: each run of consecutive launches becomes one item, a list of
    every device's kernels (in order), between the `Copy` and `Collective` steps. A run's position among the
    runs is its segment number (the key of each device's graph in a `StepsPlan`)."""
    out: list[Any] = []
    launches: list[list] = [[] for _ in exe.devices]
    for step in exe.steps + [None]:
        if isinstance(step, Launch):
            launches[step.device].append(step.kernel)
            continue
        if any(launches):
            out.append(launches)
            launches = [[] for _ in exe.devices]
        if step is not None:
            out.append(step)
    return out


def _run_steps(exe: Executable, arrays: dict[str, np.ndarray], timed: bool = False,
               plan: StepsPlan | None = None) -> StepsRun:
    if profile.active is None:
        return _walk(exe, arrays, timed, plan)
    profile.active.aliases.update({dev.name: f"{dev.kind}:{dev.index}" for dev in exe.devices if ":" not in dev.name})
    how = {"as": "launch plans", "run": plan.runs} if plan is not None else {}
    with profile.host_span(f"run on {len(exe.devices)} devices", {"devices": [d.name for d in exe.devices],
                                                                   "steps": len(exe.collectives()), **how}):
        return _walk(exe, arrays, timed, plan)


def _walk(exe: Executable, arrays: dict[str, np.ndarray], timed: bool, plan: StepsPlan | None = None) -> StepsRun:
    """Allocate each device's planned buffers (or use `plan`'s), copy each device's part of the inputs in, run the
    steps (launches on all devices at once; with `plan`, each device's run of launches as its graph), copy the
    outputs out, free the buffers (not a plan's)."""
    from tgc.engine.multi import Transfers, copy_between, profile_collective, run_collective

    devices, n = exe.devices, len(exe.devices)
    buffers: list[dict[Any, Buffer]] = plan.buffers if plan is not None else [{} for _ in range(n)]
    stats = Transfers.for_devices(n)
    ktime = [0.0] * n
    level = debug_level()
    pending: list[Any] = []

    def run_kernels(d: int, kernels: list, segment: int) -> None:
        st = time.perf_counter()
        graph = plan.graph(segment, d, kernels) if plan is not None and level < 2 and kernels else None
        if graph is not None:
            prof = profile.active
            try:
                if prof is not None:
                    prof.graph(devices[d].name, kernels, lambda: graph(wait=True))
                else:
                    graph(wait=False)
            except TgcError:
                raise
            except Exception as e:  # a device failure is a runtime error, not a crash
                raise DeviceError(f"the graph of {len(kernels)} kernels failed on {devices[d].name}: {e}") from None
        else:
            inplace = exe.memory_plan(d).inplace if level >= 2 else []
            for k in kernels:  # (DEBUG=2 launches twice, except a kernel writing its output over its input)
                realize.launch(k, [buffers[d][key] for key in k.bufs],
                               in_place=any(out in k.bufs and src in k.bufs for out, src in inplace))
        if timed:
            devices[d].synchronize()
            ktime[d] += time.perf_counter() - st

    def each_device(per_device: list[list], segment: int) -> None:
        """Every device runs its kernels at once, each from its own host thread (a CPU kernel releases the GIL)."""
        if n == 1 or sum(1 for ks in per_device if ks) <= 1 or level >= 2:  # (DEBUG lines one device at a time)
            for d in range(n):
                run_kernels(d, per_device[d], segment)
            return
        pool = exe.threads()
        pending[:] = [pool.submit(run_kernels, d, per_device[d], segment) for d in range(n)]
        for f in pending:
            f.result()
        pending.clear()

    try:
        if plan is None:
            for d in range(n):
                realize.allocate_device(exe, d, buffers[d])
        for part in exe.inputs:  # each device's part of the inputs, before the clock starts
            _copy_in(exe, part, arrays[part.name], buffers[part.device][part.key], level)
        t0 = time.perf_counter()
        segment = 0
        for step in _schedule(exe):
            if isinstance(step, list):  # a run of launches, every device's
                each_device(step, segment)
                segment += 1
                continue
            for dev in devices:
                dev.synchronize()
            if isinstance(step, Copy):
                src = buffers[step.src_device][step.src]
                copy_between(devices[step.src_device], src.handle, devices[step.dst_device],
                             buffers[step.dst_device][step.dst].handle, src.nbytes, stats=stats,
                             ids=(step.src_device, step.dst_device))
                continue
            assert isinstance(step, Collective)
            before, received = list(stats.sent), list(stats.received)
            st, st_ns = time.perf_counter(), time.perf_counter_ns()
            what = run_collective(devices, step, buffers, stats)
            if profile.active is not None:
                profile_collective(profile.active, devices, what, step.index, st_ns, stats, before, received)
            if level >= 2:
                moved = ", ".join(f"{dev.name} sent {stats.sent[d] - before[d]} B" for d, dev in enumerate(devices))
                print(f"*** {what}: {moved} ({(time.perf_counter() - st) * 1e6:.2f} us)", file=sys.stderr)
        for dev in devices:
            dev.synchronize()
        compute = time.perf_counter() - t0
        result = {part.name: _copy_out(exe, part, buffers, level) for part in exe.outputs}
        for dev in devices:
            dev.synchronize()
        return StepsRun(result, stats, ktime, stats.seconds, compute)
    finally:
        if pending:  # an interrupted or failed run: no buffer is freed under a kernel still running
            from concurrent.futures import wait
            wait(pending)
        if plan is None:
            for bufs in buffers:
                for buf in bufs.values():
                    buf.free()


def _copy_in(exe: Executable, part: InputPart, arr: np.ndarray, buf: Buffer, level: int) -> None:
    if part.axis is not None and part.rows is not None:
        arr = arr[(slice(None),) * part.axis + (slice(*part.rows),)]
    buf.copyin(arr)
    if level >= 2:
        where = f"rows {part.rows[0]}:{part.rows[1]} of axis {part.axis}" if part.rows is not None else "replicated"
        print(f"*** copy in  {part.name} ({where}): {arr.nbytes} B host -> {exe.devices[part.device].name}",
              file=sys.stderr)


def _copy_out(exe: Executable, part: OutputPart, buffers: list[dict[Any, Buffer]], level: int) -> np.ndarray:
    """Output `part` brought back whole: its holders' buffers put together along its axis (the first alone when
    replicated)."""
    parts = []
    for d, key in part.holders if part.axis is not None else part.holders[:1]:
        dtype, shape = buffer_type(key)
        parts.append(buffers[d][key].numpy() if prod(shape) and key in buffers[d] else np.zeros(shape, dtype.np))
        if level >= 2:
            print(f"*** copy out {part.name}: {parts[-1].nbytes} B {exe.devices[d].name} -> host", file=sys.stderr)
    arr = parts[0] if part.axis is None else np.concatenate(parts, axis=part.axis)
    return to_user_array(arr, buffer_type(part.holders[0][1])[0])


def _bench_steps(exe: Executable, arrays: dict[str, np.ndarray], repeat: int = 10, warmup: int = 1
                 ) -> dict[str, Any]:
    """`tgc bench` on a device list: per device its kernels' time, the collectives' time and bandwidth (bytes
    each device sent over that time), and the whole program (inputs already on the devices, outputs not read
    back), each as median/min/max over `repeat` runs after `warmup`. Every run is a replay, as a list run again
    runs (`StepsPlan`): each device's buffers allocated once, before the first run, and each device's runs of
    launches as its device graph, captured before the clock starts; the plan is freed afterwards. A device's
    kernel time is its graph's (or its launches') until the device is done; `graph` says whether every run of
    launches ran as a graph."""
    plan = StepsPlan(exe)
    try:
        plan.capture()
        for _ in range(warmup):
            _run_steps(exe, arrays, plan=plan)
        runs = [_run_steps(exe, arrays, timed=True, plan=plan) for _ in range(max(repeat, 1))]
        graph = bool(plan.graphs) and all(g is not None for g in plan.graphs.values()) and debug_level() < 2
    finally:
        plan.free()

    def stats(xs: list[float]) -> dict[str, float]:
        import statistics  # (a bench's: not on a warm run's start-up)

        xs = sorted(xs)
        return {"median_s": statistics.median(xs), "min_s": xs[0], "max_s": xs[-1]}

    names = [dev.name for dev in exe.devices]
    launches = exe.launches()
    rows = []
    for d, name in enumerate(names):
        mine = [k for dd, k in launches if dd == d]
        st = stats([r.kernel_seconds[d] for r in runs])
        flops = sum(k.flops for k in mine)
        nbytes = sum(k.bytes_moved for k in mine)
        rows.append({"name": f"{name} kernels ({len(mine)})", "device": name, "kernels": len(mine), "flops": flops,
                     "bytes": nbytes, **st, "gflops": flops / st["median_s"] / 1e9 if st["median_s"] else None,
                     "gbps": nbytes / st["median_s"] / 1e9 if st["median_s"] else None})
    last = runs[-1].transfers
    coll = stats([r.collective_seconds for r in runs])
    per_dev = max(last.sent) if last.sent else 0
    kinds = [c.kind for c in exe.collectives()]
    collectives = {"steps": kinds, "sent_bytes": list(last.sent), "received_bytes": list(last.received), **coll,
                   "gbps": per_dev / coll["median_s"] / 1e9 if coll["median_s"] and per_dev else None}
    if kinds:
        rows.append({"name": "collectives (" + ", ".join(kinds) + ")", **coll,
                     "flops": 0, "bytes": per_dev, "gflops": None, "gbps": collectives["gbps"]})
    prog = stats([r.compute_seconds for r in runs])
    flops = sum(k.flops for _, k in launches)
    prog.update({"flops": flops, "bytes": sum(k.bytes_moved for _, k in launches), "graph": graph,
                 "gflops": flops / prog["median_s"] / 1e9 if prog["median_s"] else None})
    share = coll["median_s"] / prog["median_s"] if prog["median_s"] else None
    return {"devices": names, "kernels": rows, "collectives": {**collectives, "share_of_program": share},
            "program": prog, "peak": {"gflops": None, "gbps": None, "source": "unknown"}}


# (the types re-exported from tgc.engine.realize)
__all__ = ["Chunks", "Collective", "Copy", "Executable", "InputPart", "Launch", "OutputPart", "StepsPlan", "bench",
           "run"]
