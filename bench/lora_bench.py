"""LoRA throughput: a mixed batch of the base model and 4 adapters against the base model alone.

    python -m bench.lora_bench --model ~/.cache/weir/models/SmolLM2-135M-Instruct

One engine (LoRA enabled, 4 slots) runs the same requests twice, after a warm-up: once all on
the base model, once spread round-robin over the base model and 4 random rank-16 adapters on all
seven projections. Same prompts, same number of generated tokens (ignore_eos), prefix caching
off so neither run reuses the other's KV. Prints both throughputs and their ratio (target
>= 0.75 on CPU) as JSON. The adapters are written directly in PEFT's file format (no peft needed).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.client import EngineRequest
from engine.config import CacheConfig, EngineConfig, LoraConfig, ModelConfig, SchedulerConfig
from engine.llm_engine import LLMEngine, build_engine
from engine.lora_adapter import CONFIG_FILE, TARGET_MODULES, WEIGHTS_FILE, projection_shape
from engine.request import SamplingParams

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


def _run(
    engine: LLMEngine, prompts: list[list[int]], adapters: list[str | None], max_tokens: int, tag: str
) -> tuple[int, float]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, (prompt, adapter) in enumerate(zip(prompts, adapters, strict=True)):
        engine.add_request(EngineRequest(f"{tag}-{i}", tuple(prompt), params, adapter_name=adapter))
    num_tokens = 0
    start = time.perf_counter()
    while engine.has_unfinished():
        for out in engine.step():
            if out.error is not None:
                raise RuntimeError(out.error)
            num_tokens += len(out.new_token_ids)
    return num_tokens, time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model folder (Llama family)")
    parser.add_argument("--num-requests", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="weir-lora-bench-") as tmp:
        adapter_dir = Path(tmp)
        config = EngineConfig(
            model_path=args.model,
            dtype=args.dtype,
            cache=CacheConfig(block_size=16, num_blocks=2048, enable_prefix_caching=False),
            scheduler=SchedulerConfig(
                max_num_batched_tokens=2048, max_num_seqs=args.num_requests, max_model_len=1024
            ),
            lora=LoraConfig(num_slots=4, max_rank=args.rank, adapter_dir=str(adapter_dir)),
        )
        engine = build_engine(config)
        names = [f"adapter{i}" for i in range(4)]
        for i, name in enumerate(names):
            write_random_adapter(adapter_dir / name, engine.model_config, args.rank, seed=i, base=args.model)
            engine.load_adapter(name, name)
        tok = engine.tokenizer
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
        _run(engine, prompts[:5], mixed_adapters[:5], 8, "warmup")  # loads the slots, warms oneDNN
        base_tokens, base_s = _run(engine, prompts, [None] * len(prompts), args.max_tokens, "base")
        mixed_tokens, mixed_s = _run(engine, prompts, mixed_adapters, args.max_tokens, "mixed")
    result = {
        "num_requests": args.num_requests,
        "generated_tokens": base_tokens,
        "base_tokens_per_s": base_tokens / base_s,
        "mixed_tokens_per_s": mixed_tokens / mixed_s,
        "ratio": (mixed_tokens / mixed_s) / (base_tokens / base_s),
        "torch_threads": torch.get_num_threads(),
    }
    assert base_tokens == mixed_tokens
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
