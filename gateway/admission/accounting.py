"""What happens after a request: usage, metrics, trace phases, and the hooks tenancy plugs in.

Two seams for later issues (budgets, SLO admission):
- `Admission`: awaited before `engine.generate`; raises a `WeirError` (e.g. 429) to reject, and
  returns the `Settle` callback that receives the real usage when the request ends (or an
  `Admitted` carrying that callback and the requests to run, e.g. with queue deadlines set).
- `UsageSink`: receives every `UsageRecord` (tenancy writes usage records). It is called on the
  event loop, so it must only enqueue (batch its database writes elsewhere).
Both default to doing nothing.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from weir.engine.client import EngineRequest
from weir.engine.output import RequestMetrics, RequestOutput
from weir.gateway.api.protocol import Endpoint
from weir.gateway.api.usage import Usage
from weir.gateway.metrics.registry import GatewayMetrics
from weir.gateway.metrics.tracing import RequestSpan
from weir.tenancy.context import TenantContext

logger = logging.getLogger(__name__)


class Outcome(enum.Enum):
    """How a generation request ended, from the gateway's point of view."""

    COMPLETED = "completed"
    CLIENT_DISCONNECTED = "client_disconnected"
    FAILED = "failed"
    CANCELLED = "cancelled"  # the server cancelled it, e.g. shutdown past the grace period


@dataclass(frozen=True)
class UsageRecord:
    """One finished HTTP request, as tenancy bills it and admission settles it."""

    request_id: str
    tenant_id: str
    key_id: str
    model: str
    endpoint: Endpoint
    usage: Usage
    outcome: Outcome
    finish_reasons: tuple[str, ...]  # per choice; "abort" for choices cut short
    created_at: float  # epoch seconds when the request arrived
    duration_s: float  # arrival to settlement
    ttft_s: float | None = None  # of the first prompt; None when no token came
    user: str | None = None
    # The id (name@version) of the model version that generated every token; None: not known.
    model_version: str | None = None
    adapter: str | None = None  # the LoRA adapter it ran through; None: the base model


Settle = Callable[[UsageRecord], None]
UsageSink = Callable[[UsageRecord], None]


@dataclass(frozen=True)
class UsageJournal:
    """A stream's usage records written as it goes, so a crash of the server still bills it.

    `write` returns once the record is in the usage spool file (one `write` call on the event
    loop: a crash of the process keeps it) and must feed the same spool as the `UsageSink`. A
    stream writes a provisional record before its first byte, an updated one at most every
    `USAGE_PROGRESS_INTERVAL_S` as chunks go out, and its final one before its last byte; after
    a crash the last one written is the bill (`weir.tenancy.usage.usage_writer`).
    """

    write: UsageSink


@dataclass(frozen=True)
class Admitted:
    """An admission's answer when it adjusts the requests (e.g. sets their queue deadline).

    An admission may return a plain `Settle` instead; the requests then run as built.
    """

    settle: Settle
    requests: tuple[EngineRequest, ...]
    # Headers every answer to the request carries (OpenAI's `x-ratelimit-*`), streamed or not.
    headers: tuple[tuple[str, str], ...] = ()


Admission = Callable[[TenantContext, Sequence[EngineRequest]], Awaitable[Settle | Admitted]]


def _settle_nothing(record: UsageRecord) -> None:
    return None


async def admit_all(tenant: TenantContext, requests: Sequence[EngineRequest]) -> Settle:
    """The default admission: every request is admitted and nothing is reserved."""
    return _settle_nothing


