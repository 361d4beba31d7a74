"""`tgc serve` enforces `--request-time` while kernels run, runs sessions side by side, and limits sessions per
token (issue 25, items 2 and 3).

The servers run in this process on loopback (the CPU's launches run in the server's worker processes, so a
kernel that never ends costs a worker, not the server). Deadlines are short (1.5 s); each test's long work
would run far longer (a graph of about 24 s, a kernel that never returns) if the deadline did not stop it.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.test_remote_server import _plus_one_source, batch, needs_cpu, post
from tgc.backends.remote import protocol as P
from tgc.backends.remote.server import Limits, read_server_tokens, serve
from tgc.errors import TgcError

DEADLINE = 1.5

# a client-built kernel: `iters` volatile stores (about a millisecond per 3 million here)
BUSY_SRC = """define void @busy(ptr %data0, i32 %iters, i32 %core_id) {
entry:
  br label %loop
loop:
  %i = phi i32 [0, %entry], [%n, %loop]
  %n = add i32 %i, 1
  store volatile i32 %n, ptr %data0
  %more = icmp slt i32 %n, %iters
  br i1 %more, label %loop, label %done
done:
  ret void
}
; tgc-launch: {"bufs":[4],"global_size":[1],"local_size":null,"vals":1}
"""

# a client-built kernel that never returns
SPIN_SRC = """define void @spin(ptr %data0, i32 %core_id) {
entry:
  br label %loop
loop:
  %i = phi i32 [0, %entry], [%n, %loop]
  %n = add i32 %i, 1
  store volatile i32 %n, ptr %data0
  br label %loop
}
; tgc-launch: {"bufs":[4],"global_size":[1],"local_size":null,"vals":0}
"""


def _ok(port: int, session: str, *reqs: P.Request, blobs: dict[str, bytes] | None = None,
        token: str | None = None) -> tuple[list, dict]:
    status, kind, body = post(port, batch(*reqs, blobs=blobs), session=session, token=token)
    assert status == 200, (status, kind, body)
    return P.decode_results(body)


def _load(port: int, session: str, src: str, name: str) -> None:
    """Compile `src` in `session` and make it program 1, with a 4-byte buffer 1."""
    (h,), blobs = _ok(port, session, P.Compile(src=src))
    _ok(port, session, P.ProgramAlloc(prog=1, name=name, datahash=h), P.BufferAlloc(buf=1, size=4),
        blobs={h: bytes(blobs[h])})


class _Other:
    """A second client with the `x + 1` kernel loaded: `run()` computes it for new values and checks them."""

    def __init__(self, port: int, n: int = 4096):
        self.port, self.n, self.sid = port, n, "other-client-0123456789"
        name, src, self.grid = _plus_one_source(n)
        (h,), blobs = _ok(port, self.sid, P.Compile(src=src))
        _ok(port, self.sid, P.ProgramAlloc(prog=1, name=name, datahash=h), P.BufferAlloc(buf=1, size=4 * n),
            P.BufferAlloc(buf=2, size=4 * n), blobs={h: bytes(blobs[h])})
        self.run(0)

    def run(self, seed: int) -> None:
        x = np.random.default_rng(seed).standard_normal(self.n).astype(np.float32)
        results, blobs = _ok(self.port, self.sid, P.CopyIn(buf=2, datahash=P.digest(x.tobytes())),
                             P.ProgramExec(prog=1, bufs=(1, 2), global_size=self.grid), P.CopyOut(buf=1),
                             blobs={P.digest(x.tobytes()): x.tobytes()})
        np.testing.assert_array_equal(np.frombuffer(blobs[results[2]], np.float32), x + 1)


def _ready(srv) -> None:
    """Wait until every launch worker has started (on a busy machine that can take longer than a deadline)."""
    give_up = time.monotonic() + 60
    while not (srv.launchers is not None and srv.launchers.ready()) and time.monotonic() < give_up:
        time.sleep(0.02)
    assert srv.launchers.ready()


def _while_running(srv, sid: str, body: bytes, other: _Other) -> tuple[tuple[int, str | None, bytes], float, bool]:
    """Post `body` for session `sid` from a thread; once its batch runs, let `other` run. Returns the long
    batch's answer, how long it took, and whether `other` was done before that answer came."""
    answer: list = []

    def long_client() -> None:
        start = time.monotonic()
        answer.append(post(srv.port, body, session=sid))
        answer.append(time.monotonic() - start)

    t = threading.Thread(target=long_client)
    t.start()
    give_up = time.monotonic() + 30
    while not (sid in srv.sessions and srv.sessions[sid].busy) and time.monotonic() < give_up:
        time.sleep(0.01)
    assert srv.sessions[sid].busy, "the long batch never started"
    other.run(1)
    other_first = not answer
    t.join(60)
    assert not t.is_alive(), "the long batch was not stopped"
    return answer[0], answer[1], other_first


