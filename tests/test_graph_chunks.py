"""A threaded CPU graph hands out each kernel's chunks (its `core_id`s) as threads claim them
(tgc/backends/cpu_graph.py): every chunk runs exactly once, a row waits for the previous row's chunks to be done
(not for every thread to arrive), a late thread costs nothing unless it holds a chunk, and a run returns only once
no other thread is in it. Checked with a kernel that adds 1 in place (a chunk run twice, skipped, or run beside
the previous row's chunk of the same elements shows in the counts) and with a real program against numpy and
against the serial walk; no timings."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import tgc
from tgc.backends import cpu_graph, get_device

N = 1 << 18  # floats: enough work for a split in 8 (MIN_WORK_PER_THREAD)
ROWS = 3


@pytest.fixture
def threaded(monkeypatch):
    monkeypatch.setattr(cpu_graph, "oversubscribed", lambda threads, cores: False)  # (threaded, whatever the load)


def _increment_graph(monkeypatch, chunks: int, threads: int):
    """A graph of ROWS launches of `x + 1` written back into x (one buffer), split in `chunks` chunks, run by
    `threads` threads; and the buffer, zeroed."""
    monkeypatch.setenv("TGC_THREADS", str(chunks))
    (k,) = tgc.loads("x: f32[N]\nreturn x + 1.0").lower("CPU", {"N": N}).kernels
    if k.global_size[0] != chunks:
        pytest.skip(f"the kernel is split in {k.global_size[0]} chunks here, not {chunks}")
    monkeypatch.setenv("TGC_THREADS", str(threads))
    dev = get_device("CPU")
    buf = dev.allocator.alloc(4 * N)
    buf.view(np.float32)[:] = 0.0
    graph = dev.graph([(k.program(), [buf, buf], k.global_size, k.local_size, k.vals)] * ROWS)
    assert graph.threads == threads and graph.chunks == chunks
    return graph, buf


@pytest.mark.parametrize("chunks, threads", [(2, 2), (8, 2), (8, 3)])
def test_every_chunk_runs_once_per_run_back_to_back(chunks, threads, threaded, monkeypatch):
    graph, buf = _increment_graph(monkeypatch, chunks, threads)
    runs = 200
    for _ in range(runs):
        graph()
    assert not graph.last_serial
    np.testing.assert_array_equal(buf.view(np.float32), np.full(N, runs * ROWS, np.float32))
    # the run's state: every row's chunks done, no thread left in the run
    state = graph.state.reshape(-1, cpu_graph.STATE_ROW)
    assert state[0, 0] == 0 and (state[1:, 1] == chunks).all()
    assert (state[1:, 0] >= chunks).all() and (state[1:, 0] <= chunks + threads).all()


def test_a_late_worker_is_not_waited_for(threaded, monkeypatch):
    """The pool's one worker is held by another task: the calling thread claims every chunk, and the run returns
    without waiting for the worker. Its part, run once the worker is free, finds its run closed and touches
    nothing but the gate: later runs are right, and no thread is left in a run."""
    graph, buf = _increment_graph(monkeypatch, 8, 2)
    pool, release = ThreadPoolExecutor(max_workers=1), threading.Event()
    monkeypatch.setattr(type(graph.device), "pool", lambda self, threads: pool)
    held = pool.submit(release.wait, 30)
    try:
        for _ in range(5):
            graph()
        assert not held.done()  # (the old barrier waited for the worker: here it would still be held, 30 s)
        np.testing.assert_array_equal(buf.view(np.float32), np.full(N, 5 * ROWS, np.float32))
    finally:
        release.set()
    pool.shutdown(wait=True)  # the five late parts ran, each after its run closed
    assert graph.state[0] == 0
    for _ in range(5):
        graph()
    np.testing.assert_array_equal(buf.view(np.float32), np.full(N, 10 * ROWS, np.float32))


def test_ctrl_c_inside_the_hand_off_leaves_no_chunk_running(threaded, monkeypatch):
    """A Ctrl-C that surfaces on the calling thread inside `pool.submit` after its work was queued (a SIGINT
    delivered to another thread of the process): the call raises only after its run is whole and closed, so no
    kernel runs after it, and the next run at once is right."""
    graph, buf = _increment_graph(monkeypatch, 8, 2)
    real = type(graph.device).pool

    class Interrupted:
        def __init__(self, pool):
            self.pool = pool

        def submit(self, *args):
            self.pool.submit(*args)  # (queued) ...
            raise KeyboardInterrupt  # ... then the interrupt surfaces

    monkeypatch.setattr(type(graph.device), "pool", lambda self, threads: Interrupted(real(self, threads)))
    with pytest.raises(KeyboardInterrupt):
        graph()
    after = buf.view(np.float32).copy()
    assert graph.state[0] == 0 and graph.state[1] == graph.ticket + 1  # no worker in; the run closed
    np.testing.assert_array_equal(after, np.full(N, ROWS, np.float32))  # the whole run, once
    monkeypatch.setattr(type(graph.device), "pool", real)
    graph()
    np.testing.assert_array_equal(buf.view(np.float32), np.full(N, 2 * ROWS, np.float32))


def test_a_graph_run_from_two_python_threads(threaded, monkeypatch):
    graph, buf = _increment_graph(monkeypatch, 8, 2)
    errors: list[BaseException] = []

    def runs():
        try:
            for _ in range(100):
                graph()
        except BaseException as e:  # pragma: no cover (reported below)
            errors.append(e)
    others = [threading.Thread(target=runs) for _ in range(2)]
    for t in others:
        t.start()
    for t in others:
        t.join()
    assert not errors
    np.testing.assert_array_equal(buf.view(np.float32), np.full(N, 200 * ROWS, np.float32))


SRC = "x: f32[N, D]\nreturn softmax(x, 1), x.T @ x, x.sum(0)"


def test_claimed_chunks_give_the_serial_walks_bits(monkeypatch):
    """A real program compiled for 4 chunks a kernel, run by 2 threads claiming them, then by the calling thread
    alone: the same bits, and numpy's values."""
    monkeypatch.setenv("TGC_THREADS", "4")
    prog = tgc.loads(SRC)
    kernels = prog.lower("CPU", {"N": 256, "D": 64}).kernels
    if max(k.global_size[0] for k in kernels) != 4:
        pytest.skip("no kernel of this program is split in 4 here")
    x = np.random.default_rng(5).standard_normal((256, 64)).astype(np.float32)
    for _ in range(2):
        prog.run(device="CPU", x=x)  # (the plan and its buffers)
    (plan,) = prog._launch_plans.plans.values()
    monkeypatch.setenv("TGC_THREADS", "2")
    results = {}
    for busy in (False, True):
        monkeypatch.setattr(cpu_graph, "oversubscribed", lambda threads, cores, busy=busy: busy)
        plan.graph = None  # built again, for 2 threads
        out = prog.run(device="CPU", x=x)
        assert plan.graph is not None and plan.graph.threads == 2 and plan.graph.chunks == 4
        assert plan.graph.last_serial is busy
        results[busy] = out
    for name in results[False]:
        np.testing.assert_array_equal(results[False][name], results[True][name])
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(results[False]["out0"], e / e.sum(1, keepdims=True), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(results[False]["out1"], x.T @ x, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(results[False]["out2"], x.sum(0), rtol=1e-4, atol=1e-4)


def test_the_runner_claims_chunks_and_waits_for_chunks_done():
    ir = cpu_graph.graph_ir()
    assert "atomicrmw add ptr %claimp" in ir and "@tgc_wait_done" in ir and "@tgc_wait_left" in ir
    assert cpu_graph.IR_VERSION >= 3


LATE_WORKER_AFTER_A_NEW_RUNNER = """
import gc, os, threading
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import tgc
from tgc.backends import cpu_graph, get_device
cpu_graph.oversubscribed = lambda threads, cores: False
os.environ["TGC_THREADS"] = "2"
(k,) = tgc.loads("x: f32[N]\\nreturn x + 1.0").lower("CPU", {"N": 1 << 18}).kernels
assert k.global_size[0] == 2, k.global_size
dev = get_device("CPU")
buf = dev.allocator.alloc(4 << 18)
buf.view(np.float32)[:] = 0.0
pool, release = ThreadPoolExecutor(max_workers=1), threading.Event()
type(dev).pool = lambda self, threads: pool
held = pool.submit(release.wait, 30)
graph = dev.graph([(k.program(), [buf, buf], k.global_size, k.local_size, k.vals)])
graph()  # the calling thread runs both chunks; the worker's part waits behind `held`
del graph
cpu_graph._RUNNER = None  # the process's runner dropped (a test builds it again with other settings)
gc.collect()
release.set()
pool.shutdown(wait=True)  # the late worker runs the first runner's code: still mapped
assert (buf.view(np.float32) == 1.0).all()
print("late worker ok")
"""


def test_a_late_worker_runs_code_that_is_still_loaded():
    """A worker queued behind other work starts after its graph is gone and the process's runner was dropped (as a
    test that builds it again with other settings does): it still runs that runner's code (to find its run closed),
    so the graph's workers hold the code's loaded object (before, the worker crashed: SIGSEGV). In a process of its
    own."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", LATE_WORKER_AFTER_A_NEW_RUNNER], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "late worker ok" in r.stdout, r.stderr[-2000:]
