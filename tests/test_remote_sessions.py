"""REMOTE server sessions under concurrency: a Transfer never writes a buffer another batch may free, EndSession
ends its batch, and a session the server freed on its own says so."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from tests.test_remote_server import batch, client, needs_cpu, post
from tgc.backends.remote import protocol as P
from tgc.backends.remote.client import Connection
from tgc.backends.remote.server import Limits, serve
from tgc.errors import DeviceError

SIZE = 1 << 16


@pytest.fixture
def srv():
    s = serve("127.0.0.1", 0, "CPU", None).start()
    yield s
    s.shutdown()


def _results(body: bytes) -> tuple[list, dict]:
    return P.decode_results(body)


@needs_cpu
def test_a_transfer_waits_for_the_destination_sessions_batch(srv):
    """A Transfer into a session whose batch runs (and frees the buffer) must not write that buffer meanwhile:
    its memory may already be another session's fresh buffer."""
    src_sid, dest_sid, other_sid = "xfer-src-0123456789", "xfer-dest-0123456789", "xfer-other-0123456789"
    data = b"\x55" * SIZE
    assert post(srv.port, batch(P.BufferAlloc(buf=1, size=SIZE), P.CopyIn(buf=1, datahash=P.digest(data)),
                                blobs={P.digest(data): data}), session=src_sid)[0] == 200
    assert post(srv.port, batch(P.BufferAlloc(buf=1, size=SIZE)), session=dest_sid)[0] == 200
    dest = srv.sessions[dest_sid]
    got: list = []
    with dest.lock:  # (as while a batch of the destination session runs)
        t = threading.Thread(target=lambda: got.append(post(srv.port, batch(P.Transfer(
            buf=1, dest_session=dest_sid, dest_buf=1)), session=src_sid)))
        t.start()
        time.sleep(0.5)
        assert not got, "the Transfer ran while the destination session's batch held its lock"
        assert dest.busy == 1  # (counted busy: neither reaped nor evicted while the Transfer waits for it)
        srv._free_buffer(dest, 1)  # that batch frees the buffer, and another session gets the memory
        assert post(srv.port, batch(P.BufferAlloc(buf=1, size=SIZE)), session=other_sid)[0] == 200
    t.join(30)
    status, kind, body = got[0]
    assert (status, kind) == (404, "session") and b"no destination buffer 1" in body
    status, _, body = post(srv.port, batch(P.CopyOut(buf=1)), session=other_sid)
    results, blobs = _results(body)
    assert status == 200 and bytes(blobs[results[0]]) == bytes(SIZE)  # never the source's bytes
    assert dest.busy == 0


@needs_cpu
def test_sessions_transferring_into_each_other_at_once_do_not_deadlock(srv):
    sids = ["xfer-a-0123456789", "xfer-b-0123456789"]
    for k, sid in enumerate(sids):
        data = bytes([k + 1]) * SIZE
        assert post(srv.port, batch(P.BufferAlloc(buf=1, size=SIZE), P.BufferAlloc(buf=2, size=SIZE),
                                    P.CopyIn(buf=1, datahash=P.digest(data)), blobs={P.digest(data): data}),
                    session=sid)[0] == 200
    codes: list[int] = []

    def loop(me: str, other: str) -> None:
        for _ in range(40):
            codes.append(post(srv.port, batch(P.Transfer(buf=1, dest_session=other, dest_buf=2)), session=me)[0])

    ts = [threading.Thread(target=loop, args=(sids[0], sids[1])), threading.Thread(target=loop, args=sids[::-1])]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts) and codes == [200] * 80
    for k, sid in enumerate(sids):
        status, _, body = post(srv.port, batch(P.CopyOut(buf=2)), session=sid)
        results, blobs = _results(body)
        assert bytes(blobs[results[0]]) == bytes([2 - k]) * SIZE


@needs_cpu
def test_a_transfer_into_another_tokens_session_is_refused():
    srv = serve("127.0.0.1", 0, "CPU", {"a" * 32: "alice", "b" * 32: "bob"}).start()
    try:
        assert post(srv.port, batch(P.BufferAlloc(buf=1, size=64)), token="b" * 32, session="bob-0123456789ab")[0] \
            == 200
        status, kind, body = post(srv.port, batch(P.BufferAlloc(buf=1, size=64), P.Transfer(
            buf=1, dest_session="bob-0123456789ab", dest_buf=1)), token="a" * 32, session="alice-0123456789a")
        assert (status, kind) == (404, "session") and b"no such destination session" in body
        assert srv.sessions["bob-0123456789ab"].busy == 0
    finally:
        srv.shutdown()