@pytest.fixture
def deadline_server():
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(request_time=DEADLINE)).start()
    yield srv
    srv.shutdown()


@needs_cpu
def test_a_long_graph_is_stopped_at_the_deadline_while_another_client_runs(deadline_server):
    srv, sid = deadline_server, "long-graph-0123456789"
    other = _Other(srv.port)
    _load(srv.port, sid, BUSY_SRC, "busy")
    launches = 4000
    kernel = P.GraphKernel(prog=1, bufs=(1,), global_size=(1, 1, 1), vals=(20_000_000,))  # ~6 ms each: ~24 s in all
    _ok(srv.port, sid, P.GraphAlloc(graph=1, kernels=(kernel,) * launches))
    _ready(srv)
    (status, kind, body), took, other_first = _while_running(srv, sid, batch(P.GraphExec(graph=1, wait=True)), other)
    assert (status, kind) == (408, "limit"), body
    assert b"request time limit of 1.5s" in body and b"stopped before graph 1 kernel" in body, body
    stopped_at = int(body.split(b"kernel ")[-1].split()[0])
    assert 0 < stopped_at < launches
    assert other_first, "the other client waited for the long graph"
    assert took < DEADLINE + 3, took  # stopped, not run to its end (about 24 s)
    assert srv.launchers.kills == 0  # the worker stopped by itself between launches
    # the server goes on, and so does this session: the next request is served, the buffer holds the last count
    results, blobs = _ok(srv.port, sid, P.CopyOut(buf=1))
    assert np.frombuffer(blobs[results[0]], np.int32)[0] == 20_000_000
    other.run(2)


@needs_cpu
def test_a_kernel_that_never_returns_is_stopped_at_the_deadline_while_another_client_runs(deadline_server):
    srv, sid = deadline_server, "spin-loop-0123456789"
    other = _Other(srv.port)
    _load(srv.port, sid, SPIN_SRC, "spin")
    _ready(srv)
    req = P.ProgramExec(prog=1, bufs=(1,), global_size=(1, 1, 1), wait=True)
    (status, kind, body), took, other_first = _while_running(srv, sid, batch(req), other)
    assert (status, kind) == (408, "limit"), body
    assert b"request time limit of 1.5s" in body and b"the kernel was stopped (its worker process killed)" in body
    assert other_first, "the other client waited for the spinning kernel"
    assert took < DEADLINE + 3, took
    assert srv.launchers.kills == 1
    results, blobs = _ok(srv.port, sid, P.CopyOut(buf=1))  # served next; the kernel had counted on
    assert np.frombuffer(blobs[results[0]], np.int32)[0] != 0
    _ready(srv)  # a fresh worker replaces the killed one
    other.run(3)


@needs_cpu
def test_a_kernel_that_crashes_loses_its_worker_not_the_server(deadline_server):
    srv, sid = deadline_server, "crash-client-0123456789"
    src = SPIN_SRC.replace("store volatile i32 %n, ptr %data0", "store volatile i32 %n, ptr null")
    _load(srv.port, sid, src, "spin")
    _ready(srv)
    status, kind, body = post(srv.port, batch(P.ProgramExec(prog=1, bufs=(1,), global_size=(1, 1, 1), wait=True)),
                              session=sid)
    assert (status, kind) == (500, "device") and b"worker process died (signal SIGSEGV)" in body, body
    _ready(srv)  # a fresh worker replaces it
    _Other(srv.port).run(4)


# --- sessions per token


TOKENS = {"token-of-alice-0001": "alice", "token-of-bob-000002": "bob"}


