"""weir.kernels.reshape_and_cache against weir.kernels.reference.write_kv."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.interpret import bf16_slack
from weir.kernels import reference
from weir.kernels.reshape_and_cache import reshape_and_cache

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _qkv_views(
    num_tokens: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V as strided views into a fused qkv output, like the model's projections."""
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size, generator=torch.Generator().manual_seed(3))
    qkv = qkv.to(device=device, dtype=dtype)
    _, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    return k.view(num_tokens, num_kv_heads, head_dim), v.view(num_tokens, num_kv_heads, head_dim)


@pytest.mark.parametrize("cache_dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize(("num_kv_heads", "head_dim"), [(3, 64), (1, 24)])
def test_writes_the_same_cache_as_the_reference(
    device: torch.device, cache_dtype: torch.dtype, block_size: int, num_kv_heads: int, head_dim: int
) -> None:
    num_tokens, num_blocks = 37, 6
    key, value = _qkv_views(num_tokens, 2 * num_kv_heads, num_kv_heads, head_dim, torch.float32, device)
    slots = torch.randperm(num_blocks * block_size, generator=torch.Generator().manual_seed(1))[:num_tokens]
    slots = slots.to(device)
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim).to(
        device=device, dtype=cache_dtype
    )
    expected = cache.clone()
    reference.write_kv(key, value, expected, slots)
    reshape_and_cache(key, value, cache, slots)
    # a copy with one cast: bit-identical (to an ulp under the interpreter's bfloat16)
    slack = bf16_slack(cache_dtype)
    torch.testing.assert_close(cache, expected, atol=0, rtol=slack)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_copy_exactly(device: torch.device, dtype: torch.dtype) -> None:
    key, value = _qkv_views(9, 4, 2, 16, dtype, device)
    slots = torch.arange(9, device=device, dtype=torch.int32) * 3
    cache = torch.zeros(2, 4, 8, 2, 16, dtype=dtype, device=device)
    expected = cache.clone()
    reference.write_kv(key, value, expected, slots.long())
    reshape_and_cache(key, value, cache, slots)
    assert torch.equal(cache, expected)


def test_negative_slots_are_padding_and_write_nothing(device: torch.device) -> None:
    key, value = _qkv_views(4, 2, 2, 16, torch.float32, device)
    slots = torch.tensor([5, -1, 0, -1], device=device)
    cache = torch.zeros(2, 2, 16, 2, 16, device=device)
    reshape_and_cache(key, value, cache, slots)
    flat = cache.view(2, 32, 2, 16)
    assert torch.equal(flat[0, 5], key[0]) and torch.equal(flat[1, 0], value[2])
    untouched = torch.ones(32, dtype=torch.bool)
    untouched[[0, 5]] = False
    assert not flat[:, untouched.to(device)].any()


@pytest.mark.parametrize(
    ("name", "bad", "message"),
    [
        ("key", lambda a: a["key"][:, :1], "key has size 1 in dimension 1"),
        ("value", lambda a: a["value"][:3], "value has size 3 in dimension 0"),
        ("value", lambda a: a["value"].int(), "value must have dtype"),
        ("slot_mapping", lambda a: a["slot_mapping"].float(), "slot_mapping must have dtype"),
        ("slot_mapping", lambda a: a["slot_mapping"][::2], "slot_mapping must have stride 1"),
        ("kv_cache", lambda a: a["kv_cache"].transpose(3, 4), "kv_cache"),
        ("kv_cache", lambda a: a["kv_cache"][:1], "kv_cache has size 1 in dimension 0"),
    ],
)
def test_rejects_bad_arguments_naming_them(device: torch.device, name: str, bad, message: str) -> None:  # type: ignore[no-untyped-def]
    key, value = _qkv_views(4, 2, 2, 16, torch.float32, device)
    args = dict(
        key=key,
        value=value,
        kv_cache=torch.zeros(2, 2, 16, 2, 16, device=device),
        slot_mapping=torch.arange(4, device=device),
    )
    args[name] = bad(args)
    with pytest.raises(ValueError, match=message):
        reshape_and_cache(**args)
