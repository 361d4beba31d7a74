"""Profile traces: what ran, where and for how long, as a Chrome trace-event file that Perfetto
(ui.perfetto.dev) and chrome://tracing open.

Contract:
- `profiling()` makes a `Profile` the active recorder for the block (every thread: multi-device runs launch
  from a pool of host threads); `active` is None otherwise. The runtime layers call the recorder only under
  `if profile.active is not None`: one module-attribute check per launch, copy or compile when profiling is off.
- While a profile is active every kernel launch waits for its kernel (`Device` launches with `wait=True`) so
  that each launch has a time of its own: the device's own timer where it has one (OpenCL profiling events,
  CUDA events, a REMOTE server's device), else the host clock around the synchronized launch. A profiled run
  is therefore slower than an unprofiled one where launches would overlap.
- Tracks (Chrome "processes" and "threads", each named by metadata events):
  one process per device (`CPU`, `CPU:1`, `OPENCL`, `REMOTE:0`, ...) with the threads `kernels` (launches; a
  device-graph run is one span with one child span per kernel), `copies` (host <-> device) and `collectives`
  (multi-device steps, with the bytes each device sent and received); the process `tgc host` with a thread
  per host thread for program-level spans (`run`, `bench`, `schedule`, ...) and `compile` (one span per
  kernel built, its phases as child spans, `cache: hit|miss` in its args); for REMOTE, `REMOTE client ADDR`
  (one span per HTTP round trip) and `REMOTE server ADDR` (the server's own timings of each request).
- A device graph runs its kernels in one launch, so they have no times of their own: the graph's span is
  measured and its kernels' child spans split it in proportion to each kernel's own measured launch time in
  this profile (the median of each one's launches, where all of them have some), else evenly; their args say
  `"approximated": true`.
- A launch's span ends when the synchronized launch returned and lasts the device's time (so a launch that
  first loads its binary, e.g. PoCL building the kernel on first use, shows the kernel where it ran, at the end);
  `host_us` in its args is the host's time for the whole call.
- Spans of one thread track nest (each span ends before its parent ends): they come from context managers
  on one host thread, or are clamped into their parent.
- `Profile.write(path)` writes `{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}` (ts and
  dur in microseconds since the profile started). `summarize(doc)` reads such a document back into a table
  of kernels by total time (`tools/trace_summary.py`).
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

HOST = "tgc host"

# the order tracks are listed in a viewer (Chrome's `process_sort_index` / `thread_sort_index`)
_THREAD_ORDER = {"kernels": 0, "copies": 1, "collectives": 2, "compile": 3, "requests": 0}


class Profile:
    """The events of one profile. Thread-safe: events from any thread are appended under a lock."""

    def __init__(self) -> None:
        self.start_ns = time.perf_counter_ns()
        self.wall_start = time.time()
        self.events: list[dict[str, Any]] = []
        self._pids: dict[str, int] = {}
        self._tids: dict[tuple[int, str], int] = {}
        self._lock = threading.Lock()
        self._measured: dict[tuple[str, str], list[float]] = {}  # (device, kernel) -> launch seconds
        self._flows = 0
        self.launches = 0
        self.labels: dict[str, Any] = {}  # added to the args of every launch while set (`labelled`)
        # device tracks under another name: a device list names every device with its index (`OPENCL` in
        # `CPU:0,OPENCL:0` is the track `OPENCL:0`); set by the device-list runner
        self.aliases: dict[str, str] = {}

    @contextmanager
    def labelled(self, **labels: Any) -> Iterator[None]:
        """Add `labels` to the args of every kernel launch recorded inside the block (e.g. `warmup=True`)."""
        old = self.labels
        self.labels = {**old, **labels}
        try:
            yield
        finally:
            self.labels = old

    # --- clock and tracks
    def now_ns(self) -> int:
        return time.perf_counter_ns()

    def us(self, ns: int) -> float:
        """A perf_counter_ns time as the trace's microseconds since the profile started."""
        return (ns - self.start_ns) / 1e3

    def track(self, process: str, thread: str) -> tuple[int, int]:
        """(pid, tid) of a named track, created (with its metadata events) on first use."""
        process = self.aliases.get(process, process)
        with self._lock:
            pid = self._pids.get(process)
            if pid is None:
                pid = self._pids[process] = len(self._pids) + 1
                self.events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                                    "args": {"name": process}})
                self.events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                                    "args": {"sort_index": 0 if process == HOST else pid}})
            tid = self._tids.get((pid, thread))
            if tid is None:
                tid = self._tids[(pid, thread)] = len([k for k in self._tids if k[0] == pid]) + 1
                self.events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                                    "args": {"name": thread}})
                self.events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                                    "args": {"sort_index": _THREAD_ORDER.get(thread, 10 + tid)}})
            return pid, tid

    def host_thread(self, what: str = "") -> str:
        """The host track of the calling thread (`main`, or the thread's name), optionally of one kind."""
        t = threading.current_thread()
        name = "main" if t is threading.main_thread() else t.name
        return f"{what} ({name})" if what and name != "main" else (what or name)

    # --- events
    def span(self, process: str, thread: str, name: str, start_ns: int, end_ns: int, cat: str = "",
             args: dict[str, Any] | None = None) -> dict[str, Any]:
        """A complete ("X") event from `start_ns` to `end_ns` (perf_counter_ns) on a track."""
        pid, tid = self.track(process, thread)
        ev = {"name": name, "cat": cat or thread, "ph": "X", "ts": self.us(start_ns),
              "dur": max(end_ns - start_ns, 0) / 1e3, "pid": pid, "tid": tid, "args": _plain(args or {})}
        with self._lock:
            self.events.append(ev)
        return ev

    @contextmanager
    def timed(self, process: str, thread: str, name: str, cat: str = "",
              args: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """A span around the block; the yielded dict is its args (add to it inside the block)."""
        a = dict(args or {})
        st = time.perf_counter_ns()
        try:
            yield a
        finally:
            self.span(process, thread, name, st, time.perf_counter_ns(), cat, a)

    def counter(self, process: str, name: str, at_ns: int, values: dict[str, float]) -> None:
        pid, _ = self.track(process, "kernels")
        with self._lock:
            self.events.append({"name": name, "ph": "C", "ts": self.us(at_ns), "pid": pid, "tid": 0,
                                "args": dict(values)})

    def instant(self, process: str, thread: str, name: str, args: dict[str, Any] | None = None) -> None:
        pid, tid = self.track(process, thread)
        with self._lock:
            self.events.append({"name": name, "cat": thread, "ph": "i", "s": "t", "ts": self.us(time.perf_counter_ns()),
                                "pid": pid, "tid": tid, "args": _plain(args or {})})

    def flow(self, src: dict[str, Any], dst: dict[str, Any], name: str = "flow") -> None:
        """An arrow from span `src` to span `dst` (Chrome flow events bound to the enclosing slices)."""
        with self._lock:
            self._flows += 1
            fid = self._flows
            self.events.append({"name": name, "cat": "flow", "ph": "s", "id": fid, "ts": src["ts"],
                                "pid": src["pid"], "tid": src["tid"]})
            self.events.append({"name": name, "cat": "flow", "ph": "f", "bp": "e", "id": fid, "ts": dst["ts"],
                                "pid": dst["pid"], "tid": dst["tid"]})

    # --- kernels
    def launch(self, k: Any, run: Callable[[], float | None]) -> float:
        """Record one synchronized launch of kernel `k` (`run()` launches it with `wait=True` and returns the
        device's time in seconds, or None); returns the launch's seconds (the device's, else the host's)."""
        st = time.perf_counter_ns()
        t = run()
        end = time.perf_counter_ns()
        host_s = (end - st) / 1e9
        dev_s = t if t is not None and t > 0 else None
        secs = min(dev_s, host_s) if dev_s is not None else host_s  # (inside the host span: spans nest)
        dev = _device_name(k)
        args = kernel_args(k, secs)
        args["timer"] = "device" if dev_s is not None else "host"
        args["host_us"] = round(host_s * 1e6, 3)
        args.update(self.labels)
        self.span(dev, "kernels", k.name, end - int(secs * 1e9), end, "kernel", args)
        with self._lock:
            self._measured.setdefault((dev, k.name), []).append(secs)
            self.launches += 1
        return dev_s if dev_s is not None else host_s

    def graph(self, device: str, kernels: list, run: Callable[[], float | None]) -> float:
        """Record one device-graph run of `kernels` (`run()` runs it with `wait=True`): the graph's span and a
        child span per kernel, splitting the graph's time as the module docstring says."""
        st = time.perf_counter_ns()
        t = run()
        end = time.perf_counter_ns()
        host_s = (end - st) / 1e9
        secs = min(t, host_s) if t is not None and t > 0 else host_s
        n = len(kernels)
        st = end - int(secs * 1e9)  # (ends when the synchronized run returned, as `launch`)
        self.span(device, "kernels", f"graph of {n} kernel{'s' if n != 1 else ''}", st, end,
                  "graph", {"kernels": n, "timer": "device" if t else "host", "host_us": round(host_s * 1e6, 3),
                            "flops": sum(getattr(k, "flops", 0) for k in kernels),
                            "bytes": sum(getattr(k, "bytes_moved", 0) for k in kernels), **self.labels})
        with self._lock:
            measured = [self._measured.get((device, k.name)) for k in kernels]
            self.launches += n
        from statistics import median  # (statistics: only while profiling, not on a plain run's path)

        weights = [median(m) for m in measured] if all(measured) else [1.0] * n  # type: ignore[arg-type]
        total_w = sum(weights) or 1.0
        at = st
        for k, w in zip(kernels, weights):
            dur = int(secs * 1e9 * w / total_w)
            args = kernel_args(k, dur / 1e9)
            args.update(approximated=True, timer="a share of the graph's time",
                        split="by the median of its measured launches" if all(measured) else "evenly")
            args.update(self.labels)
            self.span(device, "kernels", k.name, at, min(at + dur, end), "kernel", args)
            at += dur
        return secs

    # --- the document
    def doc(self) -> dict[str, Any]:
        with self._lock:
            events = list(self.events)
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"producer": "tgc", "clock": "perf_counter_ns, microseconds since the profile began",
                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.wall_start)),
                              "pid": os.getpid()}}

    def write(self, path: str | os.PathLike) -> None:
        """Write the trace as JSON (raises OSError where `path` cannot be written)."""
        text = json.dumps(self.doc(), separators=(",", ":"), allow_nan=False)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


