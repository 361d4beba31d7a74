"""The REMOTE client receives a copy out's bytes straight into the destination (`client._Wire._streamed`):
the sink gets exactly the blob, and a truncated stream, a blob length past the body or a blob of the wrong size
is one clear error or the ordinary (unstreamed) path, never bytes written past the sink."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_remote_datapath import _drop_remote_instances, _RawServer, needs_cpu
from tgc.backends.remote import protocol as P
from tgc.backends.remote.client import Connection
from tgc.errors import DeviceError

N = P.LARGE_BLOB * 4
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
    monkeypatch.setenv("TGC_REMOTE", f"127.0.0.1:{srv.port}")
    monkeypatch.delenv("TGC_REMOTE_TOKEN", raising=False)
    monkeypatch.delenv("TGC_REMOTE_TOKEN_FILE", raising=False)
    _drop_remote_instances()
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
