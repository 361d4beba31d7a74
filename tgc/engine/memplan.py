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
    `lifetimes[key]`: (first, last) kernel index (-1 .. n for inputs)."""

    slots: list[int] = field(default_factory=list)
    slot_of: dict = field(default_factory=dict)
    sizes: dict = field(default_factory=dict)
    lifetimes: dict = field(default_factory=dict)

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


def plan_memory(kernel_bufs: Sequence[Sequence[Hashable]], sizes: dict, inputs: Sequence[Hashable] = (),
                outputs: Sequence[Hashable] = (), share: bool = True) -> MemoryPlan:
    """Assign each buffer (a key of `sizes`, bytes >= 1) to a slot. Greedy in order of first use: a buffer takes
    the smallest free slot that holds it, else the largest free slot (which grows to fit), else a new slot.
    A slot is free once its last buffer's lifetime has ended. `share=False`: one slot per buffer."""
    import heapq

    spans = lifetimes(kernel_bufs, inputs, outputs)
    plan = MemoryPlan(sizes={k: int(sizes[k]) for k in spans}, lifetimes=spans)
    fixed = set(inputs)
    busy: list[tuple[int, int]] = []  # heap of (last kernel index its current buffer needs, slot)
    free: list[int] = []  # slots no live buffer holds
    order = sorted(spans, key=lambda k: spans[k][0])  # stable: ties keep first-use order
    for key in order:
        first, last = spans[key]
        while busy and busy[0][0] < first:
            free.append(heapq.heappop(busy)[1])
        need = plan.sizes[key]
        slot = None
        if share and key not in fixed and free:
            fits = [s for s in free if plan.slots[s] >= need]
            if fits:
                slot = min(fits, key=lambda s: (plan.slots[s], s))
            else:
                slot = max(free, key=lambda s: (plan.slots[s], -s))
                plan.slots[slot] = need
            free.remove(slot)
        if slot is None:
            slot = len(plan.slots)
            plan.slots.append(need)
        heapq.heappush(busy, (last, slot))
        plan.slot_of[key] = slot
    return plan


def check_plan(plan: MemoryPlan) -> str | None:
    """Why a plan (e.g. one read from a package) is unsafe, or None: every buffer fits its slot, and buffers
    that share a slot never live at the same time."""
    by_slot: dict[int, list] = {}
    for key, slot in plan.slot_of.items():
        if not 0 <= slot < len(plan.slots):
            return f"buffer {key} is in slot {slot}, but the plan has {len(plan.slots)} slots"
        if plan.sizes[key] > plan.slots[slot]:
            return f"buffer {key} ({plan.sizes[key]} bytes) does not fit slot {slot} ({plan.slots[slot]} bytes)"
        by_slot.setdefault(slot, []).append(key)
    for slot, keys in by_slot.items():
        spans = sorted(plan.lifetimes[k] for k in keys)
        for (_, last), (first, _) in zip(spans, spans[1:]):
            if first <= last:
                return f"slot {slot} holds buffers that are needed at the same time"
    return None
