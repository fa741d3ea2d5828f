"""The app factory: one Starlette app around a fleet of model versions (or one engine), with its
own metrics and tracer.

Everything the app needs is passed in (engine or fleet, tokenizer, hooks); nothing is global, so
tests build as many apps as they like, each with a fake engine, a stub authenticator and an
in-memory span exporter.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from opentelemetry.sdk.trace import TracerProvider
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from weir.engine.client import EngineClient
from weir.engine.request import Priority
from weir.gateway.admission.accounting import Accountant, Admission, UsageJournal, UsageSink, admit_all
from weir.gateway.api.openapi import LiveDocument
from weir.gateway.fleet.adapter_catalog import AdapterCatalog
from weir.gateway.fleet.fleet_types import model_fingerprint
from weir.gateway.fleet.model_fleet import ModelFleet, single_engine_fleet
from weir.gateway.http.body_limit import BodyLimitMiddleware
from weir.gateway.http.error_tarpit import DEFAULT_LIMITS, ErrorTarpitMiddleware, TarpitLimits
from weir.gateway.http.errors import NotFoundError, exception_handlers
from weir.gateway.metrics.registry import GatewayMetrics
from weir.gateway.metrics.tracing import RequestTracer, build_tracer_provider
from weir.gateway.prompts.grammar import GrammarLimits, GrammarService
from weir.gateway.prompts.prompt_limits import PromptLimits
from weir.gateway.prompts.tokenization import Tokenizer
from weir.gateway.prompts.tokenizer_pool import TokenizerPool
from weir.gateway.routes.gateway_state import GatewayState
from weir.gateway.routes.openai import Authenticate, OpenAIRoutes
from weir.gateway.routes.response_writes import PendingWrites
from weir.gateway.routes.responses import ResponsesRoutes, ResponseSweeper
from weir.gateway.routes.tokenize import TokenizeRoutes
from weir.gateway.settings.settings import AuthMode, Settings
from weir.tenancy.context import QuotaLimits, TenantContext
from weir.tenancy.responses.memory_responses import MemoryResponseStore
from weir.tenancy.responses.response_records import ResponseStore

logger = logging.getLogger(__name__)

Hook = Callable[[], Awaitable[None]]
# (Authorization header, client address) -> None, or raises a WeirError (401/429).
AdminCheck = Callable[[str | None, str], Awaitable[None]]

ANONYMOUS_TENANT = TenantContext(
    tenant_id="default",
    key_id="anonymous",
    priority=Priority.STANDARD,
    weight=1.0,
    cache_scope="default",
    quota=QuotaLimits(),
)


async def authenticate_anonymous(authorization: str | None, client_addr: str) -> TenantContext:
    """Auth mode `none`: every caller is the default tenant, whatever key it sends."""
    return ANONYMOUS_TENANT


__all__ = ["ANONYMOUS_TENANT", "authenticate_anonymous", "create_app", "model_fingerprint"]


def create_app(
    settings: Settings,
    engine: EngineClient | None,
    tokenizer: Tokenizer | None,
    *,
    max_model_len: int | None = None,
    model_name: str | None = None,
    vocab_size: int | None = None,
    authenticate: Authenticate | None = None,
    admission: Admission = admit_all,
    usage_sink: UsageSink | None = None,
    usage_journal: UsageJournal | None = None,
    metrics: GatewayMetrics | None = None,
    tracer_provider: TracerProvider | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    on_startup: Sequence[Hook] = (),
    on_shutdown: Sequence[Hook] = (),
    metrics_auth: AdminCheck | None = None,
    error_tarpit: TarpitLimits | None = DEFAULT_LIMITS,
    fleet: ModelFleet | None = None,
    adapters: AdapterCatalog | None = None,
    response_store: ResponseStore | None = None,
) -> Starlette:
    """Build the gateway app from collaborators built beforehand.

    `fleet` serves every model version it holds (`weir serve`); without one, `engine`,
    `tokenizer` and `max_model_len` are served as the one version `default` of `model_name`.

    `authenticate` maps (Authorization header, client address) to a tenant or raises a
    `WeirError`; without one, auth mode `none` serves everyone as the default tenant and auth mode
    `keys` is refused. `metrics` None builds a registry of the gateway's own metrics only (the
    server passes one with the admission, prefix-cache and usage collectors on it).
    `tracer_provider` None builds one from the settings (none, console, otlp).
    `on_startup`/`on_shutdown` run in the lifespan (e.g. `engine.start`, `engine.shutdown`).
    `/metrics` names every tenant, so on this (the API) port it answers only callers that
    `metrics_auth` accepts (the admin token); without one it is not served here (404) and
    Prometheus scrapes the metrics listener (weir.gateway.metrics.metrics_server).
    `adapters` holds the LoRA adapters loaded on the fleet's engines (`model` may name one).
    `response_store` keeps the stored answers of `/v1/responses` (the tenancy database under
    `weir serve` with keys); None keeps them in memory, within the settings' quota and retention.
    `error_tarpit` delays the 4xx answers of a client in a tight error loop (weir.gateway.http.error_tarpit);
    None turns it off.
    """
    if authenticate is None:
        if settings.auth_mode is AuthMode.KEYS:
            raise ValueError("authenticate is required when auth mode is 'keys'")
        authenticate = authenticate_anonymous
    if fleet is None:
        if engine is None or tokenizer is None or max_model_len is None:
            raise ValueError("engine, tokenizer and max_model_len are required without a fleet")
        name = model_name or settings.model_name()
        fingerprint = model_fingerprint(
            name, max_model_len, settings.resolved_dtype(settings.device or "cpu")
        )
        fleet = single_engine_fleet(
            name,
            engine,
            tokenizer,
            max_model_len=max_model_len,
            vocab_size=vocab_size,
            fingerprint=fingerprint,
        )
    state = GatewayState()
    metrics = metrics if metrics is not None else GatewayMetrics(fleet.stats)
    tracer = RequestTracer(
        tracer_provider
        or build_tracer_provider(settings.otel_exporter, settings.otel_endpoint, settings.otel_service_name)
    )
    openai_routes = OpenAIRoutes(
        fleet=fleet,
        adapters=adapters,
        authenticate=authenticate,
        admission=admission,
        accountant=Accountant(metrics, usage_sink, usage_journal),
        tracer=tracer,
        state=state,
        tokenizer_pool=TokenizerPool(
            settings.tokenizer_workers, settings.tokenizer_tenant_share, settings.tokenizer_inline_bytes
        ),
        prompt_limits=PromptLimits(settings.max_chat_messages, settings.prompt_chars_per_token),
        grammars=GrammarService(
            GrammarLimits(
                compile_timeout_s=settings.grammar_compile_timeout_s,
                num_workers=settings.grammar_compile_workers,
            ),
            metrics.registry,
        ),
    )

    async def openapi(request: Request) -> Response:
        primary = fleet.primary()
        vocab_size = (
            primary.prompts.vocab_size if primary is not None and primary.prompts is not None else None
        )
        body = document.render([m.name for m in fleet.served_models()], vocab_size)
        return Response(body, media_type="application/json")

    if response_store is None:
        response_store = MemoryResponseStore(settings.response_storage_limits)
    timeout_s = settings.response_store_timeout_s
    sweeper = ResponseSweeper(response_store, settings.response_sweep_interval_s, timeout_s)
    responses = ResponsesRoutes(
        openai_routes,
        response_store,
        timeout_s=timeout_s,
        writes=PendingWrites(response_store, timeout_s, metrics.registry),
    )
    routes: list[BaseRoute] = [
        *_operations_routes(fleet, state, metrics, metrics_auth),
        Route("/openapi.json", openapi, methods=["GET"]),
        *openai_routes.routes(),
        *responses.routes(),
        *TokenizeRoutes(openai_routes).routes(),
        *extra_routes,
    ]
    document = LiveDocument(mounted=[r.path for r in routes if isinstance(r, Route | Mount)])
    # Only a request whose key was verified counts its errors against that key (issue 21).
    tarpit = (
        [] if error_tarpit is None else [Middleware(ErrorTarpitMiddleware, error_tarpit, proof_required=True)]
    )
    app = Starlette(
        routes=routes,
        middleware=[
            *tarpit,  # outermost: it also sees the body limit's refusals
            Middleware(
                BodyLimitMiddleware,
                max_body_bytes=settings.max_request_body_bytes,
                count_error=metrics.count_error,
            ),
        ],
        exception_handlers=exception_handlers(metrics.count_error),
        lifespan=_lifespan(
            state, tracer, [*on_startup, sweeper.start], [sweeper.stop, responses.writes.drain, *on_shutdown]
        ),
    )
    app.state.gateway = state
    app.state.fleet = fleet
    app.state.adapters = openai_routes.adapters
    app.state.metrics = metrics
    app.state.tracer = tracer
    return app


def _operations_routes(
    engine: ModelFleet, state: GatewayState, metrics: GatewayMetrics, metrics_auth: AdminCheck | None
) -> list[BaseRoute]:
    """`/health` (an engine lives), `/ready` (a version serves and we are not draining), `/metrics`."""

    async def health(request: Request) -> Response:
        h = engine.health()
        return JSONResponse(
            {"status": "ok" if h.alive else "dead", "detail": h.detail}, 200 if h.alive else 503
        )

    async def ready(request: Request) -> Response:
        h = engine.health()
        if state.draining:
            return JSONResponse({"status": "draining"}, 503)
        return JSONResponse(
            {"status": "ready" if h.ready else "not_ready", "detail": h.detail}, 200 if h.ready else 503
        )

    async def metrics_endpoint(request: Request) -> Response:
        if metrics_auth is None:
            raise NotFoundError("/metrics is served on the metrics port")
        await metrics_auth(
            request.headers.get("authorization"), request.client.host if request.client else ""
        )
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    return [
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]


def _lifespan(
    state: GatewayState, tracer: RequestTracer, on_startup: Sequence[Hook], on_shutdown: Sequence[Hook]
) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    """Start hooks in order; at shutdown wait for requests to settle, then the stop hooks."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for hook in on_startup:
            await hook()
        try:
            yield
        finally:
            if not await state.wait_idle():
                logger.warning("%d requests still settling at shutdown", state.num_active)
            for hook in on_shutdown:
                try:
                    await hook()
                except Exception:
                    logger.exception("shutdown hook failed")
            tracer.shutdown()

    return lifespan