@needs_cpu
def test_one_tokens_sessions_at_the_limit_do_not_keep_another_token_out():
    srv = serve("127.0.0.1", 0, "CPU", dict(TOKENS), Limits(max_sessions_per_token=3)).start()
    try:
        alice, bob = "token-of-alice-0001", "token-of-bob-000002"
        for i in range(3):  # alice's sessions, all holding memory and used just now (none may be evicted)
            _ok(srv.port, f"alice-{i}-0123456789", P.BufferAlloc(buf=1, size=8), token=alice)
        status, kind, body = post(srv.port, batch(P.BufferAlloc(buf=1, size=8)), session="alice-3-0123456789",
                                  token=alice)
        assert (status, kind) == (503, "busy")
        assert b"this token ('alice') holds 3 sessions, the limit per token" in body, body
        assert b"end one" in body
        for i in range(3):  # bob, from the same address, is not kept out
            _ok(srv.port, f"bob-{i}-0123456789", P.BufferAlloc(buf=1, size=8), token=bob)
        assert {s.owner for s in srv.sessions.values()} == {"alice", "bob"}
        # a session belongs to its token: bob cannot use alice's
        status, kind, body = post(srv.port, batch(P.BufferFree(buf=1)), session="alice-0-0123456789", token=bob)
        assert (status, kind) == (403, "auth") and b"belongs to another" in body
        _ok(srv.port, "alice-0-0123456789", P.EndSession(), token=alice)  # alice ends one: she gets one back
        _ok(srv.port, "alice-3-0123456789", P.BufferAlloc(buf=1, size=8), token=alice)
        assert post(srv.port, batch(), session="carol-0-0123456789", token="wrong")[0] == 401
    finally:
        srv.shutdown()


@needs_cpu
def test_without_a_token_the_limit_per_token_is_per_address():
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(max_sessions_per_token=2)).start()
    try:
        for i in range(2):
            _ok(srv.port, f"anon-{i}-0123456789", P.BufferAlloc(buf=1, size=8))
        status, kind, body = post(srv.port, batch(), session="anon-2-0123456789")
        assert (status, kind) == (503, "busy")
        assert b"this address (127.0.0.1) holds 2 sessions, the limit per token (the server has no token" in body
    finally:
        srv.shutdown()


def test_server_token_files(tmp_path):
    one = tmp_path / "one"
    one.write_text("s3cret\n")
    assert read_server_tokens(str(one)) == {"s3cret": "the token"}
    many = tmp_path / "many"
    many.write_text("# clients\nalice aaaa1111\n\nbob bbbb2222\ncccc3333\n")
    assert read_server_tokens(str(many)) == {"aaaa1111": "alice", "bbbb2222": "bob", "cccc3333": "token 3"}
    for text, why in [("a x\nb x\n", "repeats a token"), ("a x\na y\n", "repeats a name"),
                      ("a b c\nd e\n", "is not 'NAME TOKEN'"), ("# none\n", "holds no token"),
                      ("a x\nb \u00e9\n", "cannot be used")]:
        bad = tmp_path / "bad"
        bad.write_text(text)
        with pytest.raises(TgcError, match=why):
            read_server_tokens(str(bad))


def test_tgc_serve_takes_a_file_of_tokens_and_the_limit_per_token(tmp_path):
    from tgc.backends.remote.process import ServerProcess
    f = tmp_path / "tokens"
    f.write_text("alice token-of-alice-0001\nbob token-of-bob-000002\n")
    with ServerProcess("CPU", "--token-file", str(f), "--max-sessions-per-token", "1") as srv:
        assert "(2 tokens)" in srv.stderr()
        assert post(srv.port, batch(), session="alice-0-0123456789", token="token-of-alice-0001")[0] == 200
        status, kind, body = post(srv.port, batch(), session="alice-1-0123456789", token="token-of-alice-0001")
        # (an empty session makes room for the next of its token)
        assert status == 200, body
        assert post(srv.port, batch(P.BufferAlloc(buf=1, size=8)), session="alice-1-0123456789",
                    token="token-of-alice-0001")[0] == 200
        status, kind, body = post(srv.port, batch(), session="alice-2-0123456789", token="token-of-alice-0001")
        assert (status, kind) == (503, "busy") and b"this token ('alice') holds 1 session," in body, body
        assert post(srv.port, batch(), session="bob-0-0123456789", token="token-of-bob-000002")[0] == 200


# --- the CPU server's shared arena


def test_shared_arena_places_merges_and_gives_pages_back():
    from tgc.backends.remote.launcher import PAGE, SharedArena
    arena = SharedArena(1 << 20)
    try:
        a, b, c = arena.alloc(100), arena.alloc(16 * PAGE), arena.alloc(10)
        assert [arena.offset_of(h) for h in (a, b, c)] == [0, 128, 128 + 16 * PAGE]  # first fit, 64-byte blocks
        assert arena.live == 128 + 16 * PAGE + 64
        b[:] = 0xFF
        arena.free(b, 16 * PAGE)
        again = arena.alloc(16 * PAGE)  # the same place, not zeroed by anyone but the system:
        assert arena.offset_of(again) == 128
        inside = slice(PAGE - 128, 16 * PAGE - 128)  # the whole pages no live block shares went back (zeros)
        assert (again[inside] == 0).all()
        assert (again[:PAGE - 128] == 0xFF).all() and (again[16 * PAGE - 128:] == 0xFF).all()  # shared pages kept
        for h, n in [(a, 100), (c, 10), (again, 16 * PAGE)]:
            arena.free(h, n)
        assert arena.free_blocks == [(0, arena.size)] and arena.live == 0  # merged back into one block
        with pytest.raises(MemoryError):
            arena.alloc(arena.size + 1)
    finally:
        arena.close()


