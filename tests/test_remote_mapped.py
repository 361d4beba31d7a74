"""The REMOTE server of an OpenCL device receives a large copy in straight into a mapped device buffer that the CopyIn
then adopts (`staging.MappedBlock`), and a client's keep-alive connection carries every round trip."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.test_remote_ahead import _opencl_ready
from tests.test_remote_datapath import _post, needs_cpu
from tests.test_remote_stream import _raw_post
from tgc.backends.remote import protocol as P
from tgc.backends.remote import staging
from tgc.backends.remote.client import RemoteDevice
from tgc.backends.remote.server import serve
from tgc.backends.remote.staging import MappedBlock

N = staging.MAP_MIN  # (the smallest blob received into a mapped buffer)
needs_opencl = pytest.mark.skipif(not _opencl_ready(), reason="no OpenCL here")


@pytest.fixture(scope="module")
def cl_server():
    srv = serve("127.0.0.1", 0, "OPENCL", None).start()
    yield srv
    srv.shutdown()


def _floats(seed: int, n: int = N // 4) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def _unstaged(srv) -> bool:
    """Whether every staged block is back (the server gives them back after answering)."""
    deadline = time.monotonic() + 10
    while srv._staged_bytes and time.monotonic() < deadline:
        time.sleep(0.01)
    return srv._staged_bytes == 0


def _session(srv, sid: str = "datapath-session-0123456789"):
    return srv.sessions[sid]


@needs_opencl
def test_a_copy_in_lands_in_the_mapped_opencl_buffer_it_becomes_and_matches_numpy(cl_server):
    srv = cl_server
    x, y = _floats(1), _floats(2)
    hx, hy = P.blob_id(x.tobytes()), P.blob_id(y.tobytes())
    status, body = _post(srv, P.BufferAlloc(buf=1, size=N), P.CopyIn(buf=1, datahash=hx), blobs={hx: x.tobytes()})
    assert status == 200, body
    buf = _session(srv).buffers[1]
    # (the blob was received into a mapped buffer of the server, which became buffer 1; the one it replaced is kept)
    assert _unstaged(srv) and [type(b) for b in srv._stage_pool.get(N, [])] == [MappedBlock]
    first, kept = buf.handle, srv._stage_pool[N][0].buffer
    status, body = _post(srv, P.CopyIn(buf=1, datahash=hy), P.CopyOut(buf=1), blobs={hy: y.tobytes()})
    assert status == 200, body
    results, blobs = P.decode_results(body, verify=False)
    np.testing.assert_array_equal(np.frombuffer(blobs[results[1]], np.float32), y)
    assert _unstaged(srv)  # (the staged block goes back to the pool after the answer)
    assert buf.handle is kept and srv._stage_pool[N][0].buffer is first  # the two buffers traded places
    out = np.empty_like(y)
    srv.device.allocator.copyout(memoryview(out).cast("B"), buf.handle)  # the device's own view of the buffer
    np.testing.assert_array_equal(out, y)


@needs_opencl
def test_a_blob_named_twice_is_copied_into_both_opencl_buffers(cl_server):
    srv = cl_server
    x = _floats(3)
    h = P.blob_id(x.tobytes())
    status, body = _post(srv, P.BufferAlloc(buf=11, size=N), P.BufferAlloc(buf=12, size=N),
                         P.CopyIn(buf=11, datahash=h), P.CopyIn(buf=12, datahash=h), P.CopyOut(buf=11),
                         P.CopyOut(buf=12), blobs={h: x.tobytes()})
    assert status == 200, body
    results, blobs = P.decode_results(body, verify=False)
    for r in results[4:]:
        np.testing.assert_array_equal(np.frombuffer(blobs[r], np.float32), x)
    assert _unstaged(srv)


@needs_opencl
def test_a_truncated_copy_in_to_an_opencl_server_is_refused_and_leaves_the_buffer_as_it_was(cl_server):
    srv = cl_server
    x = _floats(4)
    h = P.blob_id(x.tobytes())
    assert _post(srv, P.BufferAlloc(buf=21, size=N), P.CopyIn(buf=21, datahash=h), blobs={h: x.tobytes()})[0] == 200
    junk = np.full(N, 0xEE, np.uint8).tobytes()
    body = P.encode_requests([P.CopyIn(buf=21, datahash=P.blob_id(junk))], {P.blob_id(junk): junk})
    cut = body[:8 + 40 + N // 2]
    assert _raw_post(srv.port, cut, declared=len(body), session="datapath-session-0123456789") == b""  # no answer
    status, answer = _post(srv, P.CopyOut(buf=21), blobs={})
    assert status == 200, answer
    results, blobs = P.decode_results(answer, verify=False)
    np.testing.assert_array_equal(np.frombuffer(blobs[results[0]], np.float32), x)
    assert _unstaged(srv)


@needs_opencl
def test_a_program_over_remote_opencl_reads_inputs_received_into_mapped_buffers(cl_server, monkeypatch):
    import tgc
    from tests.test_remote_datapath import _drop_remote_instances, _use_server_without_token
    _use_server_without_token(monkeypatch, cl_server.port)
    try:
        prog = tgc.loads("x: f32[N]\ny: f32[N]\nreturn x * 2 + y\n")
        for seed in (5, 6):  # the second run's inputs land in the buffers the first run's replaced
            x, y = _floats(seed), _floats(seed + 10)
            np.testing.assert_allclose(prog.run(device="REMOTE", x=x, y=y)["out0"], x * 2 + y, rtol=1e-6)
    finally:
        _drop_remote_instances()


@needs_cpu
def test_a_keep_alive_connection_carries_every_round_trip():
    """Many round trips (queued copies, copies sent ahead, copies out) over one accepted connection."""
    accepted = []
    srv = serve("127.0.0.1", 0, "CPU", None)
    verify = srv.httpd.verify_request
    srv.httpd.verify_request = lambda request, address: accepted.append(address) or verify(request, address)
    srv.start()
    dev = RemoteDevice(address=f"127.0.0.1:{srv.port}", token="", timeout=30.0, retry=0.0)
    try:
        for n in (64, N, 2 << 20):  # a queued copy, a streamed one, one sent ahead
            data = np.arange(n, dtype=np.uint8)
            handle = dev.allocator.alloc(n)
            for _ in range(3):
                dev.allocator.copyin(handle, memoryview(data))
                out = np.empty_like(data)
                dev.allocator.copyout(memoryview(out), handle)
                np.testing.assert_array_equal(out, data)
        assert dev.round_trips >= 9 and len(accepted) == 1 and len(srv.conns) == 1
    finally:
        dev.close()
        srv.shutdown()


@needs_opencl
def test_an_opencl_copy_out_is_sent_from_a_mapping_as_of_its_place_in_the_batch(cl_server, monkeypatch):
    """A copy out that no later request of its batch can change is sent from the buffer mapped for reading (then
    unmapped: the next batch writes the buffer); one followed by a write is copied as before."""
    from tgc.backends.remote import server as S
    srv, mapped = cl_server, []
    monkeypatch.setattr(S, "map_for_reading", lambda *a: mapped.append(a[2]) or staging.map_for_reading(*a))
    x, y = _floats(7), _floats(8)
    hx, hy = P.blob_id(x.tobytes()), P.blob_id(y.tobytes())
    status, body = _post(srv, P.BufferAlloc(buf=31, size=N), P.CopyIn(buf=31, datahash=hx), P.CopyOut(buf=31),
                         blobs={hx: x.tobytes()})
    assert status == 200 and mapped == [N], body
    results, blobs = P.decode_results(body, verify=False)
    np.testing.assert_array_equal(np.frombuffer(blobs[results[2]], np.float32), x)
    status, body = _post(srv, P.CopyOut(buf=31), P.CopyIn(buf=31, datahash=hy), P.CopyOut(buf=31),
                         blobs={hy: y.tobytes()})
    assert status == 200 and mapped == [N, N], body  # (only the last copy out was mapped)
    results, blobs = P.decode_results(body, verify=False)
    np.testing.assert_array_equal(np.frombuffer(blobs[results[0]], np.float32), x)
    np.testing.assert_array_equal(np.frombuffer(blobs[results[2]], np.float32), y)
    session = _session(srv)
    with session.lock:  # (the answer is sent with the lock held; the mappings are released before it is let go)
        assert not session.maps
