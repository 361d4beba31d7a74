"""The REMOTE device: a device served by `tgc serve`, spoken to over HTTP.

It behaves as the device it serves: `renderer` is built locally for the served device's kind (renderers
are pure code), `compiler` compiles on the server, `launch_style` and `info()` are the server's.

Work that needs no answer (alloc, free, copy in, program load, launches without `wait`) is queued and
sent in one `POST /batch` when an answer is needed: a copy out, a launch with `wait=True`, a compile,
`synchronize()` or `flush()`. A program of k kernels thus costs one round trip. `round_trips` counts them.

Environment: `TGC_REMOTE=host:port` (a comma list gives `REMOTE:i` the i-th server, an index past them is a
user error; with one server every `REMOTE:i` is its own session there), `TGC_REMOTE_TOKEN` (one bearer token for
every server) or `TGC_REMOTE_TOKEN_FILE` (a file of one token, or of one `HOST:PORT TOKEN` line per server),
`TGC_REMOTE_TIMEOUT` (seconds to wait for an answer, default 120), `TGC_REMOTE_RETRY` (seconds to keep
retrying a connection, with backoff, default 3).
"""

from __future__ import annotations

import dataclasses
import functools
import http.client
import itertools
import operator
import os
import re
import secrets
import select
import socket
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from tgc import profile
from tgc.backends import device_class, get_device
from tgc.backends.base import Allocator, Compiler, Device, Program
from tgc.backends.remote import protocol as P
from tgc.env import env_float, parse_address
from tgc.errors import CompileError, DeviceError, TgcError
from tgc.interfaces import MemoryFeatures, RuntimeFeatures

ENV_ADDRESS, ENV_TOKEN, ENV_TOKEN_FILE = "TGC_REMOTE", "TGC_REMOTE_TOKEN", "TGC_REMOTE_TOKEN_FILE"
ENV_TIMEOUT, ENV_RETRY = "TGC_REMOTE_TIMEOUT", "TGC_REMOTE_RETRY"
DEFAULT_TIMEOUT, DEFAULT_RETRY = 120.0, 3.0
CONNECT_TIMEOUT = 10.0  # seconds one connection attempt may take (a host that drops packets, a full backlog)
MAX_QUEUE = 2048  # queued requests that trigger a flush
# A copy in of at least this many bytes is sent at once (`RemoteDevice._send_ahead`: its bytes go from the caller's
# memory to the socket, and its answer is read with the next one) rather than copied and queued: above it, the
# copy costs more than the server's handling of one more request.
SEND_AHEAD = 1 << 20
MAX_AHEAD = 64  # requests sent ahead whose answers are unread, at most (then they are read first)
BODY_SLACK = 1 << 20  # room left in a body for the request text (at most a quarter of the limit)
# What an answer may hold beyond the bytes of the buffers copied out: the result text of each request, and
# for a compile, assembly or disassembly listing, or the device's properties, this much more.
ANSWER_BASE, ANSWER_PER_REQUEST, ANSWER_PER_LISTING = 1 << 20, 256, 64 << 20
ERROR_LIMIT = 1 << 20  # bytes of an error message
LISTINGS = (P.Compile, P.Assembly, P.Disassemble)


def client_token(env: dict[str, str] | None = None, address: tuple[str, int] | None = None) -> str | None:
    """The token for the server at `address` (host, port): `TGC_REMOTE_TOKEN` (one token for every server), else
    from the file named by `TGC_REMOTE_TOKEN_FILE`: that server's line in a per-server file (see
    `read_token_table`), else its `*` line, else None; a one-token file gives its token to every server.
    TgcError (exit 2) for a file that cannot be read or a token that cannot go in an HTTP header."""
    env = os.environ if env is None else env
    if env.get(ENV_TOKEN):
        token = env[ENV_TOKEN].strip()
        why = P.token_problem(token)
        if why is not None:
            raise TgcError(f"{ENV_TOKEN} cannot be used: {why}")
        return token
    path = env.get(ENV_TOKEN_FILE)
    if not path:
        return None
    table = read_token_table(path)
    if address is None:
        return table.get(ANY_SERVER)
    return table.get(_server_key(*address), table.get(ANY_SERVER))


ANY_SERVER = ("*", 0)  # the key of a token file's default token
_ADDRESS_WORD = re.compile(r"(?:\[[^\s\]]+\]|[^\s:\[\]]+):[0-9]+|\*")


def _server_key(host: str, port: int) -> tuple[str, int]:
    return host.strip("[]").lower(), int(port)


