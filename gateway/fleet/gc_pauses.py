"""Keeping Python's cyclic garbage collector from stopping the server for a quarter of a second.

A served model brings ~370,000 long-lived Python objects (torch modules and their parameters,
the tokenizer, transformers' and starlette's modules). CPython's full collection walks every one
of them: 220-240 ms measured on SmolLM2-135M (2-core EPYC, Python 3.11), while it holds the GIL,
so the engine thread and the event loop both stand still, and every stream's next token is
late by that much. CPython starts a full collection once the objects that survived younger
collections reach a quarter of the long-lived ones, which a busy server does again and again.

`refreeze_heap` collects once and then moves every object still alive into the collector's
permanent generation (`gc.freeze`), which no collection walks; afterwards a full collection
only walks what was allocated since (measured: under 1 ms). It runs when the heap has just
changed shape for good: at start-up, after a model version is loaded, after one is retired.
It unfreezes first, so objects frozen earlier and garbage now (a retired version's modules)
are collected rather than kept for the life of the process. Each call costs one full
collection, once, at a moment chosen by an operator's action instead of at random.

`GcPauseRecorder` times every collection (`gc.callbacks`) into the histogram
`weir_gc_pause_seconds{generation}`, so the pauses that remain show on /metrics.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

logger = logging.getLogger(__name__)

# Pauses from ~50 us (a young collection) to a whole un-frozen heap's quarter of a second.
PAUSE_BUCKETS_S = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0)


def refreeze_heap(reason: str) -> int:
    """Collect everything (frozen objects included), then freeze what is alive. Returns how
    many objects are frozen. Blocks the whole process for one full collection."""
    start = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info(
        "garbage collector: %d objects frozen after %s (%.0f ms)",
        frozen,
        reason,
        (time.perf_counter() - start) * 1e3,
    )
    return frozen


class GcPauseRecorder:
    """Times each garbage collection into `weir_gc_pause_seconds{generation}` while installed."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.pauses = Histogram(
            "weir_gc_pause_seconds",
            "Time the process stood still in one cyclic garbage collection, by generation",
            ["generation"],
            buckets=PAUSE_BUCKETS_S,
            registry=registry,
        )
        self._started: float | None = None
        self._installed = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # Called by CPython with the GIL held, on whichever thread triggered the collection.
        if phase == "start":
            self._started = time.perf_counter()
        elif phase == "stop" and self._started is not None:
            self.pauses.labels(generation=str(info.get("generation", "?"))).observe(
                time.perf_counter() - self._started
            )
            self._started = None

    def install(self) -> None:
        """Start timing collections (idempotent)."""
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def uninstall(self) -> None:
        """Stop timing collections (idempotent)."""
        if self._installed:
            gc.callbacks.remove(self._callback)
            self._installed = False


def refreeze_heap_if_frozen(reason: str) -> None:
    """`refreeze_heap`, where the heap was frozen before (the server's start-up froze it, and
    `--gc-freeze` is on); nothing otherwise."""
    if gc.get_freeze_count():
        refreeze_heap(reason)


def lifespan_hooks(
    registry: CollectorRegistry, freeze: bool
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    """The server's start hook (with `freeze`, freeze the heap as loaded: run it last; then time
    collections) and stop hook (stop timing; unfreeze)."""
    recorder = GcPauseRecorder(registry)

    async def start() -> None:
        if freeze:
            refreeze_heap("start-up")
        recorder.install()  # after: the histogram holds the pauses of serving, not this one

    async def stop() -> None:
        recorder.uninstall()
        if freeze:
            # Objects frozen while serving are collectable again (a process that serves more than
            # once, as the end-to-end tests do, does not keep what the first server left behind).
            gc.unfreeze()

    return start, stop
