"""Engine runs for `weir_bench.gpu_check`: greedy outputs per path, and decode throughput vs the roofline.

Every engine here is built by `build_engine` and then adjusted the way `gpu_check` needs:
decode CUDA graphs attached when asked for (if `build_engine` did not capture them itself),
or removed when not; on CPU (the dry run) the fused Triton path is switched on by hand, since
its default is CUDA only.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.llm_engine import LLMEngine
from weir.engine.models.attention import AttentionMetadata
from weir.engine.request import SamplingParams
from weir.engine.runner.cuda_graphs import (
    CudaGraphCapture,
    DecodeGraphs,
    EagerCapture,
    GraphCapture,
    decode_buckets,
)
from weir_bench.roofline import decode_step_bytes, roofline_tokens_per_s

BLOCK_SIZE = 16
QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about paged attention.",
    "Explain continuous batching in two sentences.",
    "List three prime numbers greater than 100.",
    "Translate 'good morning' into German and Spanish.",
    "Why is the sky blue?",
    "Give me a short Python function that reverses a string.",
    "Summarise the rules of chess in one paragraph.",
    "What does a KV cache store in a transformer?",
    "Name the planets of the solar system in order.",
    "How do CUDA graphs reduce launch overhead?",
)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def build(
    model: Path,
    device: torch.device,
    dtype: str,
    *,
    triton: bool,
    graphs: bool,
    max_num_seqs: int,
    max_model_len: int,
    num_blocks: int,
    max_num_batched_tokens: int,
) -> LLMEngine:
    """An engine on `device` in `dtype` (weights and KV cache), with or without Triton and graphs."""
    config = EngineConfig(
        model_path=str(model),
        dtype=dtype,
        device=device.type,
        cache=CacheConfig(
            block_size=BLOCK_SIZE, num_blocks=num_blocks, kv_dtype=dtype, enable_prefix_caching=False
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
        ),
        use_triton=triton,
        use_cuda_graphs=graphs,
    )
    engine = build_engine(config)
    runner = engine.runner
    if triton and device.type != "cuda":
        net: Any = runner.model
        net.fused_kernels = True  # the dry run: CUDA's default path, interpreted
    if not graphs:
        runner.graphs = None
    elif runner.graphs is None:
        capture: GraphCapture = CudaGraphCapture() if device.type == "cuda" else EagerCapture()
        runner.graphs = DecodeGraphs(
            runner.model,
            runner.kv_caches,
            BLOCK_SIZE,
            engine.max_model_len,
            decode_buckets(max_num_seqs),
            device,
            capture,
        )
    return engine


def _free_memory() -> None:
    """Return a dropped engine's KV cache and graph pools to the device before the next one."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class GreedyRun:
    """Greedy tokens per request from one engine configuration."""

    tokens: dict[str, list[int]]
    num_steps: int
    num_graph_steps: int
    sample_text: str

    def first_divergence(self, other: GreedyRun) -> dict[str, Any] | None:
        """The first request and token index where `other` differs, or None."""
        for rid, mine in self.tokens.items():
            theirs = other.tokens[rid]
            for i, (a, b) in enumerate(zip(mine, theirs, strict=False)):
                if a != b:
                    return {"request": rid, "index": i}
        return None


def greedy_outputs(
    model: Path, device: torch.device, dtype: str, *, triton: bool, graphs: bool, quick: bool
) -> GreedyRun:
    """Greedy continuations of chat prompts plus one long prompt (chunked prefill, mixed steps)."""
    engine = build(
        model,
        device,
        dtype,
        triton=triton,
        graphs=graphs,
        max_num_seqs=16,
        max_model_len=1024,
        num_blocks=400,
        max_num_batched_tokens=64 if quick else 256,
    )
    try:
        return _greedy(engine, quick)
    finally:
        del engine
        _free_memory()


def _greedy(engine: LLMEngine, quick: bool) -> GreedyRun:
    tok = engine.tokenizer
    questions = QUESTIONS[:2] if quick else QUESTIONS
    texts = list(questions) + [" ".join(QUESTIONS) * (1 if quick else 8)]  # the last one is long
    params = SamplingParams(max_tokens=4 if quick else 64, temperature=0.0, ignore_eos=True)
    room = engine.max_model_len - params.max_tokens
    for i, text in enumerate(texts):
        chat = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        ids = tok.encode(chat, add_special_tokens=False)[-room:]  # the long one may be cut to fit
        engine.add_request(EngineRequest(f"r{i}", tuple(ids), params))
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(texts))}
    steps = 0
    while engine.has_unfinished():
        steps += 1
        for out in engine.step():
            if out.error:
                raise RuntimeError(f"request {out.request_id} failed: {out.error}")
            tokens[out.request_id].extend(out.new_token_ids)
    graphs = engine.runner.graphs
    return GreedyRun(tokens, steps, graphs.num_replays if graphs else 0, tok.decode(tokens["r0"]))


def _decode_metadata(
    batch: int, context_len: int, device: torch.device
) -> tuple[AttentionMetadata, torch.Tensor]:
    """`batch` sequences decoding their token at position context_len - 1, each in its own blocks."""
    per_seq = _cdiv(context_len, BLOCK_SIZE)
    tables = [[1 + i * per_seq + j for j in range(per_seq)] for i in range(batch)]
    pos = context_len - 1
    slots = [t[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE for t in tables]
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=device),
        seq_lens=torch.full((batch,), context_len, dtype=torch.int32, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        query_start_loc_cpu=tuple(range(batch + 1)),
        seq_lens_cpu=(context_len,) * batch,
        max_query_len=1,
        max_seq_len=context_len,
        block_size=BLOCK_SIZE,
    )
    return metadata, torch.full((batch,), pos, dtype=torch.int64, device=device)


