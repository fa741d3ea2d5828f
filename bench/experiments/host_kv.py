"""Host KV tier benchmark (issue 14): swap vs recompute vs an unconstrained pool, and multi-turn chat.

    python -m weir_bench.experiments.host_kv --model PATH [--workload mixed.jsonl] [--out report.json]

Part 1, preemption: the first `--requests` (48) requests of the workload are sent at once to
three engines in one run, one after the other (`--rounds`, alternating the order): **swap** (device pool `--device-tokens`, 4,096;
host tier `--host-tokens`, 32,768; the cost model picks swap or recompute per victim),
**recompute** (the same device pool, no host tier: every preemption recomputes) and
**unconstrained** (a device pool that holds every request at once: no preemption). Reported per
engine: requests completed, wall time, output tokens per second, preemptions by mode, blocks
swapped, prefill tokens computed (recomputation included) and TTFT/TPOT percentiles. Targets:
all complete; swap >= 0.8x the unconstrained throughput and better than recompute.

Part 2, multi-turn chat: `--conversations` tenants each hold a `--turns`-turn conversation (the
user turns are the workload's messages; the assistant turns are the model's greedy answers); each
turn of every conversation is sent together, the next turn once all have answered. User turns are
cut to `--chat-user-tokens` so that every history fits the device pool alone; the device pool
(`--chat-device-tokens`) is smaller than the histories together, so a history's cached
blocks are evicted between its turns. With a host tier they are demoted there and promoted at the
next turn; without, they are recomputed. Reported: prefill tokens computed with and without, the
tokens the host tier saved, promotions, and whether both gave the same tokens.

The engine is driven directly (no HTTP). Timings on a shared machine are noisy: compare the
engines of one run with each other, not across runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weir_bench.engine_loop import run_until_done
from weir_bench.stats import LatencySummary

DEFAULT_WORKLOAD = Path(__file__).resolve().parents[2] / ".." / "shared" / "workloads" / "mixed.jsonl"
BLOCK_SIZE = 16


@dataclass
class Variant:
    """One engine configuration of part 1."""

    name: str
    device_tokens: int
    host_tokens: int


@dataclass
class PreemptionRun:
    """What one engine did with the burst."""

    name: str
    device_tokens: int
    host_tokens: int
    num_requests: int
    num_completed: int = 0
    wall_s: float = 0.0
    num_output_tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "device_kv_tokens": self.device_tokens,
            "host_kv_tokens": self.host_tokens,
            "requests": self.num_requests,
            "completed": self.num_completed,
            "wall_s": round(self.wall_s, 2),
            "output_tokens": self.num_output_tokens,
            "output_tokens_per_s": round(self.num_output_tokens / self.wall_s, 2) if self.wall_s else None,
            "ttft_ms": LatencySummary.of(x * 1e3 for x in self.ttft_s).to_json(1),
            "tpot_ms": LatencySummary.of(x * 1e3 for x in self.tpot_s).to_json(1),
            **self.stats,
        }


def load_chat_rows(path: Path, limit: int) -> list[dict[str, Any]]:
    """The first `limit` chat requests of the workload, in arrival order."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("kind", "chat") == "chat"]
    rows.sort(key=lambda r: r.get("t", 0.0))
    return rows[:limit]


