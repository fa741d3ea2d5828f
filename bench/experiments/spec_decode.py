"""`python -m weir_bench.experiments.spec_decode --model DIR`: speculative decoding on and off, in one run.

Three parts, one engine (the n-gram drafter built in; "off" detaches it, so both arms share the
weights, the KV pool and the machine's state):

- `copy`: a copy-heavy workload (edit, quote or reformat a given text, so the answer copies spans
  of the prompt), greedy, one request at a time (decode memory-bound); per request the decode
  tokens/s (tokens after the first over the time from the first to the last) with speculation on
  and off, alternated on, off, off, on, ..., and the acceptance rate. Target: >= 1.5x.
- `mixed`: the first `--mixed-limit` requests of a JSONL trace (e.g. shared/workloads/mixed.jsonl)
  queued at once, continuous batching, greedy; output tokens/s on and off. Target: no slowdown
  > 5%.
- `crossover`: the target's forward for B decodes (1 token each) and for B verify rows (1 + k
  tokens each) at a fixed context, B = 1..64: the ratio t(verify) / t(decode). A verify step pays
  while it emits more tokens per request than this ratio; the batch rule's `max_verify_tokens` is
  B* (1 + k) for the largest B* whose ratio stays <= 2 (a step then pays from one accepted draft).

On a shared machine only the ratios within one run count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.llm_engine import LLMEngine
from weir.engine.output import ScheduledRequest
from weir.engine.request import SamplingParams
from weir.engine.scheduling.speculation_policy import SpeculationPolicy
from weir.engine.spec_decode.drafter import Drafter
from weir.engine.speculative_config import SpeculativeConfig, SpeculativeMethod
from weir_bench.engine_loop import run_until_done
from weir_bench.offline import load_requests

TEXT = (
    "The gateway admits each request or rejects it at once. Admitted requests wait in one queue, "
    "ordered by priority class and then by each tenant's fair share. Every step the scheduler runs "
    "the decodes first, then prefill chunks within the token budget. KV blocks are shared between "
    "requests with the same prefix, and a block is copied before a request writes into it."
)
CODE = (
    "def total_price(items, tax_rate):\n    subtotal = 0\n    for item in items:\n"
    "        subtotal += item.price * item.quantity\n    tax = subtotal * tax_rate\n"
    "    return subtotal + tax\n"
)
COPY_PROMPTS = (
    f"Repeat the following text exactly, word for word:\n\n{TEXT}",
    f"Rewrite this function, renaming `total_price` to `order_total`. Change nothing else.\n\n{CODE}",
    f"Correct the punctuation of this paragraph and return the whole paragraph:\n\n{TEXT}",
    f"Quote the second and third sentences of this text verbatim:\n\n{TEXT}",
    f"Return this code unchanged, with a docstring added:\n\n{CODE}",
    f"Replace every 'request' with 'call' in this text and return it:\n\n{TEXT}",
)


def set_speculation(engine: LLMEngine, drafter: Drafter | None) -> None:
    """Attach (or, with None, detach) the engine's drafter between runs."""
    engine.drafter = drafter
    policy = SpeculationPolicy(engine.config.speculative, engine.spec_counters) if drafter else None
    engine.scheduler.speculation = policy


def run_copy(
    engine: LLMEngine, drafter: Drafter, tokenizer: Any, reps: int, max_tokens: int, num_prompts: int
) -> dict[str, Any]:
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for p in COPY_PROMPTS[:num_prompts]
    ]
    rates: dict[str, list[float]] = {"on": [], "off": []}
    outputs: dict[str, dict[int, list[int]]] = {"on": {}, "off": {}}
    drafted = accepted = 0
    for rep in range(reps):
        for arm in ("on", "off") if rep % 2 == 0 else ("off", "on"):
            set_speculation(engine, drafter if arm == "on" else None)
            for i, ids in enumerate(prompts):
                before = (engine.spec_counters.num_drafted, engine.spec_counters.num_accepted)
                tokens, first, last = _one(engine, f"c{rep}-{arm}-{i}", ids, max_tokens)
                outputs[arm][i] = tokens
                if len(tokens) > 1 and last > first:
                    rates[arm].append((len(tokens) - 1) / (last - first))
                    print(
                        f"copy {arm} prompt {i}: {len(tokens)} tokens, {rates[arm][-1]:.1f} tok/s", flush=True
                    )
                if arm == "on":
                    drafted += engine.spec_counters.num_drafted - before[0]
                    accepted += engine.spec_counters.num_accepted - before[1]
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    return {
        "decode_tok_s_on_median": on,
        "decode_tok_s_off_median": off,
        "ratio": on / off,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "identical_outputs": outputs["on"] == outputs["off"],
        "num_output_tokens": {i: len(t) for i, t in outputs["on"].items()},
    }