def _seconds_per_call(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """Mean seconds of fn() after warm-up, timed with CUDA events on a GPU."""
    for _ in range(3 if device.type == "cuda" else 1):
        fn()
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / 1e3 / iters


def _row(
    engine: LLMEngine, batch: int, mode: str, seconds: float, context_len: int, bytes_per_s: float
) -> dict[str, Any]:
    itemsize = engine.runner.kv_caches[0].element_size()
    step = decode_step_bytes(engine.model_config, itemsize, itemsize, [context_len] * batch)
    return {
        "batch": batch,
        "mode": mode,
        "step_ms": round(seconds * 1e3, 4),
        "tok_s": batch / seconds,
        "bytes_per_step": step.total,
        "roofline_tok_s": roofline_tokens_per_s(step, batch, bytes_per_s),
    }


def measure_forward_decode(
    model: Path,
    device: torch.device,
    dtype: str,
    batches: list[int],
    context_len: int,
    bytes_per_s: float,
    time_left: Callable[[], float],
) -> list[dict[str, Any]]:
    """Decode forward + logits alone (no scheduler, no sampling), eager and replayed, per batch size."""
    top = max(batches)
    engine = build(
        model,
        device,
        dtype,
        triton=True,
        graphs=True,
        max_num_seqs=top,
        max_model_len=context_len + 64,
        num_blocks=2 + top * _cdiv(context_len, BLOCK_SIZE),
        max_num_batched_tokens=4096,
    )
    try:
        with torch.inference_mode():
            return _forward_rows(engine, device, batches, context_len, bytes_per_s, time_left)
    finally:
        del engine
        _free_memory()


def _eager_logits(
    net: Any, ids: torch.Tensor, positions: torch.Tensor, kv_caches: Any, md: Any
) -> torch.Tensor:
    return net.compute_logits(net(ids, positions, kv_caches, md))


def _graph_logits(
    net: Any, graphs: DecodeGraphs, ids: torch.Tensor, positions: torch.Tensor, md: Any, bucket: int
) -> torch.Tensor:
    return net.compute_logits(graphs.run(ids, positions, md, bucket))


def _forward_rows(
    engine: LLMEngine,
    device: torch.device,
    batches: list[int],
    context_len: int,
    bytes_per_s: float,
    time_left: Callable[[], float],
) -> list[dict[str, Any]]:
    net: Any = engine.runner.model
    kv_caches, graphs = engine.runner.kv_caches, engine.runner.graphs
    iters = 30 if device.type == "cuda" else 2
    rows = []
    for batch in batches:
        if time_left() < 20:
            break
        metadata, positions = _decode_metadata(batch, context_len, device)
        ids = torch.randint(0, engine.model_config.vocab_size, (batch,), device=device)
        secs = _seconds_per_call(
            partial(_eager_logits, net, ids, positions, kv_caches, metadata), device, iters
        )
        rows.append(_row(engine, batch, "forward eager", secs, context_len, bytes_per_s))
        bucket = graphs.bucket_for(metadata, batch) if graphs is not None else None
        if graphs is None or bucket is None:
            continue
        replay = partial(_graph_logits, net, graphs, ids, positions, metadata, bucket)
        secs = _seconds_per_call(replay, device, iters)
        rows.append(_row(engine, batch, "forward graph", secs, context_len, bytes_per_s))
    return rows


def measure_engine_decode(
    model: Path,
    device: torch.device,
    dtype: str,
    batches: list[int],
    context_len: int,
    num_steps: int,
    time_left: Callable[[], float],
    bytes_per_s: float,
) -> list[dict[str, Any]]:
    """Whole engine steps (schedule, forward, sample, detokenize) of `batch` decoding sequences."""
    top = max(batches)
    max_model_len = context_len + num_steps + 64
    rows: list[dict[str, Any]] = []
    for use_graphs in (False, True):
        if time_left() < 30:
            break
        engine = build(
            model,
            device,
            dtype,
            triton=True,
            graphs=use_graphs,
            max_num_seqs=top,
            max_model_len=max_model_len,
            num_blocks=2 + top * _cdiv(max_model_len, BLOCK_SIZE),
            max_num_batched_tokens=8192,
        )
        try:
            mode = "engine graph" if use_graphs else "engine eager"
            for batch in batches:
                if time_left() < 15:
                    break
                secs, mean_context = _engine_decode_step_s(engine, batch, context_len, num_steps)
                rows.append(_row(engine, batch, mode, secs, mean_context, bytes_per_s))
        finally:
            del engine
            _free_memory()
    return rows


def _engine_decode_step_s(
    engine: LLMEngine, batch: int, context_len: int, num_steps: int
) -> tuple[float, int]:
    """Mean seconds of a decode step of `batch` sequences, and their mean context over the window."""
    gen = torch.Generator().manual_seed(batch)
    params = SamplingParams(max_tokens=num_steps + 40, temperature=0.0, ignore_eos=True)
    ids = [f"b{batch}-{i}" for i in range(batch)]
    for rid in ids:
        prompt = torch.randint(0, engine.model_config.vocab_size, (context_len,), generator=gen).tolist()
        engine.add_request(EngineRequest(rid, tuple(prompt), params))
    reqs = [engine.scheduler.requests[rid] for rid in ids]
    while any(r.num_output_tokens == 0 for r in reqs):  # prefill, in as many steps as it takes
        engine.step()
    for _ in range(3):  # every sequence decoding: the steps timed next are decode-only
        engine.step()
    mean_context = sum(r.num_tokens for r in reqs) // batch + num_steps // 2
    t0 = time.perf_counter()
    for _ in range(num_steps):
        engine.step()
    seconds = (time.perf_counter() - t0) / num_steps
    for rid in ids:
        engine.abort(rid)
    return seconds, mean_context
