"""Fixed costs and copies of the REMOTE data path (docs/DESIGN.md "REMOTE data path", fourth pass): a large copy in
is sent ahead from the caller's memory (no snapshot; its answer read with the next one, its errors raised there),
the server reads request lines and headers itself (strictly), and plain result texts are read without `ast`."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_remote_datapath import needs_cpu
from tests.test_remote_server import SESSION, _raw_http
from tgc.backends.remote import client
from tgc.backends.remote import protocol as P
from tgc.backends.remote.client import RemoteDevice
from tgc.backends.remote.server import serve
from tgc.errors import DeviceError

AHEAD = 64 << 10  # the send-ahead threshold these tests use (the default, 1 MiB, would only make them slower)


@pytest.fixture
def cpu_server():
    srv = serve("127.0.0.1", 0, "CPU", None).start()
    yield srv
    srv.shutdown()


@pytest.fixture
def ahead(monkeypatch):
    monkeypatch.setattr(client, "SEND_AHEAD", AHEAD)


def _device(srv) -> RemoteDevice:
    return RemoteDevice(address=f"127.0.0.1:{srv.port}", token="", timeout=30.0, retry=0.0)


@needs_cpu
def test_a_large_copy_in_is_sent_before_copyin_returns_so_later_writes_do_not_reach_it(cpu_server, ahead):
    dev = _device(cpu_server)
    try:
        data = np.random.default_rng(5).integers(0, 256, AHEAD + 4099, dtype=np.uint8)
        want = data.copy()
        handle = dev.allocator.alloc(data.nbytes)
        trips = dev.round_trips
        dev.allocator.copyin(handle, memoryview(data))
        assert dev.posts_ahead == 1 and dev.round_trips == trips and not dev._queue  # sent, not waited for
        data[:] = 7  # the caller reuses its memory at once: the server already has the bytes
        out = np.empty_like(data)
        dev.allocator.copyout(memoryview(out), handle)
        np.testing.assert_array_equal(out, want)
        small = np.arange(100, dtype=np.uint8)
        other = dev.allocator.alloc(small.nbytes)
        dev.allocator.copyin(other, memoryview(small))  # below the threshold: queued (a snapshot), as before
        assert dev.posts_ahead == 1 and dev._queue
        small[:] = 0
        got = np.empty(100, np.uint8)
        dev.allocator.copyout(memoryview(got), other)
        np.testing.assert_array_equal(got, np.arange(100, dtype=np.uint8))
    finally:
        dev.close()


@needs_cpu
def test_an_error_in_a_copy_sent_ahead_is_raised_at_the_next_answer_and_the_device_goes_on(cpu_server, ahead):
    dev = _device(cpu_server)
    try:
        data = np.ones(AHEAD, np.uint8)
        dev.allocator.copyin(999, memoryview(data))  # no buffer 999 on the server: refused there, not yet seen here
        with pytest.raises(DeviceError, match="no buffer 999"):
            dev.synchronize()
        handle = dev.allocator.alloc(data.nbytes)
        dev.allocator.copyin(handle, memoryview(data * 3))
        dev.allocator.copyin(999, memoryview(data))
        out = np.empty_like(data)
        with pytest.raises(DeviceError, match="no buffer 999"):  # raised by the copy out that follows it
            dev.allocator.copyout(memoryview(out), handle)
        dev.allocator.copyout(memoryview(out), handle)  # the connection was reopened; the session kept its buffer
        np.testing.assert_array_equal(out, data * 3)
    finally:
        dev.close()


@needs_cpu
def test_a_program_with_a_large_input_sent_ahead_matches_numpy(cpu_server, ahead, monkeypatch):
    import tgc
    from tests.test_remote_datapath import _drop_remote_instances, _use_server_without_token
    _use_server_without_token(monkeypatch, cpu_server.port)
    try:
        prog = tgc.loads("x: f32[N]\ny: f32[N]\nreturn x * 2 + y\n")
        x = np.random.default_rng(6).standard_normal(AHEAD // 4 + 5).astype(np.float32)
        for i in range(2):
            y = x[::-1] + i
            np.testing.assert_allclose(prog.run(device="REMOTE", x=x, y=y)["out0"], x * 2 + y, rtol=1e-6)
    finally:
        _drop_remote_instances()


def _opencl_ready() -> bool:
    try:
        from tgc.backends.opencl import OpenCLDevice
        return bool(OpenCLDevice.probe()[0])
    except Exception:
        return False


@pytest.mark.skipif(not _opencl_ready(), reason="no OpenCL here")
def test_large_copies_in_into_an_opencl_buffer_match_numpy_through_a_reused_staging_buffer(ahead):
    srv = serve("127.0.0.1", 0, "OPENCL", None).start()
    dev = _device(srv)
    try:
        data = np.random.default_rng(7).standard_normal(AHEAD // 4 + 33).astype(np.float32)
        handle = dev.allocator.alloc(data.nbytes)
        for i in range(2):  # the second blob is received into the staging buffer the first one used
            dev.allocator.copyin(handle, memoryview(data + i).cast("B"))
            assert dev.posts_ahead == i + 1
            out = np.empty_like(data)
            dev.allocator.copyout(memoryview(out).cast("B"), handle)
            np.testing.assert_array_equal(out, data + i)
        # the host staging buffer is kept for the next blob of its size, nothing is left staged
        assert [type(b) for b in srv._stage_pool.get(data.nbytes, [])] == [bytearray] and srv._staged_bytes == 0
    finally:
        dev.close()
        srv.shutdown()


# --- the server's own request-line and header reading


def _head(extra: bytes = b"", line: bytes = b"POST /batch HTTP/1.1") -> bytes:
    body = P.encode_requests([P.Synchronize()], {})
    return (line + b"\r\nHost: x\r\n" + f"{P.SESSION_HEADER}: {SESSION}\r\n".encode() + extra
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)


@pytest.mark.parametrize("extra, line, status", [
    (b"", b"POST /batch HTTP/1.1", b"200"),
    (b"x-tgc-profile: 0\r\n", b"POST /batch HTTP/1.1", b"200"),  # names in any case
    (b"No colon here\r\n", b"POST /batch HTTP/1.1", b"400"),
    (b"Bad Name: x\r\n", b"POST /batch HTTP/1.1", b"400"),
    (b"X-A: b\r\n  folded\r\n", b"POST /batch HTTP/1.1", b"400"),
    (b"X-A: b\r\n" * 101, b"POST /batch HTTP/1.1", b"431"),
    (b"X-A: " + b"b" * 70000 + b"\r\n", b"POST /batch HTTP/1.1", b"431"),
    (b"", b"POST /batch HTTP/2.0", b"505"),
    (b"", b"POST /batch HTTP/1.x", b"400"),
    (b"", b"POST /batch", b"400"),
], ids=["ok", "lowercase", "no-colon", "spaced-name", "folded", "101-headers", "long-line", "http2", "bad-version",
        "no-version"])
def test_the_server_reads_request_lines_and_headers_strictly(cpu_server, extra, line, status):
    answer = _raw_http(cpu_server.port, _head(extra, line))
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
    assert b"Python" not in answer and b"<html" not in answer.lower()


def test_lowercase_session_and_length_headers_are_the_same_headers(cpu_server):
    body = P.encode_requests([P.Synchronize()], {})
    raw = (f"POST /batch HTTP/1.1\r\nhost: x\r\n{P.SESSION_HEADER.lower()}: {SESSION}\r\n"
           f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body
    answer = _raw_http(cpu_server.port, raw)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"[None]"), answer[-200:]


def test_request_and_header_lines_read_before_are_kept_by_their_bytes_and_only_when_they_parsed(cpu_server):
    from tgc.backends.remote import transport as T
    T._HEADER_LINES.clear()
    T._REQUEST_LINES.clear()
    for _ in range(2):  # (the second time from the kept lines)
        answer = _raw_http(cpu_server.port, _head(b"X-Kept: yes \r\n"))
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert T._REQUEST_LINES[b"POST /batch HTTP/1.1\r\n"][1:] == ("POST", "/batch", "HTTP/1.1", 1, 1)
    assert T._HEADER_LINES[b"X-Kept: yes \r\n"] == ("x-kept", "yes ")  # (the name lowered, trailing space kept)
    # lines that differ from a kept one by a byte are read afresh (and refused where they are bad); refused ones are
    # never kept, so they are refused again
    for _ in range(2):
        for extra, line, status in [(b"X Kept: yes \r\n", b"POST /batch HTTP/1.1", b"400"),
                                    (b"X-Kept:yes\r\n", b"POST /batch HTTP/1.1", b"200"),
                                    (b"", b"POST /batch HTTP/2.1", b"505"), (b"", b"POST  /batch", b"400")]:
            answer = _raw_http(cpu_server.port, _head(extra, line))
            assert answer.startswith(b"HTTP/1.1 " + status), (extra, line, answer[:200])
    assert not [k for k in T._HEADER_LINES if k.startswith(b"X Kept")]
    assert set(T._REQUEST_LINES) == {b"POST /batch HTTP/1.1\r\n"}
    # a token line read before does not stand for another: a wrong token is refused after a right one
    cpu_server.tokens = {"right-token-0123456789": "t"}
    try:
        for token, status in [("right-token-0123456789", b"200"), ("wrong-token-0123456789", b"401"),
                              ("right-token-0123456789", b"200"), ("right-token-0123456789 ", b"401")]:
            head = _head(f"Authorization: Bearer {token}\r\n".encode())
            head = head.replace(SESSION.encode(), b"with-a-token-0123456789")  # (a session of that token)
            answer = _raw_http(cpu_server.port, head)
            assert answer.startswith(b"HTTP/1.1 " + status), (token, answer[:200])
    finally:
        cpu_server.tokens = {}
    # at most MAX_KEPT_LINES kept (emptied when full), and no line longer than KEPT_LINE
    _raw_http(cpu_server.port, _head(b"".join(f"X-{i}: {i}\r\n".encode() for i in range(90))
                                     + b"X-Long: " + b"v" * T.KEPT_LINE + b"\r\n"))
    assert len(T._HEADER_LINES) <= T.MAX_KEPT_LINES and not [k for k in T._HEADER_LINES if len(k) > T.KEPT_LINE]
    for n in range(T.MAX_KEPT_LINES // 90 + 2):
        _raw_http(cpu_server.port, _head(b"".join(f"X-{n}-{i}: {i}\r\n".encode() for i in range(90))))
        assert len(T._HEADER_LINES) <= T.MAX_KEPT_LINES


# --- result texts read without ast


@pytest.mark.parametrize("results", [[], [None], [None, "ab" * 32, 1.5e-05, 3, -2, 0.000123, 1e300, 12.0],
                                     [None, "short"], [{"a": 1}], [float("inf")], [2**70], [[1, 2]]])
def test_result_texts_read_alike_with_or_without_the_quick_path(results):
    got, _ = P.decode_results(P.encode_results(results, {}))
    assert got == results and P.parse_text(P.to_text(results), {}) == results


@pytest.mark.parametrize("text", ["[None,None]", "[__import__('os')]", "[None, 'ab']]", "[1e5000]"])
def test_result_texts_off_the_quick_path_are_parsed_or_refused_as_before(text):
    body = P.encode_body({}, text)
    try:
        want = P.parse_text(text, {})
    except P.ProtocolError:
        with pytest.raises(P.ProtocolError):
            P.decode_results(body)
        return
    assert P.decode_results(body)[0] == want


@needs_cpu
def test_copies_in_of_2d_and_strided_views_arrive_whole(cpu_server, ahead):
    """A 2-D float view is sent ahead as its bytes; a strided one (not contiguous) is copied and queued."""
    dev = _device(cpu_server)
    try:
        full = np.random.default_rng(8).standard_normal((64, AHEAD // 128 + 1)).astype(np.float32)
        assert full[:, ::2].nbytes >= AHEAD  # (so only its layout keeps the strided one from being sent ahead)
        for view, sent in ((full, 1), (full[:, ::2], 0)):
            before = dev.posts_ahead
            handle = dev.allocator.alloc(view.nbytes)
            dev.allocator.copyin(handle, memoryview(view))
            assert dev.posts_ahead - before == sent
            out = np.empty(view.shape, np.float32)
            dev.allocator.copyout(memoryview(out), handle)
            np.testing.assert_array_equal(out, view)
    finally:
        dev.close()


@needs_cpu
def test_answers_owed_on_a_connection_the_server_closed_while_idle_are_read_and_the_next_request_reconnects(
        cpu_server, ahead):
    import select
    import time
    dev = _device(cpu_server)
    try:
        data = np.arange(AHEAD, dtype=np.uint8)
        handle = dev.allocator.alloc(data.nbytes)
        dev.allocator.copyin(handle, memoryview(data))
        assert select.select([dev._conn._conn.sock], [], [], 30)[0]  # (the answer has arrived, not yet read)
        assert cpu_server.close_late_connections(now=time.monotonic() + 1e6) == 1  # as its watchdog does when idle
        out = np.empty_like(data)
        dev.allocator.copyout(memoryview(out), handle)
        np.testing.assert_array_equal(out, data)
    finally:
        dev.close()
