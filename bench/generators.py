"""Synthetic traces: random lengths, a shared-prefix mix, and multi-turn chat.

Every generator takes a seed and returns the same requests for the same arguments, so a
generated trace can be written once (`weir bench gen`) and replayed like the shared ones.
Lengths of prompts are in words (the tokenizer turns roughly 1.3 tokens per word of this
vocabulary); output lengths are in tokens (`max_tokens`, with `ignore_eos`).
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from weir_bench.workloads import ChatMessage, RequestKind, WorkloadRequest

_WORDS = (
    "alpha basin cable delta ember fabric garnet harbor island jigsaw kernel lantern meadow nickel "
    "orbit pepper quartz ribbon saddle timber umbra velvet walnut yonder zephyr anchor bridge copper "
    "dune engine forest glacier hollow ivory jungle kettle ledger marble needle oyster pillar quiver "
    "rocket shadow tunnel utensil vessel willow yarrow zenith the of and to in is was for on with "
    "system data model request server memory cache token batch queue tenant budget latency signal"
).split()


class LengthKind(enum.Enum):
    """Shape of a length distribution."""

    FIXED = "fixed"
    UNIFORM = "uniform"
    LOGNORMAL = "lognormal"


@dataclass(frozen=True)
class LengthDist:
    """A distribution of integer lengths, clipped to [lo, hi].

    FIXED uses `median`; UNIFORM draws in [lo, hi]; LOGNORMAL has the given median and sigma
    (heavy-tailed like real chat traffic).
    """

    kind: LengthKind
    median: int
    lo: int = 1
    hi: int = 1 << 20
    sigma: float = 0.8

    def __post_init__(self) -> None:
        if self.lo < 1 or self.hi < self.lo:
            raise ValueError("lo must be >= 1 and hi >= lo")
        if not self.lo <= self.median <= self.hi:
            raise ValueError("median must lie in [lo, hi]")
        if self.sigma < 0:
            raise ValueError("sigma must be >= 0")

    def sample(self, rng: random.Random) -> int:
        """Draw one length."""
        if self.kind is LengthKind.FIXED:
            return self.median
        if self.kind is LengthKind.UNIFORM:
            return rng.randint(self.lo, self.hi)
        v = int(round(math.exp(math.log(self.median) + self.sigma * rng.gauss(0.0, 1.0))))
        return max(self.lo, min(self.hi, v))


def words(rng: random.Random, num_words: int) -> str:
    """Deterministic filler text of `num_words` words."""
    return " ".join(rng.choice(_WORDS) for _ in range(num_words))


def poisson_times(rng: random.Random, n: int, rate: float) -> list[float]:
    """n arrival times of a Poisson process of `rate` per second, starting after 0."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(round(t, 4))
    return out


def _check_common(n: int, tenants: Sequence[str]) -> None:
    if n < 1:
        raise ValueError("n must be >= 1")
    if not tenants:
        raise ValueError("tenants must not be empty")


def random_lengths(
    n: int,
    *,
    rate: float,
    prompt_words: LengthDist,
    output_tokens: LengthDist,
    tenants: Sequence[str] = ("default",),
    kind: RequestKind = RequestKind.CHAT,
    priority: str | None = None,
    seed: int = 0,
) -> list[WorkloadRequest]:
    """Independent requests with prompt and output lengths drawn from the given distributions."""
    _check_common(n, tenants)
    rng = random.Random(seed)
    out = []
    for i, t in enumerate(poisson_times(rng, n, rate)):
        tenant = tenants[rng.randrange(len(tenants))]
        text = words(rng, prompt_words.sample(rng))
        max_tokens = output_tokens.sample(rng)
        out.append(
            WorkloadRequest(
                id=f"random-{i:05d}",
                t=t,
                tenant=tenant,
                kind=kind,
                max_tokens=max_tokens,
                priority=priority,
                messages=(ChatMessage("user", text),) if kind is RequestKind.CHAT else (),
                prompt=text if kind is RequestKind.COMPLETION else None,
                ignore_eos=True,
            )
        )
    return out


def shared_prefix(
    n: int,
    *,
    rate: float,
    num_prefixes: int,
    prefix_words: int,
    suffix_words: LengthDist,
    output_tokens: LengthDist,
    tenants: Sequence[str] = ("default",),
    priority: str | None = None,
    seed: int = 0,
) -> list[WorkloadRequest]:
    """Chat requests whose system prompt is one of `num_prefixes` long shared prompts per tenant.

    Prefixes are per tenant because the prefix cache is scoped per tenant by default: a mix that
    shared prompts across tenants would measure cache isolation, not reuse.
    """
    _check_common(n, tenants)
    if num_prefixes < 1 or prefix_words < 1:
        raise ValueError("num_prefixes and prefix_words must be >= 1")
    rng = random.Random(seed)
    prefixes = {t: [words(rng, prefix_words) for _ in range(num_prefixes)] for t in tenants}
    out = []
    for i, t in enumerate(poisson_times(rng, n, rate)):
        tenant = tenants[rng.randrange(len(tenants))]
        system = prefixes[tenant][rng.randrange(num_prefixes)]
        out.append(
            WorkloadRequest(
                id=f"prefix-{i:05d}",
                t=t,
                tenant=tenant,
                kind=RequestKind.CHAT,
                max_tokens=output_tokens.sample(rng),
                priority=priority,
                messages=(
                    ChatMessage("system", system),
                    ChatMessage("user", words(rng, suffix_words.sample(rng))),
                ),
                ignore_eos=True,
            )
        )
    return out


def multi_turn(
    num_sessions: int,
    *,
    turns: int,
    session_rate: float,
    think_time_s: float,
    user_words: LengthDist,
    reply_words: LengthDist,
    output_tokens: LengthDist,
    system_words: int = 0,
    tenants: Sequence[str] = ("default",),
    priority: str | None = None,
    seed: int = 0,
) -> list[WorkloadRequest]:
    """Chat sessions: each turn resends the whole history (system, user and assistant turns).

    The assistant turns are synthetic text of `reply_words` words rather than the model's own
    answers, so the trace stays deterministic and replayable against any server. Turn k is
    sent `think_time_s` after turn k-1 is due and never before turn k-1 finished (`after`).
    """
    _check_common(num_sessions, tenants)
    if turns < 1:
        raise ValueError("turns must be >= 1")
    if think_time_s < 0:
        raise ValueError("think_time_s must be >= 0")
    rng = random.Random(seed)
    out = []
    for s, start in enumerate(poisson_times(rng, num_sessions, session_rate)):
        tenant = tenants[rng.randrange(len(tenants))]
        history: list[ChatMessage] = []
        if system_words > 0:
            history.append(ChatMessage("system", words(rng, system_words)))
        previous: str | None = None
        for k in range(turns):
            history.append(ChatMessage("user", words(rng, user_words.sample(rng))))
            rid = f"session-{s:04d}-turn-{k:02d}"
            out.append(
                WorkloadRequest(
                    id=rid,
                    t=round(start + k * think_time_s, 4),
                    tenant=tenant,
                    kind=RequestKind.CHAT,
                    max_tokens=output_tokens.sample(rng),
                    priority=priority,
                    messages=tuple(history),
                    ignore_eos=True,
                    after=previous,
                )
            )
            history.append(ChatMessage("assistant", words(rng, reply_words.sample(rng))))
            previous = rid
    # Arrival order, stable: a later turn never sorts before its predecessor (same session, larger t).
    return [r for _, r in sorted(enumerate(out), key=lambda p: (p[1].t, p[0]))]
