"""The `weir serve` command-line flags.

Each flag's `dest` (argparse's, from the flag's name; only `--model` names its own) is a
`Settings` field; every default is None so that `Settings.from_sources` can apply the `WEIR_*`
environment variable or the built-in default when a flag is not given.
This module only declares flags: `gateway/server/settings.py` stays the one place that reads the
environment and validates the values.
"""

from __future__ import annotations

import argparse
import enum
import functools

from weir.engine.config import WIDE_STEP_ROWS, QueuePolicy
from weir.gateway.server.settings import (
    DTYPES,
    AdmissionMode,
    AttentionBackend,
    AuthMode,
    CpuDecodeLayersMode,
    CpuKernelPoolMode,
    CpuRowWeightsMode,
    CudaGraphsMode,
    GcFreezeMode,
    LogLevel,
    OtelExporter,
    PrefixCachingMode,
    parse_path,
)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The `weir serve` flags. Every default is None so env and built-in defaults can apply."""
    add = parser.add_argument
    choice = functools.partial(_add_choice, parser)  # the flags whose values are an enum's
    add("--host", help="bind address (env WEIR_HOST; default 127.0.0.1)")
    add("--port", type=int, help="port; 0 picks a free one (env WEIR_PORT; default 8000)")
    add(
        "--forwarded-allow-ips",
        metavar="IPS",
        help="comma-separated proxy IPs/CIDRs (or '*') whose X-Forwarded-For is trusted "
        "(env WEIR_FORWARDED_ALLOW_IPS; default none: the peer address is the client's)",
    )
    add(
        "--metrics-port",
        type=int,
        help="port of the /metrics listener on the same host; 0: none, /metrics only on the API port "
        "with the admin token (env WEIR_METRICS_PORT; default 9464)",
    )
    add(
        "--data-dir",
        type=parse_path,
        help="database and state (env WEIR_DATA_DIR; default $XDG_DATA_HOME/weir or ~/.local/share/weir)",
    )
    add(
        "--cache-dir",
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
    add("--served-model-name", help="the name clients use in `model`")
    add(
        "--model-version",
        metavar="LABEL",
        help="the version label --model is registered and served as (env WEIR_MODEL_VERSION; default 'default')",
    )
    add("--device", help="cpu or cuda (env WEIR_DEVICE; default: cuda when available)")
    add("--dtype", choices=DTYPES, help="weights and KV dtype (default float32 on CPU, bfloat16 on CUDA)")
    add("--kv-cache-tokens", type=int, metavar="N", help="cap the KV pool at N tokens")
    add(
        "--host-kv-cache-tokens",
        type=int,
        metavar="N",
        help="host-memory KV tier of N tokens (pinned on CUDA): preempted requests swap there and "
        "evicted prefix blocks are demoted there (env WEIR_HOST_KV_CACHE_TOKENS; default 0: none)",
    )
    add(
        "--memory-budget-mib",
        type=int,
        metavar="MIB",
        help="memory all loaded model versions (weights + KV pools) must fit in together (env "
        "WEIR_MEMORY_BUDGET_MIB; default 90%% of free CUDA memory, or 80%% of available RAM on CPU)",
    )
    add(
        "--adapter-dir",
        type=parse_path,
        metavar="PATH",
        help="LoRA adapters (PEFT folders) are loaded only from under this folder (env "
        "WEIR_ADAPTER_DIR; default: none, no adapters)",
    )
    add(
        "--lora-slots",
        type=int,
        metavar="N",
        help="LoRA adapters one engine step runs at once, per model version (env WEIR_LORA_SLOTS; default 4)",
    )
    add(
        "--lora-max-rank",
        type=int,
        metavar="R",
        help="the highest LoRA rank an adapter may have (env WEIR_LORA_MAX_RANK; default 16)",
    )
    add("--max-num-seqs", type=int, help="most sequences in one batch (default 64)")
    add("--max-num-batched-tokens", type=int, help="most tokens in one engine step (default 2048)")
    add(
        "--target-step-ms",
        type=float,
        metavar="MS",
        help="target engine step time: the per-step token budget (up to --max-num-batched-tokens) and "
        "how many sequences run at once follow it and the measured costs (env WEIR_TARGET_STEP_MS; "
        "default 800 on CPU, none on an accelerator; 0: none, a fixed budget)",
    )
    add(
        "--admission-hold-ms",
        type=float,
        metavar="MS",
        help="while sequences run, a new request waits up to MS (or until as many requests wait as run) "
        "so that prompts are prefilled together instead of one per step into every running stream's "
        "inter-token gaps: smoother streams for later first tokens (env WEIR_ADMISSION_HOLD_MS; default 0: "
        "admitted at once)",
    )
    add(
        "--speculative",
        metavar="{off,ngram,draft:PATH}",
        help="speculative decoding: ngram = prompt lookup, draft:PATH = a small model with the same "
        "tokenizer (env WEIR_SPECULATIVE; default off)",
    )
    add(
        "--num-speculative-tokens",
        type=int,
        metavar="K",
        help="most draft tokens verified per request and step, lowered while acceptance is low "
        "(env WEIR_NUM_SPECULATIVE_TOKENS; default 4)",
    )
    add("--max-model-len", type=int, help="cap the context length")
    add("--database-url", help="SQLAlchemy URL (default: SQLite in the data dir)")
    choice(
        "--auth",
        AuthMode,
        help="keys: API keys required; none: every request is the default tenant "
        "(default: none on a loopback address without WEIR_ADMIN_TOKEN, else keys)",
    )
    choice("--otel-exporter", OtelExporter, help="trace exporter (env WEIR_OTEL_EXPORTER; default none)")
    add("--otel-endpoint", help="OTLP/HTTP traces endpoint")
    add(
        "--shutdown-grace-s",
        type=float,
        help="on SIGTERM, how long in-flight requests may run on (default 30)",
    )
    add("--max-request-body-bytes", type=int, help="413 above this (default 8 MiB)")
    choice(
        "--queue-policy",
        QueuePolicy,
        help="waiting-queue order: fair = priority class, then per-tenant fair share (default fair)",
    )
    choice(
        "--prefix-caching",
        PrefixCachingMode,
        help="reuse the KV blocks of identical prefixes, scoped per tenant (default on)",
    )
    choice(
        "--attention-backend",
        AttentionBackend,
        help="attention kernels: auto = triton on CUDA, torch elsewhere; triton needs CUDA (default auto)",
    )
    choice(
        "--cuda-graphs",
        CudaGraphsMode,
        help="replay decode steps as CUDA graphs: auto = on CUDA with triton; on needs both (default auto)",
    )
    choice(
        "--cpu-row-weights",
        CpuRowWeightsMode,
        help="a second copy of every linear weight for decode steps of few rows (twice the linear weights' "
        "memory): auto = on CPU in float32 where a start-up measurement finds it faster; on (one-row steps) "
        "needs that (default auto)",
    )
    choice(
        "--gc-freeze",
        GcFreezeMode,
        help="freeze the loaded heap so full garbage collections do not walk it (~230 ms each with "
        "SmolLM2 otherwise); refrozen after each model version load and unload (default on)",
    )
    add(
        "--grammar-compile-timeout-s",
        type=float,
        metavar="S",
        help="a structured-output or tool grammar that does not compile within S seconds is refused "
        "with 400 (env WEIR_GRAMMAR_COMPILE_TIMEOUT_S; default 5)",
    )
    add(
        "--grammar-compile-workers",
        type=int,
        metavar="N",
        help="worker threads that compile grammars (env WEIR_GRAMMAR_COMPILE_WORKERS; default 2)",
    )
    add(
        "--tenant-cache-share",
        type=float,
        metavar="F",
        help="most of the KV pool (0-1] one tenant's cached prefixes may hold (default 1.0)",
    )
    add(
        "--max-chat-messages",
        type=int,
        metavar="N",
        help="messages in one chat, and content parts across them, refused above this before any "
        "template runs (env WEIR_MAX_CHAT_MESSAGES; default 2048)",
    )
    add(
        "--response-storage-bytes",
        type=int,
        metavar="N",
        help="bytes one tenant's stored /v1/responses answers may hold together; 0 refuses storing "
        "(env WEIR_RESPONSE_STORAGE_BYTES; default 64 MiB)",
    )
    add(
        "--response-retention-s",
        type=float,
        metavar="S",
        help="a stored /v1/responses answer is deleted S seconds after it was stored "
        "(env WEIR_RESPONSE_RETENTION_S; default 30 days)",
    )
    add(
        "--response-sweep-interval-s",
        type=float,
        metavar="S",
        help="how often expired stored responses are deleted (env WEIR_RESPONSE_SWEEP_INTERVAL_S; "
        "default 300)",
    )
    add(
        "--prompt-chars-per-token",
        type=int,
        metavar="N",
        help="a text prompt longer than N x the context in characters is refused untokenized "
        "(env WEIR_PROMPT_CHARS_PER_TOKEN; default: the model's longest token)",
    )
    add(
        "--tokenizer-workers",
        type=int,
        metavar="N",
        help="threads that render chat templates and tokenize prompts (env WEIR_TOKENIZER_WORKERS; default 4)",
    )
    add(
        "--tokenizer-tenant-share",
        type=float,
        metavar="F",
        help="most of the tokenizer threads (0-1] one tenant may hold at once "
        "(env WEIR_TOKENIZER_TENANT_SHARE; default 0.5)",
    )
    add(
        "--tokenizer-inline-bytes",
        type=int,
        metavar="N",
        help="a prompt of at most N UTF-8 bytes (and 8 messages or prompts) is tokenized on the event "
        "loop, not a tokenizer thread; 0: none (env WEIR_TOKENIZER_INLINE_BYTES; default 512)",
    )
    choice(
        "--admission",
        AdmissionMode,
        help="on: token budgets, SLO-aware rejection, queue bound; off: admit everything (default on)",
    )
    add(
        "--max-queue-time-s",
        type=float,
        help="503 for a request still waiting in the queue after this (default 300; 0: no limit)",
    )
    add(
        "--max-queued-tokens",
        type=int,
        help="503 when waiting prompt tokens would exceed this (default 65536; 0: no bound)",
    )
    add(
        "--lease-tokens",
        type=int,
        help="largest budget chunk a replica leases from PostgreSQL (default 4096)",
    )
    add("--lease-ttl-s", type=float, help="unused leases return after this (default 10)")
    add(
        "--auth-cache-ttl-s",
        type=float,
        help="API-key lookups are cached this long: a revocation on another replica applies within it "
        "(env WEIR_AUTH_CACHE_TTL_S; default 30)",
    )
    add(
        "--default-max-tokens-reservation",
        type=int,
        help="output tokens reserved per sequence for a request without max_tokens; usage beyond it "
        "is charged as debt (default 1024)",
    )
    add(
        "--gil-switch-interval-ms",
        type=float,
        metavar="MS",
        help="longest a Python thread holds the GIL while another waits (sys.setswitchinterval); "
        "short keeps the engine thread's step from waiting on the HTTP loop "
        "(env WEIR_GIL_SWITCH_INTERVAL_MS; default 0.5)",
    )
    add(
        "--cpu-reserved-cores",
        type=int,
        metavar="N",
        help="on a CPU device, cores left to the HTTP loop, tokenizers and the OS; the engine's "
        "intra-op threads are the rest, at least one (env WEIR_CPU_RESERVED_CORES; default 1; "
        "0: every core)",
    )
    add(
        "--cpu-wide-step-threads",
        type=int,
        metavar="N",
        help="on a CPU device, the engine's intra-op threads for wide steps (see "
        "--cpu-wide-step-rows; env WEIR_CPU_WIDE_STEP_THREADS; default every core; 0: the engine's "
        "own count)",
    )
    add(
        "--cpu-wide-step-rows",
        type=int,
        metavar="N",
        help="a step is wide when it feeds N or more rows, decode rows plus prompt tokens (env "
        f"WEIR_CPU_WIDE_STEP_ROWS; default {WIDE_STEP_ROWS})",
    )
    choice(
        "--cpu-kernel-pool",
        CpuKernelPoolMode,
        help="on a CPU device, wide decode steps of at most 16 rows run their C kernels on the kernels' "
        "own helper threads, torch on one thread, so that no thread waits for one that lost its core "
        "to the HTTP loop; off: on torch's OpenMP threads (default on)",
    )
    choice(
        "--cpu-decode-layers",
        CpuDecodeLayersMode,
        help="on a CPU device in float32, decode steps of at most 16 rows run every layer in one C "
        "call, the GIL released for the step; off: each layer's C kernels called one by one from "
        "Python (default on)",
    )
    choice("--log-level", LogLevel, help="default info")


def _add_choice(parser: argparse.ArgumentParser, flag: str, kind: type[enum.Enum], help: str) -> None:
    """A flag whose value is one of `kind`'s values, listed as `{a,b}` in the help."""
    metavar = "{" + ",".join(str(member.value) for member in kind) + "}"
    parser.add_argument(flag, type=kind, choices=list(kind), metavar=metavar, help=help)