active: Profile | None = None  # the recorder the runtime layers call, or None (profiling off)


@contextmanager
def profiling(path: str | os.PathLike | None = None, prof: Profile | None = None) -> Iterator[Profile]:
    """Make `prof` (a new `Profile` by default) the active recorder inside the block, for every thread; with
    `path`, write the trace there when the block ends (also when it raises: the trace of what ran; a write
    that fails then is ignored, the block's own error wins). A trace that cannot be written raises TgcError
    (a user error for a path that cannot be written, else a runtime one)."""
    global active
    prof = prof if prof is not None else Profile()
    old, active = active, prof
    try:
        yield prof
    except BaseException:
        active = old
        if path is not None:
            try:
                prof.write(path)
            except OSError:
                pass
        raise
    active = old
    if path is not None:
        write_trace(prof, path)


def write_trace(prof: Profile, path: str | os.PathLike) -> None:
    """`prof.write(path)`, an OSError as one TgcError."""
    try:
        prof.write(path)
    except OSError as e:
        from tgc.errors import TgcError
        user = e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR, errno.EISDIR,
                           errno.ENAMETOOLONG)
        raise TgcError(f"cannot write the profile trace '{os.fspath(path)}': {e.strerror or e}",
                       kind="user" if user else "runtime",
                       hint="name a writable file for the trace (the run itself finished)") from None


