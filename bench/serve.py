"""`weir bench serve`: set up keys and model, run the load, write report.json/.md, plots and records."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from weir_bench.arrivals import ArrivalSpec
from weir_bench.loadgen import BodyOptions, LoadOptions, LoadResult, plan_requests, run_load, server_root
from weir_bench.metadata import git_commit
from weir_bench.records import write_records
from weir_bench.report import SLO, RunInfo, build_report, render_markdown
from weir_bench.tenants import TenantSetupError, create_tenants, keys_from_file, load_tenants
from weir_bench.workloads import file_sha256, load_trace, take

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
REQUESTS_JSONL = "requests.jsonl"


class BenchSetupError(RuntimeError):
    """The run could not start (no model, no keys, tenants not created); nothing was sent."""


@dataclass(frozen=True)
class ServeConfig:
    """Everything `bench serve` needs; the CLI fills it from flags."""

    url: str
    workload: Path
    out_dir: Path
    arrival: ArrivalSpec = ArrivalSpec()
    options: LoadOptions = LoadOptions()
    slo: SLO = SLO()
    model: str | None = None
    api_key: str | None = None
    tenants_file: Path | None = None
    create_tenants: bool = False
    admin_token: str | None = None
    admin_url: str | None = None  # server root of the admin API; the --url's root by default
    limit: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    body_options: BodyOptions = BodyOptions()
    command: str = ""

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError("limit must be >= 1")
        if self.create_tenants and (self.tenants_file is None or not self.admin_token):
            raise ValueError("create_tenants needs tenants_file and admin_token")


@dataclass(frozen=True)
class ServeResult:
    """What a run produced."""

    report: dict[str, Any]
    load: LoadResult
    files: tuple[Path, ...]


async def _tenant_keys(client: httpx.AsyncClient, config: ServeConfig) -> dict[str, str]:
    if config.tenants_file is None:
        return {}
    specs = load_tenants(config.tenants_file)
    if not config.create_tenants:
        return keys_from_file(specs)
    root = server_root(config.admin_url or config.url)
    try:
        return await create_tenants(client, root, config.admin_token or "", specs)
    except (httpx.HTTPError, ValueError) as exc:
        raise BenchSetupError(f"creating tenants at {root}: {exc}") from exc
    except TenantSetupError as exc:
        raise BenchSetupError(str(exc)) from exc


async def list_models(client: httpx.AsyncClient, url: str, api_key: str | None) -> list[dict[str, Any]]:
    """The entries of GET /v1/models (empty if the server has no such route)."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    resp = await client.get(f"{server_root(url)}/v1/models", headers=headers)
    if resp.status_code != 200:
        return []
    data = resp.json()
    entries = data.get("data") if isinstance(data, dict) else None
    return [e for e in entries or [] if isinstance(e, dict) and isinstance(e.get("id"), str)]


async def _pick_model(
    client: httpx.AsyncClient, config: ServeConfig, key: str | None
) -> tuple[str, dict | None]:
    try:
        entries = await list_models(client, config.url, key)
    except (httpx.HTTPError, ValueError) as exc:
        if config.model is None:
            raise BenchSetupError(f"GET /v1/models failed ({exc}); give --model") from exc
        entries = []
    if config.model is None:
        if not entries:
            raise BenchSetupError("the server lists no models; give --model")
        return entries[0]["id"], entries[0]
    entry = next((e for e in entries if e["id"] == config.model), None)
    return config.model, entry


async def run_serve(config: ServeConfig) -> ServeResult:
    """Run one serving benchmark and write its outputs into `config.out_dir`."""
    requests = take(load_trace(config.workload), config.limit)
    if not requests:
        raise BenchSetupError(f"{config.workload} holds no requests")
    async with httpx.AsyncClient(timeout=httpx.Timeout(config.options.timeout_s), trust_env=False) as client:
        keys = await _tenant_keys(client, config)
        any_key = config.api_key or next(iter(keys.values()), None)
        model, entry = await _pick_model(client, config, any_key)
    try:
        plans = plan_requests(
            requests,
            base_url=config.url,
            model=model,
            arrival=config.arrival,
            tenant_keys=keys,
            default_key=config.api_key,
            body_options=config.body_options,
        )
    except ValueError as exc:
        raise BenchSetupError(str(exc)) from exc
    load = await run_load(plans, config.arrival, config.options)
    info = RunInfo(
        url=config.url,
        model=model,
        workload=str(config.workload),
        workload_sha256=file_sha256(config.workload),
        arrival=config.arrival,
        options=config.options,
        slo=config.slo,
        limit=config.limit,
        command=config.command,
        labels=dict(config.labels),
        server_model=entry,
        tenant_keys="per_tenant" if keys else "single" if config.api_key else "none",
        git_commit=git_commit(),
    )
    report = build_report(load, info)
    return ServeResult(report=report, load=load, files=tuple(write_outputs(config.out_dir, report, load)))


def write_outputs(out_dir: Path, report: dict[str, Any], load: LoadResult) -> list[Path]:
    """report.json, report.md, requests.jsonl and the plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_records(load.records, out_dir / REQUESTS_JSONL)
    from weir_bench.plots import write_plots  # matplotlib (the `bench` extra) only when plotting

    plots = write_plots(
        load.records, out_dir, title=f"{report['metadata']['model']} - {report['metadata']['workload']}"
    )
    (out_dir / REPORT_JSON).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out_dir / REPORT_MD).write_text(render_markdown(report, [p.name for p in plots]), encoding="utf-8")
    return [out_dir / REPORT_JSON, out_dir / REPORT_MD, out_dir / REQUESTS_JSONL, *plots]
