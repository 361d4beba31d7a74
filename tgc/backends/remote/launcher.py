"""Launches of a `tgc serve` of the CPU in worker processes that the server can kill at a deadline.

A CPU kernel is native code: once called, nothing in the calling process can stop it. So the server of the
CPU keeps every session's buffers in one shared memory arena (`SharedArena`: a memfd mapped by the server
and by each worker) and runs launches in worker processes (`LaunchWorkers`): a launch is a message naming
the kernel (its object bytes, sent once per worker) and the arena offsets of its buffers; the worker loads
the kernel as the CPU device does, runs it on its own threads and answers with the time it took.

Contracts:
- Each message carries the batch's deadline (a `time.monotonic()` value: one clock for all processes on
  Linux). The worker checks it before each launch and stops there, answering which launch it did not start
  (a long graph of short kernels is stopped that way, the worker kept). The server waits for the answer until
  the deadline and `GRACE` seconds more; past that (a kernel still running), the worker is killed (SIGKILL,
  then waited for: no thread of it can write into the arena after `run` returns) and a fresh one replaces it
  on the next launch. Either way `run` raises `LaunchTimeout`. Buffers live in the server's arena, so a
  killed worker loses no session's state, only its cache of loaded kernels (the buffers the killed launch
  wrote hold partial output).
- A worker that dies by itself (a kernel that faults) raises `LaunchCrashed`; the server goes on.
- At most `capacity` launches run at once (one per worker); `run` waits for a free worker, up to the deadline.
- The protocol is JSON lines on the worker's stdin/stdout (object bytes in base64): never pickle.
- The arena: `size` bytes of address space (pages are backed only when written), blocks aligned to 64 bytes,
  first fit. Freed blocks give their whole pages back to the system at once (MADV_REMOVE).
"""

from __future__ import annotations

import base64
import bisect
import json
import mmap
import os
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from tgc.backends.base import Allocator
from tgc.backends.cpu import HostBuffer, data_address
from tgc.interfaces import MemoryFeatures

ALIGN = 64
PAGE = mmap.PAGESIZE
GRACE = 0.2  # seconds past the deadline a worker has to stop by itself (finishing the launch it runs) or be killed


