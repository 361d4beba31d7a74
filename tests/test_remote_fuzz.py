"""Fuzz a `tgc serve` subprocess with malformed requests while a well-behaved client runs beside them.

Every malformed request must get a 4xx answer, and the good client must keep getting correct results.
"""

from __future__ import annotations

import http.client
import importlib.util
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tgc.backends.remote import protocol as P
from tgc.backends.remote.process import ServerProcess


def _cpu_ready() -> bool:
    if importlib.util.find_spec("tgc.backends.cpu") is None or importlib.util.find_spec("tgc.api") is None:
        return False
    from tgc.backends import device_class
    return device_class("CPU").probe()[0]


pytestmark = pytest.mark.skipif(not _cpu_ready(), reason="the CPU device is not available yet")

TOKEN = "fuzz-token-" + "7" * 24
SESSION = "fuzz-session-0123456789"
LAUNCH_SESSION = "fuzz-launches-0123456789"  # holds a real program and buffers (the other session holds nothing)
DATA = b"0123456789"
VALID = P.encode_requests([P.CopyIn(buf=1, datahash=P.digest(DATA))], {P.digest(DATA): DATA})
HEADER = 48  # magic, count, one blob header

DANGEROUS = [
    "[__import__('os').system('touch /tmp/tgc-fuzz-pwned')]", "[os.system('true')]", "[os.environ]",
    "[eval('1')]", "[exec('import os')]", "[compile('1', 'x', 'eval')]", "[open('/etc/passwd')]",
    "[getattr(BufferAlloc, '__init__')]", "[BufferAlloc.__init__]", "[().__class__.__bases__[0].__subclasses__()]",
    "[BufferAlloc(buf=1, size=1).__class__]", "[CopyOut.__globals__]", "[math.__dict__]", "[globals()]",
    "[__builtins__]", "[lambda: 0]", "[(yield)]", "[x := 1]", "[f'{1}']", "[b'\\x00']", "[1 + 1]", "[not 1]",
    "[BufferAlloc(buf=1, size=2**40)]", "[BufferAlloc(1, 2)]", "[BufferAlloc(buf=-1, size=10)]",
    "[BufferAlloc(buf=1, size=10**30)]", "[CopyIn(buf=1, datahash='..' * 32)]", "[ProgramExec(prog=1, bufs=[1, 'a'])]",
    "[ProgramExec(prog=1, bufs=(), global_size=(0,))]", "[GraphAlloc(graph=1, kernels=[1])]", "[Nope()]",
    "[BufferAlloc(buf=1, size=1, **{})]", "BufferFree(buf=1)", "{}", "None", "", "[", "]]", "\x00", "[1] # \x00",
]

missing = st.one_of(  # well-formed requests that name objects the fuzz session never made
    st.builds(P.BufferFree, buf=st.integers(0, 10**6)),
    st.builds(P.CopyOut, buf=st.integers(0, 10**6)),
    st.builds(P.CopyIn, buf=st.integers(0, 10**6), datahash=st.binary(max_size=8).map(P.digest)),
    st.builds(P.BufferOffset, buf=st.integers(0, 99), size=st.integers(0, 99), offset=st.integers(0, 99),
              sub=st.integers(0, 99)),
    st.builds(P.Transfer, buf=st.integers(0, 99), dest_session=st.just("x" * 20), dest_buf=st.integers(0, 99)),
    st.builds(P.ProgramFree, prog=st.integers(0, 99)),
    st.builds(P.ProgramExec, prog=st.integers(0, 99), bufs=st.lists(st.integers(0, 99), max_size=3).map(tuple)),
    st.builds(P.GraphExec, graph=st.integers(0, 99), wait=st.booleans()),
    st.builds(P.GraphFree, graph=st.integers(0, 99)),
)


def _flip(body: bytes, index: int, bit: int) -> bytes:
    out = bytearray(body)
    out[index] ^= 1 << bit
    return bytes(out)


