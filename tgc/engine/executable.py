"""One executable (issue 21 item 0): what every single-device way of running a program produces, and the one
`run` and one `bench` that consume it.

An `Executable` (defined beside the realizer that runs it, `tgc.engine.realize`, and re-exported here with
`Launch` and `Chunks`) is a device, a list of steps over planned buffers, and the names the inputs and outputs
come under:

- `Launch(kernel)`: launch a `LaunchableKernel` (tgc/interfaces.py: a compiled `Kernel` or a package's
  `PackagedKernel`) on its buffers (`kernel.bufs`: buffer keys, tensor nodes or `BufferSpec`s) with its
  launch sizes and `vals` (a symbolic kernel's sizes are bound into them when it is made, at launch time);
- the buffers are placed by the executable's memory plan (`memory_plan()`: computed on first use, or the one a
  package carries);
- `chunks` (a `Chunks`, or None): the steps are one chunk of the program, repeated over equal axis-0 slices of
  the inputs it names (`tgc.engine.chunk`), each chunk's outputs written into the whole outputs.

Who makes one: `Program.lower` (one device, the program's kernels), `Program.lower_symbolic` (the size class's
kernels bound to the dims), `Chunking.executable()` (a chunked run), `Package.lower` (a package's saved form:
kernels, buffers and memory plan; see docs/DESIGN.md "One executable"), the program cache's entry (a package,
plus its chunks). `run(exe, arrays)` runs it once; with `replay` (a program's or package's `LaunchPlans` and a
key) the executable is kept bound to buffers of its own and replayed as one device graph from its second run
(`tgc.engine.realize.LaunchPlan`); `bench(exe, arrays)` times it as `run` runs it. A device list's program is
not yet an Executable: it is a `tgc.engine.multi.MultiLowered`, whose typed steps (`DeviceLaunches`,
`CollectiveStep`: `MultiLowered.steps()`) `run_multi` walks; the same `run` and `bench` take it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tgc.engine import bench as bench_mod
from tgc.engine import realize
from tgc.engine.multi import MultiLowered, bench_multi, run_multi
from tgc.engine.realize import Chunks, Executable, Launch


def run(exe: Executable | MultiLowered, arrays: dict[str, np.ndarray], replay: realize.LaunchPlans | None = None,
        key: Any = None) -> dict[str, np.ndarray]:
    """Run `exe` on `arrays` (by input name); {output name: array}. A device list's program (`MultiLowered`):
    its steps (`MultiLowered.steps()`) by `run_multi`, outputs brought back whole. Chunked: every chunk, from
    the user's arrays into the whole outputs (`realize.run_chunked`). Else with `replay` (launch plans kept
    between runs) at `key`: the first run at a key runs once (zero-copy where the device allows), the second
    binds the executable to buffers of its own and from then on replays it as one device graph; without
    `replay`, once."""
    if isinstance(exe, MultiLowered):
        return run_multi(exe, arrays).outputs
    if exe.chunks is not None:
        return realize.run_chunked(exe, exe.chunks.count, set(exe.chunks.sliced), arrays)
    if replay is not None:
        return replay.run(key, lambda: exe, arrays)
    return realize.run_program(exe, arrays)


def bench(exe: Executable | MultiLowered, arrays: dict[str, np.ndarray], repeat: int = 10, warmup: int = 1,
          measure_peak: bool = True) -> dict[str, Any]:
    """Time `exe` as `run` runs it: each kernel on its own and the whole program (one device graph where the
    device has them, `tgc.engine.bench.bench_launches`); chunked, each kernel as it runs on one chunk and the
    whole program in chunks (`program["chunks"]`); a device list's, per device and the collectives
    (`bench_multi`; no peak figures)."""
    if isinstance(exe, MultiLowered):
        return bench_multi(exe, arrays, repeat=repeat, warmup=warmup)
    if exe.chunks is None:
        return bench_mod.bench_launches(exe, arrays, repeat=repeat, warmup=warmup, measure_peak=measure_peak)
    count, sliced = exe.chunks.count, exe.chunks.sliced
    part = {}
    for _b, name in exe.inputs:
        arr = arrays[name]
        part[name] = arr[:arr.shape[0] // count] if name in sliced else arr
    timing = bench_mod.bench_launches(exe.one_chunk(), part, repeat=repeat, warmup=warmup,
                                      measure_peak=measure_peak)
    whole = bench_mod.timed_runs(lambda: run(exe, arrays), repeat, warmup)
    return bench_mod.chunked_timing(timing, whole, count)


__all__ = ["Chunks", "Executable", "Launch", "bench", "run"]  # (the types re-exported from tgc.engine.realize)
