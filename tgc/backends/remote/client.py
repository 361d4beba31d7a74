"""The REMOTE device: a device served by `tgc serve`, spoken to over HTTP.

It behaves as the device it serves: `renderer` is built locally for the served device's kind (renderers
are pure code), `compiler` compiles on the server, `launch_style` and `info()` are the server's.

Work that needs no answer (alloc, free, copy in, program load, launches without `wait`) is queued and
sent in one `POST /batch` when an answer is needed: a copy out, a launch with `wait=True`, a compile,
`synchronize()` or `flush()`. A program of k kernels thus costs one round trip. `round_trips` counts them.

Environment: `TGC_REMOTE=host:port` (a comma list gives `REMOTE:i` the i-th server; with one server every
`REMOTE:i` is its own session there), `TGC_REMOTE_TOKEN` or `TGC_REMOTE_TOKEN_FILE` (the bearer token),
`TGC_REMOTE_TIMEOUT` (seconds to wait for an answer, default 120), `TGC_REMOTE_RETRY` (seconds to keep
retrying a connection, with backoff, default 3).
"""

from __future__ import annotations

import dataclasses
import http.client
import itertools
import os
import re
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from tgc.backends import device_class, get_device
from tgc.backends.base import Allocator, Compiler, Device, Program
from tgc.backends.remote import protocol as P
from tgc.env import env_float, parse_address
from tgc.errors import CompileError, DeviceError, TgcError

ENV_ADDRESS, ENV_TOKEN, ENV_TOKEN_FILE = "TGC_REMOTE", "TGC_REMOTE_TOKEN", "TGC_REMOTE_TOKEN_FILE"
ENV_TIMEOUT, ENV_RETRY = "TGC_REMOTE_TIMEOUT", "TGC_REMOTE_RETRY"
DEFAULT_TIMEOUT, DEFAULT_RETRY = 120.0, 3.0
MAX_QUEUE = 2048  # queued requests that trigger a flush
BODY_SLACK = 1 << 20  # room left in a body for the request text (at most a quarter of the limit)
# What an answer may hold beyond the bytes of the buffers copied out: the result text of each request, and
# for a compile, assembly or disassembly listing, or the device's properties, this much more.
ANSWER_BASE, ANSWER_PER_REQUEST, ANSWER_PER_LISTING = 1 << 20, 256, 64 << 20
ERROR_LIMIT = 1 << 20  # bytes of an error message
LISTINGS = (P.Compile, P.Assembly, P.Disassemble)


def client_token(env: dict[str, str] | None = None) -> str | None:
    """The token from `TGC_REMOTE_TOKEN`, else from the file named by `TGC_REMOTE_TOKEN_FILE`. TgcError (exit 2)
    for a file that cannot be read or a token that cannot go in an HTTP header."""
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
    return P.read_token_file(path)


def _env_float(name: str, default: float) -> float:

    return env_float(name, default)


def _reason(e: BaseException) -> str:
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