def _long_length(n: int) -> bytes:
    out = bytearray(VALID)
    out[40:48] = n.to_bytes(8, "big")
    return bytes(out)


def _program(lib: bytes) -> bytes:
    """A body that loads `lib` as a kernel binary (a garbage one: loading must fail with 4xx)."""
    return P.encode_requests([P.ProgramAlloc(prog=1, name="k", datahash=P.digest(lib))], {P.digest(lib): lib})


def _is_batch(text: str) -> bool:
    try:
        P.decode_requests(P.encode_body({}, text))
        return True
    except P.ProtocolError:
        return False


def _case(body: bytes, **kw) -> dict:
    return {"body": body, "method": "POST", "path": "/batch", "token": TOKEN, "session": SESSION, "want": None,
            "may_run": False, "big": False, **kw}


sizes = st.lists(st.integers(1, 2**31 - 1) | st.integers(1, 64), min_size=1, max_size=3).map(tuple)
launches = st.builds(  # launches of the launch session's real program 1 (buffers 1 and 2 fit it): any shape
    P.ProgramExec, prog=st.just(1), bufs=st.lists(st.integers(1, 4), max_size=4).map(tuple), global_size=sizes,
    local_size=st.none() | sizes, vals=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3).map(tuple),
    wait=st.booleans())
graphs = st.lists(st.builds(P.GraphKernel, prog=st.just(1), bufs=st.lists(st.integers(1, 4), max_size=3).map(tuple),
                            global_size=sizes), min_size=1, max_size=3).map(
    lambda ks: P.GraphAlloc(graph=1, kernels=tuple(ks)))


cases = st.one_of(
    st.binary(max_size=3000).map(_case),
    st.binary(max_size=300).map(lambda b: _case(P.MAGIC + b)),
    st.integers(1, len(VALID) - 1).map(lambda n: _case(VALID[:n])),
    st.tuples(st.integers(8, 39), st.integers(0, 7)).map(lambda t: _case(_flip(VALID, *t))),
    st.tuples(st.integers(HEADER, HEADER + len(DATA) - 1), st.integers(0, 7)).map(lambda t: _case(_flip(VALID, *t))),
    st.integers(len(DATA) + 1, 2**64 - 1).map(lambda n: _case(_long_length(n))),
    st.integers(2**16 + 1, 2**32 - 1).map(lambda n: _case(P.MAGIC + n.to_bytes(4, "big"))),
    st.sampled_from(DANGEROUS).map(lambda t: _case(P.encode_body({}, t))),
    st.tuples(st.integers(P.MAX_DEPTH + 1, 3000), st.sampled_from(["[", "{'a': ", "[("])).map(
        lambda t: _case(P.encode_body({}, t[1] * t[0] + "1" + "".join({"[": "]", "{'a': ": "}", "[(": ")]"}[t[1]]
                                                                        for _ in range(t[0]))))),
    st.text(max_size=300).filter(lambda t: not _is_batch(t)).map(lambda t: _case(P.encode_body({}, t))),
    st.lists(missing, min_size=1, max_size=4).map(lambda reqs: _case(P.encode_requests(reqs, {}))),
    st.binary(max_size=500).map(lambda b: _case(_program(b"\x7fELF" + b))),
    st.sampled_from([None, "", "wrong", TOKEN + "x", TOKEN.upper(), TOKEN[:-1]]).map(
        lambda t: _case(VALID, token=t, want=401)),
    st.text(max_size=40).filter(lambda s: not P.valid_session(s) and s.isprintable() and s.strip() == s and s.isascii())
    .map(lambda s: _case(VALID, session=s or None, want=400)),
    st.sampled_from(["GET", "PUT", "DELETE", "PATCH"]).map(lambda m: _case(b"", method=m, want=405)),
    st.lists(launches | graphs, min_size=1, max_size=3).map(lambda reqs: _case(P.encode_requests(reqs, {}),
                                                                               may_run=True, session=LAUNCH_SESSION)),
    st.integers(P.MAX_NODES + 1, 2 * P.MAX_NODES).map(  # oversized request lists: refused before parsing
        lambda n: _case(P.encode_body({}, "[" + "BufferFree(buf=1)," * n + "]"), want=400, big=True)),
    st.text("abc/._-", max_size=20).filter(lambda p: p != "batch").map(lambda p: _case(VALID, path="/" + p, want=404)),
)


