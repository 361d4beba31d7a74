"""REMOTE overhead: round trips per program and time per run against the local device it serves.

Starts `tgc serve -d DEV` in a subprocess on a free loopback port, runs a small and a large program
through `-d REMOTE` and locally, and prints a table, then the two figures issue 27 sets targets for: the payload
rate (bytes sent and received per run of the large cases over their overhead; target >= 3 GB/s on loopback) and
the small programs' overhead (target <= 0.3 ms), each with whether it is met and the load
average before and after. Usage: `python bench/bench_remote.py [-d CPU] [-r 50]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import tgc  # noqa: E402
from tgc.backends import get_device  # noqa: E402
from tgc.backends.remote.process import ServerProcess  # noqa: E402

SOFTMAX = """x: f32[N, D]
m = x.max(axis=1, keepdim=True)
e = exp(x - m)
return e / sum(e, axis=1, keepdim=True)
"""

CASES = [  # name, source, input shapes
    ("small: softmax 4x8", SOFTMAX, {"x": (4, 8)}),
    ("small: mlp 16x32", "x: f32[N, D]\nw: f32[D, D]\nh = relu(x @ w)\nreturn h @ w\n", {"x": (16, 32), "w": (32, 32)}),
    ("large: softmax 1024x1024", SOFTMAX, {"x": (1024, 1024)}),
    ("large: matmul 256^3", "a: f32[M, K]\nb: f32[K, N]\nreturn a @ b\n", {"a": (256, 256), "b": (256, 256)}),
]


def timed_runs(prog, device: str, inputs: dict[str, np.ndarray], repeat: int) -> list[float]:
    """Seconds per `prog.run`, after one untimed run that compiles and loads."""
    times = []
    for _ in range(repeat):
        st = time.perf_counter()
        prog.run(device=device, **inputs)
        times.append(time.perf_counter() - st)
    return times


_ECHO = """import socket, sys
listener = socket.socket(fileno=int(sys.argv[1]))
n, size = int(sys.argv[2]), int(sys.argv[3])
conn, _ = listener.accept()
for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
    size and conn.setsockopt(socket.SOL_SOCKET, opt, size)
view = memoryview(bytearray(n))
while True:
    got = 0
    while got < n:
        k = conn.recv_into(view[got:])
        if not k:
            sys.exit(0)
        got += k
    conn.sendall(b"x")
"""


def loopback_rate(nbytes: int = 4 << 20, repeat: int = 20) -> float:
    """Bytes per second of `nbytes` sent over a TCP loopback connection to a child process and acknowledged
    (the median), with the REMOTE connections' socket buffers: the ceiling the payload rate is measured
    against, on this machine at this moment (its load included)."""
    import socket
    import subprocess

    from tgc.backends.remote.protocol import SOCKET_BUFFER, send_all, tune_socket
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        child = subprocess.Popen([sys.executable, "-c", _ECHO, str(listener.fileno()), str(nbytes),
                                  str(max(SOCKET_BUFFER, 0))], pass_fds=(listener.fileno(),))
    data = memoryview(np.ones(nbytes, np.uint8))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
            tune_socket(conn)
            times = []
            for _ in range(repeat):
                st = time.perf_counter()
                send_all(conn, [data])  # (as REMOTE writes: the send buffer set again for the round trip seen)
                conn.recv(1)
                times.append(time.perf_counter() - st)
    finally:
        child.wait(60)
    return nbytes / statistics.median(times)


def settle(pid: int, quiet: float = 0.02, most: float = 30.0) -> None:
    """Wait (at most `most` seconds) until the server `pid` with its launch workers uses under `quiet` of a core
    over 0.2 s: a CPU server starts its launch workers in the background once a client has come, and their start
    (interpreters importing numpy) would otherwise be counted in the first cases' times and the server's CPU."""
    end = time.monotonic() + most
    while time.monotonic() < end:
        before = server_cpu_ns(pid)
        time.sleep(0.2)
        after = server_cpu_ns(pid)
        if before is None or after is None or after - before < quiet * 0.2e9:
            return


def cpu_ns(pid: int) -> int | None:
    """Nanoseconds on a CPU of every thread of process `pid` so far (Linux `schedstat`; None elsewhere)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        return sum(int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0]) for t in tasks)
    except (OSError, ValueError, IndexError):
        return None


