"""Model FLOP counts and the machine's measured GEMM peak: the compute-roofline lower bound."""

from __future__ import annotations

import time
from dataclasses import dataclass

from weir.engine.config import ModelConfig


@dataclass(frozen=True)
class WorkItem:
    """One request's shape: tokens in the prompt and tokens generated."""

    num_prompt_tokens: int
    num_output_tokens: int


def request_flops(model: ModelConfig, item: WorkItem) -> float:
    """FLOPs of the minimal forward work for one request with a KV cache.

    Every prompt token and every generated token but the last is fed once through the
    projections and MLP; the LM head runs only for the positions that sample; each fed token at
    position p attends to p + 1 keys (QK^T and PV).
    """
    h, i = model.hidden_size, model.intermediate_size
    q = model.num_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    per_token = 2 * model.num_layers * (h * q + 2 * h * kv + q * h + 3 * h * i)
    head = 2 * model.vocab_size * h
    fed = item.num_prompt_tokens + item.num_output_tokens - 1
    attn_per_key = 4 * model.num_layers * model.num_heads * model.head_dim
    attn = attn_per_key * fed * (fed + 1) / 2
    return per_token * fed + head * item.num_output_tokens + attn


def model_gemm_shapes(model: ModelConfig, rows: int = 512) -> list[tuple[int, int, int]]:
    """(m, k, n) of the model's own projections for a step of `rows` tokens: QKV, output, MLP up
    and down. A square matmul alone is not the peak the model's skinnier GEMMs reach (or miss)."""
    h, i = model.hidden_size, model.intermediate_size
    q = model.num_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    return [(rows, h, q + 2 * kv), (rows, q, h), (rows, h, 2 * i), (rows, i, h)]


def measure_peak_gemm_flops(
    size: int = 1024,
    repeats: int = 8,
    dtype_name: str = "float32",
    shapes: list[tuple[int, int, int]] | None = None,
    min_s: float = 0.3,
) -> float:
    """Best observed FLOP/s of a matmul on this machine's CPU (torch, all threads): over a square
    `size` matmul and each (m, k, n) of `shapes`, each timed `repeats` times and for at least
    `min_s` (one short burst read 111 and 172 GFLOP/s minutes apart on one host: a core's clock
    ramping up, a neighbour's slice). The best of the lot is the peak: the bound it gives is a
    lower bound only if no GEMM of the run was faster."""
    import torch

    dtype = getattr(torch, dtype_name)
    best_flop_s = 0.0
    for m, k, n in [(size, size, size), *(shapes or [])]:
        a = torch.randn(m, k, dtype=dtype)
        b = torch.randn(k, n, dtype=dtype)
        for _ in range(2):
            a @ b
        best = float("inf")
        done, started = 0, time.perf_counter()
        while done < repeats or time.perf_counter() - started < min_s:
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
            done += 1
        best_flop_s = max(best_flop_s, 2 * m * k * n / best)
    return best_flop_s
