"""The LoRA slot LRU and the split of a step with more adapters than slots (torch-free)."""

from __future__ import annotations

import pytest

from weir.engine.lora.lora_slots import LoraSlots, SlotLoad, split_by_slots


def test_free_slots_first_then_the_least_recently_used_not_wanted_now() -> None:
    slots = LoraSlots(2)
    assert slots.acquire(["a", "b"]) == ({"a": 0, "b": 1}, [SlotLoad("a", 0, None), SlotLoad("b", 1, None)])
    assert slots.acquire(["a"]) == ({"a": 0}, [])  # a is now the most recently used
    assert slots.acquire(["c"]) == ({"c": 1}, [SlotLoad("c", 1, "b")])
    # b comes back with a: c (not wanted) is evicted even though a is older than c
    assert slots.acquire(["a", "b"]) == ({"a": 0, "b": 1}, [SlotLoad("b", 1, "c")])
    assert slots.release("a") == 0 and slots.slot_of("a") is None
    assert slots.acquire(["d"]) == ({"d": 0}, [SlotLoad("d", 0, None)])
    with pytest.raises(ValueError, match="needs 3 adapters"):
        slots.acquire(["x", "y", "z"])


def test_a_step_is_split_only_when_its_adapters_outnumber_the_slots() -> None:
    names = [None, "a", "b", None, "a", "c"]
    assert split_by_slots(names, 3) == [[0, 1, 2, 3, 4, 5]]
    assert split_by_slots(names, 2) == [[0, 1, 2, 3, 4], [5]]
    assert split_by_slots(names, 1) == [[0, 1, 3, 4], [2], [5]]
    assert split_by_slots([None, None], 1) == [[0, 1]]
