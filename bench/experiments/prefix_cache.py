"""Prefix-cache benchmark: one workload replayed with the cache on and off, in one run, plus a
cross-tenant timing probe.

    python -m weir_bench.experiments.prefix_cache --model PATH [--workload prefix.jsonl] [--out report.json]

The engine is driven directly (no HTTP): requests join at their trace arrival times (open loop,
`--time-scale` stretches them), and TTFT is the engine's own arrival-to-first-token time. Both
runs use the same configuration except `enable_prefix_caching`. Reported per run: TTFT
percentiles, prompt tokens computed (prefill work actually done) against prompt tokens sent, and
cached tokens. Targets (issue 7): TTFT p50 with the cache <= 0.25x without; prefill computed
drops by >= 80%.

Timing probe (on the warm cache-on engine, idle between probes): for each trial a fresh probing
tenant sends (a) a victim tenant's exact prompt, (b) an unseen prompt of the same length
("cold", a miss by construction) and, as a control, (c) the victim re-sends its own prompt (a
real hit). Isolation holds when (a) is indistinguishable from (b): the report gives both
distributions and a Mann-Whitney U test; (c) shows that the probe would see a hit if there were one.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weir.engine.output import SchedulerOutput
from weir.engine.request import Request
from weir.engine.runner.runner import ModelRunner, StepResult
from weir.engine.sampling.draft_verifier import Draft
from weir_bench.engine_loop import run_until_done
from weir_bench.stats import LatencySummary

DEFAULT_WORKLOAD = Path(__file__).resolve().parents[2] / ".." / "shared" / "workloads" / "prefix.jsonl"


@dataclass(frozen=True)
class TracedRequest:
    """A tokenized request of the trace."""

    request_id: str
    t: float
    tenant: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int


@dataclass
class RunResult:
    """One replay of the workload."""

    caching: bool
    wall_s: float
    ttft_s: list[float] = field(default_factory=list)
    num_prompt_tokens: int = 0  # sent
    num_prefill_tokens: int = 0  # computed by the engine (cache hits are not)
    num_cached_tokens: int = 0
    num_output_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "prefix_caching": self.caching,
            "wall_s": round(self.wall_s, 3),
            "ttft_ms": LatencySummary.of(x * 1e3 for x in self.ttft_s).to_json(),
            "num_requests": len(self.ttft_s),
            "prompt_tokens": self.num_prompt_tokens,
            "prefill_tokens_computed": self.num_prefill_tokens,
            "cached_tokens": self.num_cached_tokens,
            "output_tokens": self.num_output_tokens,
        }


def load_trace(path: Path, tokenizer: Any, limit: int | None) -> list[TracedRequest]:
    """Tokenize chat requests through the model's chat template, as the gateway does."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: r.get("t", 0.0))
    out = []
    for row in rows[:limit] if limit else rows:
        if row.get("kind", "chat") == "chat":
            text = tokenizer.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)
            ids = tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = tokenizer.encode(row["prompt"])
        out.append(
            TracedRequest(row["id"], float(row["t"]), row["tenant"], tuple(ids), int(row["max_tokens"]))
        )
    return out


class PrefillCountingRunner(ModelRunner):
    """The engine's model runner, also counting the prompt positions it feeds the model.

    That count is the prefill work actually done: positions the prefix cache supplied are never
    fed. Built from a loaded runner: the same model, KV tensors, sampler and CUDA graphs.
    """

    def __init__(self, loaded: ModelRunner) -> None:
        super().__init__(
            loaded.model,
            loaded.kv_caches,
            loaded.block_size,
            loaded.device,
            sampler=loaded.sampler,
            graphs=loaded.graphs,
        )
        self.num_prefill_tokens = 0

    def execute(
        self,
        out: SchedulerOutput,
        requests: Mapping[str, Request],
        drafts: Mapping[str, Draft] | None = None,
    ) -> StepResult:
        for s in out.scheduled:
            end = min(s.num_computed_tokens + s.num_tokens, requests[s.request_id].num_prompt_tokens)
            self.num_prefill_tokens += max(0, end - s.num_computed_tokens)
        return super().execute(out, requests, drafts)


