"""A compile worker process for BEAM search: reads JSON requests on stdin, writes JSON answers on stdout.

Request: {"kind": "CPU", "src": "..."}; answer: {"ok": true, "bin": base64, "seconds": compile time} or
{"ok": false, "error": "..."}. A future's `seconds` holds the compile time (`tgc compile --timings`).
With `"op": "assembly"` the answer's `bin` holds the compiler's assembly listing (UTF-8); with `"op": "printed"`
(LLVM IR) the answer also has `text`, LLVM's print of the module compiled as parsed (the future's result is then
`(bin, text)`: what `remote.shortproof` proves is what was compiled). A compiler that
aborts (LLVM's fatal errors) kills only the worker; the pool starts a new one.
Plain subprocesses (not multiprocessing) so that the parent's `__main__` and threads never matter.
"""

from __future__ import annotations

import base64
import json
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

from tgc.backends import get_device
from tgc.backends.base import Compiler


def compiler_of(kind: str) -> Compiler:
    """The compiler of a device kind, as its device has it. The CPU's without the device: a worker only compiles,
    and `tgc.backends.cpu` imports numpy (~0.1 s of CPU at each worker's start)."""
    if kind == "CPU":
        from tgc.backends.llvm_compile import COMPILER
        return COMPILER
    return get_device(kind).compiler


def main() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        start = time.perf_counter()
        try:
            comp = compiler_of(req["kind"])
            text = None
            if req.get("op") == "assembly":
                lib = str(comp.assembly(req["src"])).encode("utf-8", "replace")
            elif req.get("op") == "printed":  # (LLVM's compiler: the object and its module's print, as parsed)
                lib, text = comp.compile_printed(req["src"])  # type: ignore[attr-defined]
            else:
                lib = comp.compile(req["src"])
            ans = {"ok": True, "bin": base64.b64encode(lib).decode(), "seconds": time.perf_counter() - start}
            if text is not None:
                ans["text"] = text
        except Exception as e:  # reported to the parent, which counts the candidate as failed
            ans = {"ok": False, "error": getattr(e, "msg", None) or str(e) or type(e).__name__}
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()


class WorkerPool:
    """N worker processes; `submit(kind, src)` returns a Future of the binary bytes (one cancelled before a worker
    takes it is never compiled).

    One queue for all workers, taken in the order submitted: the next source goes to whichever worker is free.
    (Each source was dealt to a fixed worker in turn, so a worker dealt two long kernels still compiled while the
    other one idled: the end of a cold compile ran on one core.)"""

    def __init__(self, workers: int):
        self.procs = [self._start() for _ in range(workers)]
        self.closed = False
        self.jobs: queue.SimpleQueue[tuple[Future, str] | None] = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._serve, args=(i,), daemon=True) for i in range(workers)]
        for t in self.threads:
            t.start()

    @staticmethod
    def _start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "tgc.backends.compile_worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def submit(self, kind: str, src: str, op: str = "compile") -> Future:
        fut: Future = Future()
        self.jobs.put((fut, json.dumps({"kind": kind, "src": src, "op": op}) + "\n"))
        return fut

    def _serve(self, i: int) -> None:
        """Worker i's thread: takes the next request off the queue, sends it, answers its future; until shutdown."""
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fut, request = job
            if not fut.set_running_or_notify_cancel():  # cancelled while it waited (BEAM's deadline passed)
                continue
            proc = self.procs[i]
            try:
                proc.stdin.write(request)
                proc.stdin.flush()
                ans = json.loads(proc.stdout.readline())
            except (OSError, ValueError) as e:
                # the compiler crashed on this source (LLVM can abort on an assertion): replace the worker
                proc.kill()
                proc.wait()
                if self.closed:  # (shut down meanwhile: no new worker)
                    fut.set_exception(RuntimeError("the compile workers were shut down"))
                    return
                self.procs[i] = self._start()
                fut.set_exception(RuntimeError(f"compile worker died: {e}"))
                continue
            if ans["ok"]:
                fut.seconds = float(ans.get("seconds") or 0.0)  # type: ignore[attr-defined]
                lib = base64.b64decode(ans["bin"])
                fut.set_result((lib, ans["text"]) if "text" in ans else lib)
            else:
                fut.set_exception(RuntimeError(ans["error"]))

    def kill(self) -> None:
        """Kill every worker (one stuck on a source); the calls waiting on them fail and new workers start."""
        for p in self.procs:
            p.kill()

    def shutdown(self, cancel_futures: bool = True) -> None:
        self.closed = True
        while cancel_futures:  # requests no worker took yet are dropped
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
                job[0].set_running_or_notify_cancel()  # (its waiters see it done: cancelled)
        for _ in self.threads:
            self.jobs.put(None)
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
            p.terminate()
            p.wait(timeout=5)


if __name__ == "__main__":
    main()
