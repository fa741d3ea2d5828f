"""Frozen engine configuration dataclasses, validated in __post_init__."""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import asdict, dataclass, field

from weir.engine.latency_targets import NO_CLASS_TARGETS, ClassTargets
from weir.engine.speculative_config import SpeculativeConfig

# The weight dtypes the engine runs (EngineConfig.dtype); model versions are checked against it.
ENGINE_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")

# On CPU, a step feeding this many rows or more (decode rows plus prompt tokens) is wide: it may
# run on more intra-op threads (engine/runner/step_threads.py; `--cpu-wide-step-rows`).
WIDE_STEP_ROWS = 4


class RopeScalingType(enum.Enum):
    """The RoPE scaling schemes the Llama family uses (HF `rope_scaling.rope_type`)."""

    NONE = "default"
    LINEAR = "linear"
    DYNAMIC = "dynamic"
    LLAMA3 = "llama3"
    YARN = "yarn"


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding parameters. `fingerprint()` keys the prefix cache."""

    theta: float = 10000.0
    scaling_type: RopeScalingType = RopeScalingType.NONE
    factor: float = 1.0
    max_position_embeddings: int = 2048
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    partial_rotary_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.theta <= 0:
            raise ValueError(f"theta must be > 0, got {self.theta}")
        if self.factor <= 0:
            raise ValueError(f"factor must be > 0, got {self.factor}")
        if self.max_position_embeddings < 1:
            raise ValueError(f"max_position_embeddings must be >= 1, got {self.max_position_embeddings}")
        if not 0 < self.partial_rotary_factor <= 1:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}")

    def fingerprint(self) -> str:
        """A stable digest of every field that changes the positional encoding."""
        data = asdict(self)
        data["scaling_type"] = self.scaling_type.value
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a Llama-family model, read from a Hugging Face config.json."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_model_len: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head
    mlp_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_model_len",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """2 (K and V) * layers * kv heads * head dim * element size."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
        emb = v * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + emb + h

    def layer_linear_shapes(self) -> tuple[tuple[int, int], ...]:
        """`[out_features, in_features]` of one layer's fused projections: qkv, o, gate_up, down."""
        h, i = self.hidden_size, self.intermediate_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return ((q + 2 * kv, h), (h, q), (2 * i, h), (h, i))

    def linear_params(self) -> int:
        """Parameters of the projections and the LM head (what `EngineConfig.cpu_row_weights` copies)."""
        per_layer = sum(out * inp for out, inp in self.layer_linear_shapes())
        return self.num_layers * per_layer + self.vocab_size * self.hidden_size

    def lora_slot_params(self, num_slots: int, max_rank: int) -> int:
        """Values the LoRA slots of every projection take (engine/lora/lora_deltas.py): per layer and
        slot, each target holds `max_rank` rows of A `[in]` and of B `[out]` (its own outputs)."""
        h, i = self.hidden_size, self.intermediate_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        qkv = max_rank * (3 * h + q + 2 * kv)
        o = max_rank * (q + h)
        gate_up = max_rank * (2 * h + 2 * i)
        down = max_rank * (i + h)
        return self.num_layers * num_slots * (qkv + o + gate_up + down)


class BatchPolicy(enum.Enum):
    """How the scheduler forms batches over time."""

    CONTINUOUS = "continuous"  # iteration-level: join and leave every step
    STATIC = "static"  # wait for a full batch, run it to completion
    DYNAMIC = "dynamic"  # collect within a time window, then run the group to completion


class QueuePolicy(enum.Enum):
    """Order of the waiting queue."""

    FCFS = "fcfs"
    PRIORITY = "priority"
    FAIR = "fair"


