"""HTTP transport of `tgc serve`: the threading HTTP server (connection cap, one-line errors) and the request
handler (`POST /batch`: authorization, session header, body length), which hands each batch to the
`RemoteServer` it serves (`server.app`).

A request's line and headers are read here (`_Handler.parse_request`), not by `http.client`'s `email`-based
parser, which cost more server time than the rest of a small batch: the request line `METHOD PATH HTTP/1.x`
(anything else: 400; HTTP/2 and later: 505), then at most `MAX_HEADERS` header lines of at most `MAX_LINE`
bytes (more: 431), each `Name: value` (a line without a colon, an empty or spaced name, or a folded line: 400).
Values keep trailing spaces (a token with one is not the token). Names are matched without regard to case; `get`
gives a header's first value, `get_all` every value. Answers are formatted in one string and sent with their
body parts in one gathering write."""

from __future__ import annotations

import email.utils
import re
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tgc.backends.remote import protocol as P
from tgc.backends.remote.limits import Refusal
from tgc.backends.remote.staging import MappedBlock


def _busy(text: str) -> bytes:
    body = (text + "\n").encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nX-Tgc-Error: busy\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)) + body


_BUSY = _busy("the server has too many connections; try later")
_BUSY_PEER = _busy("this client address has too many connections open to the server that have not yet shown a "
                   "token; try later")


