"""A compile worker process for BEAM search: reads JSON requests on stdin, writes JSON answers on stdout.

Request: {"kind": "CPU", "src": "..."}; answer: {"ok": true, "bin": base64, "seconds": compile time} or
{"ok": false, "error": "..."}. A future's `seconds` holds the compile time (`tgc compile --timings`).
With `"op": "assembly"` the answer's `bin` holds the compiler's assembly listing (UTF-8). A compiler that
aborts (LLVM's fatal errors) kills only the worker; the pool starts a new one.
Plain subprocesses (not multiprocessing) so that the parent's `__main__` and threads never matter.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

from tgc.backends import get_device


def main() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        start = time.perf_counter()
        try:
            comp = get_device(req["kind"]).compiler
            if req.get("op") == "assembly":
                lib = str(comp.assembly(req["src"])).encode("utf-8", "replace")
            else:
                lib = comp.compile(req["src"])
            ans = {"ok": True, "bin": base64.b64encode(lib).decode(), "seconds": time.perf_counter() - start}
        except Exception as e:  # reported to the parent, which counts the candidate as failed
            ans = {"ok": False, "error": getattr(e, "msg", None) or str(e) or type(e).__name__}
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()


class WorkerPool:
    """N worker processes; `submit(kind, src)` returns a Future of the binary bytes (one cancelled before its
    worker takes it is never compiled)."""

    def __init__(self, workers: int):
        self.procs = [self._start() for _ in range(workers)]
        self.locks = [threading.Lock() for _ in self.procs]
        self.next = 0
        self.threads: list[threading.Thread] = []

    @staticmethod
    def _start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "tgc.backends.compile_worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def submit(self, kind: str, src: str, op: str = "compile") -> Future:
        fut: Future = Future()
        i = self.next % len(self.procs)
        self.next += 1

        def work() -> None:
            with self.locks[i]:
                if not fut.set_running_or_notify_cancel():  # cancelled while it waited (BEAM's deadline passed)
                    return
                proc = self.procs[i]
                try:
                    proc.stdin.write(json.dumps({"kind": kind, "src": src, "op": op}) + "\n")
                    proc.stdin.flush()
                    ans = json.loads(proc.stdout.readline())
                except (OSError, ValueError) as e:
                    # the compiler crashed on this source (LLVM can abort on an assertion): replace the worker
                    proc.kill()
                    proc.wait()
                    self.procs[i] = self._start()
                    fut.set_exception(RuntimeError(f"compile worker died: {e}"))
                    return
            if ans["ok"]:
                fut.seconds = float(ans.get("seconds") or 0.0)  # type: ignore[attr-defined]
                fut.set_result(base64.b64decode(ans["bin"]))
            else:
                fut.set_exception(RuntimeError(ans["error"]))

        t = threading.Thread(target=work, daemon=True)
        t.start()
        self.threads = [*(old for old in self.threads if old.is_alive()), t]
        return fut

    def kill(self) -> None:
        """Kill every worker (one stuck on a source); the calls waiting on them fail and new workers start."""
        for p in self.procs:
            p.kill()

    def shutdown(self, cancel_futures: bool = True) -> None:
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
            p.terminate()
            p.wait(timeout=5)


if __name__ == "__main__":
    main()
