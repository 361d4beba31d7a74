"""Load: 16 clients at once, each running 100 small programs through one `tgc serve` subprocess."""

from __future__ import annotations

import importlib.util
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

CLIENTS, RUNS = 16, 100
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
            t.join(300)
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
