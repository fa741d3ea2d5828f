"""A zero-cost engine: answers every request at once, for measuring what the gateway adds.

`NullEngine` implements `weir.engine.client.EngineClient` without a model, a scheduler or a single
sleep. Each choice yields `num_tokens` outputs of one token each (capped by `max_tokens`), the
way the real engine streams one decode step at a time, so a streamed response has as many SSE
chunks as a real one of that length. Whatever time a client measures against it is the
gateway's own: HTTP, auth, parsing, tokenization, formatting, accounting, metrics and tracing.

Stop strings, logprobs and penalties are not simulated: the outputs do not depend on them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from weir.engine.client import EngineHealth, EngineRequest
from weir.engine.engine_stats import EngineStats
from weir.engine.output import RequestMetrics, RequestOutput
from weir.engine.request import FinishReason


class NullEngine:
    """An `EngineClient` whose every token is free: outputs are yielded without awaiting anything."""

    def __init__(
        self, *, num_tokens: int = 16, token_id: int = 0, token_text: str = " hi", block_size: int = 16
    ) -> None:
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        if token_id < 0:
            raise ValueError(f"token_id must be >= 0, got {token_id}")
        self.num_tokens = num_tokens
        self.token_id = token_id
        self.token_text = token_text
        self.block_size = block_size
        self.num_requests = 0
        self.num_aborts = 0
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self._num_running = 0

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """The request's outputs, all available at once."""
        self.num_requests += 1
        return self._run(request)

    async def abort(self, request_id: str) -> None:
        """Nothing to free; counted so a run can show whether clients disconnected."""
        self.num_aborts += 1

    def stats(self) -> EngineStats:
        """A constant, idle-looking load (one block per running request)."""
        return EngineStats(
            num_running=self._num_running,
            num_waiting=0,
            num_total_blocks=1024,
            num_free_blocks=1024 - min(self._num_running, 1024),
            block_size=self.block_size,
            num_prompt_tokens_total=self.num_prompt_tokens,
            num_generation_tokens_total=self.num_generation_tokens,
        )

    def health(self) -> EngineHealth:
        """Always alive and ready."""
        return EngineHealth(alive=True, ready=True, detail="null engine")

    async def _run(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        params = request.sampling_params
        num_tokens = min(self.num_tokens, params.max_tokens)
        # A choice that stops before max_tokens ends as if it met EOS.
        reason = FinishReason.LENGTH if num_tokens == params.max_tokens else FinishReason.STOP
        num_prompt = len(request.prompt_token_ids)
        token_ids = (self.token_id,)
        self._num_running += 1
        self.num_prompt_tokens += num_prompt
        try:
            first_s = time.monotonic()
            for step in range(1, num_tokens + 1):
                last = step == num_tokens
                metrics = None
                if last:
                    now = time.monotonic()
                    metrics = RequestMetrics(
                        arrival_s=request.arrival_s,
                        queue_s=first_s - request.arrival_s,
                        ttft_s=first_s - request.arrival_s,
                        tpot_s=(now - first_s) / (num_tokens - 1) if num_tokens > 1 else None,
                        e2e_s=now - request.arrival_s,
                    )
                for index in range(params.n):
                    self.num_generation_tokens += 1
                    yield RequestOutput(
                        request_id=request.request_id,
                        index=index,
                        new_token_ids=token_ids,
                        new_text=self.token_text,
                        finished=last,
                        finish_reason=reason if last else None,
                        num_prompt_tokens=num_prompt,
                        num_output_tokens=step,
                        metrics=metrics,
                    )
        finally:
            self._num_running -= 1
