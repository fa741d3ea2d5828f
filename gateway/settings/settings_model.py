"""The settings of the model `weir serve` loads at start: which model and version, its dtype and
device, its memory (KV pool, host tier, budget), its LoRA slots and its speculative decoding."""

from __future__ import annotations

from pathlib import Path

from pydantic.dataclasses import dataclass

from weir.engine.speculative_config import MAX_SPECULATIVE_TOKENS
from weir.gateway.settings.setting_field import setting
from weir.gateway.settings.settings_enums import Dtype

# A model version label (weir.tenancy.catalog.model_version_records checks the same form for stored versions).
VERSION_LABEL = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


@dataclass(frozen=True)
class ModelFields:
    """The start-up model: its memory, adapters and speculative decoding"""

    model_path: Path | None = setting(
        None,
        "a Hugging Face model folder",
        default_text="SmolLM2-135M-Instruct, prepared into the cache if missing",
        env="WEIR_MODEL",
        flag="--model",
        metavar="PATH",
    )
    served_model_name: str | None = setting(
        None,
        "the name clients use in `model`",
        doc="the `model` clients send (letters, digits, `.`, `_`, `-`: it is also a path segment of the "
        "[model admin API](#model-version-rollouts))",
        default_text="the model folder's name",
    )
    model_version: str = setting(
        "default",
        "the version label --model is registered and served as",
        doc="the version label `--model` is registered and served as ([rollouts](#model-version-rollouts))",
        metavar="LABEL",
        pattern=VERSION_LABEL,
    )
    device: str | None = setting(None, "cpu or cuda", default_text="`cuda` when available, else `cpu`")
    dtype: Dtype | None = setting(
        None, "weights and KV cache dtype", default_text="`float32` on CPU, `bfloat16` on CUDA"
    )
    kv_cache_tokens: int | None = setting(
        None,
        "cap the KV pool at N tokens",
        doc="cap the KV pool at N tokens ([capacity](#capacity-planning)); a model version's own "
        "`kv_cache_tokens` wins",
        default_text="sized from memory",
        metavar="N",
        ge=1,
    )
    host_kv_cache_tokens: int = setting(
        0,
        "host-memory KV tier of N tokens (pinned on CUDA): preempted requests swap there and evicted "
        "prefix blocks are demoted there; 0: none",
        doc="a host-memory KV tier of N tokens per model version (pinned RAM on CUDA): preempted requests "
        "swap there instead of recomputing when the [cost model](#host-kv-tier-swap-or-recompute) says it "
        "is cheaper, and prefix blocks evicted from the device are demoted there and promoted back on a "
        "hit; each tenant's swapped and cached blocks are capped at `--tenant-cache-share` of it",
        default_text="`0` (none)",
        metavar="N",
        ge=0,
    )
    kv_store_url: str | None = setting(
        None,
        "shared KV tier on a Redis/Valkey server, redis://host:port/db, below the host tier; needs "
        "WEIR_KV_STORE_SECRET",
        doc="the shared KV store tier on a Redis/Valkey server, `redis://host:6379/0` (`rediss://` for "
        "TLS, never with a password in it), below the host tier: replicas share prefix blocks "
        "([prefix-cache.md](prefix-cache.md#the-store-tier-one-cache-for-every-replica)); needs "
        "`WEIR_KV_STORE_SECRET`",
        default_text="none",
        flag="--kv-store",
        metavar="URL",
    )
    kv_store_namespace: str = setting(
        "weir",
        "keeps deployments sharing one KV store apart",
        metavar="NAME",
        pattern=r"^[^*?\[\]: \\]+$",
    )
    kv_store_secret: str | None = setting(
        None,
        "the KV store values' HMAC key (at least 16 bytes); required with --kv-store",
        secret=True,
    )
    kv_store_password: str | None = setting(
        None, "the KV store's password (AUTH), if it has one", secret=True
    )
    kv_store_ttl_s: int = setting(3600, "every KV store entry expires after S s", metavar="S", ge=1)
    kv_store_max_mib: int = setting(
        1024,
        "KV store bytes this deployment may hold; a tenant holds --tenant-cache-share of it",
        metavar="MIB",
        ge=1,
    )
    kv_store_timeout_ms: float = setting(
        500.0,
        "bound of one KV store call; a fetch also waits no longer than its prefill would take",
        metavar="MS",
        gt=0,
        finite=True,
    )
    memory_budget_mib: int | None = setting(
        None,
        "memory all loaded model versions (weights + KV pools) must fit in together",
        doc="what every loaded model version's weights + KV pool must fit in together; a load that does "
        "not fit is refused with the numbers ([rollouts](#model-version-rollouts))",
        default_text="90% of free CUDA memory at start; 80% of available RAM on CPU",
        metavar="MIB",
        ge=1,
    )
    adapter_dir: Path | None = setting(
        None,
        "LoRA adapters (PEFT folders) are loaded only from under this folder",
        doc="LoRA adapters (PEFT folders) are loaded only from under this folder; setting it gives every "
        "model version `--lora-slots` LoRA slots ([LoRA adapters](lora.md))",
        default_text="none (no adapters)",
        metavar="PATH",
    )
    lora_slots: int = setting(
        4,
        "LoRA adapters one engine step runs at once, per model version",
        doc="adapters one engine step runs at once per model version; their slots (`N` x rank "
        "`--lora-max-rank` on every projection) count in the version's memory footprint",
        metavar="N",
        ge=1,
        le=64,
    )
    lora_max_rank: int = setting(
        16,
        "the highest LoRA rank an adapter may have",
        doc="the highest rank an adapter may have; a higher one is refused at load",
        metavar="R",
        ge=1,
        le=256,
    )
    max_model_len: int | None = setting(
        None, "cap the context length", default_text="the model's context (8192 for SmolLM2)", ge=1
    )
    speculative: str = setting(
        "off",
        "speculative decoding: ngram = prompt lookup, draft:PATH = a small model with the same tokenizer",
        doc="speculative decoding: `ngram` (prompt lookup: drafts copied from the request's own tokens, no "
        "model) or `draft:PATH` (a small model with the target's tokenizer; refused at start-up "
        "otherwise). Output distribution is the target's exactly; see "
        "[speculative decoding](speculative-decoding.md)",
        metavar="{off,ngram,draft:PATH}",
    )
    num_speculative_tokens: int = setting(
        4,
        "most draft tokens verified per request and step, lowered while acceptance is low",
        doc="most draft tokens verified per request and step; lowered per request while its drafts are "
        "rejected",
        metavar="K",
        ge=1,
        le=MAX_SPECULATIVE_TOKENS,
    )
