"""Whether a new interactive request can meet both its targets beside the streams running now
(issue 58): its TTFT (`weir.gateway.admission.slo.predict_ttft`) and its ITL, without costing the
running streams theirs.

The TTFT prediction alone let through requests that the scheduler then kept out: a request that
finds no seat under the running cap (`StepBudget.max_running`) waits in the engine's queue until
a stream of its class ends, however short its prompt (measured: every first token 15-24 s late
against a 2 s target while the cap was pinned by a polluted step cost fit). And a stream whose
row tips every step of its class over the ITL target makes every running stream of the class
miss it, its own included (the scheduler's running cap is sized for the throughput step, not
for the interactive ITL). Both are refused at once with a 503 and Retry-After, as a TTFT that
cannot be met is, rather than admitted to miss by 10x:

- **no seat:** the running sequences of its class and better (plus those admitted since the
  engine's last snapshot) fill the running cap (lower classes are displaced for it, not counted);
- **too many rows:** the fitted decode step of the rows it would share each step with
  (`slo.rows_kept`: its class and better, one looser row) plus its own, planned under the
  margin, is longer than its ITL target. Where even a step of its own rows alone is longer (a
  machine too slow for the target), refusing helps no one: it is admitted.

The step is priced without the context term (the snapshot has no mean context): an optimistic
bound, so this refuses less, never more, than the scheduler will need. Plain Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from weir.engine.engine_stats import EngineStats
from weir.engine.request import Priority
from weir.gateway.admission.slo import rows_kept


@dataclass(frozen=True)
class StreamOutlook:
    """What a new request's stream would join, by the engine's snapshot and its fitted step cost."""

    rows: int  # decode rows it would share each step with (its class and better, one looser row)
    gap_s: float  # the fitted decode step of those rows and its own, under the margin
    alone_s: float  # a step of its own rows alone: what the machine can do at best
    seats_full: bool  # the running cap leaves it no seat: it would wait in the queue for one

    def misses_itl(self, itl_s: float | None) -> bool:
        """Whether the step it would share is over `itl_s`, which the machine can keep (its rows alone)."""
        return itl_s is not None and self.gap_s > itl_s >= self.alone_s

    def refuses(self, itl_s: float | None) -> bool:
        """Whether the request cannot meet both targets beside the running streams (module docstring)."""
        return self.seats_full or self.misses_itl(itl_s)


def stream_outlook(
    stats: EngineStats, priority: Priority, unseen_seqs: int = 0, num_seqs: int = 1
) -> StreamOutlook | None:
    """The outlook of a new request of `priority` running `num_seqs` sequences (n choices);
    `unseen_seqs`: sequences of its class and better admitted since the snapshot. None while the
    step cost is not fitted (nothing is refused)."""
    budget = stats.step_budget
    if budget is None or budget.cost is None:
        return None
    rows = rows_kept(stats, priority) + unseen_seqs
    scale = 1.0 + budget.margin
    cap = budget.max_running
    ahead = sum(stats.running_by_priority[: int(priority) + 1]) + unseen_seqs
    return StreamOutlook(
        rows=rows,
        gap_s=budget.cost.seconds(rows + num_seqs, rows + num_seqs) * scale,
        alone_s=budget.cost.seconds(num_seqs, num_seqs) * scale,
        seats_full=cap is not None and ahead >= cap,
    )