def read_token_table(path: str) -> dict[tuple[str, int], str]:
    """The tokens of a token file, by server: `{(host, port): token}` plus `ANY_SERVER` for the default.

    Two forms. One token (the whole file, one line): every server's token. Or one line per server,
    `HOST:PORT TOKEN` (`[::1]:PORT` for IPv6), with `* TOKEN` for every server not named; blank lines and
    lines starting with `#` are skipped. A server is matched by the host and port written in `TGC_REMOTE`
    (no name lookup: `localhost:6667` and `127.0.0.1:6667` are different lines). TgcError (exit 2) naming the
    line for anything else."""
    text = P.read_token_text(path)
    lines = [(i, line.split()) for i, line in enumerate(text.splitlines(), 1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not any(len(words) == 2 and _ADDRESS_WORD.fullmatch(words[0]) for _, words in lines):
        return {ANY_SERVER: P.read_token_file(path, text)}  # the one-token form (and its errors)
    table: dict[tuple[str, int], str] = {}
    for i, words in lines:
        where = f"line {i} of the token file '{path}'"
        if len(words) != 2 or not _ADDRESS_WORD.fullmatch(words[0]):
            raise TgcError(f"{where} is not `HOST:PORT TOKEN`",
                           hint="one server per line (`* TOKEN` for every server not named), or a file of one token")
        key = ANY_SERVER if words[0] == "*" else _server_key(*parse_address(words[0]))
        if key in table:
            raise TgcError(f"{where} names {words[0]} a second time")
        why = P.token_problem(words[1])
        if why is not None:
            raise TgcError(f"the token on {where} cannot be used: {why}")
        table[key] = words[1]
    return table


def _env_float(name: str, default: float) -> float:

    return env_float(name, default)


def _reason(e: BaseException) -> str:
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


MAX_HEADER_LINE = 65536  # bytes of the status line or of one header line of an answer
MAX_HEADERS = 100  # header lines of an answer (http.client's limits)


class _Wire:
    """One kept-alive HTTP/1.1 connection, written and read here rather than by `http.client`, whose request
    building and `email`-based header parsing cost more client time than all the rest of a small round trip.

    A request is its header and every body part in one gathering write (`protocol.send_all`: no join, no copy).
    An answer is read from a buffered reader kept for the connection: a status line `HTTP/1.x NNN reason`, at
    most `MAX_HEADERS` header lines of at most `MAX_HEADER_LINE` bytes, and a body of exactly its Content-Length
    bytes (an answer without one is read until the server closes, at most `cap + 1` bytes). Malformed answers
    raise `http.client` exceptions (a connection closed before the status line: `RemoteDisconnected`)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.rfile = sock.makefile("rb")

    def close(self) -> None:
        try:
            self.rfile.close()
        finally:
            self.sock.close()

    def _line(self) -> bytes:
        line = self.rfile.readline(MAX_HEADER_LINE + 1)
        if len(line) > MAX_HEADER_LINE:
            raise http.client.LineTooLong("header line")
        return line

    def readable(self) -> bool:
        """Whether the socket holds bytes (or the server's close) to read, without waiting for any."""
        try:  # (poll, not select: select refuses descriptors >= 1024, which a process with many files open has)
            poller = select.poll()
            poller.register(self.sock, select.POLLIN)
            return bool(poller.poll(0))
        except (ValueError, OSError):
            return True

    def peer_closed(self) -> bool:
        """Whether the server has closed this (idle) connection: it is readable with nothing to read (or reset)."""
        try:  # (a socket with a timeout waits for data before any recv: ask whether it is readable first)
            if not self.readable():
                return False
            return self.sock.recv(1, socket.MSG_PEEK) == b""
        except (ValueError, OSError):
            return True

    def receive(self, cap: int, error_cap: int, sink: memoryview | None = None
                ) -> tuple[int, dict[str, str], Any, int | None, bool]:
        """Read the answer to one request sent; (status, headers by lowercase name, body, declared length, whether
        the server closes the connection after it). The body is None when the declared length passes the cap (`cap`
        for a 200, else `error_cap`): refused before it is read. An undeclared body holds up to cap + 1 bytes.
        With a `sink` (a writable byte view of at least `LARGE_BLOB` bytes), a 200 answer of one blob of exactly
        `len(sink)` bytes is received into it: the body is then `(body without the blob, blob id, sink)`."""
        line = self._line()
        if not line:
            raise http.client.RemoteDisconnected("the server closed the connection without an answer")
        words = line.decode("latin-1").split(None, 2)
        if len(words) < 2 or not words[0].startswith("HTTP/1.") or not (len(words[1]) == 3 and words[1].isdigit()):
            raise http.client.BadStatusLine(P.safe_text(line[:80], multiline=False))
        status, headers = int(words[1]), {}
        for _ in range(MAX_HEADERS + 1):
            line = self._line()
            field = _ANSWER_LINES.get(line)  # (a line read before: the same bytes read the same)
            if field is None:
                if line in (b"\r\n", b"\n", b""):
                    break
                name, colon, value = line.decode("latin-1").partition(":")
                if not colon:
                    raise http.client.HTTPException(f"a malformed header line: {P.to_short(line)}")
                field = (name.strip().lower(), value.strip())
                P.keep_line(_ANSWER_LINES, line, field, 256, 512)
            name, value = field
            if name == "content-length" and headers.get(name, value) != value:
                raise http.client.HTTPException("two different Content-Length headers")
            headers[name] = value
        else:
            raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")
        close = words[0] == "HTTP/1.0" or headers.get("connection", "").lower() == "close"
        limit = cap if status == 200 else error_cap
        text = headers.get("content-length")
        if text is None:
            return status, headers, self.rfile.read(limit + 1), None, True
        if not (text.isascii() and text.isdigit() and len(text) <= 18):
            raise http.client.HTTPException(f"a bad Content-Length: {P.to_short(text)}")
        length = int(text)
        if length > limit:
            return status, headers, None, length, True
        if sink is not None and status == 200 and length >= 48 + len(sink) and len(sink) >= P.LARGE_BLOB:
            return status, headers, self._streamed(length, sink), length, close
        data = self._read(length)
        return status, headers, data, length, close

    def _read(self, n: int) -> bytes:
        data = self.rfile.read(n)
        if len(data) < n:
            raise http.client.IncompleteRead(data, n - len(data))
        return data

    def _streamed(self, length: int, sink: memoryview) -> bytes | tuple[bytes, str, memoryview]:
        """Read an answer body of `length` bytes whose one blob is received straight into `sink` (`readinto`: the
        socket's bytes land in the destination, no intermediate bytes object). The body as bytes when it does not
        have exactly one blob of `len(sink)` bytes (read whole, as without a sink); else (the body without its
        blob, the blob's id, `sink`). A body that ends early raises `IncompleteRead`."""
        head = self._read(8)
        if head[:4] != P.MAGIC or int.from_bytes(head[4:8], "big") != 1:
            return head + self._read(length - 8)
        blob_head = self._read(40)
        n = int.from_bytes(blob_head[32:40], "big")
        if n != len(sink):  # (a blob of another size, or a length past the body: the decoder says which)
            return head + blob_head + self._read(length - 48)
        got = 0
        while got < n:
            k = self.rfile.readinto(sink[got:])
            if not k:
                raise http.client.IncompleteRead(bytes(0), n - got)
            got += k
        text = self._read(length - 48 - n)
        return P.MAGIC + bytes(4) + text, blob_head[:32].hex(), sink


# answer header lines read so far, by their exact bytes -> (name in lower case, value): a server sends most of them
# with every answer; only lines that read are kept (at most 256 of at most 512 bytes, emptied when full)
_ANSWER_LINES: dict[bytes, tuple[str, str]] = {}


class Connection:
    """One kept-alive HTTP connection to a server.

    Connecting is retried with exponential backoff for `retry` seconds. Once a body is sent, a failure is
    not retried (the server may have run it): a request is sent again only where it provably never reached the
    server, on a kept-alive connection that the server had already closed (seen closed before sending, or the
    send itself failing: a body the server did not receive whole is never run), reopened once. Every failure is
    one DeviceError.
    """

    def __init__(self, host: str, port: int, token: str | None, session: str, timeout: float, retry: float):
        self.host, self.port, self.token, self.session = host, port, token, session
        self._fixed: tuple[tuple, str] | None = None  # (host, port, session, token) and the head's lines of them
        self.timeout, self.retry = timeout, retry
        self._conn: _Wire | None = None
        self.server_timing: str | None = None  # the server's timing header of the last answer (`post(timing=...)`)
        self.pending: list[int] = []  # answer caps of requests sent ahead (`send_ahead`) whose answers are unread
        # how long a kept-alive connection may sit idle and still carry the next batch (`reuse_within`; None: no
        # limit known), and when its last answer was read
        self.reuse_for: float | None = None
        self._last_answer = 0.0

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def close(self) -> None:
        self.pending = []
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def reuse_within(self, request_time: float) -> None:
        """Reuse a kept-alive connection only while it has been idle for less than the server's `request_time`
        (after which the server closes it) less a margin of max(0.5 s, 10%): a batch sent just as the server's close
        is on its way would be lost with the connection, and may not be sent again (the server may have read it).
        An older connection is closed and a fresh one opened instead."""
        self.reuse_for = max(0.0, request_time - max(0.5, request_time / 10))

    def _stale(self) -> bool:
        """Whether the open connection, with no answers owed, has been idle too long to carry another batch."""
        return self.reuse_for is not None and time.monotonic() - self._last_answer >= self.reuse_for

    def set_timeout(self, seconds: float) -> None:
        """Wait `seconds` for an answer from now on: on the open connection and on any opened later."""
        self.timeout = seconds
        if self._conn is not None and self._conn.sock is not None:
            self._conn.sock.settimeout(seconds)

    def _connect(self) -> _Wire:
        deadline, delay = time.monotonic() + self.retry, 0.05
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=min(self.timeout, CONNECT_TIMEOUT))
                try:
                    sock.settimeout(self.timeout)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    P.tune_socket(sock)
                except OSError:
                    sock.close()
                    raise
                return _Wire(sock)
            except OSError as e:
                if isinstance(e, socket.gaierror) and e.errno == socket.EAI_NONAME:
                    # a host name that names no host: the address is wrong (exit 2), and retrying will not help
                    raise DeviceError(f"bad REMOTE address {self.address}: no host is called {self.host}",
                                      kind="user", hint=f"check the host in {ENV_ADDRESS}",
                                      cli_hint=f"check --remote or {ENV_ADDRESS}") from None
                if time.monotonic() + delay > deadline:
                    tried = f" (retried for {self.retry:g}s)" if self.retry else ""
                    raise DeviceError(f"cannot reach REMOTE server {self.address}: {_reason(e)}{tried}",
                                      hint=f"start a server there (`tgc serve`, port {self.port}) or check "
                                           f"{ENV_ADDRESS}",
                                      cli_hint=f"start one with `tgc serve --port {self.port}` or check {ENV_ADDRESS}"
                                      ) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _head(self, parts: Sequence[bytes | memoryview], timing: bool = False) -> bytes:
        fixed = (self.host, self.port, self.session, self.token)
        if self._fixed is None or self._fixed[0] != fixed:  # (the lines that are the same in every request: once)
            host = f"[{self.host}]" if ":" in self.host else self.host
            auth = f"Authorization: Bearer {self.token}\r\n" if self.token else ""
            self._fixed = (fixed, f"POST {P.BATCH_PATH} HTTP/1.1\r\nHost: {host}:{self.port}\r\n"
                                  f"Content-Type: application/octet-stream\r\n{P.SESSION_HEADER}: {self.session}\r\n"
                                  f"{auth}Content-Length: ")
        size = 0
        for p in parts:
            size += len(p)
        tail = f"\r\n{P.PROFILE_HEADER}: 1\r\n\r\n" if timing else "\r\n\r\n"
        return (self._fixed[1] + str(size) + tail).encode("latin-1")

    def send_ahead(self, parts: list[bytes | memoryview], limit: int) -> None:
        """Send one batch body now and read its answer later, before the next answer (`post`, `drain`): HTTP/1.1
        pipelining on the kept-alive connection, whose server answers its requests in order. The parts are written
        before this returns (a large copy in goes from the caller's memory straight to the socket: nothing need
        keep a copy). `limit`: what the answer may hold. A kept-alive connection that the server closed while idle
        is reopened first; a failure once bytes may have reached the server is one DeviceError."""
        if self._conn is not None and not self.pending and (self._stale() or self._conn.peer_closed()):
            self.close()
        if self._conn is None:
            self._conn = self._connect()
        try:
            P.send_all(self._conn.sock, [self._head(parts), *parts])
        except OSError as e:
            self.close()
            what = f"no answer within {self.timeout:g}s" if isinstance(e, TimeoutError) else _reason(e)
            raise DeviceError(f"lost the connection to REMOTE server {self.address}: {what}") from None
        self.pending.append(limit)

    def drain(self) -> None:
        """Read the answers of the requests sent ahead; the first refusal among them as its error."""
        if not self.pending:
            return
        first: TgcError | None = None
        while self.pending and self._conn is not None:
            cap = self.pending.pop(0)
            try:
                status, headers, data, length, close = self._conn.receive(cap, ERROR_LIMIT)
                self._last_answer = time.monotonic()
            except (OSError, http.client.HTTPException) as e:
                self.close()
                what = f"no answer within {self.timeout:g}s" if isinstance(e, TimeoutError) else _reason(e)
                raise first or DeviceError(f"lost the connection to REMOTE server {self.address}: {what}") from None
            if data is None or len(data) > (cap if status == 200 else ERROR_LIMIT):
                self.close()
                raise first or DeviceError(f"REMOTE server {self.address} sent an answer of more than the "
                                           f"{cap if status == 200 else ERROR_LIMIT} bytes its requests can need")
            if status != 200 and first is None:
                first = self._error(status, headers.get(P.ERROR_HEADER.lower()), data)
            if close:
                self.close()
        if self.pending:  # (the connection closed with answers still owed: those requests' fate is unknown)
            self.close()
            raise first or DeviceError(f"lost the connection to REMOTE server {self.address}: it closed the "
                                       "connection with answers still owed")
        if first is not None:
            raise first

    def post(self, body: bytes | list[bytes | memoryview], limit: int = 1 << 30, timing: bool = False,
             sink: memoryview | None = None) -> Any:
        """Send one batch body (or its parts); the response body, or a DeviceError/CompileError with the
        server's message. An answer longer than `limit` bytes (what the requests can need) is refused
        before it is read. `timing` asks the server for its timing of the batch (a profile trace), which
        `server_timing` then holds (`protocol.parse_timing`). `sink`: see `_Wire.receive` (the answer is then
        that tuple when its one blob went into the sink)."""
        parts = [body] if isinstance(body, bytes) else body
        request = self._head(parts, timing)
        self.server_timing = None
        for attempt in range(2):
            reused = self._conn is not None
            if self.pending and self._conn is not None and self._conn.readable():
                self.drain()  # (answers owed that have arrived: read now, no wait; a close behind them then shows)
                if self._conn is not None and self._conn.peer_closed():
                    self.close()  # (the server closed the idle connection after answering)
            ahead = bool(self.pending)  # (answers still owed: this one is read after them)
            if self._conn is not None and not ahead and (self._stale() or self._conn.peer_closed()):
                self.close()  # (the server closed the idle connection, or may be closing it: a fresh one)
                reused = False
            if self._conn is None:
                self._conn = self._connect()
            sent = False  # (whether the whole request was written: the server may then have run it)
            try:
                if ahead:
                    try:
                        P.send_all(self._conn.sock, [request, *parts])
                    except OSError:  # (the server may have refused one sent ahead and closed: that is the error)
                        self.drain()
                        raise
                    try:
                        self.drain()
                    except TgcError:
                        self.close()  # (this request's answer is still owed: the connection cannot go on)
                        raise
                    if self._conn is None:  # (the server closed the connection after the last of them)
                        raise DeviceError(f"lost the connection to REMOTE server {self.address}: it closed the "
                                          "connection before answering")
                    status, headers, data, length, close = self._conn.receive(limit, ERROR_LIMIT, sink)
                else:
                    P.send_all(self._conn.sock, [request, *parts])
                    sent = True
                    status, headers, data, length, close = self._conn.receive(limit, ERROR_LIMIT, sink)
                self._last_answer = time.monotonic()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self.close()
                if reused and attempt == 0 and not ahead and not sent:
                    continue  # (the server had closed the idle connection: the body never reached it whole)
                what = _reason(e) + ("; the server may have run this batch, so it is not sent again" if sent else "")
                raise DeviceError(f"lost the connection to REMOTE server {self.address}: {what}") from None
            except (OSError, http.client.HTTPException) as e:
                self.close()
                what = f"no answer within {self.timeout:g}s" if isinstance(e, TimeoutError) else _reason(e)
                raise DeviceError(f"lost the connection to REMOTE server {self.address}: {what}") from None
            cap = limit if status == 200 else ERROR_LIMIT
            if data is None:  # (declared too long: not read)
                self.close()
                raise DeviceError(f"REMOTE server {self.address} sent an answer of {length} bytes, more "
                                  f"than the {cap} its requests can need")
            streamed = data if isinstance(data, tuple) else None
            if streamed is not None:
                data = streamed[0]
            if len(data) > cap:
                self.close()
                raise DeviceError(f"REMOTE server {self.address} sent an answer of more than the {cap} bytes "
                                  "its requests can need")
            if close:
                self.close()
            if status == 200:
                self.server_timing = headers.get(P.TIMING_HEADER.lower()) if timing else None
                return data if streamed is None else streamed
            raise self._error(status, headers.get(P.ERROR_HEADER.lower()), data)
        raise AssertionError("unreachable")

    def _error(self, status: int, kind: str | None, data: bytes) -> TgcError:
        msg = data.decode("utf-8", "replace").removesuffix("\n") or f"HTTP {status}"  # the server adds one
        msg = P.safe_text(msg)
        if status == 401:
            return DeviceError(f"REMOTE server {self.address} refused the request: missing or wrong token",
                               hint=f"set {ENV_TOKEN} or {ENV_TOKEN_FILE} to the server's token (in a file of "
                                    f"several: a line `{self.address} TOKEN`)")
        if kind == "compile":
            return CompileError(msg)
        if kind is None:  # every refusal of `tgc serve` names its kind: this is some other HTTP server's page
            return DeviceError(f"{self.address} answered HTTP {status} without a tgc error (is it a `tgc serve`?)",
                               hint=f"check that TGC_REMOTE names a tgc server; {self.address} is something else")
        return DeviceError(f"REMOTE server {self.address}: {msg}")


class RemoteAllocator(Allocator):
    """Buffers on the server, named by per-session ids (the handles are those ints)."""

    # a copy out returns the whole buffer: a memory plan gives each buffer its own (no shared slots); ranged copies
    # and views at an offset (where the served device has views) are requests of their own
    features = MemoryFeatures(shared_slots=False, ranged_copies=True, offsets=True)

    def __init__(self, device: RemoteDevice):
        self.device = device

    def alloc(self, nbytes: int) -> int:
        limit = self.device.properties["max_buffer"]
        if nbytes > limit:
            raise DeviceError(f"a buffer of {nbytes} bytes exceeds the REMOTE server's limit of {limit} bytes")
        num = self.device._new_id()
        self.device._enqueue(P.BufferAlloc(buf=num, size=int(nbytes)))
        self.device._sizes[num] = int(nbytes)
        return num

    def free(self, handle: int, nbytes: int) -> None:
        self.device._sizes.pop(handle, None)
        self.device._enqueue_free(P.BufferFree(buf=handle))

    def copyin(self, handle: int, src: memoryview) -> None:
        if src.nbytes >= SEND_AHEAD and src.c_contiguous and profile.active is None:
            # sent now, from the caller's memory (no snapshot copy), with what is queued before it
            data = src if src.format == "B" and src.ndim == 1 else src.cast("B")
            self.device._send_ahead(P.CopyIn(buf=handle, datahash=""), data)
            return
        self.device._enqueue(P.CopyIn(buf=handle, datahash=""), bytes(src))  # (a queued copy must not see later
        # writes to the caller's memory)

    def copyout(self, dest: memoryview, handle: int) -> None:
        out = dest if dest.format == "B" and dest.ndim == 1 else dest.cast("B")
        # a large contiguous destination receives the bytes straight from the socket (`_Wire.receive`'s sink)
        sink = out if len(out) >= P.LARGE_BLOB and out.contiguous and not out.readonly else None
        results, blobs = self.device._submit(P.CopyOut(buf=handle), sink=sink)
        data = blobs.get(results[-1]) if isinstance(results[-1], str) else None
        if data is None or len(data) != len(out):
            raise DeviceError(f"REMOTE server sent {'no' if data is None else len(data)} bytes for a "
                              f"copy out of {len(out)} bytes")
        if data is not sink:
            out[:] = data

    def copyout_range(self, dest: memoryview, handle: int, offset: int) -> None:
        """Bytes `offset .. offset + len(dest)` of a buffer (one round trip; see `RemoteDevice.read_range`)."""
        out = dest if dest.format == "B" and dest.ndim == 1 else dest.cast("B")
        out[:] = self.device.read_range(handle, offset, len(out))

    def copyin_range(self, handle: int, offset: int, src: memoryview) -> None:
        """Write `src` into a buffer from byte `offset` (queued; see `RemoteDevice.write_range`)."""
        self.device.write_range(handle, offset, src)

    def offset(self, handle: int, nbytes: int, offset: int) -> int:
        """A view of `nbytes` at `offset` into a buffer (where the served device has views)."""
        if not self.device.properties.get("offset"):
            raise DeviceError(f"the REMOTE device ({self.device.served}) has no buffer views")
        num = self.device._new_id()
        self.device._enqueue(P.BufferOffset(buf=handle, size=nbytes, offset=offset, sub=num))
        self.device._sizes[num] = int(nbytes)
        return num

    def transfer(self, dest: int, src: int, nbytes: int, src_dev: RemoteDevice, dest_dev: RemoteDevice) -> None:
        """Copy `src` (on `src_dev`) into `dest` (on `dest_dev`): on the server when both share it."""
        if src_dev.conn_address == dest_dev.conn_address:
            dest_dev.flush()  # the destination buffer must exist first
            src_dev._enqueue(P.Transfer(buf=src, dest_session=dest_dev.session, dest_buf=dest))
            src_dev.flush()
            return
        RemoteDevice.copy_between(src_dev, src, 0, dest_dev, dest, 0, nbytes)  # one read; the write is queued


class RemoteCompiler(Compiler):
    """Compiles on the server with the served device's compiler."""

    def __init__(self, device: RemoteDevice, name: str, version: str):
        self.device, self.name, self.version = device, f"remote-{name}", version

    @property
    def cache_identity(self) -> tuple[str, ...]:
        """What names this compiler in the disk-cache key: the server's address, its compiler and version as
        it reports them, and its instance id (new at every start), so that a binary is only ever sent back
        to the server process that compiled it."""
        p = self.device.properties
        host, port = self.device.conn_address
        return (f"{host}:{port}", str(p.get("kind")), str(p.get("compiler")), str(p.get("compiler_version")),
                str(p.get("instance", "")))

    def compile(self, src: str) -> bytes:
        results, blobs = self.device._submit(P.Compile(src=src))
        h = results[-1]
        if not isinstance(h, str) or h not in blobs:
            raise DeviceError("REMOTE server answered a compile without a binary")
        return bytes(blobs[h])

    def disassemble(self, lib: bytes, src: str | None = None) -> str:
        results, _ = self.device._submit(P.Disassemble(datahash=""), lib)
        return P.safe_text(results[-1], limit=None)

    source_assembly = True

    def assembly(self, src: str) -> str:
        """The server compiler's assembly listing for `src`."""
        results, _ = self.device._submit(P.Assembly(src=src))
        return P.safe_text(results[-1], limit=None)


class RemoteProgram(Program):
    """A binary loaded on the server; calling it queues a launch (or runs it now with `wait=True`)."""

    def __init__(self, device: RemoteDevice, name: str, lib: bytes):
        super().__init__(device, name, lib)
        self.num = device._new_id()
        device._enqueue(P.ProgramAlloc(prog=self.num, name=name, datahash=""), bytes(lib))

    def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1),
                 local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
                 wait: bool = False) -> float | None:
        dev: RemoteDevice = self.device
        req = P.ProgramExec(prog=self.num, bufs=_ints(bufs, "buffer handles"),
                            global_size=_ints(global_size, "global_size"),
                            local_size=None if local_size is None else _ints(local_size, "local_size"),
                            vals=_ints(vals, "vals"), wait=bool(wait))
        if not wait:
            dev._enqueue(req)
            return None
        results, _ = dev._submit(req)
        return None if results[-1] is None else float(results[-1])

    def __del__(self) -> None:
        try:
            self.device._enqueue_free(P.ProgramFree(prog=self.num))
        except Exception:
            pass


