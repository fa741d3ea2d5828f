"""Which adapter holds which of the fixed LoRA slots, least recently used evicted first (torch-free).

Every loaded adapter lives in host memory; a step needs its adapters in device slots. A step
never needs more adapters than there are slots: `split_by_slots` cuts a step with more into
sub-batches the runner runs one after the other (requests are independent within a step).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SlotLoad:
    """Copy adapter `name` into `slot`, evicting `evicted` (None: the slot was free)."""

    name: str
    slot: int
    evicted: str | None


class LoraSlots:
    """An LRU map from adapter name to slot index."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self._slot_of: OrderedDict[str, int] = OrderedDict()  # oldest use first
        self._free = list(range(num_slots - 1, -1, -1))  # pop() gives slot 0 first

    def slot_of(self, name: str) -> int | None:
        return self._slot_of.get(name)

    def acquire(self, names: Sequence[str]) -> tuple[dict[str, int], list[SlotLoad]]:
        """Slots for `names` (distinct, at most num_slots) and the loads that must run first.

        Adapters already in a slot stay there and become the most recently used; the others take
        a free slot, or evict the least recently used adapter not in `names`.
        """
        wanted = list(dict.fromkeys(names))
        if len(wanted) > self.num_slots:
            raise ValueError(f"a step needs {len(wanted)} adapters but there are {self.num_slots} slots")
        for name in wanted:
            if name in self._slot_of:
                self._slot_of.move_to_end(name)
        loads: list[SlotLoad] = []
        for name in wanted:
            if name in self._slot_of:
                continue
            evicted: str | None = None
            if self._free:
                slot = self._free.pop()
            else:
                # The wanted ones were moved to the end: the oldest entry is not one of them.
                evicted, slot = self._slot_of.popitem(last=False)
            self._slot_of[name] = slot
            loads.append(SlotLoad(name, slot, evicted))
        return {name: self._slot_of[name] for name in wanted}, loads

    def release(self, name: str) -> int | None:
        """Forget `name` (it was unloaded); its slot is free again. Returns that slot."""
        slot = self._slot_of.pop(name, None)
        if slot is not None:
            self._free.append(slot)
        return slot


def split_by_slots(names: Sequence[str | None], num_slots: int) -> list[list[int]]:
    """Indices of `names` cut into groups of at most `num_slots` distinct adapters each.

    None (the base model) needs no slot and goes with the first group. One group, in the original
    order, when the step fits.
    """
    distinct = list(dict.fromkeys(n for n in names if n is not None))
    if len(distinct) <= num_slots:
        return [list(range(len(names)))]
    group_of = {name: i // num_slots for i, name in enumerate(distinct)}
    groups: list[list[int]] = [[] for _ in range(-(-len(distinct) // num_slots))]
    for i, name in enumerate(names):
        groups[0 if name is None else group_of[name]].append(i)
    return groups
