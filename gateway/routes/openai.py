"""The OpenAI-compatible endpoints (chat completions, completions, models) and Anthropic's
Messages, which runs as a chat through the same steps.

Everything that can be wrong with a request (auth, JSON, fields, model, quotas, context length,
sampling values) is checked here, before admission and before anything reaches the engine.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from weir.engine.structured.constraints import CompiledConstraint
from weir.engine.structured.grammar import ConstraintSpec
from weir.gateway.admission.accounting import (
    Accountant,
    Admission,
    Admitted,
    RequestInfo,
    Settle,
    UsageRecord,
)
from weir.gateway.api.anthropic_protocol import parse_messages_request
from weir.gateway.api.anthropic_stream import AnthropicFormatter
from weir.gateway.api.protocol import (
    ChatCompletionRequest,
    Endpoint,
    decode_json_object,
    parse_chat_request,
    parse_completion_request,
)
from weir.gateway.api.responses import ChatFormatter, CompletionFormatter, ResponseFormatter
from weir.gateway.fleet.adapter_catalog import AdapterCatalog
from weir.gateway.fleet.model_fleet import Lease, ModelFleet, ModelUnavailableError
from weir.gateway.http.error_tarpit import mark_key_proved
from weir.gateway.http.errors import (
    MODEL_VERSION_HEADER,
    ErrorShape,
    NotFoundError,
    PermissionDeniedError,
    ServiceUnavailableError,
)
from weir.gateway.metrics.tracing import RequestSpan, RequestTracer
from weir.gateway.prompts.grammar import GrammarService
from weir.gateway.prompts.prompt_limits import (
    PromptLimits,
    check_chat_size,
    check_prompt_sizes,
    max_request_prompt_tokens,
)
from weir.gateway.prompts.tokenization import PromptBuilder
from weir.gateway.prompts.tokenizer_pool import TokenizerPool
from weir.gateway.routes.engine_requests import AdmittedRun, Prepared, engine_requests
from weir.gateway.routes.gateway_state import GatewayState
from weir.gateway.routes.streaming import GenerationJob, GenerationResponse
from weir.tenancy.catalog.adapter_records import AdapterView
from weir.tenancy.context import TenantContext
from weir.tenancy.store.enums import ModelVersionState

Authenticate = Callable[[str | None, str], Awaitable[TenantContext]]

# Reads a body into a generation request checked, routed and tokenized (the lease released if it raises).
Prepare = Callable[[Request, TenantContext, dict[str, Any], str], Awaitable[Prepared]]


def _no_extra(prepared: Prepared) -> dict[str, object]:
    return {}


def _anthropic_extra(prepared: Prepared) -> dict[str, object]:
    return {"input_tokens": sum(len(p) for p in prepared.prompts)}  # Anthropic's message_start reports it


@dataclass(frozen=True)
class _GenerationRoute:
    """What differs between the generation endpoints: the rest of the path is one."""

    endpoint: Endpoint
    id_prefix: str  # of the response ids
    prepare: Prepare
    formatter: type[ResponseFormatter]  # the answer's shape (`/v1/messages` answers in Anthropic's)
    x_api_key: bool = False  # the key may come as `x-api-key` (Anthropic's clients send it so)
    extra: Callable[[Prepared], dict[str, object]] = _no_extra  # the formatter's endpoint-only arguments


class _Started(Response):
    """Adapts a `GenerationResponse` (a plain ASGI callable) to Starlette's endpoint type."""

    def __init__(self, inner: GenerationResponse) -> None:
        super().__init__()
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.inner(scope, receive, send)


