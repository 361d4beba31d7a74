"""Work on bound inputs done once (issue 23: weights bound once at load).

A program's bound inputs (`Executable.bound`: an ONNX model's initializers, any `Program(weights=...)`) keep the
same arrays from run to run. A kernel whose every read is a bound input or the output of such a kernel (weight
packing, a transpose or a folded scale of a weight, a fill with no input at all) computes the same values on every
run: `split(exe)` finds those kernels, the *prelude*, and the rest. A launch plan (`realize.LaunchPlan`) runs the
prelude when it is made (again only if a bound input's array is replaced by another object) and keeps its results
in buffers of their own; every run launches only the rest.

Contract of `split`:
- a kernel is in the prelude when every buffer it reads is constant (a bound input, or written by an earlier prelude
  kernel), it writes no input, and each buffer it writes is written by no other kernel of the executable;
- `kept`: the constant buffers the rest (or the outputs) read: they live as long as the plan, outside the memory
  plan's shared slots (whose later users would overwrite them);
- `temporary`: the constant buffers only the prelude reads (a weight that is only packed, the packing's
  intermediates): on the device only while the prelude runs, then freed.
Results are the same as running every kernel every time: the prelude's kernels are the same kernels, run in the
same order, on the same values.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Split:
    """An executable's kernels parted into the prelude (run once) and the rest (run every time)."""

    prelude: list[Any] = field(default_factory=list)
    rest: list[Any] = field(default_factory=list)
    kept: list[Any] = field(default_factory=list)  # constant buffers the rest or the outputs read
    temporary: list[Any] = field(default_factory=list)  # constant buffers only the prelude reads
    bound_inputs: list[tuple[Any, str]] = field(default_factory=list)  # (buffer key, name) of the bound inputs


def _writes(k: Any) -> list[Any]:
    return [k.bufs[i] for i in sorted(k.written()) if i < len(k.bufs)]


_SPLITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def split_of(exe: Any) -> Split:
    """`split(exe)`, computed once per executable."""
    got = _SPLITS.get(exe)
    if got is None:
        got = _SPLITS[exe] = split(exe)
    return got


def split(exe: Any) -> Split:
    """`exe`'s kernels parted by the contract in the module docstring (no prelude without bound inputs)."""
    bound_names = exe.bound
    out = Split(rest=list(exe.kernels))
    if not bound_names or exe.multi or exe.chunks is not None:
        return out
    out.bound_inputs = [(b, name) for b, name in exe.inputs if name in bound_names]
    inputs = {b for b, _ in exe.inputs}
    constant = {b for b, _ in out.bound_inputs}
    writers: dict[Any, int] = {}
    for k in exe.kernels:
        for b in set(_writes(k)):
            writers[b] = writers.get(b, 0) + 1
    prelude, rest = [], []
    for k in exe.kernels:
        writes = set(_writes(k))
        reads = [b for b in k.bufs if b not in writes]
        if writes and all(b in constant for b in reads) and not writes & inputs \
                and all(writers[b] == 1 for b in writes):
            prelude.append(k)
            constant |= writes
        else:
            rest.append(k)
    if not prelude:
        return out
    needed = {b for k in rest for b in k.bufs} | {node for _, node in exe.outputs}
    out.prelude, out.rest = prelude, rest
    seen: set = set()
    for b in [b for b, _ in out.bound_inputs] + [b for k in prelude for b in _writes(k)]:
        if b in seen:
            continue
        seen.add(b)
        (out.kept if b in needed else out.temporary).append(b)
    return out
