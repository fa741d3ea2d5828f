"""Server settings: the one place that reads the environment.

Precedence is command line, then `WEIR_*` environment variables, then the defaults below.
Secrets (admin token, key pepper) are read from the environment only, so they never show in `ps`.
"""

from __future__ import annotations

import argparse
import enum
import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from weir.engine.config import WIDE_STEP_ROWS, QueuePolicy
from weir.engine.spec_decode.config import SpeculativeConfig
from weir.gateway.api.openai_bodies.requests import DEFAULT_MAX_CHAT_MESSAGES
from weir.tenancy.responses.response_records import (
    DEFAULT_QUOTA_BYTES,
    DEFAULT_RETENTION_S,
    DEFAULT_SWEEP_INTERVAL_S,
    ResponseStorageLimits,
)

DTYPES = ("float32", "float16", "bfloat16")
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
# A model version label (weir.tenancy.catalog.model_version_records checks the same form for stored versions).
_VERSION_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class OtelExporter(enum.Enum):
    """Where finished trace spans go."""

    NONE = "none"
    CONSOLE = "console"
    OTLP = "otlp"


class AuthMode(enum.Enum):
    """How callers are identified. NONE serves every request as the `default` tenant."""

    KEYS = "keys"
    NONE = "none"


class PrefixCachingMode(enum.Enum):
    """ON: reuse cached KV blocks of identical prefixes (scoped per tenant). OFF: compute every prompt."""

    ON = "on"
    OFF = "off"


class CpuKernelPoolMode(enum.Enum):
    """ON: decode steps within the C row kernels' reach run them on the kernels' own helper
    threads, torch on one thread (kernels/cpu_work_pool.py). OFF: on torch's OpenMP threads."""

    ON = "on"
    OFF = "off"


class CpuDecodeLayersMode(enum.Enum):
    """ON: decode steps within the C row kernels' reach run every layer in one C call
    (engine/models/native_decode.py). OFF: the layers' C kernels one by one from Python."""

    ON = "on"
    OFF = "off"


class GcFreezeMode(enum.Enum):
    """ON: freeze the heap once loaded so full garbage collections do not walk it (gateway/server/gc_pauses.py).
    OFF: CPython's collector as it comes."""

    ON = "on"
    OFF = "off"


class AttentionBackend(enum.Enum):
    """AUTO: Triton on CUDA, torch elsewhere. TRITON needs CUDA (refused at start-up without it)."""

    AUTO = "auto"
    TORCH = "torch"
    TRITON = "triton"


class CudaGraphsMode(enum.Enum):
    """AUTO: capture decode graphs on CUDA with the Triton path. ON needs both (refused without)."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class CpuRowWeightsMode(enum.Enum):
    """AUTO: on CPU in float32 with the packed linears, keep a second copy of every linear weight
    for decode steps of few rows where a start-up measurement finds it faster, for the row counts
    it is (engine/models/packed_linear.py, row_weight_probe.py; twice the linear weights'
    memory). ON: the copy for one-row steps, not measured; it needs that path (refused
    elsewhere). OFF saves the memory."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class AdmissionMode(enum.Enum):
    """ON: token budgets, SLO-aware rejection and the queue bound (weir.gateway.admission.controller). OFF: admit all."""

    ON = "on"
    OFF = "off"


