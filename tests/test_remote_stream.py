"""The REMOTE client receives a copy out's bytes straight into the destination (`client._Wire._streamed`):
the sink gets exactly the blob, and a truncated stream, a blob length past the body or a blob of the wrong size
is one clear error or the ordinary (unstreamed) path, never bytes written past the sink."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.test_remote_datapath import _drop_remote_instances, _RawServer, _use_server_without_token, needs_cpu
from tgc.backends.remote import protocol as P
from tgc.backends.remote.client import Connection
from tgc.backends.remote.server import RemoteServer
from tgc.errors import DeviceError

N = P.LARGE_BLOB * 4
# the server's tests: a blob it receives into a staging block (smaller ones are read as bytes and copied)
NS = max(N, RemoteServer.STAGE_MIN)
BLOB_ID = "ab" * 32


def _answer(body: bytes, declared: int | None = None) -> bytes:
    n = len(body) if declared is None else declared
    return b"HTTP/1.1 200 OK\r\nContent-Length: " + str(n).encode() + b"\r\nConnection: close\r\n\r\n" + body


def _post(answer: bytes, sink: memoryview):
    srv = _RawServer(answer)
    try:
        host, port = srv.address.rsplit(":", 1)
        conn = Connection(host, int(port), None, "stream-session-0123456789", timeout=10.0, retry=0.0)
        try:
            return conn.post(P.encode_requests([P.CopyOut(buf=1)], {}), limit=1 << 24, sink=sink)
        finally:
            conn.close()
    finally:
        srv.close()


def _payload(n: int = N) -> bytes:
    return np.random.default_rng(3).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_one_blob_of_the_sinks_size_is_received_into_the_sink():
    data = _payload()
    sink = memoryview(bytearray(N + 16))[8:8 + N]  # a view inside a larger buffer: nothing written outside it
    got = _post(_answer(P.encode_results([BLOB_ID], {BLOB_ID: data})), sink)
    assert isinstance(got, tuple) and got[1] == BLOB_ID and got[2] is sink
    assert bytes(sink) == data and bytes(sink.obj[:8]) == bytes(8) and bytes(sink.obj[-8:]) == bytes(8)
    results, blobs = P.decode_results(got[0], verify=False)
    assert results == [BLOB_ID] and blobs == {}


def test_a_truncated_stream_is_one_clear_error():
    body = P.encode_results([BLOB_ID], {BLOB_ID: _payload()})
    cut = body[:8 + 40 + N // 2]  # the server closes halfway through the blob
    with pytest.raises(DeviceError, match="lost the connection .*IncompleteRead"):
        _post(_answer(cut, declared=len(body)), memoryview(bytearray(N)))


def test_a_blob_length_past_the_body_is_not_streamed_and_is_refused():
    body = bytearray(P.encode_results([BLOB_ID], {BLOB_ID: _payload()}))
    body[8 + 32:8 + 40] = (1 << 40).to_bytes(8, "big")  # a length header far past the body
    sink = memoryview(bytearray(N))
    got = _post(_answer(bytes(body)), sink)
    assert isinstance(got, bytes) and bytes(sink) == bytes(N)  # read whole, the sink untouched
    with pytest.raises(P.ProtocolError, match="runs past the end of the body"):
        P.decode_results(got, verify=False)


@pytest.mark.parametrize("size", [N - 4, N + 4], ids=["smaller", "larger"])
def test_a_blob_of_another_size_than_the_sink_is_read_as_an_ordinary_answer(size):
    data = _payload(size)
    sink = memoryview(bytearray(N))
    got = _post(_answer(P.encode_results([BLOB_ID], {BLOB_ID: data})), sink)
    assert isinstance(got, bytes) and bytes(sink) == bytes(N)
    results, blobs = P.decode_results(got, verify=False)
    assert results == [BLOB_ID] and bytes(blobs[BLOB_ID]) == data


@needs_cpu
def test_remote_copy_out_streams_into_the_result(monkeypatch):
    """A run's large output arrives through the streaming path, equal to numpy's; a small one does not."""
    import tgc
    from tgc.backends.remote import client
    from tgc.backends.remote.server import serve
    calls = []
    original = client._Wire._streamed

    def counted(self, length, sink):
        calls.append(len(sink))
        return original(self, length, sink)

    monkeypatch.setattr(client._Wire, "_streamed", counted)
    srv = serve("127.0.0.1", 0, "CPU", None).start()
    _use_server_without_token(monkeypatch, srv.port)
    try:
        prog = tgc.loads("x: f32[N]\nreturn x * 2 + 1\n")
        x = np.random.default_rng(4).standard_normal(N // 4 + 3).astype(np.float32)
        np.testing.assert_allclose(prog.run(device="REMOTE", x=x)["out0"], x * 2 + 1, rtol=1e-6)
        assert calls == [x.nbytes]
        small = x[:16].copy()
        np.testing.assert_allclose(prog.run(device="REMOTE", x=small)["out0"], small * 2 + 1, rtol=1e-6)
        assert calls == [x.nbytes]
    finally:
        _drop_remote_instances()
        srv.shutdown()


@needs_cpu
def test_server_answers_a_copy_out_as_of_its_place_in_the_batch():
    """A copy out followed by a write to the same buffer answers the bytes before the write (no view of the
    buffer is sent then); one at the batch's end (sent from the buffer itself) the bytes after it."""
    from tests.test_remote_datapath import _post as post
    from tgc.backends.remote.server import serve
    srv = serve("127.0.0.1", 0, "CPU", None).start()
    try:
        first, second = _payload(), _payload()[::-1]
        a, b = P.blob_id(first), P.blob_id(second)
        status, body = post(srv, P.BufferAlloc(buf=1, size=N), P.CopyIn(buf=1, datahash=a), P.CopyOut(buf=1),
                            P.CopyIn(buf=1, datahash=b), P.CopyOut(buf=1), P.Synchronize(), blobs={a: first, b: second})
        assert status == 200, body
        results, blobs = P.decode_results(body, verify=False)
        assert bytes(blobs[results[2]]) == first and bytes(blobs[results[4]]) == second
    finally:
        srv.shutdown()


