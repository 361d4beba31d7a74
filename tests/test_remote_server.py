"""The REMOTE server's machinery: auth, sessions, limits, idle timeout, shutdown, client retry and faults.

Servers listen on 127.0.0.1 only, on ports the OS picks. Tests that allocate memory use the real CPU
device behind the server (skipped until it exists).
"""

from __future__ import annotations

import http.client
import importlib.util
import os
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tgc.backends.remote import protocol as P
from tgc.backends.remote.client import RemoteDevice, client_token, parse_address
from tgc.backends.remote.process import ServerProcess
from tgc.backends.remote.server import Limits, RemoteServer, is_loopback, main_serve, read_token, serve
from tgc.errors import DeviceError, TgcError


def _cpu_ready() -> bool:
    if importlib.util.find_spec("tgc.backends.cpu") is None:
        return False
    from tgc.backends import device_class
    return device_class("CPU").probe()[0]


needs_cpu = pytest.mark.skipif(not _cpu_ready(), reason="the CPU device is not available yet")
SESSION = "test-session-0123456789"


def post(port: int, body: bytes, *, token: str | None = None, session: str | None = SESSION, path: str = "/batch",
         method: str = "POST", headers: dict[str, str] | None = None) -> tuple[int, str | None, bytes]:
    """One raw HTTP request to a server: (status, X-Tgc-Error kind, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    if session is not None:
        h[P.SESSION_HEADER] = session
    try:
        conn.request(method, path, body, h)
        resp = conn.getresponse()
        return resp.status, resp.getheader(P.ERROR_HEADER), resp.read()
    finally:
        conn.close()


def batch(*reqs: P.Request, blobs: dict[str, bytes] | None = None) -> bytes:
    return P.encode_requests(list(reqs), blobs or {})


def client(srv: RemoteServer, **kw) -> RemoteDevice:
    kw.setdefault("retry", 0.0)
    kw.setdefault("timeout", 30.0)
    return RemoteDevice(address=f"127.0.0.1:{srv.port}", **kw)


@pytest.fixture
def server():
    srv = serve("127.0.0.1", 0, "CPU", None).start()
    yield srv
    srv.shutdown()


@pytest.fixture
def token_server():
    srv = serve("127.0.0.1", 0, "CPU", "s3cret-token").start()
    yield srv
    srv.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- addresses and tokens


def test_parse_address():
    assert parse_address("127.0.0.1:7000") == ("127.0.0.1", 7000)
    assert parse_address("http://localhost:7001/") == ("localhost", 7001)
    assert parse_address("[::1]:7002") == ("::1", 7002)
    assert parse_address("127.0.0.1") == ("127.0.0.1", P.DEFAULT_PORT)
    for bad in ["", ":80", "host:port", "host:0", "host:70000"]:
        with pytest.raises(TgcError):
            parse_address(bad)


def test_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("127.1.2.3") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("example.com")


def test_non_loopback_without_token_is_refused_before_binding():
    with pytest.raises(TgcError, match="non-loopback address 0.0.0.0 without a token"):
        RemoteServer("CPU", host="0.0.0.0", port=0)
    with pytest.raises(TgcError, match="without a token") as e:
        main_serve("0.0.0.0", 0, "CPU", None)
    assert e.value.exit_code == 2


def test_tokens_from_files_and_env(tmp_path):
    f = tmp_path / "token"
    f.write_text("  abc123\n")
    assert read_token(str(f), env={}) == "abc123"
    assert read_token(None, env={"TGC_REMOTE_TOKEN": "xyz"}) == "xyz"
    assert read_token(None, env={"TGC_REMOTE_TOKEN_FILE": str(f)}) == "abc123"
    assert read_token(None, env={}) is None
    assert client_token({"TGC_REMOTE_TOKEN_FILE": str(f)}) == "abc123"
    assert client_token({"TGC_REMOTE_TOKEN": "t", "TGC_REMOTE_TOKEN_FILE": str(f)}) == "t"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(TgcError, match="is empty"):
        read_token(str(tmp_path / "empty"), env={})
    with pytest.raises(TgcError, match="cannot read the token file"):
        read_token(str(tmp_path / "missing"), env={})


def test_a_device_that_cannot_run_here_is_not_served():
    from tgc.backends import device_class, known_kinds
    for kind in known_kinds():
        try:
            ok, why = device_class(kind).probe()
        except Exception:
            continue
        if kind != "REMOTE" and not ok:
            with pytest.raises(DeviceError, match=f"cannot serve {kind}: ") as e:
                main_serve("127.0.0.1", 0, kind, None)
            assert why in e.value.msg
            return
    pytest.skip("every device runs here")


def test_serving_the_remote_device_itself_is_refused():
    with pytest.raises(TgcError, match="cannot serve REMOTE"):
        main_serve("127.0.0.1", 0, "REMOTE", None)


def test_serving_a_device_list_is_refused_clearly():
    """`-d CPU:0,CPU:1` (or such a TGC_DEVICE): one user error saying a server serves one device (it was 'bad
    device index', with a hint to write NAME:i)."""
    with pytest.raises(TgcError, match="serves one device, not the device list 'CPU:0,CPU:1'") as e:
        main_serve("127.0.0.1", 0, "CPU:0,CPU:1", None)
    assert e.value.exit_code == 2


# --- auth


def test_requests_without_the_token_get_401_and_nothing_else(token_server):
    port = token_server.port
    for token in [None, "wrong", "s3cret-token ", "S3CRET-TOKEN", ""]:
        status, kind, body = post(port, batch(P.EndSession()), token=token)
        assert (status, kind, body) == (401, "auth", b"unauthorized\n")
    status, _, _ = post(port, b"garbage", token=None, method="GET", path="/anything")
    assert status == 401
    for header in ["Basic s3cret-token", "s3cret-token", "Bearer", "Bearer  s3cret-token"]:
        assert post(port, batch(), headers={"Authorization": header})[0] == 401
    assert post(port, batch(), headers={"Authorization": "bearer s3cret-token"}, session="b" * 16)[0] == 200
    assert list(token_server.sessions) == ["b" * 16]
    token_server.sessions.clear()
    assert token_server.sessions == {}  # nothing was run, not even a session created
    status, kind, body = post(port, batch(), token="s3cret-token")
    assert status == 200 and P.decode_results(body)[0] == []
    assert SESSION in token_server.sessions


def test_client_sends_the_token(token_server, monkeypatch):
    monkeypatch.setenv("TGC_REMOTE_TOKEN", "wrong")
    with pytest.raises(DeviceError, match="missing or wrong token"):
        client(token_server)._submit(P.Synchronize())
    monkeypatch.setenv("TGC_REMOTE_TOKEN", "s3cret-token")
    dev = client(token_server)
    dev._submit(P.Synchronize())
    assert dev.session in token_server.sessions


def test_bad_paths_methods_and_headers(server):
    assert post(server.port, batch(), path="/other")[0] == 404
    assert post(server.port, b"", method="GET")[0] == 405
    status, kind, body = post(server.port, batch(), session=None)
    assert (status, kind) == (400, "protocol") and b"X-Tgc-Session" in body
    assert post(server.port, batch(), session="../../etc")[0] == 400


# --- limits


def test_body_limit_is_checked_before_reading():
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(max_body=1000)).start()
    try:
        status, kind, body = post(srv.port, batch(P.Compile(src="x" * 2000)))
        assert (status, kind) == (413, "limit") and b"exceeds the limit of 1000 bytes" in body
        assert post(srv.port, batch())[0] == 200  # and it keeps serving
    finally:
        srv.shutdown()