@needs_cpu
def test_nothing_may_follow_end_session_in_a_batch(srv):
    """Requests after EndSession once ran on a session no longer in the table: their buffers were never freed nor
    counted against the memory limits."""
    sid = "after-end-0123456789"
    status, kind, body = post(srv.port, batch(P.EndSession(), P.BufferAlloc(buf=1, size=1 << 20)), session=sid)
    assert (status, kind) == (400, "protocol") and b"EndSession must end its batch" in body
    assert sid not in srv.sessions and sum(s.memory for s in srv.sessions.values()) == 0
    assert post(srv.port, batch(P.BufferAlloc(buf=1, size=64)), session=sid)[0] == 200
    assert post(srv.port, batch(P.BufferAlloc(buf=2, size=64), P.EndSession()), session=sid)[0] == 200
    assert sid not in srv.sessions
    if srv._arena is not None:
        assert srv.allocator.live == 0


@needs_cpu
def test_a_session_freed_for_idleness_says_so():
    s = serve("127.0.0.1", 0, "CPU", None, Limits(idle_timeout=0.2)).start()
    try:
        dev = client(s)
        h = dev.allocator.alloc(256)
        dev.flush()
        deadline = time.monotonic() + 30
        while dev.session in s.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(2):  # every later batch of it: the reason, not "no buffer 1" of a fresh empty session
            with pytest.raises(DeviceError, match=r"after \d+s idle \(its --idle-timeout is 0.2s\).*are gone"):
                dev.allocator.copyout(memoryview(bytearray(256)), h)
        assert dev.session not in s.sessions
        # a session that held nothing lost nothing: it simply starts again
        assert post(s.port, batch(), session="empty-0123456789")[0] == 200
        assert s.reap_idle(now=time.monotonic() + 10) >= 1
        assert post(s.port, batch(P.BufferAlloc(buf=1, size=8)), session="empty-0123456789")[0] == 200
    finally:
        s.shutdown()


def test_the_memory_of_freed_sessions_is_bounded(srv, monkeypatch):
    monkeypatch.setattr(type(srv), "MAX_EXPIRED", 3)
    for i in range(5):
        sid = f"gone-{i}-0123456789"
        assert post(srv.port, batch(P.BufferAlloc(buf=1, size=8)), session=sid)[0] == 200
        with srv.lock:
            srv._forget(srv.sessions[sid], "freed for the test")
    assert list(srv._expired) == [f"gone-{i}-0123456789" for i in (2, 3, 4)]
    assert post(srv.port, batch(), session="gone-0-0123456789")[0] == 200  # (forgotten: a new session)
    status, kind, body = post(srv.port, batch(), session="gone-4-0123456789")
    assert (status, kind) == (404, "session") and b"freed for the test" in body


