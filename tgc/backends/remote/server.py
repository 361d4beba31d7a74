"""`tgc serve`: a local device served over HTTP for the REMOTE device.

One endpoint, `POST /batch` (see `protocol`). Every request must carry `Authorization: Bearer TOKEN`
when the server has a token (compared in constant time; anything else gets 401 and nothing more)
and `X-Tgc-Session: ID`, a random id the client picks. Each session has its own tables of buffers,
programs and graphs, numbered by the client, so no session can name another's objects. A session
idle for `idle_timeout` seconds is freed.

Every fault a client can cause comes back as an HTTP error with a one-line message and the kind in
`X-Tgc-Error`: 400 protocol (a malformed body or request, a binary the device cannot load), 401 auth,
404 session (an unknown buffer/program/graph/session), 405/411 protocol, 408/413 limit (request time,
body size, buffer size, session memory, objects), 422 compile (the compiler's message), 500 device (the
device raised while running), 503 busy (too many sessions, shutting down), 507 device (out of memory).
The requests of a batch run in order and stop at the first failure. A session runs one batch at a time.
For the CPU, batches of different sessions run at once: buffers live in a shared arena and launches run in
worker processes (`launcher`), which the server kills when a kernel is still running at the batch's
deadline; a launch of a kernel proven short and inside its buffers (`shortproof`, checked when the server compiles
it) runs inline in the request thread instead, with no worker round trip. Other devices run one batch at a time
(their surface is not assumed thread-safe) and stop a batch at its deadline between launches. Bodies are read
and parsed in parallel.

Sessions belong to an owner: the name of the client's token (a server may take one token per client), or
the client's address without a token; sessions are limited per owner and per address (see `Limits`).

Launches are checked: a kernel's source ends in its launch contract (see `parse_contract`); for the CPU
the server loads only binaries it compiled, and refuses launches with the wrong buffers, too-small
buffers, a larger grid than the kernel's or more work-items than the device allows. Compiles of the CPU
run in a worker process. Still, a client can run native code on this machine (a contract is what the
client's source declares), so without a token the server listens on loopback only; give a token before
serving anything wider. Fresh buffers are zeroed; requests have a deadline (`request_time`): a watchdog
closes connections that read or write past it, and a batch is stopped at it (see above); sessions,
connections and memory are capped (see `Limits`).

Run it as `tgc serve ...` (tgc/cli/main.py holds its only option parser). Modules: `server` (this one: the
request executor, `RemoteServer`, and `main_serve`), `transport` (HTTP), `session` (per-client tables),
`contract` (launch contracts), `limits` (`Limits`, `Refusal`), `launcher` (the CPU's arena and launch workers).
"""

from __future__ import annotations

import dataclasses
import errno
import hmac
import ipaddress
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from tgc.backends import canonical, default_device, device_class, get_device
from tgc.backends.remote import protocol as P
from tgc.backends.remote.contract import MAX_CONTRACT_BUFS as MAX_CONTRACT_BUFS
from tgc.backends.remote.contract import MAX_CONTRACTS as MAX_CONTRACTS
from tgc.backends.remote.contract import Contract as Contract
from tgc.backends.remote.contract import Known as Known
from tgc.backends.remote.contract import breach, remember
from tgc.backends.remote.contract import parse_contract as parse_contract
from tgc.backends.remote.limits import Limits as Limits
from tgc.backends.remote.limits import MiB as MiB
from tgc.backends.remote.limits import Refusal as Refusal
from tgc.backends.remote.session import Buffer as Buffer
from tgc.backends.remote.session import Session as Session
from tgc.backends.remote.staging import MAP_MIN, MappedBlock, map_for_reading, mappable
from tgc.backends.remote.transport import _Handler, _HTTPServer, _HTTPServer6
from tgc.errors import DeviceError, TgcError


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback IP addresses (127.0.0.0/8, ::1)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token(token_file: str | None = None, env: dict[str, str] | None = None) -> str | None:
    """The token from `token_file`, else `TGC_REMOTE_TOKEN`, else the file in `TGC_REMOTE_TOKEN_FILE`.
    TgcError (exit 2) for a file that cannot be read or a token that cannot go in an HTTP header."""
    env = os.environ if env is None else env
    if token_file is None and env.get("TGC_REMOTE_TOKEN"):
        token = env["TGC_REMOTE_TOKEN"].strip()
        why = P.token_problem(token)
        if why is not None:
            raise TgcError(f"TGC_REMOTE_TOKEN cannot be used: {why}")
        return token
    token_file = token_file or env.get("TGC_REMOTE_TOKEN_FILE") or None
    if token_file is None:
        return None
    return P.read_token_file(token_file)


def read_server_tokens(path: str) -> dict[str, str]:
    """The tokens a server accepts, from the file `path`: {token: name}. One line holding one token (the
    classic form: its name is 'the token'), or several lines of `NAME TOKEN` (or a bare `TOKEN`, named
    'token K' for its line K among the tokens), `#` comments and blank lines skipped: one token per client, so
    that each is limited and named on its own. TgcError (exit 2) for an unreadable file, a bad token, a
    repeated token or name, or a file without tokens."""
    text = P.read_token_text(path)
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if not lines:
        raise TgcError(f"the token file '{path}' holds no token")
    if len(lines) == 1 and len(lines[0].split()) == 1:
        return {P.read_token_file(path, lines[0]): "the token"}
    tokens: dict[str, str] = {}
    for k, line in enumerate(lines, 1):
        parts = line.split()
        if len(parts) > 2:
            raise TgcError(f"the token file '{path}': line {k} of tokens is not 'NAME TOKEN' or 'TOKEN'")
        name, token = (parts[0], parts[1]) if len(parts) == 2 else (f"token {k}", parts[0])
        why = P.token_problem(token)
        if why is not None or (len(parts) == 2 and P.token_problem(name) is not None):
            raise TgcError(f"the token file '{path}': the token of line {k} of tokens cannot be used: "
                           f"{why or 'its name holds characters other than printable ASCII'}")
        if token in tokens or name in tokens.values():
            raise TgcError(f"the token file '{path}': line {k} of tokens repeats a "
                           f"{'token' if token in tokens else 'name'}")
        tokens[token] = name
    return tokens


def _sessions(n: int) -> str:
    return f"{n} session{'' if n == 1 else 's'}"


def _plain(value: Any, depth: int = 0) -> Any:
    """`value` as literals that `protocol.to_text` can write (other objects become strings)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth > 8:
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    return str(value)


def _device_attrs(dev: Any) -> dict[str, bool | int | float | str]:
    """The served device's other public facts that are plain values, as its class declares them (the launch
    limits, its cores, its runtime features), so the client can show them: optimizers and renderers may read
    them (`RemoteDevice.served_fact`)."""
    facts: dict[str, Any] = {"cores": dev.cores, "max_buffer_bytes": dev.max_buffer_bytes,
                             "max_local_size": dev.max_local_size, "max_shared_bytes": dev.max_shared_bytes,
                             **dataclasses.asdict(dev.runtime)}
    return {k: v for k, v in sorted(facts.items()) if type(v) in (bool, int, float, str)}


class _Sized:
    """A buffer's size alone, as `breach` reads it."""

    __slots__ = ("size",)

    def __init__(self, size: int):
        self.size = size


# requests that change no buffer: a copy out after which only these follow may be answered from the buffer itself
_READ_ONLY = (P.CopyOut, P.ReadRange, P.Synchronize, P.GetProperties)


def _read_only_tail(requests: Sequence[P.Request]) -> int:
    """The index from which every request of a batch is one that changes no buffer (`_READ_ONLY`)."""
    i = len(requests)
    while i and isinstance(requests[i - 1], _READ_ONLY):
        i -= 1
    return i


_LAZY: dict[str, Any] = {}  # what the launch path imports on first use (numpy, the CPU backend, the launcher)


def _launch_class() -> Any:
    """`launcher.Launch` (imported once, when a server first launches in workers)."""
    cls = _LAZY.get("Launch")
    if cls is None:
        from tgc.backends.remote.launcher import Launch
        cls = _LAZY["Launch"] = Launch
    return cls


def data_address(handle: Any) -> int:
    """`tgc.backends.cpu.data_address` (imported once, when first needed)."""
    fn = _LAZY.get("data_address")
    if fn is None:
        from tgc.backends.cpu import data_address as fn
        _LAZY["data_address"] = fn
    return fn(handle)