def build(args: argparse.Namespace, device_tokens: int, host_tokens: int) -> Any:
    """An engine with this device pool and host tier (the copy bandwidth is measured while it starts)."""
    from weir.engine.config import CacheConfig, EngineConfig, QueuePolicy, SchedulerConfig
    from weir.engine.engine_builder import build_engine

    config = EngineConfig(
        model_path=args.model,
        dtype=args.dtype,
        device=args.device,
        cache=CacheConfig(
            block_size=BLOCK_SIZE,
            num_blocks=-(-device_tokens // BLOCK_SIZE) + 1,
            kv_dtype=args.dtype,
            host_num_blocks=-(-host_tokens // BLOCK_SIZE),
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            max_model_len=4096,
            queue_policy=QueuePolicy(args.queue_policy),
        ),
    )
    return build_engine(config)


def _engine_figures(engine: Any, prefill_before: int) -> dict[str, Any]:
    s = engine.stats()
    host = s.host_kv
    swaps = host.num_swap_preemptions if host is not None else 0
    return {
        "preemptions": {"swap": swaps, "recompute": s.num_preemptions - swaps},
        "blocks_swapped_out": host.num_blocks_swapped_out if host is not None else 0,
        "blocks_swapped_in": host.num_blocks_swapped_in if host is not None else 0,
        "prefix_demotions": host.num_demotions if host is not None else 0,
        "prefix_promotions": host.num_promotions if host is not None else 0,
        "copy_gb_per_s": round(host.copy_bytes_per_s / 1e9, 3) if host is not None else None,
        "prefill_tokens_per_s": round(s.prefill_tokens_per_s, 1),
        "prefill_tokens_computed": s.num_prompt_tokens_total - prefill_before,
        "stalls": s.num_stalls,  # the watchdog's count: 0 unless the scheduler stopped making progress
    }


def run_burst(
    args: argparse.Namespace, variant: Variant, prompts: list[tuple[str, str, list[int], int, str]]
) -> PreemptionRun:
    """Send every request at once to a fresh engine of `variant`; step until all are done."""
    from weir.engine.client import EngineRequest
    from weir.engine.request import Priority, SamplingParams

    engine = build(args, variant.device_tokens, variant.host_tokens)
    run = PreemptionRun(variant.name, variant.device_tokens, variant.host_tokens, len(prompts))
    t0 = time.monotonic()
    arrivals = [
        EngineRequest(
            rid,
            tuple(ids),
            SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
            tenant,
            priority=Priority.parse(priority) if args.priorities else Priority.STANDARD,
            cache_scope=tenant,
            arrival_s=t0,
        )
        for rid, tenant, ids, max_tokens, priority in prompts
    ]
    prefill_before = engine.num_prompt_tokens_total
    for out in run_until_done(engine, arrivals, max_steps=args.max_steps):
        run.num_output_tokens += len(out.new_token_ids)
        if out.finished:
            run.num_completed += out.error is None
            if out.metrics is not None and out.metrics.ttft_s is not None:
                run.ttft_s.append(out.metrics.ttft_s)
            if out.metrics is not None and out.metrics.tpot_s is not None:
                run.tpot_s.append(out.metrics.tpot_s)
    run.wall_s = time.monotonic() - t0
    run.stats = _engine_figures(engine, prefill_before)
    del engine
    gc.collect()
    return run


def run_chat(args: argparse.Namespace, host_tokens: int, users: list[str], tokenizer: Any) -> dict[str, Any]:
    """The multi-turn conversations on a small device pool, with `host_tokens` of host tier."""
    from weir.engine.client import EngineRequest
    from weir.engine.request import SamplingParams

    engine = build(args, args.chat_device_tokens, host_tokens)
    histories: list[list[dict[str, str]]] = [[] for _ in range(args.conversations)]
    answers: list[list[int]] = []
    num_cached = 0
    num_prompt = 0
    prefill_before = engine.num_prompt_tokens_total
    t0 = time.monotonic()
    for turn in range(args.turns):
        arrivals = []
        for c, history in enumerate(histories):
            history.append({"role": "user", "content": users[(turn * args.conversations + c) % len(users)]})
            text = tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
            ids = tokenizer.encode(text, add_special_tokens=False)
            num_prompt += len(ids)
            params = SamplingParams(max_tokens=args.chat_max_tokens, temperature=0.0, ignore_eos=True)
            arrivals.append(
                EngineRequest(f"c{c}-t{turn}", tuple(ids), params, f"user{c}", cache_scope=f"user{c}")
            )
        tokens: dict[str, list[int]] = {er.request_id: [] for er in arrivals}
        for out in run_until_done(engine, arrivals, max_steps=args.max_steps):
            tokens[out.request_id].extend(out.new_token_ids)
            if out.finished:
                num_cached += out.num_cached_tokens
        for c, history in enumerate(histories):
            reply = tokens[f"c{c}-t{turn}"]
            answers.append(reply)
            history.append(
                {"role": "assistant", "content": tokenizer.decode(reply, skip_special_tokens=True)}
            )
    wall_s = time.monotonic() - t0
    figures = _engine_figures(engine, prefill_before)
    del engine
    gc.collect()
    return {
        "host_kv_tokens": host_tokens,
        "wall_s": round(wall_s, 2),
        "prompt_tokens_sent": num_prompt,
        "cached_tokens": num_cached,
        **figures,
        "_answers": answers,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model folder (SmolLM2-135M-Instruct)")
    parser.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--device-tokens", type=int, default=4096)
    parser.add_argument("--host-tokens", type=int, default=32768)
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--chat-device-tokens", type=int, default=1024)
    parser.add_argument("--chat-max-tokens", type=int, default=32)
    parser.add_argument(
        "--chat-user-tokens", type=int, default=96, help="user turns are cut to this many tokens"
    )
    parser.add_argument("--rounds", type=int, default=1, help="burst rounds, alternating the engine order")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--max-steps", type=int, default=20_000, help="bound on the engine steps of each run")
    parser.add_argument(
        "--queue-policy", default="fcfs", choices=["fcfs", "priority", "fair"], help="weir serve uses fair"
    )
    parser.add_argument(
        "--priorities",
        action="store_true",
        help="give each request its class from the trace (issue 29's burst)",
    )
    parser.add_argument(
        "--one-tenant", action="store_true", help="send every request as one tenant (issue 29)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--skip-burst", action="store_true")
    parser.add_argument("--skip-chat", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    rows = load_chat_rows(args.workload, max(args.requests, args.conversations * args.turns))
    report: dict[str, Any] = {
        "machine": platform.platform(),
        "python": sys.version.split()[0],
        "model": args.model,
        "device": args.device,
        "dtype": args.dtype,
    }
    if not args.skip_burst:
        prompts = []
        for row in rows[: args.requests]:
            text = tokenizer.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)
            ids = tokenizer.encode(text, add_special_tokens=False)
            tenant = "one-tenant" if args.one_tenant else row["tenant"]
            prompts.append((row["id"], tenant, ids, int(row["max_tokens"]), row.get("priority", "standard")))
        everything = sum(-(-(len(ids) + m) // BLOCK_SIZE) for _, _, ids, m, _ in prompts) * BLOCK_SIZE
        variants = [
            Variant("swap", args.device_tokens, args.host_tokens),
            Variant("recompute", args.device_tokens, 0),
            Variant("unconstrained", everything + 2 * BLOCK_SIZE, 0),
        ]
        runs = []
        for r in range(args.rounds):  # alternate the order, so a machine getting busier favours none
            for variant in variants if r % 2 == 0 else variants[::-1]:
                run = run_burst(args, variant, prompts).to_json()
                runs.append({"round": r, **run})
                print(json.dumps(runs[-1]), flush=True)
        rates = {v.name: [x["output_tokens_per_s"] for x in runs if x["engine"] == v.name] for v in variants}
        median = {name: statistics.median(values) for name, values in rates.items()}
        report["burst"] = {
            "runs": runs,
            "median_output_tokens_per_s": median,
            "swap_over_unconstrained": round(median["swap"] / median["unconstrained"], 3),
            "swap_over_recompute": round(median["swap"] / median["recompute"], 3),
        }
    if not args.skip_chat:
        users = [
            str(
                tokenizer.decode(
                    tokenizer.encode(m["content"], add_special_tokens=False)[: args.chat_user_tokens]
                )
            )
            for row in rows
            for m in row["messages"]
            if m["role"] == "user"
        ]
        with_host = run_chat(args, args.host_tokens, users, tokenizer)
        without = run_chat(args, 0, users, tokenizer)
        same = with_host.pop("_answers") == without.pop("_answers")
        report["chat"] = {
            "conversations": args.conversations,
            "turns": args.turns,
            "device_kv_tokens": args.chat_device_tokens,
            "with_host_tier": with_host,
            "without_host_tier": without,
            "prefill_tokens_saved": without["prefill_tokens_computed"] - with_host["prefill_tokens_computed"],
            "same_tokens": same,
        }
        print(json.dumps(report["chat"]), flush=True)
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
