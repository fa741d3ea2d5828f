"""The server's own settings: where it listens and keeps its state, who may call it, how it logs,
traces and shuts down, and how the Python process runs (GIL, garbage collector)."""

from __future__ import annotations

from pathlib import Path

from pydantic.dataclasses import dataclass

from weir.gateway.settings.setting_field import setting
from weir.gateway.settings.settings_enums import AuthMode, LogLevel, OtelExporter
from weir.gateway.settings.settings_parsing import parse_forwarded_allow_ips
from weir.tenancy.responses.response_records import (
    DEFAULT_QUOTA_BYTES,
    DEFAULT_RETENTION_S,
    DEFAULT_STORE_TIMEOUT_S,
    DEFAULT_SWEEP_INTERVAL_S,
)


@dataclass(frozen=True)
class ServerFields:
    """The server: where it listens and keeps state, who may call it, logs, traces, shutdown"""

    host: str = setting("127.0.0.1", "bind address", min_length=1)
    port: int = setting(8000, "port; 0 picks a free one", doc="port; `0` picks a free one", ge=0, le=65535)
    metrics_port: int = setting(
        9464,
        "port of the /metrics listener on the same host; 0: none, /metrics only on the API port "
        "with the admin token",
        doc="the `/metrics` listener, on `--host`; `0`: none ([metrics](#metrics))",
        ge=0,
        le=65535,
    )
    forwarded_allow_ips: tuple[str, ...] = setting(
        (),
        "comma-separated proxy IPs/CIDRs (or '*') whose X-Forwarded-For is trusted",
        doc="proxy IPs/CIDRs (or `*`) whose `X-Forwarded-For`/`-Proto` are believed; none: the client "
        "address is the TCP peer's, so a client cannot choose the address it is throttled and logged as",
        default_text="none: the peer address is the client's",
        metavar="IPS",
        parse=parse_forwarded_allow_ips,
    )
    data_dir: Path = setting(
        default_factory=lambda: Path.home() / ".local" / "share" / "weir",
        help="database and state",
        doc="the SQLite database",
        default_text="`$XDG_DATA_HOME/weir`, else `~/.local/share/weir`",
    )
    cache_dir: Path = setting(
        default_factory=lambda: Path.home() / ".cache" / "weir",
        help="prepared models",
        default_text="`$XDG_CACHE_HOME/weir`, else `~/.cache/weir`",
    )
    database_url: str | None = setting(
        None,
        "SQLAlchemy URL",
        default_text="`sqlite:///<data dir>/weir.db`",
        min_length=1,
        in_chart=False,  # the chart passes it from secrets.existingSecret
    )
    admin_token: str | None = setting(
        None, "the admin bearer token", default_text="none: generated and stored at first start", secret=True
    )
    key_pepper: str | None = setting(
        None,
        "server secret in the key hash; the same on every replica",
        default_text="none (plain keyed hash)",
        secret=True,
    )
    # None: no key check on a loopback address without an admin token, API keys everywhere else
    # (`Settings.auth_mode` is the resolved value).
    auth: AuthMode | None = setting(
        None,
        "keys: API keys required; none: every request is the default tenant",
        doc="`keys` or `none` ([auth modes](#auth-modes))",
        default_text="none on a loopback address without WEIR_ADMIN_TOKEN, else keys",
    )
    auth_cache_ttl_s: float = setting(
        30.0,
        "API-key lookups are cached this long: a revocation on another replica applies within it",
        doc="API-key lookups are cached this long per replica: a key revoked or a tenant changed through "
        "another replica (or `weir admin --database-url`) applies here within it",
        gt=0,
        finite=True,
    )
    # Stored responses of /v1/responses (weir.tenancy.responses, docs/responses-api.md).
    response_storage_bytes: int = setting(
        DEFAULT_QUOTA_BYTES,
        "bytes one tenant's stored /v1/responses answers may hold together; 0 refuses storing",
        doc="bytes one tenant's stored `/v1/responses` answers may hold together (their JSON); a stored "
        "request past it: `400 storage_quota_exceeded` naming `store`; `0`: storing refused "
        "([responses-api.md](responses-api.md))",
        default_text="`67108864` (64 MiB)",
        metavar="N",
        ge=0,
    )
    response_retention_s: float = setting(
        DEFAULT_RETENTION_S,
        "a stored /v1/responses answer is deleted S seconds after it was stored",
        doc="a stored response is deleted this long after it was stored (on its first read after that, "
        "or by the sweep)",
        default_text="`2592000` (30 days)",
        metavar="S",
        gt=0,
        finite=True,
    )
    response_sweep_interval_s: float = setting(
        DEFAULT_SWEEP_INTERVAL_S,
        "how often expired stored responses are deleted",
        metavar="S",
        gt=0,
        finite=True,
    )
    response_store_timeout_s: float = setting(
        DEFAULT_STORE_TIMEOUT_S,
        "how long a stored-response read, delete, write batch or sweep waits for the database",
        doc="how long a stored-response read or delete (and a read waiting for a write still in "
        "flight) waits for the database before answering `503 database_unavailable` with "
        "Retry-After; also bounds one batch of background writes (then they count as failed), "
        "the drain of those writes at shutdown, and one sweep's work",
        metavar="S",
        gt=0,
        finite=True,
    )
    otel_exporter: OtelExporter = setting(OtelExporter.NONE, "trace exporter")
    otel_endpoint: str | None = setting(
        None, "OTLP/HTTP traces endpoint", default_text="the exporter's default"
    )
    otel_service_name: str = setting("weir", "`service.name` of the spans")
    shutdown_grace_s: float = setting(30.0, "on SIGTERM, how long in-flight requests may run on", ge=0)
    max_request_body_bytes: int = setting(
        8 * 1024 * 1024,
        "413 above this",
        doc="larger bodies get `413`",
        default_text="`8388608` (8 MiB)",
        ge=1024,
    )
    log_level: LogLevel = setting(
        LogLevel.INFO,
        "log level; debug also turns on uvicorn's access log",
        doc="`debug`, `info`, `warning`, `error`; `debug` also turns on uvicorn's access log",
    )

    gc_freeze: bool = setting(
        True,
        "freeze the loaded heap so full garbage collections do not walk it (~230 ms each with "
        "SmolLM2 otherwise); refrozen after each model version load and unload",
        doc="once the server is loaded, collect garbage once and move every live object to the "
        "collector's permanent generation (`gc.freeze`), again after each model version load or unload: "
        "a full collection would otherwise walk the ~370,000 objects of a loaded SmolLM2 and torch, "
        "~230 ms with the GIL held, stalling every stream; pauses are on `/metrics` as "
        "`weir_gc_pause_seconds{generation}` ([benchmarks](benchmarks.md))",
    )
    # Each of the engine thread's ~600 torch ops a step gives the GIL up and takes it back; with the
    # event loop busy, CPython's 5 ms default makes every retake wait up to 5 ms (docs/decisions.md,
    # issue 27).
    gil_switch_interval_ms: float = setting(
        0.5,
        "longest a Python thread holds the GIL while another waits (sys.setswitchinterval); short keeps "
        "the engine thread's step from waiting on the HTTP loop",
        doc="longest a Python thread holds the GIL while another waits for it (`sys.setswitchinterval`, "
        "CPython's default 5 ms), set for the server process: the engine thread gives the GIL up in each "
        "of a step's ~600 torch ops and, with the HTTP loop busy, waits up to this long to take it back "
        "each time ([benchmarks](benchmarks-history.md#gil-switch-interval))",
        metavar="MS",
        gt=0,
        le=1000,
    )