def test_request_time_limit_stops_a_batch_between_requests():
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(request_time=0.0)).start()
    try:
        status, kind, body = post(srv.port, batch(P.Synchronize(), P.Synchronize()))
        assert (status, kind) == (408, "limit")
        assert b"request time limit" in body and b"before request 1 (Synchronize)" in body
    finally:
        srv.shutdown()


def test_errors_name_the_request(server):
    status, kind, body = post(server.port, batch(P.Synchronize(), P.BufferFree(buf=7)))
    assert (status, kind) == (404, "session") and body == b"request 1 (BufferFree): no buffer 7 in this session\n"
    status, kind, body = post(server.port, batch(P.CopyIn(buf=1, datahash="0" * 64)))
    assert status == 404
    status, kind, body = post(server.port, batch(P.ProgramExec(prog=3, bufs=())))
    assert (status, body) == (404, b"request 0 (ProgramExec): no program 3 in this session\n")


@needs_cpu
def test_buffer_and_session_memory_limits():
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(max_buffer=4096, max_session_memory=10_000)).start()
    try:
        status, kind, body = post(srv.port, batch(P.BufferAlloc(buf=1, size=4097)))
        assert (status, kind) == (413, "limit") and b"exceeds the limit of 4096 bytes" in body
        dev = client(srv)
        with pytest.raises(DeviceError, match="exceeds the REMOTE server's limit of 4096 bytes"):
            dev.allocator.alloc(5000)
        a, b = dev.allocator.alloc(4000), dev.allocator.alloc(4000)
        dev.allocator.alloc(4000)
        with pytest.raises(DeviceError, match="session memory limit of 10000 bytes \\(8000 live\\)"):
            dev.flush()
        dev.allocator.free(a, 4000)
        c = dev.allocator.alloc(4000)  # freeing gives the memory back
        dev.allocator.copyin(c, memoryview(bytes(range(250)) * 16))
        out = bytearray(4000)
        dev.allocator.copyout(memoryview(out), c)
        assert bytes(out) == bytes(range(250)) * 16
        # another session has its own budget
        other = client(srv)
        other.allocator.alloc(4000)
        other.flush()
        assert srv.sessions[dev.session].memory == 8000 and srv.sessions[other.session].memory == 4000
        del b
    finally:
        srv.shutdown()


@needs_cpu
def test_client_splits_big_copies_into_bodies_under_the_limit():
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(max_body=3 << 20)).start()
    try:
        dev = client(srv)
        data = [np.random.default_rng(i).bytes(1 << 20) for i in range(4)]
        bufs = [dev.allocator.alloc(1 << 20) for _ in data]
        for b, d in zip(bufs, data):
            dev.allocator.copyin(b, memoryview(d))
        for b, d in zip(bufs, data):
            out = bytearray(1 << 20)
            dev.allocator.copyout(memoryview(out), b)
            assert bytes(out) == d
        with pytest.raises(DeviceError, match="do not fit in a request"):
            dev.allocator.copyin(bufs[0], memoryview(bytes(3 << 20)))
    finally:
        srv.shutdown()


@needs_cpu
def test_a_small_body_limit_still_carries_small_copies():
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(max_body=4096)).start()
    try:
        dev = client(srv)
        bufs = [dev.allocator.alloc(1000) for _ in range(5)]
        for i, b in enumerate(bufs):  # 5000 bytes of blobs: split over two bodies
            dev.allocator.copyin(b, memoryview(bytes([i]) * 1000))
        out = bytearray(1000)
        for i, b in enumerate(bufs):
            dev.allocator.copyout(memoryview(out), b)
            assert out == bytes([i]) * 1000
        with pytest.raises(DeviceError, match="do not fit in a request .*body limit is 4096 bytes"):
            dev.allocator.copyin(bufs[0], memoryview(bytes(4000)))
    finally:
        srv.shutdown()