def _children(pid: int) -> set[int]:
    import glob
    out: set[int] = set()
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                out |= {int(c) for c in f.read().split()}
        except FileNotFoundError:  # a thread that just ended
            pass
    return out


def _gone(pid: int, wait: float = 10.0) -> bool:
    import os
    give_up = time.monotonic() + wait
    while time.monotonic() < give_up:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[-1].startswith("Z"):  # (a zombie is done running)
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return not os.path.exists(f"/proc/{pid}")


@needs_cpu
@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_a_server_that_stops_mid_kernel_leaves_no_worker_running(python_sigint, how):
    import signal

    from tgc.backends.remote.process import ServerProcess
    srv = ServerProcess("CPU", "--request-time", "60").start()
    try:
        sid = "stopped-server-0123456789"
        _load(srv.port, sid, SPIN_SRC, "spin")
        before = _children(srv.proc.pid)
        def spin() -> None:
            try:
                post(srv.port, batch(P.ProgramExec(prog=1, bufs=(1,), global_size=(1, 1, 1))), session=sid)
            except Exception:  # the server went away: no answer (or half of one)
                pass

        threading.Thread(target=spin, daemon=True).start()
        time.sleep(0.5)  # the kernel spins in one of the workers
        workers = _children(srv.proc.pid) | before
        assert workers, "no launch worker"
        if how == "SIGINT":
            assert srv.stop(signal.SIGINT, wait=20) == 0  # Ctrl-C: a clean stop, the spinning worker killed
        else:
            srv.kill()  # the workers notice that their server is gone
        assert all(_gone(w) for w in workers), [w for w in workers if not _gone(w, 0)]
    finally:
        srv.kill()


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_no_kernel_of_a_graph_starts_past_the_deadline(device):
    """With a deadline already passed when the graph starts, its first kernel is not run: in the launch worker
    (CPU) and in the server's own loop (other devices) alike."""
    import tgc
    from tgc.backends import device_class, get_device
    from tgc.codegen.kernel import build_kernel
    if not device_class(device).probe()[0]:
        pytest.skip(f"{device} is not available here")
    n = 64
    (item,) = tgc.loads("x: f32[N]\nreturn x + 1\n").schedule({"N": n})
    k = build_kernel(item, get_device(device))
    srv = serve("127.0.0.1", 0, device, None).start()
    try:
        sid = "late-graph-0123456789"
        (h,), blobs = _ok(srv.port, sid, P.Compile(src=k.src))
        _ok(srv.port, sid, P.ProgramAlloc(prog=1, name=k.name, datahash=h), blobs={h: bytes(blobs[h])})
        _ok(srv.port, sid, P.BufferAlloc(buf=1, size=4 * n))
        _ok(srv.port, sid, P.BufferAlloc(buf=2, size=4 * n))
        launch = P.GraphKernel(prog=1, bufs=(1, 2), global_size=tuple(k.global_size),
                               local_size=tuple(k.local_size) if k.local_size else None)
        _ok(srv.port, sid, P.GraphAlloc(graph=1, kernels=(launch,) * 3))
        if device == "CPU":
            _ready(srv)
        srv.limits.request_time = 0.0  # from now on, every batch is late as soon as it starts
        status, kind, body = post(srv.port, batch(P.GraphExec(graph=1, wait=True)), session=sid)
        assert (status, kind) == (408, "limit"), body
        assert b"stopped before graph 1 kernel 0" in body, body
        results, blobs = _ok(srv.port, sid, P.CopyOut(buf=1))
        assert not np.frombuffer(blobs[results[0]], np.float32).any()  # nothing ran: still the zeroed buffer
        srv.limits.request_time = 60.0
        _ok(srv.port, sid, P.GraphExec(graph=1, wait=True))  # the same graph in time: it runs
        results, blobs = _ok(srv.port, sid, P.CopyOut(buf=1))
        np.testing.assert_array_equal(np.frombuffer(blobs[results[0]], np.float32), np.ones(n, np.float32))
    finally:
        srv.shutdown()
