"""Beam search requests inside the engine: live beams run as sequences sharing KV blocks.

A beam search request starts as one sequence (the prompt). Each step every live beam feeds its
last token and reports its best next tokens with their log-probabilities; once every live beam
of a group has reported, `weir.engine.sampling.beam_search.BeamSearch` picks the next beams. A parent with
several continuations is forked (the children reference its blocks, and the partial last block
is copied when a child first writes into it); a parent without any is finished and its blocks
are freed. The finished hypotheses are emitted once, at the end, best first (choice index 0).

Choices: beam search returns the `n` best of `beam_width` beams; stop strings, penalties and
logprobs are refused for it; `stop_token_ids` end a beam like the model's end tokens.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from weir.engine.client import EngineRequest
from weir.engine.errors import InvalidRequestError
from weir.engine.output import RequestMetrics, RequestOutput, TokenLogprob
from weir.engine.request import FinishReason, Request, RequestStatus
from weir.engine.sampling.beam_search import BeamSearch, EarlyStopping
from weir.engine.scheduling.scheduler import Scheduler

logger = logging.getLogger("weir.engine")

# The sampler reports at most this many alternatives per token.
MAX_CANDIDATES = 20


@dataclass
class _Group:
    """One beam search request."""

    request: EngineRequest
    search: BeamSearch
    first: Request  # the sequence that computed the prompt: its times and cache hits are the group's
    beams: list[Request]  # live beam sequences, aligned with `search.live`
    results: dict[str, tuple[int, tuple[tuple[int, float], ...]]] = field(default_factory=dict)
    ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    num_computed_tokens: int = 0  # tokens sampled over all beams (one per live beam per step)


class BeamGroups:
    """All beam search requests of one engine."""

    def __init__(
        self,
        scheduler: Scheduler,
        tokenizer: Any,
        eos_token_ids: Sequence[int],
        clock: Callable[[], float],
        early_stopping: EarlyStopping = EarlyStopping.HEURISTIC,
    ) -> None:
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        self.clock = clock
        self.early_stopping = early_stopping
        self._groups: dict[str, _Group] = {}
        self._group_of: dict[str, str] = {}  # beam sequence id -> group (request) id

    def _end_tokens(self, er: EngineRequest) -> tuple[int, ...]:
        sp = er.sampling_params
        eos = () if sp.ignore_eos else self.eos_token_ids
        return tuple(dict.fromkeys((*eos, *sp.stop_token_ids)))

    def validate(self, er: EngineRequest) -> None:
        """Refuse what beam search does not support."""
        sp = er.sampling_params
        if not math.isfinite(sp.length_penalty):
            raise InvalidRequestError(
                f"length_penalty must be finite, got {sp.length_penalty}", "length_penalty"
            )
        if sp.n > sp.beam_width:
            raise InvalidRequestError(f"n ({sp.n}) must not exceed beam_width ({sp.beam_width})", "n")
        if sp.stop:
            raise InvalidRequestError("stop strings are not supported with beam search", "stop")
        if sp.logprobs is not None:
            raise InvalidRequestError("logprobs are not supported with beam search", "logprobs")
        if sp.repetition_penalty != 1.0 or sp.presence_penalty != 0.0 or sp.frequency_penalty != 0.0:
            raise InvalidRequestError("penalties are not supported with beam search", "repetition_penalty")
        needed = sp.beam_width + len(self._end_tokens(er))
        if needed > MAX_CANDIDATES:
            raise InvalidRequestError(
                f"beam_width plus end tokens must be at most {MAX_CANDIDATES}, got {needed}", "beam_width"
            )

    def add(self, er: EngineRequest) -> None:
        """Queue a validated beam search request as its first sequence."""
        sp = er.sampling_params
        end_tokens = self._end_tokens(er)
        search = BeamSearch(sp.beam_width, sp.max_tokens, end_tokens, sp.length_penalty, self.early_stopping)
        # Each sequence is a greedy row whose alternatives are the beam's candidates; the stop
        # checker never sees it, the search decides when it ends.
        beam_params = replace(
            sp,
            n=1,
            temperature=0.0,
            top_p=1.0,
            top_k=-1,
            min_p=0.0,
            seed=None,
            stop_token_ids=(),
            logprobs=search.num_candidates_per_beam,
            use_beam_search=False,
            beam_width=1,
        )
        first = er.to_request(f"{er.request_id}#b0", beam_params)
        self.scheduler.add_request(first)
        self._groups[er.request_id] = _Group(er, search, first, [first])
        self._group_of[first.request_id] = er.request_id

    def owns(self, sequence_id: str) -> bool:
        """Whether a scheduler request is a beam of some group."""
        return sequence_id in self._group_of

    def is_active(self, request_id: str) -> bool:
        return request_id in self._groups

    # -- stepping -------------------------------------------------------------------------------

    def on_result(self, sequence_id: str, logprob: TokenLogprob | None) -> None:
        """Record a beam's candidates for this step."""
        group = self._groups[self._group_of[sequence_id]]
        req = self.scheduler.requests[sequence_id]
        top = logprob.top if logprob is not None else ()
        group.results[sequence_id] = (req.num_tokens, top)
        if group.first.times.first_token_s is None:
            group.first.times.first_token_s = self.clock()

    def advance(self) -> list[RequestOutput]:
        """Advance every group whose live beams have all reported; outputs of groups that ended.

        A group whose bookkeeping raises fails alone (FinishReason.ERROR); the others advance.
        """
        outputs: list[RequestOutput] = []
        for group_id in [g for g, grp in self._groups.items() if grp.results]:
            group = self._groups[group_id]
            try:
                ready = all(group.results.get(b.request_id, (-1, ()))[0] == b.num_tokens for b in group.beams)
                if ready:
                    outputs.extend(self._advance(group))
            except Exception as exc:
                logger.exception("beam search request %s failed", group_id)
                outputs.extend(self.fail(group_id, f"{type(exc).__name__}: {exc}"))
        return outputs

    def _advance(self, group: _Group) -> list[RequestOutput]:
        tops = [group.results[b.request_id][1] for b in group.beams]
        group.results.clear()
        group.num_computed_tokens += len(tops)
        choices = group.search.step(tops)
        if group.search.done:
            return self._end(group, None)
        sched = self.scheduler
        taken: set[int] = set()
        new_beams: list[Request] = []
        appends: list[tuple[Request, int]] = []
        # Forks first: a child references its parent's blocks before any parent is let go.
        for choice in choices:
            parent = group.beams[choice.parent]
            if choice.parent not in taken:
                taken.add(choice.parent)
                new_beams.append(parent)
                appends.append((parent, choice.token_id))
                continue
            child = Request(
                request_id=f"{group.request.request_id}#b{next(group.ids)}",
                prompt_token_ids=parent.prompt_token_ids,
                sampling_params=parent.sampling_params,
                tenant_id=parent.tenant_id,
                priority=parent.priority,
                cache_scope=parent.cache_scope,
                arrival_s=parent.arrival_s,
                weight=parent.weight,
                latency=parent.latency,
                adapter=parent.adapter,
                parent_id=parent.parent_id,
            )
            child.output_token_ids = parent.output_token_ids + [choice.token_id]
            child.num_cached_tokens = parent.num_cached_tokens
            self._group_of[child.request_id] = group.request.request_id
            if parent.status is RequestStatus.RUNNING and parent.num_computed_tokens == parent.num_tokens:
                child.num_computed_tokens = parent.num_computed_tokens
                sched.fork_request(parent, child)
            else:  # the parent was preempted meanwhile: the child recomputes (likely from the cache)
                sched.add_request(child)
            new_beams.append(child)
        for i, beam in enumerate(group.beams):
            if i not in taken:
                self._drop(beam, RequestStatus.FINISHED_STOPPED)
        for beam, token_id in appends:
            beam.output_token_ids.append(token_id)
        group.beams = new_beams
        return []

    def _drop(self, beam: Request, status: RequestStatus) -> None:
        self.scheduler.finish_request(beam.request_id, status)
        self._group_of.pop(beam.request_id, None)

    # -- ending ---------------------------------------------------------------------------------

    def abort(self, request_id: str, reason: FinishReason, error: str | None = None) -> list[RequestOutput]:
        """End a group early (abort, deadline, failure): every choice reports `reason`."""
        group = self._groups.get(request_id)
        if group is None:
            return []
        return self._end(group, (reason, error))

    def fail(self, request_id: str, error: str) -> list[RequestOutput]:
        """End a group with FinishReason.ERROR, dropping every sequence of it, even half-made ones."""
        group = self._groups.get(request_id)
        if group is None:
            return []
        live = {b.request_id for b in group.beams}
        for sequence_id in [s for s, g in self._group_of.items() if g == request_id and s not in live]:
            self.scheduler.finish_request(sequence_id, RequestStatus.FINISHED_ERROR)
            del self._group_of[sequence_id]
        return self._end(group, (FinishReason.ERROR, error))

    def group_of(self, sequence_id: str) -> str | None:
        return self._group_of.get(sequence_id)

    def _end(self, group: _Group, early: tuple[FinishReason, str | None] | None) -> list[RequestOutput]:
        status = RequestStatus.FINISHED_STOPPED
        if early is not None:
            status = (
                RequestStatus.FINISHED_ABORTED
                if early[0] is FinishReason.ABORT
                else RequestStatus.FINISHED_ERROR
            )
        for beam in group.beams:
            self._drop(beam, status)
        group.beams = []
        er = group.request
        now = self.clock()
        times = group.first.times
        times.finished_s = now
        if early is None and times.first_token_s is not None:
            times.token_s.append(now)
        metrics = RequestMetrics(
            arrival_s=times.arrival_s,
            queue_s=times.queue_s,
            ttft_s=None if early is not None else now - times.arrival_s,
            tpot_s=None,
            e2e_s=times.e2e_s,
        )
        sp = er.sampling_params
        num_prompt = len(er.prompt_token_ids)
        # Once a beam sampled, the prompt was computed; before, the first sequence holds the progress.
        computed_prompt = (
            num_prompt if group.num_computed_tokens else min(group.first.num_computed_tokens, num_prompt)
        )

        def output(
            index: int,
            token_ids: tuple[int, ...],
            reason: FinishReason,
            stop_reason: int | None = None,
            error: str | None = None,
        ) -> RequestOutput:
            text = ""
            if token_ids:
                text = self.tokenizer.decode(list(token_ids), skip_special_tokens=sp.skip_special_tokens)
            return RequestOutput(
                request_id=er.request_id,
                index=index,
                new_token_ids=token_ids,
                new_text=text,
                finished=True,
                finish_reason=reason,
                stop_reason=stop_reason,
                num_prompt_tokens=num_prompt,
                num_cached_tokens=group.first.num_cached_tokens,
                num_output_tokens=len(token_ids),
                num_computed_output_tokens=group.num_computed_tokens,
                num_computed_prompt_tokens=computed_prompt,
                metrics=metrics,
                error=error,
            )

        if early is not None:
            del self._groups[er.request_id]
            return [output(i, (), early[0], error=early[1]) for i in range(sp.n)]
        outputs = []
        end_tokens = group.search.end_token_ids
        for i, hyp in enumerate(group.search.best(sp.n)):
            last = hyp.token_ids[-1]
            ended = hyp.ended and last in end_tokens
            stop_reason = last if ended and last in sp.stop_token_ids else None
            outputs.append(
                output(i, hyp.token_ids, FinishReason.STOP if ended else FinishReason.LENGTH, stop_reason)
            )
        del self._groups[er.request_id]  # last: a group whose outputs failed can still be failed
        return outputs