def max_untrusted(limits: Any) -> int:
    """How many connections that have not yet shown a token may be open at once, all addresses together."""
    return max(1, limits.max_connections // 4)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # the listen backlog: socketserver's default of 5 drops or resets connections when many clients connect
    # at once (16 load-test clients saw 'Connection reset by peer'); the connection cap applies after accept
    request_queue_size = 128
    app: Any  # the RemoteServer whose batches this server carries

    def verify_request(self, request: Any, client_address: Any) -> bool:
        """Take a connection while fewer than `max_connections` are open. Until a request on it shows a token the
        server takes (`RemoteServer.trust`) it is untrusted: it has `header_time` for its request line and headers
        (`_Handler.handle_one_request`), its address may hold at most `max_connections_per_client` untrusted ones,
        and all addresses together at most `max_untrusted` (a quarter of `max_connections`). A connection past the
        per-address cap is answered 503 and closed; one under it that finds the untrusted connections (or all
        connections) at their cap takes the place of the oldest untrusted connection of the address holding the
        most, which is closed: tokenless connections from a few addresses cannot shut out a client with the
        token, whose connection is trusted as soon as its first request's headers are read."""
        app, peer = self.app, str(client_address[0]) if client_address else ""
        lim = app.limits
        evicted = None
        with app.conn_lock:
            untrusted = app.conn_peers
            mine = sum(1 for p in untrusted.values() if p == peer)
            if mine >= lim.max_connections_per_client:
                answer = _BUSY_PEER
            elif len(app.conns) < lim.max_connections and len(untrusted) < max_untrusted(lim):
                answer = None
            else:  # (full: the oldest untrusted connection of the address with the most of them makes room)
                counts: dict[str, int] = {}
                for p in untrusted.values():
                    counts[p] = counts.get(p, 0) + 1
                most = max(counts.values(), default=0)
                evicted = next((c for c, p in untrusted.items() if counts[p] == most), None)
                answer = _BUSY if evicted is None else None
                if evicted is not None:
                    app.conns.pop(evicted, None)
                    untrusted.pop(evicted, None)
            if answer is None:
                app.conns[request] = time.monotonic() + max(min(lim.header_time, lim.request_time), 1.0)
                untrusted[request] = peer
        if evicted is not None:
            try:
                evicted.shutdown(socket.SHUT_RDWR)  # (its handler thread sees the end and goes)
            except OSError:
                pass
        if answer is None:
            return True
        try:
            request.setblocking(False)
            request.send(answer)
        except OSError:
            pass
        return False

    def shutdown_request(self, request: Any) -> None:
        with self.app.conn_lock:
            self.app.conns.pop(request, None)
            self.app.conn_peers.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line, never a traceback: a client that vanished mid-request is not the server's problem."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError) and not self.app.verbose:
            return
        print(f"tgc serve: {client_address[0]}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")
MAX_LINE = 65536  # bytes of the request line or of one header line (http.client's limit)
MAX_HEADERS = 100  # header lines of one request (http.client's limit)
_VERSION = re.compile(r"HTTP/([0-9]{1,10})\.([0-9]{1,10})")
_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token (RFC 9110)


class _Headers:
    """A request's headers: `get(name, default)` (the first value), `get_all(name)` (every value, or None), names
    matched without regard to case."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[str, list[str]] = {}

    def add(self, name: str, value: str) -> None:
        self._values.setdefault(name.lower(), []).append(value)

    def add_lower(self, name: str, value: str) -> None:
        """`add` of a name already in lower case."""
        values = self._values.get(name)
        if values is None:
            self._values[name] = [value]
        else:
            values.append(value)

    def get(self, name: str, default: Any = None) -> Any:
        values = self._values.get(name.lower())
        return values[0] if values else default

    def get_all(self, name: str, default: Any = None) -> Any:
        values = self._values.get(name.lower())
        return list(values) if values else default


# The request lines and header lines parsed so far, by their exact bytes (CR LF included): a client sends the same
# lines with every request (its session, its token, the host), and parsing is a pure function of the bytes. Only
# lines that parsed are kept (an error is always found again), at most `MAX_KEPT_LINES` of at most `KEPT_LINE` bytes;
# each table is emptied when full. Shared by every connection: equal bytes give an equal result whoever sent them.
_REQUEST_LINES: dict[bytes, tuple[str, str, str, str, int, int]] = {}  # -> (line, command, path, version, major, minor)
_HEADER_LINES: dict[bytes, tuple[str, str]] = {}  # -> (name in lower case, value)
MAX_KEPT_LINES = 1024
KEPT_LINE = 512


def _header_date() -> str:
    """The Date header's value, formatted once a second."""
    now = int(time.time())
    if _DATE[0] != now:
        _DATE[:] = [now, email.utils.formatdate(now, usegmt=True)]
    return _DATE[1]


_DATE: list[Any] = [0, ""]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tgc-serve"
    sys_version = ""  # no Python version in the Server header
    disable_nagle_algorithm = True  # answers are small writes; do not wait for the peer's delayed ACK
    server: _HTTPServer

    def setup(self) -> None:
        self.timeout = max(self.server.app.limits.request_time, 1.0)  # socket reads; ends slow or idle peers
        self._trusted = False  # whether a request on this connection carried a token the server takes
        super().setup()
        P.tune_socket(self.connection)

    def version_string(self) -> str:
        return self.server_version

    def parse_request(self) -> bool:
        """Read the request line (already in `raw_requestline`) and the headers (see the module's docstring); False
        after answering an error (or for an empty line: the connection closes)."""
        self.command = None
        self.request_version = "HTTP/0.9"  # (until the line is read: an error is then answered in HTTP/1.1)
        self.close_connection = True
        parsed = _REQUEST_LINES.get(self.raw_requestline)  # (a line read before: the same bytes parse the same)
        if parsed is None:
            line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
            self.requestline = line
            words = line.split()
            if not words:
                return False
            if len(words) != 3:
                self.send_error(400, f"Bad request syntax ({P.to_short(line)})")
                return False
            version = _VERSION.fullmatch(words[2])
            if version is None:
                self.send_error(400, f"Bad request version ({P.to_short(words[2])})")
                return False
            major, minor = int(version[1]), int(version[2])
            if major >= 2:
                self.send_error(505, f"Invalid HTTP version ({major}.{minor})")
                return False
            parsed = (line, words[0], words[1], words[2], major, minor)
            P.keep_line(_REQUEST_LINES, self.raw_requestline, parsed, MAX_KEPT_LINES, KEPT_LINE)
        line, command, path, version_text, major, minor = parsed
        self.requestline = line
        self.request_version = version_text
        self.close_connection = (major, minor) < (1, 1)
        self.command, self.path = command, path
        headers = self.headers = _Headers()
        for _ in range(MAX_HEADERS + 1):
            raw = self.rfile.readline(MAX_LINE + 1)
            field = _HEADER_LINES.get(raw)
            if field is not None:  # (a header line read before: its name in lower case and its value)
                headers.add_lower(*field)
                continue
            if len(raw) > MAX_LINE:
                self.send_error(431, "Line too long")
                return False
            if raw in (b"\r\n", b"\n", b""):
                break
            text = raw.decode("iso-8859-1").rstrip("\r\n")
            name, colon, value = text.partition(":")
            if not colon or not _NAME.fullmatch(name):
                self.send_error(400, f"Bad header line ({P.to_short(text)})")
                return False
            field = (name.lower(), value.lstrip(" \t"))  # (trailing spaces kept, as the standard library does)
            headers.add_lower(*field)
            P.keep_line(_HEADER_LINES, raw, field, MAX_KEPT_LINES, KEPT_LINE)
        else:
            self.send_error(431, f"Too many headers (more than {MAX_HEADERS})")
            return False
        connection = headers.get("Connection", "").lower()
        if connection == "close":
            self.close_connection = True
        elif connection == "keep-alive":
            self.close_connection = False
        if headers.get("Expect", "").lower() == "100-continue" and (major, minor) >= (1, 1):
            return self.handle_expect_100()
        return True

    def handle_one_request(self) -> None:
        # the request line and headers: `header_time` on a connection that has not yet shown a token the server
        # takes (idle or slow connections of nobody cannot hold the connection slots), else `request_time` (a
        # client's kept-alive connection waits that long for its next request); once the request is authorized,
        # reading its body has `request_time` (`_authorized`)
        lim = self.server.app.limits
        self.server.app.set_deadline(self.connection, lim.request_time if self._trusted else
                                     min(lim.header_time, lim.request_time))
        super().handle_one_request()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's errors (bad request line, unknown method, headers too long) in this server's
        plain format; an unknown method from a client without the token gets 401 like everything else."""
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":  # a garbled request line: answer in HTTP/1.1
            self.request_version = "HTTP/1.1"
        headers = getattr(self, "headers", None)
        if code == 501 and headers is not None and not self.server.app.authorized(headers.get("Authorization")):
            return self._refuse(Refusal(401, "auth", "unauthorized"), close=True)
        if code == 501:
            code, message = 405, f"use POST {P.BATCH_PATH}"
        text = message or "bad request"
        self._refuse(Refusal(code, "protocol", text.replace("\n", " ")[:200]), close=True)

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.app.verbose:
            sys.stderr.write(f"tgc serve: {self.address_string()} {format % args}\n")

    def _answer(self, status: int, body: bytes | list[bytes | memoryview], kind: str | None = None,
                close: bool = False, timing: str | None = None) -> None:
        parts = [body] if isinstance(body, bytes) else body
        if self.server.app.verbose:  # (`log_message` writes only then)
            self.log_request(status)
        head = (f"HTTP/1.1 {status} {self.responses[status][0] if status in self.responses else ''}\r\n"
                f"Server: {self.server_version}\r\nDate: {_header_date()}\r\n"
                f"Content-Type: {'application/octet-stream' if kind is None else 'text/plain; charset=utf-8'}\r\n"
                f"Content-Length: {sum(len(p) for p in parts)}\r\n")
        if timing:
            head += f"{P.TIMING_HEADER}: {timing}\r\n"
        if kind is not None:
            head += f"{P.ERROR_HEADER}: {kind}\r\n"
        if status == 401:
            head += "WWW-Authenticate: Bearer\r\n"
        if close:
            head += "Connection: close\r\n"
            self.close_connection = True
        # the header and every part in one gathering write (not a write for each: see `protocol.send_all`)
        P.send_all(self.connection, [(head + "\r\n").encode("latin-1"), *parts])

    def _refuse(self, r: Refusal, close: bool = False) -> None:
        self._answer(r.status, (r.msg + "\n").encode("utf-8", "replace"), r.kind, close)

    def _length(self) -> int | None:
        """The one Content-Length, written as decimal digits; None for none, several, or any other form."""
        values = self.headers.get_all("Content-Length") or []
        if len(values) != 1 or self.headers.get("Transfer-Encoding") is not None:
            return None
        text = values[0].strip()
        return int(text) if _CONTENT_LENGTH.fullmatch(text) else None

    def _discard_body(self, limit: int = 1 << 20) -> bool:
        """Read and drop a small body so the peer can read our answer; False if it is too big to bother."""
        n = self._length()
        if n is None or n > limit:
            return False
        try:
            self.rfile.read(n)
        except OSError:
            return False
        return True

    def _authorized(self) -> bool:
        """Whether the request carries a token the server takes (else answered 401); the token's name is kept for
        the batch (`_token_name`: each token is compared once a request, not again for the batch's owner)."""
        app = self.server.app
        name = app.token_name(self.headers.get("Authorization")) if app.tokens else None
        self._token_name = name
        if not app.tokens or name is not None:
            if not self._trusted:
                self._trusted = True
                app.trust(self.connection)  # (no longer counted against the caps of untrusted connections)
            app.set_deadline(self.connection, app.limits.request_time)  # (the body: see `handle_one_request`)
            return True
        keep = self._discard_body()
        self._refuse(Refusal(401, "auth", "unauthorized"), close=not keep)
        return False

    def do_POST(self) -> None:
        app = self.server.app
        if not self._authorized():
            return
        if self.path != P.BATCH_PATH:
            keep = self._discard_body()
            return self._refuse(Refusal(404, "protocol", f"no endpoint {self.path[:80]}; POST {P.BATCH_PATH}"),
                                close=not keep)
        sid = self.headers.get(P.SESSION_HEADER)
        if not P.valid_session(sid):
            keep = self._discard_body()
            return self._refuse(Refusal(400, "protocol", f"missing or bad {P.SESSION_HEADER} header "
                                                         "(16 to 128 characters of A-Z a-z 0-9 - _)"), close=not keep)
        n = self._length()
        if n is None:
            return self._refuse(Refusal(411, "protocol", "a request needs one Content-Length of decimal digits "
                                                         "(and no Transfer-Encoding)"), close=True)
        if n > app.limits.max_body:
            return self._refuse(Refusal(413, "limit", f"a request body of {n} bytes exceeds the limit of "
                                                      f"{app.limits.max_body} bytes"), close=True)
        # bodies held at once, all connections together, are bounded (the larger of the memory limit and one body),
        # and one owner (token, or address without tokens) holds at most half of that beside its first body, so
        # one token's stalled bodies cannot shut out the others
        cap = max(app.limits.max_memory, app.limits.max_body)
        owner = self._token_name if app.tokens else f"address {self.client_address[0]}"
        with app.lock:
            held = app.body_owners.get(owner, 0)
            room = app.body_bytes + n <= cap
            fair = held == 0 or held + n <= cap // 2
            if room and fair:
                app.body_bytes += n
                app.body_owners[owner] = held + n
        if not room:
            return self._refuse(Refusal(503, "busy", f"the server is receiving {app.body_bytes} bytes of request "
                                                     f"bodies, its limit is {cap}; try later"), close=True)
        if not fair:
            whose = "this token" if app.tokens else "this address"
            return self._refuse(Refusal(503, "busy", f"{whose} is sending {held} bytes of request bodies, half the "
                                                     f"server's limit of {cap}; try later"), close=True)
        try:
            self._receive_and_run(app, sid, n)
        finally:
            with app.lock:
                app.body_bytes -= n
                left = app.body_owners.pop(owner, 0) - n
                if left > 0:
                    app.body_owners[owner] = left

    def _receive_and_run(self, app: Any, sid: str, n: int) -> None:
        """Read a body of `n` bytes (its large blobs into staging blocks) and run its batch (`do_POST`)."""
        # blobs of LARGE_BLOB bytes or more are received straight into blocks of the shared arena where the device
        # keeps its buffers there (`RemoteServer.stage_block`): a CopyIn may adopt one as its buffer (no copy);
        # elsewhere into reused host staging buffers
        blocks: list[Any] = []
        owners: dict[int, Any] = {}  # id of the object a staged view is of -> its block

        def stage(size: int) -> memoryview | None:
            block = app.stage_block(size)
            if block is None:
                return None
            blocks.append(block)
            view = memoryview(block.host if isinstance(block, MappedBlock) else block)
            owners[id(view.obj)] = block
            return view

        staged: dict[str, Any] = {}
        offered: dict[str, Any] = {}
        try:
            try:
                body = P.read_body(self.rfile, n, stage, max_text=app.limits.max_text)
            except (OSError, P.TruncatedBody):  # a timeout or a vanished peer: nobody to answer
                self.close_connection = True
                return
            except P.ProtocolError as e:  # (the rest of the body is unread: the connection cannot go on)
                return self._refuse(Refusal(400, "protocol", str(e)), close=True)
            staged = {h: owners[id(v.obj)] for h, v in body[0].items() if id(v.obj) in owners}
            offered = dict(staged)
            self._run_batch(app, sid, body, staged)
        finally:  # every block not adopted by a buffer (`run_batch` removed those from `staged`) goes back
            adopted = {id(b) for h, b in offered.items() if h not in staged}
            for block in blocks:
                if id(block) not in adopted:
                    app.unstage(block, len(block))

    def _run_batch(self, app: Any, sid: str, body: Any, staged: dict[str, Any]) -> None:
        """Run a batch read by `do_POST` and answer it."""
        app.set_deadline(self.connection, None)  # the batch's own time limit applies while it runs
        timings: list | None = [] if self.headers.get(P.PROFILE_HEADER) == "1" else None  # (a profiling client)
        start = time.perf_counter_ns()

        sent: list[bool] = []

        def send(parts: list[bytes | memoryview]) -> None:  # the answer, sent while the session is still held
            sent.append(True)
            app.set_deadline(self.connection, app.limits.request_time)  # writing the answer
            try:
                self._answer(200, parts, timing=P.timing_header(timings, start) if timings else None)
            except OSError:  # a timeout or a vanished peer: nobody to answer
                self.close_connection = True

        try:
            app.run_batch(sid, body, self.client_address[0], self._token_name, timings, send, staged)
        except Exception as e:  # never let one batch take the server down
            if sent:  # (the answer is out: nothing more may be written on this connection)
                self.close_connection = True
                return
            app.set_deadline(self.connection, app.limits.request_time)
            r = e if isinstance(e, Refusal) else Refusal(500, "device", f"internal error: {type(e).__name__}: {e}")
            return self._refuse(r)

    def _not_allowed(self) -> None:
        if self._authorized():
            keep = self._discard_body()
            self._refuse(Refusal(405, "protocol", f"use POST {P.BATCH_PATH}"), close=not keep)

    do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed
