"""Several REMOTE servers: two real `tgc serve` processes on loopback as `REMOTE:0` and `REMOTE:1` (selection by
index, per-server tokens, `tgc devices`), byte-range copies between them through the client (`copy_batch`:
exact bytes, offsets, one round trip per source server, refusals of ranges past a buffer's end), and a server
that dies mid-transfer (one clear error, not a hang)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests.test_remote_datapath import _drop_remote_instances
from tgc.backends.remote import protocol as P
from tgc.backends.remote.process import ServerProcess
from tgc.errors import DeviceError, TgcError


def _cpu_ready() -> bool:
    if importlib.util.find_spec("tgc.backends.cpu") is None:
        return False
    from tgc.backends import device_class
    return device_class("CPU").probe()[0]


pytestmark = pytest.mark.skipif(not _cpu_ready(), reason="the CPU device is not available")


@pytest.fixture(scope="module")
def servers():
    with ServerProcess("CPU") as a, ServerProcess("CPU") as b:
        yield a, b


@pytest.fixture
def pair(servers, monkeypatch):
    """REMOTE:0 and REMOTE:1 on the two servers."""
    a, b = servers
    monkeypatch.setenv("TGC_REMOTE", f"{a.address},{b.address}")
    for name in ("TGC_REMOTE_TOKEN", "TGC_REMOTE_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    _drop_remote_instances()
    from tgc.backends import get_device
    yield get_device("REMOTE:0"), get_device("REMOTE:1")
    _drop_remote_instances()


def _buffer(dev, data: np.ndarray) -> int:
    h = dev.allocator.alloc(data.nbytes)
    dev.allocator.copyin(h, memoryview(np.ascontiguousarray(data)).cast("B"))
    return h


def _read(dev, h: int, nbytes: int) -> np.ndarray:
    out = np.zeros(nbytes, np.uint8)
    dev.allocator.copyout(memoryview(out), h)
    return out


# --- selection


def test_remote_i_is_the_ith_server(pair, servers):
    import tgc
    from tgc.backends import get_device
    r0, r1 = pair
    assert r0.conn_address[1] == servers[0].port and r1.conn_address[1] == servers[1].port
    assert get_device("REMOTE") is r0  # REMOTE alone is REMOTE:0
    assert r0.info()["server"] == servers[0].address and r1.info()["server"] == servers[1].address
    x = np.arange(12, dtype=np.float32)
    prog = tgc.loads("x: f32[N]\nreturn x * 2 + 1\n")
    for name in ("REMOTE:0", "REMOTE:1"):
        np.testing.assert_array_equal(prog.run(device=name, x=x)["out0"], x * 2 + 1)


def test_each_server_is_named_by_its_index_in_debug_output(pair, capsys, monkeypatch):
    # DEBUG=2 names each launch's device: REMOTE:0 and REMOTE:1 of a list (REMOTE:0 was printed as `REMOTE`)
    import tgc
    r0, r1 = pair
    assert (r0.name, r1.name) == ("REMOTE:0", "REMOTE:1")
    monkeypatch.setenv("DEBUG", "2")
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = tgc.loads("x: f32[N, D]\nreturn x.sum(axis=0)\n").run(device="REMOTE:0,REMOTE:1", shard={"x": 0}, x=x)
    np.testing.assert_array_equal(out["out0"], x.sum(axis=0))
    err = capsys.readouterr().err
    assert "*** REMOTE:0 " in err and "*** REMOTE:1 " in err, err


def test_an_index_past_the_servers_is_a_user_error(pair):
    from tgc.backends import get_device
    with pytest.raises(TgcError, match="no device 'REMOTE:5': TGC_REMOTE names 2 servers") as e:
        get_device("REMOTE:5")
    assert e.value.exit_code == 2 and "REMOTE:0 .. REMOTE:1" in e.value.hint


def test_cli_index_past_the_servers_exits_2(servers, tmp_path):
    prog = tmp_path / "p.tg"
    prog.write_text("x: f32[N]\nreturn x + 1\n")
    env = {**os.environ, "TGC_REMOTE": f"{servers[0].address},{servers[1].address}"}
    r = subprocess.run([sys.executable, "-m", "tgc.cli.main", "run", str(prog), "-d", "REMOTE:5",
                        "--random", "-D", "N=4"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "no device 'REMOTE:5': TGC_REMOTE names 2 servers" in r.stderr and "Traceback" not in r.stderr


def test_devices_lists_each_server(pair, servers):
    from click.testing import CliRunner

    from tgc.cli.main import main
    r = CliRunner().invoke(main, ["devices", "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["device"]: row for row in json.loads(r.output)}
    assert "REMOTE" not in rows
    for i, srv in enumerate(servers):
        assert rows[f"REMOTE:{i}"]["server"] == srv.address and rows[f"REMOTE:{i}"]["available"]
    r = CliRunner().invoke(main, ["devices"], env={"COLUMNS": "400"})  # (a narrow table would wrap the name)
    assert r.exit_code == 0 and f"REMOTE:1 ({servers[1].address})" in r.output


# --- tokens


def test_token_table_forms(tmp_path):
    from tgc.backends.remote.client import ANY_SERVER, client_token, read_token_table
    f = tmp_path / "tokens"
    f.write_text("only-one-token\n")
    assert read_token_table(str(f)) == {ANY_SERVER: "only-one-token"}
    f.write_text("# tokens of my servers\n127.0.0.1:7001 tok-a\n\n[::1]:7002   tok-b\n* tok-default\n")
    assert read_token_table(str(f)) == {("127.0.0.1", 7001): "tok-a", ("::1", 7002): "tok-b", ANY_SERVER: "tok-default"}
    env = {"TGC_REMOTE_TOKEN_FILE": str(f)}
    assert client_token(env, ("127.0.0.1", 7001)) == "tok-a"
    assert client_token(env, ("::1", 7002)) == "tok-b"
    assert client_token(env, ("127.0.0.1", 7003)) == "tok-default"
    assert client_token({**env, "TGC_REMOTE_TOKEN": "env-wins"}, ("127.0.0.1", 7001)) == "env-wins"
    f.write_text("127.0.0.1:7001 tok-a\n")
    assert client_token(env, ("127.0.0.1", 7009)) is None  # no line and no `*`: no token sent


def test_token_files_starting_with_a_byte_order_mark(tmp_path):
    """Issue 25: a token-lines file saved with a UTF-8 BOM gave its first server the address "\\ufeff127.0.0.1",
    which never matched (401); a one-token file's token held the BOM."""
    from tgc.backends.remote.client import ANY_SERVER, client_token, read_token_table
    from tgc.backends.remote.server import read_token
    f = tmp_path / "tokens"
    f.write_bytes(b"\xef\xbb\xbf127.0.0.1:7001 tok-a\n127.0.0.1:7002 tok-b\n")
    assert read_token_table(str(f)) == {("127.0.0.1", 7001): "tok-a", ("127.0.0.1", 7002): "tok-b"}
    assert client_token({"TGC_REMOTE_TOKEN_FILE": str(f)}, ("127.0.0.1", 7001)) == "tok-a"
    f.write_bytes(b"\xef\xbb\xbfonly-one-token\r\n")
    assert read_token_table(str(f)) == {ANY_SERVER: "only-one-token"}
    assert read_token(str(f), env={}) == "only-one-token"  # the server reads its --token-file the same way


