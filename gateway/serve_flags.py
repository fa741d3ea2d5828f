"""The `weir serve` command-line flags.

Each flag's `dest` is a `Settings` field; every default is None so that `Settings.from_sources`
can apply the `WEIR_*` environment variable or the built-in default when a flag is not given.
This module only declares flags: `gateway/settings.py` stays the one place that reads the
environment and validates the values.
"""

from __future__ import annotations

import argparse

from engine.config import QueuePolicy
from gateway.settings import (
    DTYPES,
    AdmissionMode,
    AttentionBackend,
    AuthMode,
    CudaGraphsMode,
    LogLevel,
    OtelExporter,
    PrefixCachingMode,
    parse_path,
)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The `weir serve` flags. Every default is None so env and built-in defaults can apply."""
    add = parser.add_argument
    add("--host", help="bind address (env WEIR_HOST; default 127.0.0.1)")
    add("--port", type=int, help="port; 0 picks a free one (env WEIR_PORT; default 8000)")
    add(
        "--forwarded-allow-ips",
        dest="forwarded_allow_ips",
        metavar="IPS",
        help="comma-separated proxy IPs/CIDRs (or '*') whose X-Forwarded-For is trusted "
        "(env WEIR_FORWARDED_ALLOW_IPS; default none: the peer address is the client's)",
    )
    add(
        "--metrics-port",
        dest="metrics_port",
        type=int,
        help="port of the /metrics listener on the same host; 0: none, /metrics only on the API port "
        "with the admin token (env WEIR_METRICS_PORT; default 9464)",
    )
    add(
        "--data-dir",
        dest="data_dir",
        type=parse_path,
        help="database and state (env WEIR_DATA_DIR; default $XDG_DATA_HOME/weir or ~/.local/share/weir)",
    )
    add(
        "--cache-dir",
        dest="cache_dir",
        type=parse_path,
        help="prepared models (env WEIR_CACHE_DIR; default $XDG_CACHE_HOME/weir or ~/.cache/weir)",
    )
    add(
        "--model",
        dest="model_path",
        type=parse_path,
        metavar="PATH",
        help="a Hugging Face model folder (env WEIR_MODEL; default: SmolLM2-135M-Instruct, prepared if missing)",
    )
    add("--served-model-name", dest="served_model_name", help="the name clients use in `model`")
    add(
        "--model-version",
        dest="model_version",
        metavar="LABEL",
        help="the version label --model is registered and served as (env WEIR_MODEL_VERSION; default 'default')",
    )
    add("--device", help="cpu or cuda (env WEIR_DEVICE; default: cuda when available)")
    add("--dtype", choices=DTYPES, help="weights and KV dtype (default float32 on CPU, bfloat16 on CUDA)")
    add(
        "--kv-cache-tokens", dest="kv_cache_tokens", type=int, metavar="N", help="cap the KV pool at N tokens"
    )
    add(
        "--host-kv-cache-tokens",
        dest="host_kv_cache_tokens",
        type=int,
        metavar="N",
        help="host-memory KV tier of N tokens (pinned on CUDA): preempted requests swap there and "
        "evicted prefix blocks are demoted there (env WEIR_HOST_KV_CACHE_TOKENS; default 0: none)",
    )
    add(
        "--memory-budget-mib",
        dest="memory_budget_mib",
        type=int,
        metavar="MIB",
        help="memory all loaded model versions (weights + KV pools) must fit in together (env "
        "WEIR_MEMORY_BUDGET_MIB; default 90%% of free CUDA memory, or 80%% of available RAM on CPU)",
    )
    add("--max-num-seqs", dest="max_num_seqs", type=int, help="most sequences in one batch (default 64)")
    add(
        "--max-num-batched-tokens",
        dest="max_num_batched_tokens",
        type=int,
        help="most tokens in one engine step (default 2048)",
    )
    add(
        "--target-step-ms",
        dest="target_step_ms",
        type=float,
        metavar="MS",
        help="target engine step time: the per-step token budget follows it and the measured cost per "
        "token, up to --max-num-batched-tokens (env WEIR_TARGET_STEP_MS; default none: fixed budget)",
    )
    add(
        "--speculative",
        metavar="{off,ngram,draft:PATH}",
        help="speculative decoding: ngram = prompt lookup, draft:PATH = a small model with the same "
        "tokenizer (env WEIR_SPECULATIVE; default off)",
    )
    add(
        "--num-speculative-tokens",
        dest="num_speculative_tokens",
        type=int,
        metavar="K",
        help="most draft tokens verified per request and step, lowered while acceptance is low "
        "(env WEIR_NUM_SPECULATIVE_TOKENS; default 4)",
    )
    add("--max-model-len", dest="max_model_len", type=int, help="cap the context length")
    add("--database-url", dest="database_url", help="SQLAlchemy URL (default: SQLite in the data dir)")
    add(
        "--auth",
        type=AuthMode,
        choices=list(AuthMode),
        metavar="{keys,none}",
        help="keys: API keys required; none: every request is the default tenant "
        "(default: none on a loopback address without WEIR_ADMIN_TOKEN, else keys)",
    )
    add(
        "--otel-exporter",
        dest="otel_exporter",
        type=OtelExporter,
        choices=list(OtelExporter),
        metavar="{none,console,otlp}",
        help="trace exporter (env WEIR_OTEL_EXPORTER; default none)",
    )
    add("--otel-endpoint", dest="otel_endpoint", help="OTLP/HTTP traces endpoint")
    add(
        "--shutdown-grace-s",
        dest="shutdown_grace_s",
        type=float,
        help="on SIGTERM, how long in-flight requests may run on (default 30)",
    )
    add(
        "--max-request-body-bytes",
        dest="max_request_body_bytes",
        type=int,
        help="413 above this (default 8 MiB)",
    )
    add(
        "--queue-policy",
        dest="queue_policy",
        type=QueuePolicy,
        choices=list(QueuePolicy),
        metavar="{fcfs,priority,fair}",
        help="waiting-queue order: fair = priority class, then per-tenant fair share (default fair)",
    )
    add(
        "--prefix-caching",
        dest="prefix_caching",
        type=PrefixCachingMode,
        choices=list(PrefixCachingMode),
        metavar="{on,off}",
        help="reuse the KV blocks of identical prefixes, scoped per tenant (default on)",
    )
    add(
        "--attention-backend",
        dest="attention_backend",
        type=AttentionBackend,
        choices=list(AttentionBackend),
        metavar="{auto,torch,triton}",
        help="attention kernels: auto = triton on CUDA, torch elsewhere; triton needs CUDA (default auto)",
    )
    add(
        "--cuda-graphs",
        dest="cuda_graphs",
        type=CudaGraphsMode,
        choices=list(CudaGraphsMode),
        metavar="{auto,on,off}",
        help="replay decode steps as CUDA graphs: auto = on CUDA with triton; on needs both (default auto)",
    )
    add(
        "--tenant-cache-share",
        dest="tenant_cache_share",
        type=float,
        metavar="F",
        help="most of the KV pool (0-1] one tenant's cached prefixes may hold (default 1.0)",
    )
    add(
        "--admission",
        type=AdmissionMode,
        choices=list(AdmissionMode),
        metavar="{on,off}",
        help="on: token budgets, SLO-aware rejection, queue bound; off: admit everything (default on)",
    )
    add(
        "--max-queue-time-s",
        dest="max_queue_time_s",
        type=float,
        help="503 for a request still waiting in the queue after this (default 300; 0: no limit)",
    )
    add(
        "--max-queued-tokens",
        dest="max_queued_tokens",
        type=int,
        help="503 when waiting prompt tokens would exceed this (default 65536; 0: no bound)",
    )
    add(
        "--lease-tokens",
        dest="lease_tokens",
        type=int,
        help="largest budget chunk a replica leases from PostgreSQL (default 4096)",
    )
    add("--lease-ttl-s", dest="lease_ttl_s", type=float, help="unused leases return after this (default 10)")
    add(
        "--auth-cache-ttl-s",
        dest="auth_cache_ttl_s",
        type=float,
        help="API-key lookups are cached this long: a revocation on another replica applies within it "
        "(env WEIR_AUTH_CACHE_TTL_S; default 30)",
    )
    add(
        "--default-max-tokens-reservation",
        dest="default_max_tokens_reservation",
        type=int,
        help="output tokens reserved per sequence for a request without max_tokens; usage beyond it "
        "is charged as debt (default 1024)",
    )
    add(
        "--log-level",
        dest="log_level",
        type=LogLevel,
        choices=list(LogLevel),
        metavar="{debug,info,warning,error}",
        help="default info",
    )
