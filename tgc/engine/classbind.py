"""One bind for a size class's plan: the kernels compiled once for every size of a class, bound to some dims.

A size class's plan has one form, in size expressions (`tgc.sizeexpr`), whether it was just built
(`tgc.api.SymbolicPlan`, which converts itself once) or loaded from a symbolic package or program-cache entry
(`tgc.package.SizeClassPlan`): the *class doc*, the JSON a symbolic package stores for the class.

- `buffers`: per buffer `dtype`, `shape` (expressions), `nbytes` (an expression), `role`, `name`.
- `signature`: `inputs` and `outputs`, each with `name` and `buffer` (an index into `buffers`).
- `derived`: derived kernel arguments (a split kernel's main part and remainder of a loop), each an expression of
  the dims (`["*", ["//", end, m], m]`, `["%", end, m]`); absent: none.
- `kernels`, in launch order, each the *general* kernel's launch (valid at every size of the class): `name`, `bufs`
  (buffer indices), `global_size` (three expressions: on a GPU the work-groups, 0 where there is no output),
  `local_size`, `vals` (expressions: the dims and derived arguments the kernel takes), `flops`, `bytes`, and
  `checks` (`["divides" | "at least" | "at most", expr, k]`: where one fails the class does not serve the dims).
  A kernel may also carry `fast` (the optimized variant, a launch of the same form whose `checks` pick it),
  `plain` (the fast variant without threads, for sizes too small for them) and `tails` (a split fast variant's
  remainder kernels, each launched with it, and skipped where its `skip_if_zero` expression is 0).
- `memory` (a package's: `slot_of` per buffer, `inplace` pairs) or none (laid out here per set of launches at the
  class's probe sizes, as a plan built in memory does).

`bind(doc, templates, device, dims, ...)` is the one bind: it evaluates every expression at the dims (within the
limits of `tgc.sizeexpr`), picks each kernel's variant by its checks, drops empty launches, checks GPU grids
against the device, sizes the memory layout at the dims (each slot its largest buffer) and checks it
(`memplan.check_plan`), and returns the `Executable`. It traces, schedules and lowers nothing. What differs
between a plan in memory and a loaded one is given to it: the kernel templates (compiled `Kernel`s or
`PackagedKernel`s), how a buffer key and a bound kernel are made, and the saved layout if any. A failure is a
`ClassBindError` (the caller says what it means: a plan in memory runs size-specialized kernels, a package
stops with exit 2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tgc import sizeexpr
from tgc.dtype import dtypes
from tgc.engine.memplan import MemoryPlan, check_plan, lifetimes, plan_memory
from tgc.engine.realize import Executable
from tgc.errors import TgcError

VARIANTS = ("general", "fast", "plain")  # the launch docs of a kernel (with its `tails`)
MAX_VALUE = (1 << 31) - 1  # a kernel argument is an i32


class ClassBindError(TgcError):
    """The class's plan does not serve these dims: `kernel` (an index, or None) and `reason` ("check": a general
    kernel's check fails; "size": a size out of range; "grid": more work-groups than the device launches;
    "memory": the saved layout is unsafe there)."""

    def __init__(self, msg: str, kernel: int | None = None, reason: str = "size"):
        super().__init__(msg)
        self.kernel, self.reason = kernel, reason


def check_text(what: str, e: Any, v: int) -> str:
    """A launch check as people write it: `N % 8 == 0`, `N * M >= 64`."""
    return f"{sizeexpr.text(e)} % {v} == 0" if what == "divides" else \
        f"{sizeexpr.text(e)} <= {v}" if what == "at most" else f"{sizeexpr.text(e)} >= {v}"


def value(e: Any, env: Mapping[str, int], where: str, lo: int, hi: int) -> int:
    """An expression's value at `env`, which must lie in lo..hi (ClassBindError otherwise)."""
    try:
        v = sizeexpr.evaluate(e, env, where)
    except TgcError as err:
        raise ClassBindError(err.msg) from None
    if not lo <= v <= hi:
        raise ClassBindError(f"{where} is {v} at these sizes, outside {lo}..{hi}")
    return v


