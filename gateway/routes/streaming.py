"""Running an admitted request against the engine and answering it, streamed (SSE) or whole.

`GenerationResponse` is an ASGI response that listens for the client's `http.disconnect` the
whole time, from before the first token to the last chunk. A disconnect cancels the work at
once and the engine requests are aborted (their KV blocks freed), whatever the engine was doing.
Errors before the first output get a proper HTTP status; errors after a stream started are sent
as an OpenAI error event, which the official clients raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass

from starlette.types import Receive, Scope, Send

from weir.engine.client import EngineClient, EngineRequest
from weir.engine.errors import DEADLINE_EXCEEDED, ENGINE_RETRYABLE, RequestFailedError, RetryableEngineError
from weir.engine.output import RequestOutput
from weir.engine.request import FinishReason
from weir.gateway.admission.accounting import (
    Accountant,
    Outcome,
    RequestInfo,
    RequestTally,
    Settle,
    UsageRecord,
)
from weir.gateway.api.responses import ChoiceState, ResponseFormatter, encode_json
from weir.gateway.http.errors import ServiceUnavailableError, WeirError, from_engine_error
from weir.gateway.metrics.tracing import RequestSpan
from weir.gateway.routes.gateway_state import GatewayState

logger = logging.getLogger(__name__)

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # proxies (nginx) must not buffer the stream
]
_JSON_HEADERS = [(b"content-type", b"application/json")]
_END = object()
_CUT_STREAM_SEND_S = 1.0
# A stream's provisional usage record is rewritten into the spool file with the first chunk sent
# this long after the last write: a crash of the process leaves at most what the stream delivered
# in this last interval unbilled (docs/operations.md). Each write is ~40 us of event-loop CPU.
USAGE_PROGRESS_INTERVAL_S = 0.25
# How long a cleanup waits for the engine's abort report (one engine step, normally).
_ABORT_REPORT_S = 10.0


async def _pump(queue: asyncio.Queue[object], index: int, iterator: AsyncIterator[RequestOutput]) -> None:
    try:
        async for out in iterator:
            queue.put_nowait((index, out))
        queue.put_nowait(_END)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        queue.put_nowait(exc)


async def _shielded(work: Coroutine[object, object, None]) -> None:
    """Run `work` to its end in a task of its own, even if the caller is cancelled meanwhile
    (again and again); then pass the caller's cancellation on."""
    task = asyncio.get_running_loop().create_task(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    task.result()  # its own exception, if any
    if cancelled:
        raise asyncio.CancelledError


class OutputMerger:
    """One stream of `(prompt index, output)` over the engine streams of every prompt.

    One prompt (the usual case) is read directly; several are pumped by tasks into a queue.
    """

    def __init__(self, engine: EngineClient, requests: Sequence[EngineRequest]) -> None:
        self._iterators: list[AsyncIterator[RequestOutput]] = [engine.generate(r) for r in requests]
        self._tasks: list[asyncio.Task[None]] = []
        self._queue: asyncio.Queue[object] | None = None
        self._num_open = len(self._iterators)
        if len(self._iterators) > 1:
            self._queue = asyncio.Queue()
            queue = self._queue
            self._tasks = [asyncio.create_task(_pump(queue, i, it)) for i, it in enumerate(self._iterators)]

    def __aiter__(self) -> OutputMerger:
        return self

    async def __anext__(self) -> tuple[int, RequestOutput]:
        if self._queue is None:
            return 0, await self._iterators[0].__anext__()
        while self._num_open:
            item = await self._queue.get()
            if item is _END:
                self._num_open -= 1
                continue
            if isinstance(item, Exception):
                raise item
            return item  # type: ignore[return-value]  # the pumps only queue (index, output) pairs
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Stop the pumps and close the engine streams."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        for iterator in self._iterators:
            close = getattr(iterator, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()


@dataclass
class GenerationJob:
    """Everything one admitted request needs to run and be accounted for."""

    engine: EngineClient
    requests: tuple[EngineRequest, ...]
    n: int
    stream: bool
    formatter: ResponseFormatter
    info: RequestInfo
    span: RequestSpan
    settle: Settle
    accountant: Accountant
    state: GatewayState
    headers: tuple[tuple[str, str], ...] = ()  # on every answer (e.g. the model version that served it)

    def raw_headers(self, base: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        return base + [(k.lower().encode(), v.encode()) for k, v in self.headers]


class GenerationResponse:
    """The ASGI response of a generation request (see the module docstring)."""

    def __init__(self, job: GenerationJob) -> None:
        self.job = job
        self.tally = RequestTally(job.requests, job.n)
        self._outputs: OutputMerger | None = None
        self._disconnected = False
        self._outcome: Outcome | None = None
        self._error: str | None = None
        self._streaming = False  # SSE headers sent
        self._complete = False  # last body message sent
        self._journaled: UsageRecord | None = None  # the final record, written before the last byte

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Plain asyncio, not an anyio task group: the server's loop is asyncio (pinned), and a task
        # group with its cancel scopes cost ~10% of a streamed request's event-loop CPU.
        self.job.state.request_started()
        task = asyncio.current_task()
        assert task is not None  # an ASGI app runs in a task
        watcher = asyncio.get_running_loop().create_task(self._watch_disconnect(receive, task))
        try:
            try:
                if self.job.stream:
                    await self._stream(send)
                else:
                    await self._respond(send)
            except asyncio.CancelledError:
                # The watcher's cancel ends the work quietly; anyone else's goes on up.
                if not (self._disconnected and task.uncancel() == 0):
                    raise
            finally:
                watcher.cancel()
        finally:
            try:
                # Shielded: the abort and the usage record must happen even if this task is
                # cancelled (again) meanwhile.
                await _shielded(self._finish(send))
            finally:
                self.job.state.request_finished()

    async def _finish(self, send: Send) -> None:
        if self._streaming and not self._complete and not self._disconnected:
            await self._end_cut_stream(send)
        await self._cleanup()

    async def _end_cut_stream(self, send: Send) -> None:
        # The server cancelled a running stream (shutdown past the grace period): end it with an
        # error event, so clients see why instead of a truncated body.
        error = ServiceUnavailableError(
            "the server shut down before this request finished", code="shutting_down"
        )
        self._error = error.message
        # Bounded: a client that stopped reading must not hold the shutdown up.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(_CUT_STREAM_SEND_S):
                formatter = self.job.formatter
                body = formatter.error_event(error) + formatter.stream_end
                await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _watch_disconnect(self, receive: Receive, work: asyncio.Task[None]) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self._disconnected = True  # set only here: it marks the watcher's cancel too
                work.cancel()
                return

    def _check(self, out: RequestOutput) -> None:
        if out.finished and out.finish_reason is FinishReason.ERROR:
            if out.error == ENGINE_RETRYABLE:  # an engine fault, not this request's: 503, retry
                raise RetryableEngineError("the engine failed while running this request; retry it")
            raise RequestFailedError(out.error or "generation failed")
        if out.finished and out.error == DEADLINE_EXCEEDED:
            # Aborted in the queue: the server could not start it in time (503, not a short 200).
            raise ServiceUnavailableError(
                "the request waited in the queue past its deadline; the server is overloaded",
                code="deadline_exceeded",
            )

    async def _send_error(self, send: Send, error: WeirError) -> None:
        self._outcome, self._error = Outcome.FAILED, error.message
        self.job.accountant.metrics.count_error(error.status_code)
        headers = self.job.raw_headers(_JSON_HEADERS) + [
            (k.lower().encode(), v.encode()) for k, v in error.headers.items()
        ]
        await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": encode_json(self.job.formatter.error_body(error))})

    async def _respond(self, send: Send) -> None:
        job = self.job
        choices = [ChoiceState() for _ in range(len(job.requests) * job.n)]
        try:
            self._outputs = OutputMerger(job.engine, job.requests)
            async for prompt_index, out in self._outputs:
                choice = self.tally.observe(prompt_index, out)
                self._check(out)
                state = choices[choice]
                if out.new_text:
                    state.text_parts.append(out.new_text)
                if out.new_logprobs:
                    state.logprobs.extend(out.new_logprobs)
                if out.finished:
                    state.finish_reason = out.finish_reason.value if out.finish_reason else "stop"
                    state.stop_reason = out.stop_reason
        except Exception as exc:
            await self._send_error(send, self._log_error(exc))
            return
        usage = self.tally.usage()
        await job.formatter.seal(choices, usage)
        body = encode_json(job.formatter.response(choices, usage))
        await send({"type": "http.response.start", "status": 200, "headers": job.raw_headers(_JSON_HEADERS)})
        await send({"type": "http.response.body", "body": body})
        self._outcome = Outcome.COMPLETED

    async def _stream(self, send: Send) -> None:
        job, formatter = self.job, self.job.formatter
        try:
            self._outputs = outputs = OutputMerger(job.engine, job.requests)
            # Wait for the first output before the headers, so early failures get a real status.
            first: tuple[int, RequestOutput] | None = await outputs.__anext__()
            if first is not None:
                first_choice = self.tally.observe(*first)
                self._check(first[1])
        except StopAsyncIteration:
            first = None
        except Exception as exc:
            await self._send_error(send, self._log_error(exc))
            return
        # Billed even if the server dies mid-stream: a provisional record in the spool file before
        # the first byte, updated as the stream goes (the final record replaces it).
        job.accountant.begin(job.info, self.tally)
        progress_at = time.monotonic()
        await send({"type": "http.response.start", "status": 200, "headers": job.raw_headers(_SSE_HEADERS)})
        self._streaming = True
        pending = formatter.start_chunks(len(job.requests) * job.n)
        try:
            if first is not None:
                pending += formatter.output_chunks(first_choice, first[1])
                await send({"type": "http.response.body", "body": b"".join(pending), "more_body": True})
                async for prompt_index, out in outputs:
                    choice = self.tally.observe(prompt_index, out)
                    self._check(out)
                    chunks = formatter.output_chunks(choice, out)
                    if chunks:
                        await send(
                            {"type": "http.response.body", "body": b"".join(chunks), "more_body": True}
                        )
                        if time.monotonic() - progress_at >= USAGE_PROGRESS_INTERVAL_S:
                            progress_at = time.monotonic()
                            job.accountant.progress(job.info, self.tally)
            usage = self.tally.usage()
            await formatter.seal(None, usage)
            tail = formatter.usage_chunk(usage) if formatter.include_usage else b""
            outcome = Outcome.COMPLETED
        except Exception as exc:
            error = self._log_error(exc)
            outcome, self._error = Outcome.FAILED, error.message
            job.accountant.metrics.count_error(error.status_code)
            tail = formatter.error_event(error)
        self._outcome = outcome
        # The final record in the spool file before the last bytes: a client that saw `[DONE]` is
        # billed as completed, with its real counts, even if the process is killed right after.
        self._journaled = job.accountant.conclude(job.info, self.tally, outcome)
        self._complete = True
        await send({"type": "http.response.body", "body": tail + formatter.stream_end, "more_body": False})

    def _log_error(self, exc: Exception) -> WeirError:
        error = from_engine_error(exc)
        if error.status_code >= 500:
            logger.error("request %s failed: %r", self.job.info.request_id, exc)
        return error

    async def _cleanup(self) -> None:
        job = self.job
        outcome = self._outcome
        if outcome is None:
            outcome = Outcome.CLIENT_DISCONNECTED if self._disconnected else Outcome.CANCELLED
        # The one abort of each unfinished engine request: closing its stream below sends none.
        # Its answer is the prefill the engine computed for it: billed, though no token came, when
        # the client cancelled (not when the server did).
        for i, request in enumerate(job.requests):
            if not self.tally.prompt_finished(i):
                try:
                    computed = None
                    with contextlib.suppress(TimeoutError):  # a stalled engine must not hold this
                        async with asyncio.timeout(_ABORT_REPORT_S):
                            computed = await job.engine.abort(request.request_id)
                    if computed is not None and outcome is Outcome.CLIENT_DISCONNECTED:
                        self.tally.note_computed_prompt(i, computed)
                except Exception:
                    logger.exception("abort of %s failed", request.request_id)
        if self._outputs is not None:
            await self._outputs.aclose()
        job.accountant.finish(
            job.info, self.tally, outcome, job.span, job.settle, self._error, journaled=self._journaled
        )