def host_span(name: str, args: dict[str, Any] | None = None, what: str = "") -> Any:
    """A span on the calling host thread's track while profiling, else a no-op context."""
    prof = active
    if prof is None:
        return _NOOP
    return prof.timed(HOST, prof.host_thread(what), name, what or "host", args)


class _NoOp:
    def __enter__(self) -> dict[str, Any]:
        return {}

    def __exit__(self, *exc: Any) -> None:
        return None


_NOOP = _NoOp()


def _device_name(k: Any) -> str:
    dev = getattr(k, "device", None)
    return getattr(dev, "name", None) or "device"


def kernel_args(k: Any, seconds: float) -> dict[str, Any]:
    """A kernel launch's args: launch sizes, opts, FLOPs, bytes and the rates at `seconds`."""
    flops, nbytes = int(getattr(k, "flops", 0) or 0), int(getattr(k, "bytes_moved", 0) or 0)
    local = getattr(k, "local_size", None)
    return {"global_size": list(getattr(k, "global_size", ()) or ()), "local_size": list(local) if local else None,
            "opts": [str(o) for o in getattr(k, "opts", ()) or ()], "flops": flops, "bytes": nbytes,
            "gflops_per_s": flops / seconds / 1e9 if seconds > 0 else None,
            "gb_per_s": nbytes / seconds / 1e9 if seconds > 0 else None,
            "line": getattr(k, "line", None)}


