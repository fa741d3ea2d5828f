"""`weir bench offline`: the engine alone, side by side with Hugging Face in one run.

Systems: HF static batching (`generate` on padded batches), HF continuous batching
(`transformers.generation.continuous_batching`), and Weir's static, dynamic and continuous batch
policies. All requests of the workload are submitted at t=0 (offline throughput); TTFT and TPOT
come from each system's own per-token timestamps. The report also gives the compute-roofline
lower bound: model FLOPs / the measured peak GEMM FLOP/s of this machine.
"""

from __future__ import annotations

import argparse
import enum
import gc
import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weir_bench.engine_loop import run_until_done
from weir_bench.flops import WorkItem, measure_peak_gemm_flops, model_gemm_shapes, request_flops
from weir_bench.stats import Distribution, LatencySummary


class System(enum.Enum):
    """A system under test."""

    HF_STATIC = "hf-static"
    HF_CONTINUOUS = "hf-continuous"
    WEIR_STATIC = "weir-static"
    WEIR_DYNAMIC = "weir-dynamic"
    WEIR_CONTINUOUS = "weir-continuous"


@dataclass(frozen=True)
class OfflineRequest:
    """A tokenized request of the workload."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int


@dataclass
class RunResult:
    """What one system did with the workload."""

    system: str
    wall_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)

    @property
    def output_tok_s(self) -> float:
        return self.num_output_tokens / self.wall_s

    @property
    def total_tok_s(self) -> float:
        return (self.num_prompt_tokens + self.num_output_tokens) / self.wall_s


def load_requests(path: Path, tokenizer: Any, limit: int | None = None) -> list[OfflineRequest]:
    """Tokenize a trace (chat requests through the chat template), in arrival order."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: r.get("t", 0.0))
    out = []
    for row in rows[:limit] if limit else rows:
        if row.get("kind", "chat") == "chat":
            ids = tokenizer.apply_chat_template(
                row["messages"], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        else:
            ids = tokenizer.encode(row["prompt"])
        out.append(OfflineRequest(row["id"], tuple(int(t) for t in ids), int(row["max_tokens"])))
    return out


# -- Weir ------------------------------------------------------------------------------------


def run_weir(
    model_path: str, reqs: list[OfflineRequest], system: System, args: argparse.Namespace
) -> RunResult:
    """Our engine, stepped directly (no HTTP), all requests queued at t=0."""
    from weir.engine.client import EngineRequest
    from weir.engine.config import BatchPolicy, CacheConfig, EngineConfig, SchedulerConfig
    from weir.engine.engine_builder import build_engine
    from weir.engine.request import SamplingParams

    policy = {
        System.WEIR_STATIC: BatchPolicy.STATIC,
        System.WEIR_DYNAMIC: BatchPolicy.DYNAMIC,
        System.WEIR_CONTINUOUS: BatchPolicy.CONTINUOUS,
    }[system]
    engine = build_engine(
        EngineConfig(
            model_path=model_path,
            dtype=args.dtype,
            cache=CacheConfig(memory_budget_bytes=args.kv_budget_mib << 20, enable_prefix_caching=False),
            scheduler=SchedulerConfig(
                max_num_batched_tokens=args.max_num_batched_tokens,
                max_num_seqs=args.max_num_seqs,
                max_model_len=4096,
                batch_policy=policy,
                static_batch_size=args.batch_size,
                static_max_wait_s=0.0,
                dynamic_window_s=args.dynamic_window_s,
                target_step_s=args.target_step_ms / 1e3 if args.target_step_ms else None,
            ),
        )
    )
    t0 = time.monotonic()
    for r in reqs:
        params = SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True)
        engine.add_request(EngineRequest(r.request_id, r.prompt_token_ids, params, arrival_s=t0))
    ttft, tpot = [], []
    num_out = 0
    for o in run_until_done(engine):
        num_out += len(o.new_token_ids)
        if o.finished and o.metrics is not None:
            if o.metrics.ttft_s is not None:
                ttft.append(o.metrics.ttft_s)
            if o.metrics.tpot_s is not None:
                tpot.append(o.metrics.tpot_s)
    wall = time.monotonic() - t0
    return RunResult(system.value, wall, sum(len(r.prompt_token_ids) for r in reqs), num_out, ttft, tpot)


# -- Hugging Face ----------------------------------------------------------------------------


def _hf_model(model_path: str, dtype_name: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype_name)).eval()


