"""The drafter interface: propose up to `num_spec_slots` tokens for each speculating request
(a `Draft`, weir.engine.sampling.draft_verifier, which the runner verifies)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from weir.engine.output import SchedulerOutput
from weir.engine.request import Request
from weir.engine.sampling.draft_verifier import Draft


class Drafter(Protocol):
    """Proposes draft tokens for the requests a step gives draft slots (`num_spec_slots`)."""

    def propose(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> dict[str, Draft]:
        """Called once per step, before the target's forward, whether or not any slot was given
        (a drafter with KV of its own applies the step's copies and forgets finished requests).
        A request may get fewer tokens than slots, or none."""
        ...

    def forget_all(self) -> None:
        """Drop all per-request state (the engine was reset)."""
        ...
