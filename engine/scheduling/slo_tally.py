"""The engine's own SLO accounting: per class and tenant, how many sequences met their TTFT and
ITL targets (goodput), and preemptions by reason. Read through `EngineStats.slo` by `/metrics`.

A sequence is judged when it finishes normally (stop or length): TTFT against its TTFT target,
its mean inter-token time (TPOT) against its ITL target. A target of None is not counted. Aborted
and failed sequences are not judged (the gateway counts those outcomes). Plain Python, no torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from weir.engine.request import Priority, Request, RequestStatus

_JUDGED = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)


class PreemptReason(enum.Enum):
    """Why a running request was preempted."""

    KV = "kv_exhausted"  # the KV pool ran out during a step or an admission of the same class
    CLASS = "class"  # displaced for a higher class that could not get blocks
    SLO = "slo"  # displaced past the running cap for a higher class near its TTFT target
    FAIR_SHARE = "fair_share"  # its tenant held more than its share of its class's seats or KV
    STALL = "stall"  # the stall watchdog or an idle-blocks stall broke a deadlock
    REQUEUE = "requeue"  # its step failed; it recomputes


@dataclass(frozen=True)
class SloCount:
    """Sequences of one class and tenant judged against their targets."""

    priority: Priority
    tenant_id: str
    ttft_met: int = 0
    ttft_missed: int = 0
    itl_met: int = 0
    itl_missed: int = 0


@dataclass(frozen=True)
class SloStats:
    """The tallies of one engine: per class and tenant, and preemptions per reason."""

    counts: tuple[SloCount, ...] = ()
    preemptions: tuple[tuple[PreemptReason, int], ...] = ()

    def preempted(self, reason: PreemptReason) -> int:
        return dict(self.preemptions).get(reason, 0)


class SloTally:
    """Counts as sequences finish and as requests are preempted; `stats()` snapshots them."""

    def __init__(self) -> None:
        self._counts: dict[tuple[Priority, str], list[int]] = {}  # ttft met/missed, itl met/missed
        self._preemptions = dict.fromkeys(PreemptReason, 0)

    def on_finished(self, req: Request) -> None:
        if req.status not in _JUDGED:
            return
        ttft, tpot = req.times.ttft_s, req.times.tpot_s
        targets = req.latency
        row = self._counts.setdefault((req.priority, req.tenant_id), [0, 0, 0, 0])
        if targets.ttft_s is not None and ttft is not None:
            row[0 if ttft <= targets.ttft_s else 1] += 1
        if targets.itl_s is not None and tpot is not None:
            row[2 if tpot <= targets.itl_s else 3] += 1

    def on_preempted(self, reason: PreemptReason) -> None:
        self._preemptions[reason] += 1

    def stats(self) -> SloStats:
        return SloStats(
            tuple(SloCount(p, t, *row) for (p, t), row in sorted(self._counts.items())),
            tuple(self._preemptions.items()),
        )

    def carry_over(self, old: SloTally) -> None:
        """Keep the totals of a scheduler this one replaces (engine restart)."""
        self._counts = old._counts
        self._preemptions = old._preemptions
