"""xgrammar vs llguidance on SmolLM2's tokenizer: compile time and per-token mask time.

The measurement behind the grammar backend choice (docs/decisions.md). llguidance is not a
dependency: `pip install llguidance` first. Run:
`python -m weir_bench.experiments.grammar_backends [tokenizer dir]` (default: the prepared SmolLM2).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    "person": (
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
        {"name": "Ada Lovelace", "age": 36},
    ),
    "event": (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "date": {"type": "string"},
                "participants": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["name", "date", "participants"],
            "additionalProperties": False,
        },
        {"name": "Science fair", "date": "Friday", "participants": ["Alice", "Bob"]},
    ),
    "math": (
        {
            "type": "object",
            "properties": {
                "steps": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"explanation": {"type": "string"}, "output": {"type": "string"}},
                        "required": ["explanation", "output"],
                        "additionalProperties": False,
                    },
                },
                "final_answer": {"type": "string"},
            },
            "required": ["steps", "final_answer"],
            "additionalProperties": False,
        },
        {"steps": [{"explanation": "subtract 7", "output": "8x = -30"}], "final_answer": "x = -3.75"},
    ),
    "enum": (
        {
            "type": "object",
            "properties": {
                "color": {"enum": ["red", "green", "blue"]},
                "n": {"type": "number", "minimum": 0},
            },
            "required": ["color", "n"],
        },
        {"color": "green", "n": 3.5},
    ),
}


def main() -> None:
    import llguidance
    import llguidance.hf
    import llguidance.torch
    import xgrammar as xgr
    from transformers import AutoTokenizer

    path = sys.argv[1] if len(sys.argv) > 1 else str(Path.home() / ".cache/weir/models/SmolLM2-135M-Instruct")
    tok = AutoTokenizer.from_pretrained(path)
    vocab = len(tok)
    t = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    print(f"xgrammar tokenizer info {time.perf_counter() - t:.3f} s")
    t = time.perf_counter()
    llt = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
    print(f"llguidance tokenizer {time.perf_counter() - t:.3f} s")
    for name, (schema, answer) in SCHEMAS.items():
        ids = tok.encode(json.dumps(answer), add_special_tokens=False) + [tok.eos_token_id]
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        t = time.perf_counter()
        compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        xgr_compile = time.perf_counter() - t
        matcher = xgr.GrammarMatcher(compiled)
        bitmask = xgr.allocate_token_bitmask(1, vocab)
        xgr_mask = []
        for i in ids:
            t = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask, 0)
            xgr_mask.append(time.perf_counter() - t)
            assert matcher.accept_token(i)
        t = time.perf_counter()
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": True}
        )
        llm = llguidance.LLMatcher(llt, grammar)
        llg_compile = time.perf_counter() - t
        bitmask2 = llguidance.torch.allocate_token_bitmask(1, llt.vocab_size)
        llg_mask = []
        for i in ids:
            t = time.perf_counter()
            llguidance.torch.fill_next_token_bitmask(llm, bitmask2, 0)
            llg_mask.append(time.perf_counter() - t)
            assert llm.consume_token(i)
        print(
            f"{name:7s} xgrammar compile {xgr_compile * 1e3:6.1f} ms, mask p50 "
            f"{statistics.median(xgr_mask) * 1e6:6.1f} us max {max(xgr_mask) * 1e6:7.1f} us | "
            f"llguidance compile {llg_compile * 1e3:6.1f} ms, mask p50 "
            f"{statistics.median(llg_mask) * 1e6:6.1f} us max {max(llg_mask) * 1e6:7.1f} us ({len(ids)} tokens)"
        )


if __name__ == "__main__":
    main()