@needs_cpu
def test_too_many_sessions():
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(max_sessions=2)).start()
    try:  # sessions that hold something and were used just now are not evicted
        assert post(srv.port, batch(P.BufferAlloc(buf=1, size=8)), session="a" * 16)[0] == 200
        assert post(srv.port, batch(P.BufferAlloc(buf=1, size=8)), session="b" * 16)[0] == 200
        status, kind, body = post(srv.port, batch(), session="c" * 16)
        assert (status, kind) == (503, "busy") and b"2 sessions" in body
        assert post(srv.port, batch(P.EndSession()), session="a" * 16)[0] == 200
        assert post(srv.port, batch(), session="c" * 16)[0] == 200
    finally:
        srv.shutdown()


@needs_cpu
def test_a_full_table_evicts_empty_then_idle_sessions_first():
    """64 empty sessions once locked every other client out for the idle timeout."""
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(max_sessions=4, evict_after=0.5)).start()
    try:
        for i in range(10):  # a flood of empty sessions: each new one replaces an empty one
            assert post(srv.port, batch(), session=f"flood-{i:02d}-0123456789")[0] == 200
        assert len(srv.sessions) == 4
        for i in range(4):  # sessions that hold memory are kept while in use
            assert post(srv.port, batch(P.BufferAlloc(buf=1, size=8)), session=f"busy-{i}-0123456789")[0] == 200
        status, kind, _ = post(srv.port, batch(), session="late-client-0123456789")
        assert (status, kind) == (503, "busy")
        for s in srv.sessions.values():  # ... until they have been idle for `evict_after`
            s.last_seen -= 1.0
        assert post(srv.port, batch(P.BufferAlloc(buf=1, size=8)), session="late-client-0123456789")[0] == 200
        assert "late-client-0123456789" in srv.sessions and len(srv.sessions) == 4
    finally:
        srv.shutdown()


@needs_cpu
def test_sessions_per_client_are_limited():
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(max_sessions=8, max_sessions_per_client=2)).start()
    try:
        for i in range(2):
            assert post(srv.port, batch(P.BufferAlloc(buf=1, size=8)), session=f"mine-{i}-0123456789")[0] == 200
        status, kind, body = post(srv.port, batch(P.BufferAlloc(buf=1, size=8)), session="mine-2-0123456789")
        assert (status, kind) == (503, "busy") and b"per client" in body
    finally:
        srv.shutdown()


@needs_cpu
def test_server_wide_memory_limit_and_release():
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(max_memory=3000, max_pooled=1500,
                                                   max_session_memory=2000)).start()
    try:
        assert post(srv.port, batch(P.BufferAlloc(buf=1, size=2000)), session="mem-a-0123456789")[0] == 200
        status, kind, body = post(srv.port, batch(P.BufferAlloc(buf=1, size=1500)), session="mem-b-0123456789")
        assert (status, kind) == (413, "limit") and b"server's memory limit" in body
        assert post(srv.port, batch(P.BufferAlloc(buf=1, size=1000)), session="mem-b-0123456789")[0] == 200
        assert srv.allocator.live == 2048 + 1024  # the CPU's shared arena: 64-byte blocks
        assert post(srv.port, batch(P.BufferFree(buf=1)), session="mem-a-0123456789")[0] == 200
        assert srv.allocator.live == 1024  # freed at once (the arena keeps no pool)
        assert post(srv.port, batch(P.BufferAlloc(buf=2, size=1500)), session="mem-a-0123456789")[0] == 200
    finally:
        srv.shutdown()


@needs_cpu
def test_fresh_buffers_never_show_another_sessions_bytes(server):
    secret = b"S3CRET!!" * 512
    assert post(server.port, batch(P.BufferAlloc(buf=1, size=len(secret)),
                                   P.CopyIn(buf=1, datahash=P.digest(secret)), P.BufferFree(buf=1),
                                   blobs={P.digest(secret): secret}), session="victim-0123456789")[0] == 200
    status, _, body = post(server.port, batch(P.BufferAlloc(buf=7, size=len(secret)), P.CopyOut(buf=7)),
                           session="snooper-0123456789")
    assert status == 200
    results, blobs = P.decode_results(body)
    assert bytes(blobs[results[1]]) == bytes(len(secret))


# --- sessions


@needs_cpu
def test_sessions_cannot_touch_each_other(server):
    a, b = client(server), client(server)
    ha = a.allocator.alloc(64)
    a.allocator.copyin(ha, memoryview(b"A" * 64))
    a.flush()
    out = bytearray(64)
    with pytest.raises(DeviceError, match=f"no buffer {ha} in this session"):
        b.allocator.copyout(memoryview(out), ha)  # same number, other session
    b.allocator.free(ha, 64)
    with pytest.raises(DeviceError, match="no buffer"):
        b.flush()
    hb = b.allocator.alloc(64)  # b's own buffer may reuse the number
    assert hb == ha
    b.allocator.copyin(hb, memoryview(b"B" * 64))
    a.allocator.copyout(memoryview(out), ha)
    assert bytes(out) == b"A" * 64
    b.allocator.copyout(memoryview(out), hb)
    assert bytes(out) == b"B" * 64
    # programs are per session too
    status, _, body = post(server.port, batch(P.ProgramExec(prog=1, bufs=(ha,))), session=b.session)
    assert status == 404
    # a transfer needs the destination's session id (a secret) and a buffer there
    status, kind, body = post(server.port, batch(P.Transfer(buf=1, dest_session="z" * 20, dest_buf=1)),
                              session=a.session)
    assert (status, kind) == (404, "session") and b"no such destination session" in body