def failed_check(checks: Sequence[Sequence[Any]], env: Mapping[str, int]) -> str | None:
    """The first launch check that fails at `env`, as text; None where they all hold."""
    for what, e, v in checks:
        got = value(e, env, "a launch check", -(1 << 62), 1 << 62)
        if not (got % v == 0 if what == "divides" else got <= v if what == "at most" else got >= v):
            return f"{sizeexpr.text(e)} = {got} " + (
                f"passes {v}, the largest value of the type the kernel computes it in" if what == "at most"
                else f"fails the launch check {check_text(what, e, v)}")
    return None


def environment(doc: Mapping[str, Any], dims: Mapping[str, int]) -> dict[str, int]:
    """The dims with the derived kernel arguments at them (`derived`)."""
    env = dict(dims)
    for name, e in (doc.get("derived") or {}).items():
        env[name] = value(e, dims, f"size {name}", 0, MAX_VALUE)
    return env


def choose(doc: Mapping[str, Any], env: Mapping[str, int]) -> tuple[list[tuple[int, str, int, dict]], list[str]]:
    """Per kernel, the launches that run at `env`: (kernel index, variant, tail index or -1, launch doc), and per
    kernel what was chosen ("general", "fast" or "split"). The fast variant where its checks (and its tails')
    hold, its `plain` form where only the threads' check fails, else the general kernel; a tail with nothing to
    do is not launched. ClassBindError where a general kernel's own check fails."""
    launches: list[tuple[int, str, int, dict]] = []
    chosen = []
    for i, k in enumerate(doc["kernels"]):
        why = failed_check(k.get("checks") or [], env)
        if why is not None:
            raise ClassBindError(why, kernel=i, reason="check")
        fast, tails, name = k.get("fast"), list(k.get("tails") or []), "fast"
        if fast is not None and k.get("plain") is not None and failed_check(fast.get("checks") or [], env):
            fast, name = k["plain"], "plain"
        if fast is not None and all(failed_check(v.get("checks") or [], env) is None for v in [fast, *tails]):
            chosen.append("split" if tails else "fast")
            launches.append((i, name, -1, fast))
            launches += [(i, "tails", j, t) for j, t in enumerate(tails)
                         if t.get("skip_if_zero") is None or
                         value(t["skip_if_zero"], env, f"kernel {i} remainder", 0, 1 << 62) != 0]
        else:
            chosen.append("general")
            launches.append((i, "general", -1, k))
    return launches, chosen


@dataclass
class Layouts:
    """Which buffers share a slot: the saved one (`slot_of`, `inplace`), or, where none is saved, one per set of
    launches decided at the class's probe sizes (distinct primes: buffers of equal size there have the same size
    expression, so the sharing holds at every size) and kept."""

    probe: Mapping[str, int]
    share: bool
    slot_of: list[int] | None = None
    inplace: list[tuple[int, int]] = field(default_factory=list)
    _made: dict = field(default_factory=dict)

    def __len__(self) -> int:
        """How many layouts there are (the saved one, or those made so far)."""
        return 1 if self.slot_of is not None else len(self._made)

    def of(self, doc: Mapping[str, Any], used: list[list[int]], pairs: list[tuple[int, int]]
           ) -> tuple[dict[int, int], list[tuple[int, int]]]:
        if self.slot_of is not None:
            return {j: s for j, s in enumerate(self.slot_of) if s >= 0}, list(self.inplace)
        key = (tuple(tuple(u) for u in used), tuple(pairs))
        if key not in self._made:
            env = environment(doc, self.probe)
            nbytes = {j: max(value(b["nbytes"], env, f"buffer {j} bytes", 0, 1 << 62), 1)
                      for j, b in enumerate(doc["buffers"])}
            sig = doc["signature"]
            plan = plan_memory(used, nbytes, [d["buffer"] for d in sig["inputs"]],
                               [d["buffer"] for d in sig["outputs"]], share=self.share, inplace=pairs)
            self._made[key] = (dict(plan.slot_of), list(plan.inplace))
        return self._made[key]


MakeBuffer = Callable[[int, Any, tuple, int], Any]  # (index, dtype, shape, bytes) -> the buffer's key
# (template, launch doc, buffers, global size, values, env) -> the kernel the executable launches
MakeKernel = Callable[[Any, dict, list, tuple, tuple, dict], Any]


