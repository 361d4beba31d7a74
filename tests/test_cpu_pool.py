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