class _CloseOnce:
    """A fake server that answers every request with a 200, except request number `drop` (from 0), which it reads
    whole and then closes the connection on without an answer (as a server that ran the batch and then died)."""

    def __init__(self, drop: int):
        self.drop, self.seen = drop, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_request(f: Any) -> bool:
        """Read one request (head and body) from `f`; False where the client closed first."""
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            line = f.readline()
            if not line:
                return False
            head += line
        f.read(int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0]))
        return True

    def _one(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        with conn, f:
            while self._read_request(f):
                k, self.seen = self.seen, self.seen + 1
                if k == self.drop:
                    conn.shutdown(socket.SHUT_RDWR)
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


def test_a_batch_the_server_may_have_run_is_not_sent_again():
    """A kept-alive connection closed after the server read the whole batch: the batch may have run (a copy in, a
    launch that accumulates), so it is one 'lost the connection' error, never sent a second time."""
    fake = _CloseOnce(drop=1)
    conn = Connection("127.0.0.1", fake.port, None, "retry-0123456789ab", timeout=10.0, retry=0.0)
    try:
        assert conn.post(b"first") == b"ok"
        with pytest.raises(DeviceError, match="lost the connection.*may have run this batch"):
            conn.post(b"second")
        assert fake.seen == 2
        assert conn.post(b"third") == b"ok" and fake.seen == 3  # (a fresh connection for the next one)
    finally:
        conn.close()
        fake.sock.close()


def test_a_connection_the_server_closed_while_idle_is_reopened_without_an_error():
    fake = _CloseOnce(drop=-1)
    conn = Connection("127.0.0.1", fake.port, None, "retry-0123456789ab", timeout=10.0, retry=0.0)
    try:
        assert conn.post(b"first") == b"ok"
        conn._conn.sock.shutdown(socket.SHUT_RD)  # (seen as closed by the peer before the next request)
        assert conn.post(b"second") == b"ok" and fake.seen == 2
    finally:
        conn.close()
        fake.sock.close()


# --- connections, bodies and the compile cache are bounded


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes `sock` (nothing read) within `seconds`."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_connection_that_sends_no_request_is_closed_after_the_header_time():
    """128 connections of nobody, sending nothing, once held every slot for the request time (60 s)."""
    s = serve("127.0.0.1", 0, "CPU", "t0ken-0123456789", Limits(header_time=1.0, request_time=60.0)).start()
    try:
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", s.port)) as idle:
            assert _closed_within(idle, 10.0) and time.monotonic() - start < 5.0
        with socket.create_connection(("127.0.0.1", s.port)) as slow:  # a request line, headers never ended
            slow.sendall(b"POST /batch HTTP/1.1\r\nHost: x\r\n")
            assert _closed_within(slow, 10.0)
        # a client that showed the token keeps its connection open for its next request
        with socket.create_connection(("127.0.0.1", s.port)) as good:
            body = batch()
            head = (f"POST /batch HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0ken-0123456789\r\n"
                    f"{P.SESSION_HEADER}: keep-0123456789ab\r\nContent-Length: {len(body)}\r\n\r\n").encode()
            for _ in range(2):
                good.sendall(head + body)
                good.settimeout(10)
                assert good.recv(65536).startswith(b"HTTP/1.1 200")
                assert not _closed_within(good, 2.5)
    finally:
        s.shutdown()


def test_connections_of_one_address_are_capped():
    s = serve("127.0.0.1", 0, "CPU", None, Limits(max_connections=10, max_connections_per_client=2)).start()
    try:
        idle = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(2)]
        deadline = time.monotonic() + 10
        while len(s.conns) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as third:
            answer = third.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503") and b"this client address has too many connections" in answer
        for c in idle:
            c.close()
        deadline = time.monotonic() + 10
        while s.conns and time.monotonic() < deadline:
            time.sleep(0.01)
        assert post(s.port, batch())[0] == 200
    finally:
        s.shutdown()


def test_request_bodies_held_at_once_are_bounded():
    """Bodies were held whole per connection whatever --max-memory: many stalled ones held gigabytes."""
    n = 1 << 20
    s = serve("127.0.0.1", 0, "CPU", None, Limits(max_memory=n, max_body=n)).start()
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as stalled:
            stalled.sendall((f"POST /batch HTTP/1.1\r\nHost: x\r\n{P.SESSION_HEADER}: stall-0123456789ab\r\n"
                             f"Content-Length: {n}\r\n\r\n").encode() + b"TGC1")
            deadline = time.monotonic() + 10
            while s.body_bytes < n and time.monotonic() < deadline:
                time.sleep(0.01)
            status, kind, body = post(s.port, batch())
            assert (status, kind) == (503, "busy") and b"bytes of request bodies" in body
        deadline = time.monotonic() + 10
        while s.body_bytes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.body_bytes == 0 and post(s.port, batch())[0] == 200
    finally:
        s.shutdown()


def test_the_compile_cache_is_bounded_in_bytes():
    s = serve("127.0.0.1", 0, "CPU", None, Limits(compile_cache_bytes=100))
    try:
        for k in range(3):
            s._keep_compiled(f"k{k}", (True, bytes(40), None))
        assert list(s._compiled) == ["k1", "k2"] and s._compiled_bytes == 80
        s._keep_compiled("k1", (False, "x" * 10, None))  # (kept again: counted once, newest last)
        assert list(s._compiled) == ["k2", "k1"] and s._compiled_bytes == 50
        s._keep_compiled("huge", (True, bytes(101), None))  # more than the whole cache: not kept
        assert "huge" not in s._compiled and s._compiled_bytes == 50
    finally:
        s.close()


def test_serve_refuses_a_request_time_of_zero():
    from tests.clikit import invoke
    r = invoke("serve", "--request-time", "0", "--port", "0")
    assert r.exit_code == 2 and "--request-time" in r.output


# --- second review: descriptors past 1024, the idle close in flight, caps that count only tokenless connections