def _send(port: int, case: dict) -> tuple[int, bytes]:
    headers = {}
    if case["token"] is not None:
        headers["Authorization"] = f"Bearer {case['token']}"
    if case["session"] is not None:
        headers[P.SESSION_HEADER] = case["session"]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(case["method"], case["path"], case["body"], headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_fuzzed_requests_get_4xx_and_a_good_client_keeps_getting_correct_results(monkeypatch, tmp_path):
    import tgc
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    with ServerProcess("CPU", "--token-file", str(token_file)) as srv:
        monkeypatch.setenv("TGC_REMOTE", srv.address)
        monkeypatch.setenv("TGC_REMOTE_TOKEN", TOKEN)
        from tgc import backends
        backends._instances.pop(("REMOTE", 0), None)
        prog = tgc.loads("x: f32[N, D]\nm = x.max(axis=1, keepdim=True)\ne = exp(x - m)\n"
                         "return e / sum(e, axis=1, keepdim=True), x.sum(axis=0)\n")
        stop, runs, errors = threading.Event(), [0], []

        def good_client() -> None:
            rng = np.random.default_rng(0)
            while not stop.is_set():
                x = rng.standard_normal((int(rng.integers(1, 20)), int(rng.integers(1, 50)))).astype(np.float32)
                try:
                    got, want = prog.run(device="REMOTE", x=x), prog.reference(x=x)
                    for name in want:
                        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
                except Exception as e:  # collected and reported by the main thread
                    errors.append(e)
                    return
                runs[0] += 1

        answers: dict[int, int] = {}

        # the launch session's program 1 (x + 1 over 64 floats, compiled by the server) and buffers 1 and 2
        from tgc.backends import get_device
        from tgc.codegen.kernel import build_kernel
        (item,) = tgc.loads("x: f32[N]\nreturn x + 1\n").schedule({"N": 64})
        k = build_kernel(item, get_device("CPU"))
        compiled = _send(srv.port, _case(P.encode_requests([P.Compile(src=k.src)], {}), session=LAUNCH_SESSION))
        assert compiled[0] == 200
        (h,), libs = P.decode_results(compiled[1])
        setup = [P.ProgramAlloc(prog=1, name=k.name, datahash=h), P.BufferAlloc(buf=1, size=256),
                 P.BufferAlloc(buf=2, size=256)]
        assert _send(srv.port, _case(P.encode_requests(setup, {h: bytes(libs[h])}), session=LAUNCH_SESSION))[0] == 200

        @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=cases)
        def check(case: dict) -> None:
            assume(len(case["body"]) < 1 << 20 or case["big"])
            status, body = _send(srv.port, case)
            answers[status] = answers.get(status, 0) + 1
            if case["may_run"] and status == 200:
                return
            assert 400 <= status < 500, (status, body[:300])
            if case["want"] is not None:
                assert status == case["want"], (status, body[:300])
            assert body.strip(), "every refusal says why"
            assert srv.proc.poll() is None, "the server died"

        thread = threading.Thread(target=good_client)
        thread.start()
        try:
            check()
        finally:
            stop.set()
            thread.join(120)
        assert not errors, errors[0]
        assert runs[0] > 0
        assert {400, 401, 404} <= set(answers)
        # after the storm: still alive, still right
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_allclose(prog.run(device="REMOTE", x=x)["out1"], x.sum(axis=0))
        assert srv.proc.poll() is None
        backends._instances.pop(("REMOTE", 0)).close()
        assert srv.stop() == 0
    assert "Traceback" not in srv.stderr()
