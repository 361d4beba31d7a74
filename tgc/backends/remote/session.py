"""One client session of `tgc serve`: its own tables of buffers, programs and graphs (numbered by the
client), the binaries it compiled, its memory, and its owner (the token that made it). Its batches run one at
a time (`lock`); batches of different sessions may run at once."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from tgc.backends.remote import protocol as P
from tgc.backends.remote.contract import Known


@dataclass
class Buffer:
    handle: Any
    size: int
    parent: int | None = None  # for a view: the buffer it points into
    views: set[int] = field(default_factory=set)


@dataclass
class Session:
    id: str
    buffers: dict[int, Buffer] = field(default_factory=dict)
    programs: dict[int, Any] = field(default_factory=dict)
    graphs: dict[int, tuple[P.GraphKernel, ...]] = field(default_factory=dict)
    known: OrderedDict[str, Known] = field(default_factory=OrderedDict)  # binaries this session compiled
    memory: int = 0
    client: str = ""  # the peer's address
    owner: str = ""  # who holds it: its token's name, or 'address A' where the server has no token
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while one of its batches runs
    deadline: float = 0.0  # the time.monotonic() by which the batch running now must be done
    last_seen: float = field(default_factory=time.monotonic)
    busy: int = 0  # batches in flight
    index: int = 0  # the request of the running batch being run now
    alias_from: int = 1 << 62  # from this request on, a copy out may answer with a view of the buffer (`run_batch`)
    staged: dict[str, Any] = field(default_factory=dict)  # blobs the running batch's CopyIns may adopt (`run_batch`)
    aliased: bool = False  # the running batch's answer holds views of its buffers (`run_batch`)
    maps: list[Any] = field(default_factory=list)  # device buffers mapped for that answer, unmapped once it is sent
    answer_bytes: int = 0  # bytes of ranges read in the batch running now (bounded by the body limit)
    # graph kernels' launches as last checked (`RemoteServer._run_in_workers`), by id of the kernel: (the kernel, its
    # program's entry, its Buffers, their handles, the launch may run inline); used again only while the kernel, the
    # program entry, every Buffer in the table and every handle are the very objects checked
    checked: dict[int, tuple] = field(default_factory=dict)
    # the owner's other sessions the running batch Transfers into, locked with this one (`RemoteServer.run_batch`)
    peers: dict[str, Session] = field(default_factory=dict)

    @property
    def objects(self) -> int:
        return len(self.buffers) + len(self.programs) + len(self.graphs)
