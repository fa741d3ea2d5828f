"""The engine's load and counters as its callers read them: `EngineStats` and its parts."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from weir.engine.kv.host_kv_tier import HostKVStats
from weir.engine.kv.store.stats import KVStoreStats
from weir.engine.latency_targets import NO_CLASS_TARGETS, ClassTargets
from weir.engine.lora.lora_types import AdapterInfo
from weir.engine.scheduling.slo_tally import SloStats
from weir.engine.scheduling.step_budget import StepBudgetStats

# Field metadata of an `EngineStats` field that describes one engine (a setting), not a count or
# a rate: a total over several engines keeps the first one's instead of summing them.
DESCRIBES_ENGINE = "describes_engine"


@dataclass(frozen=True)
class StepThreadsStats:
    """The CPU's intra-op threads per step (engine/runner/step_threads.py): the counts, the steps run
    wide, and each measured bucket's choice as (the bucket's least rows, the count it runs on)."""

    decode_threads: int
    wide_threads: int
    num_wide_steps: int = 0
    choices: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class StepTimeTotals:
    """Steps the model runner ran since start and their seconds, by kind: `prefill` fed prompt
    tokens (or speculative drafts to verify), `decode` fed decode rows only. Every running stream
    waits for every step, so the prefill steps' share of the seconds is what other requests'
    prompts add to its ITL (docs/benchmarks.md, ninth stop on issue 27)."""

    decode_steps: int = 0
    decode_seconds: float = 0.0
    prefill_steps: int = 0
    prefill_seconds: float = 0.0

    def plus(self, *, prefill: bool, seconds: float) -> StepTimeTotals:
        """These totals with one more step of `seconds`."""
        if prefill:
            return replace(
                self, prefill_steps=self.prefill_steps + 1, prefill_seconds=self.prefill_seconds + seconds
            )
        return replace(self, decode_steps=self.decode_steps + 1, decode_seconds=self.decode_seconds + seconds)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of engine load, for admission, metrics and health."""

    num_running: int
    num_waiting: int
    num_total_blocks: int
    num_free_blocks: int
    block_size: int = field(metadata={DESCRIBES_ENGINE: True})
    num_waiting_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    prefill_tokens_per_s: float = 0.0  # measured, moving average
    decode_steps_per_s: float = 0.0
    num_prompt_tokens_total: int = 0
    num_generation_tokens_total: int = 0
    waiting_tokens_by_priority: tuple[int, ...] = field(default=(0, 0, 0))
    running_by_priority: tuple[int, ...] = field(default=(0, 0, 0))  # running sequences per class
    num_restarts: int = 0  # times the engine loop restarted after an exception it could not contain
    num_stalls: int = 0  # stalls the watchdog detected and broke (engine/scheduling/stall_watchdog.py)
    # Grammar masks computed ahead (engine/runner/mask_prefetch.py): rows that sat a step out because
    # theirs was not ready, and requests failed because it stayed late past its time limit.
    num_grammar_masks_late: int = 0
    num_grammar_mask_timeouts: int = 0
    # Mask worker threads started beyond the pool's size so that a tenant got one at once
    # while other tenants' masks held them all (engine/structured/mask_pool.py).
    num_grammar_mask_workers_added: int = 0
    step_budget: StepBudgetStats | None = None  # the scheduler's token budget and fitted step cost
    host_kv: HostKVStats | None = None  # the host KV tier; None: it is off
    kv_store: KVStoreStats | None = None  # the shared KV store tier; None: it is off
    # Speculative decoding totals: draft tokens verified, accepted, and tokens emitted by verify steps.
    num_spec_draft_tokens_total: int = 0
    num_spec_accepted_tokens_total: int = 0
    num_spec_emitted_tokens_total: int = 0
    adapters: tuple[AdapterInfo, ...] = ()  # the loaded LoRA adapters with their counters
    slo: SloStats = field(default_factory=SloStats)  # targets met per class and tenant, preemptions by reason
    class_targets: ClassTargets = NO_CLASS_TARGETS  # the engine's TTFT/ITL defaults per class
    # Input rows up to which the CPU linears use their row copies (0: none; see
    # engine/models/row_weight_probe.py), as chosen for this engine at load.
    cpu_row_inputs: int = field(default=0, metadata={DESCRIBES_ENGINE: True})
    # Decode steps whose layers ran in one C call (engine/models/native_decode.py), of step_times' decode steps.
    native_decode_steps: int = 0
    step_threads: StepThreadsStats | None = None  # None: one count for every step (GPU, or switched off)
    step_times: StepTimeTotals = field(default_factory=StepTimeTotals)  # steps and seconds, decode / prefill

    @property
    def kv_usage(self) -> float:
        if self.num_total_blocks == 0:
            return 0.0
        return 1.0 - self.num_free_blocks / self.num_total_blocks

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
