"""Counts of speculative decoding, per request and for the engine. Plain Python, no torch."""

from __future__ import annotations

from dataclasses import dataclass

# Weight of the latest verify step in a request's running mean of accepted tokens per step.
ACCEPTANCE_EMA_ALPHA = 0.5


@dataclass(frozen=True)
class VerifiedDraft:
    """What verification decided for one request in one step, as the scheduler applies it.

    `accepted` are the draft tokens kept, in order; the token sampled after them (the correction
    or the bonus token) is the step's ordinary sampled token.
    """

    num_drafted: int
    accepted: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.accepted) > self.num_drafted:
            raise ValueError(f"{len(self.accepted)} tokens accepted of {self.num_drafted} drafted")


@dataclass
class SpeculationCounts:
    """Token counts of verify steps."""

    num_drafted: int = 0  # draft tokens verified
    num_accepted: int = 0  # of them, accepted
    num_emitted: int = 0  # tokens appended by verify steps (accepted + one per step, stops cut)

    def add(self, num_drafted: int, num_accepted: int, num_emitted: int) -> None:
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        self.num_emitted += num_emitted


@dataclass
class SpeculationTally(SpeculationCounts):
    """One sequence's speculation so far (a field of `Request`, changed by the scheduler only)."""

    # Running mean of accepted tokens per step with draft slots; None before the first one.
    recent_accepted: float | None = None

    def observe(self, num_drafted: int, num_accepted: int, num_emitted: int) -> None:
        """A verify step."""
        self.add(num_drafted, num_accepted, num_emitted)
        self.fold(num_accepted)

    def fold(self, num_accepted: int) -> None:
        """Fold one step's accepted drafts into the running mean (0 for slots that got no draft)."""
        previous = self.recent_accepted
        a = ACCEPTANCE_EMA_ALPHA
        self.recent_accepted = num_accepted if previous is None else (1 - a) * previous + a * num_accepted


@dataclass
class SpeculationCounters(SpeculationCounts):
    """The engine's totals since start (monotonic: they survive an engine reset)."""

    num_steps_off_by_batch: int = 0  # steps with decodes where the batch rule switched speculation off
