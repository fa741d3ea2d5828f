"""Every Triton kernel against its torch oracle on random inputs, at real model sizes.

Used by `weir_bench.gpu_check` on a GPU (kernels compiled for real), and by the kernel tests,
which share `random_step`. Each check returns a `KernelCheck` row instead of raising, so one
failing case does not hide the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from weir.engine.models.attention import AttentionMetadata

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# max |got - expected| / (1 + |expected|) allowed, per dtype
TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@dataclass(frozen=True)
class KernelCheck:
    """One kernel on one input configuration."""

    kernel: str
    case: str
    dtype: str
    max_error: float  # max |got - expected| / (1 + |expected|)
    tolerance: float
    seconds: float

    @property
    def passed(self) -> bool:
        return self.max_error <= self.tolerance


@dataclass(frozen=True)
class Step:
    """One step's tensors: new tokens' q/k/v, a cache holding their context, and the metadata."""

    query: torch.Tensor  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    metadata: AttentionMetadata


def random_step(
    q_lens: Sequence[int],
    num_cached: Sequence[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
) -> Step:
    """Sequence i has `num_cached[i]` tokens in the cache and adds `q_lens[i]` this step.

    Blocks are shuffled (a sequence's pages are scattered and out of order) and block 0 is
    left out, like the engine's null block; table padding points at it.
    """
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in zip(num_cached, q_lens, strict=True)]
    blocks_per_seq = [(s + block_size - 1) // block_size for s in seq_lens]
    num_blocks = 1 + sum(blocks_per_seq) + 3  # a few spare blocks nobody owns
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables: list[list[int]] = []
    for n in blocks_per_seq:
        tables.append(ids[:n])
        ids = ids[n:]
    width = max(max(blocks_per_seq), 1)
    padded = [t + [0] * (width - len(t)) for t in tables]
    starts = [0]
    slots: list[int] = []
    for table, cached, q_len in zip(tables, num_cached, q_lens, strict=True):
        starts.append(starts[-1] + q_len)
        slots += [table[p // block_size] * block_size + p % block_size for p in range(cached, cached + q_len)]

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
        query_start_loc_cpu=tuple(starts),
        seq_lens_cpu=tuple(seq_lens),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        block_size=block_size,
    )
    return Step(
        query=rand(starts[-1], num_heads, head_dim),
        key=rand(starts[-1], num_kv_heads, head_dim),
        value=rand(starts[-1], num_kv_heads, head_dim),
        kv_cache=rand(2, num_blocks, block_size, num_kv_heads, head_dim),
        metadata=metadata,
    )


def _error(got: torch.Tensor, expected: torch.Tensor) -> float:
    diff = (got.float() - expected.float()).abs() / (1 + expected.float().abs())
    return float(diff.max().item()) if diff.numel() else 0.0


def _timed(device: torch.device, fn: Callable[..., float], *args: Any) -> tuple[float, float]:
    """(fn(*args), seconds it took, including any first-call compile)."""
    t0 = time.perf_counter()
    err = fn(*args)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return err, time.perf_counter() - t0


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# (num_heads, num_kv_heads, head_dim): SmolLM2-135M, Llama-3-8B, an MQA model, an MHA model
HEAD_SHAPES = ((9, 3, 64), (32, 8, 128), (16, 1, 128), (8, 8, 64))


def _attention_error(step: Step) -> float:
    from weir.kernels import reference
    from weir.kernels.paged_attention import paged_attention

    md, scale = step.metadata, step.query.shape[-1] ** -0.5
    reference.write_kv(step.key, step.value, step.kv_cache, md.slot_mapping)
    got = paged_attention(
        step.query, step.kv_cache, md.block_tables, md.query_start_loc, md.seq_lens, md.max_query_len, scale
    )
    expected = reference.paged_attention(
        step.query, step.kv_cache, md.block_tables, md.query_start_loc_cpu, md.seq_lens_cpu, scale
    )
    return _error(got, expected)


def check_attention(device: torch.device, quick: bool) -> list[KernelCheck]:
    """Mixed steps (long prefill, chunks with context, decode rows on page edges) and decode-only."""
    shapes: Sequence[tuple[int, int, int]] = HEAD_SHAPES
    block_sizes: Sequence[int] = (16, 32)
    dtypes: Sequence[torch.dtype] = DTYPES
    if quick:
        shapes, block_sizes, dtypes = ((4, 2, 32),), (16,), (torch.float32,)
        steps = {"mixed": ([9, 1, 1, 5], [0, 30, 16, 7]), "decode": ([1] * 3, [4, 17, 40])}
    else:
        steps = {
            "mixed": ([300, 1, 1, 1, 57, 1, 128], [0, 1000, 15, 16, 200, 2047, 64]),
            "decode": ([1] * 64, [(37 * i) % 4000 + 1 for i in range(64)]),
        }
    rows = []
    for heads, kv_heads, head_dim in shapes:
        for block_size in block_sizes:
            for dtype in dtypes:
                for label, (q_lens, cached) in steps.items():
                    step = random_step(
                        q_lens,
                        cached,
                        num_heads=heads,
                        num_kv_heads=kv_heads,
                        head_dim=head_dim,
                        block_size=block_size,
                        dtype=dtype,
                        device=device,
                    )
                    err, secs = _timed(device, _attention_error, step)
                    case = f"{label} h={heads}/{kv_heads} d={head_dim} page={block_size}"
                    rows.append(
                        KernelCheck("paged_attention", case, _name(dtype), err, TOLERANCE[dtype], secs)
                    )
    return rows


def _cache_error(k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor) -> float:
    """0 when bit-identical to the reference scatter, else the (positive) relative error."""
    from weir.kernels import reference
    from weir.kernels.reshape_and_cache import reshape_and_cache

    expected = cache.clone()
    reference.write_kv(k, v, expected, slots)
    reshape_and_cache(k, v, cache, slots)
    return 0.0 if torch.equal(cache, expected) else max(_error(cache, expected), 1e-30)


def check_reshape_and_cache(device: torch.device, quick: bool) -> list[KernelCheck]:
    """Bit-identical cache contents to the reference scatter, including a cast to the cache dtype."""
    num_tokens, kv_heads, head_dim = (20, 2, 32) if quick else (3000, 8, 128)
    rows = []
    for src in (torch.float32,) if quick else DTYPES:
        # (the CPU interpreter truncates float32 -> bfloat16: quick runs keep float32 caches)
        for dst in (torch.float32,) if quick else (torch.float32, torch.bfloat16):
            qkv = torch.randn(num_tokens, 4 * kv_heads * head_dim, device=device).to(src)
            kv_size = kv_heads * head_dim
            k = qkv[:, :kv_size].view(num_tokens, kv_heads, head_dim)  # strided views, like the model's
            v = qkv[:, kv_size : 2 * kv_size].view(num_tokens, kv_heads, head_dim)
            num_blocks = num_tokens // 16 + 2
            slots = torch.randperm(num_blocks * 16, device=device)[:num_tokens]
            cache = torch.zeros(2, num_blocks, 16, kv_heads, head_dim, device=device, dtype=dst)
            err, secs = _timed(device, _cache_error, k, v, slots, cache)
            rows.append(
                KernelCheck("reshape_and_cache", f"{_name(src)} -> cache", _name(dst), err, 0.0, secs)
            )
    return rows


def _norm_error(norm: Any, x: torch.Tensor, res: torch.Tensor) -> float:
    from weir.kernels.rms_norm import fused_add_rms_norm, rms_norm

    plain = _error(rms_norm(x, norm.weight, norm.eps), norm(x))
    expected = norm(x + res)
    out, _ = fused_add_rms_norm(x, res.clone(), norm.weight, norm.eps)
    return max(plain, _error(out, expected))


def _silu_error(gate_up: torch.Tensor) -> float:
    from weir.kernels.silu_mul import silu_mul

    gate, up = gate_up.split(gate_up.shape[1] // 2, dim=-1)
    return _error(silu_mul(gate_up), F.silu(gate) * up)


def _rope_error(
    qkv: torch.Tensor, shape: tuple[int, int, int], rotary: Any, positions: torch.Tensor
) -> float:
    from weir.kernels.rotary import apply_rotary_

    heads, kv_heads, head_dim = shape
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.view(-1, heads, head_dim), k.view(-1, kv_heads, head_dim)
    expected_q, expected_k = rotary.apply(q, k, positions)
    apply_rotary_(q, k, rotary.cos, rotary.sin, positions)
    return max(_error(q, expected_q), _error(k, expected_k))


def check_pointwise(device: torch.device, quick: bool) -> list[KernelCheck]:
    """RMSNorm (plain and fused with the residual add), RoPE, SiLU-and-mul against the torch path."""
    from weir.engine.config import RopeConfig
    from weir.engine.models.llama_layers import RMSNorm
    from weir.engine.models.rope import RotaryEmbedding

    num_tokens = 9 if quick else 2000
    hiddens = (64,) if quick else (576, 4096)
    rows = []
    for dtype in (torch.float32,) if quick else DTYPES:
        tol, dt = TOLERANCE[dtype], _name(dtype)
        for hidden in hiddens:
            norm = RMSNorm(hidden, 1e-5, dtype, device)
            with torch.no_grad():
                norm.weight.copy_(1 + 0.2 * torch.randn(hidden))
            x = 3 * torch.randn(num_tokens, hidden, device=device).to(dtype)
            res = torch.randn(num_tokens, hidden, device=device).to(dtype)
            err, secs = _timed(device, _norm_error, norm, x, res)
            rows.append(KernelCheck("rms_norm", f"hidden={hidden} (+fused add)", dt, err, tol, secs))
            gate_up = 4 * torch.randn(num_tokens, 6 * hidden, device=device).to(dtype)
            err, secs = _timed(device, _silu_error, gate_up)
            rows.append(KernelCheck("silu_mul", f"intermediate={3 * hidden}", dt, err, tol, secs))
        for heads, kv_heads, head_dim in ((4, 2, 32),) if quick else HEAD_SHAPES[:3]:
            rotary = RotaryEmbedding(RopeConfig(theta=500000.0), head_dim, 8192, dtype=dtype, device=device)
            qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, device=device).to(dtype)
            positions = torch.randint(0, 8192, (num_tokens,), device=device)
            err, secs = _timed(device, _rope_error, qkv, (heads, kv_heads, head_dim), rotary, positions)
            rows.append(KernelCheck("rotary", f"h={heads}/{kv_heads} d={head_dim}", dt, err, tol, secs))
    return rows


def run_kernel_checks(device: torch.device, quick: bool = False) -> list[KernelCheck]:
    """All kernels, all cases. The first call of each configuration includes its compile time."""
    torch.manual_seed(0)
    return (
        check_reshape_and_cache(device, quick)
        + check_pointwise(device, quick)
        + check_attention(device, quick)
    )
