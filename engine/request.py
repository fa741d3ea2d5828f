"""Request state and sampling parameters: the unit the scheduler moves around.

A request's progress is one number, `num_computed_tokens`, catching up with `num_tokens`
(prompt + generated). A prefill chunk and a decode step are the same thing at different sizes.
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from weir.engine import sampling_bounds as b
from weir.engine.errors import InvalidRequestError
from weir.engine.latency_targets import NO_TARGETS, LatencyTargets
from weir.engine.lora.lora_types import AdapterRef
from weir.engine.speculation_tally import SpeculationTally

if TYPE_CHECKING:
    from weir.engine.structured.constraints import TokenConstraint

SEED_MIN, SEED_MAX = b.SEED_MIN, b.SEED_MAX
_SEED_MODULUS = 2**64


def check_seed(seed: object) -> None:
    """Raise InvalidRequestError (param "seed") unless `seed` is None or a 64-bit integer."""
    if seed is None:
        return
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise InvalidRequestError(f"seed must be an integer, got {seed!r}", "seed")
    if not SEED_MIN <= seed <= SEED_MAX:
        raise InvalidRequestError(f"seed must be in [{SEED_MIN}, {SEED_MAX}], got {seed}", "seed")


def child_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice `index` of an n>1 request: `seed + index`, wrapped into [0, 2**64).

    Choice 0 keeps the request's seed, so n=1 and the first of n choices draw the same tokens;
    the wrap keeps every child seed valid, whatever the parent's.
    """
    if seed is None or index == 0:
        return seed
    return (seed + index) % _SEED_MODULUS


class Priority(enum.IntEnum):
    """Priority classes; lower value is served first."""

    INTERACTIVE = 0
    STANDARD = 1
    BATCH = 2

    @classmethod
    def parse(cls, name: str) -> Priority:
        try:
            return cls[name.upper()]
        except KeyError:
            raise InvalidRequestError(
                f"priority must be one of interactive, standard, batch; got {name!r}", param="priority"
            ) from None


class RequestStatus(enum.Enum):
    """Lifecycle of a request inside the engine."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # its blocks were dropped: it recomputes them when admitted again
    SWAPPED = "swapped"  # its blocks are in the host tier: swapped in when admitted again
    FETCHING_KV = "fetching_kv"  # out of the queue while its prefix's blocks come from the KV store
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED


_FINISHED = {
    RequestStatus.FINISHED_STOPPED,
    RequestStatus.FINISHED_LENGTH,
    RequestStatus.FINISHED_ABORTED,
    RequestStatus.FINISHED_ERROR,
}


class FinishReason(enum.Enum):
    """Why generation ended, as the OpenAI API names it."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"

    @property
    def status(self) -> RequestStatus:
        """The finished status a request ending for this reason takes."""
        return _STATUS_OF[self]


_STATUS_OF = {
    FinishReason.STOP: RequestStatus.FINISHED_STOPPED,
    FinishReason.LENGTH: RequestStatus.FINISHED_LENGTH,
    FinishReason.ABORT: RequestStatus.FINISHED_ABORTED,
    FinishReason.ERROR: RequestStatus.FINISHED_ERROR,
}


@dataclass(frozen=True)
class TokenDelta:
    """What one sampled token adds to a sequence: the text safe to stream now, and why the
    sequence ended if it did (`stop_reason`: the stop string or stop token id; None for EOS and
    length)."""

    text: str
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class TokenChecker(Protocol):
    """Turns a sequence's sampled tokens into text and decides when it stops, one token at a time
    (`weir.engine.text.output_processor.OutputProcessor`)."""

    def step(self, token_id: int) -> TokenDelta: ...


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. Validated on construction."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top alternatives to return; 0 = sampled token only
    n: int = 1
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    use_beam_search: bool = False
    beam_width: int = 1
    length_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit in [-100, 100])
    # Speculative decoding for this request: None follows the server; False opts out; True asks
    # for it (refused with beam search, which never speculates).
    speculative: bool | None = None

    def __post_init__(self) -> None:
        """The bounds of `weir.engine.sampling_bounds`, which the gateway's bodies declare too."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(
                f"max_tokens must be an integer >= 1, got {self.max_tokens!r}", "max_tokens"
            )
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}", "temperature")
        if not (0 < self.top_p <= 1):
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.top_k == 0 or self.top_k < -1:
            raise InvalidRequestError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k}", "top_k")
        if not (0 <= self.min_p <= 1):
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p}", "min_p")
        if not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise InvalidRequestError(
                f"repetition_penalty must be > 0, got {self.repetition_penalty}", "repetition_penalty"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (b.PENALTY_MIN <= value <= b.PENALTY_MAX):
                raise InvalidRequestError(
                    f"{name} must be in [{b.PENALTY_MIN}, {b.PENALTY_MAX}], got {value}", name
                )
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidRequestError("stop must be a tuple of non-empty strings", "stop")
        if len(self.stop) > b.MAX_STOP_STRINGS:
            raise InvalidRequestError(
                f"at most {b.MAX_STOP_STRINGS} stop strings, got {len(self.stop)}", "stop"
            )
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise InvalidRequestError("stop_token_ids must be non-negative integers", "stop_token_ids")
        if self.logprobs is not None and not (0 <= self.logprobs <= b.MAX_LOGPROBS):
            raise InvalidRequestError(
                f"logprobs must be in [0, {b.MAX_LOGPROBS}], got {self.logprobs}", "logprobs"
            )
        if not isinstance(self.n, int) or not (1 <= self.n <= b.MAX_N):
            raise InvalidRequestError(f"n must be in [1, {b.MAX_N}], got {self.n}", "n")
        if self.use_beam_search and not (1 <= self.beam_width <= b.MAX_N):
            raise InvalidRequestError(
                f"beam_width must be in [1, {b.MAX_N}], got {self.beam_width}", "beam_width"
            )
        check_seed(self.seed)
        if len(self.logit_bias) > b.MAX_LOGIT_BIAS or not all(
            isinstance(t, int) and t >= 0 and b.LOGIT_BIAS_MIN <= bias <= b.LOGIT_BIAS_MAX
            for t, bias in self.logit_bias
        ):
            raise InvalidRequestError(
                f"logit_bias must be at most {b.MAX_LOGIT_BIAS} token ids with biases in "
                f"[{b.LOGIT_BIAS_MIN}, {b.LOGIT_BIAS_MAX}]",
                "logit_bias",
            )
        if self.logit_bias and self.use_beam_search:
            raise InvalidRequestError("logit_bias is not supported with beam search", "logit_bias")
        if self.speculative and self.use_beam_search:
            raise InvalidRequestError(
                "speculative decoding is not supported with beam search; omit speculative or set it to false",
                "speculative",
            )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass
class RequestTimes:
    """Wall-clock timestamps (time.monotonic seconds) of one request's life."""

    arrival_s: float
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    token_s: list[float] = field(default_factory=list)
    finished_s: float | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def queue_s(self) -> float | None:
        return None if self.first_scheduled_s is None else self.first_scheduled_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.arrival_s

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_s, self.token_s[1:], strict=False)]

    @property
    def tpot_s(self) -> float | None:
        if len(self.token_s) < 2:
            return None
        return (self.token_s[-1] - self.token_s[0]) / (len(self.token_s) - 1)