@pytest.mark.parametrize("content, message", [
    ("127.0.0.1:7001 tok-a\nstray\n", "line 2 of the token file .* is not `HOST:PORT TOKEN`"),
    ("127.0.0.1:7001 tok-a\n127.0.0.1:7001 tok-b\n", "line 2 .* names 127.0.0.1:7001 a second time"),
    ("127.0.0.1:7001 tok-a extra\n* x\n", "line 1 .* is not `HOST:PORT TOKEN`"),
    ("127.0.0.1:7001 tök\n", "the token on line 1 .* cannot be used"),
    ("127.0.0.1:99999 tok\n", "bad port"),
])
def test_bad_token_tables_are_user_errors(tmp_path, content, message):
    from tgc.backends.remote.client import read_token_table
    f = tmp_path / "tokens"
    f.write_text(content)
    with pytest.raises(TgcError, match=message) as e:
        read_token_table(str(f))
    assert e.value.exit_code == 2


def test_each_server_its_own_token(tmp_path, monkeypatch):
    import tgc
    ta, tb = tmp_path / "a", tmp_path / "b"
    ta.write_text("token-of-server-a-" + "1" * 20 + "\n")
    tb.write_text("token-of-server-b-" + "2" * 20 + "\n")
    with ServerProcess("CPU", "--token-file", str(ta)) as a, ServerProcess("CPU", "--token-file", str(tb)) as b:
        table = tmp_path / "tokens"
        table.write_text(f"{a.address} {ta.read_text().strip()}\n{b.address} {tb.read_text().strip()}\n")
        monkeypatch.setenv("TGC_REMOTE", f"{a.address},{b.address}")
        monkeypatch.setenv("TGC_REMOTE_TOKEN_FILE", str(table))
        monkeypatch.delenv("TGC_REMOTE_TOKEN", raising=False)
        monkeypatch.setenv("TGC_REMOTE_RETRY", "0")
        _drop_remote_instances()
        try:
            x = np.arange(5, dtype=np.float32)
            prog = tgc.loads("x: f32[N]\nreturn x - 3\n")
            for name in ("REMOTE:0", "REMOTE:1"):
                np.testing.assert_array_equal(prog.run(device=name, x=x)["out0"], x - 3)
            # server b's line swapped for a's token: refused, and the hint names the line to write
            table.write_text(f"{a.address} {ta.read_text().strip()}\n* {ta.read_text().strip()}\n")
            _drop_remote_instances()
            prog = tgc.loads("x: f32[N]\nreturn x - 3\n")  # kernels loaded on the dropped devices stay there
            np.testing.assert_array_equal(prog.run(device="REMOTE:0", x=x)["out0"], x - 3)
            with pytest.raises(DeviceError, match=f"REMOTE server {b.address} refused .* wrong token") as e:
                prog.run(device="REMOTE:1", x=x)
            assert f"`{b.address} TOKEN`" in e.value.hint
        finally:
            _drop_remote_instances()


