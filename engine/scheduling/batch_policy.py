"""How batches form over time: when waiting requests may be admitted, and how many at once.

One class per `BatchPolicy` (`make_batching` picks it); the scheduler asks it and never
branches on the policy itself. Plain Python, no torch.

- Continuous (iteration-level, the default): requests join and leave every step. Admission
  stops when the step's token budget is spent, and may be held a moment so requests join
  together (`SchedulerConfig.admission_hold_s`).
- Static: wait for a full batch (`static_batch_size`, or a partial one after
  `static_max_wait_s`), admit it whole and run it to completion before the next one.
- Dynamic: collect within a time window (`dynamic_window_s`, or until `max_num_seqs` wait),
  then admit the group whole and run it to completion.

The two group policies exist for the offline benchmark's comparisons; a group is admitted
whole and its prompts fed over the next steps, so nothing is held back for a block another
request is computing (it would be left out until the whole batch ends).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from weir.engine.config import BatchPolicy, SchedulerConfig
from weir.engine.request import Request
from weir.engine.scheduling.request_queue import WaitingQueue


class Batching(ABC):
    """When the scheduler may admit waiting requests, and how many may run at once."""

    # A group policy admits a whole group at once, past the step's token budget, and runs it to
    # completion; continuous batching admits within the budget, step by step.
    forms_groups: bool = True

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config

    @property
    def max_seqs(self) -> int:
        """The most requests running at once."""
        return self.config.max_num_seqs

    @abstractmethod
    def may_admit(self, waiting: WaitingQueue, num_running: int, clock: Callable[[], float]) -> bool:
        """Whether waiting requests may be admitted now."""

    def window_end_s(self, head: Request) -> float | None:
        """When the wait of the group `head` leads ends by itself (None: time alone admits nobody)."""
        return None


class ContinuousBatching(Batching):
    """Iteration-level batching: requests join and leave every step."""

    forms_groups = False

    def may_admit(self, waiting: WaitingQueue, num_running: int, clock: Callable[[], float]) -> bool:
        """At once when the admission hold is off or nothing runs; else once as many requests wait
        as run, or the longest-waiting request has waited the hold (`admission_hold_s`). The
        longest wait, not the head's: under the fair or priority queue the head can be a newer
        request, and a tenant cancelling and resending would keep it new and hold everyone."""
        hold = self.config.admission_hold_s
        if hold <= 0 or not num_running or not len(waiting):
            return True
        if len(waiting) >= num_running:
            return True
        # fewer wait than run here: the scan is bounded by the running count
        return clock() - min(r.arrival_s for r in waiting) >= hold


class _GroupBatching(Batching):
    """A group is admitted whole once enough wait or the first has waited long enough; the next
    group only once this one has run to completion."""

    @property
    @abstractmethod
    def group_size(self) -> int:
        """How many waiting requests make a group at once."""

    @property
    @abstractmethod
    def max_wait_s(self) -> float:
        """How long the first request of a group waits at most."""

    def may_admit(self, waiting: WaitingQueue, num_running: int, clock: Callable[[], float]) -> bool:
        if num_running or not len(waiting):
            return False
        head = waiting.peek()
        waited = clock() - head.arrival_s if head is not None else 0.0
        return len(waiting) >= self.group_size or waited >= self.max_wait_s

    def window_end_s(self, head: Request) -> float | None:
        return head.arrival_s + self.max_wait_s


class StaticBatching(_GroupBatching):
    """Wait for a full batch (or a partial one after `static_max_wait_s`), run it to completion."""

    @property
    def max_seqs(self) -> int:
        return min(self.config.max_num_seqs, self.config.static_batch_size)

    @property
    def group_size(self) -> int:
        return self.config.static_batch_size

    @property
    def max_wait_s(self) -> float:
        return self.config.static_max_wait_s


class DynamicBatching(_GroupBatching):
    """Collect within `dynamic_window_s` (or until `max_num_seqs` wait), run the group to completion."""

    @property
    def group_size(self) -> int:
        return self.config.max_num_seqs

    @property
    def max_wait_s(self) -> float:
        return self.config.dynamic_window_s


_BATCHING: dict[BatchPolicy, type[Batching]] = {
    BatchPolicy.CONTINUOUS: ContinuousBatching,
    BatchPolicy.STATIC: StaticBatching,
    BatchPolicy.DYNAMIC: DynamicBatching,
}


def make_batching(config: SchedulerConfig) -> Batching:
    """The batching of `config.batch_policy`."""
    return _BATCHING[config.batch_policy](config)