@dataclass
class Request:
    """One sequence inside the engine. Mutable; owned by the scheduler."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    tenant_id: str = "default"
    priority: Priority = Priority.STANDARD
    cache_scope: str = "default"
    arrival_s: float = field(default_factory=time.monotonic)
    deadline_s: float | None = None
    weight: float = 1.0  # the tenant's fair-share weight
    # TTFT and ITL targets: the tenant's overrides until the scheduler resolves them against the
    # class defaults when it queues the request (engine/latency_targets.py).
    latency: LatencyTargets = NO_TARGETS
    adapter: AdapterRef | None = None  # the LoRA adapter it runs through; None: the base model
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    num_retries: int = 0  # times requeued after a failed model forward (at most once)
    parent_id: str | None = None  # the caller's request id (choices and beams); None: the request itself
    index: int = 0  # choice index within its parent
    # Detokenizer and stop checks of a sampled sequence; None for a beam (its group appends tokens).
    checker: TokenChecker | None = field(default=None, repr=False, compare=False)
    # The grammar matcher of a constrained sequence (`weir.engine.structured.constraints`); it advances with each
    # appended token and lives here, so preemption and host swap keep its state with the tokens.
    constraint: TokenConstraint | None = field(default=None, repr=False, compare=False)
    spec: SpeculationTally = field(default_factory=SpeculationTally, repr=False, compare=False)
    times: RequestTimes = field(init=False)
    # `all_token_ids`, kept up to date incrementally: the output list it was built from and the list.
    _all_source: list[int] | None = field(default=None, init=False, repr=False, compare=False)
    _all_ids: list[int] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise InvalidRequestError("prompt must contain at least one token", "prompt")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise InvalidRequestError(f"weight must be > 0, got {self.weight}", "weight")
        self.times = RequestTimes(arrival_s=self.arrival_s)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then output tokens. Read-only: the same list is returned and extended in place
        while tokens are appended (it is read once per block hash and per n-gram draft), so a
        call costs the new tokens only. Rebuilt when `output_token_ids` was replaced or cut."""
        out, ids = self.output_token_ids, self._all_ids
        have = len(ids) - len(self.prompt_token_ids)
        if out is not self._all_source or have > len(out) or have < 0:
            self._all_source = out
            ids = self._all_ids = self.prompt_token_ids + out
        elif have < len(out):
            ids.extend(out[have:])
        return ids

    def token_at(self, position: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < n else self.output_token_ids[position - n]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def num_remaining(self) -> int:
        """Tokens still to be fed to the model before the next sample."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def awaits_mask(self) -> bool:
        """Whether the sequence's grammar mask was late for a step and is still computing: it
        sits out steps until the mask arrives (`weir.engine.runner.mask_prefetch`)."""
        return self.constraint is not None and self.constraint.late

    @property
    def caller_id(self) -> str:
        """The id of the caller's request this sequence belongs to."""
        return self.parent_id if self.parent_id is not None else self.request_id

    def append_token(self, token_id: int, now: float) -> TokenDelta:
        """Append one sampled token after its stop checks; the caller finishes the request if it ended.

        Raises (and appends nothing) if the checks fail, e.g. the detokenizer, or if the
        sequence's constraint refuses the token (`ConstraintError`). A constraint whose grammar has
        ended ends the sequence (`stop`) even when its stop token is not one the checks stop on.
        """
        if self.checker is None:
            raise RuntimeError(
                f"request {self.request_id} has no token checker: its owner appends its tokens"
            )
        if self.constraint is not None:
            self.constraint.accept(token_id)
        delta = self.checker.step(token_id)
        if self.constraint is not None and self.constraint.is_terminated and delta.finish_reason is None:
            delta = TokenDelta(delta.text, FinishReason.STOP, token_id)
        self.output_token_ids.append(token_id)
        if self.times.first_token_s is None:
            self.times.first_token_s = now
        self.times.token_s.append(now)
        return delta
