"""OpenAI's Responses API: `POST /v1/responses`, and its stored responses per tenant
(`GET /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`, `DELETE /v1/responses/{id}`).

A response runs as a chat through the generation routes' steps (`weir.gateway.routes.openai`:
key, model and version routing, the key's limits, the constraint, admission, the engine, usage
records with the endpoint `response`); only the conversation is this module's:

- `previous_response_id` puts the stored conversation (its input items, then its output) ahead
  of the new input. Another tenant's id answers exactly as an unknown one: 404;
- a conversation that outgrows the context (or the item bound) is refused with a 400 naming
  `previous_response_id`, unless `truncation: "auto"`: then its oldest items are dropped, the
  fewest that make it fit (found by a binary search, a few tokenizations);
- with `store` (the default) the tenant's storage quota is checked before anything runs (400
  naming `store`, code `storage_quota_exceeded`; the bytes stored as `StoredBytesGauge` knows
  them), and the finished response is queued for a background write when its last bytes are ready
  (`weir.gateway.routes.response_writes`: batched, bounded): a read of that id on this replica
  waits for the write. Stored responses expire after the retention period: gone on the first read after it,
  and swept periodically (`ResponseSweeper`). The quota and retention are the tenant's
  (`QuotaLimits.response_storage_bytes`, `.response_retention_s`), else the server's settings;
- every store call waits at most `timeout_s` (then 503 `database_unavailable`, Retry-After).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from weir.gateway.api.protocol import ChatCompletionRequest, Endpoint, decode_json_object
from weir.gateway.api.responses_protocol import (
    ResponsesRequest,
    drop_oldest,
    format_echo,
    output_as_items,
    parse_responses_request,
    tool_choice_echo,
    tools_echo,
)
from weir.gateway.api.responses_stream import ResponsesFormatter
from weir.gateway.fleet.model_fleet import Lease
from weir.gateway.http.errors import BadRequestError, NotFoundError
from weir.gateway.prompts.prompt_limits import check_chat_size
from weir.gateway.prompts.tokenization import PromptBuilder
from weir.gateway.routes.engine_requests import Prepared
from weir.gateway.routes.openai import OpenAIRoutes
from weir.gateway.routes.response_quota import StoredBytesGauge, store_call
from weir.gateway.routes.response_writes import PendingWrites
from weir.tenancy.context import TenantContext
from weir.tenancy.responses.response_records import (
    DEFAULT_STORE_TIMEOUT_S,
    ResponseStorageLimits,
    ResponseStore,
    StoredResponse,
    json_bytes,
    tenant_storage_limits,
)

logger = logging.getLogger(__name__)

MAX_LISTED_ITEMS = 100  # `limit` of the input items list


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _not_found(response_id: str) -> NotFoundError:
    shown = response_id if len(response_id) <= 64 else response_id[:64] + "..."
    return NotFoundError(
        f"No response with id '{shown}' found", param="response_id", code="response_not_found"
    )


class ResponsesRoutes:
    """The four handlers, over the generation routes and a response store."""

    def __init__(
        self,
        routes: OpenAIRoutes,
        store: ResponseStore,
        gauge: StoredBytesGauge | None = None,
        *,
        timeout_s: float = DEFAULT_STORE_TIMEOUT_S,
        writes: PendingWrites | None = None,
    ) -> None:
        self.openai = routes
        self.store = store
        self.timeout_s = timeout_s
        self.gauge = gauge if gauge is not None else StoredBytesGauge(store, timeout_s=timeout_s)
        self.writes = writes if writes is not None else PendingWrites(store, timeout_s)

    def limits(self, tenant: TenantContext) -> ResponseStorageLimits:
        """The tenant's storage quota and retention: its own where an admin set them, else the server's."""
        return tenant_storage_limits(self.store.limits, tenant.quota)

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/v1/responses", self.create, methods=["POST"]),
            Route("/v1/responses/{response_id}", self.retrieve, methods=["GET"]),
            Route("/v1/responses/{response_id}", self.delete, methods=["DELETE"]),
            Route("/v1/responses/{response_id}/input_items", self.input_items, methods=["GET"]),
        ]

    async def _stored(self, tenant: TenantContext, response_id: str) -> StoredResponse:
        await self.writes.wait(tenant.tenant_id, response_id)  # read-after-write on this replica
        record = await store_call(
            self.store, self.store.get, tenant.tenant_id, response_id, _now(), timeout_s=self.timeout_s
        )
        if record is None:
            raise _not_found(response_id)
        return record

    async def retrieve(self, request: Request) -> Response:
        tenant = await self.openai._tenant(request)
        record = await self._stored(tenant, request.path_params["response_id"])
        return JSONResponse(record.body)

    async def delete(self, request: Request) -> Response:
        tenant = await self.openai._tenant(request)
        response_id = request.path_params["response_id"]
        await self.writes.wait(tenant.tenant_id, response_id)
        if not await store_call(
            self.store, self.store.delete, tenant.tenant_id, response_id, timeout_s=self.timeout_s
        ):
            raise _not_found(response_id)
        self.gauge.forget(tenant.tenant_id)
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})

    async def input_items(self, request: Request) -> Response:
        """The items that made the response's prompt (inherited ones first), OpenAI's list page:
        `order` (desc by default), `limit` (1-100, default 20), `after` (an item id)."""
        tenant = await self.openai._tenant(request)
        response_id = request.path_params["response_id"]
        query = request.query_params
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise BadRequestError("'order' must be asc or desc", param="order")
        try:
            limit = int(query.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_LISTED_ITEMS:
            raise BadRequestError(f"'limit' must be an integer in [1, {MAX_LISTED_ITEMS}]", param="limit")
        record = await self._stored(tenant, response_id)
        stem = response_id.removeprefix("resp_")
        items = [{"id": f"item_{stem}_{i}", **item} for i, item in enumerate(record.input_items)]
        if order == "desc":
            items.reverse()
        after = query.get("after")
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                raise BadRequestError("'after' is not an item of this response", param="after")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return JSONResponse(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > limit,
            }
        )

    async def _previous(self, tenant: TenantContext, previous_id: str | None) -> list[dict[str, Any]]:
        """The stored conversation `previous_id` ended: its input items, then its output."""
        if previous_id is None:
            return []
        try:
            record = await self._stored(tenant, previous_id)
        except NotFoundError:
            shown = previous_id if len(previous_id) <= 64 else previous_id[:64] + "..."
            raise NotFoundError(
                f"Previous response with id '{shown}' not found",
                param="previous_response_id",
                code="previous_response_not_found",
            ) from None
        return [*record.input_items, *output_as_items(record.body.get("output", ()))]

    async def _check_quota(self, tenant: TenantContext, conversation: Sequence[dict[str, Any]]) -> None:
        limits = self.limits(tenant)
        used = await self.gauge.used(tenant.tenant_id)
        needed = json_bytes(list(conversation))
        if used + needed > limits.quota_bytes:
            raise BadRequestError(
                f"the response storage quota of {limits.quota_bytes} bytes is used up ({used} bytes "
                f"stored, this conversation needs {needed}); delete stored responses, or send store: false",
                param="store",
                code="storage_quota_exceeded",
            )

    async def _encode(
        self, chat: ChatCompletionRequest, builder: PromptBuilder, max_model_len: int, tenant: TenantContext
    ) -> tuple[int, ...] | None:
        """The chat's prompt, or None when its text alone cannot fit the context."""
        messages = chat.prompt_messages()
        try:
            check_chat_size(messages, max_model_len, self.openai._chars_per_token(builder))
        except BadRequestError:
            return None
        return await builder.encode_chat_async(messages, self.openai.tokenizer_pool, tenant.tenant_id)

    async def _fit(
        self,
        parsed: ResponsesRequest,
        conversation: list[dict[str, Any]],
        inherited: int,
        lease: Lease,
        tenant: TenantContext,
    ) -> tuple[list[dict[str, Any]], tuple[int, ...]]:
        """The conversation (its oldest items dropped under `truncation: auto`) and its prompt,
        which leaves room for `max_output_tokens` (or one token) in the context."""
        builder, served = lease.version.prompts, lease.version.served
        assert builder is not None and served is not None  # a routed version is loaded
        max_model_len = served.max_model_len
        room = parsed.options.max_tokens or 1
        auto = parsed.body.truncation == "auto"
        max_items = self.openai.prompt_limits.max_chat_messages

        async def prompt_of(num_dropped: int) -> tuple[int, ...] | None:
            chat = parsed.chat(drop_oldest(conversation, num_dropped))
            prompt = await self._encode(chat, builder, max_model_len, tenant)
            return prompt if prompt is not None and len(prompt) + room <= max_model_len else None

        first = len(conversation) - max_items if len(conversation) > max_items else 0
        prompt = await prompt_of(first) if first == 0 or auto else None
        if prompt is not None:
            return drop_oldest(conversation, first), prompt
        if not auto or len(conversation) <= 1:
            param = "previous_response_id" if inherited else "input"
            what = "the conversation" if inherited else "the input"
            raise BadRequestError(
                f"{what} does not fit this model's context of {max_model_len} tokens (with {room} for "
                f"the output) or its bound of {max_items} items"
                + ("; send truncation: auto to drop its oldest items" if inherited and not auto else ""),
                param=param,
                code="context_length_exceeded",
            )
        # The fewest oldest items to drop: the last item alone must fit.
        low, high = first + 1, len(conversation) - 1
        best = await prompt_of(high)
        if best is None:
            raise BadRequestError(
                f"the last input item alone does not fit this model's context of {max_model_len} tokens "
                f"(with {room} for the output)",
                param="input",
                code="context_length_exceeded",
            )
        while low < high:
            middle = (low + high) // 2
            candidate = await prompt_of(middle)
            if candidate is None:
                low = middle + 1
            else:
                high, best = middle, candidate
        return drop_oldest(conversation, high), best

    async def create(self, request: Request) -> Response:
        openai = self.openai
        arrival_s = time.monotonic()
        span = openai.start_span(request)
        lease: Lease | None = None
        try:
            openai.check_open()
            tenant = await openai._tenant(request)
            data = decode_json_object(await request.body())
            parsed = parse_responses_request(data, openai.prompt_limits.max_chat_messages)
            body = parsed.body
            response_id = "resp_" + uuid.uuid4().hex
            # The model and the key's right to it are checked before any store read, as chat routes first.
            lease, adapter_name = openai._route(request, body.model, tenant, response_id)
            previous = await self._previous(tenant, body.previous_response_id)
            conversation = [*previous, *parsed.items]
            if body.store:
                await self._check_quota(tenant, conversation)
            conversation, prompt = await self._fit(parsed, conversation, len(previous), lease, tenant)
            prepared = Prepared(
                tenant, response_id, body.model, parsed.options, (prompt,), lease, adapter_name, parsed.tools
            )
            admitted = await openai.admit(prepared, Endpoint.RESPONSES, arrival_s, span)
        except BaseException as exc:  # cancelled too: the lease goes back
            if lease is not None:
                lease.release()
            span.end(str(exc))
            raise
        store = functools.partial(self._store, tenant, tuple(conversation)) if body.store else None
        return openai.start(
            prepared,
            Endpoint.RESPONSES,
            arrival_s,
            span,
            admitted,
            ResponsesFormatter,
            echo=_echo(parsed),
            store=store,
        )

    async def _store(
        self, tenant: TenantContext, items: tuple[dict[str, Any], ...], body: dict[str, Any]
    ) -> None:
        """Store the finished response: at once for a memory store, else by a queued background
        write that reads of its id wait for (the answer's last bytes do not wait for the database)."""
        now = _now()
        expires = now + dt.timedelta(seconds=self.limits(tenant).retention_s)
        record = StoredResponse(body["id"], body, items, now, expires)
        tenant_id = tenant.tenant_id
        self.gauge.add(tenant_id, record.num_bytes)  # counted now: the quota sees writes in flight
        if self.store.inline:
            self.store.put(tenant_id, record)
            return
        self.writes.submit(tenant_id, record, self.gauge.forget)  # not stored: read the bytes again