class RemoteGraph:
    """A fixed list of launches stored on the server: each call runs all of them with one request."""

    def __init__(self, device: RemoteDevice, launches: Sequence[tuple]):
        self.device, self.num = device, device._new_id()
        kernels = []
        for prog, bufs, global_size, local_size, vals in launches:
            if not isinstance(prog, RemoteProgram) or prog.device is not device:
                raise DeviceError("a REMOTE graph can only hold programs of its own device")
            kernels.append(P.GraphKernel(prog=prog.num, bufs=_ints(bufs, "buffer handles"),
                                         global_size=_ints(global_size, "global_size"),
                                         local_size=None if local_size is None else _ints(local_size, "local_size"),
                                         vals=_ints(vals, "vals")))
        self._programs = [launch[0] for launch in launches]  # keep them loaded while the graph lives
        device._enqueue(P.GraphAlloc(graph=self.num, kernels=tuple(kernels)))

    def __call__(self, wait: bool = False) -> float | None:
        req = P.GraphExec(graph=self.num, wait=bool(wait))
        if not wait:
            self.device._enqueue(req)
            return None
        results, _ = self.device._submit(req)
        return None if results[-1] is None else float(results[-1])

    def free(self) -> None:
        self.device._enqueue_free(P.GraphFree(graph=self.num))


