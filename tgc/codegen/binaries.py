"""The disk-cache key of a compiled kernel binary: `tgc.codegen.kernel` (every build) and `tgc.codegen.search`
(BEAM's fused-attention candidates, stored so the winner's later build finds its binary) use the same one."""

from __future__ import annotations

from typing import Any

from tgc import cache
from tgc.env import env_flag
from tgc.version import __version__


def compile_key(device: Any, src: str, canonical: str | None = None) -> str | None:
    """The disk-cache key of `src` compiled for `device`, or None when the compile cache is off. `canonical`:
    `device.canonical_source(src)` where the caller has it already (`build_kernels`: a model's sources are long).

    It names the compiler and its version, and for a device that compiles elsewhere (REMOTE) the
    identity of that compiler (`cache_identity`: the server's address, compiler and version as it reports
    them), so that a binary returned by one server is never sent to another.
    """
    if env_flag("DISABLE_COMPILER_CACHE"):
        return None
    comp = device.compiler
    # identical kernels under other names (ResNet's repeated blocks) share one binary where the device allows
    parts: list[Any] = [device.kind, comp.name, comp.cache_key, __version__,
                        device.canonical_source(src) if canonical is None else canonical]
    if comp.cache_identity is not None:
        parts.append(comp.cache_identity)
    return cache.make_key(*parts)
