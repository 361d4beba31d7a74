"""The wire format of the REMOTE device: one `POST /batch` per round trip.

A body (request or response) is

    b"TGC1"                          4 bytes, the format's magic
    blob count                       4 bytes, big-endian
    count x (blob id                 32 bytes
             length                  8 bytes, big-endian
             bytes)                  `length` bytes
    text                             the rest, UTF-8

A blob shorter than `LARGE_BLOB` (4 KiB) is content-addressed: its id is its sha256, which the receiver
checks, and each distinct one (small payloads, most kernel binaries) travels once per body. A larger blob
(a buffer's payload) is named by 32 random bytes its sender picks (`blob_id`) and is not hashed by
either side: sha256 runs at 0.1-0.5 GB/s on a loaded CPU, far below the link (the data path in
docs/DESIGN.md); TCP checks the bytes, the token authenticates the peer, and nothing trusts a large blob's
id (the server hashes a larger program binary itself before it looks up what it knows of it, and reuses
the checked id of a smaller one: each blob is hashed at most once on each side). Requests name a blob
by its id in hex. A request body's text is a list of request calls, e.g.
`[BufferAlloc(buf=1, size=64), CopyIn(buf=1, datahash='ab12...')]`; a response body's text is the
list of their results (None, numbers, strings, lists, dicts). Both are parsed by `parse_text`, which
walks Python's `ast` and allows only literals, calls of the classes it is given (keyword arguments
only, type-checked) and the few attributes in `ATTRIBUTES`: never pickle, never eval.

Ids (`buf`, `prog`, `graph`) are chosen by the client and live in its session only.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import math
import os
import re
import secrets
import socket
import sys
import threading
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar, Union

from tgc.env import REMOTE_DEFAULT_PORT
from tgc.errors import TgcError

MAGIC = b"TGC1"
DEFAULT_PORT = REMOTE_DEFAULT_PORT
SESSION_HEADER = "X-Tgc-Session"
ERROR_HEADER = "X-Tgc-Error"  # the error's kind: auth, protocol, limit, session, compile, device, busy
BATCH_PATH = "/batch"
# Profile traces (tgc/profile.py): a client that records one sends `X-Tgc-Profile: 1`, and the server answers
# with its own timing of the batch in `X-Tgc-Server-Timing` (`timing_header` / `parse_timing`): plain text in
# a header, the body's format unchanged.
PROFILE_HEADER = "X-Tgc-Profile"
TIMING_HEADER = "X-Tgc-Server-Timing"
MAX_TIMINGS = 1024  # entries in one timing header (the rest are merged into the last one)
_TIMING_ENTRY = re.compile(r"([A-Za-z][A-Za-z0-9_]{0,39});([0-9]{1,6});([0-9]{1,15}(?:\.[0-9]{1,3})?);"
                           r"([0-9]{1,15}(?:\.[0-9]{1,3})?)")

INT_MIN, INT_MAX = -(2**63), 2**63 - 1
MAX_DEPTH = 32  # nesting of lists/calls in request text
MAX_NODES = 200_000  # syntax nodes in one request text (counted roughly before parsing, exactly after)
MAX_TEXT = 16 << 20  # characters of one request text (kernel sources included), checked before parsing
MAX_BLOBS = 1 << 16  # blobs in one body
LARGE_BLOB = 1 << 12  # bytes from which a blob is named by a random id, not by its (checked) sha256

# The only attribute names request text may use, and the values they stand for.
ATTRIBUTES: dict[str, float] = {"math.inf": math.inf, "math.nan": math.nan}


_SESSION = re.compile(r"[A-Za-z0-9_-]{16,128}")


def valid_session(session: str | None) -> bool:
    """A session id is 16 to 128 characters of `[A-Za-z0-9_-]` (the client picks a random one)."""
    return type(session) is str and _SESSION.fullmatch(session) is not None


_TOKEN_CHARS = frozenset(chr(c) for c in range(0x21, 0x7f))  # printable ASCII without spaces


def token_problem(token: str) -> str | None:
    """Why `token` cannot go in an `Authorization` header (None when it can): it must be one line of
    printable ASCII without spaces."""
    if not token:
        return "it is empty"
    if "\n" in token or "\r" in token:
        return "it holds more than one line"
    bad = next((c for c in token if c not in _TOKEN_CHARS), None)
    if bad is not None:
        return f"it holds the character {bad!r}; use printable ASCII without spaces"
    return None


def read_token_text(path: str) -> str:
    """The text of a token file (its first 64 KiB) without a leading UTF-8 byte-order mark (editors on Windows
    write one; it would become part of the first line's address or token); TgcError (exit 2) when it cannot be
    read or is not UTF-8."""
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 16)
    except OSError as e:
        raise TgcError(f"cannot read the token file '{path}': {e.strerror or e}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TgcError(f"the token file '{path}' is not UTF-8 text") from None


def read_token_file(path: str, text: str | None = None) -> str:
    """The token in the file `path` (surrounding whitespace dropped; `text`: the file's text, already read);
    TgcError (exit 2) with the reason when it cannot be read or is not one line of printable ASCII."""
    token = (read_token_text(path) if text is None else text).strip()
    if not token:
        raise TgcError(f"the token file '{path}' is empty")
    why = token_problem(token)
    if why is not None:
        raise TgcError(f"the token in '{path}' cannot be used: {why}")
    return token


_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def safe_text(text: Any, multiline: bool = True, limit: int | None = 4000) -> str:
    """What a server said, safe to print: control characters (terminal escapes) and bidi overrides written
    as `\\xNN`, newlines too unless `multiline`, and cut to `limit` characters."""
    text = text if isinstance(text, str) else str(text)
    if limit is not None and len(text) > limit:
        text = text[:limit] + "..."
    out = _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}",
                      text)
    return out if multiline else out.replace("\n", "\\n")


class ProtocolError(ValueError):
    """A body or request text that does not follow the format (the server answers 400)."""


def digest(data: bytes | memoryview) -> str:
    """The hex sha256 of `data` (the id of a blob shorter than `LARGE_BLOB`)."""
    return hashlib.sha256(data).hexdigest()


def blob_id(data: bytes | bytearray | memoryview) -> str:
    """The id that names `data` in a body: its sha256 below `LARGE_BLOB` bytes, else a fresh random id (so
    two large blobs in one body are never merged, and no payload is hashed)."""
    if len(data) < LARGE_BLOB:
        return hashlib.sha256(data).hexdigest()
    return secrets.token_hex(32)


# ---------------------------------------------------------------------------------------------------------------------
# requests


def _check_id(value: int, what: str) -> None:
    if value < 0:
        raise ProtocolError(f"{what} must be >= 0, got {value}")


_HASH = re.compile(r"[0-9a-f]{64}")


def _check_hash(value: str) -> None:
    if not _HASH.fullmatch(value):
        raise ProtocolError(f"datahash must be 64 lowercase hex digits, got {value[:80]!r}")


def _check_launch(global_size: tuple[int, ...], local_size: tuple[int, ...] | None) -> None:
    for what, size in (("global_size", global_size), ("local_size", local_size)):
        if size is None:
            continue
        if not 1 <= len(size) <= 3 or any(not 1 <= s <= 2**31 - 1 for s in size):
            raise ProtocolError(f"{what} must be 1 to 3 sizes in [1, 2**31), got {size}")


@dataclass(frozen=True)
class Request:
    """One step of a batch. `check` rejects out-of-range values (types are checked by `build`): the fields named in
    `ids` must be >= 0 and a `datahash` field must name a blob (a subclass adds what else it checks)."""

    ids: ClassVar[tuple[str, ...]] = ()

    def check(self) -> None:
        for name in self.ids:
            _check_id(getattr(self, name), name)
        if "datahash" in self.__dataclass_fields__:
            _check_hash(self.datahash)  # type: ignore[attr-defined]

    def blob(self) -> str | None:
        """The hash of the blob this request names (its `datahash` field), or None for a request without one."""
        return self.datahash if "datahash" in self.__dataclass_fields__ else None  # type: ignore[attr-defined]


@dataclass(frozen=True)
class GetProperties(Request):
    """-> dict: the served device's kind, launch style, compiler, limits and `info()`."""


@dataclass(frozen=True)
class BufferAlloc(Request):
    ids = ("buf", "size")
    buf: int
    size: int


@dataclass(frozen=True)
class BufferFree(Request):
    buf: int


@dataclass(frozen=True)
class BufferOffset(Request):
    """A view `sub` of `size` bytes at `offset` into `buf` (no copy; freed with its parent)."""

    ids = ("buf", "size", "offset", "sub")
    buf: int
    size: int
    offset: int
    sub: int


@dataclass(frozen=True)
class CopyIn(Request):
    """Fill `buf` with the blob `datahash` (exactly the buffer's size)."""

    buf: int
    datahash: str


@dataclass(frozen=True)
class CopyOut(Request):
    """-> the hash of a response blob holding the buffer's bytes."""

    buf: int


@dataclass(frozen=True)
class ReadRange(Request):
    """-> the hash of a response blob holding `size` bytes of `buf` from byte `offset` (a chunk of a buffer, for
    copies between servers through the client; the server refuses a range past the buffer's end)."""

    buf: int
    offset: int
    size: int

    def check(self) -> None:
        for name in ("buf", "offset", "size"):
            _check_id(getattr(self, name), name)


@dataclass(frozen=True)
class WriteRange(Request):
    """Write the blob `datahash` into `buf` from byte `offset` (the server refuses a range past the buffer's
    end)."""

    buf: int
    offset: int
    datahash: str

    def check(self) -> None:
        _check_id(self.buf, "buf")
        _check_id(self.offset, "offset")
        _check_hash(self.datahash)


@dataclass(frozen=True)
class CopyRange(Request):
    """Copy `size` bytes of `buf` from `offset` into `dest_buf` of the same session from `dest_offset` (a copy
    within one device, with no round trip; both ranges checked by the server)."""

    buf: int
    offset: int
    dest_buf: int
    dest_offset: int
    size: int

    def check(self) -> None:
        for name in ("buf", "offset", "dest_buf", "dest_offset", "size"):
            _check_id(getattr(self, name), name)


@dataclass(frozen=True)
class Transfer(Request):
    """Copy `buf` into buffer `dest_buf` of the session `dest_session` (whose id the client must know)."""

    buf: int
    dest_session: str
    dest_buf: int

    def check(self) -> None:
        if not valid_session(self.dest_session):
            raise ProtocolError("dest_session is not a session id")


@dataclass(frozen=True)
class Disassemble(Request):
    """-> the compiler's assembly listing of the blob `datahash` (a binary)."""

    datahash: str


@dataclass(frozen=True)
class Assembly(Request):
    """-> the compiler's assembly listing for the source `src`."""

    src: str


@dataclass(frozen=True)
class Compile(Request):
    """-> the hash of a response blob holding the binary, or the compiler's message as a `compile` error."""

    src: str


@dataclass(frozen=True)
class ProgramAlloc(Request):
    ids = ("prog",)
    prog: int
    name: str
    datahash: str


@dataclass(frozen=True)
class ProgramFree(Request):
    prog: int


@dataclass(frozen=True)
class ProgramExec(Request):
    """Launch `prog` on buffers `bufs`. -> the kernel's time in seconds with `wait=True`, else None."""

    prog: int
    bufs: tuple[int, ...]
    global_size: tuple[int, ...] = (1, 1, 1)
    local_size: tuple[int, ...] | None = None
    vals: tuple[int, ...] = ()
    wait: bool = False

    def check(self) -> None:
        _check_launch(self.global_size, self.local_size)


@dataclass(frozen=True)
class GraphKernel:
    """One launch inside a graph (a value, not a request)."""

    prog: int
    bufs: tuple[int, ...]
    global_size: tuple[int, ...] = (1, 1, 1)
    local_size: tuple[int, ...] | None = None
    vals: tuple[int, ...] = ()

    def check(self) -> None:
        _check_launch(self.global_size, self.local_size)


@dataclass(frozen=True)
class GraphAlloc(Request):
    """A fixed list of launches that `GraphExec` runs in order with one request."""

    ids = ("graph",)
    graph: int
    kernels: tuple[GraphKernel, ...]


@dataclass(frozen=True)
class GraphExec(Request):
    """-> the total time in seconds with `wait=True`, else None."""

    graph: int
    wait: bool = False


@dataclass(frozen=True)
class GraphFree(Request):
    graph: int


@dataclass(frozen=True)
class Synchronize(Request):
    """Wait until the device has finished all work of this session."""


@dataclass(frozen=True)
class EndSession(Request):
    """Free everything the session holds (a client closing politely)."""


REQUESTS: dict[str, type] = {cls.__name__: cls for cls in (
    GetProperties, BufferAlloc, BufferFree, BufferOffset, CopyIn, CopyOut, ReadRange, WriteRange, CopyRange, Transfer,
    Compile, Disassemble, Assembly, ProgramAlloc, ProgramFree, ProgramExec, GraphKernel, GraphAlloc, GraphExec,
    GraphFree, Synchronize, EndSession)}


# ---------------------------------------------------------------------------------------------------------------------
# bodies: blobs + text


def body_parts(blobs: Mapping[str, bytes | memoryview], text: str) -> list[bytes | memoryview]:
    """A body as a list of pieces whose concatenation is the body (big blobs are not copied)."""
    parts: list[bytes | memoryview] = []
    head = MAGIC + len(blobs).to_bytes(4, "big")
    for h, data in blobs.items():
        head += bytes.fromhex(h) + len(data).to_bytes(8, "big")
        if len(data) < LARGE_BLOB:  # (small: copied into the header piece, one piece fewer to send)
            head += data
        else:
            parts += [head, data]
            head = b""
    parts.append(head + text.encode("utf-8"))
    return parts


# Socket buffers. The receive buffer (SO_RCVBUF) is fixed at `SOCKET_BUFFER`, not autotuned: on loopback the
# kernel's autotuning grows it to megabytes. The send buffer (SO_SNDBUF) bounds how far a sender runs ahead of its
# receiver, and is sized to the connection's bandwidth-delay product (`send_buffer` of the least round trip the
# kernel has seen, set again before each large write: `retune_send`): on a short path (loopback, up to ~30 us)
# `SEND_BUFFER_MIN`, so the receiver copies each piece out while it is still in the caches (a 4 MiB copy in and out
# over loopback took ~1.0 ms of CPU a side at 256 KiB against ~2.0 ms at 1 MiB, and less wall time); on a longer
# one enough to keep a `LINK_RATE` link busy, and past `SEND_BUFFER_MAX` the kernel's autotuning.
SOCKET_BUFFER = 1 << 20
SEND_BUFFER_MIN = 256 << 10
SEND_BUFFER_MAX = 4 << 20
LINK_RATE = 12.5e9  # bytes per second: 100 Gbit/s, the fastest link issue 27 names
_TCP_INFO_RTT = 68  # offset of `tcpi_rtt` (smoothed round trip, microseconds) in Linux's `struct tcp_info`
_TCP_INFO_MIN_RTT = 148  # offset of `tcpi_min_rtt` (the least round trip seen, microseconds; Linux 4.6 on)


def send_buffer(rtt_us: int | None) -> int | None:
    """The SO_SNDBUF to set for a connection whose least round trip is `rtt_us` microseconds (None: unknown):
    `LINK_RATE` times the round trip, over 1.5 (Linux doubles the size set, and about 3/4 of the buffer holds
    payload), rounded up to 64 KiB, at least `SEND_BUFFER_MIN`; None (leave it to the kernel's autotuning) past
    `SEND_BUFFER_MAX`. An unknown round trip gets `SOCKET_BUFFER`."""
    if rtt_us is None:
        return SOCKET_BUFFER
    need = -(-int(LINK_RATE * rtt_us / 1e6 / 1.5) // (64 << 10)) * (64 << 10)
    return None if need > SEND_BUFFER_MAX else max(SEND_BUFFER_MIN, need)


def round_trip_us(sock: socket.socket) -> int | None:
    """The least round-trip time the kernel has seen on a connected TCP socket, in microseconds (Linux's
    `tcpi_min_rtt`; on a fresh connection its handshake's; the smoothed `tcpi_rtt` on kernels without it): the
    path's own delay, not the time a busy receiver took to read (which the smoothed one grows with: 109 us against
    a least 2 us after 50 loopback transfers of 300 KB here). None where not available, and off Linux (other systems
    lay `struct tcp_info` out differently)."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "TCP_INFO"):  # (the offsets are Linux's)
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except OSError:
        return None
    for at in (_TCP_INFO_MIN_RTT, _TCP_INFO_RTT):
        if len(info) >= at + 4:
            rtt = int.from_bytes(info[at:at + 4], sys.byteorder)
            if 0 < rtt < 0xFFFFFFFF:  # (no sample yet: 0 or ~0)
                return rtt
    return None


@cache
def most_send_buffer() -> int | None:
    """The largest SO_SNDBUF a process may set (Linux `net.core.wmem_max`; None where not known). A larger size is
    cut to it silently, while autotuning may still grow an unset buffer up to `net.ipv4.tcp_wmem`'s maximum."""
    try:
        with open("/proc/sys/net/core/wmem_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _send_size(sock: socket.socket) -> tuple[int | None, int | None]:
    """(the SO_SNDBUF to set for `sock`'s round trip so far or None to leave it to autotuning, the round trip)."""
    rtt = round_trip_us(sock)
    send = send_buffer(rtt)
    most = most_send_buffer()
    if send is not None and most is not None and send > max(most, SEND_BUFFER_MIN):
        send = None
    return send, rtt


def tune_socket(sock: socket.socket) -> None:
    """Set a connected socket's buffers: receive `SOCKET_BUFFER`, send `send_buffer` of its round trip (left to
    autotuning where that is more than `most_send_buffer` allows above `SEND_BUFFER_MIN`; each ignored where the
    system refuses). `send_all` sets the send buffer again before a large write (`retune_send`)."""
    if SOCKET_BUFFER <= 0:
        return
    send, _ = _send_size(sock)
    for opt, size in ((socket.SO_SNDBUF, send), (socket.SO_RCVBUF, SOCKET_BUFFER)):
        if size is None:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, size)
        except OSError:
            pass


def retune_send(sock: socket.socket) -> None:
    """Set `sock`'s send buffer again for the least round trip seen so far, where that asks for another size than the
    buffer has (Linux reports twice the size set). A fresh connection's round trip is its handshake's, which a busy
    machine can make tens of microseconds on loopback (a send buffer past `SEND_BUFFER_MIN`); the data's own round
    trips bring it down. Not where the round trip is unknown, nor to autotuning (a set buffer stays set)."""
    if SOCKET_BUFFER <= 0:
        return
    send, rtt = _send_size(sock)
    if send is None or rtt is None:
        return
    most = most_send_buffer()
    try:
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) != 2 * (send if most is None else min(send, most)):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send)
    except OSError:
        pass


def send_all(sock: socket.socket, parts: Sequence[bytes | memoryview]) -> None:
    """Write `parts` in order with as few system calls as the kernel allows: one gathering `sendmsg` of all of
    them (no join, no copy in Python), repeated over what a partial send left. The first write is an `os.writev`
    on the socket's descriptor where there is one: a socket with a timeout (both ends' connections) otherwise
    polls before every send, one system call more per round trip for what fits the socket buffer at once (every
    small program's request and answer); what it could not take (`EAGAIN`: the buffer full) goes by `sendmsg`,
    which waits for room within the socket's timeout."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    if isinstance(sock, socket.socket) and sum(len(v) for v in views) > SEND_BUFFER_MIN:
        retune_send(sock)
    if not hasattr(sock, "sendmsg"):  # (not on every platform)
        for v in views:
            sock.sendall(v)
        return
    sent = 0
    if _WRITEV is not None and views and isinstance(sock, socket.socket):
        try:
            sent = _WRITEV(sock.fileno(), views[:1024])
        except (BlockingIOError, InterruptedError):
            sent = 0
    while True:
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if sent:
            views[0] = views[0][sent:]
        if not views:
            return
        sent = sock.sendmsg(views[:1024])  # (IOV_MAX is 1024 on Linux)


_WRITEV = os.writev if os.name == "posix" else None


def keep_line(table: dict[bytes, Any], raw: bytes, parsed: Any, most: int, longest: int) -> None:
    """Keeps `parsed`, what an HTTP line of exactly the bytes `raw` reads as, in `table` (the lines both ends send
    with every message are then not read again): lines up to `longest` bytes, at most `most` of them (the table is
    emptied when full). Only lines that read are given: an error is always found again."""
    if len(raw) <= longest:
        if len(table) >= most:
            table.clear()
        table[raw] = parsed


def encode_body(blobs: Mapping[str, bytes | memoryview], text: str) -> bytes:
    """Blobs (hex digest -> bytes) and text as one body."""
    return b"".join(body_parts(blobs, text))


def decode_body(body: bytes | memoryview, max_blobs: int = MAX_BLOBS, verify: bool = True,
                max_text: int | None = None) -> tuple[dict[str, memoryview], str]:
    """A body's blobs (hex digest -> bytes) and its text; `ProtocolError` if malformed.

    With `verify` (what the server does) the sha256 of every blob shorter than `LARGE_BLOB` must match its id.
    """
    mv = memoryview(body)
    if len(mv) < 8 or bytes(mv[:4]) != MAGIC:
        raise ProtocolError("body does not start with the TGC1 header")
    count = int.from_bytes(mv[4:8], "big")
    if count > max_blobs:
        raise ProtocolError(f"body declares {count} blobs, more than the limit of {max_blobs}")
    pos, blobs = 8, {}
    for i in range(count):
        if len(mv) - pos < 40:
            raise ProtocolError(f"blob {i}: header truncated")
        want = bytes(mv[pos:pos + 32])
        n = int.from_bytes(mv[pos + 32:pos + 40], "big")
        pos += 40
        if n > len(mv) - pos:
            raise ProtocolError(f"blob {i}: length {n} runs past the end of the body ({len(mv) - pos} bytes left)")
        data = mv[pos:pos + n]
        pos += n
        if verify and n < LARGE_BLOB and hashlib.sha256(data).digest() != want:
            raise ProtocolError(f"blob {i}: sha256 does not match its {n} bytes")
        blobs[want.hex()] = data
    if max_text is not None and len(mv) - pos > 4 * max_text:  # before decoding: at most 4 bytes a character
        raise ProtocolError(f"request text of {len(mv) - pos} bytes exceeds the limit of {max_text} characters")
    try:
        text = bytes(mv[pos:]).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"request text is not UTF-8: {e.reason} at byte {e.start}") from None
    return blobs, text


class TruncatedBody(ValueError):
    """The peer closed (or timed out) before sending the body it declared (nobody is left to answer)."""


def _read_exact(rfile: Any, n: int) -> bytes:
    data = rfile.read(n)
    if len(data) != n:
        raise TruncatedBody(f"the body ended {n - len(data)} bytes early")
    return data


def read_body(rfile: Any, n: int, stage: Any = None, max_blobs: int = MAX_BLOBS, max_text: int | None = None
              ) -> tuple[dict[str, memoryview], str]:
    """Read a body of exactly `n` bytes from the buffered reader `rfile` and decode it as `decode_body(verify=True)`
    does, receiving each blob of at least `LARGE_BLOB` bytes into `stage(length)` (a writable byte view of that
    length, or None to receive it as bytes) with `readinto`: the bytes go from the socket straight to where the
    caller wants them (the server: a block of device memory a CopyIn can adopt).

    `ProtocolError` for a malformed body: the rest of the body is then unread (the caller must close the
    connection). `TruncatedBody` when the stream ends before `n` bytes. A blob's length is checked against what is
    left of `n` before anything is staged or read for it."""
    if n < 8:
        _read_exact(rfile, n)
        raise ProtocolError("body does not start with the TGC1 header")
    head = _read_exact(rfile, 8)
    if head[:4] != MAGIC:
        raise ProtocolError("body does not start with the TGC1 header")
    count = int.from_bytes(head[4:8], "big")
    if count > max_blobs:
        raise ProtocolError(f"body declares {count} blobs, more than the limit of {max_blobs}")
    left, blobs = n - 8, {}
    for i in range(count):
        if left < 40:
            raise ProtocolError(f"blob {i}: header truncated")
        blob_head = _read_exact(rfile, 40)
        size = int.from_bytes(blob_head[32:40], "big")
        left -= 40
        if size > left:
            raise ProtocolError(f"blob {i}: length {size} runs past the end of the body ({left} bytes left)")
        view = stage(size) if stage is not None and size >= LARGE_BLOB else None
        if view is None:
            data = memoryview(_read_exact(rfile, size))
        else:
            got = 0
            while got < size:
                k = rfile.readinto(view[got:])
                if not k:
                    raise TruncatedBody(f"the body ended {size - got} bytes into a {size}-byte blob early")
                got += k
            data = view
        left -= size
        if size < LARGE_BLOB and hashlib.sha256(data).digest() != blob_head[:32]:
            raise ProtocolError(f"blob {i}: sha256 does not match its {size} bytes")
        blobs[blob_head[:32].hex()] = data
    if max_text is not None and left > 4 * max_text:  # before reading: at most 4 bytes a character
        raise ProtocolError(f"request text of {left} bytes exceeds the limit of {max_text} characters")
    try:
        text = _read_exact(rfile, left).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"request text is not UTF-8: {e.reason} at byte {e.start}") from None
    return blobs, text


# ---------------------------------------------------------------------------------------------------------------------
# text: writing literals and parsing them back through a whitelist


def to_text(value: Any) -> str:
    """Write a value as text that `parse_text` reads back: literals, containers and request dataclasses."""
    t = type(value)  # (the common kinds by their exact type first; subclasses and the rest below)
    if t is int or t is str or value is None or t is bool:
        return repr(value)
    if t is list:
        return "[" + ", ".join([to_text(v) for v in value]) + "]"
    if t is tuple:
        return "(" + "".join([to_text(v) + ", " for v in value]) + ")"
    names = _WRITTEN.get(t)
    if names is not None:  # (a field of an int, a str or None, as most are, written here: no call for it)
        fields = []
        for name in names:
            v = getattr(value, name)
            tv = type(v)
            plain = tv is int or tv is str or tv is bool or v is None
            fields.append(f"{name}={v!r}" if plain else f"{name}={to_text(v)}")
        return t.__name__ + "(" + ", ".join(fields) + ")"
    if isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "math.nan"
        if math.isinf(value):
            return "math.inf" if value > 0 else "-math.inf"
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(to_text(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + "".join(to_text(v) + ", " for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{to_text(k)}: {to_text(v)}" for k, v in value.items()) + "}"
    names = _field_names(type(value)) if type(value).__name__ in REQUESTS else None
    if names is not None:
        args = ", ".join(f"{name}={to_text(getattr(value, name))}" for name in names)
        return f"{type(value).__name__}({args})"
    raise TypeError(f"cannot write a {type(value).__name__} as request text")


@cache
def _field_names(cls: type) -> tuple[str, ...] | None:
    """The fields of a request dataclass, in order (None for a class that is not a dataclass)."""
    return tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None


# the request classes and the fields `to_text` writes for each, in order
_WRITTEN: dict[type, tuple[str, ...]] = {cls: _field_names(cls) or () for cls in REQUESTS.values()}


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@cache
def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _conform(value: Any, hint: Any, where: str) -> Any:
    """`value` converted to the type `hint` (lists become tuples), or a ProtocolError naming `where`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        for arg in args:
            try:
                return _conform(value, arg, where)
            except ProtocolError:
                pass
        raise ProtocolError(f"{where}: {to_short(value)} is not a {_type_name(hint)}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ProtocolError(f"{where}: expected a tuple, got {to_short(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_conform(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ProtocolError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(_conform(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if hint is type(None):
        if value is not None:
            raise ProtocolError(f"{where}: expected None, got {to_short(value)}")
        return None
    if hint is int:
        if type(value) is not int:
            raise ProtocolError(f"{where}: expected an integer, got {to_short(value)}")
        if not INT_MIN <= value <= INT_MAX:
            raise ProtocolError(f"{where}: {value} does not fit in 64 bits")
        return value
    if hint is float:
        if type(value) not in (int, float):
            raise ProtocolError(f"{where}: expected a number, got {to_short(value)}")
        return float(value)
    if hint in (bool, str):
        if type(value) is not hint:
            raise ProtocolError(f"{where}: expected a {hint.__name__}, got {to_short(value)}")
        return value
    if isinstance(hint, type):
        if not isinstance(value, hint):
            raise ProtocolError(f"{where}: expected a {hint.__name__}, got {to_short(value)}")
        return value
    raise TypeError(f"unsupported field type {hint!r}")  # a bug in this module, not in the request


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def to_short(value: Any) -> str:
    """A value for an error message, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@cache
def _plan(cls: type) -> tuple[tuple[str, Any, int, bool], ...]:
    """How `build` checks each field of `cls`: (name, type hint, a quick check, required). The quick checks: 0 none
    (`_conform` converts the value or refuses it), 1 a 64-bit int, 2 a tuple of them, 3 a str, 4 a bool; a value that
    passes its quick check is taken as it is, any other goes to `_conform` (which gives every message)."""
    hints = _hints(cls)

    def quick(hint: Any) -> int:
        return {int: 1, str: 3, bool: 4}.get(hint, 2 if hint == tuple[int, ...] else 0)
    return tuple((f.name, hints[f.name], quick(hints[f.name]), f.default is dataclasses.MISSING)
                 for f in dataclasses.fields(cls))


@cache
def _field_set(cls: type) -> frozenset[str]:
    return frozenset(_fields(cls))


def build(cls: type, kwargs: dict[str, Any]) -> Any:
    """An instance of the dataclass `cls` from keyword arguments, type-checked and range-checked."""
    plan = _plan(cls)
    if not _field_set(cls).issuperset(kwargs):
        unknown = sorted(set(kwargs) - set(_fields(cls)))
        raise ProtocolError(f"{cls.__name__} has no field '{unknown[0]}'")
    values = {}
    for name, hint, check, required in plan:
        if name in kwargs:
            value = kwargs[name]
            t = type(value)
            if check == 1:
                ok = t is int and INT_MIN <= value <= INT_MAX
            elif check == 3:
                ok = t is str
            elif check == 4:
                ok = t is bool
            elif check == 2:
                ok = t is tuple and all(type(v) is int and INT_MIN <= v <= INT_MAX for v in value)
            else:
                ok = False
            values[name] = value if ok else _conform(value, hint, f"{cls.__name__}.{name}")
        elif required:
            raise ProtocolError(f"{cls.__name__} is missing the field '{name}'")
    obj = cls(**values)
    obj.check()
    return obj


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return f"{_dotted(node.func)}(...)"
    return f"<{type(node).__name__}>"


# CPython 3.11 keeps the AST constructor's recursion count in shared state, so two threads parsing at once
# can fail with "SystemError: AST constructor recursion depth mismatch": parse one text at a time.
_AST_LOCK = threading.Lock()


def _parse(text: str) -> ast.Expression:
    for attempt in range(2):
        try:
            with _AST_LOCK:
                return ast.parse(text, mode="eval")
        except SystemError as e:  # the race above, with a thread outside this module: try once more
            if attempt or "recursion depth mismatch" not in str(e):
                raise ProtocolError(f"request text does not parse: {e}") from None
        except Exception as e:  # SyntaxError, ValueError (null bytes, huge ints), RecursionError, MemoryError
            msg = getattr(e, "msg", None) or str(e) or type(e).__name__
            raise ProtocolError(f"request text does not parse: {msg}") from None
    raise AssertionError("unreachable")


# String literals as `to_text` writes them (repr: one line, backslash escapes), to skip when counting.
_STRINGS = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")
_SEPARATOR_CHARS = ",([{:="
_PREFIXED = re.compile(r"[A-Za-z0-9_]''")


def check_size(text: str, max_text: int = MAX_TEXT, max_nodes: int = MAX_NODES) -> None:
    """Refuse a text too long, or with more separators (outside string literals) than `max_nodes`, before
    `ast.parse` spends memory on it (about 1 KB per node)."""
    if len(text) > max_text:
        raise ProtocolError(f"request text of {len(text)} characters exceeds the limit of {max_text}")
    bare = _STRINGS.sub("''", text)
    if _PREFIXED.search(bare):  # f-strings hold code, and `to_text` never writes prefixes
        raise ProtocolError("string prefixes (f'', b'', r'') are not allowed in request text")
    if sum(bare.count(c) for c in _SEPARATOR_CHARS) > max_nodes:
        raise ProtocolError(f"request text has more than {max_nodes} nodes")


def parse_text(text: str, classes: Mapping[str, type] = REQUESTS, *, max_depth: int = MAX_DEPTH,
               max_nodes: int = MAX_NODES, max_text: int = MAX_TEXT) -> Any:
    """The value that `text` writes, allowing only literals, calls of `classes` and `ATTRIBUTES`.

    Raises ProtocolError for anything else (names, other calls, operators, comprehensions, lambdas,
    dunders), for nesting deeper than `max_depth`, for more than `max_nodes` nodes and for more than
    `max_text` characters (the last two checked before parsing).
    """
    check_size(text, max_text, max_nodes)
    tree = _parse(text)
    count = 0

    def conv(node: ast.expr, depth: int) -> Any:
        nonlocal count
        count += 1
        if count > max_nodes:
            raise ProtocolError(f"request text has more than {max_nodes} nodes")
        if depth >= max_depth:
            raise ProtocolError(f"request text is nested deeper than {max_depth} levels")
        if isinstance(node, ast.Constant):
            if type(node.value) not in (int, float, str, bool, type(None)):
                raise ProtocolError(f"constant {to_short(node.value)} is not allowed")
            return node.value
        if isinstance(node, ast.List):
            return [conv(e, depth + 1) for e in node.elts]
        if isinstance(node, ast.Tuple):
            return tuple(conv(e, depth + 1) for e in node.elts)
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise ProtocolError("'**' is not allowed in request text")
            out = {}
            for k, v in zip(node.keys, node.values):
                key = conv(k, depth + 1)
                if not isinstance(key, (str, int)):
                    raise ProtocolError(f"dict key {to_short(key)} is not a string or integer")
                out[key] = conv(v, depth + 1)
            return out
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = conv(node.operand, depth + 1)
            if type(operand) not in (int, float):
                raise ProtocolError(f"unary minus on {to_short(operand)} is not allowed")
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.Attribute):
            name = _dotted(node)
            if name not in ATTRIBUTES:
                raise ProtocolError(f"attribute '{name}' is not allowed")
            return ATTRIBUTES[name]
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else _dotted(node.func)
            if name not in classes:
                raise ProtocolError(f"call of '{name}' is not allowed")
            if node.args:
                raise ProtocolError(f"{name}: only keyword arguments are allowed")
            kwargs = {}
            for kw in node.keywords:
                if kw.arg is None:
                    raise ProtocolError(f"{name}: '**' is not allowed")
                if kw.arg in kwargs:  # (ast reads f(a=1, a=2); Python's compiler refuses it, and so do we)
                    raise ProtocolError(f"{name}: the argument '{kw.arg}' is given twice")
                kwargs[kw.arg] = conv(kw.value, depth + 1)
            return build(classes[name], kwargs)
        if isinstance(node, ast.Name):
            raise ProtocolError(f"name '{node.id}' is not allowed")
        raise ProtocolError(f"{type(node).__name__} expressions are not allowed in request text")

    try:
        return conv(tree.body, 0)
    except RecursionError:
        raise ProtocolError("request text is nested too deeply") from None


def encode_requests(requests: list[Request], blobs: Mapping[str, bytes | memoryview]) -> bytes:
    """A request body: the blobs, then the requests as text."""
    return encode_body(blobs, to_text(list(requests)))


def decode_requests(body: bytes | memoryview, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES,
                    max_text: int = MAX_TEXT) -> tuple[list[Request], dict[str, memoryview]]:
    """The requests of a body and its blobs; ProtocolError unless the text is a list of requests."""
    blobs, text = decode_body(body, max_text=max_text)
    return parse_requests(text, max_depth=max_depth, max_nodes=max_nodes, max_text=max_text), blobs


# A request text of flat calls whose arguments are integers, plain strings (no escapes), True/False/None and tuples of
# integers, as `to_text` writes them (the copies, launches and frees of a run), is read without `ast`
# (`_quick_requests`)
_Q_INT = r"-?(?:0|[1-9][0-9]{0,18})"
_Q_VALUE = rf"{_Q_INT}|'[A-Za-z0-9_.:-]{{0,256}}'|True|False|None|\((?:{_Q_INT}, ){{0,64}}\)"
_Q_ARG = rf"[a-z_]{{1,32}}=(?:{_Q_VALUE})"
_Q_CALL = rf"[A-Z][A-Za-z]{{0,31}}\((?:{_Q_ARG}(?:, {_Q_ARG})*)?\)"
_QUICK_TEXT = re.compile(rf"\[(?:{_Q_CALL}(?:, {_Q_CALL})*)?\]")
_QUICK_CALL = re.compile(rf"([A-Z][A-Za-z]{{0,31}})\(((?:{_Q_ARG}(?:, {_Q_ARG})*)?)\)")
_QUICK_LIMIT = 1 << 16  # characters: a longer text is parsed with `ast` (its regular expression is linear anyway)


# one argument of the quick form, its value's kind told by the group that matched: an integer, a plain string (its
# text), a name (True, False, None) or the integers of a tuple (`1, 2, `)
_QUICK_TYPED_ARG = re.compile(rf"([a-z_]{{1,32}})=(?:({_Q_INT})|'([A-Za-z0-9_.:-]{{0,256}})'|(True|False|None)|"
                              rf"\(((?:{_Q_INT}, ){{0,64}})\))")
_QUICK_NAMES = {"True": True, "False": False, "None": None}
# Requests already built from the text of one call (`GraphExec(graph=6, wait=False)`, `CopyOut(buf=5)`: what each run
# of a kept launch plan sends again): requests are frozen, and `build` gives the same one for the same text. Calls
# with a string argument (a blob id, a kernel's name: seldom the same twice) are not kept. At most `_QUICK_KEEP`.
_QUICK_BUILT: dict[str, Any] = {}
_QUICK_KEEP = 4096


def _quick_requests(text: str, classes: Mapping[str, type], max_nodes: int | None = None) -> list[Any] | None:
    """The requests of a text of the quick form (see `_QUICK_TEXT`), built and checked by `build` as `parse_text`
    builds them; None for any other text, or one the quick form reads but `ast` might not read alike (an unknown
    request name, a repeated argument): `parse_text` then reads it, or refuses it with its message. With
    `max_nodes`, a text of the quick form with more nodes than that is refused with `check_size`'s message (counted
    as it counts them: in this form no separator but `:` can stand inside a string, and `:` only there)."""
    if len(text) > _QUICK_LIMIT or not _QUICK_TEXT.fullmatch(text):
        return None
    if max_nodes is not None and \
            text.count(",") + text.count("(") + text.count("[") + text.count("=") > max_nodes:
        raise ProtocolError(f"request text has more than {max_nodes} nodes")
    out = []
    kept = classes is REQUESTS
    for call in _QUICK_CALL.finditer(text):
        whole = call[0]
        req = _QUICK_BUILT.get(whole) if kept else None
        if req is not None:
            out.append(req)
            continue
        cls = classes.get(call[1])
        if cls is None:
            return None
        kwargs: dict[str, Any] = {}
        for arg in _QUICK_TYPED_ARG.finditer(call[2]):
            name = arg[1]
            if name in kwargs:
                return None
            if arg[2] is not None:
                kwargs[name] = int(arg[2])
            elif arg[3] is not None:
                kwargs[name] = arg[3]
            elif arg[4] is not None:
                kwargs[name] = _QUICK_NAMES[arg[4]]
            else:
                kwargs[name] = tuple([int(v) for v in arg[5].split(", ") if v])
        req = build(cls, kwargs)
        if kept and "'" not in whole:
            if len(_QUICK_BUILT) >= _QUICK_KEEP:
                _QUICK_BUILT.clear()
            _QUICK_BUILT[whole] = req
        out.append(req)
    return out


# A kept plan sends the same request text on every run but for the ids of the small blobs it copies in
# (`datahash='<sha256 of the bytes>'`): the requests of a quick-form text are kept under the text with those ids blanked
# (`_PLANS`), with where each id goes, and a later text that blanks to the same key with as many ids gets them back
# with its own ids. A text of the quick form never holds `datahash=''` (refused: not 64 hex digits), so equal keys
# with equal id counts mean the same text but for the ids, in the same places; the requests are frozen and every
# other field was built and checked from the same characters. At most `_PLAN_KEEP` texts of `_PLAN_TEXT` characters.
_PLAN_ID = re.compile(r"datahash='([0-9a-f]{64})'")
_PLANS: dict[str, tuple[tuple[Any, ...], tuple[int, ...], int]] = {}  # key -> (requests, slots, nodes)
_PLAN_KEEP = 256
_PLAN_TEXT = 4096


def _plan_key(text: str) -> tuple[str, list[str]]:
    """A kept plan's key for a quick-form `text` (its blob ids blanked) and those ids, in order."""
    ids = _PLAN_ID.findall(text)
    return (_PLAN_ID.sub("datahash=''", text) if ids else text), ids


def _planned(text: str, max_nodes: int | None) -> list[Any] | None:
    """The requests of `text` from `_PLANS`, or None (not kept: parse it)."""
    if len(text) > _PLAN_TEXT:
        return None
    key, ids = _plan_key(text)
    kept = _PLANS.get(key)
    if kept is None or len(kept[1]) != len(ids):
        return None
    if max_nodes is not None and kept[2] > max_nodes:
        raise ProtocolError(f"request text has more than {max_nodes} nodes")
    out = list(kept[0])
    for i, h in zip(kept[1], ids):
        r = out[i]
        out[i] = CopyIn(r.buf, h) if type(r) is CopyIn else dataclasses.replace(r, datahash=h)
    return out


def _keep_plan(text: str, requests: list[Any]) -> None:
    """Keep the requests just built from the quick-form `text` for `_planned`."""
    if len(text) > _PLAN_TEXT:
        return
    key, ids = _plan_key(text)
    slots = tuple(i for i, r in enumerate(requests) if r.blob() is not None)
    if [requests[i].blob() for i in slots] != ids:  # (every id where a request's datahash is, in order)
        return
    if len(_PLANS) >= _PLAN_KEEP:
        _PLANS.clear()
    nodes = text.count(",") + text.count("(") + text.count("[") + text.count("=")
    _PLANS[key] = (tuple(requests), slots, nodes)


def parse_requests(text: str, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES,
                   max_text: int = MAX_TEXT) -> list[Request]:
    """The requests of a body's text; ProtocolError unless it is a list of requests."""
    if len(text) > max_text:
        check_size(text, max_text, max_nodes)  # (its message)
    if max_depth > 4:  # (a kept plan's text again, but for its blob ids: `_planned`)
        planned = _planned(text, max_nodes)
        if planned is not None:
            return planned
    # the quick form needs no `check_size` pass: it holds no string prefix, and its nodes are counted exactly as
    # `check_size` counts them (`_quick_requests`); any other text is checked before `ast` reads it
    value: Any = _quick_requests(text, REQUESTS, max_nodes) if max_depth > 4 else None  # (5 deep: -1 in a tuple)
    if value is not None and all(isinstance(r, Request) for r in value):
        _keep_plan(text, value)
    if value is None:
        check_size(text, max_text, max_nodes)
        value = parse_text(text, REQUESTS, max_depth=max_depth, max_nodes=max_nodes, max_text=max_text)
    if not isinstance(value, list):
        raise ProtocolError("request text must be a list of requests")
    for r in value:
        if not isinstance(r, Request):
            raise ProtocolError("request text must be a list of requests")
    return value


def encode_results(results: list[Any], blobs: Mapping[str, bytes | memoryview]) -> bytes:
    """A response body: the blobs (copied-out buffers, binaries), then one result per request."""
    return encode_body(blobs, to_text(list(results)))


# A result text of only None, blob ids and numbers (the results of copies, launches and frees), read without `ast`
_PLAIN_RESULT = r"None|'[0-9a-f]{64}'|-?[0-9]{1,18}(?:\.[0-9]{1,20})?(?:e[-+]?[0-9]{1,3})?"
_PLAIN_RESULTS = re.compile(rf"\[(?:(?:{_PLAIN_RESULT})(?:, (?:{_PLAIN_RESULT}))*)?\]")


def _plain_result(word: str) -> Any:
    if word == "None":
        return None
    if word[0] == "'":
        return word[1:-1]
    return float(word) if "." in word or "e" in word else int(word)


def decode_results(body: bytes | memoryview, verify: bool = True, max_text: int = MAX_TEXT,
                   max_nodes: int = MAX_NODES) -> tuple[list[Any], dict[str, memoryview]]:
    """The results of a response body and its blobs (hashes checked with `verify`)."""
    blobs, text = decode_body(body, verify=verify, max_text=max_text)
    if len(text) <= 4 * max_nodes and _PLAIN_RESULTS.fullmatch(text):  # the common answer: split, not parsed
        return ([] if text == "[]" else [_plain_result(w) for w in text[1:-1].split(", ")]), blobs
    value = parse_text(text, {}, max_text=max_text, max_nodes=max_nodes)
    if not isinstance(value, list):
        raise ProtocolError("response text must be a list of results")
    return value, blobs


def timing_header(entries: list[tuple[str, int, int, int]], start_ns: int) -> str:
    """The server's timing of one batch as header text: `name;count;start_us;dur_us` per entry (a request, or a
    run of `count` launches of one kind), comma-separated, times from `start_ns` (the batch's start)."""
    if len(entries) > MAX_TIMINGS:  # (the rest as one entry: a header stays well under 64 KiB)
        rest = entries[MAX_TIMINGS - 1:]
        entries = entries[:MAX_TIMINGS - 1] + [("Rest", sum(e[1] for e in rest), rest[0][2], rest[-1][3])]
    return ",".join(f"{name};{count};{(st - start_ns) / 1e3:.3f};{(end - st) / 1e3:.3f}"
                    for name, count, st, end in entries)


def parse_timing(text: str | None) -> list[tuple[str, int, float, float]]:
    """`timing_header`'s text back as (name, count, start_us, dur_us); [] for none or anything malformed."""
    if not text or len(text) > 65536:
        return []
    out = []
    for part in text.split(","):
        m = _TIMING_ENTRY.fullmatch(part.strip())
        if m is None:
            return []
        out.append((m[1], int(m[2]), float(m[3]), float(m[4])))
    return out[:MAX_TIMINGS]
