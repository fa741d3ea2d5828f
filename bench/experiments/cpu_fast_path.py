"""`python -m weir_bench.experiments.cpu_fast_path --model DIR`: the CPU fast path against the plain one, in one run.

Two measurements, both in the same process so that they share the machine's state:

1. `linear`: each of the model's GEMM shapes (fused qkv, o, fused gate/up, down, LM head) at
   several row counts, `F.linear` against the pre-packed oneDNN weight
   (engine/models/packed_linear.py), one call of each in turn, median of the repetitions.
2. `decode`: whole engine decode steps (schedule, forward, logits, sampling) of the plain and
   the packed engine, `--steps` steps of each, and one read of every weight of the model (a
   `sum` over each tensor, bound by memory bandwidth on CPU: the floor of a decode step at
   batch 1), in an order that alternates, `--reps` times: on a shared, noisy machine all three
   see the same noise. Reported as medians (and minima), as the ratio plain / packed, packed /
   weight read, and packed at batch B / packed at the first batch size. `--no-plain`: the packed
   engine and the weight read only (the weights then read from a plain copy loaded for it).
   The first step after a weight read is slower than the steady state (measured at batch 8:
   4-step blocks 61 ms median, 16-step blocks 46 ms): `--steps` sets how much it weighs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.llm_engine import LLMEngine
from weir.engine.models.attention import TorchAttentionBackend
from weir.engine.models.packed_linear import PackedLinear
from weir.engine.request import SamplingParams
from weir.engine.runner.loader import load_model, load_model_config
from weir_bench.decode_bench import BLOCK_SIZE, _cdiv


def gemm_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each linear layer as the loader builds them (fused qkv, gate/up)."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    h, i = config.hidden_size, config.intermediate_size
    return {
        "qkv": (q + 2 * kv, h),
        "o": (h, q),
        "gate_up": (2 * i, h),
        "down": (h, i),
        "lm_head": (config.vocab_size, h),
    }


def _median_pair(first: Callable[[], object], second: Callable[[], object], reps: int) -> tuple[float, float]:
    """Median seconds of each of two calls, timed one after the other `reps` times."""
    first()
    second()
    a, b = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        first()
        t1 = time.perf_counter()
        second()
        b.append(time.perf_counter() - t1)
        a.append(t1 - t0)
    return statistics.median(a), statistics.median(b)


def measure_linear(
    config: ModelConfig, rows: Sequence[int], dtype: torch.dtype, budget_flop: float = 3e9
) -> list[dict[str, Any]]:
    """F.linear vs the packed weight, per shape and row count (µs, median)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    with torch.inference_mode():
        for name, (n, k) in gemm_shapes(config).items():
            weight = (torch.randn(n, k, generator=gen) * 0.02).to(dtype)
            packed = PackedLinear(weight, None)
            for m in rows:
                x = torch.randn(m, k, generator=gen).to(dtype)
                reps = max(5, min(200, int(budget_flop / (2 * m * n * k + 1e6))))
                plain_s, packed_s = _median_pair(partial(F.linear, x, weight), partial(packed, x), reps)
                out.append(
                    {
                        "shape": name,
                        "n_k": [n, k],
                        "rows": m,
                        "f_linear_us": round(plain_s * 1e6, 1),
                        "packed_us": round(packed_s * 1e6, 1),
                        "speedup": round(plain_s / packed_s, 2),
                        "reps": reps,
                    }
                )
    return out


class WeightReader:
    """Reads every floating-point parameter of a model once per call (`sum`, bandwidth-bound on CPU).

    Give it a plain (unpacked) model: a packed model's linear weights are opaque oneDNN tensors,
    not parameters, so its parameters are only a small part of its weights.
    """

    def __init__(self, net: torch.nn.Module):
        self.params = [p for p in net.parameters() if p.is_floating_point()]
        self.num_bytes = sum(p.numel() * p.element_size() for p in self.params)

    def __call__(self) -> None:
        with torch.inference_mode():
            for p in self.params:
                p.sum()


def plain_weight_reader(model: Path, dtype: str) -> WeightReader:
    """A WeightReader of every weight of the model folder, loaded once more in the plain layout."""
    net, _ = load_model(model, getattr(torch, dtype), torch.device("cpu"), TorchAttentionBackend())
    return WeightReader(net)


def build_cpu_engine(
    model: Path, dtype: str, packed: bool, max_num_seqs: int, max_model_len: int
) -> LLMEngine:
    """A CPU engine with the fast path on or off (prefix caching off: every step does its work)."""
    return build_engine(cpu_engine_config(model, dtype, packed, max_num_seqs, max_model_len))


def cpu_engine_config(
    model: Path, dtype: str, packed: bool, max_num_seqs: int, max_model_len: int
) -> EngineConfig:
    """The config of `build_cpu_engine`."""
    return EngineConfig(
        model_path=str(model),
        dtype=dtype,
        device="cpu",
        cache=CacheConfig(
            block_size=BLOCK_SIZE,
            num_blocks=2 + max_num_seqs * _cdiv(max_model_len, BLOCK_SIZE),
            kv_dtype=dtype,
            enable_prefix_caching=False,
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=4096, max_num_seqs=max_num_seqs, max_model_len=max_model_len
        ),
        cpu_packed_linear=packed,
    )


