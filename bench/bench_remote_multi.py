"""Two REMOTE servers against local devices: the overhead of `REMOTE:0,REMOTE:1` on loopback.

`remote_pair_overhead()` starts two `tgc serve -d CPU` processes on free loopback ports and measures, in one run:

- a copy of a small and a large byte range between two buffers: locally (host-staged, what a copy between two
  local devices without a direct path does) and between the two servers through the client
  (`RemoteDevice.copy_batch`, sent at once);
- a small and a large program sharded on `REMOTE:0,REMOTE:1` against `CPU:0,CPU:1`, where `Program.run` takes a
  device list (`shard=`); where it does not yet, those rows say so instead of a time.

`bench/bench.py` calls it as `remote_pair_overhead(quick)` and prints `format_rows(rows)`; run alone:
`python bench/bench_remote_multi.py [--quick] [--json]`. Timings on a shared machine are noisy: compare the
ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tgc  # noqa: E402
from tgc.backends import get_device  # noqa: E402
from tgc.backends.remote.process import ServerProcess  # noqa: E402
from tgc.errors import TgcError  # noqa: E402

PROGRAMS = [  # name, source, input shapes, the input sharded and its axis
    ("small: sum 4096", "x: f32[N]\nreturn sum(x * 2 + 1)\n", {"x": (4096,)}, ("x", 0)),
    ("large: sum 4M", "x: f32[N]\nreturn sum(x * 2 + 1)\n", {"x": (4 << 20,)}, ("x", 0)),
]


def _median_time(fn: Any, repeat: int) -> float:
    fn()  # once untimed: compiles, loads, opens connections
    times = []
    for _ in range(repeat):
        st = time.perf_counter()
        fn()
        times.append(time.perf_counter() - st)
    return statistics.median(times)


def _copy_rows(r0: Any, r1: Any, sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    from tgc.backends.remote.client import RemoteDevice
    cpu = get_device("CPU")
    rows = []
    for n in sizes:
        src = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
        a, b = cpu.allocator.alloc(n), cpu.allocator.alloc(n)
        cpu.allocator.copyin(a, memoryview(src))

        def local(a: Any = a, b: Any = b, n: int = n) -> None:
            staging = bytearray(n)
            cpu.allocator.copyout(memoryview(staging), a)
            cpu.allocator.copyin(b, memoryview(staging))

        h0, h1 = r0.allocator.alloc(n), r1.allocator.alloc(n)
        r0.allocator.copyin(h0, memoryview(src))
        r0.flush(), r1.flush()

        def remote(h0: int = h0, h1: int = h1, n: int = n) -> None:
            RemoteDevice.copy_batch([(r0, h0, 0, r1, h1, 0, n)], wait=True)

        trips = r0.round_trips + r1.round_trips
        lt, rt = _median_time(local, repeat), _median_time(remote, repeat)
        trips = (r0.round_trips + r1.round_trips - trips) / (repeat + 1)
        rows.append({"what": f"copy {n} bytes", "bytes": n, "local_s": lt, "remote_s": rt, "round_trips": trips})
        cpu.allocator.free(a, n), cpu.allocator.free(b, n)
        r0.allocator.free(h0, n), r1.allocator.free(h1, n)
    return rows


def _program_rows(repeat: int, quick: bool) -> list[dict[str, Any]]:
    rows = []
    rng = np.random.default_rng(1)
    for name, src, shapes, (sharded, axis) in PROGRAMS[:1] if quick else PROGRAMS:
        inputs = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
        prog = tgc.loads(src)
        row: dict[str, Any] = {"what": f"program {name}", "bytes": sum(x.nbytes for x in inputs.values())}
        try:
            times = {}
            for devices in ("CPU:0,CPU:1", "REMOTE:0,REMOTE:1"):
                def run(d: str = devices, prog: Any = prog, shard: dict = {sharded: axis},  # noqa: B006
                        inputs: dict = inputs) -> None:
                    prog.run(device=d, shard=shard, **inputs)
                remotes = [get_device(d) for d in devices.split(",")] if devices.startswith("REMOTE") else []
                trips = sum(r.round_trips for r in remotes)
                times[devices] = _median_time(run, repeat)
                if remotes:
                    row["round_trips"] = (sum(r.round_trips for r in remotes) - trips) / (repeat + 1)
            row.update(local_s=times["CPU:0,CPU:1"], remote_s=times["REMOTE:0,REMOTE:1"])
        except (TgcError, TypeError) as e:  # no device lists yet (or no `shard=`): say so
            row["skipped"] = getattr(e, "msg", str(e))
        rows.append(row)
    return rows


def remote_pair_overhead(quick: bool = False, repeat: int | None = None) -> list[dict[str, Any]]:
    """Rows of {what, bytes, local_s, remote_s[, round_trips]} (or `skipped`: why), measured in one run;
    `round_trips` are those of both servers together, per copy or run."""
    repeat = repeat or (3 if quick else 10)
    sizes = [4096, 1 << 20] if quick else [4096, 32 << 20]
    saved = os.environ.get("TGC_REMOTE")
    from tgc import backends
    with ServerProcess("CPU") as a, ServerProcess("CPU") as b:
        os.environ["TGC_REMOTE"] = f"{a.address},{b.address}"
        try:
            r0, r1 = get_device("REMOTE:0"), get_device("REMOTE:1")
            rows = _copy_rows(r0, r1, sizes, repeat) + _program_rows(repeat, quick)
        finally:
            for key in [k for k in backends._instances if k[0] == "REMOTE"]:
                backends._instances.pop(key).close()
            if saved is None:
                os.environ.pop("TGC_REMOTE", None)
            else:
                os.environ["TGC_REMOTE"] = saved
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    out = ["REMOTE:0,REMOTE:1 (two `tgc serve -d CPU` on 127.0.0.1) against local, median per run",
           f"{'what':<28}{'bytes':>12}{'local':>12}{'REMOTE':>12}{'overhead':>12}{'ratio':>8}{'trips':>7}"]
    for r in rows:
        if "skipped" in r:
            out.append(f"{r['what']:<28}{r['bytes']:>12}  skipped: {r['skipped']}")
            continue
        lt, rt = r["local_s"], r["remote_s"]
        trips = f"{r['round_trips']:>7.1f}" if "round_trips" in r else f"{'-':>7}"
        out.append(f"{r['what']:<28}{r['bytes']:>12}{lt * 1e3:>10.3f}ms{rt * 1e3:>10.3f}ms{(rt - lt) * 1e3:>10.3f}ms"
                   f"{rt / lt if lt else float('inf'):>7.1f}x{trips}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats (a smoke run)")
    ap.add_argument("-r", "--repeat", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = remote_pair_overhead(a.quick, a.repeat)
    print(json.dumps(rows, indent=1) if a.json else format_rows(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