@needs_cpu
def test_transfer_between_sessions_on_one_server(server):
    a, b = client(server), client(server)
    src, dest = a.allocator.alloc(256), b.allocator.alloc(256)
    a.allocator.copyin(src, memoryview(bytes(range(256))))
    a.allocator.transfer(dest, src, 256, a, b)
    out = bytearray(256)
    b.allocator.copyout(memoryview(out), dest)
    assert bytes(out) == bytes(range(256))


@needs_cpu
def test_views_where_the_device_has_none(server):
    dev = client(server)
    h = dev.allocator.alloc(64)
    if dev.properties["offset"]:
        pytest.skip("the served device has buffer views")
    with pytest.raises(DeviceError, match="no buffer views"):
        dev.allocator.offset(h, 16, 16)


def test_explicit_reaping(server):
    assert post(server.port, batch())[0] == 200
    assert server.reap_idle() == 0
    assert server.reap_idle(now=time.monotonic() + server.limits.idle_timeout + 1) == 1
    assert server.sessions == {}


@needs_cpu
def test_idle_sessions_are_freed():
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(idle_timeout=0.2)).start()
    try:
        size = 12_345
        dev = client(srv)
        h = dev.allocator.alloc(size)
        dev.flush()
        assert srv.allocator.live == 12_352  # the CPU's buffers live in the shared arena, 64-byte blocks
        deadline = time.monotonic() + 30
        while dev.session in srv.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dev.session not in srv.sessions
        assert srv.allocator.live == 0  # the memory went back to the arena
        with pytest.raises(DeviceError, match="freed this session after .* idle"):
            dev.allocator.copyout(memoryview(bytearray(size)), h)
    finally:
        srv.shutdown()


@needs_cpu
def test_end_session_frees_everything(server):
    dev = client(server)
    dev.allocator.alloc(100)
    dev.flush()
    assert server.sessions[dev.session].memory == 100
    dev.close()
    assert dev.session not in server.sessions


# --- lifetime and faults


def test_shutdown_frees_sessions_and_stops_listening():
    srv = serve("127.0.0.1", 0, "CPU", None).start()
    dev = client(srv)
    dev._submit(P.Synchronize())
    assert srv.shutdown() == 1
    with pytest.raises(DeviceError, match="cannot reach REMOTE server"):
        client(srv)._submit(P.Synchronize())


def test_client_retries_its_connection_with_backoff():
    port = free_port()
    dev = RemoteDevice(address=f"127.0.0.1:{port}", retry=0.0)
    with pytest.raises(DeviceError, match=f"cannot reach REMOTE server 127.0.0.1:{port}: Connection refused"):
        dev._submit(P.Synchronize())
    started: list[RemoteServer] = []

    def late_start() -> None:
        time.sleep(0.3)
        started.append(serve("127.0.0.1", port, "CPU", None).start())

    t = threading.Thread(target=late_start)
    t.start()
    try:
        patient = RemoteDevice(address=f"127.0.0.1:{port}", retry=60.0)
        patient._submit(P.Synchronize())  # refused at first, then served
        assert patient.round_trips == 1
    finally:
        t.join()
        for s in started:
            s.shutdown()


def test_bounded_retry_gives_one_clear_error(monkeypatch):
    monkeypatch.setenv("TGC_REMOTE_RETRY", "0.3")
    dev = RemoteDevice(address=f"127.0.0.1:{free_port()}")
    with pytest.raises(DeviceError, match=r"Connection refused \(retried for 0.3s\)"):
        dev._submit(P.Synchronize())


def test_probe(monkeypatch, server):
    monkeypatch.delenv("TGC_REMOTE", raising=False)
    monkeypatch.setattr(RemoteDevice, "_configured", None)
    assert RemoteDevice.probe() == (False, "TGC_REMOTE is not set")
    port = free_port()
    monkeypatch.setenv("TGC_REMOTE", f"127.0.0.1:{port}")
    ok, why = RemoteDevice.probe()
    assert not ok and why.startswith(f"cannot reach 127.0.0.1:{port}: ")
    monkeypatch.setenv("TGC_REMOTE", f"127.0.0.1:{server.port}")
    if _cpu_ready():
        assert RemoteDevice.probe() == (True, "")
    RemoteDevice.configure(f"127.0.0.1:{port}")
    try:
        assert not RemoteDevice.probe()[0]  # --remote wins over the environment
    finally:
        RemoteDevice.configure(None)


def test_remote_without_a_server_says_how_to_set_one(monkeypatch):
    monkeypatch.delenv("TGC_REMOTE", raising=False)
    monkeypatch.setattr(RemoteDevice, "_configured", None)
    with pytest.raises(DeviceError, match="needs a server") as e:
        RemoteDevice()._submit(P.Synchronize())
    assert "TGC_REMOTE" in e.value.hint and "--" not in e.value.hint  # a Python user has no --remote flag
    assert "--remote host:port" in e.value.cli_hint  # what `tgc` shows


