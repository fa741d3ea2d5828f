"""`weir serve`: build the engine, the tenancy pieces and the app from Settings, then serve.

Heavy imports (torch, the engine, SQLAlchemy) happen inside these functions, so `weir --help`
and the other subcommands start fast.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import math
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.routing import BaseRoute

from weir.engine.request import FinishReason
from weir.gateway.admission.accounting import Outcome, UsageJournal, UsageRecord, UsageSink
from weir.gateway.admission.controller import build_admission
from weir.gateway.admission.window_budget_gate import WindowBudgetMetrics
from weir.gateway.fleet import gc_pauses
from weir.gateway.metrics.admission_metrics import AdmissionMetrics
from weir.gateway.metrics.metrics_server import MetricsListener
from weir.gateway.metrics.registry import GatewayMetrics
from weir.gateway.routes.openai import Authenticate
from weir.gateway.server.app import create_app
from weir.gateway.server.uvicorn_runner import run_server
from weir.gateway.settings.settings import (
    AttentionBackend,
    AuthMode,
    CpuRowWeightsMode,
    CudaGraphsMode,
    LogLevel,
    Settings,
)
from weir.tenancy.store.enums import UsageStatus
from weir.tenancy.usage.usage_records import UsageRecordIn

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from weir.engine.config import EngineConfig, LoraConfig
    from weir.gateway.fleet.model_fleet import ModelFleet
    from weir.gateway.fleet.model_rollout import ModelRollout
    from weir.gateway.http.admin_auth import AdminAuthenticator
    from weir.gateway.http.auth import Authenticator
    from weir.tenancy.catalog.adapters import AdapterRepo
    from weir.tenancy.catalog.model_versions import ModelVersionRepo
    from weir.tenancy.repository.repo import TenancyRepo
    from weir.tenancy.responses.response_records import ResponseStore
    from weir.tenancy.usage.usage_writer import UsageWriterStats

logger = logging.getLogger("weir.serve")

# The engine keeps one block back (the null block), so a pool of N tokens needs one more block.
_RESERVED_BLOCKS = 1


def configure_logging(level: LogLevel) -> None:
    """Plain logging to stderr at `level` (uvicorn configures its own loggers)."""
    logging.basicConfig(
        level=level.value.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def resolve_model_path(settings: Settings) -> Path:
    """`--model`, or the default SmolLM2 prepared into the cache (converted once if missing)."""
    if settings.model_path is not None:
        return settings.model_path
    from weir.engine.runner.model_prepare import ensure_default_model

    return ensure_default_model(settings.cache_dir)


def resolve_device(settings: Settings) -> str:
    """`--device`, else cuda when available, else cpu."""
    if settings.device:
        return settings.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def set_engine_threads(settings: Settings, device: str) -> int | None:
    """Set torch's intra-op threads for the engine (`Settings.engine_threads`, on the cores this
    process may run on), before any engine is built; the count set, None on a GPU.

    On the shared 2-core machine one thread beside a core left to the front end served the
    noisy-neighbour trace's quiet tenant 32-33/48 against 11-15/48 with two, and guidellm at
    1.07x the tokens/s (docs/benchmarks.md): two threads on two cores spin at every op's barrier
    whenever the event loop, a tokenizer or the client takes a core, and the fitted step cost
    the scheduler plans with swung 0-57 ms per decode row. The cores are the affinity narrowed by
    a cgroup CPU quota (a Kubernetes CPU limit; gateway/server/cpu_cores.py)."""
    import torch

    from weir.gateway.server.cpu_cores import usable_cores

    threads = settings.engine_threads(device, usable_cores())
    if threads is not None:
        torch.set_num_threads(threads)
    return threads


def engine_config(settings: Settings, model_path: Path, device: str) -> EngineConfig:
    """The EngineConfig for these settings."""
    from weir.engine.config import CacheConfig, EngineConfig, MaskConfig, SchedulerConfig
    from weir.engine.latency_targets import class_targets_for
    from weir.engine.runner.loader import load_model_config
    from weir.engine.speculative_config import SpeculativeConfig
    from weir.gateway.server.cpu_cores import usable_cores

    dtype = settings.resolved_dtype(device)
    block_size = CacheConfig().block_size
    num_blocks = None
    if settings.kv_cache_tokens is not None:
        num_blocks = math.ceil(settings.kv_cache_tokens / block_size) + _RESERVED_BLOCKS
    max_model_len = settings.max_model_len or load_model_config(model_path).max_model_len
    use_triton, use_cuda_graphs = _kernel_choices(settings, device)
    return EngineConfig(
        model_path=str(model_path),
        dtype=dtype,
        device=device,
        cache=CacheConfig(
            block_size=block_size,
            num_blocks=num_blocks,
            kv_dtype=dtype,
            enable_prefix_caching=settings.prefix_caching,
            tenant_cache_share=settings.tenant_cache_share,
            host_num_blocks=math.ceil(settings.host_kv_cache_tokens / block_size),
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=settings.max_num_batched_tokens,
            max_num_seqs=settings.max_num_seqs,
            max_model_len=max_model_len,
            queue_policy=settings.queue_policy,
            target_step_s=settings.resolved_target_step_s(device),
            class_targets=class_targets_for(device),
            admission_hold_s=settings.admission_hold_ms / 1e3,
        ),
        use_triton=use_triton,
        use_cuda_graphs=use_cuda_graphs,
        cpu_row_weights=_row_weights_choice(settings),
        cpu_wide_step_threads=settings.wide_step_threads(device, usable_cores()),
        cpu_wide_step_rows=settings.cpu_wide_step_rows,
        cpu_kernel_pool=settings.cpu_kernel_pool,
        cpu_decode_layers=settings.cpu_decode_layers,
        speculative=SpeculativeConfig.parse(settings.speculative, settings.num_speculative_tokens),
        lora=lora_config(settings),
        masks=MaskConfig(
            num_workers=settings.grammar_mask_workers,
            max_workers=settings.grammar_mask_workers + settings.grammar_mask_extra_workers,
            timeout_s=settings.grammar_mask_timeout_s,
            queue_timeout_s=6 * settings.grammar_mask_timeout_s,
        ),
        kv_store=settings.kv_store_config(),
    )


def lora_config(settings: Settings) -> LoraConfig:
    """LoRA slots when an adapter directory is set (`--adapter-dir`), else none."""
    from weir.engine.config import LoraConfig

    if settings.adapter_dir is None:
        return LoraConfig()
    return LoraConfig(
        num_slots=settings.lora_slots, max_rank=settings.lora_max_rank, adapter_dir=str(settings.adapter_dir)
    )


def _row_weights_choice(settings: Settings) -> bool | None:
    """EngineConfig.cpu_row_weights: None (the engine's auto), or the explicit on / off (on where the
    engine cannot honour it stops start-up with EngineConfig's ValueError)."""
    mode = settings.cpu_row_weights
    return None if mode is CpuRowWeightsMode.AUTO else mode is CpuRowWeightsMode.ON


class KernelChoiceError(ValueError):
    """An explicit --attention-backend / --cuda-graphs choice this device cannot honour."""


def _kernel_choices(settings: Settings, device: str) -> tuple[bool | None, bool | None]:
    """EngineConfig's use_triton and use_cuda_graphs (None: the engine's auto); explicit choices
    the device cannot honour are refused here, naming the flag, rather than ignored."""
    cuda = device.startswith("cuda")
    backend, graphs = settings.attention_backend, settings.cuda_graphs
    if backend is AttentionBackend.TRITON and not cuda:
        raise KernelChoiceError(f"--attention-backend triton needs a CUDA device, got device {device!r}")
    if graphs is CudaGraphsMode.ON and not cuda:
        raise KernelChoiceError(f"--cuda-graphs on needs a CUDA device, got device {device!r}")
    if graphs is CudaGraphsMode.ON and backend is AttentionBackend.TORCH:
        raise KernelChoiceError(
            "--cuda-graphs on needs the Triton attention backend, got --attention-backend torch"
        )
    use_triton = None if backend is AttentionBackend.AUTO else backend is AttentionBackend.TRITON
    use_cuda_graphs = None if graphs is CudaGraphsMode.AUTO else graphs is CudaGraphsMode.ON
    return use_triton, use_cuda_graphs


@dataclass
class TenancyWiring:
    """What tenancy adds to the app: key checks, admin routes, usage records, lifecycle hooks."""

    authenticate: Authenticate | None = None
    usage_sink: UsageSink | None = None
    usage_journal: UsageJournal | None = None  # streams' provisional records (billed after a crash)
    routes: list[BaseRoute] = field(default_factory=list)
    num_tenants: int = 0
    start: Callable[[], Awaitable[None]] | None = None
    close: Callable[[], Awaitable[None]] | None = None
    admin_auth: AdminAuthenticator | None = None  # also guards the prefix-cache admin routes
    usage_stats: Callable[[], UsageWriterStats] | None = None  # the usage writer's, for metrics
    model_versions: ModelVersionRepo | None = (
        None  # the model-version records (weir.gateway.fleet.model_rollout)
    )
    adapters: AdapterRepo | None = None  # the LoRA adapter records (weir.gateway.fleet.adapter_rollout)
    # The admin console (/admin/ui) calls these in-process, as the admin API does.
    repo: TenancyRepo | None = None
    response_store: ResponseStore | None = None  # stored /v1/responses, in the database
    authenticator: Authenticator | None = None


_STATUS_OF = {
    Outcome.COMPLETED: UsageStatus.COMPLETED,
    Outcome.FAILED: UsageStatus.FAILED,
    Outcome.CLIENT_DISCONNECTED: UsageStatus.CANCELLED,
    Outcome.CANCELLED: UsageStatus.CANCELLED,
}


def to_usage_record_in(record: UsageRecord) -> UsageRecordIn:
    """The gateway's usage record as tenancy stores it (times in ms, one finish reason)."""
    try:
        finish: FinishReason | None = FinishReason(record.finish_reasons[0])
    except (IndexError, ValueError):
        finish = None
    return UsageRecordIn(
        request_id=record.request_id,
        tenant_id=record.tenant_id,
        key_id=record.key_id,
        model=record.model,
        status=_STATUS_OF[record.outcome],
        prompt_tokens=record.usage.billed_prompt_tokens,  # computed: a prefill cut short, only its part
        completion_tokens=record.usage.billed_completion_tokens,  # computed: every beam of a beam search
        cached_tokens=min(record.usage.cached_tokens, record.usage.billed_prompt_tokens),
        ttft_ms=None if record.ttft_s is None else max(record.ttft_s, 0.0) * 1000,
        e2e_ms=record.duration_s * 1000,
        finish_reason=finish,
        created_at=dt.datetime.fromtimestamp(record.created_at, tz=dt.UTC),
        model_version=record.model_version,
        user=record.user,
        adapter=record.adapter,
        endpoint=record.endpoint.value,
    )


def build_tenancy(settings: Settings) -> TenancyWiring:
    """Open (and on SQLite, migrate) the database; build authenticators and admin routes.

    A brand-new, empty SQLite database (the embedded default) is created at the newest schema so
    a fresh install just works; any database with tables must already be at head, or start-up
    stops and names `weir db upgrade`.
    """
    from sqlalchemy import inspect

    from weir.gateway.http.admin_auth import AdminAuthenticator
    from weir.gateway.http.auth import Authenticator
    from weir.gateway.http.auth_settings import AuthSettings
    from weir.gateway.routes.admin import admin_routes
    from weir.migrations.migrate import check_migrated, upgrade
    from weir.tenancy.catalog.adapters import AdapterRepo
    from weir.tenancy.catalog.model_versions import ModelVersionRepo
    from weir.tenancy.keys.keys import KeyHasher
    from weir.tenancy.repository.admin_token import admin_token_banner, ensure_admin_token
    from weir.tenancy.repository.repo import TenancyRepo
    from weir.tenancy.responses.response_repo import DatabaseResponseStore
    from weir.tenancy.store.db import Database
    from weir.tenancy.store.enums import KeyScope
    from weir.tenancy.usage.usage_writer import UsageWriter

    db = Database(settings.resolved_database_url)
    if db.backend == "sqlite" and not inspect(db.engine).get_table_names():
        # First start of the embedded default: an empty SQLite file is created at head. Any
        # database that already has tables is never migrated behind the operator's back.
        upgrade(db.engine)
    check_migrated(db.engine)
    repo = TenancyRepo(db, KeyHasher.from_pepper(settings.key_pepper))
    token = ensure_admin_token(repo, settings.admin_token)
    if token is not None:
        print(admin_token_banner(token), flush=True)  # shown once, never logged
    authenticator = Authenticator(repo, AuthSettings(cache_ttl_s=settings.auth_cache_ttl_s))
    admin_auth = AdminAuthenticator(repo, settings.admin_token)
    # Usage is billing data: records are fsync'd here before the database sees them, and
    # replayed from here after an outage or a crash (tenancy/usage/usage_writer.py).
    writer = UsageWriter(repo, usage_spool_dir(settings))
    responses = DatabaseResponseStore(db, settings.response_storage_limits)

    def sink(record: UsageRecord) -> None:
        writer.submit(to_usage_record_in(record))  # queued; written in batches on its own thread

    def journal(record: UsageRecord) -> None:
        # A stream's record (before its first byte, as it goes, before its last byte) in the spool
        # file now: one write call, which a process crash keeps; fsync'd with the spool thread's
        # batch window (docs/decisions.md, eighteenth and twentieth stops).
        writer.write_now(to_usage_record_in(record))

    async def start() -> None:
        await asyncio.to_thread(writer.start)  # opens the spool; replays what a crash left

    async def close() -> None:
        # After the requests settled (the lifespan waits): flush their usage, then close the pool.
        await asyncio.to_thread(writer.close)
        db.dispose()

    return TenancyWiring(
        # The OpenAI routes need the inference scope; a usage-only key may only read its usage.
        authenticate=functools.partial(authenticator.authenticate_async, scope=KeyScope.INFERENCE),
        usage_sink=sink,
        usage_journal=UsageJournal(write=journal),
        routes=admin_routes(repo, authenticator, admin_auth, responses),
        num_tenants=len(repo.list_tenants()),
        start=start,
        close=close,
        admin_auth=admin_auth,
        usage_stats=writer.stats,
        model_versions=ModelVersionRepo(db),
        adapters=AdapterRepo(db),
        repo=repo,
        authenticator=authenticator,
        response_store=responses,
    )


def usage_spool_dir(settings: Settings) -> Path:
    """Where usage records wait for the database: inside the data directory, on local disk."""
    return settings.data_dir / "usage-spool"


def resolve_auth(settings: Settings, num_tenants: int) -> AuthMode:
    """The auth mode: explicit, else `none` only for a fresh local install (see Settings)."""
    mode = settings.auth_mode
    if settings.auth is None and mode is AuthMode.NONE and num_tenants > 0:
        # Once an admin has created tenants, their keys must count, even on loopback.
        return AuthMode.KEYS
    return mode


def build_metrics(fleet: ModelFleet, tenancy: TenancyWiring, default_name: str) -> GatewayMetrics:
    """The app's registry, complete before anything uses it: the gateway's own metrics, every
    engine's load (labelled by model version), the serving version's prefix cache and, with
    tenancy, the usage-record writer."""
    from weir.gateway.metrics.engine_collectors import (
        AdapterMetricsCollector,
        FleetStatsCollector,
        ServerLoadCollector,
    )
    from weir.gateway.metrics.prefix_cache_metrics import PrefixCacheCollector
    from weir.gateway.metrics.usage_metrics import UsageRecordsCollector
    from weir.gateway.server.fleet_setup import primary_prefix_stats

    collectors: list[Collector] = [
        FleetStatsCollector(fleet.stats_by_version),
        ServerLoadCollector(fleet.stats),  # the pod's total, for routers and autoscalers
        AdapterMetricsCollector(fleet.stats_by_version),
        PrefixCacheCollector(functools.partial(primary_prefix_stats, fleet, default_name)),
    ]
    if tenancy.usage_stats is not None:
        collectors.append(UsageRecordsCollector(tenancy.usage_stats))
    return GatewayMetrics(None, collectors=collectors)


def start_fleet(settings: Settings, tenancy: TenancyWiring) -> tuple[ModelFleet, ModelRollout, str]:
    """Build the fleet and load, before the server listens: the `--model` version (registered if
    absent) and every version recorded as ready, with their split and pins. Returns the fleet,
    its rollout control and the default model name."""
    from weir.gateway.fleet.model_rollout import ModelRollout
    from weir.gateway.server.fleet_setup import build_fleet, check_startup_record, startup_spec
    from weir.tenancy.errors import ModelVersionNotFoundError

    model_path = resolve_model_path(settings)
    device = resolve_device(settings)
    engine_config(settings, model_path, device)  # an impossible kernel choice stops here, naming its flag
    set_engine_threads(settings, device)
    fleet = build_fleet(settings, device, functools.partial(engine_config, settings, device=device))
    spec = startup_spec(settings, model_path)
    assert tenancy.model_versions is not None
    rollout = ModelRollout(fleet, tenancy.model_versions)
    try:
        recorded = tenancy.model_versions.get(spec.name, spec.version).path
    except ModelVersionNotFoundError:
        recorded = None
    check_startup_record(spec, recorded)
    # Loads warm up with a generation, which needs an event loop: a short-lived one here, so a
    # model that cannot load stops `weir serve` before it listens, as before.
    asyncio.run(rollout.start(spec))
    return fleet, rollout, spec.name


def serve(settings: Settings) -> int:
    """`weir serve`: load, wire, serve until SIGTERM; the exit status."""
    configure_logging(settings.log_level)
    return run_server(build_server_app(settings), settings)


def build_server_app(settings: Settings) -> Starlette:
    """Everything `weir serve` serves, loaded and warm (end-to-end tests serve it in a thread).

    Every collaborator is built before the app and passed in: the fleet of model versions (loaded
    and warm), the metrics registry, then admission (counting into it) and the metrics listener.
    """
    from weir.gateway.fleet.adapter_catalog import AdapterCatalog
    from weir.gateway.fleet.adapter_rollout import AdapterRollout
    from weir.gateway.routes.adapters_admin import adapters_admin_routes
    from weir.gateway.routes.models_admin import models_admin_routes
    from weir.gateway.server.fleet_setup import prefix_cache_target

    tenancy = build_tenancy(settings)
    auth = resolve_auth(settings, tenancy.num_tenants)
    if auth is AuthMode.NONE:
        logger.warning(
            "auth mode 'none': every request is served as the 'default' tenant, whatever key it sends "
            "(a fresh install on %s). Pass --auth keys to require API keys.",
            settings.host,
        )
    fleet, rollout, default_name = start_fleet(settings, tenancy)
    metrics = build_metrics(fleet, tenancy, default_name)
    startup_hooks: list[Callable[[], Awaitable[None]]] = []
    shutdown_hooks: list[Callable[[], Awaitable[None]]] = [fleet.shutdown]
    if tenancy.start is not None:
        startup_hooks.append(tenancy.start)
    catalog = AdapterCatalog()
    adapter_rollout = None
    if tenancy.adapters is not None:
        # On the serving loop, before it listens: the adapters recorded as loaded, on their engines.
        adapter_rollout = AdapterRollout(fleet, tenancy.adapters, catalog)
        startup_hooks.append(adapter_rollout.start)
        rollout.retire_hooks.append(adapter_rollout.version_retired)
    if tenancy.close is not None:
        shutdown_hooks.append(tenancy.close)
    kwargs: dict[str, Any] = {}
    on_budget_change: Callable[[], Awaitable[None]] | None = None  # the window-budget gate's refresh
    if settings.admission:
        admission = build_admission(
            settings, fleet.stats, AdmissionMetrics(metrics.registry), WindowBudgetMetrics(metrics.registry)
        )
        startup_hooks.append(admission.start)
        shutdown_hooks.append(admission.close)  # after requests settled: unused leases go back
        kwargs["admission"] = admission
        if admission.window_budgets is not None:
            on_budget_change = admission.window_budgets.refresh_now
    if auth is AuthMode.KEYS:
        kwargs["authenticate"] = tenancy.authenticate
        kwargs["usage_sink"] = tenancy.usage_sink
        kwargs["usage_journal"] = tenancy.usage_journal
        # Stored responses are the tenant's data: in its database, deleted with it. (Auth mode
        # `none` serves a tenant with no row there: its responses stay in memory.)
        kwargs["response_store"] = tenancy.response_store
    extra_routes = list(tenancy.routes)
    if tenancy.admin_auth is not None:
        from weir.gateway.routes.prefix_cache import prefix_cache_routes

        # Before the /admin/v1 mount, whose catch-all would answer these paths with 404.
        select = functools.partial(prefix_cache_target, fleet, default_name)
        extra_routes[:0] = [
            *prefix_cache_routes(None, tenancy.admin_auth, None, select),
            *models_admin_routes(rollout, tenancy.admin_auth),
        ]
        if tenancy.repo is not None:
            from weir.gateway.routes.spend_admin import spend_admin_routes

            # prices, budgets; a change applies on this replica before the answer
            spend = spend_admin_routes(tenancy.repo.db, tenancy.admin_auth, on_budget_change)
            extra_routes[:0] = spend
        if adapter_rollout is not None:
            extra_routes[:0] = adapters_admin_routes(adapter_rollout, tenancy.admin_auth)
        if tenancy.repo is not None and tenancy.authenticator is not None:
            from weir.gateway.console.routes import ConsoleDeps, console_routes

            extra_routes += console_routes(
                ConsoleDeps(
                    tenancy.repo,
                    tenancy.authenticator,
                    tenancy.admin_auth,
                    fleet.stats_by_version,
                    rollout,
                    metrics=metrics,
                )
            )
        # On the API port /metrics needs the admin token: it names every tenant and its traffic.
        kwargs["metrics_auth"] = tenancy.admin_auth.authenticate_async
    if settings.metrics_port:
        # Started last (the engine is warm) and stopped last (the final scrape sees the drain).
        listener = MetricsListener(metrics, settings.host, settings.metrics_port)
        startup_hooks.append(listener.start)
        shutdown_hooks.append(listener.stop)
    # Last: the heap is frozen once everything the server keeps is loaded (gateway/fleet/gc_pauses.py).
    freeze_start, freeze_stop = gc_pauses.lifespan_hooks(metrics.registry, settings.gc_freeze)
    startup_hooks.append(freeze_start)
    shutdown_hooks.append(freeze_stop)
    return create_app(
        settings,
        None,
        None,
        fleet=fleet,
        metrics=metrics,
        adapters=catalog,
        extra_routes=extra_routes,
        on_startup=startup_hooks,
        on_shutdown=shutdown_hooks,
        **kwargs,
    )