def _is_host_array(handle: Any) -> bool:
    """Whether a buffer handle is a 1-D numpy byte array (host memory, `HostAllocator`)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(handle, np.ndarray) and handle.dtype == np.uint8 and handle.ndim == 1


class RemoteServer:
    """Serves one local device. `serve_forever()` in this thread, or `start()` a background thread."""

    def __init__(self, device: str, host: str = "127.0.0.1", port: int = P.DEFAULT_PORT,
                 token: str | dict[str, str] | None = None, limits: Limits | None = None, verbose: bool = False):
        if not token and not is_loopback(host):
            raise TgcError(f"refusing to serve on the non-loopback address {host} without a token",
                           hint="give it a token (token=..., or set TGC_REMOTE_TOKEN), or serve on 127.0.0.1",
                           cli_hint="pass --token-file FILE (or set TGC_REMOTE_TOKEN), or serve on 127.0.0.1")
        self.device_name, self.verbose = device, verbose
        # the tokens accepted, each with the name that owns its sessions ({} serves without a token)
        self.tokens: dict[str, str] = {token: "the token"} if isinstance(token, str) else dict(token or {})
        self.token = next(iter(self.tokens), None)
        self.limits = limits or Limits()
        self.lock = threading.RLock()  # held while the session table or memory counts change (briefly)
        # devices whose launches run in this process run one batch at a time; the CPU's run in launch workers
        self.device_lock = threading.Lock()
        self._arena: Any = None  # CPU: every session's buffers, shared with the launch workers
        self._staged_bytes = 0  # request blobs received into the arena now (`stage_block`)
        self._stage_pool: dict[int, list[Any]] = {}  # arena blocks kept for staging, by size (`_pool_block`)
        self._pooled_bytes = 0
        self.launchers: Any = None  # CPU: the launch worker processes (`launcher.LaunchWorkers`)
        self._cache_lock = threading.Lock()  # the compiled and known tables below
        self.sessions: dict[str, Session] = {}
        # ids of sessions the server freed on its own (idle, evicted) -> (owner, why): a later batch of one is refused
        # with that reason, rather than run on a fresh empty session whose buffers and programs it does not know
        self._expired: OrderedDict[str, tuple[str, str, bool]] = OrderedDict()
        self.instance = secrets.token_hex(16)  # names this server process in clients' cache keys
        self._device: Any = None
        self._native: bool | None = None  # `uses_launch_workers`, once known
        self._maps: bool | None = None  # `maps_buffers`, once known
        self._work_cap: tuple[int | None] | None = None  # `_max_work_items`, once known
        # sha256(src) -> (ok, lib|msg, proven short (`shortproof`; None: not asked))
        self._compiled: OrderedDict[str, tuple[bool, bytes | str, bool | None]] = OrderedDict()
        self._compiled_bytes = 0  # what `_compiled` holds, in bytes of binaries and messages (`_keep_compiled`)
        self.body_bytes = 0  # bytes of request bodies being received or run now, all connections (`transport`)
        self.body_owners: dict[str | None, int] = {}  # of them, by owner (token name, or address): at most half each
        self._known: OrderedDict[str, Known] = OrderedDict()  # sha256(binary) -> what the source said, first wins
        self._workers: Any = None  # compile worker processes (CPU), started on the first compile
        self._workers_lock = threading.Lock()
        self.inline_launches = 0  # CPU launches run inline, without a launch worker (for tests and logs)
        # open connections -> the time by which the request being read (or answer being written) must be done,
        # or None while a batch runs; the watchdog closes connections past it (slow or idle peers)
        self.conns: dict[Any, float | None] = {}
        # open connections that have not yet shown a token the server takes -> the client's address, oldest first
        # (`max_connections_per_client`, `transport.max_untrusted`)
        self.conn_peers: dict[Any, str] = {}
        self.conn_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        cls = _HTTPServer6 if ":" in host else _HTTPServer
        try:
            self.httpd = cls((host.strip("[]"), port), _Handler)
        except OSError as e:
            # a --host that names no host or no address of this machine is the user's to fix (exit 2); a port
            # in use, or one this user may not take, stays a failure to serve (exit 1)
            bad_host = (isinstance(e, socket.gaierror) and e.errno == socket.EAI_NONAME) or \
                e.errno == errno.EADDRNOTAVAIL
            raise DeviceError(f"cannot listen on {host}:{port}: {e.strerror or e}", kind="user" if bad_host else
                              "runtime", hint="--host names an address of this machine" if bad_host else None
                              ) from None
        self.httpd.app = self
        self.host, self.port = host, self.httpd.server_address[1]

    @property
    def url(self) -> str:
        host = f"[{self.host.strip('[]')}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def device(self) -> Any:
        """The served device, opened on first use."""
        if self._device is None:
            try:
                self._device = get_device(self.device_name)
            except TgcError:
                raise
            except Exception as e:
                raise DeviceError(f"cannot open {self.device_name}: {type(e).__name__}: {e}") from None
        return self._device

    # --- lifetime

    def serve_forever(self) -> None:
        """Serve until `shutdown()` (from another thread) or KeyboardInterrupt; the idle reaper runs beside."""
        self._start_reaper()
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> RemoteServer:
        """Serve from a background thread (for tests and embedding)."""
        t = threading.Thread(target=self.serve_forever, name="tgc-serve", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def shutdown(self) -> int:
        """Stop serving, free every session; returns how many sessions were freed. Safe to call twice."""
        self._stop.set()
        if any(t.is_alive() for t in self._threads if t.name == "tgc-serve"):
            self.httpd.shutdown()
        return self.close()

    def close(self) -> int:
        self._stop.set()
        self.httpd.server_close()
        with self._workers_lock:
            if self._workers is not None:
                try:
                    self._workers.shutdown()
                except Exception:
                    pass
                self._workers = None
        if self.launchers is not None:
            self.launchers.close()
        if not self.lock.acquire(timeout=5.0):  # a batch still running: the process is going away anyway
            return len(self.sessions)
        try:
            n = len(self.sessions)
            for s in list(self.sessions.values()):
                self._end_session(s)
            for blocks in self._stage_pool.values():  # (mapped device buffers are freed here; the rest go with
                for block in blocks:                  # the arena or the heap)
                    if isinstance(block, MappedBlock):
                        block.release()
            self._stage_pool.clear()
            self._pooled_bytes = 0
            if self._arena is not None:  # (a mapping still in use by a handle stays until that is gone)
                self._arena.close()
                self._arena = None
        finally:
            self.lock.release()
        return n

    def _start_reaper(self) -> None:
        period = max(0.05, min(1.0, self.limits.idle_timeout / 4, self.limits.request_time / 4))

        def loop() -> None:
            while not self._stop.wait(period):
                try:  # (one failed pass must not end the reaping: slow peers and idle sessions would stay forever)
                    self.close_late_connections()
                    self.reap_idle()
                except Exception as e:
                    print(f"tgc serve: the reaper's pass failed: {type(e).__name__}: {e}", file=sys.stderr,
                          flush=True)
        t = threading.Thread(target=loop, name="tgc-serve-reaper", daemon=True)
        t.start()
        self._threads.append(t)

    def close_late_connections(self, now: float | None = None) -> int:
        """Shut the connections whose request (or answer) has taken longer than `request_time`: a slow client
        cannot hold a thread longer than that. Returns how many."""
        now = time.monotonic() if now is None else now
        with self.conn_lock:
            late = [c for c, deadline in self.conns.items() if deadline is not None and now > deadline]
        for c in late:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return len(late)

    def trust(self, conn: Any) -> None:
        """A request on `conn` showed a token the server takes: it no longer counts as untrusted."""
        with self.conn_lock:
            self.conn_peers.pop(conn, None)

    def set_deadline(self, conn: Any, seconds: float | None) -> None:
        with self.conn_lock:
            if conn in self.conns:
                self.conns[conn] = None if seconds is None else time.monotonic() + max(seconds, 1.0)

    def reap_idle(self, now: float | None = None) -> int:
        """Free the sessions idle for longer than `idle_timeout`; returns how many."""
        now = time.monotonic() if now is None else now
        with self.lock:
            idle = [s for s in self.sessions.values()
                    if not s.busy and now - s.last_seen > self.limits.idle_timeout]
            for s in idle:
                self._forget(s, f"the server freed this session after {now - s.last_seen:.0f}s idle (its "
                                f"--idle-timeout is {self.limits.idle_timeout:g}s)")
            if idle:
                self._trim_pool()
        if idle and self.verbose:
            print(f"tgc serve: freed {len(idle)} idle session(s)", file=sys.stderr, flush=True)
        return len(idle)

    def authorized(self, header: str | None) -> bool:
        """Whether an `Authorization` header carries a token (always true without a token)."""
        return not self.tokens or self.token_name(header) is not None

    def token_name(self, header: str | None) -> str | None:
        """The name of the token an `Authorization` header carries (None for none or a wrong one). Every
        token is compared, each in constant time."""
        scheme, _, value = (header or "").partition(" ")
        sent = value.encode("utf-8", "replace")
        found = None
        for token, name in self.tokens.items():
            if hmac.compare_digest(sent, token.encode("utf-8")):
                found = name
        return found if scheme.lower() == "bearer" else None

    # --- CPU launches in worker processes

    @property
    def uses_launch_workers(self) -> bool:
        """Whether launches run in killable worker processes (a device whose kernels are native code here)."""
        if self._native is None:  # (a fact of the device's class: asked once)
            self._native = bool(self.device.runtime.native_launch)
        return self._native

    @property
    def allocator(self) -> Any:
        """Where session buffers live: the shared arena for the CPU, else the device's allocator."""
        if self._arena is not None:
            return self._arena
        if not self.uses_launch_workers:
            return self.device.allocator
        with self._workers_lock:
            if self._arena is None:
                from tgc.backends.remote.launcher import LaunchWorkers, SharedArena
                lim = self.limits
                self._arena = SharedArena(2 * lim.max_memory + 64 * MiB)  # room for alignment and fragments
                self.launchers = LaunchWorkers(self._arena, self.concurrency)
                threading.Thread(target=self.launchers.warm, name="tgc-serve-warm", daemon=True).start()
        return self._arena

    @property
    def concurrency(self) -> int:
        """How many batches of different sessions may run launches at once: the device's threads (its cores),
        at least 2, so that one client's long kernel never stalls every other client."""
        try:
            return max(2, int(self.device.cores))
        except Exception:
            return 2

    # --- batches

    def _session(self, sid: str, client: str = "", token: str | None = None) -> Session:
        """Session `sid`, made for its owner when new. The owner is the token's name, or the client's address
        where the server has no token. Refusals: a session of another owner (403), and (503) a full session
        table or an owner (or address) at its limit whose sessions were all used within `evict_after`."""
        owner = token if self.tokens else f"address {client}"
        s = self.sessions.get(sid)
        if s is not None:
            if s.owner != owner:
                raise Refusal(403, "auth", "this session id belongs to another client's token; pick another id")
            return s
        gone = self._expired.get(sid)
        if gone is not None and gone[0] == owner:
            fix = ("serve with a larger --max-sessions, --max-sessions-per-token or --max-sessions-per-client"
                   if gone[2] else "serve with a longer --idle-timeout")
            raise Refusal(404, "session", f"{gone[1]}: its buffers, programs and graphs are gone; run again (a "
                                          f"new process starts a new session), or {fix}")
        lim = self.limits
        when = (f"all used in the last {lim.evict_after:g}s; end one (a client ends its session when it closes) "
                f"or retry when one has been idle {lim.evict_after:g}s")
        same_address = [x for x in self.sessions.values() if x.client == client]
        if len(same_address) >= lim.max_sessions_per_client and not self._evict(same_address):
            raise Refusal(503, "busy", f"this client address ({client}) holds {_sessions(len(same_address))}, "
                                       f"the limit per client address, {when}")
        mine = [x for x in self.sessions.values() if x.owner == owner]
        if len(mine) >= lim.max_sessions_per_token and not self._evict(mine):
            whose = (f"this token ('{token}') holds {_sessions(len(mine))}, the limit per token" if self.tokens else
                     f"this address ({client}) holds {_sessions(len(mine))}, the limit per token (the server has "
                     "no token, so every client at one address counts as one)")
            raise Refusal(503, "busy", f"{whose}, {when}")
        if len(self.sessions) >= lim.max_sessions:
            self.reap_idle()
        if len(self.sessions) >= lim.max_sessions and not self._evict(list(self.sessions.values())):
            raise Refusal(503, "busy", f"the server holds {len(self.sessions)} sessions, its limit; try later")
        s = self.sessions[sid] = Session(sid, client=client, owner=owner)
        return s

    # how many ids of sessions freed by the server it remembers (`_forget`)
    MAX_EXPIRED = 4096

    def _forget(self, session: Session, why: str, evicted: bool = False) -> None:
        """End a session the server frees on its own (idle, or `evicted` to make room), remembering its id and
        `why` where it held something (caller holds `lock`)."""
        held = session.objects
        self._end_session(session)
        if not held:  # (an empty session lost nothing: it may simply start again)
            return
        self._expired[session.id] = (session.owner, why, evicted)
        self._expired.move_to_end(session.id)
        while len(self._expired) > self.MAX_EXPIRED:
            self._expired.popitem(last=False)

    def _evict(self, candidates: list[Session]) -> bool:
        """Free one of `candidates` to make room: an empty one, else the one idle longest (at least
        `evict_after` seconds). False when none may go."""
        now = time.monotonic()
        held = {}  # sessions per owner: among sessions idle alike, the biggest holder's go first
        for s in candidates:
            held[s.owner] = held.get(s.owner, 0) + 1
        idle = sorted((s for s in candidates if not s.busy), key=lambda s: (-held[s.owner], s.last_seen))
        victim = next((s for s in idle if not s.objects), None)
        if victim is None:
            victim = next((s for s in idle if now - s.last_seen >= self.limits.evict_after), None)
        if victim is None:
            return False
        self._forget(victim, f"the server freed this session, idle for {now - victim.last_seen:.0f}s, to make room "
                             "for another (its session limits)", evicted=True)
        if self.verbose:
            print("tgc serve: evicted an idle session to make room", file=sys.stderr, flush=True)
        return True

    # bytes of request blobs received into the shared arena at once, all connections together, and of blocks kept
    # for that (`stage_block`, `_pool_block`); the arena has this much room beyond twice the memory limit
    STAGE_LIMIT = 64 * MiB
    # the least bytes of a blob received into a staging block: below it a blob is read as bytes and a CopyIn copies
    # it (a copy of 64 KiB costs a few microseconds, less than taking, adopting and pooling a block under the lock)
    STAGE_MIN = 64 << 10

    def stage_block(self, size: int) -> Any | None:
        """A block of `size` bytes of the shared arena for a request blob to be received into (`protocol.read_body`),
        which a CopyIn of exactly that size may then adopt as its buffer's memory (no copy). Where buffers do not
        live in the arena (OpenCL, CUDA, PYTHON), a host `bytearray` instead, kept for later blobs of its size like
        an arena block: a CopyIn copies it into the device buffer, so no blob costs a fresh allocation (and its
        page faults). None when `STAGE_LIMIT` bytes are staged already or the arena is full (the blob is then
        received as bytes). Give it back with `unstage` unless adopted."""
        if size > self.limits.max_buffer or size < self.STAGE_MIN:
            return None
        spare: list[tuple[Any, int]] = []
        with self.lock:
            pool = self._stage_pool.get(size)
            if pool:  # (a block whose pages are already mapped: the arena gives a freed block's pages back)
                self._pooled_bytes -= size
                self._staged_bytes += size
                return pool.pop()
            while self._staged_bytes + self._pooled_bytes + size > self.STAGE_LIMIT and self._pooled_bytes:
                n, blocks = next((n, b) for n, b in self._stage_pool.items() if b)
                spare.append((blocks.pop(), n))
                self._pooled_bytes -= n
            if self._staged_bytes + self._pooled_bytes + size > self.STAGE_LIMIT:
                return None
            self._staged_bytes += size
        for block, n in spare:
            self._release_block(block, n)
        try:
            if self.uses_launch_workers:
                return self.allocator.alloc(size)
            if self.maps_buffers and size >= MAP_MIN:
                return MappedBlock.fresh(self.device, size)
            return bytearray(size)
        except Exception:  # (MemoryError; an OpenCL allocation or mapping error: the blob is read as bytes)
            with self.lock:
                self._staged_bytes -= size
            return None

    def unstage(self, handle: Any, size: int, free: bool = True) -> None:
        """Give a staged block back (`free`), or count it as adopted by a buffer (not given back)."""
        with self.lock:
            self._staged_bytes -= size
        if free:
            self._pool_block(handle, size)

    def _pool_block(self, block: Any, size: int) -> None:
        """Keep an arena block for a later blob of its size while staged and pooled blocks stay within
        `STAGE_LIMIT` (its bytes are never shown: a block is adopted only once a blob has filled it), else free it."""
        with self.lock:
            if self._staged_bytes + self._pooled_bytes + size <= self.STAGE_LIMIT:
                self._stage_pool.setdefault(size, []).append(block)
                self._pooled_bytes += size
                return
        self._release_block(block, size)

    def _release_block(self, block: Any, size: int) -> None:
        if isinstance(block, MappedBlock):  # (a mapped device buffer: not the allocator's, freed here)
            block.release()
        elif not isinstance(block, bytearray):  # (an arena block; a host staging bytearray just goes)
            self.allocator.free(block, size)

    @property
    def maps_buffers(self) -> bool:
        """Whether request blobs are received into mapped device buffers (`staging.MappedBlock`: OpenCL) that a
        CopyIn adopts, rather than into host staging buffers."""
        if self._maps is None:
            self._maps = not self.uses_launch_workers and mappable(self.device)
        return self._maps

    def run_batch(self, sid: str, body: bytes | tuple[dict[str, memoryview], str], client: str = "",
                  token: str | None = None, timings: list[tuple[str, int, int, int]] | None = None,
                  send: Callable[[list[bytes | memoryview]], None] | None = None,
                  staged: dict[str, Any] | None = None) -> list[bytes | memoryview]:
        """Run the requests of one body for session `sid` of the client at address `client` with the token named
        `token` (see `token_name`); the response body's parts, or a `Refusal`.

        A session's batches run one at a time; different sessions' run at once where launches run in worker
        processes (the CPU), else one at a time. Each batch must be done `request_time` seconds after it starts
        running (waiting for the session's previous batch not counted). `timings` (a list; a client recording a
        profile asks for it) receives (name, count, start_ns, end_ns) for decoding the body, each request (a run
        of launches handed to the workers: one entry) and encoding the answer.

        With `send`, the answer's parts are handed to `send`. A host-memory buffer of at least `LARGE_BLOB` bytes
        copied out by a request that no later request of the batch can change is then sent straight from the
        buffer (a view, no copy; `_do_CopyOut`): such an answer is sent while the session's lock is still held
        and the session counted busy (never evicted or reaped meanwhile), so no other batch of the session can
        free or write the buffer before the answer is out. Other answers are sent once the session is free.

        `body` is the body's bytes, or its blobs and text already read (`protocol.read_body`); `staged` maps the
        ids of blobs received into arena blocks (`stage_block`) to those blocks: a CopyIn that is the only
        request naming such a blob, into a whole buffer of its size with no views, adopts the block as the
        buffer's memory (the old one is freed) and removes it from `staged`; the caller frees what is left."""
        start = time.perf_counter_ns()
        try:
            if isinstance(body, tuple):
                blobs, text = body
                requests = P.parse_requests(text, max_text=self.limits.max_text, max_nodes=self.limits.max_nodes)
            else:
                requests, blobs = P.decode_requests(body, max_text=self.limits.max_text,
                                                    max_nodes=self.limits.max_nodes)
        except P.ProtocolError as e:
            raise Refusal(400, "protocol", str(e)) from None
        if timings is not None:
            timings.append(("Decode", 1, start, time.perf_counter_ns()))
        # the sessions the batch Transfers into (locked with its own: see below); EndSession must end its batch (a
        # request after it would run on a session no longer in the table, whose buffers nothing frees or counts)
        dests, last = set(), len(requests) - 1
        for i, r in enumerate(requests):
            kind = type(r)
            if kind is P.Transfer:
                dests.add(r.dest_session)
            elif kind is P.EndSession and i < last:
                raise Refusal(400, "protocol", f"request {i + 1} ({type(requests[i + 1]).__name__}) follows "
                                               f"EndSession (request {i}): EndSession must end its batch")
        with self.lock:
            if self._stop.is_set():
                raise Refusal(503, "busy", "the server is shutting down")
            session = self._session(sid, client, token)
            # the owner's other sessions this batch Transfers into: counted busy (never reaped or evicted meanwhile)
            # and locked with this one, all in the order of their ids (no deadlock between two batches that
            # transfer into each other's sessions), so that no batch of theirs frees or reuses a buffer meanwhile
            peers = {x: p for x in dests
                     if x != sid and (p := self.sessions.get(x)) is not None and p.owner == session.owner}
            for held in (session, *peers.values()):
                held.busy += 1
        locks = [x.lock for x in sorted((session, *peers.values()), key=lambda x: x.id)]
        taken: list[threading.Lock] = []
        try:
            for lock in locks:
                lock.acquire()
                taken.append(lock)
            session.peers = peers
            try:
                parts = self._run_held(session, requests, blobs, timings, send, staged)
            finally:  # (no later batch of the session may touch a buffer while it is mapped)
                session.peers = {}
                maps, session.maps = session.maps, []
                for m in maps:
                    m.release(self.device.queue)
        finally:
            for lock in reversed(taken):
                lock.release()
            with self.lock:
                session.busy -= 1
                session.last_seen = time.monotonic()
                for held in peers.values():
                    held.busy -= 1
                self._trim_pool()
        if send is not None and not session.aliased:  # (a copied answer: sent with the session free, as before)
            send(parts)
        return parts

    def _run_held(self, session: Session, requests: list[P.Request], blobs: dict[str, memoryview],
                  timings: list[tuple[str, int, int, int]] | None,
                  send: Callable[[list[bytes | memoryview]], None] | None,
                  staged: dict[str, Any] | None) -> list[bytes | memoryview]:
        """The part of `run_batch` run with the session's lock held: the requests, and an answer that holds views of
        the session's buffers sent."""
        if self.sessions.get(session.id) is not session:
            raise Refusal(404, "session", "the session ended while this batch waited for its turn")
        session.alias_from = _read_only_tail(requests) if send is not None else len(requests) + 1
        session.aliased = False
        session.staged = {} if not staged else staged
        if staged:
            uses: dict[str, int] = {}
            for r in requests:
                h = r.blob()
                if h is not None:
                    uses[h] = uses.get(h, 0) + 1
            session.staged = {h: v for h, v in staged.items() if uses.get(h) == 1}
        try:
            if self.uses_launch_workers:
                results, out_blobs = self._run(session, requests, blobs, timings)
            else:
                with self.device_lock:
                    results, out_blobs = self._run(session, requests, blobs, timings)
        finally:
            session.alias_from = len(requests) + 1
            if staged:  # (what was adopted is no longer the caller's to free)
                for h in [h for h in staged if h in session.staged and session.staged[h] is None]:
                    del staged[h]
            session.staged = {}
        st = time.perf_counter_ns()
        parts = P.body_parts(out_blobs, P.to_text(results))
        if timings is not None:
            timings.append(("Encode", 1, st, time.perf_counter_ns()))
        if send is not None and session.aliased:  # views of the session's buffers: sent before it is free
            send(parts)
        return parts

    def _trim_pool(self) -> None:
        """Release the device's pool of freed buffers when it holds more than `max_pooled` bytes (the shared
        arena of the CPU gives freed pages back at once)."""
        if self._arena is not None:
            return
        alloc = self._device.allocator if self._device is not None else None
        if alloc is None or not alloc.features.pool:
            return
        if alloc.pooled_bytes() > self.limits.max_pooled:
            alloc.free_cache()

    def _run(self, session: Session, requests: list[P.Request], blobs: dict[str, memoryview],
             timings: list[tuple[str, int, int, int]] | None = None) -> tuple[list[Any], dict[str, bytes]]:
        results: list[Any] = []
        out_blobs: dict[str, bytes] = {}
        start = time.monotonic()
        session.deadline = start + self.limits.request_time
        session.answer_bytes = 0
        workers = self.uses_launch_workers
        i = 0
        while i < len(requests):
            req = requests[i]
            name = type(req).__name__
            session.index = i
            if i and time.monotonic() - start >= self.limits.request_time:
                raise Refusal(408, "limit", f"the batch ran past the request time limit of "
                                            f"{self.limits.request_time:g}s; stopped before request {i} ({name})")
            if workers and name == "ProgramExec":  # a run of launches: one message to a worker
                end = i + 1
                while end < len(requests) and type(requests[end]).__name__ == "ProgramExec":
                    end += 1
                group, first = requests[i:end], i
                st = time.perf_counter_ns()
                times = self._run_in_workers(session, group, lambda a, b, f=first: f"request {f + a} (ProgramExec)"
                                             if a == b else f"requests {f + a}..{f + b} (ProgramExec)")
                if timings is not None:
                    timings.append((name, len(group), st, time.perf_counter_ns()))
                results += [t if r.wait else None for r, t in zip(group, times)]
                i = end
                continue
            try:
                st = time.perf_counter_ns()
                results.append(getattr(self, "_do_" + name)(session, req, blobs, out_blobs))
                if timings is not None:
                    timings.append((name, 1, st, time.perf_counter_ns()))
                i += 1
            except Refusal as e:
                if e.kind == "compile":
                    raise
                raise Refusal(e.status, e.kind, f"request {i} ({name}): {e.msg}") from None
            except P.ProtocolError as e:
                raise Refusal(400, "protocol", f"request {i} ({name}): {e}") from None
            except MemoryError:
                raise Refusal(507, "device", f"request {i} ({name}): {self.device_name} is out of memory") from None
            except Exception as e:
                msg = e.msg if isinstance(e, TgcError) else f"{type(e).__name__}: {e}"
                raise Refusal(500, "device", f"request {i} ({name}): {self.device_name} failed: {msg}") from None
        return results, out_blobs

    # --- lookups

    @staticmethod
    def _get(table: dict[int, Any], num: int, what: str) -> Any:
        if num not in table:
            raise Refusal(404, "session", f"no {what} {num} in this session")
        return table[num]

    def _new_id(self, session: Session, table: dict[int, Any], num: int, what: str) -> None:
        if num in table:
            raise Refusal(400, "protocol", f"{what} {num} already exists in this session")
        if session.objects >= self.limits.max_objects:
            raise Refusal(413, "limit", f"the session holds {session.objects} objects, the limit")

    @staticmethod
    def _blob(blobs: dict[str, memoryview], h: str) -> memoryview:
        if h not in blobs:
            raise Refusal(400, "protocol", f"no blob with hash {h[:16]}... in the body")
        return blobs[h]

    # --- one handler per request

    def _do_GetProperties(self, session: Session, req: P.GetProperties, blobs, out) -> dict[str, Any]:
        dev, lim = self.device, self.limits
        comp = dev.compiler
        try:
            info = _plain(dev.info())
        except Exception as e:  # facts for display must not fail a client
            info = {"error": f"{type(e).__name__}: {e}"}
        renderer = dev.renderer
        return {"kind": dev.kind, "device": dev.name, "launch_style": dev.launch_style,
                "renderer": None if renderer is None else type(renderer).__name__,
                "compiler": comp.name if comp is not None else None,
                "compiler_version": str(comp.version) if comp is not None else None,
                "compile_error": dev.compile_error, "info": info,
                "offset": dev.allocator.features.offsets, "attrs": _device_attrs(dev),
                "max_body": lim.max_body, "max_buffer": lim.max_buffer,
                "max_session_memory": lim.max_session_memory, "request_time": lim.request_time,
                "idle_timeout": lim.idle_timeout, "instance": self.instance}

    def _do_BufferAlloc(self, session: Session, req: P.BufferAlloc, blobs, out) -> None:
        self._new_id(session, session.buffers, req.buf, "buffer")
        lim = self.limits
        if req.size > lim.max_buffer:
            raise Refusal(413, "limit", f"a buffer of {req.size} bytes exceeds the limit of {lim.max_buffer} bytes")
        if session.memory + req.size > lim.max_session_memory:
            raise Refusal(413, "limit", f"allocating {req.size} bytes would pass the session memory limit of "
                                        f"{lim.max_session_memory} bytes ({session.memory} live)")
        with self.lock:  # counted before allocating: sessions allocate at once
            total = sum(x.memory for x in self.sessions.values())
            if total + req.size > lim.max_memory:
                raise Refusal(413, "limit", f"allocating {req.size} bytes would pass the server's memory limit of "
                                            f"{lim.max_memory} bytes ({total} live in all sessions)")
            session.memory += req.size
        try:
            handle = self.allocator.alloc(req.size)
        except BaseException:
            with self.lock:
                session.memory -= req.size
            raise
        try:  # a reused buffer holds what an earlier session left there: never show it to this one
            if self.allocator.features.host_buffers:  # host memory (a numpy array): no temporary
                handle.fill(0)
            else:
                self.allocator.copyin(handle, memoryview(bytearray(req.size)))
        except BaseException:
            self.allocator.free(handle, req.size)
            with self.lock:
                session.memory -= req.size
            raise
        session.buffers[req.buf] = Buffer(handle, req.size)

    def _free_buffer(self, session: Session, num: int) -> None:
        buf = session.buffers.pop(num)
        if buf.parent is not None:
            parent = session.buffers.get(buf.parent)
            if parent is not None:
                parent.views.discard(num)
            return
        for v in buf.views:  # views die with their buffer
            session.buffers.pop(v, None)
        with self.lock:
            session.memory -= buf.size
        self.allocator.free(buf.handle, buf.size)

    def _do_BufferFree(self, session: Session, req: P.BufferFree, blobs, out) -> None:
        self._get(session.buffers, req.buf, "buffer")
        self._free_buffer(session, req.buf)

    def _do_BufferOffset(self, session: Session, req: P.BufferOffset, blobs, out) -> None:
        base = self._get(session.buffers, req.buf, "buffer")
        self._new_id(session, session.buffers, req.sub, "buffer")
        if not self.allocator.features.offsets:
            raise Refusal(400, "device", f"{self.device_name} does not support buffer views")
        if req.offset + req.size > base.size:
            raise Refusal(400, "protocol", f"a view of {req.size} bytes at {req.offset} runs past buffer "
                                           f"{req.buf} of {base.size} bytes")
        root = req.buf if base.parent is None else base.parent
        view = self.allocator.offset(base.handle, req.size, req.offset)
        session.buffers[req.sub] = Buffer(view, req.size, parent=root)
        session.buffers[root].views.add(req.sub)

    def _do_CopyIn(self, session: Session, req: P.CopyIn, blobs, out) -> None:
        buf = self._get(session.buffers, req.buf, "buffer")
        data = self._blob(blobs, req.datahash)
        if len(data) != buf.size:
            raise Refusal(400, "protocol", f"copying {len(data)} bytes into buffer {req.buf} of {buf.size} bytes")
        block = session.staged.get(req.datahash)
        if block is not None and buf.parent is None and not buf.views and _is_host_array(buf.handle) \
                and len(block) == buf.size:
            # the blob was received into an arena block (`stage_block`) and nothing else names it: that block
            # becomes the buffer's memory, and the old one is freed (no copy)
            old, buf.handle = buf.handle, block
            session.staged[req.datahash] = None  # (adopted: `run_batch` tells the caller)
            self.unstage(block, buf.size, free=False)
            self._pool_block(old, buf.size)  # (the next blob of this size is received into it)
            return
        if isinstance(block, MappedBlock) and buf.parent is None and not buf.views and block.size == buf.size:
            # the same for a device buffer the blob was received into through a mapping (OpenCL): it becomes the
            # buffer, and the old buffer, mapped, is kept for the next blob of its size
            old, buf.handle = buf.handle, block.adopt()
            session.staged[req.datahash] = None
            self.unstage(block, buf.size, free=False)
            try:
                kept: Any = MappedBlock(self.device, old, buf.size)
            except Exception:  # (a buffer that cannot be mapped again: back to the device's pool)
                self.allocator.free(old, buf.size)
                return
            self._pool_block(kept, buf.size)
            return
        self.allocator.copyin(buf.handle, data)

    def _do_CopyOut(self, session: Session, req: P.CopyOut, blobs, out) -> str:
        buf = self._get(session.buffers, req.buf, "buffer")
        if _is_host_array(buf.handle) and session.index >= session.alias_from and buf.size >= P.LARGE_BLOB:
            data: bytes | bytearray | memoryview = memoryview(buf.handle).cast("B")  # sent from the buffer itself
            session.aliased = True
        elif self.maps_buffers and session.index >= session.alias_from and buf.size >= MAP_MIN:
            # an OpenCL buffer, mapped for reading (in place where the platform maps so) and sent from the mapping,
            # unmapped once the answer is out (`run_batch`)
            mapped = map_for_reading(self.device, buf.handle, buf.size)
            session.maps.append(mapped.base)
            data = memoryview(mapped)
            session.aliased = True
        elif _is_host_array(buf.handle):  # one copy (no zeroed bytearray filled a second time)
            data = buf.handle.tobytes()
        else:
            data = bytearray(buf.size)
            self.allocator.copyout(memoryview(data), buf.handle)
        h = P.blob_id(data)
        out[h] = data
        return h

    def _range(self, session: Session, num: int, offset: int, size: int) -> Buffer:
        """Buffer `num`, after checking that `size` bytes from `offset` lie inside it."""
        buf = self._get(session.buffers, num, "buffer")
        if offset + size > buf.size:
            raise Refusal(400, "protocol", f"a range of {size} bytes at offset {offset} runs past buffer {num} of "
                                           f"{buf.size} bytes")
        return buf

    def _range_view(self, buf: Buffer, offset: int, size: int, use: Any) -> bool:
        """Call `use` with a view of the range where the device makes one (False where it has no views, or
        refuses this one, e.g. an offset its alignment rules do not allow)."""
        if not self.allocator.features.offsets:
            return False
        try:
            view = self.allocator.offset(buf.handle, size, offset)
        except Exception:
            return False
        use(view)
        return True

    def _read_bytes(self, buf: Buffer, offset: int, size: int) -> bytes | bytearray:
        """`size` bytes of `buf` from `offset` (checked by `_range`)."""
        alloc, handle = self.allocator, buf.handle
        if _is_host_array(handle):  # host memory (a numpy byte array): one copy of just the range
            return handle[offset:offset + size].tobytes()
        data = bytearray(size)
        if size and not self._range_view(buf, offset, size, lambda v: alloc.copyout(memoryview(data), v)):
            whole = bytearray(buf.size)
            alloc.copyout(memoryview(whole), handle)
            data[:] = whole[offset:offset + size]
        return data

    def _write_bytes(self, buf: Buffer, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write `data` into `buf` from `offset` (checked by `_range`)."""
        alloc, handle, n = self.allocator, buf.handle, len(data)
        if not n:
            return
        if _is_host_array(handle):
            import numpy as np
            np.copyto(handle[offset:offset + n], np.frombuffer(data, dtype=np.uint8))
        elif not self._range_view(buf, offset, n, lambda v: alloc.copyin(v, memoryview(data))):
            # no view of this range on this device: read the buffer, patch the range, write it back
            whole = bytearray(buf.size)
            alloc.copyout(memoryview(whole), handle)
            whole[offset:offset + n] = data
            alloc.copyin(handle, memoryview(whole))

    def _do_ReadRange(self, session: Session, req: P.ReadRange, blobs, out) -> str:
        buf = self._range(session, req.buf, req.offset, req.size)
        if session.answer_bytes + req.size > self.limits.max_body:
            raise Refusal(413, "limit", f"the ranges read in one batch pass the body limit of "
                                        f"{self.limits.max_body} bytes")
        session.answer_bytes += req.size
        data = self._read_bytes(buf, req.offset, req.size)
        h = P.blob_id(data)
        out[h] = data
        return h

    def _do_WriteRange(self, session: Session, req: P.WriteRange, blobs, out) -> None:
        data = self._blob(blobs, req.datahash)
        self._write_bytes(self._range(session, req.buf, req.offset, len(data)), req.offset, data)

    def _do_CopyRange(self, session: Session, req: P.CopyRange, blobs, out) -> None:
        src = self._range(session, req.buf, req.offset, req.size)
        dst = self._range(session, req.dest_buf, req.dest_offset, req.size)
        if _is_host_array(src.handle) and _is_host_array(dst.handle):  # numpy copies overlapping ranges right
            import numpy as np
            np.copyto(dst.handle[req.dest_offset:req.dest_offset + req.size],
                      src.handle[req.offset:req.offset + req.size])
            return
        self._write_bytes(dst, req.dest_offset, self._read_bytes(src, req.offset, req.size))

    def _do_Transfer(self, session: Session, req: P.Transfer, blobs, out) -> None:
        src = self._get(session.buffers, req.buf, "buffer")
        # a session of this owner locked for this batch (`run_batch`), still in the table: none of its batches
        # runs now, so its buffer, checked here, cannot be freed (and its memory given to another) while written
        dest_session = session if req.dest_session == session.id else session.peers.get(req.dest_session)
        if dest_session is None or self.sessions.get(req.dest_session) is not dest_session:
            raise Refusal(404, "session", "no such destination session")
        dest = self._get(dest_session.buffers, req.dest_buf, "destination buffer")
        if dest.size != src.size:
            raise Refusal(400, "protocol", f"transfer of {src.size} bytes into a buffer of {dest.size} bytes")
        data = bytearray(src.size)
        self.allocator.copyout(memoryview(data), src.handle)
        self.allocator.copyin(dest.handle, memoryview(data))

    def _compile_text(self, src: str, op: str = "compile", deadline: float | None = None) -> bytes:
        """Compile (or list the assembly of) `src` with the device's compiler. For the CPU it runs in a worker
        process, so that a compiler that aborts (LLVM's fatal errors) loses that process, not the server."""
        return self._run_compiler(src, op, deadline)

    def _compile_printed(self, src: str, deadline: float | None = None) -> tuple[bytes, str]:
        """LLVM IR `src` compiled (as `_compile_text`), and LLVM's print of the module compiled, as parsed (the
        text `shortproof` proves: the parse, like the compile, in the worker process)."""
        return self._run_compiler(src, "printed", deadline)

    def _run_compiler(self, src: str, op: str, deadline: float | None) -> Any:
        dev = self.device
        comp = dev.compiler
        if not dev.runtime.native_launch:
            if op == "printed":
                return comp.compile_printed(src)
            return bytes(comp.compile(src)) if op == "compile" else str(comp.assembly(src)).encode()
        from tgc.backends.compile_worker import WorkerPool
        with self._workers_lock:
            if self._workers is None:
                self._workers = WorkerPool(1)
            workers = self._workers
        fut = workers.submit(dev.kind, src, op)
        try:
            left = self.limits.request_time if deadline is None else deadline - time.monotonic()
            return fut.result(timeout=max(left, 0.05))
        except TimeoutError:
            workers.kill()
            raise Refusal(408, "limit", f"the compiler ran past the request time limit of "
                                        f"{self.limits.request_time:g}s") from None
        except RuntimeError as e:
            msg = str(e)
            if msg.startswith("compile worker died"):
                raise Refusal(422, "compile", "the compiler crashed on this source (its process died); "
                                              "the server goes on") from None
            raise Refusal(422, "compile", msg) from None

    def _compiler(self) -> Any:
        """The served device's compiler, or a refusal saying why it has none here (Compile, Disassemble, Assembly)."""
        comp = self.device.compiler
        if comp is None:
            raise Refusal(400, "device", f"{self.device_name} cannot compile here: {self.device.compile_error}")
        return comp

    def _do_Compile(self, session: Session, req: P.Compile, blobs, out) -> str:
        self._compiler()
        try:
            renderer = self.device.renderer
            known = parse_contract(req.src, renderer.language if renderer is not None else None)
        except ValueError as e:
            raise Refusal(422, "compile", str(e)) from None
        key = P.digest(req.src.encode("utf-8", "surrogatepass"))
        # a kernel that may run inline: compiled with LLVM's print of the module compiled, which the proof reads
        provable = known.contract is not None and self.uses_launch_workers and self.limits.inline \
            and renderer is not None and renderer.language == "llvm"
        with self._cache_lock:
            entry = self._compiled.get(key)
        if entry is None or provable and entry[0] and entry[2] is None:
            # (compiled outside the lock: two sessions compiling one source both get it)
            try:
                if provable:
                    lib, printed = self._compile_printed(req.src, deadline=session.deadline)
                    entry = (True, lib, printed)
                else:
                    entry = (True, self._compile_text(req.src, deadline=session.deadline), None)
            except Refusal as r:
                if r.kind != "compile" or r.msg.startswith("the compiler crashed"):  # (not kept: maybe another's)
                    raise
                entry = (False, r.msg, None)
            except Exception as e:  # the compiler's message goes back as is
                entry = (False, e.msg if isinstance(e, TgcError) else str(e) or type(e).__name__, None)
            if isinstance(entry[2], str):  # (the proof reads the print; the cache keeps only its answer)
                entry = (True, entry[1], self._proven(req.src, entry[2], known.contract))  # type: ignore[arg-type]
        self._keep_compiled(key, entry)
        ok, value, proven = entry
        if not ok:
            raise Refusal(422, "compile", str(value))
        if provable and proven and known.contract is not None:
            known = dataclasses.replace(known, contract=dataclasses.replace(known.contract, inline=True))
        h = P.digest(value)
        remember(session.known, h, known, 4096, replace=True)
        with self._cache_lock:
            remember(self._known, h, known, 1 << 16, replace=False)
        out[h] = value
        return h

    # most sources whose compiled binaries (or errors) the server keeps (`_keep_compiled`)
    MAX_COMPILED = 256

    def _keep_compiled(self, key: str, entry: tuple[bool, bytes | str, bool | None]) -> None:
        """Keep a compile's answer for other sessions compiling the same source: at most `MAX_COMPILED` of them and
        `compile_cache_bytes` in all (the least recently compiled go first; one bigger than that is not kept)."""
        size = len(entry[1])
        with self._cache_lock:
            old = self._compiled.pop(key, None)
            if old is not None:
                self._compiled_bytes -= len(old[1])
            if size > self.limits.compile_cache_bytes:
                return
            self._compiled[key] = entry
            self._compiled_bytes += size
            while len(self._compiled) > self.MAX_COMPILED or self._compiled_bytes > self.limits.compile_cache_bytes:
                self._compiled_bytes -= len(self._compiled.popitem(last=False)[1][1])

    @staticmethod
    def _proven(src: str, printed: str, contract: Contract) -> bool:
        """Whether kernel `src`, whose module compiled LLVM printed as `printed` (`_compile_printed`), is proven
        short and safe under `contract` (`shortproof`, on `printed`; kept with the compiled source in `_compiled`)."""
        from tgc.backends.remote.shortproof import prove_short
        try:
            return prove_short(src, contract, printed) is not None
        except Exception:  # (a proof that fails is no proof: the launches go to a worker, the server goes on)
            return False

    def _do_Disassemble(self, session: Session, req: P.Disassemble, blobs, out) -> str:
        comp = self._compiler()
        try:
            return str(comp.disassemble(bytes(self._blob(blobs, req.datahash))))
        except NotImplementedError:
            raise Refusal(400, "device", f"the {comp.name} compiler cannot disassemble") from None

    def _do_Assembly(self, session: Session, req: P.Assembly, blobs, out) -> str:
        comp = self._compiler()
        try:
            if comp.source_assembly:
                return self._compile_text(req.src, "assembly", session.deadline).decode("utf-8", "replace")
            return str(comp.disassemble(self._compile_text(req.src, deadline=session.deadline)))
        except NotImplementedError:
            raise Refusal(400, "device", f"the {comp.name} compiler cannot show assembly") from None
        except Refusal:
            raise
        except Exception as e:
            raise Refusal(422, "compile", e.msg if isinstance(e, TgcError) else str(e)) from None

    def _do_ProgramAlloc(self, session: Session, req: P.ProgramAlloc, blobs, out) -> None:
        self._new_id(session, session.programs, req.prog, "program")
        lib = bytes(self._blob(blobs, req.datahash))
        # what this server knows of a binary never rests on an unchecked id: a small blob's id is its sha256,
        # checked when the body was decoded (not hashed twice); a large one is hashed here
        key = req.datahash if len(lib) < P.LARGE_BLOB else P.digest(lib)
        with self._cache_lock:
            known = session.known.get(key) or self._known.get(key)
        contracts = known.all_contracts() if known is not None else ()
        if self.device.runtime.native_launch:
            # launches run as native code in this process: only binaries whose launches can be checked
            if not contracts:
                raise Refusal(400, "protocol", f"program '{req.name[:80]}': this server did not compile that "
                                               "binary (or has forgotten it); send its source in a Compile first")
            if known.params is not None:
                # each contract with the arity its own source declared for this name (sources of different
                # arity can compile to one binary: `Contract.functions`)
                arities = {(p, i) for c in contracts for n, p, i in c.functions if n == req.name}
                if not arities:
                    raise Refusal(400, "protocol", f"the binary defines no kernel '{req.name[:80]}'")
                contracts = tuple(c for c in contracts if (req.name, len(c.bufs), c.vals + 1) in c.functions)
                if not contracts:
                    p, i = min(arities)
                    raise Refusal(400, "protocol", f"kernel '{req.name[:80]}' takes {p} buffers and "
                                                   f"{i} integers, not what its launch contract says")
        try:
            program = self.device.program(req.name, lib)
        except Exception as e:  # not a binary this device can load: the client's fault
            msg = e.msg if isinstance(e, TgcError) else f"{type(e).__name__}: {e}"
            raise Refusal(400, "device", f"cannot load program '{req.name[:80]}': {msg}") from None
        session.programs[req.prog] = (program, contracts, lib, req.name, key)

    def _do_ProgramFree(self, session: Session, req: P.ProgramFree, blobs, out) -> None:
        self._get(session.programs, req.prog, "program")
        del session.programs[req.prog]

    def _check_launch(self, session: Session, k: P.ProgramExec | P.GraphKernel,
                      contracts: tuple[Contract, ...]) -> list:
        """The buffers' handles for launch `k`, after checking it against the program's contracts (it must
        meet one of them) and the device's limits (a Refusal otherwise)."""
        return self._checked_launch(session, k, contracts)[0]

    def _checked_launch(self, session: Session, k: P.ProgramExec | P.GraphKernel,
                        contracts: tuple[Contract, ...]) -> tuple[list, list[Buffer], Contract, tuple[int, int, int]]:
        """`_check_launch`'s handles, with the buffers, the contract the launch met (the newest it meets) and its
        grid as three sizes."""
        table = session.buffers
        bufs = [table[b] if b in table else self._get(table, b, "buffer") for b in k.bufs]
        gs = k.global_size
        glob = (gs[0], gs[1] if len(gs) > 1 else 1, gs[2] if len(gs) > 2 else 1)
        work = glob[0] * glob[1] * glob[2]
        cap = self._max_work_items()
        if cap is not None and work > cap:
            raise Refusal(400, "limit", f"a launch of {work} work-items exceeds {self.device_name}'s limit of {cap}")
        for v in k.vals:
            if not -(2**31) <= v < 2**31:
                raise Refusal(400, "protocol", "vals must fit in 32 bits")
        refusal = None
        for contract in reversed(contracts):  # the newest first: the one the client most likely compiled
            refusal = breach(k, bufs, glob, contract)
            if refusal is None:
                return [b.handle for b in bufs], bufs, contract, glob
        if refusal is not None:
            raise refusal
        return [b.handle for b in bufs], bufs, None, glob  # type: ignore[return-value] (no contracts: refused above)

    def _max_work_items(self) -> int | None:
        """The most work-items one launch may ask for: on a CPU-style device, threads (a few per core); worked out
        once (the device's cores do not change while it is served)."""
        if self._work_cap is None:
            self._work_cap = (self._work_items(),)
        return self._work_cap[0]

    def _work_items(self) -> int | None:
        dev = self.device
        if dev.launch_style != "cpu":
            return dev.runtime.max_work_items
        try:
            cores = int(dev.cores)
        except Exception:
            cores = 1
        return max(64, 4 * cores)

    def _launch(self, session: Session, k: P.ProgramExec | P.GraphKernel, wait: bool) -> float | None:
        """Run one launch in this process (devices whose launches are not native code here)."""
        if time.monotonic() > session.deadline:
            raise self._late()
        prog, contract, _, _, _ = self._get(session.programs, k.prog, "program")
        handles = self._check_launch(session, k, contract)
        t = prog(*handles, global_size=k.global_size, local_size=k.local_size, vals=k.vals, wait=wait)
        return float(t) if wait and t is not None else None

    def _late(self, what: str = "") -> Refusal:
        return Refusal(408, "limit", f"the batch ran past the request time limit of {self.limits.request_time:g}s"
                                     + (f"; {what}" if what else ""))

    # launches sent to a worker in one message (the worker checks the deadline before each launch)
    GRAPH_SLICE = 1024

    def _run_in_workers(self, session: Session, launches: list, label: Callable[[int, int], str]) -> list[float]:
        """Run launches (ProgramExec or GraphKernel) in a launch worker process, checked, in slices of
        `GRAPH_SLICE`, except those `_inline_ok` lets run in this thread (in order with the rest); their times.
        Launches are not started past the batch's deadline, and one still running then is stopped: its worker is
        killed (either way a 408 refusal). `label(a, b)` names launches a..b in messages."""
        Launch = _launch_class()
        arena, times = self.allocator, []
        first, part = 0, []
        checked, table, programs = session.checked, session.buffers, session.programs
        for i, k in enumerate(launches):
            hit = checked.get(id(k))
            if hit is not None and hit[0] is k and programs.get(k.prog) is hit[1] and all(
                    table.get(b) is buf and buf.handle is h for b, buf, h in zip(k.bufs, hit[2], hit[3])):
                # (a kept graph's kernel, checked before against these very objects: the same program entry,
                # Buffers and handles, so the same contract, sizes, addresses and answer)
                entry, handles, inline = hit[1], hit[3], hit[4]
                prog, contracts, lib, name, key = entry
            else:
                try:
                    entry = self._get(programs, k.prog, "program")
                    prog, contracts, lib, name, key = entry
                    handles, bufs, met, glob = self._checked_launch(session, k, contracts)
                except Refusal as e:
                    raise Refusal(e.status, e.kind, f"{label(i, i)}: {e.msg}") from None
                inline = self._inline_ok(k, contracts, handles, bufs, met, glob)
                if type(k) is P.GraphKernel:
                    if len(checked) >= self.limits.max_objects:
                        checked.clear()
                    checked[id(k)] = (k, entry, tuple(bufs), tuple(handles), inline)
            if inline:  # proven short: here, after those before it
                if part:
                    times += self._worker_part(session, part, first, label)
                if time.monotonic() > session.deadline:
                    raise self._late(f"stopped before {label(i, i)}")
                t = prog(*handles, global_size=tuple(k.global_size), vals=tuple(k.vals), wait=True)
                self.inline_launches += 1
                times.append(float(t or 0.0))
                first, part = i + 1, []
                continue
            part.append(Launch(f"{key}:{name}", name, lib, [arena.offset_of(h) for h in handles],
                               tuple(k.global_size), tuple(k.vals)))
            if len(part) == self.GRAPH_SLICE:
                times += self._worker_part(session, part, first, label)
                first, part = i + 1, []
        return times + self._worker_part(session, part, first, label) if part else times

    @staticmethod
    def _inline_ok(k: P.ProgramExec | P.GraphKernel, contracts: tuple[Contract, ...], handles: list,
                   bufs: list[Buffer], met: Contract | None, glob: tuple[int, int, int]) -> bool:
        """Whether a checked launch may run inline: it meets a contract proven short (`shortproof`), and its buffers
        are 64-byte aligned (as the proof assumes) and do not overlap (its parameters are `noalias`). The contract
        is met by the handles' own sizes; `bufs`, `met` and `glob` (from `_checked_launch`: the buffers, the contract
        they met, the grid) spare checking again what that check found, where the handles are those buffers'
        sizes."""
        for c in contracts:
            if c.inline:
                break
        else:
            return False
        spans = sorted((data_address(h), h.nbytes) for h in handles)
        end = None
        for a, n in spans:
            if a % 64 or (end is not None and end > a):
                return False
            end = a + n
        if met is not None and met.inline and all(h.nbytes == b.size for h, b in zip(handles, bufs)):
            return True  # (the handles' sizes are what `breach` checked)
        sized = [_Sized(h.nbytes) for h in handles]
        return any(c.inline and breach(k, sized, glob, c) is None for c in contracts)  # type: ignore[arg-type]

    def _worker_part(self, session: Session, part: list, first: int, label: Callable[[int, int], str]
                     ) -> list[float]:
        """Run launches `part` (first.. in `label`'s numbers) in a launch worker; their times (`_run_in_workers`)."""
        from tgc.backends.remote.launcher import LaunchCrashed, LaunchFailed, LaunchTimeout
        if not part:
            return []
        if time.monotonic() > session.deadline:
            raise self._late(f"stopped before {label(first, first)}")
        last = first + len(part) - 1
        try:
            return self.launchers.run(part, session.deadline)
        except LaunchTimeout as e:
            if self.verbose:
                print(f"tgc serve: {label(first, last)}: {e}", file=sys.stderr, flush=True)
            if e.stopped_before is not None:
                raise self._late(f"stopped before {label(first + e.stopped_before, first + e.stopped_before)}"
                                 ) from None
            raise self._late(f"{e} in {label(first, last)}" if e.started else
                             f"{e} for {label(first, last)} ({self.concurrency} batches run launches at once)"
                             ) from None
        except LaunchCrashed as e:
            raise Refusal(500, "device", f"{label(first, last)}: {e}") from None
        except LaunchFailed as e:
            raise Refusal(400, "device", f"{label(first, last)}: {e}") from None

    def _do_ProgramExec(self, session: Session, req: P.ProgramExec, blobs, out) -> float | None:
        return self._launch(session, req, req.wait)  # (launch workers: see `_run`, which sends runs of these)

    def _do_GraphAlloc(self, session: Session, req: P.GraphAlloc, blobs, out) -> None:
        self._new_id(session, session.graphs, req.graph, "graph")
        for i, k in enumerate(req.kernels):
            if k.prog not in session.programs:
                raise Refusal(404, "session", f"graph kernel {i}: no program {k.prog} in this session")
            missing = [b for b in k.bufs if b not in session.buffers]
            if missing:
                raise Refusal(404, "session", f"graph kernel {i}: no buffer {missing[0]} in this session")
            try:
                self._check_launch(session, k, session.programs[k.prog][1])
            except Refusal as e:
                raise Refusal(e.status, e.kind, f"graph kernel {i}: {e.msg}") from None
        session.graphs[req.graph] = req.kernels

    def _do_GraphExec(self, session: Session, req: P.GraphExec, blobs, out) -> float | None:
        kernels = self._get(session.graphs, req.graph, "graph")
        start, total = time.perf_counter(), 0.0
        if self.uses_launch_workers:
            g = req.graph
            total = sum(self._run_in_workers(session, list(kernels), lambda a, b: f"graph {g} kernel {a}"
                                             if a == b else f"graph {g} kernels {a}..{b}"))
            return (total or time.perf_counter() - start) if req.wait else None
        for i, k in enumerate(kernels):
            if time.monotonic() > session.deadline:
                raise self._late(f"stopped before graph {req.graph} kernel {i}")
            try:
                t = self._launch(session, k, req.wait)
            except Refusal as e:
                raise Refusal(e.status, e.kind, f"graph {req.graph} kernel {i}: {e.msg}") from None
            total += t or 0.0
        if not req.wait:
            return None
        return total or time.perf_counter() - start

    def _do_GraphFree(self, session: Session, req: P.GraphFree, blobs, out) -> None:
        kernels = self._get(session.graphs, req.graph, "graph")
        del session.graphs[req.graph]
        for k in kernels:
            session.checked.pop(id(k), None)

    def _do_Synchronize(self, session: Session, req: P.Synchronize, blobs, out) -> None:
        if not self.uses_launch_workers:  # (a worker's launches are done when it answers)
            self.device.synchronize()

    def _do_EndSession(self, session: Session, req: P.EndSession, blobs, out) -> None:
        self._end_session(session)

    def _end_session(self, session: Session) -> None:
        """Free everything a session holds and forget it (errors while freeing are skipped)."""
        with self.lock:  # (the table changes only under `lock`; an EndSession batch does not hold it otherwise)
            self.sessions.pop(session.id, None)
        session.graphs.clear()
        session.checked.clear()
        session.programs.clear()
        for num in [n for n, b in session.buffers.items() if b.parent is None]:
            try:
                self._free_buffer(session, num)
            except Exception:
                session.buffers.pop(num, None)
        session.buffers.clear()
        session.memory = 0


def serve(host: str, port: int, device_name: str, token: str | None, limits: Limits | None = None,
          verbose: bool = False) -> RemoteServer:
    """A server for `device_name` listening on host:port (port 0 picks a free one); call `serve_forever()`."""
    return RemoteServer(device_name, host, port, token, limits, verbose)


def main_serve(host: str = "127.0.0.1", port: int = P.DEFAULT_PORT, device: str | None = None,
               token_file: str | None = None, *, idle_timeout: float | None = None, max_body: int | None = None,
               max_buffer: int | None = None, max_session_memory: int | None = None,
               request_time: float | None = None, max_sessions: int | None = None, verbose: bool = False,
               max_memory: int | None = None, max_connections: int | None = None,
               max_sessions_per_client: int | None = None, max_sessions_per_token: int | None = None,
               inline: bool = True, max_connections_per_client: int | None = None) -> int:
    """What `tgc serve` runs: open the device, print `serving DEVICE on http://host:port` to stderr, serve
    until Ctrl-C or SIGTERM, free every session and return 0.

    The tokens come from `token_file` (one token, or `NAME TOKEN` lines: see `read_server_tokens`), else
    `TGC_REMOTE_TOKEN`, else `TGC_REMOTE_TOKEN_FILE` (one token: the clients' file of that name may hold
    `HOST:PORT TOKEN` lines, which are no server's list of clients).
    Raises TgcError (a user error: exit 2) for a non-loopback host without a token or an unreadable token
    file, and DeviceError (exit 1) when the device cannot be opened or the port cannot be bound.
    Limits left as None keep the defaults of `Limits`.
    """
    token = read_server_tokens(token_file) if token_file is not None else read_token(None)
    name = device or default_device()
    if "," in name:  # (TGC_DEVICE may hold a list for the other commands)
        raise TgcError(f"tgc serve serves one device, not the device list '{name}'",
                       hint="start one server per device (tgc serve -d CPU:1 --port ...) and list them in a "
                            "client's TGC_REMOTE")
    kind, _ = canonical(name)
    if kind == "REMOTE":
        raise TgcError("cannot serve REMOTE itself", hint="serve a local device, e.g. CPU",
                       cli_hint="serve a local device, e.g. -d CPU")
    try:
        ok, why = device_class(kind).probe()
    except Exception as e:
        ok, why = False, f"{type(e).__name__}: {e}"
    if not ok:
        raise DeviceError(f"cannot serve {name}: {why}")
    chosen = {"idle_timeout": idle_timeout, "max_body": max_body, "max_buffer": max_buffer,
              "max_session_memory": max_session_memory, "request_time": request_time, "max_sessions": max_sessions,
              "max_memory": max_memory, "max_connections": max_connections,
              "max_sessions_per_client": max_sessions_per_client, "max_sessions_per_token": max_sessions_per_token,
              "max_connections_per_client": max_connections_per_client}
    limits = Limits(**{k: v for k, v in chosen.items() if v is not None}, inline=inline)
    server = serve(host, port, name, token, limits, verbose)
    try:
        try:
            dev = server.device
            dev_name = dev.name
        except TgcError:
            raise
        except Exception as e:
            raise DeviceError(f"cannot open {name}: {type(e).__name__}: {e}") from None
    except BaseException:
        server.close()
        raise
    prev = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    if prev is not None:
        signal.signal(signal.SIGTERM, _interrupt)
    n = len(server.tokens)
    print(f"serving {dev_name} on {server.url}" + (f" ({n} tokens)" if n > 1 else " (token required)" if n else ""),
          file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        freed = server.close()
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)
    print(f"tgc serve: shutting down ({freed} session(s) freed)", file=sys.stderr, flush=True)
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