class RequestTally:
    """Counts, per choice, what the engine requests of one HTTP request produced.

    Choice indices are global: prompt `p`, choice `i` of `n` is `p * n + i`, as OpenAI numbers them.
    """

    def __init__(self, requests: Sequence[EngineRequest], n: int) -> None:
        self.requests = tuple(requests)
        self.n = n
        num_choices = len(self.requests) * n
        self.num_output_tokens = [0] * num_choices
        self.finish_reasons: list[str | None] = [None] * num_choices
        self.num_cached_tokens = [0] * len(self.requests)
        self.num_computed_tokens = [0] * len(self.requests)  # as the engine reports it (beam search)
        # Prompt tokens the engine reported computed when the client cancelled, per prompt.
        self.num_computed_prompt_tokens = [0] * len(self.requests)
        self.num_draft_tokens = [0] * num_choices  # speculative decoding, per choice, as reported
        self.num_accepted_draft_tokens = [0] * num_choices
        self.metrics: list[RequestMetrics | None] = [None] * len(self.requests)
        self.first_output_s: list[float | None] = [None] * len(self.requests)
        self.last_output_s: list[float | None] = [None] * len(self.requests)
        self.num_unfinished = num_choices

    def observe(self, prompt_index: int, out: RequestOutput) -> int:
        """Count one output; returns its global choice index."""
        choice = prompt_index * self.n + out.index
        if out.new_token_ids:
            now = time.monotonic()
            if self.first_output_s[prompt_index] is None:
                self.first_output_s[prompt_index] = now
            self.last_output_s[prompt_index] = now
        # The engine counts a choice's tokens where it produces them; every output carries the count.
        self.num_output_tokens[choice] = out.num_output_tokens
        self.num_draft_tokens[choice] = max(self.num_draft_tokens[choice], out.num_draft_tokens)
        self.num_accepted_draft_tokens[choice] = max(
            self.num_accepted_draft_tokens[choice], out.num_accepted_draft_tokens
        )
        if out.num_cached_tokens:
            self.num_cached_tokens[prompt_index] = out.num_cached_tokens
        if out.finished and self.finish_reasons[choice] is None:
            computed = max(self.num_computed_tokens[prompt_index], out.num_computed_output_tokens)
            self.num_computed_tokens[prompt_index] = computed
            self.finish_reasons[choice] = out.finish_reason.value if out.finish_reason else "stop"
            self.num_unfinished -= 1
            if out.index == 0 and out.metrics is not None:
                self.metrics[prompt_index] = out.metrics
        return choice

    def note_computed_prompt(self, prompt_index: int, num_tokens: int) -> None:
        """The engine computed `num_tokens` of this prompt before the client cancelled it (its
        abort's report). Not noted for failures or queue deadlines: the server's, not billed."""
        self.num_computed_prompt_tokens[prompt_index] = max(
            self.num_computed_prompt_tokens[prompt_index], num_tokens
        )

    def _computed_prompt(self, prompt_index: int) -> int:
        """A prompt's billed tokens: all of it once any of its choices produced, else the report."""
        num_prompt = len(self.requests[prompt_index].prompt_token_ids)
        n = self.n
        produced = any(self.num_output_tokens[prompt_index * n : (prompt_index + 1) * n])
        if produced or self.num_computed_tokens[prompt_index]:
            return num_prompt
        return min(self.num_computed_prompt_tokens[prompt_index], num_prompt)

    def prompt_finished(self, prompt_index: int) -> bool:
        """Whether every choice of one engine request has finished."""
        start = prompt_index * self.n
        return all(r is not None for r in self.finish_reasons[start : start + self.n])

    def latencies(self, prompt_index: int) -> RequestMetrics:
        """One engine request's latencies: the engine's, else what the gateway saw (aborts)."""
        m = self.metrics[prompt_index]
        if m is not None:
            return m
        arrival_s = self.requests[prompt_index].arrival_s
        first, last = self.first_output_s[prompt_index], self.last_output_s[prompt_index]
        return RequestMetrics(
            arrival_s=arrival_s,
            queue_s=None,
            ttft_s=None if first is None else first - arrival_s,
            tpot_s=None,
            e2e_s=None if last is None or not self.prompt_finished(prompt_index) else last - arrival_s,
        )

    def usage(self) -> Usage:
        computed = None
        if any(self.num_computed_tokens):
            n = self.n
            per_prompt = (sum(self.num_output_tokens[p * n : (p + 1) * n]) for p in range(len(self.requests)))
            computed = sum(max(c, r) for c, r in zip(self.num_computed_tokens, per_prompt, strict=True))
        usage = Usage(
            prompt_tokens=sum(len(r.prompt_token_ids) for r in self.requests),
            completion_tokens=sum(self.num_output_tokens),
            cached_tokens=sum(self.num_cached_tokens),
            computed_completion_tokens=computed,
            draft_tokens=sum(self.num_draft_tokens),
            accepted_draft_tokens=sum(self.num_accepted_draft_tokens),
        )
        computed_prompt = sum(self._computed_prompt(p) for p in range(len(self.requests)))
        if computed_prompt == usage.billed_prompt_tokens:  # what the usage says without it
            return usage
        return replace(usage, computed_prompt_tokens=computed_prompt)


@dataclass(frozen=True)
class RequestInfo:
    """Who asked for what: fixed when the request is admitted."""

    request_id: str
    endpoint: Endpoint
    model: str
    tenant: TenantContext
    user: str | None
    created_at: float  # epoch seconds
    arrival_s: float  # monotonic
    model_version: str | None = None  # the id (name@version) of the version routed to
    adapter: str | None = None  # the LoRA adapter `model` named; None: the base model


