"""`weir generate`: try the engine without the server."""

from __future__ import annotations

import argparse
import sys
import time

from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig
from weir.engine.request import SamplingParams


def add_subcommand(subparsers: argparse._SubParsersAction) -> None:
    """Register `weir generate` on the top-level CLI."""
    p = subparsers.add_parser("generate", help="generate a completion offline, without the server")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--model", default=None, help="Hugging Face model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model_path: str) -> int:
    """Load the engine, generate, stream the text to stdout."""
    from weir.engine.engine_builder import build_engine

    engine = build_engine(
        EngineConfig(
            model_path=model_path, dtype=args.dtype, cache=CacheConfig(memory_budget_bytes=256 << 20)
        )
    )
    tok = engine.tokenizer
    if args.chat:
        ids = tok.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "user", "content": args.prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
    else:
        ids = tok.encode(args.prompt)  # type: ignore[attr-defined]
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
    )
    engine.add_request(EngineRequest("generate-0", tuple(ids), params))
    t0 = time.monotonic()
    n = 0
    reason = None
    while engine.has_unfinished():
        for out in engine.step():
            sys.stdout.write(out.new_text)
            sys.stdout.flush()
            n += len(out.new_token_ids)
            if out.finished:
                reason = out.finish_reason
    dt = time.monotonic() - t0
    sys.stdout.write("\n")
    reason_name = reason.value if reason else "?"
    print(
        f"[{n} tokens in {dt:.2f}s, {n / dt if dt else 0:.1f} tok/s, finish: {reason_name}]", file=sys.stderr
    )
    return 0