class Connection:
    """One kept-alive HTTP connection to a server.

    Connecting is retried with exponential backoff for `retry` seconds. Once a body is sent, a failure is
    not retried (the server may have run part of it), except on a kept-alive connection that the server
    had already closed, which is reopened once. Every failure is one DeviceError.
    """

    def __init__(self, host: str, port: int, token: str | None, session: str, timeout: float, retry: float):
        self.host, self.port, self.token, self.session = host, port, token, session
        self.timeout, self.retry = timeout, retry
        self._conn: http.client.HTTPConnection | None = None

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connect(self) -> http.client.HTTPConnection:
        deadline, delay = time.monotonic() + self.retry, 0.05
        while True:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                conn.connect()
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return conn
            except OSError as e:
                conn.close()
                if time.monotonic() + delay > deadline:
                    tried = f" (retried for {self.retry:g}s)" if self.retry else ""
                    raise DeviceError(f"cannot reach REMOTE server {self.address}: {_reason(e)}{tried}",
                                      hint=f"start a server there (`tgc serve`, port {self.port}) or check "
                                           f"{ENV_ADDRESS}",
                                      cli_hint=f"start one with `tgc serve --port {self.port}` or check {ENV_ADDRESS}"
                                      ) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def post(self, body: bytes | list[bytes | memoryview], limit: int = 1 << 30) -> bytes:
        """Send one batch body (or its parts); the response body, or a DeviceError/CompileError with the
        server's message. An answer longer than `limit` bytes (what the requests can need) is refused
        before it is read."""
        parts = [body] if isinstance(body, bytes) else body
        headers = {"Content-Type": "application/octet-stream", P.SESSION_HEADER: self.session,
                   "Content-Length": str(sum(len(p) for p in parts))}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        for attempt in range(2):
            reused = self._conn is not None
            if self._conn is None:
                self._conn = self._connect()
            try:
                self._conn.request("POST", P.BATCH_PATH, parts, headers)
                resp = self._conn.getresponse()
                cap = limit if resp.status == 200 else ERROR_LIMIT
                if resp.length is not None and resp.length > cap:
                    self.close()
                    raise DeviceError(f"REMOTE server {self.address} sent an answer of {resp.length} bytes, more "
                                      f"than the {cap} its requests can need")
                data = resp.read(cap + 1)
                if len(data) > cap:
                    self.close()
                    raise DeviceError(f"REMOTE server {self.address} sent an answer of more than the {cap} bytes "
                                      "its requests can need")
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self.close()
                if reused and attempt == 0:  # the server closed an idle connection: open a fresh one
                    continue
                raise DeviceError(f"lost the connection to REMOTE server {self.address}: {_reason(e)}") from None
            except (OSError, http.client.HTTPException) as e:
                self.close()
                what = f"no answer within {self.timeout:g}s" if isinstance(e, TimeoutError) else _reason(e)
                raise DeviceError(f"lost the connection to REMOTE server {self.address}: {what}") from None
            if resp.will_close:
                self.close()
            if resp.status == 200:
                return data
            raise self._error(resp.status, resp.getheader(P.ERROR_HEADER), data)
        raise AssertionError("unreachable")

    def _error(self, status: int, kind: str | None, data: bytes) -> TgcError:
        msg = data.decode("utf-8", "replace").removesuffix("\n") or f"HTTP {status}"  # the server adds one
        msg = P.safe_text(msg)
        if status == 401:
            return DeviceError(f"REMOTE server {self.address} refused the request: missing or wrong token",
                               hint=f"set {ENV_TOKEN} or {ENV_TOKEN_FILE} to the server's token")
        if kind == "compile":
            return CompileError(msg)
        return DeviceError(f"REMOTE server {self.address}: {msg}")


