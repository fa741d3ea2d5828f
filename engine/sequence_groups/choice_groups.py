"""Sampled requests inside the engine: a caller's request and its `n` choices (sequences).

The choices share the request's prompt: the first computes it, the others fork from it
(copy-on-write) and compute only the last prompt token for their own sample. Each choice has
its own `OutputProcessor` (detokenization and stop checks, `Request.checker`) and its own seed
(`child_seed`), and finishes on its own; the request is done when all its choices are. Beam search
requests live in `weir.engine.sequence_groups.beam_group` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from weir.engine.client import EngineRequest
from weir.engine.output import RequestMetrics, RequestOutput, TokenLogprob
from weir.engine.request import FinishReason, Request, RequestStatus, child_seed
from weir.engine.runner.runner import ModelRunner
from weir.engine.scheduling.scheduler import Scheduler
from weir.engine.scheduling.step_records import AppendedToken
from weir.engine.text.output_processor import OutputProcessor


@dataclass
class _Group:
    """A caller's request and its `n` choices."""

    request: EngineRequest
    child_ids: list[str]
    num_unfinished: int


class ChoiceGroups:
    """All sampled (non-beam) requests of one engine."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        tokenizer: Any,
        eos_token_ids: Sequence[int],
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.tokenizer = tokenizer  # the engine thread's own copy
        self.eos_token_ids = tuple(eos_token_ids)
        self._groups: dict[str, _Group] = {}

    def is_active(self, request_id: str) -> bool:
        """Whether any choice of the request is still queued or running."""
        return request_id in self._groups

    def add(self, er: EngineRequest) -> None:
        """Queue a validated request as its `n` choices; nothing stays behind if this raises."""
        children: list[Request] = []
        child_ids: list[str] = []
        try:
            self._add_choices(er, children, child_ids)
            self.scheduler.add_fork_group(children[0], children[1:])
        except Exception:
            self.runner.forget(tuple(child_ids))
            raise
        self._groups[er.request_id] = _Group(er, child_ids, len(child_ids))

    def _add_choices(self, er: EngineRequest, children: list[Request], child_ids: list[str]) -> None:
        sp = er.sampling_params
        for i in range(sp.n):
            child_sp = sp if sp.n == 1 else replace(sp, n=1, seed=child_seed(sp.seed, i))
            cid = er.request_id if sp.n == 1 else f"{er.request_id}#{i}"
            child_ids.append(cid)
            # The generator is built now: a seed it refuses fails this request here, alone.
            self.runner.add_request(cid, child_sp.seed)
            req = er.to_request(
                cid,
                child_sp,
                index=i,
                checker=OutputProcessor(self.tokenizer, er.prompt_token_ids, child_sp, self.eos_token_ids),
            )
            children.append(req)

    def output(self, appended: AppendedToken, logprob: TokenLogprob | None) -> RequestOutput:
        """The output of a token the scheduler appended to a choice (its last if it ended the choice)."""
        req, delta = appended.request, appended.delta
        logprobs = (logprob,) if logprob is not None else None
        token_ids = (appended.token_id,)
        if delta.finish_reason is not None:
            return self.finish(req, delta.finish_reason, delta.text, delta.stop_reason, token_ids, logprobs)
        return self._output(req, token_ids, delta.text, logprobs)

    def abort(self, request_id: str) -> list[RequestOutput]:
        """Abort every choice of a request; their blocks are freed now."""
        group = self._groups.get(request_id)
        if group is None:
            return []
        outs = []
        for cid in group.child_ids:
            req = self.scheduler.finish_request(cid, RequestStatus.FINISHED_ABORTED)
            if req is not None:
                outs.append(self.finish(req, FinishReason.ABORT, "", None))
        return outs

    def fail(self, sequence_id: str, error: str) -> list[RequestOutput]:
        """Fail one choice with FinishReason.ERROR; the request's other choices go on."""
        req = self.scheduler.finish_request(sequence_id, RequestStatus.FINISHED_ERROR)
        if req is None or req.caller_id not in self._groups:
            return []
        return [self.finish(req, FinishReason.ERROR, "", None, error=error)]

    def _output(
        self, req: Request, token_ids: tuple[int, ...], text: str, logprobs: tuple | None = None
    ) -> RequestOutput:
        return RequestOutput(
            request_id=req.caller_id,
            index=req.index,
            new_token_ids=token_ids,
            new_text=text,
            finished=False,
            new_logprobs=logprobs,
            num_prompt_tokens=req.num_prompt_tokens,
            num_cached_tokens=req.num_cached_tokens,
            num_output_tokens=req.num_output_tokens,
            num_draft_tokens=req.spec.num_drafted,
            num_accepted_draft_tokens=req.spec.num_accepted,
        )

    def finish(
        self,
        req: Request,
        reason: FinishReason,
        text: str,
        stop_reason: str | int | None,
        token_ids: tuple[int, ...] = (),
        logprobs: tuple | None = None,
        error: str | None = None,
    ) -> RequestOutput:
        """The last output of a choice the scheduler has already finished."""
        partial = self._output(req, token_ids, text, logprobs)
        times = req.times
        group = self._groups[req.caller_id]
        group.num_unfinished -= 1
        if group.num_unfinished == 0:
            del self._groups[req.caller_id]
        metrics = RequestMetrics(
            arrival_s=times.arrival_s,
            queue_s=times.queue_s,
            ttft_s=times.ttft_s,
            tpot_s=times.tpot_s,
            e2e_s=times.e2e_s,
            itl_s=tuple(times.itl_s),
        )
        return replace(
            partial,
            finished=True,
            finish_reason=reason,
            stop_reason=stop_reason,
            metrics=metrics,
            error=error,
            num_computed_prompt_tokens=min(req.num_computed_tokens, req.num_prompt_tokens),
        )