def run_hf_static(model_path: str, reqs: list[OfflineRequest], args: argparse.Namespace) -> RunResult:
    """transformers `generate` on left-padded batches of `batch_size`, in arrival order.

    A batch runs until its longest request is done; only the tokens each request asked for count.
    """
    import torch
    from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

    model = _hf_model(model_path, args.dtype)
    step_times: list[float] = []

    class StepClock(LogitsProcessor):  # records when each generation step produced its logits
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            step_times.append(time.monotonic())
            return scores

    pad = model.generation_config.pad_token_id or 0
    t0 = time.monotonic()
    ttft, tpot = [], []
    num_out = 0
    with torch.inference_mode():
        for start in range(0, len(reqs), args.batch_size):
            batch = reqs[start : start + args.batch_size]
            width = max(len(r.prompt_token_ids) for r in batch)
            ids = torch.tensor(
                [[pad] * (width - len(r.prompt_token_ids)) + list(r.prompt_token_ids) for r in batch]
            )
            mask = torch.tensor(
                [[0] * (width - len(r.prompt_token_ids)) + [1] * len(r.prompt_token_ids) for r in batch]
            )
            steps = max(r.max_tokens for r in batch)
            step_times.clear()
            cfg = GenerationConfig(max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=pad)
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=cfg,
                logits_processor=LogitsProcessorList([StepClock()]),
            )
            for r in batch:
                num_out += r.max_tokens
                ttft.append(step_times[0] - t0)
                if r.max_tokens > 1:
                    tpot.append((step_times[r.max_tokens - 1] - step_times[0]) / (r.max_tokens - 1))
    wall = time.monotonic() - t0
    return RunResult(
        System.HF_STATIC.value, wall, sum(len(r.prompt_token_ids) for r in reqs), num_out, ttft, tpot
    )


def run_hf_continuous(model_path: str, reqs: list[OfflineRequest], args: argparse.Namespace) -> RunResult:
    """transformers' own continuous batching manager, per-request max_new_tokens, EOS disabled."""
    from transformers import GenerationConfig

    model = _hf_model(model_path, args.dtype)
    pad = model.generation_config.pad_token_id or 0
    cfg = GenerationConfig(
        max_new_tokens=max(r.max_tokens for r in reqs), do_sample=False, eos_token_id=None, pad_token_id=pad
    )
    results: dict[str, Any] = {}
    with model.continuous_batching_context_manager(generation_config=cfg, block=True, timeout=30) as manager:
        t0 = time.perf_counter()  # transformers stamps tokens with time.perf_counter
        for r in reqs:
            manager.add_request(
                list(r.prompt_token_ids),
                request_id=r.request_id,
                max_new_tokens=r.max_tokens,
                record_timestamps=True,
            )
        while len(results) < len(reqs):
            res = manager.get_result(timeout=1)
            if res is not None and res.is_finished():
                results[res.request_id] = res
        wall = time.perf_counter() - t0
    ttft, tpot = [], []
    num_out = 0
    for res in results.values():
        num_out += len(res.generated_tokens)
        stamps = list(getattr(res, "timestamps", None) or [])
        if stamps:
            ttft.append(stamps[0] - t0)
            if len(stamps) > 1:
                tpot.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
    return RunResult(
        System.HF_CONTINUOUS.value, wall, sum(len(r.prompt_token_ids) for r in reqs), num_out, ttft, tpot
    )


# -- report ----------------------------------------------------------------------------------


def build_report(
    results: list[RunResult], reqs: list[OfflineRequest], model_cfg: Any, peak: float, meta: dict[str, Any]
) -> dict[str, Any]:
    flops = sum(request_flops(model_cfg, WorkItem(len(r.prompt_token_ids), r.max_tokens)) for r in reqs)
    bound = flops / peak
    by = {r.system: r for r in results}
    rows = {}
    for r in results:
        row: dict[str, Any] = {
            "wall_s": r.wall_s,
            "output_tok_s": r.output_tok_s,
            "total_tok_s": r.total_tok_s,
            "x_roofline": r.wall_s / bound,
            "ttft_ms": LatencySummary.of(t * 1e3 for t in r.ttft_s).to_json(),
            "tpot_ms": LatencySummary.of(t * 1e3 for t in r.tpot_s).to_json(),
            "num_output_tokens": r.num_output_tokens,
        }
        for peer in (System.HF_STATIC.value, System.HF_CONTINUOUS.value):
            if peer in by and r.system != peer:
                row[f"total_tok_s_vs_{peer}"] = r.total_tok_s / by[peer].total_tok_s
        rows[r.system] = row
    return {
        "metadata": meta,
        "model_flops": flops,
        "peak_gemm_flop_s": peak,
        "roofline_wall_s": bound,
        "systems": rows,
    }


