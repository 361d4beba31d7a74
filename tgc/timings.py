"""Where compile time goes: the time of each phase of building each kernel (scheduling, each group of lowering
passes, linearizing, verifying, rendering, the compiler) and whether its binary came from the disk cache.

`tgc compile --timings` (and `--json`) reads a `Recorder` (`recording()`); with `DEBUG=2` every kernel built
prints its line to stderr (`kernel_line`); while a profile trace records (`tgc.profile`), each kernel built and
each phase is also a span of its compile track. Without any of these, `kernel` and `phase` cost one attribute
lookup.

Contract: `kernel(name)` opens one kernel's record; `phase(name)` adds the seconds of its block to the open
kernel's `phases[name]` (outside a kernel: to the recorder's program-level `phases`). Only the outermost phase
counts, so a BEAM search (`phase("beam")`, which lowers and compiles many candidates) is not counted again as
lowering; time inside a kernel but in no phase is its `other`. Records are per thread.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tgc import profile
from tgc.env import debug_level

# the phases, in the order a kernel goes through them (columns of `tgc compile --timings`)
# (beam: looking up stored BEAM winners, or searching; count: counting the kernel's flops and bytes)
PHASES = ("beam", "prepare", "optimize", "to_linear", "linearize", "verify", "render", "compile", "count")


@dataclass
class KernelTimes:
    """One kernel's build: seconds per phase, the whole build, and its binary's source ("hit": the disk cache,
    "miss": compiled now, "shared": an identical kernel's of the same build, None: not compiled here)."""

    name: str
    phases: dict[str, float] = field(default_factory=dict)
    total: float = 0.0
    cache: str | None = None
    _depth: int = 0

    @property
    def other(self) -> float:
        return max(self.total - sum(self.phases.values()), 0.0)

    def doc(self) -> dict[str, Any]:
        return {"name": self.name, "phases_s": dict(self.phases), "other_s": self.other, "total_s": self.total,
                "cache": self.cache}


@dataclass
class Recorder:
    """Every kernel built while recording, and the program-level phases (`schedule`)."""

    kernels: list[KernelTimes] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    _depth: int = 0

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for k in self.kernels:
            for name, s in k.phases.items():
                out[name] = out.get(name, 0.0) + s
        return out

    def doc(self) -> dict[str, Any]:
        """What `tgc compile --timings --json` prints under `timings`."""
        hits = sum(1 for k in self.kernels if k.cache == "hit")
        misses = sum(1 for k in self.kernels if k.cache == "miss")
        return {"kernels": [k.doc() for k in self.kernels], "program_phases_s": dict(self.phases),
                "kernel_phases_s": self.totals(), "kernels_s": sum(k.total for k in self.kernels),
                "cache_hits": hits, "cache_misses": misses,
                "shared": sum(1 for k in self.kernels if k.cache == "shared")}


_local = threading.local()


def _state() -> tuple[Recorder | None, KernelTimes | None]:
    return getattr(_local, "recorder", None), getattr(_local, "kernel", None)


@contextmanager
def recording() -> Iterator[Recorder]:
    """Record every kernel built in this thread inside the block."""
    rec = Recorder()
    old = getattr(_local, "recorder", None)
    _local.recorder = rec
    try:
        yield rec
    finally:
        _local.recorder = old


@contextmanager
def kernel(name: str) -> Iterator[KernelTimes | None]:
    """One kernel's build (recorded where a recorder is active or DEBUG >= 2; a nested build, such as a BEAM
    candidate's, belongs to the outer one)."""
    rec, current = _state()
    show = debug_level() >= 2
    prof = profile.active
    if current is not None or (rec is None and not show and prof is None):
        yield None
        return
    k = KernelTimes(name)
    _local.kernel = k
    start = time.perf_counter_ns()
    try:
        yield k
    finally:
        end = time.perf_counter_ns()
        k.total = (end - start) / 1e9
        _local.kernel = None
        if rec is not None:
            rec.kernels.append(k)
        if show:
            print(kernel_line(k), file=sys.stderr)
        if prof is not None:  # the compile track of a profile trace (tgc/profile.py)
            prof.span(profile.HOST, prof.host_thread("compile"), f"build {name}", start, end, "compile",
                      {"cache": k.cache, "phases_ms": {p: round(s * 1e3, 3) for p, s in k.phases.items()}})


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Add the block's seconds to the open kernel's (or the recorder's) phase `name`; nested phases do not."""
    rec, current = _state()
    owner: Any = current if current is not None else rec
    prof = profile.active
    counted = owner is not None and not owner._depth
    if not counted and prof is None:
        yield
        return
    if counted:
        owner._depth += 1
    start = time.perf_counter_ns()
    try:
        yield
    finally:
        end = time.perf_counter_ns()
        if counted:
            owner._depth -= 1
            owner.phases[name] = owner.phases.get(name, 0.0) + (end - start) / 1e9
        if prof is not None:  # every phase, nested ones too, as a span of the compile track
            prof.span(profile.HOST, prof.host_thread("compile"), name, start, end, "compile")


def cache_result(hit: bool | str) -> None:
    """Whether the open kernel's binary came from the disk cache (True), was compiled (False), or is that of an
    identical kernel of the same program ("shared")."""
    _, current = _state()
    if current is not None:
        current.cache = hit if isinstance(hit, str) else "hit" if hit else "miss"


def fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} us"


def kernel_line(k: KernelTimes) -> str:
    """What DEBUG=2 prints for a kernel built."""
    parts = [f"{name} {fmt_s(k.phases[name])}" for name in PHASES if name in k.phases]
    if k.other >= 1e-4:
        parts.append(f"other {fmt_s(k.other)}")
    cache = {"hit": ", binary from the cache", "miss": ", compiled",
             "shared": ", binary of an identical kernel"}.get(k.cache or "", "")
    return f"*** build {k.name:<20} {fmt_s(k.total):>9}: {', '.join(parts)}{cache}"
