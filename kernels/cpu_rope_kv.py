"""RoPE on q and k and the step's K/V stored in the paged cache, in one C call (CPU, float32).

`rope_kv_write(qkv, cos, sin, slot_mapping, kv_cache, num_heads, num_kv_heads)` reads the fused
qkv projection's output `[tokens, (heads + 2 kv_heads) * head_dim]`, returns the rotated query
`[tokens, heads, head_dim]` and writes the rotated keys and the values into their cache slots:
what the torch path does with a slice, four multiplies, a subtract, an add and a `cat` for the
rotation, then a split, a copy of v and two `index_copy_` for the store (~60 us a layer at 8
rows of SmolLM2, once per layer; the C kernel `native/rope_kv.c` is one ctypes call). The
rotation is the same operations in the same order as `weir.engine.models.rope.RotaryEmbedding.rotate`, so
the same bits; `weir.kernels.reference.write_kv`'s store is a copy.

`available()` is False where the kernel cannot be built (no C compiler): callers keep the torch
form. Tested against the torch form.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from weir.kernels.native import build

_I64 = ctypes.c_int64
_F32 = torch.float32


@functools.cache
def _function() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    ptr = ctypes.c_void_p
    return build.function("rope_kv", "weir_rope_kv_write", [ptr, _I64, ptr, ptr, ptr, ptr, ptr] + [_I64] * 5)


def available() -> bool:
    """Whether the C kernel is built (or can be: the first call compiles it)."""
    return _function() is not None


def _cpu_f32(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.device.type == "cpu"


def check_step_tables(
    cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor, tokens: int, half: int
) -> None:
    """ValueError unless cos and sin are contiguous float32 CPU [tokens, half] (or [tokens, 1,
    half]: the same bytes) and slot_mapping a contiguous int64 [tokens]: a step's tables as the
    kernel reads them (also for kernels/cpu_decode_layers.py, which hands them to it)."""
    for name, table in (("cos", cos), ("sin", sin)):
        if (
            table.dtype != _F32
            or not table.is_cpu
            or not table.is_contiguous()
            or table.numel() != tokens * half
        ):
            raise ValueError(
                f"{name} must be a contiguous float32 CPU [{tokens}, {half}], got {table.dtype} {tuple(table.shape)}"
            )
    if (
        slot_mapping.dtype != torch.int64
        or not slot_mapping.is_contiguous()
        or slot_mapping.numel() != tokens
    ):
        raise ValueError(f"slot_mapping must be a contiguous int64 [{tokens}], got {slot_mapping.dtype}")


def rope_kv_write(
    qkv: torch.Tensor,  # [tokens, >= (num_heads + 2 num_kv_heads) * head_dim] float32 (rows read in place)
    cos: torch.Tensor,  # [tokens, head_dim // 2] (or [tokens, 1, head_dim // 2]) float32, contiguous
    sin: torch.Tensor,  # as cos
    slot_mapping: torch.Tensor,  # [tokens] int64: each token's cache slot
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim] float32, contiguous
    num_heads: int,
) -> torch.Tensor:  # [tokens, num_heads, head_dim]: the rotated query
    """The rotated query; the rotated keys and the values stored in `kv_cache` at `slot_mapping`.
    ValueError (nothing written) on tensors the kernel would misread or a slot outside the cache.
    Checked with the least work (each tensor attribute read costs ~0.2-0.5 us; once a layer)."""
    fn = _function()
    if fn is None:
        raise RuntimeError("the C RoPE + KV store kernel is not available (weir.kernels.native.build)")
    shape = kv_cache.shape
    if (
        len(shape) != 5
        or shape[0] != 2
        or kv_cache.dtype != _F32
        or not kv_cache.is_cpu
        or not kv_cache.is_contiguous()
    ):
        raise ValueError(
            f"kv_cache must be a contiguous float32 CPU [2, blocks, block_size, kv_heads, head_dim], got "
            f"{kv_cache.dtype} {tuple(shape)}"
        )
    _, num_blocks, block_size, num_kv_heads, head_dim = shape
    half = head_dim // 2
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv_shape = qkv.shape
    if len(qkv_shape) != 2 or qkv.dtype != _F32 or not qkv.is_cpu or qkv_shape[1] < width:
        raise ValueError(
            f"qkv must be a float32 CPU [tokens, >= {width}] matrix, got {qkv.dtype} {tuple(qkv_shape)}"
        )
    tokens = qkv_shape[0]
    if qkv.stride(1) != 1 or qkv.stride(0) < qkv_shape[1]:
        qkv = qkv.contiguous()
    check_step_tables(cos, sin, slot_mapping, tokens, half)
    q = torch.empty(tokens, num_heads, head_dim, dtype=torch.float32)
    if tokens == 0:
        return q
    status = fn(
        qkv.data_ptr(),
        qkv.stride(0),
        cos.data_ptr(),
        sin.data_ptr(),
        slot_mapping.data_ptr(),
        q.data_ptr(),
        kv_cache.data_ptr(),
        tokens,
        num_heads,
        num_kv_heads,
        head_dim,
        num_blocks * block_size,
    )
    if status != 0:
        raise ValueError(
            f"the C kernel refused: a slot outside [0, {num_blocks * block_size}) or an odd head_dim {head_dim}"
        )
    return q