# --- copies between servers


def test_copy_batch_between_servers_is_exact(pair):
    from tgc.backends.remote.client import RemoteDevice
    r0, r1 = pair
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 256, 4099, dtype=np.uint8), rng.integers(0, 256, 3001, dtype=np.uint8)
    ha, hb = _buffer(r0, a), _buffer(r1, b)
    copies = [(r0, ha, 0, r1, hb, 1, 1000), (r0, ha, 4000, r1, hb, 3001 - 99, 99), (r1, hb, 7, r0, ha, 2048, 2000),
              (r0, ha, 5, r0, ha, 3000, 10)]  # within one device too
    want_a, want_b = a.copy(), b.copy()
    for src, hs, so, dst, _, do, n in copies:  # reads see the data before the batch, then the writes land
        data = (a if hs == ha and src is r0 else b)[so:so + n]
        (want_a if dst is r0 else want_b)[do:do + n] = data
    t0, t1 = r0.round_trips, r1.round_trips
    assert RemoteDevice.copy_batch(copies) == 1000 + 99 + 2000 + 10
    assert (r0.round_trips - t0, r1.round_trips - t1) == (1, 1)  # one read request per source server
    np.testing.assert_array_equal(_read(r0, ha, a.size), want_a)
    np.testing.assert_array_equal(_read(r1, hb, b.size), want_b)
    assert r0.bytes_read >= 1109 and r1.bytes_written >= 1099


def test_a_ring_step_costs_one_round_trip_per_server(pair):
    """The writes of one step ride with the next step's reads: k steps of a 2-device ring, k round trips each."""
    from tgc.backends.remote.client import RemoteDevice
    r0, r1 = pair
    n, chunk = 8, 64
    x0, x1 = np.arange(n * chunk, dtype=np.uint8), (np.arange(n * chunk) * 7 % 251).astype(np.uint8)
    h0, h1 = _buffer(r0, x0), _buffer(r1, x1)
    r0.flush(), r1.flush()
    t0, t1 = r0.round_trips, r1.round_trips
    for step in range(n):  # swap chunk `step` between the two devices
        o = step * chunk
        RemoteDevice.copy_batch([(r0, h0, o, r1, h1, o, chunk), (r1, h1, o, r0, h0, o, chunk)])
    assert (r0.round_trips - t0, r1.round_trips - t1) == (n, n)
    np.testing.assert_array_equal(_read(r0, h0, x0.size), x1)
    np.testing.assert_array_equal(_read(r1, h1, x1.size), x0)


def test_copy_between_and_host_ranges(pair):
    from tgc.backends.remote.client import RemoteDevice
    r0, r1 = pair
    assert RemoteDevice.supports_batch_copy and r0.supports_batch_copy
    a = np.arange(256, dtype=np.uint8)
    ha, hb = _buffer(r0, a), _buffer(r1, np.zeros(256, np.uint8))
    assert RemoteDevice.copy_between(r0, ha, np.int64(16), r1, hb, 32, 8, wait=True) == 8
    assert r1.read_range(hb, 30, 12) == bytes([0, 0, *range(16, 24), 0, 0])
    r1.write_range(hb, 250, b"\x01\x02\x03\x04\x05\x06")
    assert r1.read_range(hb, 248, 8) == b"\x00\x00\x01\x02\x03\x04\x05\x06"


