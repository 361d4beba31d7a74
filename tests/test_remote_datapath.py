"""The REMOTE data path (docs/DESIGN.md "REMOTE data path"): gathering writes, large blobs named by random ids
and not hashed, and a server that never trusts a large blob's id."""

from __future__ import annotations

import http.client
import importlib.util
import io
import socket
import sys
import threading

import numpy as np
import pytest

from tgc.backends.remote import protocol as P
from tgc.backends.remote.server import serve

LARGE = P.LARGE_BLOB


def _cpu_ready() -> bool:
    if importlib.util.find_spec("tgc.backends.cpu") is None:
        return False
    from tgc.backends import device_class
    return device_class("CPU").probe()[0]


needs_cpu = pytest.mark.skipif(not _cpu_ready(), reason="the CPU device is not available")


@pytest.mark.parametrize("timeout", [None, 30.0])  # (with a timeout the first write is a non-blocking writev)
def test_send_all_writes_every_part_in_order_through_partial_sends(timeout):
    rng = np.random.default_rng(1)
    parts = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (0, 1, 7, 300_000, 5, 1_000_000, 3)]
    parts.append(memoryview(np.arange(1000, dtype=np.float32)))  # a non-byte view is sent as its bytes
    want = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # small buffers: sendmsg returns partial counts
    a.settimeout(timeout)
    got = bytearray()

    def read() -> None:
        while len(got) < len(want):
            chunk = b.recv(8192)
            if not chunk:
                return
            got.extend(chunk)

    t = threading.Thread(target=read)
    t.start()
    try:
        P.send_all(a, parts)
        t.join(30)
    finally:
        a.close()
        b.close()
    assert bytes(got) == want


def test_blob_ids_small_are_sha256_large_are_fresh_random_ids():
    small = b"x" * (LARGE - 1)
    assert P.blob_id(small) == P.digest(small)
    large = bytes(LARGE)
    first, second = P.blob_id(large), P.blob_id(large)
    assert first != second and first != P.digest(large) and len(bytes.fromhex(first)) == 32


