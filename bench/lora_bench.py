"""LoRA throughput: a mixed batch of the base model and 4 adapters against the base model alone.

    python -m weir_bench.lora_bench --model ~/.cache/weir/models/SmolLM2-135M-Instruct

Two identical engines (LoRA enabled, 4 slots, the same 4 random rank-16 adapters on all seven
projections loaded in each) run the same prompts for the same number of generated tokens
(ignore_eos): one all on the base model, the other spread round-robin over the base model and
the 4 adapters. They step alternately, one step of each in turn, each step timed on its own, so a
machine that gets busier or quieter during the run weighs on both sides alike (the machines
this is run on are shared). Prefix caching is off; a warm-up through both first loads the slots
and warms oneDNN. `--rounds N` repeats the pair N times. Prints both throughputs, their ratio
(target >= 0.75 on CPU) over all rounds and per round, and the same over this process's CPU
seconds, as JSON. The adapters are written directly in PEFT's file format (no peft needed).
`--threads` sets torch's intra-op threads (default: torch's own choice).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, LoraConfig, ModelConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.llm_engine import LLMEngine
from weir.engine.lora.lora_adapter import CONFIG_FILE, TARGET_MODULES, WEIGHTS_FILE, projection_shape
from weir.engine.request import SamplingParams

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about paged attention.",
    "Explain continuous batching in two sentences.",
    "List three prime numbers greater than 100.",
    "Translate 'good morning' into German and Spanish.",
    "Why is the sky blue?",
    "Give me a short Python function that reverses a string.",
    "Summarise the rules of chess in one paragraph.",
)


def write_random_adapter(folder: Path, config: ModelConfig, rank: int, seed: int, base: str) -> Path:
    """A PEFT-format LoRA adapter with random A and B on every projection of every layer."""
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(config.num_layers):
        for target in TARGET_MODULES:
            parent = "self_attn" if target in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            in_f, out_f = projection_shape(config, target)
            prefix = f"base_model.model.model.layers.{layer}.{parent}.{target}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_f, generator=gen) * 0.02
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_f, rank, generator=gen) * 0.02
    save_file(tensors, str(folder / WEIGHTS_FILE))
    adapter_config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(TARGET_MODULES),
        "base_model_name_or_path": base,
        "bias": "none",
    }
    (folder / CONFIG_FILE).write_text(json.dumps(adapter_config))
    return folder


@dataclass
class _Side:
    """One engine of the comparison and what its steps took."""

    engine: LLMEngine
    tokens: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0

    def add(self, prompts: list[list[int]], adapters: list[str | None], max_tokens: int, tag: str) -> None:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        for i, (prompt, adapter) in enumerate(zip(prompts, adapters, strict=True)):
            self.engine.add_request(EngineRequest(f"{tag}-{i}", tuple(prompt), params, adapter_name=adapter))

    def step(self) -> None:
        start, start_cpu = time.perf_counter(), time.process_time()
        outputs = self.engine.step()
        self.wall_s += time.perf_counter() - start
        self.cpu_s += time.process_time() - start_cpu
        for out in outputs:
            if out.error is not None:
                raise RuntimeError(out.error)
            self.tokens += len(out.new_token_ids)


def _run_side_by_side(sides: list[_Side]) -> None:
    """Step every side in turn until all are done."""
    while any(side.engine.has_unfinished() for side in sides):
        for side in sides:
            if side.engine.has_unfinished():
                side.step()


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model folder (Llama family)")
    parser.add_argument("--num-requests", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=1, help="base/mixed pairs, alternated")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="weir-lora-bench-") as tmp:
        adapter_dir = Path(tmp)
        config = EngineConfig(
            model_path=args.model,
            dtype=args.dtype,
            cache=CacheConfig(block_size=16, num_blocks=512, enable_prefix_caching=False),
            scheduler=SchedulerConfig(
                max_num_batched_tokens=2048, max_num_seqs=args.num_requests, max_model_len=1024
            ),
            lora=LoraConfig(num_slots=4, max_rank=args.rank, adapter_dir=str(adapter_dir)),
        )
        base, mixed = _Side(build_engine(config)), _Side(build_engine(config))
        names = [f"adapter{i}" for i in range(4)]
        for i, name in enumerate(names):
            write_random_adapter(
                adapter_dir / name, base.engine.model_config, args.rank, seed=i, base=args.model
            )
            for side in (base, mixed):
                side.engine.adapter_admin.load_adapter(name, name)
        tok = base.engine.tokenizer
        prompts = [
            list(
                tok.apply_chat_template(
                    [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=False,
                )
            )
            for i in range(args.num_requests)
        ]
        mixed_adapters: list[str | None] = [([None, *names])[i % 5] for i in range(args.num_requests)]
        for side in (base, mixed):  # loads the slots, warms oneDNN; not counted
            side.add(prompts[:5], mixed_adapters[:5], 8, "warmup")
        _run_side_by_side([base, mixed])
        base.tokens = mixed.tokens = 0
        base.wall_s = base.cpu_s = mixed.wall_s = mixed.cpu_s = 0.0
        round_ratios: list[float] = []
        for r in range(args.rounds):
            before = (base.wall_s, mixed.wall_s)
            base.add(prompts, [None] * len(prompts), args.max_tokens, f"round{r}")
            mixed.add(prompts, mixed_adapters, args.max_tokens, f"round{r}")
            _run_side_by_side([base, mixed])
            # the same tokens on each side: the throughput ratio is the inverse time ratio
            round_ratios.append((base.wall_s - before[0]) / (mixed.wall_s - before[1]))
    if base.tokens != mixed.tokens:
        raise RuntimeError(f"the sides generated {base.tokens} and {mixed.tokens} tokens")
    result = {
        "num_requests": args.num_requests,
        "rounds": args.rounds,
        "generated_tokens_per_side": base.tokens,
        "base_tokens_per_s": base.tokens / base.wall_s,
        "mixed_tokens_per_s": mixed.tokens / mixed.wall_s,
        "ratio": base.wall_s / mixed.wall_s,
        "round_ratios": round_ratios,
        # over this process's CPU seconds: less sensitive to other processes taking the cores
        "base_tokens_per_cpu_s": base.tokens / base.cpu_s,
        "mixed_tokens_per_cpu_s": mixed.tokens / mixed.cpu_s,
        "cpu_time_ratio": base.cpu_s / mixed.cpu_s,
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