def test_a_copy_within_one_device_stays_there(pair):
    """Same-device copies are queued on the server (no round trip); one whose source the batch writes reads
    first, so every copy sees the data from before the batch."""
    from tgc.backends.remote.client import RemoteDevice
    r0, r1 = pair
    a = np.arange(100, dtype=np.uint8)
    h, other = _buffer(r0, a), _buffer(r1, np.full(100, 7, np.uint8))
    r0.flush(), r1.flush()
    t0 = r0.round_trips
    RemoteDevice.copy_batch([(r0, h, 0, r0, h, 50, 10), (r0, h, 20, r0, h, 25, 20)])  # the second overlaps itself
    assert r0.round_trips == t0 and isinstance(r0._queue[-1], P.CopyRange)
    want = a.copy()
    want[50:60], want[25:45] = a[0:10], a[20:40]
    np.testing.assert_array_equal(_read(r0, h, 100), want)
    # (r1 -> r0 writes [0, 10); r0's own copy reads [5, 15)): the copy must read before the write lands
    before = _read(r0, h, 100)
    RemoteDevice.copy_batch([(r1, other, 0, r0, h, 0, 10), (r0, h, 5, r0, h, 90, 10)])
    want = before.copy()
    want[:10], want[90:] = 7, before[5:15]
    np.testing.assert_array_equal(_read(r0, h, 100), want)


def test_a_digest_from_the_source_server_is_checked_by_the_destination(pair, monkeypatch):
    """The client passes the source server's digest on with the bytes; a wrong one is refused where they land."""
    from tgc.backends.remote.client import RemoteDevice
    r0, r1 = pair
    ha, hb = _buffer(r0, np.arange(32, dtype=np.uint8)), _buffer(r1, np.zeros(32, np.uint8))
    real = RemoteDevice._read_ranges
    monkeypatch.setattr(RemoteDevice, "_read_ranges",
                        lambda self, ranges: [("0" * 64, data) for _, data in real(self, ranges)])
    with pytest.raises(DeviceError, match=f"REMOTE server {r1.conn_address[0]}:{r1.conn_address[1]}: .*sha256 does "
                                          "not match"):
        RemoteDevice.copy_batch([(r0, ha, 0, r1, hb, 0, 32)], wait=True)


def test_read_batch_reads_each_device_once(pair):
    from tgc.backends.remote.client import RemoteDevice
    r0, r1 = pair
    a, b = np.arange(100, dtype=np.uint8), np.arange(100, 200, dtype=np.uint8)
    ha, hb = _buffer(r0, a), _buffer(r1, b)
    t0, t1 = r0.round_trips, r1.round_trips
    got = RemoteDevice.read_batch([(r0, ha, 10, 5), (r1, hb, 0, 3), (r0, ha, 90, 10), (r1, hb, 50, 0)])
    assert got == [bytes(a[10:15]), bytes(b[:3]), bytes(a[90:]), b""]
    assert (r0.round_trips - t0, r1.round_trips - t1) == (1, 1)
    with pytest.raises(DeviceError, match="read range of 5 bytes at offset 96 runs past buffer"):
        RemoteDevice.read_batch([(r0, ha, 96, 5)])


def test_the_multi_device_hooks(pair):
    """What a multi-device all-reduce calls: ranged copies on the allocator and `copy_to` on the device."""
    r0, r1 = pair
    a = np.arange(64, dtype=np.uint8)
    ha, hb = _buffer(r0, a), _buffer(r1, np.zeros(64, np.uint8))
    out = np.zeros(8, np.uint8)
    r0.allocator.copyout_range(memoryview(out), ha, 40)
    np.testing.assert_array_equal(out, a[40:48])
    r1.allocator.copyin_range(hb, 60, memoryview(np.full(4, 9, np.uint8)))
    assert r0.copy_to(ha, r1, hb, 16, 0, 8) is True
    assert r0.copy_to(ha, object(), 0, 16) is False  # not REMOTE: the caller stages through the host
    want = np.zeros(64, np.uint8)
    want[8:24], want[60:] = a[:16], 9
    np.testing.assert_array_equal(_read(r1, hb, 64), want)


def _move(src: int, dst: int, src_offset: int, dst_offset: int, nbytes: int, size: int):
    from types import SimpleNamespace
    return SimpleNamespace(src=src, dst=dst, src_offset=src_offset, dst_offset=dst_offset, nbytes=nbytes,
                           src_size=size, dst_size=size)