def _raw_post(port: int, body: bytes, declared: int | None = None, session: str = "stream-server-0123456789"
              ) -> bytes:
    """Send a request whose body may end early (then close the writing side); everything the server answers."""
    import socket
    n = len(body) if declared is None else declared
    head = (f"POST {P.BATCH_PATH} HTTP/1.1\r\nHost: x\r\n{P.SESSION_HEADER}: {session}\r\n"
            f"Content-Length: {n}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head + body)
        if declared is not None:
            s.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                return got
            got += chunk


@pytest.fixture
def cpu_server():
    from tgc.backends.remote.server import serve
    srv = serve("127.0.0.1", 0, "CPU", None).start()
    yield srv
    srv.shutdown()


def _live(srv) -> int:
    """Arena bytes in buffers (not the blocks kept for staging), once the last request's thread has given its
    staged blocks back (it does so after answering)."""
    deadline = time.monotonic() + 10
    while srv._staged_bytes and time.monotonic() < deadline:
        time.sleep(0.01)
    return srv.allocator.live - srv._pooled_bytes


@needs_cpu
def test_server_receives_a_copy_in_into_the_buffer_it_fills(cpu_server):
    """A large CopyIn's blob is received into an arena block that becomes the buffer (the old one is freed); a blob
    named twice is copied into both buffers; every staged block is accounted for afterwards."""
    from tests.test_remote_datapath import _post as post
    srv = cpu_server
    data = _payload(NS)
    h = P.blob_id(data)
    status, body = post(srv, P.BufferAlloc(buf=1, size=NS), P.BufferAlloc(buf=2, size=NS), P.CopyIn(buf=1, datahash=h),
                        P.CopyIn(buf=2, datahash=h), P.CopyOut(buf=1), P.CopyOut(buf=2), blobs={h: data})
    assert status == 200, body
    results, blobs = P.decode_results(body, verify=False)
    assert bytes(blobs[results[4]]) == data and bytes(blobs[results[5]]) == data
    before = _live(srv)
    session = next(iter(srv.sessions.values()))
    address = session.buffers[1].handle.address
    status, body = post(srv, P.CopyIn(buf=1, datahash=h), P.CopyOut(buf=1), blobs={h: data[::-1]})
    assert status == 200, body
    results, blobs = P.decode_results(body, verify=False)
    assert bytes(blobs[results[1]]) == data[::-1]
    assert session.buffers[1].handle.address != address  # the block the blob was received into became buffer 1
    assert _live(srv) == before and srv._staged_bytes == 0 and not session.staged
    assert session.buffers[1].handle.tobytes() == data[::-1] and session.buffers[2].handle.tobytes() == data


@needs_cpu
def test_server_refuses_a_copy_in_of_the_wrong_size_and_frees_the_staged_block(cpu_server):
    from tests.test_remote_datapath import _post as post
    srv = cpu_server
    assert post(srv, P.BufferAlloc(buf=1, size=NS + 64), blobs={})[0] == 200
    before = _live(srv)
    data = _payload(NS)
    h = P.blob_id(data)
    status, body = post(srv, P.CopyIn(buf=1, datahash=h), blobs={h: data})
    assert status == 400 and f"copying {NS} bytes into buffer 1 of {NS + 64} bytes".encode() in body, body
    assert _live(srv) == before and srv._staged_bytes == 0


@needs_cpu
def test_server_closes_on_a_truncated_body_and_frees_the_staged_block(cpu_server):
    from tests.test_remote_datapath import _post as post
    srv = cpu_server
    assert post(srv, P.BufferAlloc(buf=1, size=NS), blobs={})[0] == 200
    before = _live(srv)
    data = _payload(NS)
    h = P.blob_id(data)
    body = P.encode_requests([P.CopyIn(buf=1, datahash=h)], {h: data})
    assert _raw_post(srv.port, body[:8 + 40 + NS // 2], declared=len(body)) == b""  # no answer, connection closed
    assert _live(srv) == before and srv._staged_bytes == 0


@needs_cpu
def test_server_refuses_a_blob_length_past_the_body_and_closes(cpu_server):
    srv = cpu_server
    data = _payload(NS)
    h = P.blob_id(data)
    body = bytearray(P.encode_requests([P.Synchronize()], {h: data}))
    body[8 + 32:8 + 40] = (1 << 40).to_bytes(8, "big")
    answer = _raw_post(srv.port, bytes(body))
    assert answer.startswith(b"HTTP/1.1 400") and b"runs past the end of the body" in answer, answer[:300]
    assert b"Connection: close" in answer and srv._staged_bytes == 0