def to_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"Roofline lower bound: {report['roofline_wall_s']:.1f} s "
        f"({report['model_flops'] / 1e12:.2f} TFLOP at a measured {report['peak_gemm_flop_s'] / 1e9:.1f} GFLOP/s)",
        "",
        "| system | wall s | output tok/s | total tok/s | × roofline | vs hf-static | vs hf-continuous "
        "| TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in report["systems"].items():
        vs_s = r.get("total_tok_s_vs_hf-static")
        vs_c = r.get("total_tok_s_vs_hf-continuous")
        lines.append(
            f"| {name} | {r['wall_s']:.1f} | {r['output_tok_s']:.1f} | {r['total_tok_s']:.1f} | {r['x_roofline']:.2f} "
            f"| {f'{vs_s:.2f}×' if vs_s else '—'} | {f'{vs_c:.2f}×' if vs_c else '—'} "
            f"| {_ms(r['ttft_ms']['p50'], 0)} | {_ms(r['ttft_ms']['p99'], 0)} "
            f"| {_ms(r['tpot_ms']['p50'], 1)} | {_ms(r['tpot_ms']['p99'], 1)} |"
        )
    return "\n".join(lines) + "\n"


def _ms(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload", type=Path, required=True, help="JSONL trace, e.g. shared/workloads/mixed.jsonl"
    )
    p.add_argument("--model", default=None, help="HF model folder (default: the prepared SmolLM2)")
    p.add_argument(
        "--random-model",
        action="store_true",
        help="use a random 8-layer hidden-512 GQA Llama with the default model's tokenizer",
    )
    p.add_argument(
        "--systems",
        default=",".join(s.value for s in System),
        help="comma-separated: " + ", ".join(s.value for s in System),
    )
    p.add_argument("--limit", type=int, default=None, help="only the first N requests")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--batch-size", type=int, default=16, help="static batch size (HF static and weir-static)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--dynamic-window-s", type=float, default=0.05)
    p.add_argument(
        "--target-step-ms",
        type=float,
        default=None,
        help="Weir's step budget follows this target step time (engine/scheduling/step_budget.py); default: fixed",
    )
    p.add_argument("--kv-budget-mib", type=int, default=2048)
    p.add_argument("--out", type=Path, default=Path("bench-out/offline"))
    p.set_defaults(func=offline_command)


def offline_command(args: argparse.Namespace, model_path: str | None = None) -> int:
    """Run every selected system on the workload and write offline.json and offline.md."""
    from transformers import AutoTokenizer

    from weir.engine.runner.loader import load_model_config

    path = model_path or args.model
    if path is None:
        raise SystemExit("--model is required (the weir CLI fills in the default model)")
    if args.random_model:
        from weir_bench.random_model import make_random_llama

        path = str(make_random_llama(args.out / "random-model", tokenizer_dir=Path(path)))
    tokenizer = AutoTokenizer.from_pretrained(path)
    reqs = load_requests(args.workload, tokenizer, args.limit)
    model_cfg = load_model_config(path)
    shapes = model_gemm_shapes(model_cfg)
    peak = measure_peak_gemm_flops(
        dtype_name=args.dtype, shapes=shapes
    )  # before and after the runs: the best
    systems = [System(s.strip()) for s in args.systems.split(",") if s.strip()]
    results = []
    for system in systems:
        print(f"running {system.value} on {len(reqs)} requests ...", flush=True)
        if system is System.HF_STATIC:
            res = run_hf_static(path, reqs, args)
        elif system is System.HF_CONTINUOUS:
            res = run_hf_continuous(path, reqs, args)
        else:
            res = run_weir(path, reqs, system, args)
        print(f"  {res.system}: {res.wall_s:.1f} s, {res.total_tok_s:.1f} total tok/s", flush=True)
        results.append(res)
        gc.collect()
    peak = max(peak, measure_peak_gemm_flops(dtype_name=args.dtype, shapes=shapes))
    meta = {
        "workload": str(args.workload),
        "num_requests": len(reqs),
        "prompt_tokens": Distribution.of(len(r.prompt_token_ids) for r in reqs).to_json(),
        "output_tokens": Distribution.of(r.max_tokens for r in reqs).to_json(),
        "model": path,
        "dtype": args.dtype,
        "batch_size": args.batch_size,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "target_step_ms": args.target_step_ms,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": _cpus()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    report = build_report(results, reqs, model_cfg, peak, meta)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "offline.json").write_text(json.dumps(report, indent=2))
    md = to_markdown(report)
    (args.out / "offline.md").write_text(md)
    print(md)
    return 0


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
