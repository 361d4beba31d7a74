"""The device registry: a name like `CPU`, `CL:1` or `REMOTE` to a `Device` instance.

Built-in backends are imported only when first used (start-up time matters). Third-party
packages add one through the entry-point group `tgc.backends`: `NAME = module:DeviceClass`.
"""

from __future__ import annotations

import importlib
import os
import threading
from functools import cache
from typing import Any

from tgc.errors import TgcError, close_match

# registry name -> "module:Class"
BUILTIN = {
    "CPU": "tgc.backends.cpu:CPUDevice",
    "OPENCL": "tgc.backends.opencl:OpenCLDevice",
    "CUDA": "tgc.backends.cuda:CUDADevice",
    "METAL": "tgc.backends.metal:MetalDevice",
    "PYTHON": "tgc.backends.python:PythonDevice",
    "REMOTE": "tgc.backends.remote.client:RemoteDevice",
}
ALIASES = {"LLVM": "CPU", "CL": "OPENCL"}


@cache
def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points
    try:
        return {ep.name.upper(): ep.value for ep in entry_points(group="tgc.backends")}
    except Exception:  # a broken third-party package must not break tgc
        return {}


def known_kinds() -> dict[str, str]:
    return {**BUILTIN, **{k: v for k, v in _entry_points().items() if k not in BUILTIN}}


def canonical(name: str) -> tuple[str, int]:
    """`"cl:1"` -> `("OPENCL", 1)`; raises a user error with a did-you-mean for unknown names."""
    kind, _, idx = name.strip().upper().partition(":")
    kind = ALIASES.get(kind, kind)
    kinds = BUILTIN if kind in BUILTIN else known_kinds()  # (entry points are read only for other names: slow)
    if kind not in kinds:
        close = close_match(kind, list(kinds) + list(ALIASES))
        raise TgcError(f"unknown device '{name}'", hint=f"did you mean '{close}'?" if close else
                       "known devices: " + ", ".join(sorted(kinds)))
    if idx and not idx.isdigit():
        raise TgcError(f"bad device index in '{name}'", hint="write NAME:i, e.g. OPENCL:1")
    return kind, int(idx or 0)


def device_class(kind: str) -> type:
    mod, _, cls = (BUILTIN.get(kind) or known_kinds()[kind]).partition(":")
    return getattr(importlib.import_module(mod), cls)


_instances: dict[tuple[str, int], object] = {}
# one lock per device name, so that threads asking for one device at once make one instance (a second REMOTE
# instance would be a second session on the server, and its buffers and programs would be another's); different
# devices are still opened at once. `_locks_lock` guards the table of locks only.
_locks: dict[tuple[str, int], threading.RLock] = {}
_locks_lock = threading.Lock()


def get_device(name: str):
    """The (cached) device instance for a name such as `CPU`, `OPENCL:0`; one instance per name, also when
    threads ask for it at once (double-checked under a lock per name).

    An index beyond the devices of its kind is a user error (exit 2): checked against the class's
    `device_count()` where it has one, else by the constructor failing for `KIND:i` where `KIND:0` works.
    """
    key = canonical(name)
    dev = _instances.get(key)
    if dev is not None:
        return dev
    with _locks_lock:
        lock = _locks.get(key)
        if lock is None:
            lock = _locks[key] = threading.RLock()
    with lock:
        if key not in _instances:
            _make_device(name, key)
    return _instances[key]


def _make_device(name: str, key: tuple[str, int]) -> None:
    """Open device `key` (named `name` by the caller) into `_instances` (`get_device` holds its lock)."""
    kind, idx = key
    cls = device_class(kind)
    counter = getattr(cls, "device_count", None)
    count = counter() if counter is not None else None
    if count is not None and idx >= count:
        raise _index_error(name, kind, count)
    try:
        _instances[key] = cls(idx)
    except TgcError as e:
        if idx == 0 or e.kind == "user":
            raise
        try:
            get_device(kind)
        except Exception:
            raise e from None  # the kind itself does not work here: its own (runtime) error
        raise TgcError(e.msg, hint=e.hint or f"{kind}:0 works on this machine") from None


def _index_error(name: str, kind: str, count: int) -> TgcError:
    return TgcError(f"no device '{name}': this machine has {count} {kind} device{'s' if count != 1 else ''}",
                    hint=f"use {kind}" if count == 1 else f"use {kind}:0 .. {kind}:{count - 1}")


def default_device() -> str:
    return os.environ.get("TGC_DEVICE", "CPU")


def one_device(device: str | None) -> Any:
    """The device object for one device name (None: the default device); a device list is a user error."""
    name = device or default_device()
    if "," in name:
        raise TgcError(f"'{name}' is a device list; this needs one device",
                       hint="name one device, e.g. " + name.split(",")[0].strip())
    return get_device(name)
