"""The tgc version (the cache keys and `tgc --version` use it) and the identity of the code that is running
(`code_identity`: the program cache's key holds it, so an edited or reinstalled tgc never serves a program an
older tgc built under the same version number); base layer, imports only the standard library."""

from __future__ import annotations

import hashlib
import os

__version__ = "0.1.0"

_IDENTITY: str | None = None


def code_identity() -> str:
    """A hash of every source file of the `tgc` package as it is on disk (its path, size and modification time:
    one `stat` per file, about a millisecond, no reading), computed once per process."""
    global _IDENTITY
    if _IDENTITY is None:
        _IDENTITY = identity_of(os.path.dirname(os.path.abspath(__file__)))
    return _IDENTITY


def identity_of(root: str) -> str:
    """The hash `code_identity` gives the source tree under `root`."""
    h = hashlib.sha256(__version__.encode())
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                if e.name != "__pycache__":
                    stack.append(e.path)
            elif e.name.endswith((".py", ".h", ".c", ".js", ".css", ".html")):
                try:
                    st = e.stat()
                except OSError:
                    continue
                h.update(f"{os.path.relpath(e.path, root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]