class OpenAIRoutes:
    """Handlers of the `/v1` API over the fleet of model versions (`weir.gateway.fleet.model_fleet`)."""

    def __init__(
        self,
        *,
        fleet: ModelFleet,
        authenticate: Authenticate,
        admission: Admission,
        accountant: Accountant,
        tracer: RequestTracer,
        state: GatewayState,
        tokenizer_pool: TokenizerPool,
        prompt_limits: PromptLimits,
        grammars: GrammarService | None = None,
        adapters: AdapterCatalog | None = None,
    ) -> None:
        self.adapters = adapters if adapters is not None else AdapterCatalog()
        self.grammars = grammars if grammars is not None else GrammarService()
        self.fleet = fleet
        self.tokenizer_pool = tokenizer_pool
        self.prompt_limits = prompt_limits
        self.authenticate = authenticate
        self.admission = admission
        self.accountant = accountant
        self.tracer = tracer
        self.state = state
        self._chat = _GenerationRoute(
            Endpoint.CHAT,
            "chatcmpl-",
            functools.partial(self._prepare_chat, parse_chat_request),
            ChatFormatter,
        )
        self._completions = _GenerationRoute(
            Endpoint.COMPLETIONS, "cmpl-", self._prepare_completion, CompletionFormatter
        )
        self._messages = _GenerationRoute(
            Endpoint.MESSAGES,
            "msg_",
            functools.partial(self._prepare_chat, parse_messages_request),
            AnthropicFormatter,
            x_api_key=True,
            extra=_anthropic_extra,
        )

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/models", self.list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", self.retrieve_model, methods=["GET"]),
        ]

    async def _tenant(self, request: Request, *, x_api_key: bool = False) -> TenantContext:
        """The caller's tenant, by its `Authorization: Bearer` key (or, with `x_api_key`, by
        Anthropic's `x-api-key` header when no Authorization is sent)."""
        client = request.client.host if request.client else ""
        authorization = request.headers.get("authorization")
        if authorization is None and x_api_key:
            key = request.headers.get("x-api-key")
            authorization = None if key is None else "Bearer " + key
        tenant = await self.authenticate(authorization, client)
        mark_key_proved(
            request.state
        )  # its errors may now count against its key (weir.gateway.http.error_tarpit)
        return tenant

    async def list_models(self, request: Request) -> Response:
        tenant = await self._tenant(request)
        allowed = [
            m.card() for m in self.fleet.served_models(tenant.tenant_id) if tenant.allows_model(m.name)
        ]
        allowed += [
            card
            for view in self.adapters.visible_to(tenant.tenant_id)
            if tenant.allows_model(view.name) and (card := self._adapter_card(view)) is not None
        ]
        return JSONResponse({"object": "list", "data": allowed})

    def _adapter_card(self, view: AdapterView) -> dict[str, object] | None:
        """An adapter's /v1/models entry (`parent`: its base model); None while its base is not ready."""
        base = self.fleet.get(view.model_version)
        if base is None or base.served is None or base.state is not ModelVersionState.READY:
            return None
        return {
            **base.served.card(),
            "id": view.name,
            "parent": base.spec.name,
            "root": view.name,
            "created": int(view.created_at.timestamp()),
        }

    async def retrieve_model(self, request: Request) -> Response:
        tenant = await self._tenant(request)
        name = request.path_params["model"]
        adapter = self._adapter(name, tenant)
        if adapter is not None:
            card = self._adapter_card(adapter)
            if card is not None:
                return JSONResponse(card)
        self._check_model(name, tenant)
        served = next(m for m in self.fleet.served_models(tenant.tenant_id) if m.name == name)
        return JSONResponse(served.card())

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, self._chat)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, self._completions)

    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API, run as a chat (`weir.gateway.api.anthropic_protocol`)."""
        request.state.error_shape = ErrorShape.ANTHROPIC
        return await self._generate(request, self._messages)

    def _chars_per_token(self, prompt_builder: PromptBuilder) -> int:
        return self.prompt_limits.resolved_chars_per_token(prompt_builder.max_token_chars)

    def _max_prompt_ids(self) -> int:
        """Token ids one completion request may hold, for any model served (its own bound comes later)."""
        longest = max((m.max_model_len for m in self.fleet.served_models()), default=0)
        return max_request_prompt_tokens(longest)

    def _check_model(self, name: str, tenant: TenantContext) -> None:
        if not self.fleet.knows(name):
            # The name is client input: echo a bounded prefix of it (the error body escapes the rest).
            shown = name if len(name) <= 256 else name[:256] + "..."
            raise NotFoundError(f"The model '{shown}' does not exist", param="model", code="model_not_found")
        if not tenant.allows_model(name):
            raise PermissionDeniedError(
                f"this API key may not use the model '{name}'", param="model", code="model_not_allowed"
            )
        if not self.fleet.serves(name):
            raise ModelUnavailableError(name)

    def _adapter(self, name: str, tenant: TenantContext) -> AdapterView | None:
        """The adapter `name` names for this tenant, if any. A model name wins over an adapter
        name; an adapter this tenant may not see is None, so it ends in the unknown-model 404."""
        if self.fleet.serves(name):
            return None
        adapter = self.adapters.resolve(name, tenant.tenant_id)
        if adapter is not None and not tenant.allows_model(name):
            raise PermissionDeniedError(
                f"this API key may not use the model '{name}'", param="model", code="model_not_allowed"
            )
        return adapter

    def _route(
        self, request: Request, model: str, tenant: TenantContext, response_id: str
    ) -> tuple[Lease, str | None]:
        """Check the name, then pick the version that serves this request for its whole life,
        and the LoRA adapter it runs through (None: the base model).

        A `model` naming an adapter the tenant may call goes to the adapter's base version. The
        version is noted on the request, so an error answered after this point names it too
        (`weir.gateway.http.errors` adds the header).
        """
        adapter = self._adapter(model, tenant)
        if adapter is not None:
            lease = self.fleet.route_version(adapter.model_version, adapter.name)
        else:
            self._check_model(model, tenant)
            lease = self.fleet.route(model, tenant.tenant_id, response_id)
        request.state.model_version = lease.version.spec.version
        return lease, adapter.name if adapter is not None else None

    def start_span(self, request: Request) -> RequestSpan:
        path = request.scope["path"]  # not request.url: it builds and parses the whole URL
        return self.tracer.start_request(f"POST {path}", request.headers, {"http.route": path})

    def check_open(self) -> None:
        if self.state.draining:
            raise ServiceUnavailableError("the server is shutting down", code="shutting_down")

    async def _generate(self, request: Request, route: _GenerationRoute) -> Response:
        """Authenticate, prepare (the endpoint's own step), admit and start one generation request."""
        arrival_s = time.monotonic()
        span = self.start_span(request)
        try:
            self.check_open()
            tenant = await self._tenant(request, x_api_key=route.x_api_key)
            body = decode_json_object(await request.body())
            prepared = await route.prepare(request, tenant, body, route.id_prefix + uuid.uuid4().hex)
        except BaseException as exc:
            span.end(str(exc))
            raise
        try:
            admitted = await self.admit(prepared, route.endpoint, arrival_s, span)
        except BaseException as exc:  # cancelled too (e.g. waiting in admission): the lease goes back
            prepared.lease.release()
            span.end(str(exc))
            raise
        return self.start(
            prepared, route.endpoint, arrival_s, span, admitted, route.formatter, **route.extra(prepared)
        )

    # Sizes and counts are checked before anything reads, renders or tokenizes the prompts, which
    # then happens on the tokenizer pool, within the tenant's share of it (or on the loop, for a
    # prompt within the pool's `inline_max_bytes`).

    async def _prepare_chat(
        self,
        parse: Callable[[Mapping[str, Any], int], ChatCompletionRequest],
        request: Request,
        tenant: TenantContext,
        body: dict[str, Any],
        response_id: str,
    ) -> Prepared:
        """A chat (OpenAI's or Anthropic's body, by `parse`): its messages rendered by the chat template."""
        chat = parse(body, self.prompt_limits.max_chat_messages)
        lease, adapter_name = self._route(request, chat.model, tenant, response_id)
        try:
            prompt_builder, served = lease.version.prompts, lease.version.served
            assert prompt_builder is not None and served is not None  # a routed version is loaded
            messages = chat.prompt_messages()
            check_chat_size(messages, served.max_model_len, self._chars_per_token(prompt_builder))
            prompt = await prompt_builder.encode_chat_async(messages, self.tokenizer_pool, tenant.tenant_id)
        except BaseException:
            lease.release()
            raise
        return Prepared(
            tenant, response_id, chat.model, chat.options, (prompt,), lease, adapter_name, chat.tools
        )

    async def _prepare_completion(
        self, request: Request, tenant: TenantContext, body: dict[str, Any], response_id: str
    ) -> Prepared:
        """A completion: its prompts (texts or token ids) as they are."""
        completion = parse_completion_request(body, self._max_prompt_ids())
        lease, adapter_name = self._route(request, completion.model, tenant, response_id)
        try:
            prompt_builder, served = lease.version.prompts, lease.version.served
            assert prompt_builder is not None and served is not None
            check_prompt_sizes(
                completion.prompts, served.max_model_len, self._chars_per_token(prompt_builder)
            )
            prompts = await prompt_builder.encode_prompts_async(
                completion.prompts, self.tokenizer_pool, tenant.tenant_id
            )
        except BaseException:
            lease.release()
            raise
        return Prepared(
            tenant,
            response_id,
            completion.model,
            completion.options,
            tuple(prompts),
            lease,
            adapter_name,
            None,
        )

    async def admit(
        self, prepared: Prepared, endpoint: Endpoint, arrival_s: float, span: RequestSpan
    ) -> AdmittedRun:
        """Compile the request's constraint, build its engine requests within the key's limits and
        admit them; the caller releases `prepared.lease` if this raises."""
        lease, tenant = prepared.lease, prepared.tenant
        prompt_builder, served = lease.version.prompts, lease.version.served
        assert prompt_builder is not None and served is not None
        options = prepared.options
        constraint = await self._compile(options.constraint, lease, prompt_builder.vocab_size, tenant)
        requests = engine_requests(
            prepared.response_id,
            endpoint,
            prepared.prompts,
            options,
            tenant,
            arrival_s,
            served.max_model_len,
            constraint,
            prepared.adapter_name,
        )
        span.set_attributes(
            {
                "weir.request_id": prepared.response_id,
                "weir.tenant": tenant.tenant_id,
                "gen_ai.request.model": prepared.model,
            }
        )
        with span.child("admission"):
            admitted = await self.admission(tenant, requests)
        if isinstance(admitted, Admitted):
            return AdmittedRun(admitted.requests, admitted.settle, admitted.headers)
        return AdmittedRun(requests, admitted)

    def start(
        self,
        prepared: Prepared,
        endpoint: Endpoint,
        arrival_s: float,
        span: RequestSpan,
        admitted: AdmittedRun,
        formatter_type: type[ResponseFormatter],
        **extra: object,
    ) -> Response:
        """The response that runs an admitted request on its version's engine and answers it with
        `formatter_type` (given `extra` keywords); settling releases the lease."""
        lease, options = prepared.lease, prepared.options
        prompt_builder, served = lease.version.prompts, lease.version.served
        assert prompt_builder is not None and served is not None
        info = RequestInfo(
            prepared.response_id,
            endpoint,
            prepared.model,
            prepared.tenant,
            options.user,
            time.time(),
            arrival_s,
            lease.version.id,
            prepared.adapter_name,
        )
        formatter = formatter_type(
            prepared.response_id,
            int(info.created_at),
            prepared.model,
            served.fingerprint,
            prompt_builder.token_text,
            logprobs=options.logprobs is not None,
            include_usage=options.include_usage,
            tools=prepared.tools,
            **extra,
        )
        job = GenerationJob(
            engine=lease.engine,
            requests=admitted.requests,
            n=options.n,
            stream=options.stream,
            formatter=formatter,
            info=info,
            span=span,
            settle=_releasing(admitted.settle, lease),
            accountant=self.accountant,
            state=self.state,
            headers=((MODEL_VERSION_HEADER, lease.version.spec.version), *admitted.headers),
        )
        return _Started(GenerationResponse(job))

    async def _compile(
        self, spec: ConstraintSpec | None, lease: Lease, vocab_size: int, tenant: TenantContext
    ) -> CompiledConstraint | None:
        """The request's grammar, compiled for the version's tokenizer on the grammar workers,
        within the tenant's share of them."""
        if spec is None:
            return None
        tokenizer = lease.version.tokenizer
        if tokenizer is None:
            raise ServiceUnavailableError("the model version has no tokenizer loaded", code="model_not_ready")
        eos = getattr(tokenizer, "eos_token_id", None)
        stop_ids = [eos] if isinstance(eos, int) else []
        return await self.grammars.compile(spec, tokenizer, vocab_size, stop_ids, tenant.tenant_id)


def _releasing(settle: Settle, lease: Lease) -> Settle:
    """`settle`, then the request's hold on its version (a drain waits for it)."""

    def settle_and_release(record: UsageRecord) -> None:
        try:
            settle(record)
        finally:
            lease.release()

    return settle_and_release
