"""A CPU graph on a busy machine runs on the calling thread alone (`tgc.backends.cpu_graph.oversubscribed`): it
walks the table alone, a kernel of T chunks called with each core id in turn, no waits. The results are the same bits
as the threaded run's (the same kernels on the same chunks) and match numpy; whether the machine is busy is
decided from `/proc/loadavg`'s runnable tasks, here given (no timing, no dependence on the machine's load)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import tgc
from tgc.backends import cpu_graph

SRC = """x: f32[N, N]
y = exp(x) * 2.0
return y + y.sum(axis=1), (x * 3.0).max(axis=0)
"""


def test_runnable_tasks_from_proc_loadavg():
    assert cpu_graph.runnable_tasks("0.50 0.40 0.30 3/1234 5678\n") == 3
    assert cpu_graph.runnable_tasks("13.74 13.00 9.00 266/501 2") == 266
    assert cpu_graph.runnable_tasks("0.50 0.40") is None
    assert cpu_graph.runnable_tasks("0.50 0.40 0.30 x/1 5") is None


def test_oversubscribed_counts_the_other_runnable_tasks(monkeypatch):
    now = time.monotonic()
    monkeypatch.setattr(cpu_graph, "_SAMPLE", [now + 60.0, 0.0])  # a fresh sample: nothing else runnable
    assert not cpu_graph.oversubscribed(2, 2)
    assert cpu_graph.oversubscribed(3, 2)
    monkeypatch.setattr(cpu_graph, "_SAMPLE", [now + 60.0, 1.0])  # one other task runnable
    assert cpu_graph.oversubscribed(2, 2) and not cpu_graph.oversubscribed(2, 4)
    assert not cpu_graph.oversubscribed(1, 2)


@pytest.fixture
def graphs(monkeypatch):
    """The CPU graphs run, each with whether that run went serially."""
    runs: list[tuple[cpu_graph.CPUGraph, bool]] = []
    real = cpu_graph.CPUGraph.__call__

    def spy(self, wait=False):
        out = real(self, wait)
        runs.append((self, self.last_serial))
        return out
    monkeypatch.setattr(cpu_graph.CPUGraph, "__call__", spy)
    return runs


def test_a_busy_machine_runs_the_graph_serially_with_the_same_bits(monkeypatch, graphs):
    monkeypatch.setenv("TGC_THREADS", "2")
    x = np.random.default_rng(3).standard_normal((256, 256)).astype(np.float32)
    expect_y = np.exp(x) * 2.0
    results = {}
    for busy in (False, True):
        monkeypatch.setattr(cpu_graph, "oversubscribed", lambda threads, cores, busy=busy: busy)
        prog = tgc.loads(SRC)
        graphs.clear()
        for _ in range(3):  # (a graph from the second run at these dims on)
            out = prog.run(device="CPU", x=x)
        results[busy] = [out[k] for k in sorted(out)]
        g, serial = graphs[-1]
        if g.threads == 1:
            pytest.skip("no kernel of this program runs on more than one thread here")
        assert serial is busy
    for a, b in zip(results[False], results[True]):
        np.testing.assert_array_equal(a, b)
    outs = dict(zip(sorted(out), results[True]))
    y = [v for v in outs.values() if v.shape == (256, 256)][0]
    np.testing.assert_allclose(y, expect_y + expect_y.sum(axis=1), rtol=1e-4)
    m = [v for v in outs.values() if v.shape == (256,)][0]
    np.testing.assert_allclose(m, (x * 3.0).max(axis=0), rtol=1e-6)


def test_a_busy_machine_runs_a_single_launch_on_the_calling_thread_with_the_same_bits(monkeypatch):
    """Kernels launched one by one (the first run, `TGC_GRAPH=0`, bench's rows) follow the same rule: on a busy
    machine every core id's chunk runs in turn on the calling thread, the device's pool is not used."""
    from tgc.backends import cpu
    monkeypatch.setenv("TGC_THREADS", "2")
    monkeypatch.setenv("TGC_GRAPH", "0")
    x = np.random.default_rng(4).standard_normal((256, 256)).astype(np.float32)
    pools: list[int] = []
    real_pool = cpu.CPUDevice.pool
    monkeypatch.setattr(cpu.CPUDevice, "pool", lambda self, threads: pools.append(threads) or real_pool(self, threads))
    results = {}
    for busy in (False, True):
        monkeypatch.setattr(cpu_graph, "oversubscribed", lambda threads, cores, busy=busy: busy)
        prog = tgc.loads(SRC)
        if max(k.global_size[0] for k in prog.lower("CPU", {"N": 256}).kernels) == 1:
            pytest.skip("no kernel of this program runs on more than one thread here")
        pools.clear()
        out = prog.run(device="CPU", x=x)
        assert bool(pools) is not busy  # threads when idle, none when busy
        results[busy] = [out[k] for k in sorted(out)]
    for a, b in zip(results[False], results[True]):
        np.testing.assert_array_equal(a, b)
    y = [v for v in results[True] if v.shape == (256, 256)][0]
    np.testing.assert_allclose(y, np.exp(x) * 2.0 + (np.exp(x) * 2.0).sum(axis=1), rtol=1e-4)
