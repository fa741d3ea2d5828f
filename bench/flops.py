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


def measure_peak_gemm_flops(size: int = 1024, repeats: int = 8, dtype_name: str = "float32") -> float:
    """Best observed FLOP/s of a square matmul on this machine's CPU (torch, all threads)."""
    import torch

    dtype = getattr(torch, dtype_name)
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best
