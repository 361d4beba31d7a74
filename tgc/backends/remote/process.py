"""Run a REMOTE server in a child process on a free loopback port (for tests and benchmarks)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from tgc.errors import DeviceError

_SERVING = re.compile(r"serving (\S+) on http://127\.0\.0\.1:(\d+)")


class ServerProcess:
    """`tgc serve` (as `python -m tgc.cli.main serve`) on 127.0.0.1 and a port the OS picks; a context manager.

    stderr goes to a file (read it with `stderr()`), so a chatty server can never block on a full pipe.
    """

    def __init__(self, device: str = "CPU", *args: str, env: dict[str, str] | None = None):
        self.device, self.args = device, list(args)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self._log = tempfile.NamedTemporaryFile(prefix="tgc-serve-", suffix=".log", delete=False)
        self._closed_log: str | None = None  # what the log held when the context ended
        self._sigint_ignored = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stderr(self) -> str:
        if self._closed_log is not None:
            return self._closed_log
        with open(self._log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def start(self, wait: float = 60.0) -> ServerProcess:
        """Start the server and wait until it says where it listens."""
        cmd = [sys.executable, "-m", "tgc.cli.main", "serve", "--host", "127.0.0.1", "--port", "0", "-d", self.device,
               *self.args]
        # a child started while this process ignores SIGINT (an xdist worker, a job a shell started in the
        # background) ignores it too: `stop` then asks for the same clean stop with SIGTERM
        self._sigint_ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log,
                                     env=self.env)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            m = _SERVING.search(self.stderr())
            if m:
                self.port = int(m.group(2))
                return self
            if self.proc.poll() is not None:
                raise DeviceError(f"the server exited with {self.proc.returncode}: {self.stderr().strip()}")
            time.sleep(0.02)
        self.kill()
        raise DeviceError(f"the server did not start within {wait:g}s: {self.stderr().strip()}")

    def stop(self, sig: int = signal.SIGINT, wait: float = 30.0) -> int:
        """Send `sig` (Ctrl-C by default) and wait for the exit status (killing it after `wait` seconds). Ctrl-C to
        a server that inherited SIGINT ignored is SIGTERM, which the server handles as the same clean stop."""
        if self.proc is None:
            return 0
        if sig == signal.SIGINT and self._sigint_ignored:
            sig = signal.SIGTERM
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def freeze(self, wait: float = 60.0) -> None:
        """Stop the server (SIGSTOP) and return once every one of its threads has stopped.

        `kill` only queues a stop signal: the kernel wakes one thread, which stops the others when it next runs,
        so on a busy machine another thread (one blocked reading a kept-alive connection) can still answer a
        request sent right after `kill` returns. `waitpid(WUNTRACED)` reports the stop only once the whole
        process has stopped (this process is the server's parent). DeviceError if that takes over `wait` seconds
        or the server has exited."""
        if self.proc is None or self.proc.poll() is not None:
            raise DeviceError("the server is not running")
        os.kill(self.proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + wait
        while True:
            pid, status = os.waitpid(self.proc.pid, os.WUNTRACED | os.WNOHANG)
            if pid and os.WIFSTOPPED(status):
                return
            if pid:  # it exited (a status that Popen would have reaped: give it back to Popen)
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                raise DeviceError(f"the server exited with {self.proc.returncode} instead of stopping")
            if time.monotonic() > deadline:
                raise DeviceError(f"the server did not stop within {wait:g}s")
            time.sleep(0.005)

    def thaw(self) -> None:
        """Let a `freeze`d server run again (SIGCONT)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._closed_log = self.stderr()
        self._log.close()
        try:
            os.unlink(self._log.name)
        except OSError:
            pass
