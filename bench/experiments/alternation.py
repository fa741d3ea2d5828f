"""Systems measured in alternating rounds, so that a slow spell of the host lands on both sides.

A benchmark that starts each system once, one after another, compares two different moments of a
shared host: when the host slows for a minute (another tenant of the machine, a thermal step), the
ratio says which system was unlucky. Running the systems in rounds, each round in the reverse
order of the one before (A B, B A, A B, ...), puts every system at the start and at the end of a
round equally often, so a drift over the run weighs on both; the ratio is then taken within each
round (two neighbouring runs) and summarised by its median over the rounds.

- `round_orders`: the order of the systems in every round;
- `RoundRatios` / `summarise`: one ratio's values over the rounds, their median and spread, and how
  many rounds met a target.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def round_orders(systems: Sequence[str], rounds: int) -> list[list[str]]:
    """The systems' order in each of `rounds` rounds: as given in the first, reversed in the second,
    and so on (A B, B A, A B: the last system of a round opens the next)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if len(set(systems)) != len(systems):
        raise ValueError(f"each system once per round, got {list(systems)}")
    forward = list(systems)
    return [forward if i % 2 == 0 else forward[::-1] for i in range(rounds)]


@dataclass(frozen=True)
class RoundRatios:
    """One ratio (e.g. Weir's ITL p50 over the peer's) in every round, in round order."""

    name: str
    values: tuple[float, ...]
    target: float
    higher_is_better: bool

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread(self) -> tuple[float, float]:
        return min(self.values), max(self.values)

    def met(self, value: float) -> bool:
        return value >= self.target if self.higher_is_better else value <= self.target

    @property
    def rounds_met(self) -> int:
        return sum(self.met(v) for v in self.values)

    @property
    def median_met(self) -> bool:
        return self.met(self.median)

    def line(self) -> str:
        """`name: median M (lo-hi), met in k of n rounds` for a summary."""
        lo, hi = self.spread
        sign = ">=" if self.higher_is_better else "<="
        verdict = "met" if self.median_met else "not met"
        return (
            f"{self.name}: median {self.median:.2f} ({lo:.2f}-{hi:.2f}), target {sign} {self.target}: "
            f"{verdict} on the median; met in {self.rounds_met} of {len(self.values)} rounds"
        )


def summarise(
    per_round: Sequence[dict[str, float]],
    targets: dict[str, tuple[float, bool]],
    prefix: str = "",
) -> list[RoundRatios]:
    """Each targeted ratio over the rounds: `per_round` holds one round's ratios by name, `targets`
    maps a name to (target, higher is better); each result is named `prefix` + the ratio's name. A
    ratio missing from a round is an error: every round measures every system."""
    if not per_round:
        raise ValueError("no rounds to summarise")
    out = []
    for name, (target, higher) in targets.items():
        values = tuple(round_ratios[name] for round_ratios in per_round)
        out.append(RoundRatios(prefix + name, values, target, higher))
    return out
