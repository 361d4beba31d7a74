"""The CPU device's thread pool is one per device even when threads ask for it at once (`CPUDevice.pool`)."""

from __future__ import annotations

import threading

from tgc.backends.cpu import CPUDevice


def test_threads_asking_at_once_share_one_pool_that_only_grows():
    dev = CPUDevice(0)  # (a device of its own: the pool it grows is not the session's)
    pools, barrier = [], threading.Barrier(8)

    def ask(threads: int) -> None:
        barrier.wait()
        pools.append(dev.pool(threads))

    workers = [threading.Thread(target=ask, args=(2,)) for _ in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len({id(p) for p in pools}) == 1
    assert dev.pool(1) is pools[0]  # a smaller ask keeps the pool
    assert dev.pool(64) is not pools[0] and dev.pool(3) is dev.pool(64)  # a larger one replaces it, once


def test_ctrl_c_inside_a_threaded_launchs_hand_off_runs_no_chunk_after_it(monkeypatch):
    """A Ctrl-C surfacing inside `pool.submit` after the chunk was queued (a SIGINT delivered to another thread
    of the process): the launch knows that chunk's future, so a chunk not yet started never runs after the
    launch raised (before, its future was lost: it ran later, on buffers the caller may have freed)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import pytest

    import tgc
    from tgc.backends import cpu, get_device

    n = 1 << 18
    monkeypatch.setenv("TGC_THREADS", "2")
    (k,) = tgc.loads("x: f32[N]\nreturn x + 1.0").lower("CPU", {"N": n}).kernels
    if k.global_size[0] < 2:
        pytest.skip("the kernel is not split in threads here")
    monkeypatch.setattr(cpu, "_busy", lambda threads, device: False)
    dev = get_device("CPU")
    buf = dev.allocator.alloc(4 * n)
    buf.view(np.float32)[:] = 0.0
    pool, release = ThreadPoolExecutor(max_workers=1), threading.Event()
    held = pool.submit(release.wait, 30)  # (the pool's one worker busy: a chunk queued behind it)

    class Interrupted:
        def submit(self, *args):
            pool.submit(*args)  # (queued) ...
            raise KeyboardInterrupt  # ... then the interrupt surfaces

    monkeypatch.setattr(type(dev), "pool", lambda self, threads: Interrupted())
    with pytest.raises(KeyboardInterrupt):
        k.program()(buf, buf, global_size=k.global_size, local_size=k.local_size, vals=k.vals)
    release.set()
    pool.shutdown(wait=True)
    assert held.done() and not cpu.ABANDONED.running()
    np.testing.assert_array_equal(buf.view(np.float32), np.zeros(n, np.float32))  # no chunk ran after the raise
