"""The REMOTE wire format: blobs + request text, and the whitelist parser (no device, no network)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tgc.backends.remote import protocol as P

ints64 = st.integers(min_value=0, max_value=P.INT_MAX)
sizes = st.tuples(st.integers(1, 2**31 - 1)) | st.tuples(st.integers(1, 64), st.integers(1, 64), st.integers(1, 64))
hashes = st.binary(max_size=64).map(P.digest)
session_ids = st.text("abcXYZ019-_", min_size=16, max_size=40)
launch = dict(prog=ints64, bufs=st.lists(ints64, max_size=6).map(tuple), global_size=sizes,
              local_size=st.none() | sizes, vals=st.lists(st.integers(P.INT_MIN, P.INT_MAX), max_size=4).map(tuple))

requests = st.one_of(
    st.builds(P.GetProperties),
    st.builds(P.BufferAlloc, buf=ints64, size=ints64),
    st.builds(P.BufferFree, buf=st.integers(P.INT_MIN, P.INT_MAX)),
    st.builds(P.BufferOffset, buf=ints64, size=ints64, offset=ints64, sub=ints64),
    st.builds(P.CopyIn, buf=ints64, datahash=hashes),
    st.builds(P.CopyOut, buf=ints64),
    st.builds(P.Transfer, buf=ints64, dest_session=session_ids, dest_buf=ints64),
    st.builds(P.Compile, src=st.text()),
    st.builds(P.ProgramAlloc, prog=ints64, name=st.text(), datahash=hashes),
    st.builds(P.ProgramExec, wait=st.booleans(), **launch),
    st.builds(P.GraphAlloc, graph=ints64, kernels=st.lists(st.builds(P.GraphKernel, **launch), max_size=3).map(tuple)),
    st.builds(P.GraphExec, graph=ints64, wait=st.booleans()),
    st.builds(P.Synchronize),
    st.builds(P.EndSession),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(requests, max_size=8), st.lists(st.binary(max_size=300), max_size=4))
def test_requests_round_trip(reqs, datas):
    blobs = {P.digest(d): d for d in datas}
    got, got_blobs = P.decode_requests(P.encode_requests(reqs, blobs))
    assert got == reqs
    assert {h: bytes(v) for h, v in got_blobs.items()} == blobs


literals = st.recursive(
    st.none() | st.booleans() | st.integers(P.INT_MIN, P.INT_MAX) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(st.lists(literals, max_size=5))
def test_results_round_trip(values):
    got, _ = P.decode_results(P.encode_results(values, {}))
    assert got == values


def test_non_finite_floats_use_whitelisted_attributes():
    text = P.to_text([math.inf, -math.inf, math.nan])
    assert text == "[math.inf, -math.inf, math.nan]"
    pos, neg, nan = P.parse_text(text)
    assert pos == math.inf and neg == -math.inf and math.isnan(nan)


def test_body_layout_is_magic_count_then_blobs_then_text():
    body = P.encode_body({P.digest(b"abc"): b"abc"}, "[]")
    assert body[:4] == b"TGC1" and int.from_bytes(body[4:8], "big") == 1
    assert body[8:40] == bytes.fromhex(P.digest(b"abc"))
    assert int.from_bytes(body[40:48], "big") == 3 and body[48:51] == b"abc" and body[51:] == b"[]"


def test_duplicate_data_is_one_blob():
    # the client keys blobs by hash, so the same payload twice is sent once
    data = b"x" * 1000
    body = P.encode_requests([P.CopyIn(buf=1, datahash=P.digest(data)), P.CopyIn(buf=2, datahash=P.digest(data))],
                             {P.digest(data): data})
    assert body.count(data) == 1


@pytest.mark.parametrize("body, message", [
    (b"", "TGC1 header"),
    (b"XXXX\x00\x00\x00\x00[]", "TGC1 header"),
    (b"TGC1\x00\x00\x00\x01" + b"\x00" * 20, "header truncated"),
    (b"TGC1\xff\xff\xff\xff", "more than the limit"),
    (b"TGC1\x00\x00\x00\x00\xff\xfe", "not UTF-8"),
])
def test_malformed_bodies(body, message):
    with pytest.raises(P.ProtocolError, match=message):
        P.decode_requests(body)


def test_truncated_blob_and_wrong_hash_and_long_length():
    good = P.encode_body({P.digest(b"hello"): b"hello"}, "[]")
    with pytest.raises(P.ProtocolError, match="runs past the end"):
        P.decode_body(good[:50])
    wrong = bytearray(good)
    wrong[8] ^= 1
    with pytest.raises(P.ProtocolError, match="sha256 does not match"):
        P.decode_body(bytes(wrong))
    long = bytearray(good)
    long[40:48] = (10**12).to_bytes(8, "big")
    with pytest.raises(P.ProtocolError, match="runs past the end"):
        P.decode_body(bytes(long))


@pytest.mark.parametrize("text, message", [
    ("[__import__('os').system('true')]", r"call of '__import__\(...\).system' is not allowed"),
    ("[os.system('true')]", "call of 'os.system' is not allowed"),
    ("[os.environ]", "attribute 'os.environ' is not allowed"),
    ("[eval('1')]", "call of 'eval' is not allowed"),
    ("[exec('x = 1')]", "call of 'exec' is not allowed"),
    ("[open('/etc/passwd')]", "call of 'open' is not allowed"),
    ("[().__class__.__bases__]", "attribute .* is not allowed"),
    ("[BufferAlloc.__init__]", "attribute 'BufferAlloc.__init__' is not allowed"),
    ("[BufferAlloc(buf=1, size=1).__class__]", "attribute .*__class__' is not allowed"),
    ("[math.pi]", "attribute 'math.pi' is not allowed"),
    ("[x]", "name 'x' is not allowed"),
    ("[BufferAlloc]", "name 'BufferAlloc' is not allowed"),
    ("[lambda: 1]", "Lambda"),
    ("[i for i in range(3)]", "ListComp"),
    ("[1 + 1]", "BinOp"),
    ("[b'bytes']", "constant b'bytes' is not allowed|string prefixes"),
    ("[f'{[0, 0, 0]}']", "string prefixes"),
    ("[1j]", "constant 1j is not allowed"),
    ("[...]", "constant Ellipsis is not allowed"),
    ("[BufferAlloc(1, 2)]", "only keyword arguments"),
    ("[BufferAlloc(**{'buf': 1, 'size': 2})]", r"'\*\*' is not allowed"),
    ("[BufferAlloc(buf=1)]", "missing the field 'size'"),
    ("[BufferAlloc(buf=1, size=2, extra=3)]", "has no field 'extra'"),
    ("[BufferAlloc(buf=True, size=2)]", "expected an integer, got True"),
    ("[BufferAlloc(buf=1, size=2**70)]", "BinOp"),
    ("[BufferAlloc(buf=1, size=1180591620717411303424)]", "does not fit in 64 bits"),
    ("[BufferAlloc(buf=1, size=-5)]", "size must be >= 0"),
    ("[BufferAlloc(buf='1', size=2)]", "expected an integer"),
    ("[CopyIn(buf=1, datahash='../../etc/passwd')]", "64 lowercase hex"),
    ("[ProgramExec(prog=1, bufs=(1,), global_size=(0, 1, 1))]", "global_size"),
    ("[ProgramExec(prog=1, bufs=(1,), global_size=(1, 1, 1, 1))]", "global_size"),
    ("[Transfer(buf=1, dest_session='short', dest_buf=2)]", "not a session id"),
    ("[GraphAlloc(graph=1, kernels=(BufferFree(buf=1),))]", "expected a GraphKernel"),
    ("[-'x']", "unary minus"),
    ("[{**{}}]", r"'\*\*' is not allowed"),
    ("[1,", "does not parse"),
    ("\x00", "does not parse"),
    ("[" + "9" * 5000 + "]", "does not parse"),
    ("-" * 100_000 + "1", "does not parse|nested"),
])
def test_whitelist_rejects(text, message):
    with pytest.raises(P.ProtocolError, match=message):
        P.parse_text(text)


def test_only_lists_of_requests_are_batches():
    for text in ["0", "{}", "[GraphKernel(prog=1, bufs=())]", "[[BufferFree(buf=1)]]"]:
        with pytest.raises(P.ProtocolError, match="must be a list of requests"):
            P.decode_requests(P.encode_body({}, text))
    assert P.decode_requests(P.encode_body({}, "[BufferFree(buf=1)]"))[0] == [P.BufferFree(buf=1)]


@pytest.mark.parametrize("depth", [P.MAX_DEPTH + 1, 100, 199, 500, 100_000])
def test_deep_nesting_is_refused(depth):
    with pytest.raises(P.ProtocolError, match="nested|does not parse"):
        P.parse_text("[" * depth + "]" * depth)
    with pytest.raises(P.ProtocolError, match="nested|does not parse"):
        P.parse_text("{'a': " * depth + "1" + "}" * depth)


def test_nesting_up_to_the_limit_is_fine():
    assert P.parse_text("[" * P.MAX_DEPTH + "]" * P.MAX_DEPTH) is not None


def test_node_limit():
    text = "[" + ", ".join(["1"] * 1000) + "]"
    with pytest.raises(P.ProtocolError, match="more than 500 nodes"):
        P.parse_text(text, max_nodes=500)
    assert len(P.parse_text(text)) == 1000


def test_size_limits_apply_before_parsing(monkeypatch):
    """A long request list is refused before `ast.parse` sees it (a 40 MB list once took 19 GB to parse)."""
    parsed = []

    def parse(text: str) -> None:
        parsed.append(len(text))
        raise P.ProtocolError("parsed")
    monkeypatch.setattr(P, "_parse", parse)
    many = "[" + "0," * (P.MAX_NODES + 1) + "]"
    with pytest.raises(P.ProtocolError, match="more than .* nodes"):
        P.decode_requests(P.encode_body({}, many))
    with pytest.raises(P.ProtocolError, match="exceeds the limit"):
        P.decode_requests(P.encode_body({}, "[" + " " * 100 + "]"), max_text=50)
    with pytest.raises(P.ProtocolError, match="exceeds the limit"):  # bytes: refused before decoding
        P.decode_body(P.encode_body({}, "x" * 1000), max_text=100)
    assert parsed == []


def test_separators_inside_strings_do_not_count():
    src = "define void @k(ptr %a, ptr %b) { [(,,,)] }" * 50
    assert P.parse_text(to_text := P.to_text([P.Compile(src=src)]), max_nodes=20) == [P.Compile(src=src)]
    assert "'" in to_text


def test_parsing_never_runs_code(tmp_path):
    marker = tmp_path / "ran"
    for text in [f"[__import__('pathlib').Path({str(marker)!r}).touch()]",
                 f"[open({str(marker)!r}, 'w')]",
                 f"[BufferAlloc(buf=open({str(marker)!r}, 'w'), size=1)]"]:
        with pytest.raises(P.ProtocolError):
            P.parse_text(text)
    assert not marker.exists()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_parses_or_raises_protocol_error(text):
    try:
        P.parse_text(text)
    except P.ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_decode_or_raise_protocol_error(body):
    try:
        P.decode_requests(body)
    except P.ProtocolError:
        pass


def test_session_ids():
    assert P.valid_session("a" * 16) and P.valid_session("Az09-_" * 5)
    for bad in [None, "", "a" * 15, "a" * 129, "a" * 15 + "/", "a" * 16 + " ", "ä" * 16]:
        assert not P.valid_session(bad)
