"""The load generator: sends planned requests on schedule, streams them, times every chunk.

Every request streams (`stream: true`, usage in the last chunk). Timing uses one monotonic clock:
TTFT is the first chunk with content minus the send time, each later content chunk adds one
inter-token interval, E2E ends at `[DONE]` (or when we close a cancelled stream). A bad server
never stops the run: each failure becomes a record with its status or failure kind.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from tqdm import tqdm

from weir_bench.arrivals import ArrivalMode, ArrivalSpec, send_offsets
from weir_bench.records import Outcome, RequestRecord
from weir_bench.sse import DONE, ChunkError, SSEDecoder, parse_chunk
from weir_bench.workloads import RequestKind, WorkloadRequest

_ERROR_BODY_BYTES = 2000


@dataclass(frozen=True)
class BodyOptions:
    """Which non-standard fields go into request bodies (peers may reject ours)."""

    send_priority: bool = True
    send_ignore_eos: bool = True


@dataclass(frozen=True)
class PlannedRequest:
    """A request ready to send: where, with which headers and body, and when."""

    request: WorkloadRequest
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    scheduled_s: float


@dataclass(frozen=True)
class LoadOptions:
    """Bounds of one run."""

    timeout_s: float = 120.0  # per request: connect, each read, and the whole stream
    max_duration_s: float = 3600.0  # the whole run; requests still running then are stopped
    progress: bool = True

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        if self.max_duration_s <= 0:
            raise ValueError("max_duration_s must be > 0")


@dataclass(frozen=True)
class LoadResult:
    """The records of the requests that were sent (in plan order) and the run's extent."""

    records: tuple[RequestRecord, ...]
    duration_s: float  # from the start of the run to the end of the last request
    started_at_unix: float
    num_planned: int
    clock_origin: float = 0.0  # time.perf_counter() at the start of the run; start_s counts from it


def server_root(url: str) -> str:
    """The server root of an OpenAI base URL: `http://h:p/v1` and `http://h:p/` both give `http://h:p`."""
    root = url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def request_body(req: WorkloadRequest, model: str, options: BodyOptions) -> dict[str, Any]:
    """The JSON body for one request: always streaming, with usage in the final chunk."""
    body: dict[str, Any] = {"model": model}
    if req.kind is RequestKind.CHAT:
        body["messages"] = [{"role": m.role, "content": m.content} for m in req.messages]
    else:
        body["prompt"] = req.prompt
    body["max_tokens"] = req.max_tokens
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if options.send_priority and req.priority is not None:
        body["priority"] = req.priority
    if options.send_ignore_eos and req.ignore_eos:
        body["ignore_eos"] = True
    return body


def plan_requests(
    requests: Sequence[WorkloadRequest],
    *,
    base_url: str,
    model: str,
    arrival: ArrivalSpec,
    tenant_keys: Mapping[str, str] | None = None,
    default_key: str | None = None,
    body_options: BodyOptions | None = None,
) -> list[PlannedRequest]:
    """Bodies, headers and due times for each request, in the given order.

    The key of a request is its tenant's key, else `default_key`; with tenant keys given, a
    tenant without one and no default is an error (caught before anything is sent).
    """
    tenant_keys = tenant_keys or {}
    body_options = body_options or BodyOptions()
    root = server_root(base_url)
    offsets = send_offsets(requests, arrival)
    planned = []
    for req, offset in zip(requests, offsets, strict=True):
        key = tenant_keys.get(req.tenant, default_key)
        if key is None and tenant_keys:
            raise ValueError(
                f"tenant {req.tenant!r} (request {req.id}) has no API key; give --api-key as fallback"
            )
        headers = [("content-type", "application/json"), ("x-request-id", req.id)]
        if key is not None:
            headers.append(("authorization", f"Bearer {key}"))
        body = json.dumps(request_body(req, model, body_options)).encode()
        planned.append(
            PlannedRequest(
                request=req, url=root + req.kind.path, headers=tuple(headers), body=body, scheduled_s=offset
            )
        )
    return planned


@dataclass
class _Progress:
    """Mutable state of one request while it runs; frozen into a RequestRecord at the end."""

    plan: PlannedRequest
    closed_loop: bool = False  # sent when a slot freed up, not at a due time
    start: float | None = None  # perf_counter at send
    start_s: float = 0.0
    status_code: int = 0
    chunks_ms: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    outcome: Outcome | None = None
    error: str | None = None
    end: float | None = None

    def finish(self, outcome: Outcome, error: str | None = None) -> None:
        if self.outcome is None:
            self.outcome, self.error, self.end = outcome, error, time.perf_counter()

    def record(self) -> RequestRecord:
        req = self.plan.request
        start = self.start if self.start is not None else 0.0
        end = self.end if self.end is not None else time.perf_counter()
        return RequestRecord(
            request_id=req.id,
            tenant=req.tenant,
            kind=req.kind.value,
            priority=req.priority,
            max_tokens=req.max_tokens,
            scheduled_s=self.start_s if self.closed_loop else self.plan.scheduled_s,
            start_s=self.start_s,
            status_code=self.status_code,
            outcome=self.outcome or Outcome.DEADLINE,
            error=self.error,
            ttft_ms=self.chunks_ms[0] if self.chunks_ms else None,
            e2e_ms=(end - start) * 1000.0,
            chunk_offsets_ms=tuple(self.chunks_ms),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            finish_reason=self.finish_reason,
        )


async def _read_error_body(resp: httpx.Response) -> str:
    data = b""
    async for part in resp.aiter_bytes():
        data += part
        if len(data) >= _ERROR_BODY_BYTES:
            break
    return data[:_ERROR_BODY_BYTES].decode("utf-8", errors="replace")


