"""`POST /tokenize` and `POST /detokenize` (vLLM's shapes), under the tenant's key and limits.

They share the generation routes' steps (`weir.gateway.routes.openai`): the key, the model check and
routing (a tenant's pin, an adapter's base), the size checks before anything is rendered, and the
tokenizer pool within the tenant's share. A call goes through admission with no engine request, so
a key's concurrency and requests-per-minute limits count it and its answer carries the same
`x-ratelimit-*` headers; it computes nothing, so it settles at once with no tokens.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from weir.gateway.admission.accounting import Admitted, Outcome, Usage, UsageRecord
from weir.gateway.api.protocol import Endpoint, decode_json_object
from weir.gateway.api.tokenize_bodies import (
    DetokenizeAnswer,
    TokenizeAnswer,
    parse_detokenize,
    parse_tokenize,
    tokenize_messages,
)
from weir.gateway.http.errors import MODEL_VERSION_HEADER, ServiceUnavailableError
from weir.gateway.prompts.prompt_limits import check_chat_size, check_prompt_sizes
from weir.gateway.prompts.tokenization import PromptBuilder
from weir.gateway.routes.openai import OpenAIRoutes
from weir.tenancy.context import TenantContext

Work = Callable[[PromptBuilder, int, TenantContext], Awaitable[dict[str, object]]]


class TokenizeRoutes:
    """The two handlers, over the generation routes' fleet, keys, admission and tokenizer pool."""

    def __init__(self, routes: OpenAIRoutes) -> None:
        self.openai = routes

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
        ]

    async def tokenize(self, request: Request) -> Response:
        tenant = await self.openai._tenant(request)
        body = parse_tokenize(
            decode_json_object(await request.body()), self.openai.prompt_limits.max_chat_messages
        )

        async def work(
            builder: PromptBuilder, max_model_len: int, tenant: TenantContext
        ) -> dict[str, object]:
            pool, chars = self.openai.tokenizer_pool, self.openai._chars_per_token(builder)
            if body.messages is not None:
                messages = tokenize_messages(body)
                check_chat_size(messages, max_model_len, chars)
                ids = await builder.tokenize_chat_async(
                    messages,
                    pool,
                    tenant.tenant_id,
                    generation_prompt=body.add_generation_prompt,
                    add_special_tokens=bool(body.add_special_tokens),
                )
            else:
                assert body.prompt is not None  # parse_tokenize: exactly one of the two
                check_prompt_sizes((body.prompt,), max_model_len, chars)
                special = body.add_special_tokens is not False
                ids = await builder.tokenize_text_async(body.prompt, pool, tenant.tenant_id, special)
            answer = TokenizeAnswer(count=len(ids), max_model_len=max_model_len, tokens=list(ids))
            return answer.model_dump()

        return await self._run(request, tenant, body.model, work)

    async def detokenize(self, request: Request) -> Response:
        tenant = await self.openai._tenant(request)
        body = parse_detokenize(decode_json_object(await request.body()), self.openai._max_prompt_ids())

        async def work(
            builder: PromptBuilder, max_model_len: int, tenant: TenantContext
        ) -> dict[str, object]:
            text = await builder.decode_async(body.tokens, self.openai.tokenizer_pool, tenant.tenant_id)
            return DetokenizeAnswer(prompt=text).model_dump()

        return await self._run(request, tenant, body.model, work)

    def _default_model(self, tenant: TenantContext) -> str:
        allowed = [m.name for m in self.openai.fleet.served_models(tenant.tenant_id)]
        usable = [name for name in allowed if tenant.allows_model(name)]
        if not usable:
            raise ServiceUnavailableError("no model this API key may use is served", code="model_not_ready")
        return usable[0]

    async def _run(self, request: Request, tenant: TenantContext, model: str | None, work: Work) -> Response:
        arrival_s = time.monotonic()
        name = model if model is not None else self._default_model(tenant)
        request_id = "tok-" + uuid.uuid4().hex
        lease, _ = self.openai._route(request, name, tenant, request_id)
        try:
            builder, served = lease.version.prompts, lease.version.served
            assert builder is not None and served is not None  # a routed version is loaded
            # Admitted before any work, so a key past its limits costs no tokenizer time.
            admitted = await self.openai.admission(tenant, ())
            settle, headers = (
                (admitted.settle, admitted.headers) if isinstance(admitted, Admitted) else (admitted, ())
            )
            try:
                answer = await work(builder, served.max_model_len, tenant)
            finally:
                settle(_record(request_id, tenant, name, arrival_s))
        finally:
            lease.release()
        return JSONResponse(
            answer, headers={MODEL_VERSION_HEADER: lease.version.spec.version, **dict(headers)}
        )


def _record(request_id: str, tenant: TenantContext, model: str, arrival_s: float) -> UsageRecord:
    """What a tokenizer call settles with: nothing computed by the engine."""
    return UsageRecord(
        request_id=request_id,
        tenant_id=tenant.tenant_id,
        key_id=tenant.key_id,
        model=model,
        endpoint=Endpoint.TOKENIZE,
        usage=Usage(prompt_tokens=0, completion_tokens=0),
        outcome=Outcome.COMPLETED,
        finish_reasons=(),
        created_at=time.time(),
        duration_s=time.monotonic() - arrival_s,
    )