class Accountant:
    """Settles a finished request: metrics, trace phases, usage record, admission settle."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        usage_sink: UsageSink | None = None,
        journal: UsageJournal | None = None,
    ) -> None:
        self.metrics = metrics
        self.usage_sink = usage_sink
        self.journal = journal

    def begin(self, info: RequestInfo, tally: RequestTally) -> None:
        """Before a stream's first byte: its provisional record (what it is about to deliver, as
        cancelled) in the spool file. Billing trouble is logged, never fails the request."""
        self.conclude(info, tally, Outcome.CANCELLED)

    def progress(self, info: RequestInfo, tally: RequestTally) -> None:
        """A stream's provisional record, updated to what it has delivered so far, in the spool file."""
        self.conclude(info, tally, Outcome.CANCELLED)

    def conclude(self, info: RequestInfo, tally: RequestTally, outcome: Outcome) -> UsageRecord | None:
        """A stream's record as it stands, with `outcome`, in the spool file now; before its last
        byte this is its final record (`finish` then writes no second one). Returns the record
        written, None when there is no journal or the write failed (logged: billing trouble
        never fails the request; `finish` then queues the record as for any request)."""
        if self.journal is None:
            return None
        record = self._record(info, tally, outcome)
        try:
            self.journal.write(record)
        except Exception:
            logger.exception("could not write the %s usage record of %s", outcome.value, info.request_id)
            return None
        return record

    def _record(self, info: RequestInfo, tally: RequestTally, outcome: Outcome) -> UsageRecord:
        return UsageRecord(
            request_id=info.request_id,
            tenant_id=info.tenant.tenant_id,
            key_id=info.tenant.key_id,
            model=info.model,
            endpoint=info.endpoint,
            usage=tally.usage(),
            outcome=outcome,
            finish_reasons=tuple(r if r is not None else "abort" for r in tally.finish_reasons),
            created_at=info.created_at,
            duration_s=time.monotonic() - info.arrival_s,
            ttft_s=tally.latencies(0).ttft_s if tally.requests else None,
            user=info.user,
            model_version=info.model_version,
            adapter=info.adapter,
        )

    def finish(
        self,
        info: RequestInfo,
        tally: RequestTally,
        outcome: Outcome,
        span: RequestSpan,
        settle: Settle,
        error_message: str | None = None,
        journaled: UsageRecord | None = None,
    ) -> UsageRecord:
        """Record everything about one ended request. Never raises.

        `journaled`: the record `conclude` wrote before the stream's last byte. When it still
        holds (the same outcome and counts) it is the request's record and is not written again.
        """
        record = self._record(info, tally, outcome)
        sink = self.usage_sink
        if (
            journaled is not None
            and journaled.outcome is outcome
            and journaled.usage == record.usage
            and journaled.finish_reasons == record.finish_reasons
        ):
            record, sink = journaled, None  # already in the spool
        usage, reasons = record.usage, record.finish_reasons
        try:
            self._observe(info, tally, usage, reasons, span)
            span.set_attributes({"weir.outcome": outcome.value})
        except Exception:
            logger.exception("recording metrics of %s failed", info.request_id)
        span.end(error_message)
        for callback in (settle, sink):
            if callback is None:
                continue
            try:
                callback(record)
            except Exception:
                # Billing trouble must not fail a request that was already served.
                logger.exception("usage callback failed for %s", info.request_id)
        return record

    def _observe(
        self,
        info: RequestInfo,
        tally: RequestTally,
        usage: Usage,
        reasons: tuple[str, ...],
        span: RequestSpan,
    ) -> None:
        model, tenant = info.model, info.tenant.tenant_id
        self.metrics.count_tokens(
            model,
            tenant,
            prompt=usage.prompt_tokens,
            cached=usage.cached_tokens,
            generated=usage.completion_tokens,
        )
        for reason in reasons:
            self.metrics.count_finished(model, tenant, reason)
        for i in range(len(tally.requests)):
            m = tally.latencies(i)
            self.metrics.observe_latency(
                model,
                tenant,
                ttft_s=m.ttft_s,
                tpot_s=m.tpot_s,
                e2e_s=m.e2e_s,
                queue_s=m.queue_s,
                itl_s=m.itl_s,
            )
            if i == 0:
                span.record_phases(m.arrival_s, m.queue_s, m.ttft_s, m.e2e_s)
        span.set_attributes(
            {
                "gen_ai.usage.input_tokens": usage.prompt_tokens,
                "gen_ai.usage.output_tokens": usage.completion_tokens,
                "weir.cached_tokens": usage.cached_tokens,
                "gen_ai.response.finish_reasons": reasons,
            }
        )
