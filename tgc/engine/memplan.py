"""Planned memory: which buffers of a launch plan share one allocation.

A program's buffers live from the kernel that first uses them to the kernel that last does; two buffers whose
lifetimes do not overlap can use the same memory. `plan_memory` assigns every buffer to a *slot* (one device
allocation, as large as the largest buffer it holds), so the plan knows its peak memory before anything runs:
the sum of its slots. The realizer allocates exactly these slots (`tgc.engine.realize`), and a package stores
the plan (`tgc.package`).

Lifetimes are inclusive kernel indices: a kernel that reads A and writes B needs both at once. Inputs live
from before the first kernel to after the last (a plan can run again on the same inputs: `tgc bench`);
outputs from their first kernel to the end (they are copied out after the last kernel). Only plain
intermediates and outputs share; inputs never do.

Pure Python over integers and hashable keys: no device, no numpy.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field


@dataclass
class MemoryPlan:
    """`slots[i]`: the bytes of allocation i; `slot_of[key]`: the slot holding a buffer; `sizes[key]`: its bytes;
    `lifetimes[key]`: (first, last) kernel index (-1 .. n for inputs); `inplace`: (output, input) pairs that share
    a slot although both are live at the kernel that reads the input last and writes the output first."""

    slots: list[int] = field(default_factory=list)
    slot_of: dict = field(default_factory=dict)
    sizes: dict = field(default_factory=dict)
    lifetimes: dict = field(default_factory=dict)
    inplace: list = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        """The device memory the plan allocates: every slot at once (inputs and outputs included)."""
        return sum(self.slots)

    @property
    def unshared_bytes(self) -> int:
        """What one allocation per buffer would take."""
        return sum(self.sizes.values())


def lifetimes(kernel_bufs: Sequence[Sequence[Hashable]], inputs: Sequence[Hashable],
              outputs: Sequence[Hashable]) -> dict:
    """(first, last) kernel index of every buffer the kernels or inputs use, in first-use order."""
    n = len(kernel_bufs)
    out: dict = {key: (-1, n) for key in inputs}
    for i, bufs in enumerate(kernel_bufs):
        for key in bufs:
            first, last = out.get(key, (i, i))
            out[key] = (first, max(last, i))
    keep = set(outputs)
    for key, (first, _last) in out.items():
        if key in keep:
            out[key] = (first, n)
    return out


LARGEST_FIRST_UNITS = 256  # above this many buffers only the first-use placement runs (the other is quadratic)


def plan_memory(kernel_bufs: Sequence[Sequence[Hashable]], sizes: dict, inputs: Sequence[Hashable] = (),
                outputs: Sequence[Hashable] = (), share: bool = True,
                inplace: Sequence[tuple[Hashable, Hashable]] = (), hosts: Sequence[Hashable] = ()) -> MemoryPlan:
    """Assign each buffer (a key of `sizes`, bytes >= 1) to a slot: the better (smaller sum of slots) of two
    greedy placements, largest buffer first (each into the smallest slot that is free for its whole lifetime)
    and first use first (each into a free slot, grown where none holds it). `share=False`: one slot per buffer.

    `inplace`: (output, input) pairs that may share memory although both are live at one kernel: an elementwise
    kernel that reads `input` only at exactly the index it writes `output`, where `input` dies (see
    `tgc.engine.realize.inplace_pairs`). A pair is kept (`plan.inplace`) where the input is no input of the
    plan, its last kernel is the output's first and both have the same size; the two are then one buffer.

    `hosts`: outputs whose memory is given (a chunk's outputs, written into their part of the whole output: see
    `tgc.engine.realize.run_chunked`): each opens a slot of its own size that no larger buffer joins, and that
    buffers no larger whose lives end before the host's begins may share (the output's memory holds them
    before the output is written; an output lives to the end, so none comes after it: a host that is not
    among `outputs` is ignored). No in-place pair has a host in it."""
    spans = lifetimes(kernel_bufs, inputs, outputs)
    plan = MemoryPlan(sizes={k: int(sizes[k]) for k in spans}, lifetimes=spans)
    fixed = set(inputs)
    hosts = {k for k in hosts if k not in fixed and spans.get(k, (0, 0))[1] == len(kernel_bufs)}
    if not share:
        for key in spans:
            plan.slot_of[key] = len(plan.slots)
            plan.slots.append(plan.sizes[key])
        return plan
    # units: a buffer, or a chain of in-place pairs, placed as one
    unit_of: dict = {key: key for key in spans}
    members: dict = {key: [key] for key in spans}
    paired: set = set()  # inputs of the pairs kept
    # per unit, its two latest ends and (negated) two earliest starts, with their buffers
    ends: dict = {key: [(spans[key][1], key)] for key in spans}
    starts: dict = {key: [(-spans[key][0], key)] for key in spans}
    for out, src in inplace:
        if out not in spans or src not in spans or out in fixed | hosts or src in fixed | hosts \
                or unit_of[src] == unit_of[out] \
                or plan.sizes[out] != plan.sizes[src] or spans[src][1] != spans[out][0] \
                or unit_of[out] != out or src in paired \
                or _latest_but(ends[unit_of[src]], src) >= spans[out][0] \
                or -_latest_but(starts[out], out) <= spans[src][1]:
            continue  # (last two: the rest of src's unit ends before `out` begins, the rest of out's begins after
            # src ends; only the pair touches: a chain z -> a -> b where a lives at one kernel would put z beside
            # b: review 17)
        u = unit_of[src]
        for key in members.pop(out):
            unit_of[key] = u
            members[u].append(key)
        ends[u] = sorted(ends[u] + ends.pop(out), reverse=True)[:2]
        starts[u] = sorted(starts[u] + starts.pop(out), reverse=True)[:2]
        plan.inplace.append((out, src))
        paired.add(src)
    units = [(u, min(spans[k][0] for k in ks), max(spans[k][1] for k in ks), max(plan.sizes[k] for k in ks))
             for u, ks in members.items()]
    best: tuple[list[int], dict] | None = None
    placements = (_largest_first, _first_use_first) if len(units) <= LARGEST_FIRST_UNITS else (_first_use_first,)
    for place in placements:
        got = place(units, fixed, hosts)
        if best is None or sum(got[0]) < sum(best[0]):
            best = got
    assert best is not None
    if len(units) <= SEARCH_UNITS:
        got = _searched(units, fixed, hosts, sum(best[0]))
        if got is not None:
            best = got
    slots, slot_of_unit = best
    first: dict[int, int] = {}  # slots numbered in order of first use (inputs first)
    for u, start, _end, _size in units:
        first[slot_of_unit[u]] = min(first.get(slot_of_unit[u], start), start)
    renumber = {s: i for i, s in enumerate(sorted(first, key=lambda s: (first[s], s)))}
    plan.slots = [0] * len(renumber)
    for s, i in renumber.items():
        plan.slots[i] = slots[s]
    for key in spans:
        plan.slot_of[key] = renumber[slot_of_unit[unit_of[key]]]
    return plan


def _latest_but(tops: list, key: Hashable) -> int:
    """The largest value of `tops` (a unit's two largest (value, buffer), largest first) of a buffer other
    than `key`, or -2**62 where there is none."""
    return next((v for v, k in tops if k != key), -(1 << 62))


def _largest_first(units: list, fixed: set, hosts: set = frozenset()) -> tuple[list[int], dict]:
    """Largest unit first, each into the smallest slot no unit of an overlapping lifetime holds (a slot only
    takes units no larger than its first, so none grows), else a new slot. Inputs get slots of their own;
    a host opens a slot that later (no larger) units may join (a host comes first among units of its size).
    Slots are made in order of non-increasing size, so the newest that is free is the smallest."""
    slots: list[int] = []
    held: list[list[tuple[int, int]]] = []  # per slot: the (first, last) of its units
    slot_of: dict = {}
    own: set[int] = set()
    for i in sorted(range(len(units)), key=lambda i: (-units[i][3], units[i][0] not in hosts, units[i][1], i)):
        u, start, end, size = units[i]
        slot = None
        if u not in fixed and u not in hosts:
            for s in reversed(range(len(slots))):
                if s not in own and all(end < a or b < start for a, b in held[s]):
                    slot = s
                    break
        if slot is None:
            slot = len(slots)
            slots.append(size)
            held.append([])
            if u in fixed:
                own.add(slot)
        held[slot].append((start, end))
        slot_of[u] = slot
    return slots, slot_of


SEARCH_UNITS = 96  # up to this many buffers a bounded search looks for a smaller plan than the greedy ones
SEARCH_STEPS = 8000  # ... placing at most this many units into slots in all


def _searched(units: list, fixed: set, hosts: set, bound: int) -> tuple[list[int], dict] | None:
    """A plan whose slots sum to less than `bound` (the greedy placements' best), or None. The choices are
    `_largest_first`'s (each unit, largest first, into any slot whose units' lifetimes it does not overlap, or
    a new slot): starting from its greedy choices (the newest fitting slot), each try changes one unit's choice
    and places the units after it greedily; a try that makes the slots' sum smaller becomes the base, until
    none does, the sum is the floor (the most bytes live at one kernel: no plan is below it), or SEARCH_STEPS
    placements are spent. Greedy placement wastes a slot where an early choice (a buffer into the newest
    fitting slot) leaves a later buffer no free slot that fits: the U-Net's hidden layer took the slot that
    its next layer's output could have used, which then needed a slot of its own."""
    n = len(units)
    order = sorted(range(n), key=lambda i: (-units[i][3], units[i][0] not in hosts, units[i][1], i))
    # lifetimes on the ranks of their ends (order kept, so two overlap exactly where their kernels do): masks and
    # the floor cost the number of units, not of kernels (review 17: 108 ms a plan at 20,000 kernels before)
    rank = {t: r for r, t in enumerate(sorted({t for _u, start, end, _s in units for t in (start, end)}))}
    masks = [((1 << (rank[units[i][2]] - rank[units[i][1]] + 1)) - 1) << rank[units[i][1]] for i in order]
    sizes = [units[i][3] for i in order]
    own = [units[i][0] in fixed for i in order]  # a slot of its own
    opens = [units[i][0] in fixed or units[i][0] in hosts for i in order]  # opens a slot (others may join a host's)
    live = [0] * len(rank)  # per rank: bytes of the units live there (the most is at a unit's start)
    for _u, start, end, size in units:
        for r in range(rank[start], rank[end] + 1):
            live[r] += size
    floor = max(live, default=0)
    if bound <= floor:
        return None
    steps = 0

    def run(prefix: list[int]) -> tuple[int, list[int], list[list[int]]]:
        """(sum of slots, each unit's slot, each unit's other choices) placing units by `prefix`, then greedily."""
        nonlocal steps
        held: list[int] = []  # per slot: the kernel indices its units hold (a bit each)
        taking: list[bool] = []  # whether the slot takes more units (an input's slot never does)
        cost, choice, others = 0, [], []
        for k in range(n):
            fits = [] if opens[k] else [s for s in reversed(range(len(held))) if taking[s] and not held[s] & masks[k]]
            opts = fits + [len(held)]
            c = prefix[k] if k < len(prefix) else opts[0]
            if c == len(held):
                held.append(masks[k])
                taking.append(not own[k])
                cost += sizes[k]
            else:
                held[c] |= masks[k]
            choice.append(c)
            others.append([o for o in opts if o != c])
        steps += n
        return cost, choice, others

    best, base, others = run([])
    found = False
    improved = True
    while improved and best > floor and steps < SEARCH_STEPS:
        improved = False
        for k in range(n):
            for alt in others[k]:
                if steps >= SEARCH_STEPS:
                    break
                cost, choice, alts = run(base[:k] + [alt])
                if cost < best:
                    best, base, others, improved, found = cost, choice, alts, True, True
                    break
            if improved:
                break
    if not found or best >= bound:
        return None
    slots: list[int] = []
    slot_of: dict = {}
    for k, i in enumerate(order):
        if base[k] == len(slots):
            slots.append(sizes[k])
        slot_of[units[i][0]] = base[k]
    return slots, slot_of


def _first_use_first(units: list, fixed: set, hosts: set = frozenset()) -> tuple[list[int], dict]:
    """In order of first use: the smallest free slot that holds the unit, else the largest free slot (which
    grows to fit), else a new slot. A slot is free once its last unit's lifetime has ended. Hosts are placed
    as inputs are (slots of their own: a slot here may grow, a host's may not)."""
    import heapq

    slots: list[int] = []
    slot_of: dict = {}
    busy: list[tuple[int, int]] = []  # heap of (last kernel index its current unit needs, slot)
    free: list[int] = []  # slots no live unit holds
    for u, start, end, size in sorted(units, key=lambda t: t[1]):  # stable: ties keep first-use order
        while busy and busy[0][0] < start:
            free.append(heapq.heappop(busy)[1])
        slot = None
        if u not in fixed and u not in hosts and free:
            fits = [s for s in free if slots[s] >= size]
            if fits:
                slot = min(fits, key=lambda s: (slots[s], s))
            else:
                slot = max(free, key=lambda s: (slots[s], -s))
                slots[slot] = size
            free.remove(slot)
        if slot is None:
            slot = len(slots)
            slots.append(size)
        heapq.heappush(busy, (end, slot))
        slot_of[u] = slot
    return slots, slot_of


def check_plan(plan: MemoryPlan) -> str | None:
    """Why a plan (e.g. one read from a package) is unsafe, or None: every buffer fits its slot, buffers that
    share a slot never live at the same time, except an in-place pair (`plan.inplace`) at the one kernel where
    its input's life ends and its output's begins, and each buffer is the input of at most one pair."""
    by_slot: dict[int, list] = {}
    for key, slot in plan.slot_of.items():
        if not 0 <= slot < len(plan.slots):
            return f"buffer {key} is in slot {slot}, but the plan has {len(plan.slots)} slots"
        if plan.sizes[key] > plan.slots[slot]:
            return f"buffer {key} ({plan.sizes[key]} bytes) does not fit slot {slot} ({plan.slots[slot]} bytes)"
        by_slot.setdefault(slot, []).append(key)
    pairs = set()
    for out, src in plan.inplace:
        if out not in plan.slot_of or src not in plan.slot_of or plan.slot_of[out] != plan.slot_of[src] \
                or plan.lifetimes[src][1] != plan.lifetimes[out][0] or plan.sizes[out] != plan.sizes[src] \
                or any(s == src for _, s in pairs):
            return f"the in-place pair ({out}, {src}) is not one buffer ending where the other begins in one slot"
        pairs.add((out, src))
    for slot, keys in by_slot.items():
        spans = sorted((plan.lifetimes[k], i, k) for i, k in enumerate(keys))
        last_key = None
        for (first, last), _, key in spans:
            # (a pair whose two lives are the same one kernel may sort either way round: review 17)
            touch = (key, last_key) in pairs and first == plan.lifetimes[last_key][1] \
                or (last_key, key) in pairs and plan.lifetimes[key] == plan.lifetimes[last_key] == (first, first)
            if last_key is not None and first <= plan.lifetimes[last_key][1] and not touch:
                return f"slot {slot} holds buffers that are needed at the same time"
            if last_key is None or last > plan.lifetimes[last_key][1]:
                last_key = key
    return None
