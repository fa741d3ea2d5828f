"""The prefix-cache admin API under /admin/v1/prefix-cache (admin bearer token).

    GET    /admin/v1/prefix-cache/stats                 totals, per tenant, per scope
    GET    /admin/v1/prefix-cache/tenants/{name}        one tenant: hit rate, cached tokens, evictions
    GET    /admin/v1/prefix-cache/prefixes              the registered shared prefixes
    POST   /admin/v1/prefix-cache/prefixes              register (and compute) one: token_ids | text | messages
    GET    /admin/v1/prefix-cache/prefixes/{id}
    DELETE /admin/v1/prefix-cache/prefixes/{id}         unregister (its blocks become evictable)
    POST   /admin/v1/prefix-cache/prefixes/{id}/pin     never evict its blocks
    POST   /admin/v1/prefix-cache/prefixes/{id}/unpin
    POST   /admin/v1/prefix-cache/flush                 {} | {"model_version"} | {"tenant"} | {"cache_scope"}

Each call acts on one loaded model version's cache: `?model=NAME&version=LABEL` names it; by
default, the default model's serving version (`weir serve` passes `select`; an app around one
engine has just that one).

Body errors follow the rest of the admin API: a body that is not a JSON object is 400; a field that
is unknown, of the wrong type or out of range is 422 naming it. `messages` are those of a chat
body (`weir.gateway.api.openai_bodies.requests.ChatMessageBody`, content parts included): malformed, a 400
naming the field, as `/v1/chat/completions` answers. Text and messages are tokenized by the model
version's `PromptBuilder`, off the event loop and under its lock, as the chat route's are. Every error, the engine's included
(unknown prefix 404, pin budget 409, refused prefix 422), is raised to the app's one mapper in
`weir.gateway.http.errors`, which answers and counts it. Everything runs on the engine thread through the
engine's prefix-cache facade (`weir.engine.client.PrefixCacheControl`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route

from weir.engine.client import PrefixCacheControl
from weir.engine.kv.prefix_cache_types import TenantCacheStats
from weir.gateway.api.openai_bodies.params import bad_request
from weir.gateway.api.openai_bodies.requests import ChatMessageBody
from weir.gateway.api.prefix_cache_bodies import (
    PrefixCacheFlush,
    PrefixCacheStatsBody,
    PrefixList,
    SharedPrefix,
    TenantCacheStatsBody,
)
from weir.gateway.api.protocol import ChatMessage, message_of
from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.errors import BadRequestError, NotFoundError, PayloadTooLargeError, UnprocessableError
from weir.gateway.http.json_body import loads_bounded
from weir.gateway.prompts.tokenization import PromptBuilder, Tokenizer
from weir.gateway.routes.admin_http import client_addr, json_answer
from weir.gateway.settings.settings_prompts import DEFAULT_MAX_CHAT_MESSAGES

MAX_BODY_BYTES = 4 << 20  # a long system prompt as token ids is a few hundred KB
_REGISTER_FIELDS = frozenset({"token_ids", "text", "messages", "add_special_tokens", "name", "pin"})
_FLUSH_FIELDS = frozenset({"model_version", "tenant", "cache_scope", "include_pinned"})
_MESSAGES: TypeAdapter[list[ChatMessageBody]] = TypeAdapter(list[ChatMessageBody])

Handler = Callable[[Request], Awaitable[Response]]


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise PayloadTooLargeError(f"request body is larger than {MAX_BODY_BYTES} bytes")
    if not raw.strip():
        return {}
    data = loads_bounded(raw)  # 400 for invalid JSON, too deep nesting, lone surrogates
    if not isinstance(data, dict):
        raise BadRequestError("request body must be a JSON object", code="invalid_body")
    return data


def _messages(value: Any) -> list[ChatMessage]:
    """`messages` read as a chat body reads them: a 400 naming the field when malformed."""
    if isinstance(value, list) and len(value) > DEFAULT_MAX_CHAT_MESSAGES:
        raise BadRequestError(
            f"'messages' may hold at most {DEFAULT_MAX_CHAT_MESSAGES} messages", param="messages"
        )
    if isinstance(value, list) and not value:
        raise BadRequestError("'messages' must be a non-empty list of messages", param="messages")
    try:
        return [message_of(m) for m in _MESSAGES.validate_python(value)]
    except ValidationError as exc:
        raise bad_request(exc, "messages") from None


def _invalid(param: str, message: str) -> UnprocessableError:
    return UnprocessableError(f"'{param}' {message}", param=param, code="invalid_value")


def _check_fields(data: Mapping[str, Any], allowed: frozenset[str]) -> None:
    for name in data:
        if name not in allowed:
            raise _invalid(name, "is not a known field")


def _opt_str(data: Mapping[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is not None and (not isinstance(value, str) or not value):
        raise _invalid(name, "must be a non-empty string")
    return value


def _bool(data: Mapping[str, Any], name: str, default: bool) -> bool:
    value = data.get(name, default)
    if not isinstance(value, bool):
        raise _invalid(name, "must be a boolean")
    return value


@dataclass(frozen=True)
class PrefixCacheTarget:
    """The prefix cache one admin call acts on, with the prompt builder of its model version."""

    control: PrefixCacheControl
    prompts: PromptBuilder


# (model name or None, version label or None) -> the target; raises NotFoundError for neither.
SelectTarget = Callable[[str | None, str | None], PrefixCacheTarget]


def _target(request: Request) -> PrefixCacheTarget:
    target: PrefixCacheTarget = request.state.prefix_cache_target
    return target


class PrefixCacheRoutes:
    """The endpoints, sharing an engine's prefix-cache facade, the admin authenticator and the tokenizer.

    With `select`, each call may name a model version with the query parameters `model` and
    `version` (default: the default model's serving version); without, the one `control` serves.
    """

    def __init__(
        self,
        control: PrefixCacheControl | None,
        admin_auth: AdminAuthenticator,
        tokenizer: Tokenizer | None,
        select: SelectTarget | None = None,
    ) -> None:
        if select is None:
            if control is None or tokenizer is None:
                raise ValueError("control and tokenizer are required without select")
            fixed = PrefixCacheTarget(control, PromptBuilder(tokenizer))

            def select(model: str | None, version: str | None) -> PrefixCacheTarget:
                return fixed

        self.select = select
        self.admin_auth = admin_auth

    def admin(self, handler: Handler) -> Handler:
        """Check the admin token first. Errors are raised, never answered here: the app's one
        mapper (`weir.gateway.http.errors.to_http_error`) answers and counts them, like every route's."""

        async def endpoint(request: Request) -> Response:
            await self.admin_auth.authenticate_async(
                request.headers.get("authorization"), client_addr(request)
            )
            params = request.query_params
            request.state.prefix_cache_target = self.select(params.get("model"), params.get("version"))
            return await handler(request)

        return endpoint

    def routes(self) -> list[BaseRoute]:
        a = self.admin
        return [
            Mount(
                "/admin/v1/prefix-cache",
                routes=[
                    Route("/stats", a(self.stats), methods=["GET"]),
                    Route("/tenants/{name}", a(self.tenant), methods=["GET"]),
                    Route("/prefixes", a(self.list_prefixes), methods=["GET"]),
                    Route("/prefixes", a(self.register), methods=["POST"]),
                    Route("/prefixes/{prefix_id}", a(self.get_prefix), methods=["GET"]),
                    Route("/prefixes/{prefix_id}", a(self.unregister), methods=["DELETE"]),
                    Route("/prefixes/{prefix_id}/pin", a(self.pin), methods=["POST"]),
                    Route("/prefixes/{prefix_id}/unpin", a(self.unpin), methods=["POST"]),
                    Route("/flush", a(self.flush), methods=["POST"]),
                    Route("/{path:path}", a(self.unknown), methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
                ],
            )
        ]

    # -- stats --------------------------------------------------------------------------------------

    async def stats(self, request: Request) -> Response:
        return json_answer(PrefixCacheStatsBody.model_validate(await _target(request).control.stats()))

    async def tenant(self, request: Request) -> Response:
        name = request.path_params["name"]
        stats = await _target(request).control.stats()
        for t in stats.tenants:
            if t.tenant_id == name:
                return json_answer(TenantCacheStatsBody.model_validate(t))
        # A tenant the engine has not seen yet: nothing looked up, nothing cached in its name.
        return json_answer(
            TenantCacheStatsBody.model_validate(TenantCacheStats(name, name, 0, 0, 0, 0, 0, 0))
        )

    # -- shared prefixes ----------------------------------------------------------------------------

    async def _token_ids(self, data: Mapping[str, Any], prompts: PromptBuilder) -> list[int]:
        given = [name for name in ("token_ids", "text", "messages") if data.get(name) is not None]
        if len(given) != 1:
            raise _invalid("token_ids", "or 'text' or 'messages': give exactly one")
        if "token_ids" in given:
            ids = data["token_ids"]
            if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids
            ):
                raise _invalid("token_ids", "must be a list of integers")
            if not all(0 <= t < prompts.vocab_size for t in ids):
                raise _invalid("token_ids", f"must be token ids in [0, {prompts.vocab_size})")
            return ids
        if "text" in given:
            text = data["text"]
            if not isinstance(text, str) or not text:
                raise _invalid("text", "must be a non-empty string")
            # The default matches /v1/completions, which encodes text with the special tokens.
            add_special = _bool(data, "add_special_tokens", True)
            return list(await prompts.encode_text_async(text, add_special))
        return list(await prompts.encode_chat_prefix_async(_messages(data["messages"])))

    async def register(self, request: Request) -> Response:
        data = await _body(request)
        _check_fields(data, _REGISTER_FIELDS)
        name = _opt_str(data, "name") or ""
        pin = _bool(data, "pin", False)
        token_ids = await self._token_ids(data, _target(request).prompts)
        info = await _target(request).control.register(token_ids, name=name, pin=pin)
        return json_answer(SharedPrefix.model_validate(info), 201)

    async def list_prefixes(self, request: Request) -> Response:
        prefixes = await _target(request).control.list_prefixes()
        return json_answer(PrefixList(data=[SharedPrefix.model_validate(p) for p in prefixes]))

    async def get_prefix(self, request: Request) -> Response:
        return json_answer(
            SharedPrefix.model_validate(await _target(request).control.get(request.path_params["prefix_id"]))
        )

    async def unregister(self, request: Request) -> Response:
        return json_answer(
            SharedPrefix.model_validate(
                await _target(request).control.unregister(request.path_params["prefix_id"])
            )
        )

    async def pin(self, request: Request) -> Response:
        return json_answer(
            SharedPrefix.model_validate(await _target(request).control.pin(request.path_params["prefix_id"]))
        )

    async def unpin(self, request: Request) -> Response:
        return json_answer(
            SharedPrefix.model_validate(
                await _target(request).control.unpin(request.path_params["prefix_id"])
            )
        )

    # -- flush --------------------------------------------------------------------------------------

    async def flush(self, request: Request) -> Response:
        data = await _body(request)
        _check_fields(data, _FLUSH_FIELDS)
        result = await _target(request).control.flush(
            model_version=_opt_str(data, "model_version"),
            tenant_id=_opt_str(data, "tenant"),
            cache_scope=_opt_str(data, "cache_scope"),
            include_pinned=_bool(data, "include_pinned", False),
        )
        return json_answer(
            PrefixCacheFlush(
                flushed_blocks=result.num_blocks_flushed, model_version_matched=result.model_version_matched
            )
        )

    async def unknown(self, request: Request) -> Response:
        raise NotFoundError(f"no admin endpoint {request.method} {request.url.path}")


def prefix_cache_routes(
    control: PrefixCacheControl | None,
    admin_auth: AdminAuthenticator,
    tokenizer: Tokenizer | None,
    select: SelectTarget | None = None,
) -> list[BaseRoute]:
    """The `/admin/v1/prefix-cache` mount; place it before the `/admin/v1` catch-all."""
    return PrefixCacheRoutes(control, admin_auth, tokenizer, select).routes()