class PreemptionMode(enum.Enum):
    """How a preempted request gives back its KV blocks (engine/kv/swap_policy.py decides under AUTO)."""

    AUTO = "auto"  # swap or recompute, whichever the measured cost model says is cheaper
    SWAP = "swap"  # swap to the host pool whenever it has room (tests, benchmarks)
    RECOMPUTE = "recompute"  # always drop the blocks and recompute them


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache geometry. Either `num_blocks` or `memory_budget_bytes` sizes the pool."""

    block_size: int = 16
    num_blocks: int | None = None
    memory_budget_bytes: int | None = None
    kv_dtype: str = "float32"
    enable_prefix_caching: bool = True
    tenant_cache_share: float = 1.0  # max share of the pool one tenant's cached blocks may hold
    # Host-memory KV pool (engine/kv/host_kv_tier.py): swapped requests and demoted prefix blocks.
    host_num_blocks: int = 0  # 0: no host tier
    preemption_mode: PreemptionMode = PreemptionMode.AUTO

    def __post_init__(self) -> None:
        if self.host_num_blocks < 0:
            raise ValueError(f"host_num_blocks must be >= 0, got {self.host_num_blocks}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two >= 1, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.memory_budget_bytes is not None and self.memory_budget_bytes < 1:
            raise ValueError(f"memory_budget_bytes must be >= 1, got {self.memory_budget_bytes}")
        if self.kv_dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"kv_dtype must be float32, float16 or bfloat16, got {self.kv_dtype!r}")
        if not 0 < self.tenant_cache_share <= 1:
            raise ValueError(f"tenant_cache_share must be in (0, 1], got {self.tenant_cache_share}")


@dataclass(frozen=True)
class KVStoreConfig:
    """The shared KV store tier below the host tier (engine/kv/store/tier.py), on a Redis or
    Valkey server. The secret keys the values' MACs; the password (if the store wants one) and
    the secret come from the environment only (gateway/settings/settings_model.py)."""

    url: str  # redis://host:port/db (rediss:// for TLS); never with a password in it
    secret: bytes = field(repr=False)  # HMAC-SHA256 key of every stored value
    password: str | None = field(default=None, repr=False)
    namespace: str = "weir"  # keeps deployments sharing one store apart
    ttl_s: int = 3600  # every key expires after this (rewritten keys start again)
    max_bytes: int = 1 << 30  # what this deployment may hold in the store; a scope holds its share
    timeout_s: float = 0.5  # one store call (connect, read); a fetch waits at most its prefill's time
    max_write_queue: int = 256  # blocks waiting to be written; more are dropped (counted)
    max_fetch_bytes: int = 256 << 20  # fetched and in-flight bytes held for waiting requests at once
    breaker_failures: int = 3  # failures in a row that open the circuit breaker
    breaker_open_s: float = 5.0  # how long it stays open before one probe

    def __post_init__(self) -> None:
        if not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"kv_store url must be redis://, rediss:// or unix://, got {self.url!r}")
        if "@" in self.url.split("//", 1)[1].split("/", 1)[0]:
            raise ValueError("kv_store url must not carry a password: set WEIR_KV_STORE_PASSWORD")
        if len(self.secret) < 16:
            raise ValueError("kv_store secret must be at least 16 bytes (WEIR_KV_STORE_SECRET)")
        if not self.namespace or any(c in self.namespace for c in "*?[]: \\"):
            raise ValueError(
                f"kv_store namespace must be non-empty without *?[]: or spaces, got {self.namespace!r}"
            )
        for name in ("ttl_s", "max_bytes", "max_write_queue", "max_fetch_bytes", "breaker_failures"):
            if getattr(self, name) < 1:
                raise ValueError(f"kv_store {name} must be >= 1, got {getattr(self, name)}")
        for name in ("timeout_s", "breaker_open_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"kv_store {name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one scheduler step and the batching/queue policies."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    max_model_len: int = 2048
    batch_policy: BatchPolicy = BatchPolicy.CONTINUOUS
    queue_policy: QueuePolicy = QueuePolicy.FCFS
    static_batch_size: int = 8
    dynamic_window_s: float = 0.05
    static_max_wait_s: float = 1.0  # static batching fires a partial batch after this wait
    long_prefill_threshold: int = 0  # >0: a prefill chunk is capped at this many tokens per step
    # None: every step may feed max_num_batched_tokens; else the budget follows this target step
    # time and the measured cost per token (engine/scheduling/step_budget.py), up to max_num_batched_tokens.
    target_step_s: float | None = None
    # Steps in a row that feed no token while work exists before the stall watchdog acts
    # (engine/scheduling/stall_watchdog.py): it logs the scheduler's state, counts a stall and preempts.
    max_stalled_steps: int = 64
    # TTFT/ITL defaults per priority class (engine/latency_targets.py; the server sets the CPU or
    # GPU ones). A running request's ITL target caps the step time; none here: no class targets.
    class_targets: ClassTargets = NO_CLASS_TARGETS
    # Steps a request runs after it starts or resumes before it may be preempted for a higher
    # class (SLO preemption); KV exhaustion may still preempt it.
    min_residency_steps: int = 16
    # Continuous batching only. While sequences run, a new request waits until it has waited this
    # long or as many requests wait as run, so that prompts arriving apart are prefilled together
    # instead of one per step into every running stream's inter-token gaps (TGI's
    # max_waiting_tokens / waiting_served_ratio). Buys smoother streams with TTFT. 0: at once.
    admission_hold_s: float = 0.0

    def __post_init__(self) -> None:
        for name in (
            "max_num_batched_tokens",
            "max_num_seqs",
            "max_model_len",
            "static_batch_size",
            "max_stalled_steps",
            "min_residency_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.static_max_wait_s < 0:
            raise ValueError(f"static_max_wait_s must be >= 0, got {self.static_max_wait_s}")
        if self.dynamic_window_s < 0:
            raise ValueError(f"dynamic_window_s must be >= 0, got {self.dynamic_window_s}")
        if self.long_prefill_threshold < 0:
            raise ValueError(f"long_prefill_threshold must be >= 0, got {self.long_prefill_threshold}")
        if self.target_step_s is not None and not 0 < self.target_step_s < float("inf"):
            raise ValueError(f"target_step_s must be > 0 and finite, got {self.target_step_s}")
        if not 0 <= self.admission_hold_s < float("inf"):
            raise ValueError(f"admission_hold_s must be >= 0 and finite, got {self.admission_hold_s}")


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters (engine/lora/lora_manager.py): `num_slots` device slots of rank up to `max_rank`.

    `num_slots` 0: no adapters. Adapters are read only from under `adapter_dir` (None: no
    directory is allowed, so none can be loaded from disk).
    """

    num_slots: int = 0
    max_rank: int = 16
    adapter_dir: str | None = None
    max_adapters: int = 64  # adapters held in host memory (loaded), in slots or not

    def __post_init__(self) -> None:
        if not 0 <= self.num_slots <= 64:
            raise ValueError(f"num_slots must be in [0, 64], got {self.num_slots}")
        if not 1 <= self.max_rank <= 256:
            raise ValueError(f"max_rank must be in [1, 256], got {self.max_rank}")
        if self.max_adapters < 1:
            raise ValueError(f"max_adapters must be >= 1, got {self.max_adapters}")

    @property
    def enabled(self) -> bool:
        return self.num_slots > 0