def test_the_idle_checks_work_for_descriptors_past_1024():
    """`select.select` refuses a descriptor >= 1024 (ValueError), which read as 'the server closed it': a client
    with many files open opened a new connection for every batch."""
    import resource

    from tgc.backends.remote.client import _Wire
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200 and hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("the hard limit on open files is under 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while True:
            a, b = socket.socketpair()
            held += [a, b]
            if a.fileno() >= 1024:
                break
        wire = _Wire(a)
        assert not wire.readable() and not wire.peer_closed()  # (open, nothing to read)
        b.sendall(b"x")
        assert wire.readable() and not wire.peer_closed()
        b.close()
        wire.rfile.read(1)
        assert wire.peer_closed()
    finally:
        for s in held:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class _ClosesWhenIdle(_CloseOnce):
    """A fake server that reads a request arriving on a connection idle for `idle` seconds or more and closes
    without an answer: as a server whose close of the idle connection was on its way when the batch was sent."""

    def __init__(self, idle: float):
        self.idle, self.connections = idle, 0
        super().__init__(drop=-1)

    def _one(self, conn: socket.socket) -> None:
        self.connections += 1
        f = conn.makefile("rb")
        last = time.monotonic()
        with conn, f:
            while self._read_request(f):
                self.seen += 1
                if time.monotonic() - last >= self.idle:
                    conn.shutdown(socket.SHUT_RDWR)
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                last = time.monotonic()


def test_a_connection_idle_for_nearly_the_servers_request_time_is_not_reused():
    fake = _ClosesWhenIdle(idle=0.5)
    conn = Connection("127.0.0.1", fake.port, None, "stale-0123456789ab", timeout=10.0, retry=0.0)
    conn.reuse_within(1.0)  # (a request time of 1 s: reused for less than 0.5 s idle)
    try:
        assert conn.reuse_for == 0.5
        assert conn.post(b"first") == b"ok"
        time.sleep(0.05)
        assert conn.post(b"soon after") == b"ok" and fake.connections == 1  # (kept alive)
        time.sleep(0.6)
        assert conn.post(b"after a pause") == b"ok" and fake.connections == 2 and fake.seen == 3
    finally:
        conn.close()
        fake.sock.close()
    assert Connection("h", 1, None, "s" * 16, 1.0, 0.0).reuse_for is None  # (no request time known: kept)


def test_a_remote_device_reuses_its_connection_only_within_the_servers_request_time():
    s = serve("127.0.0.1", 0, "CPU", None, Limits(request_time=20.0)).start()
    try:
        dev = client(s)
        assert dev.properties["request_time"] == 20.0
        assert dev._connection().reuse_for == 18.0  # (20 s less 10%)
        dev.close()
    finally:
        s.shutdown()


def _wait(cond, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def test_connections_that_showed_the_token_do_not_count_against_the_per_address_cap():
    """Two processes of 32 REMOTE devices each (64 kept-alive connections) were refused by a per-address cap of
    64 all connections: the cap counts only connections that have not yet shown a token."""
    token = "t0ken-0123456789abcdef"
    s = serve("127.0.0.1", 0, "CPU", token, Limits(max_connections=32, max_connections_per_client=2)).start()
    conns = [Connection("127.0.0.1", s.port, token, f"many-{i}-0123456789ab", timeout=10, retry=0) for i in range(6)]
    try:
        for c in conns:
            assert c.post(batch()) is not None
        assert _wait(lambda: not s.conn_peers) and len(s.conns) == 6
        idle = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(2)]
        assert _wait(lambda: len(s.conn_peers) == 2)
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as third:
            answer = third.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503") and b"have not yet shown a token" in answer
        for c in conns:  # (the kept-alive ones still work)
            assert c.post(batch()) is not None
        for i in idle:  # closed by the client: no longer counted, at once
            i.close()
        assert _wait(lambda: not s.conn_peers, 2.0)
        with socket.create_connection(("127.0.0.1", s.port), timeout=10):
            assert _wait(lambda: len(s.conn_peers) == 1, 2.0)
    finally:
        for c in conns:
            c.close()
        s.shutdown()


def test_tokenless_connections_from_several_addresses_cannot_shut_out_a_client_with_the_token():
    """Idle connections from two addresses filled `max_connections`: a client with the token found no room."""
    token = "t0ken-0123456789abcdef"
    s = serve("127.0.0.1", 0, "CPU", token, Limits(max_connections=8, max_connections_per_client=4)).start()
    held = []
    try:
        for src in ("127.0.0.2", "127.0.0.3"):
            for _ in range(4):
                c = socket.socket()
                c.bind((src, 0))
                c.connect(("127.0.0.1", s.port))
                held.append(c)
        assert _wait(lambda: s.httpd is not None and len(s.conn_peers) == 2)  # (a quarter of 8 at most)
        time.sleep(0.2)
        assert len(s.conn_peers) <= 2 and len(s.conns) <= 8
        for i in range(3):
            assert post(s.port, batch(), token=token, session=f"legit-{i}-0123456789")[0] == 200
        # all connections trusted and open: a new one is refused as busy (there is no untrusted one to give way)
        full = [Connection("127.0.0.1", s.port, token, f"full-{i}-0123456789ab", timeout=10, retry=0)
                for i in range(8)]
        for c in full:
            c.post(batch())
        assert _wait(lambda: len(s.conns) == 8 and not s.conn_peers)
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as late:  # (answered before any request)
            answer = late.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503") and b"the server has too many connections" in answer
        for c in full:
            c.close()
    finally:
        for c in held:
            c.close()
        s.shutdown()


def test_a_device_list_does_not_probe_its_remote_servers_again(monkeypatch):
    """A REMOTE device with its server's properties was probed again (REMOTE:0, two more connections): a refusal
    of that probe read 'device REMOTE:0 ... is not available here'."""
    from tests.test_remote_datapath import _drop_remote_instances, _use_server_without_token
    from tgc.api import device_list
    from tgc.backends import get_device
    s = serve("127.0.0.1", 0, "CPU", None, Limits(max_connections_per_client=2)).start()
    _use_server_without_token(monkeypatch, s.port)
    idle = []
    try:
        dev = get_device("REMOTE:0")
        assert dev.properties["kind"] == "CPU"
        idle = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(2)]
        assert _wait(lambda: len(s.conn_peers) == 2)
        assert [d.kind for d in device_list(["REMOTE:0"])] == ["REMOTE"]
    finally:
        for c in idle:
            c.close()
        _drop_remote_instances()
        s.shutdown()