async def _stream(client: httpx.AsyncClient, st: _Progress, t0: float, timeout_s: float) -> None:
    """Send one request and fill `st`; every failure is caught and becomes an outcome."""
    plan = st.plan
    cancel_after = plan.request.cancel_after_tokens
    start = st.start = time.perf_counter()
    st.start_s = start - t0
    try:
        async with client.stream("POST", plan.url, content=plan.body, headers=list(plan.headers)) as resp:
            st.status_code = resp.status_code
            if resp.status_code != 200:
                st.finish(Outcome.HTTP_ERROR, await _read_error_body(resp))
                return
            if cancel_after == 0:
                st.finish(Outcome.CANCELLED)
                return  # leaving the block closes the connection: the server sees a disconnect
            decoder = SSEDecoder()
            async for line in resp.aiter_lines():
                now = time.perf_counter()
                if now - start > timeout_s:
                    st.finish(Outcome.TIMEOUT, f"stream ran past {timeout_s} s")
                    return
                data = decoder.feed(line)
                if data is None:
                    continue
                if data == DONE:
                    st.finish(Outcome.OK)
                    return
                if _absorb(st, data, (now - start) * 1000.0, cancel_after):
                    return
            data = decoder.flush()
            elapsed_ms = (time.perf_counter() - start) * 1000.0
            if data is not None and data != DONE and _absorb(st, data, elapsed_ms, cancel_after):
                return
            if data == DONE or st.finish_reason is not None:
                st.finish(Outcome.OK)
            else:
                st.finish(Outcome.STREAM_ERROR, "stream ended without [DONE] or a finish_reason")
    except ChunkError as exc:
        st.finish(Outcome.STREAM_ERROR, str(exc))
    except httpx.TimeoutException as exc:
        st.finish(Outcome.TIMEOUT, f"{type(exc).__name__}: {exc}")
    except httpx.HTTPError as exc:
        st.finish(Outcome.CONNECTION_ERROR, f"{type(exc).__name__}: {exc}")
    except (OSError, ValueError, UnicodeError) as exc:
        # Anything else a broken server can provoke below httpx; the run goes on.
        st.finish(Outcome.STREAM_ERROR, f"{type(exc).__name__}: {exc}")


def _absorb(st: _Progress, data: str, elapsed_ms: float, cancel_after: int | None) -> bool:
    """Take one chunk into `st`; True when the stream should be closed now (planned cancel)."""
    chunk = parse_chunk(data)
    if chunk.has_content:
        st.chunks_ms.append(elapsed_ms)
    if chunk.prompt_tokens is not None:
        st.prompt_tokens = chunk.prompt_tokens
    if chunk.completion_tokens is not None:
        st.completion_tokens = chunk.completion_tokens
    if chunk.finish_reason is not None:
        st.finish_reason = chunk.finish_reason
    if cancel_after is not None and len(st.chunks_ms) >= cancel_after:
        st.finish(Outcome.CANCELLED)
        return True
    return False


def _make_client(spec: ArrivalSpec, options: LoadOptions) -> httpx.AsyncClient:
    # Open loop: no connection cap, or requests would queue in the pool and the harness would
    # measure its own queue. trust_env=False: a proxy from the environment must not sit in the path.
    limit = spec.concurrency if spec.mode is ArrivalMode.CONCURRENCY else None
    return httpx.AsyncClient(
        timeout=httpx.Timeout(options.timeout_s),
        limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit or 1000),
        trust_env=False,
    )


async def run_load(
    plans: Sequence[PlannedRequest],
    arrival: ArrivalSpec,
    options: LoadOptions,
    client: httpx.AsyncClient | None = None,
) -> LoadResult:
    """Send every planned request per the arrival process; return one record per sent request.

    Bounded: after `options.max_duration_s` nothing new is sent and running requests are
    stopped and recorded as `deadline`. Requests never sent are left out of the records.
    """
    states = [_Progress(plan=p) for p in plans]
    finished = {p.request.id: asyncio.Event() for p in plans}
    bar = tqdm(total=len(plans), unit="req", disable=not options.progress, dynamic_ncols=True)
    own_client = client is None
    http = client if client is not None else _make_client(arrival, options)
    started_at = time.time()
    t0 = time.perf_counter()

    async def one(st: _Progress, delay: bool) -> None:
        try:
            if delay:
                await asyncio.sleep(max(0.0, t0 + st.plan.scheduled_s - time.perf_counter()))
            after = st.plan.request.after
            if after is not None and after in finished:
                await finished[after].wait()
            await _stream(http, st, t0, options.timeout_s)
        finally:
            finished[st.plan.request.id].set()
            if st.outcome is not None:
                bar.update(1)

    if arrival.mode is ArrivalMode.CONCURRENCY:
        queue = deque(states)

        async def worker() -> None:
            while queue:
                st = queue.popleft()
                st.closed_loop = True
                await one(st, delay=False)

        tasks = [asyncio.create_task(worker()) for _ in range(min(arrival.concurrency or 1, len(states)))]
    else:
        tasks = [asyncio.create_task(one(st, delay=True)) for st in states]
    try:
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=options.max_duration_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    finally:
        bar.close()
        if own_client:
            await http.aclose()
    records = tuple(st.record() for st in states if st.start is not None)
    last_end = max((r.end_s for r in records), default=0.0)
    return LoadResult(
        records=records,
        duration_s=last_end,
        started_at_unix=started_at,
        num_planned=len(plans),
        clock_origin=t0,
    )