def _start_decoding(engine: LLMEngine, batch: int, context_len: int, max_tokens: int) -> list[str]:
    gen = torch.Generator().manual_seed(batch)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = [f"b{batch}-{i}" for i in range(batch)]
    for rid in ids:
        prompt = torch.randint(0, engine.model_config.vocab_size, (context_len,), generator=gen).tolist()
        engine.add_request(EngineRequest(rid, tuple(prompt), params))
    reqs = [engine.scheduler.requests[rid] for rid in ids]
    while any(r.num_output_tokens == 0 for r in reqs):  # prefill
        engine.step()
    engine.step()  # every sequence decoding from here on
    return ids


def _time_steps(engine: LLMEngine, num_steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(num_steps):
        engine.step()
    return (time.perf_counter() - t0) / num_steps


def measure_decode(
    engines: dict[str, LLMEngine],
    read_weights: WeightReader,
    batches: Sequence[int],
    context_len: int,
    num_steps: int,
    reps: int,
) -> list[dict[str, Any]]:
    """Median decode step (ms) of each engine per batch size, and of one read of every weight.

    Each repetition times `num_steps` steps of each engine and one weight-read pass, in an order
    that alternates, so that all three see the same load on a shared machine.
    """
    rows = []
    for batch in batches:
        ids = {
            name: _start_decoding(eng, batch, context_len, 2 * reps * num_steps + 8)
            for name, eng in engines.items()
        }
        contestants: dict[str, Callable[[], float]] = {
            name: partial(_time_steps, eng, num_steps) for name, eng in engines.items()
        }
        contestants["weight_read"] = partial(_time_call, read_weights)
        names = list(contestants)
        read_weights()  # warm-up
        times: dict[str, list[float]] = {name: [] for name in names}
        for rep in range(reps):
            for name in names if rep % 2 == 0 else reversed(names):
                times[name].append(contestants[name]())
        row: dict[str, Any] = {"batch": batch, "context_len": context_len, "steps": num_steps, "reps": reps}
        for name in names:
            row[f"{name}_ms"] = round(statistics.median(times[name]) * 1e3, 2)
            row[f"{name}_min_ms"] = round(min(times[name]) * 1e3, 2)
        rows.append(row)
        for name, eng in engines.items():
            for rid in ids[name]:
                eng.abort(rid)
    return rows


def _time_call(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every section the arguments ask for, as one JSON-ready dict."""
    dtype = getattr(torch, args.dtype)
    config = load_model_config(args.model)
    report: dict[str, Any] = {
        "model": str(args.model),
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
    }
    if args.linear_rows:
        report["linear"] = measure_linear(config, args.linear_rows, dtype)
    if not args.batches:
        return report
    max_len = args.context_len + 2 * args.reps * args.steps + 64
    top = max(args.batches)
    engines = {"packed": build_cpu_engine(args.model, args.dtype, True, top, max_len)}
    if not getattr(engines["packed"].runner.model, "is_packed", False):
        raise RuntimeError("the packed engine did not pack its linear weights")
    if args.no_plain:  # the packed engine alone against the weight read: no second engine between its steps
        read_weights = plain_weight_reader(args.model, args.dtype)
    else:
        engines = {"plain": build_cpu_engine(args.model, args.dtype, False, top, max_len), **engines}
        read_weights = WeightReader(engines["plain"].runner.model)
    report["weight_bytes"] = read_weights.num_bytes
    report["decode"] = measure_decode(
        engines, read_weights, args.batches, args.context_len, args.steps, args.reps
    )
    base = report["decode"][0]
    for row in report["decode"]:
        row["weight_read_gb_per_s"] = round(read_weights.num_bytes / row["weight_read_ms"] / 1e6, 1)
        if "plain_ms" in row:
            row["plain_over_packed"] = round(row["plain_ms"] / row["packed_ms"], 2)
        row["packed_over_weight_read"] = round(row["packed_ms"] / row["weight_read_ms"], 2)
        row["packed_over_first_batch"] = round(row["packed_ms"] / base["packed_ms"], 2)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.cpu_fast_path", description=__doc__.splitlines()[0]
    )
    p.add_argument("--model", type=Path, required=True, help="a prepared model folder")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--linear-rows", type=int, nargs="*", default=[1, 8, 32, 128, 512])
    p.add_argument("--batches", type=int, nargs="*", default=[1, 8])
    p.add_argument("--context-len", type=int, default=128, help="prompt tokens of each decoding sequence")
    p.add_argument("--steps", type=int, default=4, help="decode steps per timed block")
    p.add_argument("--reps", type=int, default=8, help="timed blocks per engine and batch size")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument(
        "--no-plain",
        action="store_true",
        help="time the packed engine against the weight read only (no plain engine run between its steps)",
    )
    p.add_argument("--out", type=Path, help="also write the JSON report here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
