"""Constrained vs unconstrained decode throughput on the same prompts (one run, CPU or GPU).

`python -m weir_bench.experiments.constrained_decode [model dir] [max tokens]`: SmolLM2 by default.
Both runs are greedy with `ignore_eos` off; the constrained one follows a JSON Schema with a
free-text string field, so both generate up to max_tokens. Reports output tokens per second.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.llm_engine import LLMEngine
from weir.engine.request import SamplingParams
from weir.engine.structured.grammar import ConstraintSpec, GrammarBackend

SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "story": {"type": "string"}},
    "required": ["title", "story"],
    "additionalProperties": False,
}


def _run(engine: LLMEngine, requests: list[EngineRequest]) -> tuple[int, float]:
    for er in requests:
        engine.add_request(er)
    num_tokens, start = 0, time.perf_counter()
    while engine.has_unfinished():
        num_tokens += sum(len(o.new_token_ids) for o in engine.step())
    return num_tokens, time.perf_counter() - start


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else str(Path.home() / ".cache/weir/models/SmolLM2-135M-Instruct")
    max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    engine = build_engine(
        EngineConfig(
            model_path=path,
            cache=CacheConfig(num_blocks=512, block_size=16),
            scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=16, max_model_len=1024),
        )
    )
    backend = GrammarBackend(
        engine.tokenizer, engine.model_config.vocab_size, engine.model_config.eos_token_ids
    )
    compiled = backend.compile(ConstraintSpec.json_schema(SCHEMA, "response_format"))
    prompt = tuple(
        engine.tokenizer.encode("Write a long story about a lighthouse keeper as JSON with a title.")
    )
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    _run(engine, [EngineRequest("warmup", prompt, SamplingParams(max_tokens=4, temperature=0.0))])
    for batch in (1, 8):
        for label, constraint in (("unconstrained", None), ("constrained", compiled)):
            reqs = [
                EngineRequest(f"{label}-{batch}-{i}", prompt, params, constraint=constraint)
                for i in range(batch)
            ]
            tokens, seconds = _run(engine, reqs)
            print(
                f"batch {batch} {label:13s} {tokens} tokens in {seconds:.2f} s: {tokens / seconds:.1f} tok/s"
            )


if __name__ == "__main__":
    main()