class SharedArena(Allocator):
    """Host memory shared with the launch workers; the interface of the CPU's allocator (`alloc`, `free`,
    `copyin`, `copyout`; no `offset`: like the CPU's, no buffer views), handles are numpy byte arrays that know
    their `address`."""

    features = MemoryFeatures(host_buffers=True)

    def __init__(self, size: int):
        self.size = -(-max(size, PAGE) // PAGE) * PAGE
        self.fd = os.memfd_create("tgc-serve-arena", 0)  # (not inherited: passed to workers by pass_fds)
        os.ftruncate(self.fd, self.size)
        self.map = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.array = np.frombuffer(self.map, dtype=np.uint8)
        self.base = self.array.ctypes.data
        self.lock = threading.Lock()
        self.free_blocks: list[tuple[int, int]] = [(0, self.size)]  # (offset, size), sorted, coalesced
        self.blocks: dict[int, int] = {}  # offset -> size of each live block
        self.live = 0  # bytes in live blocks

    def alloc(self, nbytes: int) -> Any:
        need = -(-max(nbytes, 1) // ALIGN) * ALIGN
        with self.lock:
            i = next((j for j, block in enumerate(self.free_blocks) if block[1] >= need), None)
            if i is None:
                raise MemoryError(f"no free block of {nbytes} bytes in the shared arena")
            off, size = self.free_blocks[i]
            if size == need:
                del self.free_blocks[i]
            else:
                self.free_blocks[i] = (off + need, size - need)
            self.blocks[off] = need
            self.live += need
        return self._handle(off, nbytes)

    def _handle(self, off: int, nbytes: int) -> Any:
        handle = self.array[off:off + nbytes].view(HostBuffer)
        handle.address = self.base + off
        return handle

    def offset_of(self, handle: Any) -> int:
        """Where a handle (or a view of one) starts in the arena."""
        return data_address(handle) - self.base

    def free(self, handle: Any, nbytes: int) -> None:
        off = self.offset_of(handle)
        with self.lock:
            size = self.blocks.pop(off)
            self.live -= size
            i = bisect.bisect(self.free_blocks, (off, 0))
            start, end = off, off + size
            if i < len(self.free_blocks) and self.free_blocks[i][0] == end:  # merge with the next free block
                end += self.free_blocks.pop(i)[1]
            if i > 0 and sum(self.free_blocks[i - 1]) == start:  # ... and the previous one
                start = self.free_blocks[i - 1][0]
                i -= 1
                del self.free_blocks[i]
            self.free_blocks.insert(i, (start, end - start))
            # the pages the freed block touches that no live block shares
            lo = off // PAGE * PAGE
            lo = lo if lo >= start else lo + PAGE
            hi = -(-(off + size) // PAGE) * PAGE
            hi = hi if hi <= end else hi - PAGE
        if hi > lo:
            self.map.madvise(mmap.MADV_REMOVE, lo, hi - lo)  # the pages go back; they read as zeros after

    @staticmethod
    def copyin(handle: Any, src: memoryview) -> None:
        np.copyto(handle, np.frombuffer(src, dtype=np.uint8))

    @staticmethod
    def copyout(dest: memoryview, handle: Any) -> None:
        np.copyto(np.frombuffer(dest, dtype=np.uint8), handle)

    def close(self) -> None:
        self.array = None  # type: ignore[assignment]
        try:
            self.map.close()
        except BufferError:  # a handle still points into it: the mapping goes with the process
            pass
        os.close(self.fd)


class LaunchTimeout(Exception):
    """The launches ran past their deadline: `stopped_before` is the first launch not started (the worker stopped
    there), or None when the worker was killed mid-launch or none came free (`started` False)."""

    def __init__(self, msg: str, started: bool, stopped_before: int | None = None):
        super().__init__(msg)
        self.started, self.stopped_before = started, stopped_before


class LaunchCrashed(Exception):
    """The worker died running the launch (a kernel that faults)."""


class LaunchFailed(Exception):
    """The worker could not run the launch (an object it cannot load): its message."""


@dataclass
class Launch:
    """One kernel launch: the kernel (`key` names its object bytes `lib` and kernel `name`), the arena offsets of
    its buffers, its grid and its integer arguments."""

    key: str
    name: str
    lib: bytes
    offsets: list[int]
    global_size: tuple[int, ...]
    vals: tuple[int, ...]


class _Worker:
    KEEP = 512  # loaded kernels a worker keeps (the oldest are dropped)

    def __init__(self, arena: SharedArena):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tgc.backends.remote.launcher", str(arena.fd), str(arena.size), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, pass_fds=(arena.fd,))
        self.loaded: OrderedDict[str, None] = OrderedDict()
        self.pending = b""

    def send(self, launches: list[Launch], deadline: float) -> None:
        programs, drop = {}, []
        for k in launches:
            if k.key in self.loaded:
                self.loaded.move_to_end(k.key)
            elif k.key not in programs:
                programs[k.key] = [k.name, base64.b64encode(k.lib).decode()]
        for key in programs:
            self.loaded[key] = None
        while len(self.loaded) > self.KEEP:
            drop.append(self.loaded.popitem(last=False)[0])
        msg = {"programs": programs, "drop": drop, "deadline": deadline,
               "launches": [[k.key, k.offsets, list(k.global_size), list(k.vals)] for k in launches]}
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def answer(self, deadline: float) -> dict[str, Any] | None:
        """The worker's answer, or None when the deadline passes first. EOFError when the worker died."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        poll = select.poll()  # (not select.select: a server with 1024 or more descriptors open refuses it)
        poll.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not poll.poll(max(1, int(left * 1000))):
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return json.loads(line)

    def kill(self) -> int:
        self.proc.kill()
        return self.proc.wait()

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        self.kill()


class LaunchWorkers:
    """Up to `capacity` launch workers over one arena, started when first needed."""

    def __init__(self, arena: SharedArena, capacity: int):
        self.arena, self.capacity = arena, max(1, capacity)
        self.idle: list[_Worker] = []
        self.all: set[_Worker] = set()  # every live worker, idle or running (killed at close)
        self.started = 0  # workers alive (idle or running), counting those being started
        self.cond = threading.Condition()
        self.closed = False
        self.kills = 0  # workers killed at a deadline (for tests and logs)

    def ready(self) -> bool:
        """Whether every worker is started, ready and idle."""
        with self.cond:
            return len(self.idle) == self.capacity

    def warm(self) -> None:
        """Start every worker now (a client's first launch then finds one ready)."""
        while True:
            with self.cond:
                if self.closed or self.started >= self.capacity:
                    return
                self.started += 1
            try:
                worker = self._new()
            except BaseException:
                with self.cond:
                    self.started -= 1
                return
            self._release(worker)

    STARTUP = 60.0  # seconds a new worker may take to say it is ready (imports on a busy machine)

    def _new(self) -> _Worker:
        """A started worker that has said it is ready (it has mapped the arena and imported the CPU device)."""
        worker = _Worker(self.arena)
        with self.cond:
            self.all.add(worker)
        try:
            ready = worker.answer(time.monotonic() + self.STARTUP)
        except (OSError, EOFError, ValueError):
            ready = None
        if not (ready or {}).get("ready"):
            with self.cond:
                self.all.discard(worker)
            worker.kill()
            raise RuntimeError("a launch worker did not start")
        return worker

    def _acquire(self, deadline: float) -> _Worker | None:
        with self.cond:
            while not self.idle and self.started >= self.capacity:
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    return None
                self.cond.wait(left)
            if self.closed:
                return None
            if self.idle:
                return self.idle.pop()
            self.started += 1
        try:
            return self._new()
        except BaseException:
            with self.cond:
                self.started -= 1
                self.cond.notify()
            raise

    def _release(self, worker: _Worker | None) -> None:
        with self.cond:
            if worker is None:
                self.started -= 1
            elif self.closed:
                self.started -= 1
                self.all.discard(worker)
                worker.close()
            else:
                self.idle.append(worker)
            self.cond.notify()

    def run(self, launches: list[Launch], deadline: float) -> list[float]:
        """Run `launches` in order in one worker; their times in seconds. Raises LaunchTimeout past `deadline`
        (the worker is killed), LaunchCrashed when the worker dies, LaunchFailed for a kernel it cannot load."""
        worker = self._acquire(deadline)
        if worker is None:
            raise LaunchTimeout("no launch worker came free before the deadline", started=False)
        keep: _Worker | None = None
        try:
            try:
                worker.send(launches, deadline)
                ans = worker.answer(deadline + GRACE)
            except (OSError, EOFError, ValueError):
                with self.cond:
                    self.all.discard(worker)
                code = worker.kill()
                raise LaunchCrashed(f"the kernel's worker process died ({_exit_text(code)}); the server goes "
                                    "on") from None
            if ans is None:
                with self.cond:
                    self.all.discard(worker)
                worker.kill()
                self.kills += 1
                raise LaunchTimeout("the kernel was stopped (its worker process killed)", started=True)
            if not ans.get("ok") and "late" not in ans:
                worker.loaded.clear()  # it may have loaded some of the kernels: send them all again next time
            keep = worker
        finally:
            self._release(keep)
            if keep is None and not self.closed:  # a replacement starts now, not in the next batch's time
                threading.Thread(target=self.warm, name="tgc-serve-warm", daemon=True).start()
        if "late" in ans:
            raise LaunchTimeout("stopped at the deadline", started=True, stopped_before=int(ans["late"]))
        if not ans.get("ok"):
            raise LaunchFailed(str(ans.get("error")))
        return [float(t) for t in ans["times"]]

    def close(self) -> None:
        """Stop every worker, running ones too (their launches fail; the server is going away)."""
        with self.cond:
            self.closed = True
            idle, self.idle = self.idle, []
            self.started -= len(idle)
            live, self.all = list(self.all), set()
            self.cond.notify_all()
        for w in live:
            w.close()


def _exit_text(code: int) -> str:
    if code < 0:
        import signal
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


class _Ptr:
    """A buffer argument in a worker: its address in this process's mapping of the arena."""

    __slots__ = ("address",)

    def __init__(self, address: int):
        self.address = address


def main() -> None:
    """The worker: map the arena (fd, size and the server's pid from argv), then answer launch messages on stdin
    until it closes; exit as soon as the server is gone."""
    fd, size, parent = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])  # (the server may be gone already)

    def orphaned() -> None:  # a server that died (even by SIGKILL) leaves no worker spinning behind it
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=orphaned, daemon=True).start()
    arena = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    base = np.frombuffer(arena, dtype=np.uint8).ctypes.data
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # nothing else may write into the answers
    from tgc.backends.cpu import CPUDevice
    from tgc.backends.elf import load_object  # noqa: F401 (imported now, not in the first launch's time)
    dev = CPUDevice(0)
    programs: dict[str, Any] = {}
    out.write(b'{"ready": true}\n')
    out.flush()
    for line in sys.stdin.buffer:
        msg = json.loads(line)
        try:
            for key in msg["drop"]:
                programs.pop(key, None)
            for key, (name, lib) in msg["programs"].items():
                programs[key] = dev.program(name, base64.b64decode(lib))
            times: list[float] = []
            ans: dict[str, Any] = {"ok": True, "times": times}
            for i, (key, offsets, global_size, vals) in enumerate(msg["launches"]):
                if time.monotonic() >= msg["deadline"]:
                    ans = {"ok": False, "late": i}
                    break
                t = programs[key](*[_Ptr(base + o) for o in offsets], global_size=tuple(global_size),
                                  vals=tuple(vals), wait=True)
                times.append(t)
        except Exception as e:  # reported to the server, which refuses the launch with it
            ans = {"ok": False, "error": getattr(e, "msg", None) or f"{type(e).__name__}: {e}"}
        out.write(json.dumps(ans).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