def _plain(v: Any) -> Any:
    """JSON-safe args: plain numbers, strings, lists and dicts (anything else as its text)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and abs(v) != float("inf") else None
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if hasattr(v, "item"):  # a numpy scalar
        return _plain(v.item())
    return str(v)


def summarize(doc: dict[str, Any], top: int | None = None, warmup: bool = False) -> list[dict[str, Any]]:
    """Kernels of a trace document by total time, most first: name, device, launches, total, mean and median
    microseconds, share of all kernel time, GFLOP/s and GB/s over the total. Spans inside a graph count
    (`approximated` counts them); warm-up launches (`tgc bench`'s untimed runs: args `warmup`) only with
    `warmup`."""
    events = doc.get("traceEvents", [])
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "kernel" or (e.get("args", {}).get("warmup") and not warmup):
            continue
        key = (procs.get(e["pid"], str(e["pid"])), e["name"])
        r = rows.setdefault(key, {"name": e["name"], "device": key[0], "launches": 0, "total_us": 0.0,
                                  "flops": 0, "bytes": 0, "approximated": 0, "durations_us": []})
        r["launches"] += 1
        r["durations_us"].append(e["dur"])
        r["total_us"] += e["dur"]
        r["flops"] += e.get("args", {}).get("flops", 0) or 0
        r["bytes"] += e.get("args", {}).get("bytes", 0) or 0
        r["approximated"] += bool(e.get("args", {}).get("approximated"))
    total = sum(r["total_us"] for r in rows.values()) or 1.0
    out = sorted(rows.values(), key=lambda r: -r["total_us"])
    from statistics import median

    for r in out:
        r["mean_us"] = r["total_us"] / r["launches"]
        r["median_us"] = median(r.pop("durations_us"))
        r["share"] = r["total_us"] / total
        r["gflops_per_s"] = r["flops"] / r["total_us"] / 1e3 if r["total_us"] else None
        r["gb_per_s"] = r["bytes"] / r["total_us"] / 1e3 if r["total_us"] else None
    return out[:top] if top else out


def summary_markdown(rows: list[dict[str, Any]]) -> str:
    """`summarize`'s rows as a Markdown table."""
    lines = ["| kernel | device | launches | in a graph | total | mean | median | share | GFLOP/s | GB/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        gf = f"{r['gflops_per_s']:.2f}" if r["gflops_per_s"] is not None else "-"
        gb = f"{r['gb_per_s']:.2f}" if r["gb_per_s"] is not None else "-"
        lines.append(f"| {r['name']} | {r['device']} | {r['launches']} | {r['approximated']} | "
                     f"{_fmt_us(r['total_us'])} | {_fmt_us(r['mean_us'])} | {_fmt_us(r['median_us'])} | "
                     f"{100 * r['share']:.1f}% | {gf} | {gb} |")
    return "\n".join(lines)


def _fmt_us(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us"


def read_trace(path: str) -> dict:
    """A trace file as `--profile` writes it (a JSON object with a `traceEvents` list); OSError or ValueError
    (a file that is not such a trace) otherwise. The tools that read traces (tools/trace_summary.py,
    tools/trace_timeline.py) share it."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError("no traceEvents list")
    return doc
