"""The REMOTE bulk path at its edges: a request body refused before it is read (no token, a declared length past the
limit), a body longer than it declared, a small blob under a wrong sha256, and copies through REMOTE of sizes one
byte either side of every size where the data path changes (a blob named by its hash or not, the server's staging,
the client's sending ahead, the send buffer), against the bytes sent and a local run."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from tests.test_remote_datapath import _drop_remote_instances, _use_server_without_token, needs_cpu
from tgc.backends.remote import client as C
from tgc.backends.remote import protocol as P
from tgc.backends.remote.server import Limits, RemoteServer, serve

SESSION = "bulk-session-0123456789"


def _exchange(port: int, head_lines: str, body: bytes = b"", wait: float = 10.0) -> bytes:
    """Send a request head (and `body`, maybe not all of what the head declares), then read everything the server
    answers until it closes the connection or `wait` seconds pass (a server waiting for the rest of the body
    answers nothing)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(f"POST {P.BATCH_PATH} HTTP/1.1\r\nHost: x\r\n{head_lines}\r\n".encode() + body)
        got = b""
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                chunk = s.recv(1 << 16)
            except TimeoutError:
                break
            if not chunk:
                break
            got += chunk
        return got


@pytest.fixture
def token_server():
    srv = serve("127.0.0.1", 0, "CPU", "s3cret-token").start()
    yield srv
    srv.shutdown()


@needs_cpu
@pytest.mark.parametrize("auth", ["", "Authorization: Bearer wrong\r\n"], ids=["no-token", "wrong-token"])
def test_an_unauthenticated_bulk_upload_is_refused_before_its_body_is_read(token_server, auth):
    """64 MiB declared, none of it sent: the server answers 401 at once and closes (it does not wait for the body,
    stages nothing and makes no session)."""
    st = time.monotonic()
    answer = _exchange(token_server.port, f"{auth}{P.SESSION_HEADER}: {SESSION}\r\nContent-Length: {64 << 20}\r\n")
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"Connection: close" in answer and time.monotonic() - st < 5
    assert token_server._staged_bytes == 0 and token_server.sessions == {}


@needs_cpu
def test_a_declared_length_past_the_limit_is_refused_before_the_body_is_read():
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(max_body=1 << 20)).start()
    try:
        answer = _exchange(srv.port, f"{P.SESSION_HEADER}: {SESSION}\r\nContent-Length: {(1 << 20) + 1}\r\n")
        assert answer.startswith(b"HTTP/1.1 413") and b"exceeds the limit of 1048576 bytes" in answer, answer[:300]
        assert srv._staged_bytes == 0 and srv.sessions == {}
    finally:
        srv.shutdown()


@needs_cpu
def test_a_body_longer_than_declared_runs_the_declared_body_and_refuses_the_rest():
    """The declared body (a large copy in, received into the buffer, and a copy out) runs; the bytes after it are
    read as the next request: 400 and the connection closed, and they never reach the buffer."""
    srv = serve("127.0.0.1", 0, "CPU", None).start()
    try:
        n = max(RemoteServer.STAGE_MIN, P.LARGE_BLOB) * 2
        data = np.random.default_rng(5).integers(0, 256, n, dtype=np.uint8).tobytes()
        h = P.blob_id(data)
        body = P.encode_requests([P.BufferAlloc(buf=1, size=n), P.CopyIn(buf=1, datahash=h), P.CopyOut(buf=1)],
                                 {h: data})
        junk = b"\xff" * 4092 + b"\r\n\r\n"  # (a line: the server reads it as the next request line)
        answer = _exchange(srv.port, f"{P.SESSION_HEADER}: {SESSION}\r\nContent-Length: {len(body)}\r\n", body + junk)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert b"HTTP/1.1 400" in answer and data in answer
        session = next(iter(srv.sessions.values()))
        assert session.buffers[1].handle.tobytes() == data
        assert srv._staged_bytes == 0
    finally:
        srv.shutdown()


@needs_cpu
def test_a_small_blob_under_a_wrong_sha256_is_refused_and_nothing_runs():
    srv = serve("127.0.0.1", 0, "CPU", None).start()
    try:
        data = b"\x01" * 100
        wrong = P.digest(b"\x02" * 100)
        body = P.encode_requests([P.BufferAlloc(buf=1, size=100), P.CopyIn(buf=1, datahash=wrong)], {wrong: data})
        answer = _exchange(srv.port, f"{P.SESSION_HEADER}: {SESSION}\r\nContent-Length: {len(body)}\r\n", body)
        assert answer.startswith(b"HTTP/1.1 400") and b"sha256 does not match its 100 bytes" in answer, answer[:300]
        assert all(not s.buffers for s in srv.sessions.values())
    finally:
        srv.shutdown()


# every size where the bulk path changes: a blob named by a random id (LARGE_BLOB), received into a staging block
# (STAGE_MIN), the send buffer of a loopback connection (SEND_BUFFER_MIN), a copy in sent ahead (SEND_AHEAD)
EDGES = sorted({P.LARGE_BLOB, RemoteServer.STAGE_MIN, P.SEND_BUFFER_MIN, C.SEND_AHEAD})


@pytest.fixture(scope="module")
def bulk_server():
    srv = serve("127.0.0.1", 0, "CPU", None).start()
    yield srv
    srv.shutdown()


@needs_cpu
def test_copies_one_byte_either_side_of_each_edge_come_back_exact(bulk_server):
    from tgc.backends.remote.client import RemoteDevice
    dev = RemoteDevice(address=f"127.0.0.1:{bulk_server.port}", retry=0.0, timeout=60.0)
    rng = np.random.default_rng(6)
    try:
        alloc = dev.allocator
        for edge in EDGES:
            for n in (edge - 1, edge, edge + 1):
                src = rng.integers(0, 256, n, dtype=np.uint8)
                dst = np.zeros(n, np.uint8)
                handle = alloc.alloc(n)
                alloc.copyin(handle, memoryview(src))
                src_sent = src.copy()
                src[:] = 0  # a copy in sent ahead has left; a queued one is a snapshot: neither sees this
                alloc.copyout(memoryview(dst), handle)
                assert np.array_equal(dst, src_sent), n
                alloc.free(handle, n)
    finally:
        dev.close()


@needs_cpu
def test_a_program_around_each_edge_matches_a_local_run(bulk_server, monkeypatch):
    import tgc
    _use_server_without_token(monkeypatch, bulk_server.port)
    prog = tgc.loads("x: f32[N]\ny: f32[N]\nreturn x * 2 + y\n")
    rng = np.random.default_rng(7)
    try:
        for edge in EDGES:
            for n in (edge // 4 - 1, edge // 4, edge // 4 + 1):
                x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
                there = prog.run(device="REMOTE", x=x, y=y)["out0"]
                here = prog.run(device="CPU", x=x, y=y)["out0"]
                assert np.array_equal(there, here), n
                np.testing.assert_allclose(there, x * 2 + y, rtol=1e-6)
    finally:
        _drop_remote_instances()