def test_serve_refuses_times_that_are_not_finite():
    from tests.clikit import invoke
    for option, value in (("--request-time", "nan"), ("--request-time", "inf"), ("--idle-timeout", "nan"),
                          ("--idle-timeout", "inf")):
        r = invoke("serve", option, value, "--port", "0")
        assert r.exit_code == 2 and option in r.output and "finite" in r.output, (option, value, r.output)
    for name in ("request_time", "idle_timeout", "header_time", "evict_after"):
        for value in (float("nan"), float("inf"), -1.0):
            with pytest.raises(ValueError, match=name):
                Limits(**{name: value})


def test_an_evicted_session_names_the_session_limits_not_the_idle_timeout(srv):
    sid = "evicted-0123456789"
    assert post(srv.port, batch(P.BufferAlloc(buf=1, size=8)), session=sid)[0] == 200
    with srv.lock:
        srv.sessions[sid].last_seen -= 3600
        assert srv._evict([srv.sessions[sid]])
    status, kind, body = post(srv.port, batch(), session=sid)
    assert (status, kind) == (404, "session") and b"to make room" in body
    assert b"--max-sessions" in body and b"--idle-timeout" not in body


def test_the_reaper_goes_on_after_a_failed_pass(monkeypatch, capsys):
    s = serve("127.0.0.1", 0, "CPU", None, Limits(idle_timeout=0.2, request_time=1.0))
    calls = []

    def flaky(now=None):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("one bad pass")
        return 0
    monkeypatch.setattr(s, "close_late_connections", flaky)
    try:
        s.start()
        assert _wait(lambda: len(calls) >= 3, 10.0)
    finally:
        s.shutdown()
    assert "one bad pass" in capsys.readouterr().err


def test_one_token_holds_at_most_half_of_the_request_body_budget():
    """The bytes of request bodies held at once were one budget for all tokens: one token's stalled bodies
    (declared, never sent) shut every other token out."""
    n = 1 << 20
    tokens = {"a" * 32: "alice", "b" * 32: "bob"}
    s = serve("127.0.0.1", 0, "CPU", tokens, Limits(max_memory=4 * n, max_body=n)).start()
    stalled = []
    try:
        for i in range(2):  # alice: 2 MiB of bodies still being received, half of the 4 MiB budget
            c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            c.sendall((f"POST /batch HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {'a' * 32}\r\n"
                       f"{P.SESSION_HEADER}: stall-{i}-0123456789ab\r\nContent-Length: {n}\r\n\r\n").encode() + b"TGC1")
            stalled.append(c)
        assert _wait(lambda: s.body_bytes == 2 * n)
        status, kind, body = post(s.port, batch(), token="a" * 32, session="alice-0123456789ab")
        assert (status, kind) == (503, "busy") and b"this token is sending" in body
        assert post(s.port, batch(), token="b" * 32, session="bob-0123456789abcd")[0] == 200
    finally:
        for c in stalled:
            c.close()
        s.shutdown()
    assert _wait(lambda: s.body_bytes == 0 and not s.body_owners)
