"""The engine's stall watchdog: a scheduler that stops making progress becomes a visible failure.

The scheduler is built to always make progress (every step with running requests schedules a
token or preempts someone; tests/engine/scheduling/test_scheduler_progress.py holds it to that). This is the
net under that promise: if the engine steps `max_stalled_steps` times in a row without feeding a
single token while work exists, the engine logs the scheduler's state, counts a stall
(`weir_engine_stalls_total`) and breaks it by preempting the lowest-ranked running request, whose
blocks then go to the waiting ones. A preemption alone does not count as progress here: a
request preempted and admitted again step after step, with no token computed, is a stall too.

Plain Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StallWatchdog:
    """Counts consecutive steps that fed no token while work existed; `observe` says when to act."""

    max_stalled_steps: int = 64
    num_stalled_steps: int = 0  # consecutive, so far
    num_stalls: int = 0  # stalls detected (and broken) since start; monotonic

    def __post_init__(self) -> None:
        if self.max_stalled_steps < 1:
            raise ValueError(f"max_stalled_steps must be >= 1, got {self.max_stalled_steps}")

    def observe(self, num_tokens: int, has_work: bool) -> bool:
        """One step fed `num_tokens` tokens; `has_work`: requests were running or admissible.

        True when this step completes a stall: the caller logs and breaks it. The count starts
        again after a stall, so a stall that persists is reported once every `max_stalled_steps`.
        """
        if num_tokens > 0 or not has_work:
            self.num_stalled_steps = 0
            return False
        self.num_stalled_steps += 1
        if self.num_stalled_steps < self.max_stalled_steps:
            return False
        self.num_stalled_steps = 0
        self.num_stalls += 1
        return True