class LogLevel(enum.Enum):
    """Log levels, named as uvicorn and `logging` name them."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _xdg_dir(env: Mapping[str, str], var: str, fallback: str) -> Path:
    # XDG base directories: honoured when set, else the usual ~/.local/share and ~/.cache.
    base = env.get(var)
    return (Path(base) if base else Path.home() / fallback) / "weir"


# The default target step on CPU (docs/benchmarks.md, issue 13): on two cores, of 500/800/1,200
# ms in one guidellm run it gave the best throughput and ITL with TTFT still under the peer's.
CPU_TARGET_STEP_MS = 800.0


@dataclass(frozen=True)
class Settings:
    """Everything `weir serve` needs, resolved and validated.

    `auth` None means: no key check on a loopback address without an admin token (a fresh local
    install), API keys everywhere else. Use `auth_mode` for the resolved value.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    metrics_port: int = 9464  # /metrics for the operator's scraper, on `host`; 0: no separate listener
    # Proxies whose X-Forwarded-For / X-Forwarded-Proto are believed (IPs, CIDRs or "*"); empty:
    # none, so the client address is the peer's and a client cannot choose whom it is counted as.
    forwarded_allow_ips: tuple[str, ...] = ()
    data_dir: Path = field(default_factory=lambda: Path.home() / ".local" / "share" / "weir")
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "weir")
    model_path: Path | None = None  # None: the default SmolLM2, prepared into cache_dir if missing
    served_model_name: str | None = None  # None: the model folder's name
    device: str | None = None  # None: cuda when available, else cpu
    dtype: str | None = None  # None: float32 on CPU, bfloat16 on CUDA
    kv_cache_tokens: int | None = None  # caps the KV pool; None: sized from memory
    # Host-memory KV tier per model version (swapped requests, demoted prefix blocks); 0: none.
    host_kv_cache_tokens: int = 0
    # The memory every loaded model version's weights + KV pool must fit in together; None: 90% of
    # the device memory free at start (CUDA) or 80% of the machine's available memory (CPU).
    memory_budget_mib: int | None = None
    # LoRA adapters (docs/lora.md) are read only from under this folder; None: no adapters.
    adapter_dir: Path | None = None
    lora_slots: int = 4  # adapters one step can run at once, per model version (device slots)
    lora_max_rank: int = 16  # the highest adapter rank a slot holds
    model_version: str = "default"  # the version label `--model` is registered and served as
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    # The per-step token budget and running cap follow this target step time and the measured
    # costs (engine/scheduling/step_budget.py). None: CPU_TARGET_STEP_MS on CPU, none on an accelerator;
    # 0: none (every step may feed max_num_batched_tokens).
    target_step_ms: float | None = None
    # While sequences run, a new request waits up to this long (or until as many wait as run) so
    # that prompts prefill together (engine SchedulerConfig.admission_hold_s). 0: admitted at once.
    admission_hold_ms: float = 0.0
    speculative: str = "off"  # off | ngram | draft:<path> (engine/spec_decode)
    num_speculative_tokens: int = 4  # k: most draft tokens verified per request and step
    max_model_len: int | None = None  # None: the model's own context length
    database_url: str | None = None  # None: SQLite file in data_dir
    admin_token: str | None = field(default=None, repr=False)
    key_pepper: str | None = field(default=None, repr=False)
    auth: AuthMode | None = None
    otel_exporter: OtelExporter = OtelExporter.NONE
    otel_endpoint: str | None = None  # OTLP/HTTP endpoint; None: the exporter's default
    otel_service_name: str = "weir"
    shutdown_grace_s: float = 30.0
    max_request_body_bytes: int = 8 * 1024 * 1024
    log_level: LogLevel = LogLevel.INFO
    queue_policy: QueuePolicy = QueuePolicy.FAIR  # the engine's waiting-queue order
    admission: AdmissionMode = AdmissionMode.ON
    max_queue_time_s: float = 300.0  # a request still waiting after this gets 503; 0: no limit
    max_queued_tokens: int = 65_536  # 503 when the waiting prompt tokens would exceed it; 0: no bound
    lease_tokens: int = 4096  # largest chunk of a tenant's budget one replica leases (PostgreSQL)
    lease_ttl_s: float = 10.0  # unused leased tokens go back to the database after this
    # An API-key lookup is cached this long per replica: a key revoked (or a tenant changed)
    # through another replica is refused here within it.
    auth_cache_ttl_s: float = 30.0
    # Output tokens reserved per sequence for a request without max_tokens (tenants may override).
    default_max_tokens_reservation: int = 1024
    prefix_caching: PrefixCachingMode = PrefixCachingMode.ON
    tenant_cache_share: float = 1.0  # most of the KV pool one tenant's cached prefixes may hold
    attention_backend: AttentionBackend = AttentionBackend.AUTO
    cuda_graphs: CudaGraphsMode = CudaGraphsMode.AUTO
    cpu_row_weights: CpuRowWeightsMode = CpuRowWeightsMode.AUTO
    gc_freeze: GcFreezeMode = GcFreezeMode.ON
    # Input bounds checked before any chat template or tokenizer runs (weir.gateway.prompts.prompt_limits).
    max_chat_messages: int = DEFAULT_MAX_CHAT_MESSAGES  # messages, and content parts across them
    # A text prompt of more than this x max_model_len characters is refused untokenized; None: the
    # model's longest token (no token covers more characters, for byte-level BPE).
    prompt_chars_per_token: int | None = None
    # Threads that render chat templates and tokenize prompts (weir.gateway.prompts.tokenizer_pool), and the
    # share of them one tenant may hold at a time.
    tokenizer_workers: int = 4
    tokenizer_tenant_share: float = 0.5
    # A prompt of at most this many UTF-8 bytes (and at most 8 messages or prompts) is tokenized on
    # the event loop, where it costs less than the hand-off to a worker; 0: every prompt on one.
    tokenizer_inline_bytes: int = 512
    # Structured outputs / tool calls (weir.gateway.prompts.grammar): a grammar that does not compile within
    # this time is refused (400); compiles run on this many worker threads.
    grammar_compile_timeout_s: float = 5.0
    grammar_compile_workers: int = 2
    # How long a Python thread may hold the GIL while another waits for it (`sys.setswitchinterval`),
    # set for the whole process by `weir serve`. Each of the engine thread's ~600 torch ops a step
    # gives the GIL up and takes it back; with the event loop busy, CPython's 5 ms default makes
    # every retake wait up to 5 ms (docs/decisions.md, issue 27).
    gil_switch_interval_ms: float = 0.5
    # On a CPU device, cores left to the HTTP loop, the tokenizer threads and the OS: the engine's
    # intra-op threads are the cores this process may run on minus these, at least one (like
    # vLLM's VLLM_CPU_NUM_OF_RESERVED_CPU). 0: every core (torch's default). Not used on a GPU.
    cpu_reserved_cores: int = 1
    # On a CPU device, the engine's intra-op threads for wide steps: those that feed at least
    # `cpu_wide_step_rows` rows (decode rows plus prompt tokens), matrix-matrix work a second core
    # shortens by a quarter to a half on a quiet host; the engine runs each size of wide step on
    # whichever count it measures faster (engine/runner/step_threads.py). None: every core this process
    # may run on; 0: the engine's thread count for every step.
    cpu_wide_step_threads: int | None = None
    cpu_wide_step_rows: int = WIDE_STEP_ROWS
    cpu_kernel_pool: CpuKernelPoolMode = CpuKernelPoolMode.ON
    cpu_decode_layers: CpuDecodeLayersMode = CpuDecodeLayersMode.ON
    # Stored responses of /v1/responses (weir.tenancy.responses): the bytes one tenant's may hold
    # together (0: storing refused), how long one is kept, and how often expired ones are swept.
    response_storage_bytes: int = DEFAULT_QUOTA_BYTES
    response_retention_s: float = DEFAULT_RETENTION_S
    response_sweep_interval_s: float = DEFAULT_SWEEP_INTERVAL_S

    def __post_init__(self) -> None:
        for f in fields(self):  # NaN passes every range check below (each comparison is False)
            value = getattr(self, f.name)
            if isinstance(value, float) and math.isnan(value):
                raise ValueError(f"{f.name} must be a number, got nan")
        if not self.host:
            raise ValueError("host must not be empty")
        for entry in self.forwarded_allow_ips:
            _check_forwarded_entry(entry)
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if not self.grammar_compile_timeout_s > 0:
            raise ValueError(f"grammar_compile_timeout_s must be > 0, got {self.grammar_compile_timeout_s}")
        if self.cpu_reserved_cores < 0:
            raise ValueError(f"cpu_reserved_cores must be >= 0, got {self.cpu_reserved_cores}")
        if self.cpu_wide_step_threads is not None and self.cpu_wide_step_threads < 0:
            raise ValueError(f"cpu_wide_step_threads must be >= 0, got {self.cpu_wide_step_threads}")
        if self.cpu_wide_step_rows < 1:
            raise ValueError(f"cpu_wide_step_rows must be >= 1, got {self.cpu_wide_step_rows}")
        if not 0 < self.gil_switch_interval_ms <= 1000:
            raise ValueError(
                f"gil_switch_interval_ms must be in (0, 1000], got {self.gil_switch_interval_ms}"
            )
        if self.response_storage_bytes < 0:
            raise ValueError(f"response_storage_bytes must be >= 0, got {self.response_storage_bytes}")
        for name in ("response_retention_s", "response_sweep_interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0 and finite, got {value}")
        if self.grammar_compile_workers < 1:
            raise ValueError(f"grammar_compile_workers must be >= 1, got {self.grammar_compile_workers}")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be in [0, 65535] (0: none), got {self.metrics_port}")
        if self.metrics_port != 0 and self.metrics_port == self.port:
            raise ValueError(f"metrics_port must differ from port, both are {self.port}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.target_step_ms is not None and not 0 <= self.target_step_ms < float("inf"):
            raise ValueError(f"target_step_ms must be >= 0 (0: none) and finite, got {self.target_step_ms}")
        if not 0 <= self.admission_hold_ms < float("inf"):
            raise ValueError(
                f"admission_hold_ms must be >= 0 (0: none) and finite, got {self.admission_hold_ms}"
            )
        SpeculativeConfig.parse(self.speculative, self.num_speculative_tokens)  # ValueError names it
        if self.host_kv_cache_tokens < 0:
            raise ValueError(
                f"host_kv_cache_tokens must be >= 0 (0: no host tier), got {self.host_kv_cache_tokens}"
            )
        if not 1 <= self.lora_slots <= 64:
            raise ValueError(f"lora_slots must be in [1, 64], got {self.lora_slots}")
        if not 1 <= self.lora_max_rank <= 256:
            raise ValueError(f"lora_max_rank must be in [1, 256], got {self.lora_max_rank}")
        for name in ("kv_cache_tokens", "max_model_len", "memory_budget_mib"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.shutdown_grace_s < 0:
            raise ValueError(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")
        if self.max_request_body_bytes < 1024:
            raise ValueError(f"max_request_body_bytes must be >= 1024, got {self.max_request_body_bytes}")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("served_model_name must not be blank")
        if not _VERSION_LABEL.fullmatch(self.model_version):
            raise ValueError(
                f"model_version must be 1-64 characters of A-Z, a-z, 0-9, '.', '_' or '-', got {self.model_version!r}"
            )
        if self.database_url is not None and not self.database_url:
            raise ValueError("database_url must not be empty")
        for name in ("max_queue_time_s", "max_queued_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: no limit), got {getattr(self, name)}")
        if self.lease_tokens < 1:
            raise ValueError(f"lease_tokens must be >= 1, got {self.lease_tokens}")
        if self.lease_ttl_s <= 0:
            raise ValueError(f"lease_ttl_s must be > 0, got {self.lease_ttl_s}")
        if not math.isfinite(self.auth_cache_ttl_s) or self.auth_cache_ttl_s <= 0:
            raise ValueError(f"auth_cache_ttl_s must be > 0, got {self.auth_cache_ttl_s}")
        if self.default_max_tokens_reservation < 1:
            raise ValueError(
                f"default_max_tokens_reservation must be >= 1, got {self.default_max_tokens_reservation}"
            )
        if not 0 < self.tenant_cache_share <= 1:
            raise ValueError(f"tenant_cache_share must be in (0, 1], got {self.tenant_cache_share}")
        for name in ("max_chat_messages", "tokenizer_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prompt_chars_per_token is not None and self.prompt_chars_per_token < 1:
            raise ValueError(f"prompt_chars_per_token must be >= 1, got {self.prompt_chars_per_token}")
        if not 0 < self.tokenizer_tenant_share <= 1:
            raise ValueError(f"tokenizer_tenant_share must be in (0, 1], got {self.tokenizer_tenant_share}")
        if self.tokenizer_inline_bytes < 0:
            raise ValueError(f"tokenizer_inline_bytes must be >= 0, got {self.tokenizer_inline_bytes}")

    @property
    def auth_mode(self) -> AuthMode:
        """The resolved auth mode (see the class docstring)."""
        if self.auth is not None:
            return self.auth
        if _is_loopback(self.host) and not self.admin_token:
            return AuthMode.NONE
        return AuthMode.KEYS

    @property
    def response_storage_limits(self) -> ResponseStorageLimits:
        """Each tenant's storage quota and retention period for stored responses."""
        return ResponseStorageLimits(self.response_storage_bytes, self.response_retention_s)

    @property
    def resolved_database_url(self) -> str:
        """`database_url`, or a SQLite file inside `data_dir`."""
        return self.database_url or f"sqlite:///{self.data_dir / 'weir.db'}"

    def model_name(self, model_path: Path | None = None) -> str:
        """The name clients put in `model`: explicit, else the model folder's name."""
        if self.served_model_name:
            return self.served_model_name
        path = model_path or self.model_path
        return path.name if path is not None else DEFAULT_MODEL_NAME

    def resolved_dtype(self, device: str) -> str:
        """`dtype`, defaulting to float32 on CPU and bfloat16 on an accelerator."""
        if self.dtype is not None:
            return self.dtype
        return "float32" if device == "cpu" else "bfloat16"

    def engine_threads(self, device: str, cores: int) -> int | None:
        """The engine's intra-op threads on `device` for a process that may run on `cores` cores:
        on CPU, `cores - cpu_reserved_cores`, at least one; None (torch's default) on a GPU."""
        if device != "cpu":
            return None
        return max(1, cores - self.cpu_reserved_cores)

    def wide_step_threads(self, device: str, cores: int) -> int | None:
        """The engine's intra-op threads for wide steps on `device` (`cpu_wide_step_threads`,
        default every one of `cores`); None on a GPU, when off (0), or when it is the engine's
        own count (nothing to switch)."""
        threads = self.engine_threads(device, cores)
        if threads is None or self.cpu_wide_step_threads == 0:
            return None
        wanted = cores if self.cpu_wide_step_threads is None else self.cpu_wide_step_threads
        return None if wanted == threads else wanted

    def resolved_target_step_s(self, device: str) -> float | None:
        """The target step time in seconds, None for a fixed budget: `target_step_ms` (0: none),
        defaulting to CPU_TARGET_STEP_MS on CPU and none on an accelerator."""
        ms = self.target_step_ms
        if ms is None:
            ms = CPU_TARGET_STEP_MS if device == "cpu" else 0.0
        return ms / 1000 if ms > 0 else None

    @classmethod
    def from_sources(cls, cli: Mapping[str, Any] | argparse.Namespace, env: Mapping[str, str]) -> Settings:
        """Merge command-line values (None = not given) over `WEIR_*` env values over defaults.

        `env` is passed in (normally `os.environ`) so nothing reads the environment implicitly.
        """
        given = vars(cli) if isinstance(cli, argparse.Namespace) else dict(cli)
        values: dict[str, Any] = {}
        for f in fields(cls):
            spec = _FIELDS.get(f.name)
            if spec is None:
                continue
            if spec.cli and given.get(f.name) is not None:
                values[f.name] = _coerce(f.name, spec.parse, given[f.name])
            elif spec.env in env and env[spec.env] != "":
                values[f.name] = _coerce(spec.env, spec.parse, env[spec.env])
        if "data_dir" not in values:
            values["data_dir"] = _xdg_dir(env, "XDG_DATA_HOME", ".local/share")
        if "cache_dir" not in values:
            values["cache_dir"] = _xdg_dir(env, "XDG_CACHE_HOME", ".cache")
        return cls(**values)

    @classmethod
    def from_environment(cls, cli: Mapping[str, Any] | argparse.Namespace | None = None) -> Settings:
        """`from_sources` with the process environment; the only call that touches os.environ."""
        return cls.from_sources(cli or {}, os.environ)


def _coerce(name: str, parse: Callable[[str], Any], value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return parse(value)
    except ValueError as exc:
        raise ValueError(f"{name}: cannot parse {value!r}: {exc}") from None


def parse_path(value: str) -> Path:
    return Path(value).expanduser()


def _check_forwarded_entry(entry: str) -> None:
    if entry == "*":
        return
    try:
        ipaddress.ip_network(entry, strict=False)
    except ValueError:
        raise ValueError(
            f"forwarded_allow_ips: {entry!r} is not an IP address, a CIDR network or '*'"
        ) from None


def parse_forwarded_allow_ips(value: str) -> tuple[str, ...]:
    """A comma-separated list of proxy addresses or networks (`10.0.0.0/8,192.168.1.7`), or `*`."""
    entries = tuple(part.strip() for part in value.split(",") if part.strip())
    for entry in entries:
        _check_forwarded_entry(entry)
    return entries


@dataclass(frozen=True)
class _FieldSpec:
    env: str
    parse: Callable[[str], Any]
    cli: bool = True  # False: environment only (secrets)


_FIELDS: dict[str, _FieldSpec] = {
    "host": _FieldSpec("WEIR_HOST", str),
    "port": _FieldSpec("WEIR_PORT", int),
    "metrics_port": _FieldSpec("WEIR_METRICS_PORT", int),
    "forwarded_allow_ips": _FieldSpec("WEIR_FORWARDED_ALLOW_IPS", parse_forwarded_allow_ips),
    "data_dir": _FieldSpec("WEIR_DATA_DIR", parse_path),
    "cache_dir": _FieldSpec("WEIR_CACHE_DIR", parse_path),
    "model_path": _FieldSpec("WEIR_MODEL", parse_path),
    "served_model_name": _FieldSpec("WEIR_SERVED_MODEL_NAME", str),
    "device": _FieldSpec("WEIR_DEVICE", str),
    "dtype": _FieldSpec("WEIR_DTYPE", str),
    "kv_cache_tokens": _FieldSpec("WEIR_KV_CACHE_TOKENS", int),
    "host_kv_cache_tokens": _FieldSpec("WEIR_HOST_KV_CACHE_TOKENS", int),
    "memory_budget_mib": _FieldSpec("WEIR_MEMORY_BUDGET_MIB", int),
    "adapter_dir": _FieldSpec("WEIR_ADAPTER_DIR", parse_path),
    "lora_slots": _FieldSpec("WEIR_LORA_SLOTS", int),
    "lora_max_rank": _FieldSpec("WEIR_LORA_MAX_RANK", int),
    "model_version": _FieldSpec("WEIR_MODEL_VERSION", str),
    "max_num_seqs": _FieldSpec("WEIR_MAX_NUM_SEQS", int),
    "max_num_batched_tokens": _FieldSpec("WEIR_MAX_NUM_BATCHED_TOKENS", int),
    "max_model_len": _FieldSpec("WEIR_MAX_MODEL_LEN", int),
    "target_step_ms": _FieldSpec("WEIR_TARGET_STEP_MS", float),
    "admission_hold_ms": _FieldSpec("WEIR_ADMISSION_HOLD_MS", float),
    "speculative": _FieldSpec("WEIR_SPECULATIVE", str),
    "num_speculative_tokens": _FieldSpec("WEIR_NUM_SPECULATIVE_TOKENS", int),
    "database_url": _FieldSpec("WEIR_DATABASE_URL", str),
    "admin_token": _FieldSpec("WEIR_ADMIN_TOKEN", str, cli=False),
    "key_pepper": _FieldSpec("WEIR_KEY_PEPPER", str, cli=False),
    "auth": _FieldSpec("WEIR_AUTH", AuthMode),
    "otel_exporter": _FieldSpec("WEIR_OTEL_EXPORTER", OtelExporter),
    "otel_endpoint": _FieldSpec("WEIR_OTEL_ENDPOINT", str),
    "otel_service_name": _FieldSpec("WEIR_OTEL_SERVICE_NAME", str),
    "shutdown_grace_s": _FieldSpec("WEIR_SHUTDOWN_GRACE_S", float),
    "max_request_body_bytes": _FieldSpec("WEIR_MAX_REQUEST_BODY_BYTES", int),
    "log_level": _FieldSpec("WEIR_LOG_LEVEL", LogLevel),
    "queue_policy": _FieldSpec("WEIR_QUEUE_POLICY", QueuePolicy),
    "admission": _FieldSpec("WEIR_ADMISSION", AdmissionMode),
    "max_queue_time_s": _FieldSpec("WEIR_MAX_QUEUE_TIME_S", float),
    "max_queued_tokens": _FieldSpec("WEIR_MAX_QUEUED_TOKENS", int),
    "lease_tokens": _FieldSpec("WEIR_LEASE_TOKENS", int),
    "lease_ttl_s": _FieldSpec("WEIR_LEASE_TTL_S", float),
    "auth_cache_ttl_s": _FieldSpec("WEIR_AUTH_CACHE_TTL_S", float),
    "default_max_tokens_reservation": _FieldSpec("WEIR_DEFAULT_MAX_TOKENS_RESERVATION", int),
    "prefix_caching": _FieldSpec("WEIR_PREFIX_CACHING", PrefixCachingMode),
    "tenant_cache_share": _FieldSpec("WEIR_TENANT_CACHE_SHARE", float),
    "attention_backend": _FieldSpec("WEIR_ATTENTION_BACKEND", AttentionBackend),
    "cuda_graphs": _FieldSpec("WEIR_CUDA_GRAPHS", CudaGraphsMode),
    "cpu_row_weights": _FieldSpec("WEIR_CPU_ROW_WEIGHTS", CpuRowWeightsMode),
    "gc_freeze": _FieldSpec("WEIR_GC_FREEZE", GcFreezeMode),
    "max_chat_messages": _FieldSpec("WEIR_MAX_CHAT_MESSAGES", int),
    "prompt_chars_per_token": _FieldSpec("WEIR_PROMPT_CHARS_PER_TOKEN", int),
    "tokenizer_workers": _FieldSpec("WEIR_TOKENIZER_WORKERS", int),
    "tokenizer_tenant_share": _FieldSpec("WEIR_TOKENIZER_TENANT_SHARE", float),
    "tokenizer_inline_bytes": _FieldSpec("WEIR_TOKENIZER_INLINE_BYTES", int),
    "grammar_compile_timeout_s": _FieldSpec("WEIR_GRAMMAR_COMPILE_TIMEOUT_S", float),
    "grammar_compile_workers": _FieldSpec("WEIR_GRAMMAR_COMPILE_WORKERS", int),
    "gil_switch_interval_ms": _FieldSpec("WEIR_GIL_SWITCH_INTERVAL_MS", float),
    "cpu_reserved_cores": _FieldSpec("WEIR_CPU_RESERVED_CORES", int),
    "cpu_wide_step_threads": _FieldSpec("WEIR_CPU_WIDE_STEP_THREADS", int),
    "cpu_wide_step_rows": _FieldSpec("WEIR_CPU_WIDE_STEP_ROWS", int),
    "cpu_kernel_pool": _FieldSpec("WEIR_CPU_KERNEL_POOL", CpuKernelPoolMode),
    "cpu_decode_layers": _FieldSpec("WEIR_CPU_DECODE_LAYERS", CpuDecodeLayersMode),
    "response_storage_bytes": _FieldSpec("WEIR_RESPONSE_STORAGE_BYTES", int),
    "response_retention_s": _FieldSpec("WEIR_RESPONSE_RETENTION_S", float),
    "response_sweep_interval_s": _FieldSpec("WEIR_RESPONSE_SWEEP_INTERVAL_S", float),
}
