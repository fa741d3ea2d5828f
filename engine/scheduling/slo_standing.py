"""Whether a request can still meet its SLO: the standing the step plan's goodput trade counts.

A request meets its SLO (it counts towards goodput) when its first token came within its TTFT
target and every gap between two of its tokens within its ITL target (engine/latency_targets.py).
Once one of them is missed the request cannot meet it any more, whatever the scheduler does for
it later: a longer step costs it nothing towards goodput. The step plan uses this to trade a step
longer than the tightest ITL against first tokens that would otherwise come late
(engine/scheduling/slo_trade.py): only the rows that still stand are a price.

A gap counts as missed when it is over the ITL target by more than `ITL_TOLERANCE` (a step is
planned at its target, and the fitted cost is a mean, not a bound: the plan cannot promise a
step to the millisecond). The checks are incremental: each request's tokens are looked at once.

Plain Python, no torch.
"""

from __future__ import annotations

from collections.abc import Collection

from weir.engine.request import Request

ITL_TOLERANCE = 0.05  # a gap this much over the ITL target (relative) still counts as kept


class SloStanding:
    """Per request: the tokens checked so far and whether its SLO is already lost."""

    def __init__(self) -> None:
        self._checked: dict[str, tuple[int, bool]] = {}  # request id -> (tokens checked, lost)

    def stands(self, req: Request) -> bool:
        """Whether `req` has kept its TTFT target (if it has a first token) and every ITL so far."""
        checked, lost = self._checked.get(req.request_id, (0, False))
        tokens = req.times.token_s
        if not lost and len(tokens) > checked:
            lost = _misses(req, checked)
        self._checked[req.request_id] = (len(tokens), lost)
        return not lost

    def retain(self, request_ids: Collection[str]) -> None:
        """Forget the requests not in `request_ids` (finished ones) once they outnumber them."""
        if len(self._checked) > 2 * len(request_ids) + 64:
            self._checked = {rid: v for rid, v in self._checked.items() if rid in request_ids}

    def __len__(self) -> int:
        return len(self._checked)


def _misses(req: Request, checked: int) -> bool:
    """Whether the tokens of `req` from index `checked` on miss its TTFT or ITL target."""
    times, targets = req.times, req.latency
    tokens = times.token_s
    if checked == 0 and targets.ttft_s is not None and times.first_token_s is not None:
        if times.first_token_s - req.arrival_s > targets.ttft_s:
            return True
    itl = targets.itl_s
    if itl is None:
        return False
    bound = itl * (1.0 + ITL_TOLERANCE)
    return any(tokens[i] - tokens[i - 1] > bound for i in range(max(1, checked), len(tokens)))