def test_the_engine_step_form_of_copy_batch(pair):
    """`copy_batch(devices, src_handles, dst_handles, moves)`: a collective step's copies, by list position."""
    from tgc.backends.remote.client import RemoteDevice
    r0, r1 = pair
    a, b = np.arange(40, dtype=np.uint8), np.arange(100, 140, dtype=np.uint8)
    h = [_buffer(r0, a), _buffer(r1, b)]
    t0, t1 = r0.round_trips, r1.round_trips
    assert RemoteDevice.copy_batch([r0, r1], h, h, [_move(0, 1, 0, 0, 20, 40), _move(1, 0, 20, 20, 20, 40),
                                                    _move(0, 1, 0, 0, 0, 40)]) is True
    assert (r0.round_trips - t0, r1.round_trips - t1) == (1, 1)
    np.testing.assert_array_equal(_read(r0, h[0], 40), np.concatenate([a[:20], b[20:]]))
    np.testing.assert_array_equal(_read(r1, h[1], 40), np.concatenate([a[:20], b[20:]]))


def test_reduce_batch_combines_a_whole_step(pair):
    pytest.importorskip("tgc.engine.multi", reason="the multi-device engine is not in this tree")
    from tgc.backends.remote.client import RemoteDevice
    from tgc.dtype import dtypes
    r0, r1 = pair
    x, y = np.arange(10, dtype=np.float32), np.arange(10, dtype=np.float32) * 10
    h = [_buffer(r0, x.view(np.uint8)), _buffer(r1, y.view(np.uint8))]
    t0, t1 = r0.round_trips, r1.round_trips
    # device 0 sends elements 0..4 to device 1, device 1 sends 5..9 to device 0 (a 2-device reduce-scatter step)
    assert RemoteDevice.reduce_batch([r0, r1], h, [_move(0, 1, 0, 0, 20, 40), _move(1, 0, 20, 20, 20, 40)], "sum",
                                     dtypes.f32) is True
    assert (r0.round_trips - t0, r1.round_trips - t1) == (1, 1)
    got0, got1 = _read(r0, h[0], 40).view(np.float32), _read(r1, h[1], 40).view(np.float32)
    np.testing.assert_array_equal(got0[5:], (x + y)[5:])
    np.testing.assert_array_equal(got0[:5], x[:5])
    np.testing.assert_array_equal(got1[:5], (x + y)[:5])


def test_allocator_transfer_between_servers(pair):
    r0, r1 = pair
    a = np.arange(300, dtype=np.uint8)
    ha, hb = _buffer(r0, a), _buffer(r1, np.zeros(300, np.uint8))
    t0 = r0.round_trips
    r0.allocator.transfer(hb, ha, 300, r0, r1)
    assert r0.round_trips - t0 == 1  # one read; the write goes with r1's next request
    np.testing.assert_array_equal(_read(r1, hb, 300), a)


def test_ranges_past_a_buffer_are_refused(pair):
    from tgc.backends.remote.client import RemoteDevice
    r0, r1 = pair
    ha, hb = _buffer(r0, np.zeros(100, np.uint8)), _buffer(r1, np.zeros(50, np.uint8))
    with pytest.raises(DeviceError, match="source range of 10 bytes at offset 95 runs past buffer"):
        RemoteDevice.copy_batch([(r0, ha, 95, r1, hb, 0, 10)])
    with pytest.raises(DeviceError, match="destination range of 10 bytes at offset 41 runs past buffer"):
        RemoteDevice.copy_batch([(r0, ha, 0, r1, hb, 41, 10)])
    with pytest.raises(DeviceError, match="has no buffer 999"):
        RemoteDevice.copy_batch([(r0, 999, 0, r1, hb, 0, 1)])
    with pytest.raises(DeviceError, match="between REMOTE devices"):
        RemoteDevice.copy_batch([(r0, ha, 0, "CPU", 0, 0, 1)])
    # a client that skips those checks: the server refuses, naming the range
    r0._queue.append(P.ReadRange(buf=ha, offset=60, size=41))
    with pytest.raises(DeviceError, match=r"ReadRange\): a range of 41 bytes at offset 60 runs past buffer"):
        r0.flush()
    r1._enqueue(P.WriteRange(buf=hb, offset=45, datahash=""), b"123456")
    with pytest.raises(DeviceError, match=r"WriteRange\): a range of 6 bytes at offset 45 runs past buffer"):
        r1.flush()
    with pytest.raises(P.ProtocolError, match="offset must be >= 0"):
        P.parse_text("[ReadRange(buf=1, offset=-1, size=4)]")
    np.testing.assert_array_equal(_read(r1, hb, 50), np.zeros(50, np.uint8))  # nothing was written


