"""weir.gateway.fleet.gc_pauses: the heap frozen after start-up, garbage still collected, pauses timed."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from weir.gateway.fleet.gc_pauses import (
    GcPauseRecorder,
    lifespan_hooks,
    refreeze_heap,
    refreeze_heap_if_frozen,
)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    """A reference cycle nothing else holds (only the cyclic collector frees it)."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def _cycle_frozen() -> weakref.ref[_Node]:
    """A cycle alive at a freeze and garbage right after (a retired version's modules)."""
    holder = [_Node()]
    holder[0].other = holder[0]
    ref = weakref.ref(holder[0])
    refreeze_heap("it is alive")
    holder.clear()
    return ref


@pytest.fixture(autouse=True)
def _unfrozen_after() -> Iterator[None]:
    yield
    gc.unfreeze()


def _observed(registry: CollectorRegistry, generation: str) -> float:
    value = registry.get_sample_value("weir_gc_pause_seconds_count", {"generation": generation})
    return value or 0.0


def test_what_is_alive_is_frozen_and_a_full_collection_no_longer_walks_it() -> None:
    kept = [_Node() for _ in range(100)]
    frozen = refreeze_heap("a test")
    # objects alive at the freeze and freed since leave the count: it can only shrink
    assert frozen >= gc.get_freeze_count() > len(kept)
    # frozen: in no generation, so no collection (not even a full one) walks these objects
    walked = {id(obj) for generation in range(3) for obj in gc.get_objects(generation)}
    assert not any(id(node) in walked for node in kept)
    fresh = _Node()
    assert any(obj is fresh for obj in gc.get_objects(0))  # what comes after is collected as usual


def test_garbage_that_was_frozen_is_collected_by_the_next_refreeze() -> None:
    cycle = _cycle()
    refreeze_heap("the first load")  # the cycle is garbage already: collected, not frozen
    assert cycle() is None
    # a cycle alive at a freeze (a model version still serving) and garbage later (retired)
    holder = [_Node()]
    holder[0].other = holder[0]
    later = weakref.ref(holder[0])
    refreeze_heap("a version loaded")
    holder.clear()
    gc.collect()
    assert later() is not None  # frozen: a plain collection does not free it
    refreeze_heap("a version retired")
    assert later() is None


def test_every_collection_is_timed_by_generation_while_installed() -> None:
    registry = CollectorRegistry()
    recorder = GcPauseRecorder(registry)
    recorder.install()
    recorder.install()  # idempotent: one callback, one observation per collection
    try:
        gc.collect(0)
        gc.collect(2)
        assert _observed(registry, "0") >= 1 and _observed(registry, "2") >= 1
        before = _observed(registry, "2")
        gc.collect(2)
        assert _observed(registry, "2") == before + 1
    finally:
        recorder.uninstall()
    recorder.uninstall()  # idempotent
    after = _observed(registry, "2")
    gc.collect(2)
    assert _observed(registry, "2") == after


def test_without_a_freeze_at_start_up_loads_and_unloads_do_not_freeze_either() -> None:
    gc.unfreeze()
    refreeze_heap_if_frozen("a version loaded")
    assert gc.get_freeze_count() == 0
    refreeze_heap("start-up")
    cycle = _cycle_frozen()
    refreeze_heap_if_frozen("a version retired")
    assert cycle() is None and gc.get_freeze_count() > 0


@pytest.mark.parametrize("freeze", [True, False])
def test_the_lifespan_hooks_freeze_at_start_and_stop_timing_at_shutdown(freeze: bool) -> None:
    registry = CollectorRegistry()
    start, stop = lifespan_hooks(registry, freeze)
    gc.unfreeze()
    asyncio.run(start())
    assert (gc.get_freeze_count() > 0) is freeze
    gc.collect(2)
    assert _observed(registry, "2") >= 1
    asyncio.run(stop())
    assert gc.get_freeze_count() == 0  # unfrozen at shutdown
    observed = _observed(registry, "2")
    gc.collect(2)
    assert _observed(registry, "2") == observed