def test_small_blobs_are_checked_large_blobs_are_not_hashed():
    small = b"hello"
    wrong = "00" * 32
    with pytest.raises(P.ProtocolError, match="sha256 does not match"):
        P.decode_body(P.encode_body({wrong: small}, "[]"))
    large = np.arange(LARGE // 4, dtype=np.float32).tobytes()
    blobs, text = P.decode_body(P.encode_body({wrong: large, P.digest(small): small}, "[]"))
    assert bytes(blobs[wrong]) == large and bytes(blobs[P.digest(small)]) == small and text == "[]"


@pytest.fixture
def server():
    srv = serve("127.0.0.1", 0, "CPU", None).start()
    yield srv
    srv.shutdown()


def _post(srv, *reqs: P.Request, blobs: dict[str, bytes]) -> tuple[int, bytes]:
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    try:
        conn.request("POST", P.BATCH_PATH, P.encode_requests(list(reqs), blobs),
                     {P.SESSION_HEADER: "datapath-session-0123456789"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@needs_cpu
def test_a_large_binary_under_a_known_binarys_id_is_refused(server):
    """The server hashes a binary itself: junk sent (unhashed, as a large blob) under the id of a binary it
    compiled is still one it did not compile."""
    import tgc
    from tgc.backends import get_device
    from tgc.codegen.kernel import build_kernel
    (item,) = tgc.loads("x: f32[N]\nreturn x + 1\n").schedule({"N": 64})
    k = build_kernel(item, get_device("CPU"))
    status, body = _post(server, P.Compile(src=k.src), blobs={})
    assert status == 200, body
    known = P.decode_results(body)[0][0]
    junk = bytes(LARGE)
    status, body = _post(server, P.ProgramAlloc(prog=1, name=k.name, datahash=known), blobs={known: junk})
    assert status == 400 and b"did not compile" in body, body


def _drop_remote_instances() -> None:
    """Forget cached REMOTE devices so the next `get_device("REMOTE")` reads TGC_REMOTE again."""
    from tgc import backends
    for key in [k for k in backends._instances if k[0] == "REMOTE"]:
        backends._instances.pop(key).close()


def _use_server_without_token(monkeypatch, port: int) -> None:
    """Point REMOTE at the tokenless server on this machine's `port` (no token in the environment) and forget
    cached REMOTE devices, so the next run connects to it."""
    monkeypatch.setenv("TGC_REMOTE", f"127.0.0.1:{port}")
    monkeypatch.delenv("TGC_REMOTE_TOKEN", raising=False)
    monkeypatch.delenv("TGC_REMOTE_TOKEN_FILE", raising=False)
    _drop_remote_instances()


@needs_cpu
def test_large_and_repeated_payloads_round_trip_through_remote(server, monkeypatch):
    """Inputs past LARGE_BLOB (two with equal bytes in one batch) and a large result, against numpy."""
    import tgc
    _use_server_without_token(monkeypatch, server.port)
    try:
        n = LARGE // 4 + 1000
        x = np.random.default_rng(2).standard_normal(n).astype(np.float32)
        prog = tgc.loads("x: f32[N]\ny: f32[N]\nreturn x * 2 + y\n")
        np.testing.assert_allclose(prog.run(device="REMOTE", x=x, y=x.copy())["out0"], x * 3, rtol=1e-6)
        y = x[::-1].copy()
        np.testing.assert_allclose(prog.run(device="REMOTE", x=x, y=y)["out0"], x * 2 + y, rtol=1e-6)
    finally:
        _drop_remote_instances()


class _RawServer:
    """A loopback listener that answers each connection's first request with fixed bytes (then closes)."""

    def __init__(self, answer: bytes):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.answer = answer
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                got = b""
                try:
                    while b"\r\n\r\n" not in got:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        got += chunk
                    conn.sendall(self.answer)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


_OK_BODY = P.encode_results([None], {})


@pytest.mark.parametrize("answer, message", [
    (b"", "lost the connection .*closed the connection without an answer"),
    (b"SPDY/9 200 OK\r\n\r\n", "lost the connection .*SPDY/9 200 OK"),
    (b"HTTP/1.1 2000 OK\r\n\r\n", "lost the connection"),
    (b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", "more than 100 headers"),
    (b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n", "lost the connection .*line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nabcdef", "two different Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", "bad Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nTGC1", "lost the connection .*IncompleteRead"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999\r\n\r\n", "answer of 999999999999 bytes, more than"),
], ids=["closed", "not-http", "bad-status", "too-many-headers", "long-line", "no-colon", "two-lengths",
        "negative-length", "short-body", "huge-length"])
def test_malformed_answers_are_one_clear_error(answer, message):
    """The client reads answers itself (no http.client): each malformed one is one DeviceError, never a hang."""
    from tgc.backends.remote.client import Connection
    from tgc.errors import DeviceError
    srv = _RawServer(answer)
    try:
        host, port = srv.address.rsplit(":", 1)
        conn = Connection(host, int(port), None, "datapath-session-0123456789", timeout=10.0, retry=0.0)
        with pytest.raises(DeviceError, match=message):
            conn.post(P.encode_requests([P.Synchronize()], {}), limit=1 << 20)
        conn.close()
    finally:
        srv.close()


def test_a_well_formed_answer_is_read_whole_and_its_headers_kept():
    from tgc.backends.remote.client import Connection
    answer = (b"HTTP/1.1 200 OK\r\ncontent-length: " + str(len(_OK_BODY)).encode() + b"\r\n"
              + P.TIMING_HEADER.upper().encode() + b": Decode;1;0.000;5.000\r\nConnection: close\r\n\r\n" + _OK_BODY)
    srv = _RawServer(answer)
    try:
        host, port = srv.address.rsplit(":", 1)
        conn = Connection(host, int(port), "tok", "datapath-session-0123456789", timeout=10.0, retry=0.0)
        assert conn.post(P.encode_requests([P.Synchronize()], {}), timing=True) == _OK_BODY
        assert conn.server_timing == "Decode;1;0.000;5.000"  # header names match in any case
        assert conn._conn is None  # `Connection: close` closed it
    finally:
        srv.close()


def test_both_ends_of_a_connection_get_tuned_socket_buffers(server):
    """`protocol.tune_socket` on both ends: the receive buffer fixed at `SOCKET_BUFFER`, the send buffer sized to
    the loopback round trip (after a large copy each way, microseconds: `SEND_BUFFER_MIN`). Linux reports twice the
    size set; the autotuned default starts at 128 KiB (receive) and 16 KiB (send), so a missing call fails."""
    from tgc.backends.remote.client import RemoteDevice
    dev = RemoteDevice(address=f"127.0.0.1:{server.port}", retry=0.0, timeout=60.0)
    try:
        n = 2 * P.SEND_BUFFER_MIN
        handle = dev.allocator.alloc(n)
        src, dst = np.arange(n, dtype=np.uint8), np.zeros(n, np.uint8)
        dev.allocator.copyin(handle, memoryview(src))
        dev.allocator.copyout(memoryview(dst), handle)
        assert np.array_equal(src, dst)
        sock = dev._conn._conn.sock
        with server.conn_lock:
            (served,) = list(server.conns)
        for end in (sock, served):
            assert end.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= P.SOCKET_BUFFER
            if sys.platform.startswith("linux"):
                rtt = P.round_trip_us(end)
                assert rtt is not None and P.send_buffer(rtt) == P.SEND_BUFFER_MIN, rtt
                with open("/proc/sys/net/core/wmem_max") as f:  # the most a process may set
                    most = int(f.read())
                assert end.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 2 * min(P.SEND_BUFFER_MIN, most)
    finally:
        dev.close()


def test_send_buffer_follows_the_bandwidth_delay_product():
    """`send_buffer`: LINK_RATE x round trip / 1.5 rounded up to 64 KiB, at least SEND_BUFFER_MIN, autotuning (None)
    past SEND_BUFFER_MAX, SOCKET_BUFFER when the round trip is unknown."""
    assert P.send_buffer(None) == P.SOCKET_BUFFER
    assert P.send_buffer(1) == P.SEND_BUFFER_MIN == 256 << 10
    assert P.send_buffer(30) == 256 << 10  # 12.5 GB/s x 30 us / 1.5 = 250,000 bytes
    assert P.send_buffer(32) == 320 << 10  # 266,667 bytes: five 64 KiB pieces
    assert P.send_buffer(100) == 832 << 10  # 833,334 bytes -> 13 pieces of 64 KiB
    assert P.send_buffer(500) == 4 << 20 == P.SEND_BUFFER_MAX  # 4,166,667 bytes: 64 pieces exactly
    assert P.send_buffer(504) is None
    assert P.send_buffer(10_000) is None


@pytest.mark.parametrize("rtt, most, expected", [
    (100, 4 << 20, 832 << 10),  # the bandwidth-delay product, allowed
    (100, 212992, None),  # more than the system lets a process set: autotuning, not a silent cut to 208 KiB
    (3, 212992, 256 << 10),  # the floor: set (the system cuts it), as any short path
    (100, None, 832 << 10),  # the system's cap unknown: set
])
def test_a_send_buffer_past_what_the_system_allows_is_left_to_autotuning(monkeypatch, rtt, most, expected):
    monkeypatch.setattr(P, "round_trip_us", lambda sock: rtt)
    monkeypatch.setattr(P, "most_send_buffer", lambda: most)
    calls = []

    class Sock:
        def setsockopt(self, level, opt, size):
            calls.append((opt, size))

    P.tune_socket(Sock())  # type: ignore[arg-type]
    sent = [size for opt, size in calls if opt == socket.SO_SNDBUF]
    assert sent == ([] if expected is None else [expected])
    assert (socket.SO_RCVBUF, P.SOCKET_BUFFER) in calls


def test_a_large_write_sets_the_send_buffer_again_for_the_least_round_trip_seen(monkeypatch):
    """A connection tuned for a slow handshake (100 us: 832 KiB) gets SEND_BUFFER_MIN at its next write of more than
    SEND_BUFFER_MIN once the least round trip is 3 us; a smaller write does not look; every byte arrives."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        conn = socket.create_connection(listener.getsockname())
        served, _ = listener.accept()
    try:
        with open("/proc/sys/net/core/wmem_max") as f:
            if int(f.read()) < (832 << 10):
                pytest.skip("this system caps SO_SNDBUF below 832 KiB")
        rtts = [100]
        looked = []
        monkeypatch.setattr(P, "round_trip_us", lambda sock: looked.append(1) or rtts[0])
        P.tune_socket(conn)
        assert conn.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 2 * (832 << 10)
        rtts[0] = 3
        got = bytearray()

        def read() -> None:
            while len(got) < P.SEND_BUFFER_MIN + 2:
                chunk = served.recv(1 << 20)
                if not chunk:
                    return
                got.extend(chunk)

        reader = threading.Thread(target=read)
        reader.start()
        looked.clear()
        P.send_all(conn, [b"x"])
        assert looked == [] and conn.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 2 * (832 << 10)
        data = np.random.default_rng(4).integers(0, 256, P.SEND_BUFFER_MIN + 1, dtype=np.uint8).tobytes()
        P.send_all(conn, [data])
        reader.join(30)
        assert looked and conn.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 2 * P.SEND_BUFFER_MIN
        assert bytes(got) == b"x" + data
    finally:
        conn.close()
        served.close()


def test_round_trip_of_a_socket_that_cannot_say_is_unknown():
    """`round_trip_us` of a socket that is not TCP (or not connected to anything that measured) is None, and
    `tune_socket` then still sets both buffers."""
    a, b = socket.socketpair()
    try:
        assert P.round_trip_us(a) is None
        P.tune_socket(a)
        assert a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= P.SOCKET_BUFFER
    finally:
        a.close()
        b.close()


def test_answer_header_lines_are_kept_by_their_bytes_and_read_alike():
    """The client keeps answer header lines it read (by their exact bytes): the same answer read again gives the same
    headers, a line that differs by a byte is read afresh, and a malformed one is never kept (refused again)."""
    from tgc.backends.remote import client as C
    C._ANSWER_LINES.clear()

    def read(answer: bytes) -> tuple:
        w = C._Wire.__new__(C._Wire)
        w.rfile = io.BufferedReader(io.BytesIO(answer))
        return w.receive(1 << 20, 1 << 16)

    def answer(*lines: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\n" + b"".join(x + b"\r\n" for x in lines) + b"\r\n" + _OK_BODY

    length = b"Content-Length: " + str(len(_OK_BODY)).encode()
    first = read(answer(b"X-Tgc-Timing:  a;1 ", length))
    assert first[1] == {"x-tgc-timing": "a;1", "content-length": str(len(_OK_BODY))} and first[2] == _OK_BODY
    assert read(answer(b"X-Tgc-Timing:  a;1 ", length))[1] == first[1]  # (from the kept lines)
    assert C._ANSWER_LINES[b"X-Tgc-Timing:  a;1 \r\n"] == ("x-tgc-timing", "a;1")
    assert read(answer(b"X-Tgc-Timing:  a;2 ", length))[1]["x-tgc-timing"] == "a;2"
    for _ in range(2):  # (a malformed line is refused each time: never kept)
        with pytest.raises(http.client.HTTPException, match="malformed header line"):
            read(answer(b"No colon here", length))
    assert b"No colon here\r\n" not in C._ANSWER_LINES
    for _ in range(2):  # two different Content-Lengths are refused though both lines were read before
        with pytest.raises(http.client.HTTPException, match="two different Content-Length"):
            read(answer(length, b"Content-Length: 1"))
    for i in range(600):  # (bounded: emptied when full)
        read(answer(f"X-{i}: {i}".encode(), length))
        assert len(C._ANSWER_LINES) <= 256


@needs_cpu
@pytest.mark.parametrize("nbytes, hashed", [
    (4 << 20, []),  # a payload (>= LARGE_BLOB): named by a random id, hashed by nobody on either side
    (100, [100, 100, 100]),  # a small blob: the client names its copy in, the server checks that id against the
    # bytes and names its answer (the client keeps that id unchecked: a server it sends the bytes to checks it)
])
def test_a_copy_in_and_out_hashes_each_small_blob_once_a_step_and_no_payload(server, monkeypatch, nbytes, hashed):
    """Every sha256 of a copy in and a copy out through an in-process server (client and server share `protocol`'s
    `hashlib`), counted with the length hashed: exactly the hashes the blob-id rules need, none twice."""
    import hashlib
    import types

    from tgc.backends import get_device
    calls: list[int] = []

    def sha256(data=b"", *args, **kwargs):
        calls.append(memoryview(data).nbytes)
        return hashlib.sha256(data, *args, **kwargs)

    _use_server_without_token(monkeypatch, server.port)
    try:
        alloc = get_device("REMOTE").allocator
        handle = alloc.alloc(nbytes)
        src = np.random.default_rng(3).integers(0, 256, nbytes, dtype=np.uint8)
        dst = np.zeros(nbytes, np.uint8)
        alloc.copyin(handle, memoryview(np.zeros(nbytes, np.uint8)))  # (the first round trip: session, connection)
        alloc.copyout(memoryview(dst), handle)
        monkeypatch.setattr(P, "hashlib", types.SimpleNamespace(sha256=sha256))
        alloc.copyin(handle, memoryview(src))
        alloc.copyout(memoryview(dst), handle)
        monkeypatch.setattr(P, "hashlib", hashlib)
        np.testing.assert_array_equal(dst, src)
        assert calls == hashed
        alloc.free(handle, nbytes)
    finally:
        _drop_remote_instances()