def build(args: argparse.Namespace, caching: bool) -> tuple[Any, PrefillCountingRunner]:
    """An LLMEngine with this run's configuration, and its runner (a `PrefillCountingRunner`)."""
    from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
    from weir.engine.engine_builder import build_engine
    from weir.engine.llm_engine import LLMEngine

    block_size = 16
    num_blocks = args.kv_cache_tokens // block_size + 1
    config = EngineConfig(
        model_path=args.model,
        dtype=args.dtype,
        device=args.device,
        cache=CacheConfig(
            block_size=block_size,
            num_blocks=num_blocks,
            kv_dtype=args.dtype,
            enable_prefix_caching=caching,
            tenant_cache_share=args.tenant_cache_share,
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            max_model_len=4096,
        ),
    )
    loaded = build_engine(config)  # loads the model, sizes the KV tensors, captures graphs
    runner = PrefillCountingRunner(loaded.runner)
    engine = LLMEngine(config, loaded.model_config, loaded.tokenizer, runner, num_blocks)
    return engine, runner


def _params(max_tokens: int) -> Any:
    from weir.engine.request import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def replay(
    engine: Any,
    runner: PrefillCountingRunner,
    trace: Sequence[TracedRequest],
    caching: bool,
    time_scale: float,
) -> RunResult:
    """Open-loop replay: each request joins at its arrival time; step while there is work."""
    from weir.engine.client import EngineRequest

    result = RunResult(caching, 0.0)
    prefill_before = runner.num_prefill_tokens
    t0 = time.monotonic()
    arrivals = [
        EngineRequest(
            r.request_id,
            r.prompt_token_ids,
            _params(r.max_tokens),
            r.tenant,
            cache_scope=r.tenant,
            arrival_s=t0 + r.t * time_scale,
        )
        for r in trace
    ]
    result.num_prompt_tokens = sum(len(r.prompt_token_ids) for r in trace)
    for out in run_until_done(engine, arrivals):
        result.num_output_tokens += len(out.new_token_ids)
        if out.finished:
            result.num_cached_tokens += out.num_cached_tokens
            if out.metrics is not None and out.metrics.ttft_s is not None:
                result.ttft_s.append(out.metrics.ttft_s)
    result.wall_s = time.monotonic() - t0
    result.num_prefill_tokens = runner.num_prefill_tokens - prefill_before
    return result


def _ttft_alone(engine: Any, rid: str, prompt: Sequence[int], tenant: str) -> tuple[float, int]:
    """TTFT of one request on an otherwise idle engine, and its cached tokens."""
    from weir.engine.client import EngineRequest

    engine.add_request(EngineRequest(rid, tuple(prompt), _params(1), tenant, cache_scope=tenant))
    ttft, cached = math.nan, -1
    for out in run_until_done(engine):
        if out.finished and out.metrics is not None and out.metrics.ttft_s is not None:
            ttft, cached = out.metrics.ttft_s, out.num_cached_tokens
    return ttft, cached


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation, continuity correction).

    The asymptotic method at every sample size, as this report has always given; ties also
    correct the variance (scipy's standard), which untied timings never need.
    """
    from scipy.stats import mannwhitneyu

    if not a or not b or len(set(a) | set(b)) < 2:  # nothing to compare, or all tied: no evidence
        return 1.0
    return float(mannwhitneyu(a, b, alternative="two-sided", method="asymptotic").pvalue)


def timing_probe(engine: Any, trace: Sequence[TracedRequest], trials: int, seed: int = 0) -> dict[str, Any]:
    """Cross-tenant probe against a miss and a real hit, interleaved, on the warm engine."""
    rng = random.Random(seed)
    victims = [r for r in trace if r.tenant == trace[0].tenant]
    cross, cold, own = [], [], []
    cross_cached = cold_cached = 0
    vocab = engine.model_config.vocab_size
    for k in range(trials):
        victim = victims[k % len(victims)]
        order = ["cross", "cold", "own"]
        rng.shuffle(order)  # no probe kind always runs first (warm CPU caches, allocator state)
        for kind in order:
            prober = f"probe-{k}"
            if kind == "cross":
                ttft, cached = _ttft_alone(engine, f"cross-{k}", victim.prompt_token_ids, prober)
                cross.append(ttft)
                cross_cached += cached
            elif kind == "cold":
                unseen = [rng.randrange(3, vocab) for _ in victim.prompt_token_ids]
                ttft, cached = _ttft_alone(engine, f"cold-{k}", unseen, f"{prober}-cold")
                cold.append(ttft)
                cold_cached += cached
            else:
                ttft, _ = _ttft_alone(engine, f"own-{k}", victim.prompt_token_ids, victim.tenant)
                own.append(ttft)
    ms = lambda xs: LatencySummary.of(x * 1e3 for x in xs).to_json()  # noqa: E731
    p_cross_cold = mann_whitney_p(cross, cold)
    return {
        "trials": trials,
        "prompt_tokens": [len(v.prompt_token_ids) for v in victims[: min(trials, len(victims))]],
        "cross_tenant_ttft_ms": ms(cross),
        "cold_miss_ttft_ms": ms(cold),
        "own_tenant_hit_ttft_ms": ms(own),
        "cross_tenant_cached_tokens": cross_cached,
        "cold_cached_tokens": cold_cached,
        "p_value_cross_vs_cold": round(p_cross_cold, 4),
        "p_value_own_vs_cold": round(mann_whitney_p(own, cold), 6),
        "indistinguishable": cross_cached == 0 and p_cross_cold > 0.05,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both replays and the probe; returns the report."""
    import torch
    from transformers import AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    trace = load_trace(Path(args.workload), tokenizer, args.limit)
    runs: dict[str, RunResult] = {}
    probe: dict[str, Any] = {}
    for caching in (False, True):  # the cold run first, so neither profits from a warmer machine
        engine, runner = build(args, caching)
        _ttft_alone(engine, "warmup", trace[0].prompt_token_ids[:64], "<warmup>")
        engine.prefix_cache.flush(include_pinned=True)
        runs["on" if caching else "off"] = replay(engine, runner, trace, caching, args.time_scale)
        if caching and args.probe_trials:
            probe = timing_probe(engine, trace, args.probe_trials)
        del engine, runner
        gc.collect()
    on, off = runs["on"], runs["off"]
    p50_on = LatencySummary.of(on.ttft_s).p50 or math.nan
    p50_off = LatencySummary.of(off.ttft_s).p50 or math.nan
    ttft_ratio = p50_on / p50_off if p50_off else math.nan
    prefill_drop = 1 - on.num_prefill_tokens / off.num_prefill_tokens if off.num_prefill_tokens else math.nan
    return {
        "benchmark": "prefix_cache",
        "workload": str(args.workload),
        "num_requests": len(trace),
        "model": args.model,
        "device": args.device,
        "dtype": args.dtype,
        "config": {
            "kv_cache_tokens": args.kv_cache_tokens,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "max_num_seqs": args.max_num_seqs,
            "tenant_cache_share": args.tenant_cache_share,
            "time_scale": args.time_scale,
            "threads": args.threads,
        },
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0]},
        "runs": {"off": off.to_json(), "on": on.to_json()},
        "ttft_p50_ratio_on_over_off": round(ttft_ratio, 4),
        "prefill_tokens_drop": round(prefill_drop, 4),
        "targets": {
            "ttft_p50_ratio_le_0.25": ttft_ratio <= 0.25,
            "prefill_drop_ge_0.80": prefill_drop >= 0.80,
            "cross_tenant_probe_indistinguishable": probe.get("indistinguishable"),
        },
        "timing_probe": probe,
    }


