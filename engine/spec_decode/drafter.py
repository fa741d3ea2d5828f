"""The drafter interface: propose up to `num_spec_slots` tokens for each speculating request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from weir.engine.output import SchedulerOutput
from weir.engine.request import Request


@dataclass(frozen=True)
class Draft:
    """Tokens proposed for one request, with the distribution each was drawn from.

    `probs` is [len(token_ids), vocab] (row i: the q that token i was drawn from), or None when
    each token is a point mass (q(token) = 1), as for the n-gram drafter and greedy requests.
    """

    token_ids: tuple[int, ...]
    probs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.probs is not None and self.probs.shape[0] != len(self.token_ids):
            raise ValueError(f"{len(self.token_ids)} draft tokens but {self.probs.shape[0]} q rows")


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
