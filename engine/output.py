"""What the scheduler hands the runner, and what the engine streams to its callers."""

from __future__ import annotations

from dataclasses import dataclass

from weir.engine.kv.kv_swap import NO_TRANSFERS, KVTransfers
from weir.engine.request import FinishReason


@dataclass(frozen=True)
class ScheduledRequest:
    """One request in a step: feed `num_tokens` tokens starting at `num_computed_tokens`."""

    request_id: str
    num_tokens: int
    num_computed_tokens: int  # position of the first token fed this step
    block_ids: tuple[int, ...]  # the request's block table after allocation for this step
    samples: bool  # True when this chunk reaches the end of the known tokens: sample a token
    # Speculative decoding: blocks are allocated for this many draft tokens after the chunk; the
    # drafter fills up to that many, the runner verifies them (weir.engine.spec_decode).
    num_spec_slots: int = 0


@dataclass(frozen=True)
class SchedulerOutput:
    """One engine step, decided by the scheduler and executed by the runner.

    Decodes come first in `scheduled`, then prefill chunks.
    """

    scheduled: tuple[ScheduledRequest, ...]
    preempted_ids: tuple[str, ...] = ()
    finished_ids: tuple[str, ...] = ()  # finished/aborted since the last step; blocks already freed
    blocks_to_copy: tuple[tuple[int, int], ...] = ()  # (src, dst) copy-on-write
    swaps: KVTransfers = NO_TRANSFERS  # device <-> host copies: swap-out before, swap-in after the COW

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def num_decodes(self) -> int:
        """Rows feeding a single token (decodes; the step budget costs them apart from prefill)."""
        return sum(1 for s in self.scheduled if s.num_tokens == 1)

    @property
    def num_decode_context_tokens(self) -> int:
        """Context tokens the decode rows attend over, in all (the step cost grows with it)."""
        return sum(s.num_computed_tokens for s in self.scheduled if s.num_tokens == 1)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.blocks_to_copy and self.swaps.is_empty


@dataclass(frozen=True)
class TokenLogprob:
    """Log probability of one token, with the top alternatives at that position."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), best first


@dataclass(frozen=True)
class RequestMetrics:
    """Latency figures of a finished (or running) request, in seconds."""

    arrival_s: float
    queue_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    itl_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class RequestOutput:
    """An increment of one choice of one request, streamed to the caller.

    `new_text` is the bytes-correct text added since the previous output of the same choice
    (stop strings already cut away).
    """

    request_id: str
    index: int
    new_token_ids: tuple[int, ...]
    new_text: str
    finished: bool
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    new_logprobs: tuple[TokenLogprob, ...] | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0  # tokens generated for this choice so far: the count usage bills
    # Tokens sampled for the request over all its sequences, on finished outputs, where that is
    # more than the choices return (beam search: every beam's tokens); 0 when not reported.
    num_computed_output_tokens: int = 0
    # Prompt tokens whose KV this choice had (computed, or found in the prefix cache) when it
    # finished: the whole prompt once it produced a token, less when it was aborted or failed
    # during its prefill (billed all the same: the work was done). 0 when not reported.
    num_computed_prompt_tokens: int = 0
    metrics: RequestMetrics | None = None
    error: str | None = None
    # Speculative decoding of this choice so far: draft tokens verified, and of them accepted.
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