def _echo(parsed: ResponsesRequest) -> dict[str, Any]:
    """The request's fields a response states."""
    body = parsed.body
    return {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "store": body.store,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "text": format_echo(body),
        "tool_choice": tool_choice_echo(body),
        "tools": tools_echo(body),
        "truncation": body.truncation,
        "user": body.user,
        "metadata": body.metadata or {},
    }


class ResponseSweeper:
    """Deletes expired stored responses every `interval_s`, on a worker thread (app lifespan hooks).

    One sweep's database work is bounded by `timeout_s`: the store stops between batches past it
    (the rest waits for the next sweep), and the sweeper stops waiting past it; a sweep still
    running at the next tick is not doubled (that tick is skipped, with a warning).
    """

    def __init__(
        self, store: ResponseStore, interval_s: float, timeout_s: float = DEFAULT_STORE_TIMEOUT_S
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.store = store
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._task: asyncio.Task[None] | None = None
        self._sweep: asyncio.Future[int] | None = None  # the sweep on its thread, maybe abandoned

    async def sweep_once(self) -> int | None:
        """One bounded sweep: how many were deleted, or None when it did not finish in time."""
        if self._sweep is not None and not self._sweep.done():
            logger.warning("the previous sweep of expired stored responses is still running; skipped")
            return None
        # On a worker thread whatever the store: a sweep walks every stored response.
        self._sweep = asyncio.ensure_future(asyncio.to_thread(self.store.sweep, _now(), self.timeout_s))
        try:
            return await asyncio.wait_for(asyncio.shield(self._sweep), self.timeout_s)
        except TimeoutError:
            logger.warning(
                "the sweep of expired stored responses took over %.1f s; left running", self.timeout_s
            )
            return None

    async def _run(self) -> None:
        while True:
            try:
                deleted = await self.sweep_once()
                if deleted:
                    logger.info("deleted %d expired stored responses", deleted)
            except Exception:
                logger.exception("the sweep of expired stored responses failed")
            await asyncio.sleep(self.interval_s)

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