def test_a_hostile_client_cannot_read_more_than_a_body_per_batch():
    """Ranges read in one batch are bounded by the body limit, however many requests name them."""
    from tgc.backends.remote.server import Limits, serve
    srv = serve("127.0.0.1", 0, "CPU", None, Limits(max_body=1 << 16)).start()
    try:
        from tgc.backends.remote.client import RemoteDevice
        dev = RemoteDevice(address=f"127.0.0.1:{srv.port}", retry=0.0, timeout=30.0)
        h = dev.allocator.alloc(40000)
        dev._queue += [P.ReadRange(buf=h, offset=i, size=30000) for i in range(3)]
        with pytest.raises(DeviceError, match="ranges read in one batch pass the body limit of 65536"):
            dev.flush()
        assert len(dev.read_range(h, 100, 30000)) == 30000  # one such range is fine
        dev.close()
    finally:
        srv.shutdown()


# --- a server that dies


def test_a_server_killed_mid_transfer_is_one_clear_error(servers, monkeypatch):
    """The server stops (SIGSTOP) with a copy's request in flight, then is killed: the copy fails at once with
    the server's address (the connection is lost), not after the answer timeout."""
    from tgc.backends import get_device
    from tgc.backends.remote.client import RemoteDevice
    with ServerProcess("CPU") as victim:
        monkeypatch.setenv("TGC_REMOTE", f"{servers[0].address},{victim.address}")
        monkeypatch.setenv("TGC_REMOTE_TIMEOUT", "600")  # a hang would show as a hung test, not a pass
        monkeypatch.setenv("TGC_REMOTE_RETRY", "0.2")
        for name in ("TGC_REMOTE_TOKEN", "TGC_REMOTE_TOKEN_FILE"):
            monkeypatch.delenv(name, raising=False)
        _drop_remote_instances()
        r0, r1 = get_device("REMOTE:0"), get_device("REMOTE:1")
        n = 8 << 20
        h0, h1 = _buffer(r0, np.ones(n, np.uint8)), _buffer(r1, np.zeros(n, np.uint8))
        r1.flush()
        victim.freeze()
        errors: list[BaseException] = []

        def copy() -> None:
            try:
                RemoteDevice.copy_batch([(r1, h1, 0, r0, h0, 0, n), (r0, h0, 0, r1, h1, 0, n)], wait=True)
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=copy, daemon=True)
        t.start()
        t.join(0.5)  # the request to the stopped server is sent and waits for an answer
        victim.proc.kill()
        victim.proc.wait()
        t.join(60)
        assert not t.is_alive(), "the copy hung after its server died"
        assert len(errors) == 1 and isinstance(errors[0], DeviceError), errors
        msg = errors[0].msg
        assert victim.address in msg and ("lost the connection" in msg or "cannot reach" in msg), msg
        assert "no answer within" not in msg
        _drop_remote_instances()