def bind(doc: Mapping[str, Any], templates: Sequence[Mapping[str, Any]], device: Any, dims: Mapping[str, int],
         make_buffer: MakeBuffer, make_kernel: MakeKernel, layouts: Layouts,
         inplace_of: Callable[[Any], list[tuple[Any, Any]]] | None = None,
         max_buffer: int = 1 << 62, graph_options: dict | None = None) -> tuple[Executable, list[str]]:
    """The class's plan at `dims` as an `Executable`, and per kernel what was chosen (`choose`). `templates`:
    per kernel, its compiled variants by name (`general`, `fast`, `plain`: a template; `tails`: a list).
    `inplace_of(kernel)`: the (output, input) buffer pairs a bound kernel may share (a plan in memory's;
    none for a package's). ClassBindError where the plan does not serve the dims."""
    env = environment(doc, dims)
    keys, sizes = [], []
    for i, b in enumerate(doc["buffers"]):
        shape = tuple(value(e, env, f"buffer {i} shape", 0, max_buffer) for e in b["shape"])
        n = dtypes.by_name[b["dtype"]].itemsize
        for x in shape:
            n = min(n * x, max_buffer + 1)
        if n > max_buffer:
            raise ClassBindError(f"at these sizes buffer {i} takes more than {max_buffer} bytes")
        sizes.append(max(n, 1))
        keys.append(make_buffer(i, dtypes.by_name[b["dtype"]], shape, sizes[-1]))
    launches, chosen = choose(doc, env)
    kernels, used = [], []
    caps = device.caps
    for i, variant, j, k in launches:
        where = f"kernel {i} ({k['name']})"
        tmpl = templates[i][variant][j] if variant == "tails" else templates[i][variant]
        gs = tuple(value(e, env, f"{where} global size", 0, MAX_VALUE) for e in k["global_size"])
        if caps.gpu and max(gs) > caps.max_grid:
            raise ClassBindError(f"kernel {k['name']} needs {max(gs)} work-groups at these sizes, more than the "
                                 f"device's {caps.max_grid}", kernel=i, reason="grid")
        if min(gs) == 0:
            continue  # no output at these sizes: nothing to launch
        vals = tuple(value(e, env, f"{where} value", -(1 << 31), MAX_VALUE) for e in k["vals"])
        bufs = [keys[b] for b in k["bufs"]]
        kernels.append(make_kernel(tmpl, k, bufs, gs, vals, env))
        used.append(list(k["bufs"]))
    position = {key: j for j, key in enumerate(keys)}
    pairs = [(position[a], position[b]) for kern in kernels for a, b in
             (inplace_of(kern) if inplace_of is not None else [])]
    slot_of, inplace = layouts.of(doc, used, pairs)
    sig = doc["signature"]
    inputs = [keys[d["buffer"]] for d in sig["inputs"]]
    outputs = [keys[d["buffer"]] for d in sig["outputs"]]
    # (an in-place pair of buffers whose sizes differ here: the executable plans its own memory)
    memory = None if any(sizes[a] != sizes[b] for a, b in inplace) else \
        _memory(keys, sizes, kernels, inputs, outputs, slot_of, inplace)
    return Executable(device, kernels, [(b, d["name"]) for b, d in zip(inputs, sig["inputs"])],
                      [(d["name"], b) for b, d in zip(outputs, sig["outputs"])], memory=memory,
                      graph_options=graph_options), chosen


def _memory(keys: list, sizes: list[int], kernels: list, inputs: list, outputs: list, slot_of: dict[int, int],
            inplace: list[tuple[int, int]]) -> MemoryPlan:
    """The layout sized at these dims (each slot its largest buffer) and checked (`check_plan`)."""
    spans = lifetimes([k.bufs for k in kernels], inputs, outputs)
    plan = MemoryPlan(slots=[1] * (max(slot_of.values(), default=-1) + 1), lifetimes=spans)
    for j, s in slot_of.items():
        key = keys[j]
        if key in spans:
            plan.slot_of[key], plan.sizes[key] = s, sizes[j]
            plan.slots[s] = max(plan.slots[s], plan.sizes[key])
    plan.inplace = [(keys[a], keys[b]) for a, b in inplace if keys[a] in spans and keys[b] in spans]
    why = check_plan(plan)
    if why is not None:
        raise ClassBindError(f"its memory plan is unsafe at these sizes: {why}", reason="memory")
    return plan
