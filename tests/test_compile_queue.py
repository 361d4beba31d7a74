"""The compile workers take one queue (`tgc.backends.compile_worker.WorkerPool`): the next source goes to whichever
worker is free, so one worker busy on a long compile never holds back the sources behind it (dealt in turn,
every second source waited for that worker). A worker is held with SIGSTOP: no timing involved."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, wait

import pytest

from tgc.backends.compile_worker import WorkerPool, compiler_of
from tgc.backends.cpu import CPUDevice

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")

SRC = """define void @k{n}(ptr noalias align 16 %data0, i32 %core_id) {{
entry:
  %p = getelementptr inbounds float, ptr %data0, i32 {n}
  store float {n}.0, ptr %p, align 4
  ret void
}}
"""
HANG_GUARD_S = 300  # only against a hang: a correct pool answers in well under a second each


def _until_done(futs: list, count: int) -> int:
    """Waits until `count` of `futs` are done (or the guard runs out); how many are."""
    deadline = time.monotonic() + HANG_GUARD_S
    while sum(f.done() for f in futs) < count and time.monotonic() < deadline:
        wait([f for f in futs if not f.done()], timeout=1, return_when=FIRST_COMPLETED)
    return sum(f.done() for f in futs)


def test_a_stopped_worker_holds_back_only_the_source_it_took():
    pool = WorkerPool(2)
    stopped = None
    try:
        warm = [pool.submit("CPU", SRC.format(n=n)) for n in range(2)]
        assert _until_done(warm, 2) == 2
        stopped = pool.procs[0]
        os.kill(stopped.pid, signal.SIGSTOP)
        futs = [pool.submit("CPU", SRC.format(n=n)) for n in range(2, 8)]
        # every source but (at most) the one the stopped worker's thread took goes to the other worker
        assert _until_done(futs, 5) >= 5
        os.kill(stopped.pid, signal.SIGCONT)
        stopped = None
        assert _until_done(futs, 6) == 6
        serial = CPUDevice().compiler
        for n, fut in zip(range(2, 8), futs):
            assert fut.result() == serial.compile(SRC.format(n=n))  # a worker's object is the in-process one
    finally:
        if stopped is not None:
            os.kill(stopped.pid, signal.SIGCONT)
        pool.shutdown()


def test_cancelled_in_the_queue_never_compiles_and_shutdown_cancels_what_is_queued():
    pool = WorkerPool(1)
    stopped = pool.procs[0]
    try:
        assert _until_done([pool.submit("CPU", SRC.format(n=1))], 1) == 1
        os.kill(stopped.pid, signal.SIGSTOP)
        held = pool.submit("CPU", SRC.format(n=2))  # the one thread takes it and waits on the stopped worker
        queued = [pool.submit("CPU", SRC.format(n=n)) for n in range(3, 6)]
        assert queued[0].cancel()
        os.kill(stopped.pid, signal.SIGCONT)
        assert _until_done([held, *queued], 4) == 4
        assert queued[0].cancelled() and all(f.result() for f in (held, *queued[1:]))
        os.kill(stopped.pid, signal.SIGSTOP)
        later = [pool.submit("CPU", SRC.format(n=n)) for n in range(6, 10)]
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
        pool.shutdown()
    # the one in flight fails (its worker is gone), the queued ones are cancelled: none is left waiting
    assert _until_done(later, 4) == 4
    assert sum(f.cancelled() for f in later) >= 3


def test_a_cpu_worker_compiles_without_importing_numpy_or_the_device():
    """A worker only compiles: it takes the CPU's compiler (`tgc.backends.llvm_compile`) without `tgc.backends.cpu`
    and numpy (their imports were ~0.1 s of each worker's start); the object is the device compiler's."""
    assert compiler_of("CPU") is CPUDevice().compiler
    src = SRC.format(n=3)
    probe = ("import sys, runpy\nsys.argv = ['compile_worker']\n"
             "runpy.run_module('tgc.backends.compile_worker', run_name='__main__')\n"
             "print(json.dumps(sorted(m for m in ('numpy', 'tgc.backends.cpu') if m in sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", "import json\n" + probe], input=json.dumps({"kind": "CPU", "src": src})
                         + "\n", capture_output=True, text=True, timeout=HANG_GUARD_S, check=True).stdout.splitlines()
    answer, loaded = json.loads(out[0]), json.loads(out[1])
    assert loaded == []
    assert answer["ok"] and base64.b64decode(answer["bin"]) == CPUDevice().compiler.compile(src)
