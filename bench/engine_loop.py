"""Driving an `LLMEngine` directly, without the gateway: step it until every request is done.

The offline benchmark and the prefix-cache experiment time the engine alone, so they step it
themselves. `run_until_done` is that loop, written once: it yields every `RequestOutput` in the
order the engine produced it, and, given `arrivals`, adds each request when the clock reaches its
`arrival_s` (an open loop: the engine is stepped while it has work and the loop sleeps while it
has none).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from weir.engine.client import EngineRequest
    from weir.engine.output import RequestOutput


class SteppedEngine(Protocol):
    """What the loop needs of an engine (`weir.engine.llm_engine.LLMEngine` has it)."""

    def add_request(self, er: EngineRequest) -> None: ...

    def has_unfinished(self) -> bool: ...

    def step(self) -> list[RequestOutput]: ...


def run_until_done(
    engine: SteppedEngine,
    arrivals: Iterable[EngineRequest] = (),
    *,
    max_steps: int | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[RequestOutput]:
    """Step `engine` until no request is unfinished and every arrival has joined; yield each output.

    `arrivals` join in `arrival_s` order once `clock()` (the engine's clock: monotonic by
    default) reaches it; requests added before the call are run too. `max_steps` bounds the
    number of engine steps: past it, `RuntimeError` (for callers that must not loop forever).
    """
    pending = deque(sorted(arrivals, key=lambda er: er.arrival_s))
    num_steps = 0
    while pending or engine.has_unfinished():
        now = clock()
        while pending and pending[0].arrival_s <= now:
            engine.add_request(pending.popleft())
        if not engine.has_unfinished():
            sleep(max(0.0, pending[0].arrival_s - clock()))
            continue
        if max_steps is not None and num_steps >= max_steps:
            raise RuntimeError(f"requests still unfinished after {max_steps} engine steps")
        num_steps += 1
        yield from engine.step()