def test_cli_run_on_a_dead_server_exits_1_with_one_line(servers, tmp_path):
    import socket
    with socket.socket() as s:  # a port nobody listens on: a server that has died
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    prog = tmp_path / "p.tg"
    prog.write_text("x: f32[N]\nreturn x + 1\n")
    env = {**os.environ, "TGC_REMOTE": f"{servers[0].address},{dead}", "TGC_REMOTE_RETRY": "0.2"}
    r = subprocess.run([sys.executable, "-m", "tgc.cli.main", "run", str(prog), "-d", "REMOTE:1",
                        "--random", "-D", "N=4"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1, r.stderr
    assert f"cannot reach REMOTE server {dead}" in r.stderr and "Traceback" not in r.stderr
    assert len([line for line in r.stderr.splitlines() if line.startswith("error")]) == 1, r.stderr


def test_a_stopped_server_times_out_instead_of_hanging(servers, monkeypatch):
    """A server that stops answering (SIGSTOP: the connection stays open) is one error after TGC_REMOTE_TIMEOUT."""
    from tgc.backends import get_device
    with ServerProcess("CPU") as frozen:
        monkeypatch.setenv("TGC_REMOTE", f"{servers[0].address},{frozen.address}")
        monkeypatch.setenv("TGC_REMOTE_TIMEOUT", "1")
        for name in ("TGC_REMOTE_TOKEN", "TGC_REMOTE_TOKEN_FILE"):
            monkeypatch.delenv(name, raising=False)
        _drop_remote_instances()
        r1 = get_device("REMOTE:1")
        conn = r1._connection()
        assert conn.timeout == 1.0  # TGC_REMOTE_TIMEOUT's
        conn.set_timeout(60.0)  # the setup's answers may be slow on a busy machine
        h = _buffer(r1, np.ones(64, np.uint8))
        r1.flush()
        conn.set_timeout(1.0)
        frozen.freeze()  # every thread stopped (a bare SIGSTOP left a thread that still answered, under load)
        try:
            with pytest.raises(DeviceError, match=f"lost the connection to REMOTE server {frozen.address}: no answer "
                                                  "within 1s") as e:
                r1.read_range(h, 0, 64)
            assert e.value.exit_code == 1
        finally:
            frozen.thaw()
            _drop_remote_instances()


def test_a_connection_that_is_never_accepted_times_out(monkeypatch):
    """A host that drops the connection attempt (here: a listener whose backlog is full) is an error after the
    connect timeout, not after the answer timeout."""
    import socket

    from tgc.backends.remote import client as C
    monkeypatch.setattr(C, "CONNECT_TIMEOUT", 0.5)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        try:
            for _ in range(8):  # fill the accept queue: later attempts are dropped, so they hang in connect
                s = socket.socket()
                s.settimeout(0.2)
                try:
                    s.connect(("127.0.0.1", port))
                except OSError:
                    s.close()
                    break
                fillers.append(s)
            dev = C.RemoteDevice(address=f"127.0.0.1:{port}", token="", timeout=600.0, retry=0.0)
            with pytest.raises(DeviceError, match=f"cannot reach REMOTE server 127.0.0.1:{port}: timed out"):
                dev.properties  # noqa: B018
        finally:
            for s in fillers:
                s.close()


@pytest.mark.parametrize("how", ["whole buffer", "view"])
def test_ranges_on_devices_without_host_arrays(monkeypatch, how):
    """Where the served device's buffers are not host arrays, a range goes through an `allocator.offset` view, or
    (without views) a read of the whole buffer (and for a write, a rewrite of it)."""
    from tgc.backends.remote import server as S
    from tgc.backends.remote.client import RemoteDevice
    srv = S.serve("127.0.0.1", 0, "CPU", None).start()
    try:
        monkeypatch.setattr(S, "_is_host_array", lambda handle: False)
        alloc = srv.allocator  # (the CPU's: the server's shared arena)
        if how == "view":
            views = []
            monkeypatch.setattr(alloc, "offset", lambda h, n, o: views.append((n, o)) or h[o:o + n], raising=False)
            monkeypatch.setattr(alloc, "features", dataclasses.replace(alloc.features, offsets=True), raising=False)
        dev = RemoteDevice(address=f"127.0.0.1:{srv.port}", retry=0.0, timeout=30.0)
        a = np.arange(200, dtype=np.uint8)
        h = _buffer(dev, a)
        assert dev.read_range(h, 50, 20) == bytes(a[50:70])
        dev.write_range(h, 190, b"\xff" * 10)
        want = a.copy()
        want[190:] = 255
        np.testing.assert_array_equal(_read(dev, h, 200), want)
        if how == "view":
            assert views == [(20, 50), (10, 190)]
        dev.close()
    finally:
        srv.shutdown()


def test_raw_range_requests_are_checked(monkeypatch):
    """What a client that skips the client's checks gets: 404 for a buffer not in its session, 400 past the end,
    400 for a negative offset (the request text does not parse into a request)."""
    import http.client

    from tgc.backends.remote.server import serve
    srv = serve("127.0.0.1", 0, "CPU", None).start()

    def post(*reqs: P.Request, blobs: dict | None = None) -> tuple[int, str | None, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        try:
            conn.request("POST", "/batch", P.encode_requests(list(reqs), blobs or {}),
                         {P.SESSION_HEADER: "raw-range-session-0123"})
            resp = conn.getresponse()
            return resp.status, resp.getheader(P.ERROR_HEADER), resp.read()
        finally:
            conn.close()

    try:
        assert post(P.BufferAlloc(buf=1, size=16))[0] == 200
        status, kind, body = post(P.ReadRange(buf=2, offset=0, size=1))
        assert (status, kind) == (404, "session") and b"no buffer 2" in body
        status, kind, body = post(P.ReadRange(buf=1, offset=8, size=9))
        assert (status, kind) == (400, "protocol") and b"runs past buffer 1 of 16 bytes" in body
        data = b"x" * 17
        status, kind, body = post(P.WriteRange(buf=1, offset=0, datahash=P.digest(data)), blobs={P.digest(data): data})
        assert (status, kind) == (400, "protocol") and b"a range of 17 bytes at offset 0" in body
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.request("POST", "/batch", P.encode_body({}, "[ReadRange(buf=1, offset=-4, size=4)]"),
                     {P.SESSION_HEADER: "raw-range-session-0123"})
        resp = conn.getresponse()
        assert resp.status == 400 and b"offset must be >= 0" in resp.read()
        conn.close()
        status, kind, body = post(P.BufferAlloc(buf=3, size=8), P.CopyRange(buf=1, offset=0, dest_buf=3,
                                                                              dest_offset=4, size=5))
        assert (status, kind) == (400, "protocol") and b"a range of 5 bytes at offset 4 runs past buffer 3" in body
        status, kind, body = post(P.CopyRange(buf=1, offset=0, dest_buf=9, dest_offset=0, size=1))
        assert (status, kind) == (404, "session")
        status, _, body = post(P.ReadRange(buf=1, offset=4, size=4))
        results, blobs = P.decode_results(body)
        assert status == 200 and bytes(blobs[results[0]]) == bytes(4)
    finally:
        srv.shutdown()


# --- programs sharded across the two servers (needs the multi-device engine)

REDUCTIONS = [  # source, input shapes, shard
    ("x: f32[N, D]\nreturn sum(x, axis=0)\n", {"x": (37, 300)}, {"x": 0}),
    ("x: f32[N, D]\nreturn x.max(axis=0), x.min(axis=0)\n", {"x": (21, 17)}, {"x": 0}),
    ("x: f32[N, D]\nreturn sum(x * x, axis=1), x.max()\n", {"x": (11, 40)}, {"x": 1}),
    ("x: i32[N]\nreturn sum(x), x.max()\n", {"x": (1001,)}, {"x": 0}),
    ("a: f32[M, K]\nb: f32[K, N]\nreturn a @ b\n", {"a": (6, 33), "b": (33, 5)}, {"a": 1, "b": 0}),
    ("x: f32[N, D]\nm = x.max(axis=1, keepdim=True)\ne = exp(x - m)\nreturn e / sum(e, axis=1, keepdim=True)\n",
     {"x": (9, 31)}, {"x": 0}),
]


@pytest.mark.parametrize("src, shapes, shard", REDUCTIONS)
def test_reductions_sharded_across_two_servers(pair, src, shapes, shard):
    pytest.importorskip("tgc.engine.multi", reason="the multi-device engine is not in this tree")
    import tgc
    rng = np.random.default_rng(5)
    prog = tgc.loads(src)
    inputs = {}
    for decl in prog.inputs:
        dt = decl.dtype.np
        size = shapes[decl.name]
        inputs[decl.name] = (rng.integers(-50, 50, size=size) if np.issubdtype(dt, np.integer)
                             else rng.standard_normal(size)).astype(dt)
    want = prog.run(device="CPU", **inputs)
    got = prog.run(device="REMOTE:0,REMOTE:1", shard=shard, **inputs)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)


def test_a_server_dying_mid_run_is_one_error_exit_1(servers, tmp_path):
    """`tgc run` sharded on REMOTE:0,REMOTE:1 whose second server is stopped and then killed while the run waits
    on it: exit 1, one error line naming the server, no traceback, no hang."""
    pytest.importorskip("tgc.engine.multi", reason="the multi-device engine is not in this tree")
    prog = tmp_path / "p.tg"
    prog.write_text("x: f32[N, D]\nreturn sum(x, axis=0)\n")
    with ServerProcess("CPU") as victim:
        env = {**os.environ, "TGC_REMOTE": f"{servers[0].address},{victim.address}", "TGC_REMOTE_TIMEOUT": "600",
               "TGC_REMOTE_RETRY": "0.2"}
        cmd = [sys.executable, "-m", "tgc.cli.main", "run", str(prog), "-d", "REMOTE:0,REMOTE:1", "--shard", "x=0",
               "--random", "-D", "N=64", "-D", "D=1000"]
        ok = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        assert ok.returncode == 0, ok.stderr
        victim.freeze()
        run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            run.wait(2.0)  # it cannot finish: the stopped server never answers
        except subprocess.TimeoutExpired:
            pass
        victim.proc.kill()
        victim.proc.wait()
        _, err = run.communicate(timeout=60)
    assert run.returncode == 1, err
    assert victim.address in err and "Traceback" not in err and "internal error" not in err
    assert len([line for line in err.splitlines() if line.startswith("error")]) == 1, err


def test_a_remote_package_runs_on_a_server_that_did_not_compile_it(pair, tmp_path):
    # a server loads only binaries it compiled: a package from REMOTE:1 run on REMOTE:0 (or on a restarted
    # server) was refused ("this server did not compile that binary"); the server now compiles its source
    import tgc
    from tgc.package import write
    prog = tgc.loads("x: f32[N, D]\nreturn exp(x - x.max(axis=1, keepdim=True))\n")
    path = tmp_path / "r.tgpkg"
    write(prog, path, "REMOTE:1", {"N": 4, "D": 8})
    x = np.arange(32, dtype=np.float32).reshape(4, 8) / 7
    want = np.exp(x - x.max(axis=1, keepdims=True))
    for dev in ("REMOTE:0", "REMOTE:1"):
        np.testing.assert_allclose(tgc.load_package(path).run(device=dev, x=x)["out0"], want, rtol=1e-6)