def own_cpu_ns() -> int:
    """Nanoseconds on a CPU of every thread of this process so far (`schedstat` of a thread that is running now is
    only brought up to date when it stops, which a run that never waits may not do for a while)."""
    return time.process_time_ns()


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (a CPU server's launch workers; Linux `/proc`)."""
    out = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def server_cpu_ns(pid: int) -> int | None:
    """CPU nanoseconds of the server process `pid` and of its launch workers so far (None where not measurable)."""
    total = cpu_ns(pid)
    if total is None:
        return None
    return total + sum(cpu_ns(c) or 0 for c in children(pid))


def copy_rate(remote, server_pid: int, nbytes: int = 4 << 20, repeat: int = 20
              ) -> tuple[float, float | None, float | None]:
    """A copy in and a copy out of `nbytes` through REMOTE (one round trip each time, no kernel: the data path
    alone, without the local run the table's overheads subtract): bytes per second (the median), and the
    client's and the server's CPU seconds per round trip (less dependent on the machine's load than the wall
    time; None where not measurable)."""
    alloc = remote.allocator
    handle = alloc.alloc(nbytes)
    src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    times = []
    try:
        alloc.copyin(handle, memoryview(src))
        alloc.copyout(memoryview(dst), handle)
        c0, s0 = own_cpu_ns(), cpu_ns(server_pid)
        for _ in range(repeat):
            st = time.perf_counter()
            alloc.copyin(handle, memoryview(src))
            alloc.copyout(memoryview(dst), handle)
            times.append(time.perf_counter() - st)
        c1, s1 = own_cpu_ns(), cpu_ns(server_pid)
    finally:
        alloc.free(handle, nbytes)
    if not (dst == 1).all():
        raise SystemExit("bench_remote: the copy through REMOTE came back wrong")
    client = (c1 - c0) / 1e9 / repeat if c0 is not None and c1 is not None else None
    server = (s1 - s0) / 1e9 / repeat if s0 is not None and s1 is not None else None
    return 2 * nbytes / statistics.median(times), client, server


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-d", "--device", default="CPU", help="the device to serve and to compare with")
    ap.add_argument("-r", "--repeat", type=int, default=50)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    load_before = _load()
    ceiling = loopback_rate()
    with ServerProcess(a.device) as srv:
        os.environ["TGC_REMOTE"] = srv.address
        remote = get_device("REMOTE")
        for name, src, shapes in CASES:
            inputs = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
            prog = tgc.loads(src)
            kernels = len(prog.compile(device=a.device, dims=prog.bind(inputs)[0]))
            prog.run(device=a.device, **inputs)  # compile and load first
            outputs = prog.run(device="REMOTE", **inputs)
            settle(srv.proc.pid)
            l0 = own_cpu_ns()
            local = timed_runs(prog, a.device, inputs, a.repeat)
            l1 = own_cpu_ns()
            # a local run's time where nothing else runs: its CPU time, or its fastest run where that is less (a device
            # that runs a kernel on several threads spends more CPU than time): the smaller, so the idle estimate
            # below leans high
            local_cpu = None if None in (l0, l1) else min((l1 - l0) / 1e9 / a.repeat, min(local))
            before, ahead = remote.round_trips, getattr(remote, "posts_ahead", 0)
            # (the client's CPU is read inside the server's: finding the launch workers scans /proc, which costs this
            # process more CPU than a small run)
            s0 = server_cpu_ns(srv.proc.pid)
            c0 = own_cpu_ns()
            there = timed_runs(prog, "REMOTE", inputs, a.repeat)
            c1 = own_cpu_ns()
            s1 = server_cpu_ns(srv.proc.pid)
            trips = (remote.round_trips - before) / a.repeat
            ahead = (getattr(remote, "posts_ahead", 0) - ahead) / a.repeat
            cpu = None if None in (c0, c1, s0, s1, local_cpu) else \
                ((c1 - c0) / 1e9 / a.repeat, (s1 - s0) / 1e9 / a.repeat, local_cpu)
            nbytes = sum(x.nbytes for x in inputs.values())
            moved = nbytes + sum(np.asarray(v).nbytes for v in outputs.values())
            lm, rm = statistics.median(local), statistics.median(there)
            rows.append((name, kernels, nbytes, trips, lm, rm, moved, ahead, cpu))
        copied, client_cpu, server_cpu = copy_rate(remote, srv.proc.pid, repeat=a.repeat)
        remote.close()
    load = _load()
    print(f"REMOTE serving {a.device} on 127.0.0.1, median of {a.repeat} runs; {os.cpu_count()} cores, load average "
          f"{load:.1f}; raw TCP loopback here now: {ceiling / 1e9:.2f} GB/s one way")
    print(f"{'program':<28}{'kernels':>8}{'input':>10}{'trips/run':>11}{'ahead/run':>11}{'local':>11}{'REMOTE':>11}"
          f"{'overhead':>11}{'ratio':>8}{'CPU client':>12}{'CPU server':>12}")
    for name, kernels, nbytes, trips, lm, rm, _, ahead, cpu in rows:
        c, sv = ("-", "-") if cpu is None else (f"{cpu[0] * 1e3:.3f}ms", f"{cpu[1] * 1e3:.3f}ms")
        print(f"{name:<28}{kernels:>8}{nbytes / 1e6:>8.2f}MB{trips:>11.2f}{ahead:>11.2f}{lm * 1e3:>9.3f}ms"
              f"{rm * 1e3:>9.3f}ms{(rm - lm) * 1e3:>9.3f}ms{rm / lm:>7.1f}x{c:>12}{sv:>12}")
    print("(trips/run: answers waited for; ahead/run: requests sent without waiting (a large copy in), answered with "
          "the next; CPU: per REMOTE run, this process (its local work included) and the server with its launch "
          "workers)")
    large = [r for r in rows if r[0].startswith("large")]
    moved, extra = sum(r[6] for r in large), sum(max(r[5] - r[4], 1e-9) for r in large)
    small = statistics.median(r[5] - r[4] for r in rows if r[0].startswith("small"))
    small_cpu = [r[8] for r in rows if r[0].startswith("small") and r[8] is not None]
    rate = moved / extra
    print(f"payload: {rate / 1e9:.2f} GB/s ({moved / 1e6:.1f} MB in and out over {extra * 1e3:.1f} ms of "
          f"overhead; target >= {PAYLOAD_TARGET / 1e9:g} GB/s): {_verdict(rate >= PAYLOAD_TARGET)}")
    cpu = "" if client_cpu is None or server_cpu is None else \
        f"; CPU per round trip: client {client_cpu * 1e3:.2f} ms, server {server_cpu * 1e3:.2f} ms"
    print(f"data path alone: {copied / 1e9:.2f} GB/s (a 4 MiB copy in and copy out, one round trip, no kernel; "
          f"{_verdict(copied >= PAYLOAD_TARGET)}{cpu})")
    cpu = "" if not small_cpu else (
        f"; CPU per run: client {statistics.median(c for c, _, _ in small_cpu) * 1e3:.3f} ms (a local run "
        f"{statistics.median(lc for _, _, lc in small_cpu) * 1e3:.3f} ms), server "
        f"{statistics.median(sv for _, sv, _ in small_cpu) * 1e3:.3f} ms")
    print(f"small-program overhead: {small * 1e3:.3f} ms (median of the small cases; target <= "
          f"{SMALL_TARGET * 1e3:g} ms): {_verdict(small <= SMALL_TARGET)}{cpu}")
    # What the CPU times imply where nothing else runs: a small program's round trip is serial (the client waits for
    # the server), so its overhead is the client's extra CPU plus the server's; a large copy's two sides overlap on
    # two idle cores (the bound: the busier side), or not at all on one.
    if small_cpu:
        idle = statistics.median(c - lc + sv for c, sv, lc in small_cpu)
        print(f"implied on an idle machine (CPU time, no waiting for other work): small-program overhead "
              f"~{idle * 1e3:.3f} ms ({_verdict(idle <= SMALL_TARGET)})", end="")
    if client_cpu and server_cpu:
        both, alone = 2 * (4 << 20) / max(client_cpu, server_cpu), 2 * (4 << 20) / (client_cpu + server_cpu)
        print(f"{'; d' if small_cpu else 'implied on an idle machine: d'}ata path ~{both / 1e9:.2f} GB/s with client "
              f"and server on two cores ({_verdict(both >= PAYLOAD_TARGET)}), ~{alone / 1e9:.2f} GB/s on one", end="")
    if small_cpu or (client_cpu and server_cpu):
        print()
    print(f"load average {load_before:.1f} before, {load:.1f} after ({os.cpu_count()} cores): figures taken with a "
          "load above the core count measure the machine's contention as much as the data path")
    return 0


PAYLOAD_TARGET = 3e9  # bytes per second of payload over the overhead (issue 27)
SMALL_TARGET = 0.3e-3  # seconds of overhead per small program (issue 27)


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def _verdict(met: bool) -> str:
    return "target met" if met else "target NOT met"


if __name__ == "__main__":
    sys.exit(main())
