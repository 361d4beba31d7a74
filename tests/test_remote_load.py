"""Load: 16 clients at once, each running 100 small programs through one `tgc serve` subprocess.
`TGC_LOAD_CLIENTS` and `TGC_LOAD_RUNS` make it bigger by hand (32 clients, as many runs as fill a minute)."""

from __future__ import annotations

import importlib.util
import os
import threading

import numpy as np
import pytest

from tgc.backends.remote.process import ServerProcess


def _cpu_ready() -> bool:
    if importlib.util.find_spec("tgc.backends.cpu") is None or importlib.util.find_spec("tgc.api") is None:
        return False
    from tgc.backends import device_class
    return device_class("CPU").probe()[0]


pytestmark = pytest.mark.skipif(not _cpu_ready(), reason="the CPU device is not available yet")

CLIENTS = int(os.environ.get("TGC_LOAD_CLIENTS", "16"))
RUNS = int(os.environ.get("TGC_LOAD_RUNS", "100"))
SRC = "x: f32[N]\ny: f32[N]\nreturn x * y + 1, sum(x)\n"


def test_sixteen_clients_a_hundred_programs_each(monkeypatch):
    import tgc
    from tgc import backends
    with ServerProcess("CPU") as srv:
        monkeypatch.setenv("TGC_REMOTE", srv.address)
        monkeypatch.delenv("TGC_REMOTE_TOKEN", raising=False)
        monkeypatch.delenv("TGC_REMOTE_TOKEN_FILE", raising=False)
        for key in [k for k in backends._instances if k[0] == "REMOTE"]:
            backends._instances.pop(key)
        programs = [tgc.loads(SRC) for _ in range(CLIENTS)]  # parsed here: one Program per client thread
        errors: list[BaseException] = []
        done = [0] * CLIENTS

        def client(i: int) -> None:
            rng = np.random.default_rng(i)
            n = 8 + i  # each client its own shapes, so the server holds different programs at once
            try:
                for _ in range(RUNS):
                    x = rng.integers(-50, 50, n).astype(np.float32)
                    y = rng.integers(-50, 50, n).astype(np.float32)
                    out = programs[i].run(device=f"REMOTE:{i}", x=x, y=y)
                    np.testing.assert_array_equal(out["out0"], x * y + 1)
                    assert out["out1"] == x.sum()  # small integers: exact in f32
                    done[i] += 1
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300 + RUNS)
        assert not errors, errors[0]
        assert done == [RUNS] * CLIENTS
        devices = [backends.get_device(f"REMOTE:{i}") for i in range(CLIENTS)]
        assert len({d.session for d in devices}) == CLIENTS
        # after the programs are loaded, a run is one round trip (two outputs: two copy outs)
        assert all(d.round_trips <= 2 * RUNS + 10 for d in devices), [d.round_trips for d in devices]
        for d in devices:
            d.close()
        assert srv.stop() == 0
    assert "shutting down (0 session(s) freed)" in srv.stderr()


def test_floods_of_sessions_hostile_launches_and_slow_clients_beside_good_clients(monkeypatch):
    """Empty and memory-holding session floods, hostile launches, oversized request lists and trickling
    connections, all at once, while four good clients keep getting exact results."""
    import http.client
    import socket
    import time

    import tgc
    from tgc import backends
    from tgc.backends.remote import protocol as P
    with ServerProcess("CPU", "--max-sessions", "24", "--max-sessions-per-client", "24", "--request-time", "2",
                       "--max-connections", "48") as srv:
        monkeypatch.setenv("TGC_REMOTE", srv.address)
        monkeypatch.delenv("TGC_REMOTE_TOKEN", raising=False)
        monkeypatch.delenv("TGC_REMOTE_TOKEN_FILE", raising=False)
        for key in [k for k in backends._instances if k[0] == "REMOTE"]:
            backends._instances.pop(key)
        good = 4
        programs = [tgc.loads(SRC) for _ in range(good)]
        for i in range(good):  # the good clients' sessions exist (and hold memory) before the floods
            programs[i].run(device=f"REMOTE:{i}", x=np.ones(8, np.float32), y=np.ones(8, np.float32))
        stop, errors, runs = threading.Event(), [], [0] * good

        def client(i: int) -> None:
            rng = np.random.default_rng(i)
            try:
                while not stop.is_set():
                    x = rng.integers(-50, 50, 8 + i).astype(np.float32)
                    y = rng.integers(-50, 50, 8 + i).astype(np.float32)
                    out = programs[i].run(device=f"REMOTE:{i}", x=x, y=y)
                    np.testing.assert_array_equal(out["out0"], x * y + 1)
                    runs[i] += 1
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        def post(session: str, body: bytes) -> int:
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
            try:
                conn.request("POST", "/batch", body, {P.SESSION_HEADER: session})
                resp = conn.getresponse()
                resp.read()
                return resp.status
            finally:
                conn.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(good)]
        for t in threads:
            t.start()
        slow = []
        try:
            for _ in range(8):  # trickling connections that never finish their headers
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
                s.sendall(b"POST /batch HTTP/1.1\r\n")
                slow.append(s)
            statuses = set()
            for i in range(60):  # sessions: empty ones, then ones holding memory
                body = P.encode_requests([P.BufferAlloc(buf=1, size=1024)] if i % 2 else [], {})
                statuses.add(post(f"flood-{i:03d}-0123456789", body))
                for s in slow:
                    try:
                        s.sendall(b"X")
                    except OSError:
                        pass
            assert statuses <= {200, 503}
            launches = [P.ProgramExec(prog=1, bufs=(1,), global_size=(10**6, 1, 1)),
                        P.ProgramExec(prog=1, bufs=(), global_size=(2**31 - 1, 2**31 - 1, 2**31 - 1))]
            for req in launches:  # refused (or, with the table full of live sessions, 503): never a crash
                assert post("hostile-0123456789", P.encode_requests([req], {})) in (400, 404, 503)
            huge = P.encode_body({}, "[" + "BufferFree(buf=1), " * 400_000 + "]")
            assert post("hostile-0123456789", huge) == 400  # refused before parsing, before any session
            time.sleep(0.5)
        finally:
            stop.set()
            for t in threads:
                t.join(120)
            for s in slow:
                s.close()
        assert not errors, errors[0]
        assert all(r > 0 for r in runs), runs
        assert srv.proc.poll() is None
        for i in range(good):
            backends.get_device(f"REMOTE:{i}").close()
        assert srv.stop() == 0
    assert "Traceback" not in srv.stderr()