@dataclass(frozen=True)
class MaskConfig:
    """How grammar masks are computed ahead (engine/runner/mask_prefetch.py)."""

    num_workers: int = 2
    # Threads the pool may grow to so that a tenant with no mask running gets a worker at once
    # while other tenants' slow masks hold the `num_workers` (engine/structured/mask_pool.py).
    max_workers: int = 8
    # A mask still computing this long after a worker took it fails its request.
    timeout_s: float = 5.0
    # A mask still waiting for a worker this long after it was asked for fails its request.
    queue_timeout_s: float = 30.0
    # How long a step waits, after its forward, for the masks of the rows it samples (all together).
    grace_s: float = 0.002

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.max_workers < self.num_workers:
            raise ValueError(
                f"max_workers must be >= num_workers ({self.num_workers}), got {self.max_workers}"
            )
        if not 0 < self.timeout_s < float("inf"):
            raise ValueError(f"timeout_s must be > 0 and finite, got {self.timeout_s}")
        if not 0 < self.queue_timeout_s < float("inf"):
            raise ValueError(f"queue_timeout_s must be > 0 and finite, got {self.queue_timeout_s}")
        if not 0 <= self.grace_s <= self.timeout_s:
            raise ValueError(f"grace_s must be in [0, timeout_s], got {self.grace_s}")


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs to start."""

    model_path: str
    dtype: str = "float32"
    device: str = "cpu"
    model_version: str = "default"
    tokenizer_path: str | None = None  # None: the tokenizer in model_path
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    use_triton: bool | None = None  # None: on CUDA only
    use_cuda_graphs: bool | None = None  # None: on CUDA only
    # None: on CPU in float32/bfloat16 where oneDNN can pack (engine/models/packed_linear.py)
    cpu_packed_linear: bool | None = None
    # A second copy of every linear weight for decode steps of few rows, read at the memory
    # bandwidth: twice the linear weights' memory (engine/models/packed_linear.py). True: for
    # one-row steps; None: where the packed path is on in float32 and this machine measures that
    # it pays, for the row counts it pays at (engine/models/row_weight_probe.py).
    cpu_row_weights: bool | None = None
    # On CPU, torch's intra-op threads for steps feeding at least `cpu_wide_step_rows` rows (decode
    # rows plus prompt tokens; engine/runner/step_threads.py); the other steps keep the process's count.
    # None: no switch.
    cpu_wide_step_threads: int | None = None
    cpu_wide_step_rows: int = WIDE_STEP_ROWS
    # On CPU, decode steps within the C row kernels' reach run them on the kernels' work pool
    # with torch on one thread (kernels/cpu_work_pool.py); False: on torch's OpenMP threads.
    cpu_kernel_pool: bool = True
    # On CPU in float32, decode steps within the C row kernels' reach run every layer in one C
    # call (engine/models/native_decode.py); False: the layers' C kernels one by one from Python.
    cpu_decode_layers: bool = True
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)  # off by default
    lora: LoraConfig = field(default_factory=LoraConfig)  # off by default
    masks: MaskConfig = field(default_factory=MaskConfig)  # grammar masks computed ahead
    kv_store: KVStoreConfig | None = None  # the shared KV store tier; None: off

    def __post_init__(self) -> None:
        if self.cpu_wide_step_threads is not None and self.cpu_wide_step_threads < 1:
            raise ValueError(f"cpu_wide_step_threads must be >= 1, got {self.cpu_wide_step_threads}")
        if self.cpu_wide_step_rows < 1:
            raise ValueError(f"cpu_wide_step_rows must be >= 1, got {self.cpu_wide_step_rows}")
        if self.cpu_row_weights and (
            self.device != "cpu" or self.dtype != "float32" or self.cpu_packed_linear is False
        ):
            raise ValueError(
                "cpu_row_weights needs device cpu, float32 and the packed path, got "
                f"{self.device} {self.dtype} cpu_packed_linear={self.cpu_packed_linear}"
            )
        if self.dtype not in ENGINE_DTYPES:
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")
        if not self.model_path:
            raise ValueError("model_path must not be empty")
        if self.cpu_packed_linear and (self.device != "cpu" or self.dtype == "float16"):
            raise ValueError(
                f"cpu_packed_linear needs device cpu and float32 or bfloat16, got {self.device} {self.dtype}"
            )