def test_the_cli_words_an_api_hint_with_its_flag(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from tgc.cli.main import main
    monkeypatch.delenv("TGC_REMOTE", raising=False)
    monkeypatch.setattr(RemoteDevice, "_configured", None)
    (tmp_path / "p.tg").write_text("x: f32[4]\nreturn x + 1\n")
    res = CliRunner().invoke(main, ["run", str(tmp_path / "p.tg"), "-d", "REMOTE", "--random"])
    # exit 2: a setting the user has to give (tests/test_errfix.py), not a device failure
    assert res.exit_code == 2 and "needs a server" in res.output and "--remote host:port" in res.output


def test_server_process_exits_cleanly_on_ctrl_c(python_sigint):
    with ServerProcess("CPU") as srv:
        assert post(srv.port, batch())[0] == 200
        assert srv.stop(signal.SIGINT) == 0
        err = srv.stderr()
    assert f"serving CPU on http://127.0.0.1:{srv.port}" in err
    assert "shutting down (1 session(s) freed)" in err
    assert "Traceback" not in err


def test_a_server_started_with_ctrl_c_ignored_still_stops_cleanly():
    """A child started while SIGINT is ignored (an xdist worker, a shell's background job) ignores it too: `stop`
    asks for the same clean stop with SIGTERM instead of waiting 30 s and killing it."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        srv = ServerProcess("CPU").start()
    finally:
        signal.signal(signal.SIGINT, old)
    try:
        assert post(srv.port, batch())[0] == 200
        assert srv.stop(signal.SIGINT, wait=20) == 0  # (-9 where it was killed after the wait)
        assert "shutting down (1 session(s) freed)" in srv.stderr()
    finally:
        srv.kill()


def test_server_process_exits_cleanly_on_sigterm():
    with ServerProcess("CPU") as srv:
        assert srv.stop(signal.SIGTERM) == 0
        assert "shutting down" in srv.stderr()


def test_server_process_reports_a_bad_device():
    srv = ServerProcess("NOSUCHDEVICE")
    with pytest.raises(DeviceError, match="exited with 2: .*unknown device"):
        srv.start()


def test_server_death_gives_one_clear_error():
    srv = ServerProcess("CPU").start()
    try:
        dev = RemoteDevice(address=srv.address, retry=0.2, timeout=30.0)
        dev._submit(P.Synchronize())
        srv.kill()
        with pytest.raises(DeviceError, match=f"REMOTE server {srv.address}"):
            dev._submit(P.Synchronize())
    finally:
        srv.stop()


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_a_hung_server_times_out_instead_of_hanging():
    srv = ServerProcess("CPU").start()
    try:
        dev = RemoteDevice(address=srv.address, retry=0.0, timeout=30.0)
        dev._submit(P.Synchronize())  # the first answer may be slow on a busy machine: a generous timeout
        dev._conn.set_timeout(1.0)  # then 1 s for the hung server, on this connection and any reopened one
        # stopped for sure (every thread): right after a bare SIGSTOP, the thread reading this kept-alive
        # connection could still answer on a loaded machine (the test failed with DID NOT RAISE)
        srv.freeze()
        if os.path.isdir(f"/proc/{srv.proc.pid}/task"):  # (Linux) every thread of it is stopped now
            tasks = Path(f"/proc/{srv.proc.pid}/task")
            states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()]
            assert set(states) == {"T"}, states
        with pytest.raises(DeviceError, match="lost the connection .*no answer within 1s"):
            dev._submit(P.Synchronize())
    finally:
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.stop()


def test_a_kept_alive_connection_closed_by_the_server_is_reopened():
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(request_time=0.0)).start()  # 1 s socket timeout
    try:
        dev = client(srv)
        dev._submit(P.Synchronize())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait for the server to drop the idle connection
            sock = dev._conn._conn.sock
            sock.setblocking(False)
            try:
                if sock.recv(1, socket.MSG_PEEK) == b"":
                    break
            except BlockingIOError:
                pass
            finally:
                sock.setblocking(True)
            time.sleep(0.05)
        dev._submit(P.Synchronize())
        assert dev.round_trips == 2
    finally:
        srv.shutdown()


# --- the client's disk cache never mixes servers


@needs_cpu
def test_binaries_from_one_server_are_never_sent_to_another(monkeypatch, tmp_path):
    """A binary cached from server A (here: poisoned, computing x * 2) is never used with server B."""
    import tgc
    from tgc import backends, cache
    from tgc.backends import get_device
    from tgc.codegen.kernel import compile_key
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DISABLE_COMPILER_CACHE", raising=False)
    cache._reset_for_tests()
    a, b = serve("127.0.0.1", 0, "CPU", None).start(), serve("127.0.0.1", 0, "CPU", None).start()

    def use(srv: RemoteServer) -> RemoteDevice:
        for key in [k for k in backends._instances if k[0] == "REMOTE"]:
            backends._instances.pop(key).close()
        monkeypatch.setenv("TGC_REMOTE", f"127.0.0.1:{srv.port}")
        return get_device("REMOTE")

    try:
        plus, times = tgc.loads("x: f32[N]\nreturn x + 1\n"), tgc.loads("x: f32[N]\nreturn x * 2\n")
        x = np.arange(8, dtype=np.float32)
        use(a)
        np.testing.assert_array_equal(plus.run(device="REMOTE", x=x)["out0"], x + 1)
        np.testing.assert_array_equal(times.run(device="REMOTE", x=x)["out0"], x * 2)
        assert cache.stats()["entries"]["compile"] == 2
        # server A was malicious: it answered the compile of x + 1 with the binary of x * 2
        src_plus, src_times = _kernel_sources(plus, "REMOTE", x)[0], _kernel_sources(times, "REMOTE", x)[0]
        dev_a = get_device("REMOTE")
        key_plus, key_times = compile_key(dev_a, src_plus), compile_key(dev_a, src_times)
        cache.put("compile", key_plus, cache.get("compile", key_times))
        fresh = tgc.loads("x: f32[N]\nreturn x + 1\n")
        np.testing.assert_array_equal(fresh.run(device="REMOTE", x=x)["out0"], x * 2)  # A's clients see the damage
        dev_b = use(b)
        assert compile_key(dev_b, src_plus) != key_plus
        assert compile_key(get_device("CPU"), src_plus) != key_plus  # nor is it the local CPU's key
        fresh = tgc.loads("x: f32[N]\nreturn x + 1\n")
        np.testing.assert_array_equal(fresh.run(device="REMOTE", x=x)["out0"], x + 1)  # B compiled its own
        assert len(b._compiled) == 1
    finally:
        for key in [k for k in backends._instances if k[0] == "REMOTE"]:
            backends._instances.pop(key).close()
        a.shutdown()
        b.shutdown()
        cache._reset_for_tests()


def _kernel_sources(prog, device: str, x) -> list[str]:
    from tgc.backends import get_device
    from tgc.codegen.kernel import build_kernel
    dev = get_device(device)
    return [build_kernel(item, dev).src for item in prog.schedule({"N": len(x)})]


# --- hostile launches and compiles: refused with a reason, never a crash (a server subprocess: a crash shows)

ABORTING_SRC = """declare i32 @llvm.amdgcn.workitem.id.x()
define void @k(ptr %data0, i32 %core_id) {
entry:
  %v = call i32 @llvm.amdgcn.workitem.id.x()
  store i32 %v, ptr %data0
  ret void
}
"""


def _plus_one_source(n: int) -> tuple[str, str, tuple[int, ...]]:
    """(name, source, global_size) of the CPU kernel of `x + 1` over `n` floats, as tgc renders it."""
    import tgc
    from tgc.backends import get_device
    from tgc.codegen.kernel import build_kernel
    (item,) = tgc.loads("x: f32[N]\nreturn x + 1\n").schedule({"N": n})
    k = build_kernel(item, get_device("CPU"))
    return k.name, k.src, tuple(k.global_size)


@pytest.fixture(scope="module")
def server_process():
    with ServerProcess("CPU") as srv:
        yield srv


def _raw(srv, session: str, *reqs: P.Request, blobs: dict[str, bytes] | None = None) -> tuple[int, str | None, bytes]:
    return post(srv.port, batch(*reqs, blobs=blobs), session=session)


def _compiled(srv, session: str, src: str) -> tuple[str, bytes]:
    status, kind, body = _raw(srv, session, P.Compile(src=src))
    assert status == 200, body
    results, blobs = P.decode_results(body)
    return results[0], bytes(blobs[results[0]])


@needs_cpu
def test_launches_that_do_not_fit_the_kernel_are_refused(server_process):
    srv, sid = server_process, "hostile-launch-0123456789"
    n = 100_000
    name, src, grid = _plus_one_source(n)
    assert grid[0] > 1 or _cpu_cores() == 1
    h, lib = _compiled(srv, sid, src)
    x = np.arange(n, dtype=np.float32)
    setup = [P.ProgramAlloc(prog=1, name=name, datahash=h), P.BufferAlloc(buf=1, size=4 * n),
             P.BufferAlloc(buf=2, size=4 * n), P.CopyIn(buf=2, datahash=P.digest(x.tobytes())),
             P.BufferAlloc(buf=3, size=16)]
    assert _raw(srv, sid, *setup, blobs={h: lib, P.digest(x.tobytes()): x.tobytes()})[0] == 200
    hostile = {
        "buffers": P.ProgramExec(prog=1, bufs=(1,), global_size=grid, wait=True),
        "buffers too many": P.ProgramExec(prog=1, bufs=(1, 2, 2), global_size=grid, wait=True),
        "too small": P.ProgramExec(prog=1, bufs=(1, 3), global_size=grid, wait=True),
        "global_size": P.ProgramExec(prog=1, bufs=(1, 2), global_size=(grid[0] + 1, 1, 1), wait=True),
        "local": P.ProgramExec(prog=1, bufs=(1, 2), global_size=grid, local_size=(4, 1, 1), wait=True),
        "vals": P.ProgramExec(prog=1, bufs=(1, 2), global_size=grid, vals=(7,), wait=True),
        "limit": P.ProgramExec(prog=1, bufs=(1, 2), global_size=(1_000_000, 1, 1), wait=True),
        "graph": P.GraphAlloc(graph=1, kernels=(P.GraphKernel(prog=1, bufs=(1, 3), global_size=grid),)),
    }
    for what, req in hostile.items():
        status, kind, body = _raw(srv, sid, req)
        assert 400 <= status < 500 and body.strip(), (what, status, body)
        assert srv.proc.poll() is None, f"the server died on the launch with bad {what}"
    # a view too small for the kernel is refused as well (the view's size counts, not its parent's)
    status, _, body = _raw(srv, sid, P.BufferFree(buf=3), P.BufferAlloc(buf=3, size=4 * n))
    assert status == 200
    status, _, body = _raw(srv, sid, P.ProgramExec(prog=1, bufs=(1, 2), global_size=grid, wait=True),
                           P.CopyOut(buf=1))
    assert status == 200, body
    results, blobs = P.decode_results(body)
    np.testing.assert_array_equal(np.frombuffer(blobs[results[1]], np.float32), x + 1)


def _cpu_cores() -> int:
    from tgc.backends import get_device
    return get_device("CPU").cores


@needs_cpu
def test_binaries_the_server_did_not_compile_or_that_lie_are_refused(server_process):
    from tgc.backends import get_device
    srv, sid = server_process, "hostile-binary-0123456789"
    name, src, grid = _plus_one_source(64)
    lib = get_device("CPU").compiler.compile(src)  # a good binary, but not from this server
    status, _, body = _raw(srv, sid, P.ProgramAlloc(prog=1, name=name, datahash=P.digest(lib)),
                           blobs={P.digest(lib): lib})
    assert status == 400 and b"did not compile" in body
    # a contract that does not match the kernel's parameters
    lying = src.replace('"bufs":[256,256]', '"bufs":[256]')
    assert lying != src
    h, lib = _compiled(srv, sid, lying)
    status, _, body = _raw(srv, sid, P.ProgramAlloc(prog=1, name=name, datahash=h), blobs={h: lib})
    assert status == 400 and b"takes 2 buffers" in body
    status, _, body = _raw(srv, sid, P.ProgramAlloc(prog=1, name="other", datahash=h), blobs={h: lib})
    assert status == 400 and b"no kernel 'other'" in body
    for bad in ["not json", "[1]", '{"bufs":"x","global_size":[1],"local_size":null,"vals":0}',
                '{"bufs":[1],"global_size":[0],"local_size":null,"vals":0}']:
        status, kind, body = _raw(srv, sid, P.Compile(src=src.split("; tgc-launch:")[0] + "; tgc-launch: " + bad))
        assert (status, kind) == (422, "compile") and b"contract" in body, (bad, body)
    assert srv.proc.poll() is None


@needs_cpu
def test_a_compiler_abort_loses_a_worker_not_the_server(server_process):
    srv, sid = server_process, "hostile-compile-0123456789"
    for _ in range(2):
        status, kind, body = _raw(srv, sid, P.Compile(src=ABORTING_SRC))
        assert (status, kind) == (422, "compile") and b"crashed" in body, body
        status, kind, body = _raw(srv, sid, P.Assembly(src=ABORTING_SRC))
        assert (status, kind) == (422, "compile"), body
        assert srv.proc.poll() is None
    name, src, grid = _plus_one_source(64)
    h, lib = _compiled(srv, sid, src)  # the next compile gets a fresh worker
    assert lib.startswith(b"\x7fELF")


# --- slow, greedy and sloppy clients


def _raw_http(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes and read until the server closes (or `timeout`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out


def test_a_slow_client_is_cut_off_by_the_request_deadline_while_others_are_served():
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(request_time=1.0)).start()
    try:
        slow = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        slow.sendall(b"POST /batch HTTP/1.1\r\n")
        start, closed = time.monotonic(), False
        while time.monotonic() - start < 8:  # a byte every 0.2 s: no single read ever times out
            try:
                slow.sendall(b"X")
            except OSError:
                closed = True
                break
            assert post(srv.port, batch())[0] == 200  # a good client beside it
            slow.settimeout(0.2)
            try:
                if slow.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
        slow.close()
        assert closed, "the slow client still held its connection"
    finally:
        srv.shutdown()


def test_connections_beyond_the_cap_get_503():
    from tgc.backends.remote.client import Connection
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(max_connections=3)).start()
    try:  # (connections that showed their (empty) token: idle ones that never did give way to new ones instead)
        idle = [Connection("127.0.0.1", srv.port, None, f"cap{i}-0123456789abc", timeout=10, retry=0)
                for i in range(3)]
        for c in idle:
            assert c.post(batch()) is not None
        answer = _raw_http(srv.port, b"")
        assert answer.startswith(b"HTTP/1.1 503") and b"too many connections" in answer
        for s in idle:
            s.close()
        deadline = time.monotonic() + 10
        while srv.conns and time.monotonic() < deadline:
            time.sleep(0.01)
        assert post(srv.port, batch())[0] == 200
    finally:
        srv.shutdown()


def test_unknown_methods_are_refused_in_plain_text_after_the_token_check(token_server):
    for auth in (b"", b"Authorization: Bearer s3cret-token\r\n"):
        answer = _raw_http(token_server.port, b"FROB /batch HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 401" if not auth else b"HTTP/1.1 405"), answer
        assert b"Python" not in head and b"<" not in body and body.strip()
    answer = _raw_http(token_server.port, b"GARBAGE\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400") and b"Python" not in answer and b"<html" not in answer.lower()


@pytest.mark.parametrize("lengths", [["+12"], ["1_0"], ["12", "12"], ["0x10"], ["-1"], [" "], ["1" * 30]])
def test_content_length_is_parsed_strictly(server, lengths):
    headers = b"".join(b"Content-Length: " + v.encode() + b"\r\n" for v in lengths)
    head = f"POST /batch HTTP/1.1\r\nHost: x\r\n{P.SESSION_HEADER}: {SESSION}\r\n".encode()
    answer = _raw_http(server.port, head + headers + b"\r\n" + b"x" * 12)
    assert answer.startswith(b"HTTP/1.1 411"), answer


@needs_cpu
def test_clients_vanishing_mid_request_print_no_tracebacks():
    with ServerProcess("CPU") as srv:
        head = f"POST /batch HTTP/1.1\r\nHost: x\r\n{P.SESSION_HEADER}: {SESSION}\r\n".encode()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:  # body cut short
            s.sendall(head + b"Content-Length: 1000\r\n\r\n" + b"TGC1")
        big = batch(P.BufferAlloc(buf=1, size=32 << 20), P.CopyOut(buf=1))
        for _ in range(3):  # gone before the (32 MiB) answer is written
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.sendall(head + f"Content-Length: {len(big)}\r\n\r\n".encode() + big)
            s.recv(10)
            s.close()
        assert post(srv.port, batch(P.EndSession()))[0] == 200
        assert srv.proc.poll() is None
    assert "Traceback" not in srv.stderr(), srv.stderr()


@needs_cpu
def test_tgc_serve_takes_the_new_limits():
    with ServerProcess("CPU", "--max-memory", "100", "--max-sessions-per-client", "1", "--max-connections", "4") as srv:
        status, kind, body = post(srv.port, batch(P.BufferAlloc(buf=1, size=200)))
        assert (status, kind) == (413, "limit") and b"server's memory limit of 100 bytes" in body
        assert post(srv.port, batch(P.BufferAlloc(buf=1, size=50)))[0] == 200
        status, kind, body = post(srv.port, batch(P.BufferAlloc(buf=1, size=50)), session="other-0123456789")
        assert (status, kind) == (503, "busy") and b"per client" in body


def test_contracts_and_parameters_are_read_from_the_source():
    from tgc.backends.remote.server import parse_contract
    src = ('define void @k(ptr noalias align(16) %a, ptr dereferenceable(8) %b, <4 x i32> %v, i64 %core_id) #0 {\n'
           '}\ndefine void @other() {\n}\n; tgc-launch: {"bufs":[1,2],"global_size":[2],"local_size":null,"vals":1}\n')
    known = parse_contract(src, "llvm")
    assert known.params == {"k": (2, 2), "other": (0, 0)}
    assert known.contract.bufs == (1, 2) and known.contract.global_size == (2, 1, 1) and known.contract.vals == 1
    assert parse_contract("define void @k(ptr %a) {\n}\n", "llvm").contract is None
    c_src = '__kernel void k(__global float* a) {}\n// tgc-launch: {"bufs":[4],"global_size":[8,1,1],' \
            '"local_size":[8,1,1],"vals":0}\n'
    known = parse_contract(c_src, "c")
    assert known.params is None and known.contract.local_size == (8, 1, 1)
    with pytest.raises(ValueError, match="vals"):
        parse_contract('; tgc-launch: {"bufs":[],"global_size":[1],"local_size":null,"vals":-1}', "llvm")


def test_one_binary_compiled_from_sources_with_different_sizes_runs_under_each(monkeypatch, tmp_path):
    """`y: i32[3]` and `y: i32[1]`, each returning `y[0] + 0`, compile to the same binary with different launch
    contracts. A session that runs the second from the client's cache (no Compile) must not be held to the
    first's contract (it was: 'buffer has 4 bytes; the kernel's parameter 1 needs 12')."""
    import tgc
    from tgc import backends, cache
    monkeypatch.setenv("TGC_CACHE_DIR", str(tmp_path / "cache"))
    cache._reset_for_tests()
    srv = serve("127.0.0.1", 0, "CPU", None, Limits()).start()
    monkeypatch.setenv("TGC_REMOTE", f"127.0.0.1:{srv.port}")
    try:
        def run_in_new_session(n: int) -> np.ndarray:
            monkeypatch.setattr(backends, "_instances", {})  # a new RemoteDevice: a new session
            y = np.arange(7, 7 + n, dtype=np.int32)
            return tgc.loads(f"y: i32[{n}]\nreturn y[0] + 0\n").run(device="REMOTE", y=y)["out0"]
        assert int(run_in_new_session(3)) == 7  # compiled first: the server's contract needs 12 bytes
        assert int(run_in_new_session(1)) == 7  # same binary, compiled again from its own source
        assert int(run_in_new_session(1)) == 7  # from the client's cache: no Compile in this session
        assert int(run_in_new_session(3)) == 7
    finally:
        srv.shutdown()
        cache._reset_for_tests()


def test_serve_has_one_option_parser():
    """`tgc serve`'s options live in the CLI only: the server module has no command line of its own."""
    import tgc.backends.remote.server as server_module
    assert not hasattr(server_module, "main")
    src = open(server_module.__file__, encoding="utf-8").read()
    assert "argparse" not in src and "__main__" not in src


