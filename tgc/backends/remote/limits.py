"""What a `tgc serve` client may ask of the server (`Limits`), and the answer it gets instead of a result
(`Refusal`: HTTP status, error kind, message)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tgc.backends.remote import protocol as P

MiB = 1 << 20


@dataclass
class Limits:
    """What one client may ask of the server. Sizes in bytes, times in seconds."""

    max_body: int = 512 * MiB  # one request body
    max_buffer: int = 256 * MiB  # one buffer
    max_session_memory: int = 1024 * MiB  # live buffers of one session
    request_time: float = 60.0  # one batch's run (enforced while kernels run) and socket reads
    idle_timeout: float = 300.0  # a session unheard from this long is freed
    max_sessions: int = 64
    max_sessions_per_token: int = 32  # sessions of one token (of one address where the server has no token)
    max_sessions_per_client: int = 64  # sessions of one client address, whatever their tokens
    evict_after: float = 10.0  # a full table frees sessions idle this long (empty ones at once), oldest first
    max_memory: int = 4096 * MiB  # live buffers of all sessions together
    max_pooled: int = 256 * MiB  # freed memory the device may keep for reuse; beyond it, the pool is released
    max_connections: int = 128  # open connections; more are answered 503 and closed
    # open connections of one client address that have not yet shown a token (connections that have count only
    # against `max_connections`); all addresses together may hold a quarter of `max_connections` such connections
    max_connections_per_client: int = 16
    header_time: float = 5.0  # a new connection's request line and headers (before any token is checked)
    compile_cache_bytes: int = 256 * MiB  # compiled binaries (and compile errors) the server keeps, all together
    max_objects: int = 1 << 16  # buffers + programs + graphs of one session
    max_text: int = P.MAX_TEXT  # characters of one request text (the request list and kernel sources)
    max_nodes: int = P.MAX_NODES  # syntax nodes of one request text
    inline: bool = True  # a CPU kernel proven short (`shortproof`) runs in the request thread; False: every launch
    # goes to a launch worker (`tgc serve --no-inline`: no client-compiled code runs in the server's own process)

    def __post_init__(self) -> None:
        # a time of nan or inf would never end a request or free a session (nan compares false with everything)
        for name in ("request_time", "idle_timeout", "header_time", "evict_after"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"Limits.{name} must be a finite number of seconds >= 0, not {value!r}")


class Refusal(Exception):
    """An answer the server gives instead of a result: HTTP status, error kind, message."""

    def __init__(self, status: int, kind: str, msg: str):
        super().__init__(msg)
        self.status, self.kind, self.msg = status, kind, msg