def _one(engine: LLMEngine, rid: str, ids: list[int], max_tokens: int) -> tuple[list[int], float, float]:
    """Greedy, alone: (tokens, time of the first token, time of the last)."""
    engine.add_request(EngineRequest(rid, tuple(ids), SamplingParams(max_tokens=max_tokens, temperature=0.0)))
    tokens: list[int] = []
    first = last = 0.0
    while engine.has_unfinished():
        for o in engine.step():
            if o.new_token_ids:
                last = time.perf_counter()
                first = first or last
                tokens.extend(o.new_token_ids)
    return tokens, first, last


def run_mixed(
    engine: LLMEngine, drafter: Drafter, workload: Path, tokenizer: Any, limit: int, reps: int
) -> dict[str, Any]:
    reqs = load_requests(workload, tokenizer, limit)
    rates: dict[str, list[float]] = {"on": [], "off": []}
    for rep in range(reps):
        for arm in ("on", "off") if rep % 2 == 0 else ("off", "on"):
            set_speculation(engine, drafter if arm == "on" else None)
            t0 = time.perf_counter()
            for r in reqs:
                params = SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True)
                engine.add_request(EngineRequest(f"{rep}{arm}{r.request_id}", r.prompt_token_ids, params))
            num_out = sum(len(o.new_token_ids) for o in run_until_done(engine))
            rates[arm].append(num_out / (time.perf_counter() - t0))
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    return {
        "output_tok_s_on": rates["on"],
        "output_tok_s_off": rates["off"],
        "ratio": on / off,
        "requests": len(reqs),
    }


@torch.inference_mode()
def run_crossover(engine: LLMEngine, k: int, context: int, reps: int) -> dict[str, Any]:
    runner = engine.runner
    bs = runner.block_size
    blocks_per_seq = -(-(context + k + 1) // bs)
    rows = []
    for batch in (1, 2, 4, 8, 16, 32, 64):
        if 1 + batch * blocks_per_seq > engine.kv.num_total_blocks:
            break
        times: dict[int, list[float]] = {1: [], 1 + k: []}
        for _ in range(reps):
            for width in (1, 1 + k):
                steps = [
                    ScheduledRequest(
                        f"x{i}",
                        width,
                        context,
                        tuple(range(1 + i * blocks_per_seq, 1 + (i + 1) * blocks_per_seq)),
                        True,
                    )
                    for i in range(batch)
                ]
                inputs = [[7] * width for _ in range(batch)]
                ids, pos, meta, sample_rows = runner.prepare(steps, inputs)
                t0 = time.perf_counter()
                hidden = runner.model(ids, pos, runner.kv_caches, meta)
                runner.model.compute_logits(hidden)  # type: ignore[operator]
                times[width].append(time.perf_counter() - t0)
        decode, verify = min(times[1]), min(times[1 + k])
        rows.append(
            {"batch": batch, "decode_ms": decode * 1e3, "verify_ms": verify * 1e3, "ratio": verify / decode}
        )
    fits = [r["batch"] for r in rows if r["ratio"] <= 2.0]
    best = max(fits) if fits else 0
    return {
        "k": k,
        "context": context,
        "rows": rows,
        "crossover_batch": best,
        "max_verify_tokens": best * (1 + k),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=Path.home() / ".cache/weir/models/SmolLM2-135M-Instruct")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--copy-max-tokens", type=int, default=160)
    p.add_argument("--copy-prompts", type=int, default=len(COPY_PROMPTS))
    p.add_argument("--mixed", type=Path, default=Path("/work/shared/workloads/mixed.jsonl"))
    p.add_argument("--mixed-limit", type=int, default=32)
    p.add_argument("--crossover-context", type=int, default=256)
    p.add_argument("--parts", default="copy,mixed,crossover")
    p.add_argument("--out", type=Path, default=Path("bench-out/spec_decode"))
    args = p.parse_args(argv)
    spec = SpeculativeConfig(SpeculativeMethod.NGRAM, args.k)
    engine = build_engine(
        EngineConfig(
            model_path=str(args.model),
            cache=CacheConfig(num_blocks=1200, block_size=16, enable_prefix_caching=False),
            scheduler=SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=64, max_model_len=2048),
            speculative=spec,
        )
    )
    drafter = engine.drafter
    assert drafter is not None
    report: dict[str, Any] = {
        "speculative": spec.describe(),
        "k": args.k,
        "torch_threads": torch.get_num_threads(),
    }
    parts = args.parts.split(",")
    if "copy" in parts:
        report["copy"] = run_copy(
            engine, drafter, engine.tokenizer, args.reps, args.copy_max_tokens, args.copy_prompts
        )
        print(json.dumps(report["copy"]), flush=True)
    if "mixed" in parts:
        report["mixed"] = run_mixed(
            engine, drafter, args.mixed, engine.tokenizer, args.mixed_limit, args.reps
        )
        print(json.dumps(report["mixed"]), flush=True)
    if "crossover" in parts:
        report["crossover"] = run_crossover(engine, args.k, args.crossover_context, max(3, args.reps))
        print(json.dumps(report["crossover"]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "spec_decode.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