@needs_cpu
def test_one_binary_of_sources_of_different_arity_launches_as_each_declares(server_process, monkeypatch):
    """`x * 0` (kernel E_1 of two buffers) and `a * 0 + b * 0` (E_1 of three) store a zero: on the CPU both compile
    to one binary (the unread inputs leave no trace in the code). A launch is checked against what its own source
    declared, not against what the first source of that binary did (a suite run found this: a launch was refused
    as 'the kernel takes 1 buffers, the launch gave 2')."""
    import tgc
    from tgc import backends
    dev = client(server_process)
    monkeypatch.setitem(backends._instances, backends.canonical("REMOTE:0"), dev)  # REMOTE:0 is this client
    one = np.array([7], dtype=np.int32)
    try:
        srcs = ["x: i32[1]\nreturn x * 0", "a: i32[1]\nb: i32[1]\nreturn a * 0 + b * 0",
                "a: i32[1]\nb: i32[1]\nreturn a - b + b - a"]
        libs = set()
        for src in srcs:
            prog = tgc.loads(src)
            ks = prog.compile(device="CPU")
            libs |= {k.binary for k in ks}
            out = prog.run(device="REMOTE:0", **{d.name: one for d in prog.inputs})
            np.testing.assert_array_equal(next(iter(out.values())), np.zeros(1, np.int32))
        assert len(libs) == 1  # (the premise: one binary for all three)
    finally:
        dev.close()