def _ints(values: Sequence[Any], what: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in values)
    except (TypeError, ValueError):
        raise DeviceError(f"REMOTE {what} must be integers, got {values!r}") from None


@functools.lru_cache(maxsize=16)
def _split_addresses(text: str) -> tuple[str, ...]:
    """The addresses of a comma list (split once per text: the engine asks a device's name many times a run)."""
    return tuple(a for a in (t.strip() for t in text.split(",")) if a)


def _end_session(conn: Connection, state: dict[str, bool]) -> None:
    """At exit: tell the server to free this session now (best effort, short timeout, no retry)."""
    if not state.get("used"):
        return
    quick = Connection(conn.host, conn.port, conn.token, conn.session, timeout=2.0, retry=0.0)
    try:
        quick.post(P.encode_requests([P.EndSession()], {}))
    except Exception:
        pass
    finally:
        quick.close()
        conn.close()


class RemoteDevice(Device):
    """`REMOTE`: the device served by `tgc serve` at `TGC_REMOTE` (or `--remote`), one session per instance.

    With several servers (`TGC_REMOTE=h1:p1,h2:p2`) `REMOTE:i` is the i-th (an index past them is a user error);
    with one, every `REMOTE:i` is a session of its own on it.

    Copies between devices (what a multi-device all-reduce calls): `supports_batch_copy` is True, and

    - `RemoteDevice.copy_batch([(src_dev, src_handle, src_offset, dst_dev, dst_handle, dst_offset, nbytes), ...],
      wait=False) -> int` copies byte ranges between buffers of REMOTE devices (any servers, any sessions)
      through this client: one request per source device reads all its ranges (the requests already queued
      there ride along), the sources are read in parallel, then the ranges are queued on each destination
      and go with its next batch (`wait=True` sends them now). So one ring step over n servers costs one round
      trip per server, in parallel, not one per chunk. Returns the bytes copied. The writes are ordered before
      anything later queued on the destination (a launch that reads them, a copy out, the next step's reads).
      Every range is read before any is written, and writes land in the batch's order. A copy within one
      device is done on its server with no round trip (`CopyRange`, queued) where no other copy of the batch
      writes into its ranges.
    - `RemoteDevice.copy_between(src_dev, src_handle, src_offset, dst_dev, dst_handle, dst_offset, nbytes)`:
      one such copy.
    - `RemoteDevice.read_batch([(dev, handle, offset, nbytes), ...]) -> [bytes, ...]`: many ranges of many
      devices, one request per device, in parallel (a reduce-scatter step that combines chunks on the host).
    - `dev.read_range(handle, offset, nbytes) -> bytes` and `dev.write_range(handle, offset, data)`: a range to
      and from host memory (for copies with a local device; the write is queued like the above); the same as
      `allocator.copyout_range(dest, handle, offset)` and `allocator.copyin_range(handle, offset, src)`.
    - `dev.copy_to(src_handle, dst_dev, dst_handle, nbytes, src_offset=0, dst_offset=0) -> bool`: a direct copy
      when `dst_dev` is REMOTE too (True), else False (stage it through the host).

    Handles are the ints `allocator.alloc` returns (a view from `allocator.offset` is a handle too). Ranges are
    checked here against the buffers' sizes (DeviceError) and again on the server, which refuses a range past a
    buffer's end. `bytes_read` and `bytes_written` count the bytes each device sent and received this way.
    A server that dies mid-copy gives one DeviceError naming it (never a hang: connections and answers have
    time limits, `TGC_REMOTE_RETRY` and `TGC_REMOTE_TIMEOUT`).
    """

    kind = "REMOTE"
    supports_batch_copy = True
    # copies between REMOTE devices go server to server; a collective step is one request per server
    runtime = RuntimeFeatures(direct_copies=True, batched_copies=True, batched_reduces=True)
    # attributes generic code may probe with getattr(dev, name, None): answered here, so that probing them never
    # asks the server (`__getattr__` fetches the served device's properties for any other name)
    share: Any = None
    _configured: str | None = None  # set by `configure` (the CLI's --remote)

    def __init__(self, index: int = 0, *, address: str | None = None, token: str | None = None,
                 timeout: float | None = None, retry: float | None = None):
        super().__init__(index)
        if address is None:
            addrs = self.addresses()
            if len(addrs) > 1 and index >= len(addrs):
                raise TgcError(f"no device 'REMOTE:{index}': {ENV_ADDRESS} names {len(addrs)} servers",
                               hint=f"use REMOTE:0 .. REMOTE:{len(addrs) - 1}, or add a server to {ENV_ADDRESS}")
        self.session = secrets.token_urlsafe(24)
        self.allocator = RemoteAllocator(self)
        self.round_trips = 0  # requests whose answer the client waited for
        self.posts_ahead = 0  # requests sent without waiting (a large copy in: `_send_ahead`), answered later
        self.bytes_read = self.bytes_written = 0  # bytes of ranges read and written by `copy_batch`
        self._address, self._token = address, token
        self._timeout, self._retry = timeout, retry
        self._lock = threading.RLock()
        self._queue: list[P.Request] = []
        self._blobs: dict[str, bytes] = {}
        self._queued_bytes = 0
        self._sizes: dict[int, int] = {}  # bytes of each buffer and view (to bound what a copy out may return)
        self._pending_launches = False
        self._ids = itertools.count(1)
        self._props: dict[str, Any] | None = None
        self._renderer: Any = None
        self._conn: Connection | None = None
        self._used = {"used": False}

    @property
    def name(self) -> str:
        """`REMOTE:i` wherever TGC_REMOTE names several servers (so DEBUG=2 and `tgc bench` tell REMOTE:0 from
        REMOTE:1 in a device list), `REMOTE` for the one server."""
        return f"REMOTE:{self.index}" if self.index or len(self.addresses()) > 1 else "REMOTE"

    @classmethod
    def configure(cls, address: str | None) -> None:
        """Use this server (`host:port`) instead of `TGC_REMOTE` for devices that connect from now on."""
        if address is not None:
            for part in address.split(","):  # a bad address is a user error now, not later
                if part.strip():
                    parse_address(part)
        cls._configured = address

    @classmethod
    def _address_text(cls) -> str | None:
        return cls._configured or os.environ.get(ENV_ADDRESS) or None

    @classmethod
    def addresses(cls) -> list[str]:
        """The servers named by `--remote` or `TGC_REMOTE` (a comma list), in order: `REMOTE:i` uses the i-th."""
        return list(_split_addresses(cls._address_text() or ""))

    @classmethod
    def probe(cls, index: int = 0) -> tuple[bool, str]:
        """Whether the server of `REMOTE:index` answers as a tgc server with this token (the first by default)."""
        addrs = cls.addresses()
        if not addrs:
            return False, f"{ENV_ADDRESS} is not set"
        try:
            host, port = parse_address(addrs[index if len(addrs) > 1 else 0])
        except TgcError as e:
            return False, e.msg
        except IndexError:
            return False, f"{ENV_ADDRESS} names {len(addrs)} servers"
        try:
            socket.create_connection((host, port), timeout=2.0).close()
        except OSError as e:
            return False, f"cannot reach {host}:{port}: {_reason(e)}"
        dev = cls(address=f"[{host}]:{port}" if ":" in host else f"{host}:{port}", timeout=5.0, retry=0.0)
        try:
            dev.properties  # noqa: B018 (checks the token and that it is a tgc server)
        except TgcError as e:
            return False, e.msg
        finally:
            dev.close()
        return True, ""

    # --- connection

    @property
    def conn_address(self) -> tuple[str, int]:
        """(host, port) of the server this device talks to."""
        text = self._address or self._address_text()
        if not text:
            raise DeviceError("the REMOTE device needs a server", kind="user",  # (a setting missing: exit 2)
                              hint=f"set {ENV_ADDRESS}=host:port, the address of a running `tgc serve`",
                              cli_hint=f"set {ENV_ADDRESS}=host:port or pass --remote host:port (see `tgc serve`)")
        addrs = [a for a in (t.strip() for t in text.split(",")) if a]
        if not addrs:
            raise DeviceError("the REMOTE device needs a server", hint=f"set {ENV_ADDRESS}=host:port", kind="user")
        if len(addrs) > 1 and self.index >= len(addrs):
            raise DeviceError(f"{self.name} needs a server {self.index}, but {ENV_ADDRESS} names {len(addrs)}",
                              kind="user")
        return parse_address(addrs[self.index] if len(addrs) > 1 else addrs[0])

    def _connection(self) -> Connection:
        if self._conn is None:
            host, port = self.conn_address
            token = self._token if self._token is not None else client_token(address=(host, port))
            timeout = self._timeout if self._timeout is not None else _env_float(ENV_TIMEOUT, DEFAULT_TIMEOUT)
            retry = self._retry if self._retry is not None else _env_float(ENV_RETRY, DEFAULT_RETRY)
            self._conn = Connection(host, port, token, self.session, timeout, retry)
            weakref.finalize(self, _end_session, self._conn, self._used)
        return self._conn

    def close(self) -> None:
        """Free this session on the server now (otherwise it is freed after the server's idle timeout)."""
        with self._lock:
            self._queue, self._blobs, self._queued_bytes = [], {}, 0
            if self._conn is not None:
                try:  # (what was sent ahead is done before the session ends)
                    self._conn.drain()
                except TgcError:
                    pass
                _end_session(self._conn, self._used)
                self._used["used"] = False

    # --- the queue

    def _new_id(self) -> int:
        with self._lock:
            return next(self._ids)

    def _enqueue(self, req: P.Request, blob: bytes | memoryview | None = None, digest: str | None = None) -> None:
        """Queue a request (with the blob it names, if any); flush first when the body would get too big."""
        with self._lock:
            if blob is not None:
                max_body = int(self.properties["max_body"])
                budget = max_body - min(BODY_SLACK, max_body // 4)
                if len(blob) > budget:
                    raise DeviceError(f"{len(blob)} bytes do not fit in a request to the REMOTE server "
                                      f"(its body limit is {max_body} bytes)")
                h = digest or P.blob_id(blob)  # an id a server gave for these bytes: the next one checks it
                req = P.CopyIn(req.buf, h) if type(req) is P.CopyIn else dataclasses.replace(req, datahash=h)
                if h not in self._blobs:
                    if self._queued_bytes + len(blob) > budget:
                        self.flush()
                    self._blobs[h] = blob
                    self._queued_bytes += len(blob)
            try:
                req.check()
            except P.ProtocolError as e:
                raise DeviceError(f"bad REMOTE request {type(req).__name__}: {e}") from None
            self._queue.append(req)
            if len(self._queue) >= MAX_QUEUE:
                self.flush()

    def _enqueue_free(self, req: P.Request) -> None:
        """Queue a free; never sends anything (it may run from a finalizer)."""
        if self._lock.acquire(timeout=1.0):
            try:
                self._queue.append(req)
            finally:
                self._lock.release()

    def _submit(self, req: P.Request, blob: bytes | None = None, sink: memoryview | None = None
                ) -> tuple[list[Any], dict[str, memoryview]]:
        """Queue `req` and flush: the results of the batch (`req`'s is last) and the response blobs. With a
        `sink` (for a CopyOut `req`), the answer's blob is received into it when it is the batch's only copy out
        (then `sink` itself is in the blobs)."""
        with self._lock:
            self._enqueue(req, blob)
            copies = sum(isinstance(r, (P.CopyOut, P.ReadRange)) for r in self._queue)
            return self._send(sink if copies == 1 else None)

    def flush(self) -> None:
        """Send everything queued now, and read the answers of requests sent ahead (their errors are raised here)."""
        with self._lock:
            if self._queue:
                self._send()
            elif self._conn is not None and self._conn.pending:
                self._conn.drain()

    def _send_ahead(self, req: P.Request, blob: memoryview) -> None:
        """Send what is queued and `req` (naming `blob`) now, without waiting for the answer (`Connection.send_ahead`):
        the blob is written from the caller's memory before this returns, so it is neither copied nor seen after
        the caller changes it. The answer is read before the next one; an error in it is raised then."""
        with self._lock:
            self._enqueue(req, blob)  # (may flush what was queued first, to stay within the body limit)
            reqs, blobs = self._queue, self._blobs
            self._queue, self._blobs, self._queued_bytes = [], {}, 0
            conn = self._connection()
            if len(conn.pending) >= MAX_AHEAD:
                conn.drain()
            self._used["used"] = True
            self.posts_ahead += 1
            conn.send_ahead(P.body_parts(blobs, P.to_text(reqs)), ANSWER_BASE + ANSWER_PER_REQUEST * len(reqs))
            if any(isinstance(r, (P.ProgramExec, P.GraphExec)) for r in reqs):
                self._pending_launches = True

    def _send(self, sink: memoryview | None = None) -> tuple[list[Any], dict[str, memoryview]]:
        reqs, blobs = self._queue, self._blobs
        self._queue, self._blobs, self._queued_bytes = [], {}, 0
        body = P.body_parts(blobs, P.to_text(reqs))
        conn = self._connection()
        self._used["used"] = True
        self.round_trips += 1
        limit = ANSWER_BASE + ANSWER_PER_REQUEST * len(reqs)
        pending = self._pending_launches  # launches not yet known to be finished once this batch is answered:
        for r in reqs:  # those after the last copy out/wait/sync
            t = type(r)
            if t is P.CopyOut:
                limit += 40 + self._sizes.get(r.buf, 0)
                pending = False
            elif t is P.GraphExec or t is P.ProgramExec:
                pending = not r.wait
            elif t is P.Synchronize:
                pending = False
            elif t is P.ReadRange:
                limit += 40 + r.size
            elif t in LISTINGS:
                limit += ANSWER_PER_LISTING
        prof = profile.active
        if prof is None:
            data = conn.post(body, limit, sink=sink)
        else:
            data = self._post_profiled(prof, conn, body, limit, reqs)
        streamed = data if isinstance(data, tuple) else None
        try:
            results, out_blobs = P.decode_results(data if streamed is None else streamed[0], verify=False,
                                                  max_text=limit, max_nodes=10_000 + 16 * len(reqs))
        except P.ProtocolError as e:
            raise DeviceError(f"REMOTE server {conn.address} sent a bad answer: {P.safe_text(e)}") from None
        if streamed is not None:
            out_blobs[streamed[1]] = streamed[2]
        if len(results) != len(reqs):
            raise DeviceError(f"REMOTE server {conn.address} answered {len(results)} of {len(reqs)} requests")
        self._pending_launches = pending
        return results, out_blobs

    def _post_profiled(self, prof: Any, conn: Connection, body: list[bytes | memoryview], limit: int,
                       reqs: list[P.Request]) -> bytes:
        """`conn.post` recorded in a profile trace: the round trip as a span of this device's client track, the
        server's own timing of the batch (its reply header) as spans of the server's track, placed in the middle
        of the round trip (the two clocks are not synchronized: the network time is split evenly before and
        after), and an arrow from the one to the other."""
        kinds: dict[str, int] = {}
        for r in reqs:
            kinds[type(r).__name__] = kinds.get(type(r).__name__, 0) + 1
        sent = sum(len(p) for p in body)
        st = time.perf_counter_ns()
        data = conn.post(body, limit, timing=True)
        end = time.perf_counter_ns()
        what = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in kinds.items())
        client = prof.span(profile.HOST, f"REMOTE client {conn.address} ({self.name})", f"POST {P.BATCH_PATH}",
                           st, end, "remote", {"requests": len(reqs), "kinds": what, "bytes_sent": sent,
                                               "bytes_received": len(data), "device": self.name})
        entries = P.parse_timing(conn.server_timing)
        if entries:
            server_us = max(s + d for _, _, s, d in entries)
            base = st + max(end - st - int(server_us * 1e3), 0) // 2
            track, thread = f"REMOTE server {conn.address}", f"requests ({self.name})"  # (one session's)
            batch = prof.span(track, thread, f"batch of {len(reqs)} request{'s' if len(reqs) != 1 else ''}", base,
                              base + int(server_us * 1e3), "remote",
                              {"session_device": self.name, "clock": "the server's, centred in the round trip"})
            for name, count, s_us, d_us in entries:
                at = base + int(s_us * 1e3)
                prof.span(track, thread, name if count == 1 else f"{name} x{count}", at,
                          min(at + int(d_us * 1e3), base + int(server_us * 1e3)), "remote", {"count": count})
            prof.flow(client, batch, "REMOTE round trip")
        return data

    def synchronize(self) -> None:
        """Send what is queued and wait until the server's device has finished it."""
        with self._lock:
            if self._queue or self._pending_launches:
                self._submit(P.Synchronize())
            else:
                self.flush()  # (answers still owed for requests sent ahead: read, and their errors raised)

    # --- copies of byte ranges (see the class docstring)

    def _check_range(self, handle: int, offset: int, nbytes: int, what: str) -> None:
        if type(handle) is not int or type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0:
            raise DeviceError(f"a REMOTE {what} range needs integer handle, offset >= 0 and size >= 0, got "
                              f"{handle!r}, {offset!r}, {nbytes!r}")
        size = self._sizes.get(handle)
        if size is None:
            raise DeviceError(f"{self.name} has no buffer {handle} (freed, or from another device)")
        if offset + nbytes > size:
            raise DeviceError(f"a {what} range of {nbytes} bytes at offset {offset} runs past buffer {handle} of "
                              f"{size} bytes on {self.name}")

    def _read_ranges(self, ranges: Sequence[tuple[int, int, int]]) -> list[tuple[str, memoryview]]:
        """The (digest, bytes) of `(handle, offset, nbytes)` ranges: one request per body's worth (usually one),
        with what is already queued."""
        out: list[tuple[str, memoryview]] = []
        with self._lock:
            budget = max(1, int(self.properties["max_body"]) - min(BODY_SLACK, int(self.properties["max_body"]) // 4))
            i = 0
            while i < len(ranges):
                batch: list[P.ReadRange] = []
                total = 0
                while i < len(ranges) and len(batch) < MAX_QUEUE and (not batch or total + ranges[i][2] <= budget):
                    handle, offset, nbytes = ranges[i]
                    batch.append(P.ReadRange(buf=handle, offset=offset, size=nbytes))
                    total += nbytes
                    i += 1
                self._queue.extend(batch)
                results, blobs = self._send()
                for req, h in zip(batch, results[len(results) - len(batch):]):
                    data = blobs.get(h) if isinstance(h, str) else None
                    if data is None or len(data) != req.size:
                        raise DeviceError(f"REMOTE server {self._connection().address} sent "
                                          f"{'no' if data is None else len(data)} bytes for a range of {req.size}")
                    out.append((h, data))
                self.bytes_read += total
        return out

    def read_range(self, handle: int, offset: int, nbytes: int) -> bytes:
        """`nbytes` bytes of buffer `handle` from byte `offset` (one round trip, with what is queued)."""
        handle, offset, nbytes = _index(handle), _index(offset), _index(nbytes)
        self._check_range(handle, offset, nbytes, "read")
        return bytes(self._read_ranges([(handle, offset, nbytes)])[0][1])

    def write_range(self, handle: int, offset: int, data: bytes | memoryview) -> None:
        """Queue writing `data` into buffer `handle` from byte `offset` (sent with the next batch)."""
        data, handle, offset = bytes(data), _index(handle), _index(offset)
        self._check_range(handle, offset, len(data), "write")
        if data:
            self._enqueue(P.WriteRange(buf=handle, offset=offset, datahash=""), data)
            self.bytes_written += len(data)

    @staticmethod
    def copy_batch(copies: Sequence[Any], *step: Any, wait: bool = False) -> int | bool:
        """Copy byte ranges between REMOTE buffers: `(src_dev, src_handle, src_offset, dst_dev, dst_handle,
        dst_offset, nbytes)` each. One request per source device (in parallel), then the writes are queued on each
        destination (sent now, in parallel, with `wait`). Returns the bytes copied. See the class docstring.

        Also called as the multi-device engine's step hook, `copy_batch(devices, src_handles, dst_handles, moves)`
        (moves with `src`, `dst` list positions, `src_offset`, `dst_offset`, `nbytes`): the same copies; True."""
        if step:
            devices, (src_handles, dst_handles, moves) = copies, step
            RemoteDevice.copy_batch([(devices[m.src], src_handles[m.src], m.src_offset, devices[m.dst],
                                      dst_handles[m.dst], m.dst_offset, m.nbytes) for m in moves if m.nbytes > 0],
                                    wait=wait)
            return True
        items = []
        for c in copies:
            if len(c) != 7:
                raise DeviceError(f"a copy is (src_dev, src_handle, src_offset, dst_dev, dst_handle, dst_offset, "
                                  f"nbytes), got {len(c)} items")
            src, sh, so, dst, dh, do, n = c
            sh, so, dh, do, n = (_index(v) for v in (sh, so, dh, do, n))
            items.append((src, sh, so, dst, dh, do, n))
            for dev in (src, dst):
                if not isinstance(dev, RemoteDevice):
                    raise DeviceError(f"copy_batch copies between REMOTE devices, not {getattr(dev, 'name', dev)}")
            src._check_range(sh, so, n, "source")
            dst._check_range(dh, do, n, "destination")
        # a copy within one device is done there (queued, no round trip) unless another copy of the batch writes
        # where it reads or writes (then the batch's order holds: every read before every write, writes in order)
        def touched(i: int, dev: Any, handle: int, lo: int, hi: int) -> bool:
            return any(j != i and c[3] is dev and c[4] == handle and c[5] < hi and lo < c[5] + c[6]
                       for j, c in enumerate(items) if c[6])

        local = [c[0] is c[3] and c[6] > 0 and not touched(i, c[0], c[1], c[2], c[2] + c[6])
                 and not touched(i, c[3], c[4], c[5], c[5] + c[6]) for i, c in enumerate(items)]
        data = RemoteDevice._read_batch([(c[0], c[1], c[2], 0 if here else c[6]) for c, here in zip(items, local)])
        for c, here in zip(items, local):  # before the writes: they must not see what the writes bring
            if here:
                c[0]._enqueue(P.CopyRange(buf=c[1], offset=c[2], dest_buf=c[4], dest_offset=c[5], size=c[6]))
        dsts: list[RemoteDevice] = []
        for i, (_, _, _, dst, dh, do, n) in enumerate(items):
            if n and not local[i]:
                dst._enqueue(P.WriteRange(buf=dh, offset=do, datahash=""), data[i][1], digest=data[i][0])
                dst.bytes_written += n
                if dst not in dsts:
                    dsts.append(dst)
        if wait:
            _each(lambda d: d.flush(), dsts)
        return sum(c[6] for c in items)

    @staticmethod
    def read_batch(ranges: Sequence[tuple[Any, int, int, int]]) -> list[bytes]:
        """The bytes of `(dev, handle, offset, nbytes)` ranges on REMOTE devices: one request per device (with what
        is queued there), the devices in parallel. For a step that reads many chunks to combine them on the host
        (a ring's reduce-scatter); write the results back with `write_range` (queued)."""
        items = []
        for r in ranges:
            if len(r) != 4 or not isinstance(r[0], RemoteDevice):
                raise DeviceError(f"read_batch takes (REMOTE device, handle, offset, nbytes) ranges, got {r!r}")
            dev, handle, offset, nbytes = r[0], _index(r[1]), _index(r[2]), _index(r[3])
            dev._check_range(handle, offset, nbytes, "read")
            items.append((dev, handle, offset, nbytes))
        return [bytes(d) for _, d in RemoteDevice._read_batch(items)]

    @staticmethod
    def _read_batch(items: list[tuple[Any, int, int, int]]) -> list[tuple[str, Any]]:
        """The (digest, bytes) of checked `(dev, handle, offset, nbytes)` ranges, one request per device, in
        parallel."""
        by_dev: dict[RemoteDevice, list[int]] = {}
        for i, item in enumerate(items):
            if item[3]:
                by_dev.setdefault(item[0], []).append(i)
        data: list[tuple[str, Any]] = [("", b"")] * len(items)

        def read(dev: RemoteDevice) -> None:
            idx = by_dev[dev]
            for i, chunk in zip(idx, dev._read_ranges([items[i][1:] for i in idx])):
                data[i] = chunk

        _each(read, list(by_dev))
        return data

    @staticmethod
    def reduce_batch(devices: Sequence[Any], handles: Sequence[int], moves: Sequence[Any], op: Any,
                     dtype: Any) -> bool:
        """The multi-device engine's reduce-scatter step hook: for every move, the destination's chunk becomes
        `op(its chunk, the source's chunk)`. Every chunk of the step is read in one request per device (in
        parallel), combined on this host, and written back queued (it goes with the next step's reads). False
        (the engine then does it chunk by chunk) where the engine's combine is not there to call."""
        try:
            from tgc.engine.multi import _combine
        except ImportError:
            return False
        import numpy as np
        live = [m for m in moves if m.nbytes > 0]
        data = RemoteDevice.read_batch([(devices[m.src], handles[m.src], m.src_offset, m.nbytes) for m in live] +
                                       [(devices[m.dst], handles[m.dst], m.dst_offset, m.nbytes) for m in live])
        for i, m in enumerate(live):
            theirs, mine = np.frombuffer(data[i], np.uint8), np.frombuffer(data[len(live) + i], np.uint8)
            devices[m.dst].write_range(handles[m.dst], m.dst_offset, _combine(op, dtype, mine, theirs).tobytes())
        return True

    def copy_to(self, src_handle: int, dst_dev: Any, dst_handle: int, nbytes: int, src_offset: int = 0,
                dst_offset: int = 0) -> bool:
        """A direct copy to another REMOTE device (`copy_between`; True), or False for any other device (the
        caller then stages through host memory, with `allocator.copyout_range`/`copyin_range`)."""
        if not isinstance(dst_dev, RemoteDevice):
            return False
        RemoteDevice.copy_between(self, src_handle, src_offset, dst_dev, dst_handle, dst_offset, nbytes)
        return True

    @staticmethod
    def copy_between(src_dev: Any, src_handle: int, src_offset: int, dst_dev: Any, dst_handle: int,
                     dst_offset: int, nbytes: int, wait: bool = False) -> int:
        """One copy of `nbytes` from a REMOTE buffer to another (see `copy_batch`)."""
        return RemoteDevice.copy_batch([(src_dev, src_handle, src_offset, dst_dev, dst_handle, dst_offset, nbytes)],
                                       wait=wait)

    # --- the served device's face

    @property
    def properties(self) -> dict[str, Any]:
        """The served device's facts (fetched once): kind, device, launch_style, compiler, limits, info."""
        with self._lock:
            if self._props is None:
                results, _ = self._submit(P.GetProperties())
                self._props = checked_properties(results[-1], self._connection().address)
                if "request_time" in self._props:  # (the server closes a connection idle that long)
                    self._connection().reuse_within(float(self._props["request_time"]))
            return self._props

    @property
    def served(self) -> str:
        """The served device's name, e.g. `CPU`."""
        return str(self.properties["device"])

    @property
    def launch_style(self) -> str:  # type: ignore[override]
        return str(self.properties["launch_style"])

    @property
    def renderer(self) -> Any:  # type: ignore[override]
        if self._renderer is None:
            self._renderer = renderer_for(str(self.properties["kind"]))
        return self._renderer

    @property
    def compiler(self) -> Compiler | None:  # type: ignore[override]
        p = self.properties
        if p.get("compiler") is None:
            return None
        return RemoteCompiler(self, str(p["compiler"]), str(p.get("compiler_version")))

    @property
    def compile_error(self) -> str | None:
        p = self.properties
        if p.get("compiler") is None:
            return f"the REMOTE server's {p['device']} cannot compile: {p.get('compile_error')}"
        return None

    def program(self, name: str, lib: bytes) -> RemoteProgram:
        return RemoteProgram(self, name, lib)

    def graph(self, launches: Sequence[tuple]) -> RemoteGraph:
        """A graph of `(program, bufs, global_size, local_size, vals)` launches, run with one request per call."""
        return RemoteGraph(self, launches)

    @property
    def cores(self) -> int:  # type: ignore[override]
        """The served device's threads per launch (what the optimizer splits a CPU kernel across)."""
        attrs = self.properties.get("attrs")
        value = attrs.get("cores", 1) if isinstance(attrs, dict) else 1
        return value if isinstance(value, int) and value > 0 else 1

    def served_fact(self, name: str) -> bool | int | float | str | None:
        """One of the served device's other plain facts (`has_fp16`, ...), or None where it states none. (A
        REMOTE device has exactly the attributes its class defines: nothing unknown is forwarded.)"""
        attrs = self.properties.get("attrs")
        value = attrs.get(name) if isinstance(attrs, dict) and not name.startswith("_") else None
        return value if type(value) in (bool, int, float, str) else None

    def info(self) -> dict[str, Any]:
        """The served device's facts, plus `serves` (its name) and `server` (host:port)."""
        p = self.properties
        host, port = self.conn_address
        out: dict[str, Any] = {"serves": p["device"], "server": f"{host}:{port}"}
        if isinstance(p.get("info"), dict):  # (not the served device's own device lists: CPU:0,CPU:1 on the server
            # are not what a client's REMOTE:i names, so `tgc devices` would print a wrong note under REMOTE)
            out.update({k: v for k, v in p["info"].items() if k not in out and k != "device_list"})
        out.setdefault("renderer", p.get("renderer"))
        out.setdefault("compiler", p.get("compiler"))
        return out


def _index(value: Any) -> Any:
    """An integer-like value (a numpy integer too) as an int; anything else as is (the range check refuses it)."""
    try:
        return operator.index(value)
    except TypeError:
        return value


def _each(fn: Any, devices: list[RemoteDevice]) -> None:
    """`fn(dev)` for each device, in parallel threads when there are several (each device has its own connection);
    the first error is raised after all have finished."""
    if len(devices) <= 1:
        for d in devices:
            fn(d)
        return
    errors: list[BaseException | None] = [None] * len(devices)

    def run(i: int) -> None:
        try:
            fn(devices[i])
        except BaseException as e:  # handed to the caller's thread below
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(devices))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first


_KIND = re.compile(r"[A-Z][A-Z0-9_]{0,31}")
LAUNCH_STYLES = ("cpu", "gpu")


def checked_properties(raw: Any, address: str) -> dict[str, Any]:
    """The device properties a server sent, checked field by field (a DeviceError naming the first bad
    one), with every text made safe to print (`protocol.safe_text`)."""
    def bad(what: str) -> DeviceError:
        return DeviceError(f"REMOTE server {address} sent malformed device properties: {what}")

    if not isinstance(raw, dict):
        raise bad("not a dict")
    p = dict(raw)
    kind = p.get("kind")
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        raise bad(f"kind {P.to_short(kind)} is not a device kind")
    if kind == "REMOTE":
        raise DeviceError(f"REMOTE server {address} says it serves REMOTE itself; a server must serve a local "
                          "device", hint="point TGC_REMOTE at a server of a local device (CPU, CUDA, ...)",
                          cli_hint="point TGC_REMOTE at a `tgc serve` of a real device (e.g. -d CPU)")
    if p.get("launch_style") not in LAUNCH_STYLES:
        raise bad(f"launch_style {P.to_short(p.get('launch_style'))} is not one of {', '.join(LAUNCH_STYLES)}")
    for name, least in (("max_body", 1), ("max_buffer", 0), ("max_session_memory", 0)):
        value = p.get(name, 0 if name == "max_session_memory" else None)
        if type(value) is not int or value < least:
            raise bad(f"{name} {P.to_short(value)} is not an integer >= {least}")
    for name in ("request_time", "idle_timeout"):
        if name in p and (type(p[name]) not in (int, float) or not p[name] >= 0):
            raise bad(f"{name} {P.to_short(p[name])} is not a number of seconds")
    if not isinstance(p.get("device"), str):
        raise bad(f"device {P.to_short(p.get('device'))} is not a name")
    p["device"] = P.safe_text(p["device"], multiline=False, limit=200)
    for name in ("renderer", "compiler", "compiler_version", "compile_error", "instance"):
        if p.get(name) is not None and not isinstance(p[name], str):
            raise bad(f"{name} {P.to_short(p[name])} is not text")
        if p.get(name) is not None:
            p[name] = P.safe_text(p[name], multiline=name == "compile_error", limit=2000)
    p["offset"] = p.get("offset") is True
    info, attrs = p.get("info", {}), p.get("attrs", {})
    if not isinstance(info, dict) or not isinstance(attrs, dict):
        raise bad("info and attrs must be dicts")
    p["info"] = {P.safe_text(k, False, 200): _safe_value(v) for k, v in list(info.items())[:256]}
    p["attrs"] = {k: P.safe_text(v, False, 2000) if isinstance(v, str) else v for k, v in list(attrs.items())[:256]
                  if isinstance(k, str) and k.isidentifier() and type(v) in (bool, int, float, str)}
    return p


def _safe_value(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return P.safe_text(value, multiline=False, limit=2000)
    if isinstance(value, dict) and depth < 4:
        return {P.safe_text(k, False, 200): _safe_value(v, depth + 1) for k, v in list(value.items())[:256]}
    if isinstance(value, (list, tuple)) and depth < 4:
        return [_safe_value(v, depth + 1) for v in value[:256]]
    if value is None or type(value) in (bool, int, float):
        return value
    return P.safe_text(repr(value), multiline=False, limit=200)


def renderer_for(kind: str) -> Any:
    """The renderer of a device kind, built here: the class attribute, else the local device's."""
    try:
        cls = device_class(kind)
    except Exception as e:
        raise DeviceError(f"cannot load the {kind} backend here to render for the REMOTE server: {e}") from None
    r = cls.__dict__.get("renderer") or getattr(cls, "renderer", None)
    if r is not None and not isinstance(r, property):
        return r() if isinstance(r, type) else r
    try:
        return get_device(kind).renderer
    except Exception as e:
        raise DeviceError(f"cannot build the {kind} renderer here for the REMOTE server: {e}") from None
