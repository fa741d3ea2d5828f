"""`python -m weir_bench.experiments.opening_burst`: prompts sent all at once to a fresh engine, as
`weir serve` builds it, without HTTP or a load generator: the engine's own share of an opening
burst.

guidellm opens its run by sending its 8 streams' first requests at once (issue 58's reference
load: 128-token prompts, 64 tokens out). In served runs every one of those 8 missed the
interactive class's 2 s TTFT target, llama-server's as well as Weir's, while all 40 later requests
met both targets. This experiment takes the front end and the client away: it builds the engine
from the same settings as `weir serve` (`weir.gateway.server.bootstrap.engine_config`, the
engine's intra-op threads set the same way), starts it with its warm-up, and sends `--prompts`
interactive requests of `--prompt-tokens` random token ids at once, `--rounds` times (a new
burst once the last has drained; round 1 is the engine's first burst, the others see the steps'
fitted cost and thread choices). Every request ignores EOS and produces `--max-tokens` tokens.

Reported per round: each request's first token (seconds after the burst), how many came within
the class's TTFT target, the largest gap between two tokens, and how many requests met both
targets (every gap within the ITL target, up to `weir.engine.scheduling.slo_standing.ITL_TOLERANCE`),
plus the engine's steps and thread choices after the run. One run is one sample; compare code by
running it from two checkouts in turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from weir.engine.request import Priority

DEFAULT_MODEL = Path.home() / ".cache/weir/models/SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class BurstRequest:
    """What one request of a burst got: its first token and its gaps, in seconds."""

    ttft_s: float
    gaps_s: tuple[float, ...]

    def met(self, ttft_s: float, itl_s: float, tolerance: float) -> bool:
        return self.ttft_s <= ttft_s and all(g <= itl_s * (1 + tolerance) for g in self.gaps_s)


def summarize(
    requests: Sequence[BurstRequest], ttft_s: float, itl_s: float, tolerance: float
) -> dict[str, Any]:
    """One round's figures (see the module docstring)."""
    firsts = sorted(r.ttft_s for r in requests)
    return {
        "first_tokens_s": [round(t, 3) for t in firsts],
        "within_ttft": sum(1 for t in firsts if t <= ttft_s),
        "met_both": sum(1 for r in requests if r.met(ttft_s, itl_s, tolerance)),
        "max_gap_s": round(max((g for r in requests for g in r.gaps_s), default=0.0), 3),
        "num_requests": len(requests),
    }


async def _one(engine: Any, request: Any) -> BurstRequest:
    start = time.monotonic()
    stamps: list[float] = []
    async for out in engine.generate(request):
        if out.new_token_ids:
            stamps.append(time.monotonic())
    first = stamps[0] - start if stamps else float("inf")
    return BurstRequest(first, tuple(b - a for a, b in zip(stamps, stamps[1:], strict=False)))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from weir.engine.async_engine import AsyncEngine
    from weir.engine.client import EngineRequest
    from weir.engine.latency_targets import class_targets_for
    from weir.engine.request import SamplingParams
    from weir.engine.scheduling.slo_standing import ITL_TOLERANCE
    from weir.gateway.server.bootstrap import engine_config, set_engine_threads
    from weir.gateway.settings.settings import Settings

    settings = Settings.from_environment({"dtype": args.dtype, "device": "cpu"})
    threads = set_engine_threads(settings, "cpu")
    engine = AsyncEngine(engine_config(settings, args.model, "cpu"))
    await engine.start()
    targets = class_targets_for("cpu").of(Priority.INTERACTIVE)
    assert targets.ttft_s is not None and targets.itl_s is not None
    rng = random.Random(args.seed)
    vocab = engine.model_config.vocab_size
    rounds = []
    try:
        for r in range(args.rounds):
            requests = [
                EngineRequest(
                    request_id=f"burst{r}-{i}",
                    prompt_token_ids=tuple(rng.randrange(vocab) for _ in range(args.prompt_tokens)),
                    sampling_params=SamplingParams(
                        max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True
                    ),
                    tenant_id="burst",
                    priority=Priority.INTERACTIVE,
                )
                for i in range(args.prompts)
            ]
            got = await asyncio.gather(*(_one(engine, q) for q in requests))
            rounds.append(summarize(got, targets.ttft_s, targets.itl_s, ITL_TOLERANCE))
            print(f"round {r + 1}: {json.dumps(rounds[-1])}", flush=True)
        stats = engine.stats()
    finally:
        await engine.shutdown()
    return {
        "command": args.command,
        "engine_threads": threads,
        "targets": {"ttft_s": targets.ttft_s, "itl_s": targets.itl_s},
        "rounds": rounds,
        "step_threads": asdict(stats.step_threads) if stats.step_threads is not None else None,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.opening_burst", description=__doc__.splitlines()[0]
    )
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench-out/opening-burst"))
    args = p.parse_args(argv)
    for name in ("prompts", "prompt_tokens", "max_tokens", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    import shlex
    import sys

    args = parse_args(argv)
    args.command = shlex.join(
        ["python", "-m", "weir_bench.experiments.opening_burst", *(sys.argv[1:] if argv is None else argv)]
    )
    report = asyncio.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
