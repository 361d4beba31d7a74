"""The REMOTE client against a hostile server: bounded reads, escaped text, checked properties, and clear
errors for bad token files. The "server" is a small HTTP server in a thread on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tgc.backends.remote import protocol as P
from tgc.backends.remote.client import RemoteDevice, client_token
from tgc.backends.remote.server import read_token
from tgc.errors import DeviceError, TgcError

GOOD = {"kind": "CPU", "device": "CPU", "launch_style": "cpu", "renderer": "LLVMRenderer", "compiler": "llvmlite",
        "compiler_version": "1", "compile_error": None, "info": {"cores": 2}, "offset": False, "attrs": {"cores": 2},
        "max_body": 1 << 20, "max_buffer": 1 << 20, "max_session_memory": 1 << 20, "request_time": 60.0,
        "idle_timeout": 300.0, "instance": "x"}


class FakeServer:
    """Answers every batch with `answer(requests) -> (status, headers, raw body)`; by default, `props` for
    GetProperties and None for everything else."""

    def __init__(self, props: dict[str, Any] | None = None,
                 answer: Callable[[list[P.Request]], tuple[int, dict[str, str], bytes]] | None = None):
        self.props = GOOD if props is None else props
        self.answer = answer or self.default
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                reqs, _ = P.decode_requests(body)
                status, headers, data = fake.answer(reqs)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if "Content-Length" not in headers:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def default(self, reqs: list[P.Request]) -> tuple[int, dict[str, str], bytes]:
        results = [self.props if isinstance(r, P.GetProperties) else None for r in reqs]
        body = P.encode_results(results, {})
        return 200, {"Content-Length": str(len(body))}, body

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def device(self) -> RemoteDevice:
        return RemoteDevice(address=self.address, token="", timeout=10.0, retry=0.0)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake():
    servers: list[FakeServer] = []

    def make(*args: Any, **kw: Any) -> FakeServer:
        servers.append(FakeServer(*args, **kw))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


def test_a_declared_huge_answer_is_refused_before_it_is_read(fake):
    srv = fake(answer=lambda reqs: (200, {"Content-Length": str(300 << 20)}, b"TGC1"))
    with pytest.raises(DeviceError, match=r"answer of 314572800 bytes, more than"):
        srv.device().properties  # noqa: B018


def test_an_undeclared_huge_answer_is_cut_off(fake):
    srv = fake(answer=lambda reqs: (200, {}, P.MAGIC + bytes(4) + b" " * (3 << 20)))
    with pytest.raises(DeviceError, match="more than the .* bytes its requests can need"):
        srv.device().properties  # noqa: B018


def test_a_copy_out_may_bring_its_buffers_bytes_and_no_more(fake):
    size = 2 << 20
    data = b"\x01" * size

    def answer(reqs):
        results, blobs = [], {}
        for r in reqs:
            if isinstance(r, P.GetProperties):
                results.append(dict(GOOD, max_buffer=16 << 20))
            elif isinstance(r, P.CopyOut):
                blobs[P.digest(data)] = data
                results.append(P.digest(data))
            else:
                results.append(None)
        body = P.encode_results(results, blobs)
        return 200, {"Content-Length": str(len(body))}, body
    dev = fake(answer=answer).device()
    h = dev.allocator.alloc(size)
    out = bytearray(size)
    dev.allocator.copyout(memoryview(out), h)
    assert bytes(out) == data
    small = dev.allocator.alloc(16)  # the same 2 MiB answer to a copy out of 16 bytes: refused
    with pytest.raises(DeviceError, match="more than"):
        dev.allocator.copyout(memoryview(bytearray(16)), small)


def test_an_answer_text_too_big_to_parse_is_refused(fake):
    text = ("[" + "0," * 400_000 + "]").encode()
    body = P.MAGIC + bytes(4) + text
    srv = fake(answer=lambda reqs: (200, {"Content-Length": str(len(body))}, body))
    with pytest.raises(DeviceError, match="sent a bad answer: .*nodes"):
        srv.device().properties  # noqa: B018


def test_a_server_that_serves_remote_is_refused(fake):
    with pytest.raises(DeviceError, match="serves REMOTE itself"):
        fake(dict(GOOD, kind="REMOTE")).device().properties  # noqa: B018


@pytest.mark.parametrize("change, message", [
    ({"max_body": "abc"}, "max_body 'abc' is not an integer"),
    ({"max_buffer": None}, "max_buffer None is not an integer"),
    ({"launch_style": "warp"}, "launch_style 'warp' is not one of"),
    ({"kind": "cpu; rm"}, "is not a device kind"),
    ({"kind": 3}, "is not a device kind"),
    ({"device": ["x"]}, "device .* is not a name"),
    ({"compiler": 7}, "compiler 7 is not text"),
    ({"info": []}, "must be dicts"),
    ({"request_time": "soon"}, "request_time"),
])
def test_malformed_properties_give_one_clear_error(fake, change, message):
    with pytest.raises(DeviceError, match="malformed device properties: .*" + message):
        fake(dict(GOOD, **change)).device().properties  # noqa: B018


def test_a_missing_properties_answer_is_clear(fake):
    with pytest.raises(DeviceError, match="malformed device properties: not a dict"):
        fake([]).device().properties  # noqa: B018  (a list where the dict belongs)


def test_server_text_is_made_safe_to_print(fake):
    evil = "\x1b]8;;http://evil\x07click\x1b[2J\u202e"
    dev = fake(dict(GOOD, device="CPU" + evil, info={"name" + evil: "[/oops][link=http://x]y[/link]" + evil},
                    compile_error="a\x1b[31m")).device()
    assert "\x1b" not in dev.served and "\\x1b" in dev.served and "\u202e" not in dev.served
    info = dev.info()
    assert all("\x1b" not in k and "\x1b" not in str(v) for k, v in info.items())

    def refuse(reqs):
        msg = "no \x1b[31mred\x1b[0m here\x07"
        return 400, {"Content-Length": str(len(msg)), P.ERROR_HEADER: "protocol"}, msg.encode()
    with pytest.raises(DeviceError) as e:
        fake(answer=refuse).device().properties  # noqa: B018
    assert "\x1b" not in e.value.msg and "\x07" not in e.value.msg and "\\x1b[31mred" in e.value.msg


def test_an_error_page_of_another_http_server_is_one_line(fake):
    """TGC_REMOTE naming some other HTTP server (a proxy, `python -m http.server`): its error page is not
    printed as the error (every refusal of `tgc serve` names its kind in X-Tgc-Error); one line saying so."""
    page = "<!DOCTYPE HTML>\n<html>\n<body><h1>Error response</h1><p>Error code: 501</p></body>\n</html>\n"
    srv = fake(answer=lambda reqs: (501, {"Content-Length": str(len(page))}, page.encode()))
    with pytest.raises(DeviceError) as e:
        srv.device().properties  # noqa: B018
    assert "HTTP 501" in e.value.msg and "tgc serve" in e.value.msg
    assert "<html>" not in e.value.msg and "\n" not in e.value.msg


def test_info_leaves_out_the_served_devices_own_device_lists(fake):
    """`CPU:0 .. CPU:7 split the server's cores` is about the server's local lists, not the client's REMOTE:i:
    `tgc devices` printed it under each REMOTE row."""
    info = fake(dict(GOOD, info={"cores": 2, "device_list": "CPU:0 .. CPU:7 in a device list split the 2 cores"})
                ).device().info()
    assert "device_list" not in info and info["cores"] == 2 and info["serves"] == "CPU"


def test_tgc_devices_shows_a_servers_markup_as_text(fake, monkeypatch):
    from click.testing import CliRunner

    from tgc import backends
    from tgc.cli.main import main
    srv = fake(dict(GOOD, info={"compiler": "[/oops]", "renderer": "[link=http://x]R[/link]"}))
    monkeypatch.setenv("TGC_REMOTE", srv.address)
    monkeypatch.delenv("TGC_REMOTE_TOKEN", raising=False)
    monkeypatch.delenv("TGC_REMOTE_TOKEN_FILE", raising=False)
    monkeypatch.setenv("COLUMNS", "300")
    for key in [k for k in backends._instances if k[0] == "REMOTE"]:
        backends._instances.pop(key).close()
    try:
        result = CliRunner().invoke(main, ["devices"])
    finally:
        for key in [k for k in backends._instances if k[0] == "REMOTE"]:
            backends._instances.pop(key).close()
    assert result.exit_code == 0, result.output
    assert "[/oops]" in result.output and "[link=http://x]R[/link]" in result.output


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfetoken", "not UTF-8"),
    ("tök€n".encode(), "character"),
    (b"abc\ndef\n", "more than one line"),
    (b"two words", "character ' '"),
    (b"\n\n", "is empty"),
])
def test_bad_token_files_are_user_errors(tmp_path, content, message):
    f = tmp_path / "token"
    f.write_bytes(content)
    for read in (lambda: read_token(str(f), env={}), lambda: client_token({"TGC_REMOTE_TOKEN_FILE": str(f)})):
        with pytest.raises(TgcError, match=message) as e:
            read()
        assert e.value.exit_code == 2


def test_bad_token_variables_are_user_errors():
    for read in (lambda t: read_token(None, env={"TGC_REMOTE_TOKEN": t}),
                 lambda t: client_token({"TGC_REMOTE_TOKEN": t})):
        with pytest.raises(TgcError, match="cannot be used") as e:
            read("tök€n")
        assert e.value.exit_code == 2


def test_the_fake_server_is_loopback_only(fake):
    srv = fake()
    host, port = srv.address.split(":")
    assert host == "127.0.0.1"
    socket.create_connection((host, int(port)), timeout=5).close()