def to_markdown(report: dict[str, Any]) -> str:
    """A short table for docs/benchmarks.md."""
    rows = [
        "| prefix cache | TTFT p50 ms | TTFT p90 ms | prompt tokens | prefill computed | cached |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("off", "on"):
        r = report["runs"][name]
        rows.append(
            f"| {name} | {r['ttft_ms']['p50']} | {r['ttft_ms']['p90']} | {r['prompt_tokens']} | "
            f"{r['prefill_tokens_computed']} | {r['cached_tokens']} |"
        )
    lines = [
        *rows,
        "",
        f"TTFT p50 on/off: {report['ttft_p50_ratio_on_over_off']} (target <= 0.25); "
        f"prefill computed drop: {report['prefill_tokens_drop']:.1%} (target >= 80%)",
    ]
    probe = report.get("timing_probe") or {}
    if probe:
        lines.append(
            f"Timing probe ({probe['trials']} trials): cross-tenant TTFT p50 {probe['cross_tenant_ttft_ms']['p50']} ms "
            f"vs cold miss {probe['cold_miss_ttft_ms']['p50']} ms (p={probe['p_value_cross_vs_cold']}, "
            f"cached tokens {probe['cross_tenant_cached_tokens']}); own-tenant hit "
            f"{probe['own_tenant_hit_ttft_ms']['p50']} ms (p={probe['p_value_own_vs_cold']})"
        )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a Hugging Face model folder (e.g. the prepared SmolLM2)")
    p.add_argument(
        "--workload", default=str(DEFAULT_WORKLOAD.resolve()), help="a JSONL trace (default prefix.jsonl)"
    )
    p.add_argument("--limit", type=int, default=None, help="only the first N requests")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--kv-cache-tokens", type=int, default=16384)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--tenant-cache-share", type=float, default=1.0)
    p.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply arrival times (>1: slower arrivals)"
    )
    p.add_argument("--probe-trials", type=int, default=12)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", default=None, help="write the JSON report here")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.prefix_cache", description=__doc__.split("\n\n")[0]
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    report = run(args)
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(to_markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