class RemoteAllocator(Allocator):
    """Buffers on the server, named by per-session ids (the handles are those ints)."""

    shared_slots = False  # a copy out returns the whole buffer: a memory plan gives each buffer its own

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
        self.device._enqueue(P.CopyIn(buf=handle, datahash=""), bytes(src))

    def copyout(self, dest: memoryview, handle: int) -> None:
        results, blobs = self.device._submit(P.CopyOut(buf=handle))
        data = blobs.get(results[-1]) if isinstance(results[-1], str) else None
        out = dest if dest.format == "B" and dest.ndim == 1 else dest.cast("B")
        if data is None or len(data) != len(out):
            raise DeviceError(f"REMOTE server sent {'no' if data is None else len(data)} bytes for a "
                              f"copy out of {len(out)} bytes")
        out[:] = data

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
        data = bytearray(nbytes)
        src_dev.allocator.copyout(memoryview(data), src)
        dest_dev.allocator.copyin(dest, memoryview(data))


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

    def disassemble(self, lib: bytes) -> str:
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
    """`REMOTE`: the device served by `tgc serve` at `TGC_REMOTE` (or `--remote`), one session per instance."""

    kind = "REMOTE"
    _configured: str | None = None  # set by `configure` (the CLI's --remote)

    def __init__(self, index: int = 0, *, address: str | None = None, token: str | None = None,
                 timeout: float | None = None, retry: float | None = None):
        super().__init__(index)
        self.session = secrets.token_urlsafe(24)
        self.allocator = RemoteAllocator(self)
        self.round_trips = 0
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

    @classmethod
    def configure(cls, address: str | None) -> None:
        """Use this server (`host:port`) instead of `TGC_REMOTE` for devices that connect from now on."""
        if address is not None:
            parse_address(address.split(",")[0])  # a bad address is a user error now, not later
        cls._configured = address

    @classmethod
    def _address_text(cls) -> str | None:
        return cls._configured or os.environ.get(ENV_ADDRESS) or None

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        text = cls._address_text()
        if not text:
            return False, f"{ENV_ADDRESS} is not set"
        try:
            host, port = parse_address(text.split(",")[0])
        except TgcError as e:
            return False, e.msg
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
            raise DeviceError("the REMOTE device needs a server",
                              hint=f"set {ENV_ADDRESS}=host:port, the address of a running `tgc serve`",
                              cli_hint=f"set {ENV_ADDRESS}=host:port or pass --remote host:port (see `tgc serve`)")
        addrs = [a for a in (t.strip() for t in text.split(",")) if a]
        if len(addrs) > 1 and self.index >= len(addrs):
            raise DeviceError(f"{self.name} needs a server {self.index}, but {ENV_ADDRESS} names {len(addrs)}")
        return parse_address(addrs[self.index] if len(addrs) > 1 else addrs[0])

    def _connection(self) -> Connection:
        if self._conn is None:
            host, port = self.conn_address
            token = self._token if self._token is not None else client_token()
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
                _end_session(self._conn, self._used)
                self._used["used"] = False

    # --- the queue

    def _new_id(self) -> int:
        with self._lock:
            return next(self._ids)

    def _enqueue(self, req: P.Request, blob: bytes | None = None) -> None:
        """Queue a request (with the blob it names, if any); flush first when the body would get too big."""
        with self._lock:
            if blob is not None:
                max_body = int(self.properties["max_body"])
                budget = max_body - min(BODY_SLACK, max_body // 4)
                if len(blob) > budget:
                    raise DeviceError(f"{len(blob)} bytes do not fit in a request to the REMOTE server "
                                      f"(its body limit is {max_body} bytes)")
                h = P.digest(blob)
                req = dataclasses.replace(req, datahash=h)
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

    def _submit(self, req: P.Request, blob: bytes | None = None) -> tuple[list[Any], dict[str, memoryview]]:
        """Queue `req` and flush: the results of the batch (`req`'s is last) and the response blobs."""
        with self._lock:
            self._enqueue(req, blob)
            return self._send()

    def flush(self) -> None:
        """Send everything queued now."""
        with self._lock:
            if self._queue:
                self._send()

    def _send(self) -> tuple[list[Any], dict[str, memoryview]]:
        reqs, blobs = self._queue, self._blobs
        self._queue, self._blobs, self._queued_bytes = [], {}, 0
        body = P.body_parts(blobs, P.to_text(reqs))
        conn = self._connection()
        self._used["used"] = True
        self.round_trips += 1
        limit = ANSWER_BASE + ANSWER_PER_REQUEST * len(reqs)
        for r in reqs:
            if isinstance(r, P.CopyOut):
                limit += 40 + self._sizes.get(r.buf, 0)
            elif isinstance(r, LISTINGS):
                limit += ANSWER_PER_LISTING
        data = conn.post(body, limit)
        try:
            results, out_blobs = P.decode_results(data, verify=False, max_text=limit,
                                                  max_nodes=10_000 + 16 * len(reqs))
        except P.ProtocolError as e:
            raise DeviceError(f"REMOTE server {conn.address} sent a bad answer: {P.safe_text(e)}") from None
        if len(results) != len(reqs):
            raise DeviceError(f"REMOTE server {conn.address} answered {len(results)} of {len(reqs)} requests")
        for r in reqs:  # launches not yet known to be finished: those after the last copy out/wait/sync
            if isinstance(r, (P.ProgramExec, P.GraphExec)):
                self._pending_launches = not r.wait
            elif isinstance(r, (P.CopyOut, P.Synchronize)):
                self._pending_launches = False
        return results, out_blobs

    def synchronize(self) -> None:
        """Send what is queued and wait until the server's device has finished it."""
        with self._lock:
            if self._queue or self._pending_launches:
                self._submit(P.Synchronize())

    # --- the served device's face

    @property
    def properties(self) -> dict[str, Any]:
        """The served device's facts (fetched once): kind, device, launch_style, compiler, limits, info."""
        with self._lock:
            if self._props is None:
                results, _ = self._submit(P.GetProperties())
                self._props = checked_properties(results[-1], self._connection().address)
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

    def __getattr__(self, name: str) -> Any:
        """The served device's other plain facts (`cores`, `has_fp16`, ...): an AttributeError where it has none,
        as locally."""
        if name.startswith("_"):
            raise AttributeError(name)
        attrs = self.properties.get("attrs")
        if isinstance(attrs, dict) and name in attrs:
            return attrs[name]
        raise AttributeError(f"the device served over REMOTE has no attribute '{name}'")

    def info(self) -> dict[str, Any]:
        """The served device's facts, plus `serves` (its name) and `server` (host:port)."""
        p = self.properties
        host, port = self.conn_address
        out: dict[str, Any] = {"serves": p["device"], "server": f"{host}:{port}"}
        if isinstance(p.get("info"), dict):
            out.update({k: v for k, v in p["info"].items() if k not in out})
        out.setdefault("renderer", p.get("renderer"))
        out.setdefault("compiler", p.get("compiler"))
        return out


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
