"""weir.kernels.cpu_rope_kv: the C RoPE + K/V store against the torch form (`RotaryEmbedding.rotate` and
`weir.kernels.reference.write_kv`): the same bits in q and in the cache, other slots untouched; misread
tensors and slots outside the cache refused with nothing written."""

from __future__ import annotations

import pytest
import torch

from weir.engine.models.rope import RotaryEmbedding
from weir.kernels import cpu_rope_kv
from weir.kernels.reference import write_kv

pytestmark = pytest.mark.skipif(not cpu_rope_kv.available(), reason="no C compiler")


def _case(tokens: int, heads: int, kv_heads: int, head_dim: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    positions = torch.randint(0, 500, (tokens,), generator=gen)
    angles = positions[:, None].float() * torch.rand(head_dim // 2, generator=gen)
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]  # as RotaryEmbedding.tables gives them
    cache = torch.randn(2, 12, 16, kv_heads, head_dim, generator=gen)
    slots = torch.randperm(12 * 16, generator=gen)[:tokens]
    return qkv, cos, sin, slots, cache


def _torch_form(qkv, cos, sin, slots, cache, heads, kv_heads, head_dim):
    tokens = qkv.shape[0]
    qk = qkv[:, : (heads + kv_heads) * head_dim].view(tokens, heads + kv_heads, head_dim)
    qk = RotaryEmbedding.rotate(qk, cos, sin)
    q, k = qk.split([heads, kv_heads], dim=1)
    v = qkv[:, (heads + kv_heads) * head_dim :].reshape(tokens, kv_heads, head_dim)
    write_kv(k, v.contiguous(), cache, slots)
    return q


@pytest.mark.parametrize(
    ("tokens", "heads", "kv_heads", "head_dim"), [(1, 9, 3, 64), (8, 9, 3, 64), (37, 4, 4, 16), (3, 6, 2, 2)]
)
def test_the_same_bits_as_the_torch_form(tokens: int, heads: int, kv_heads: int, head_dim: int) -> None:
    qkv, cos, sin, slots, cache = _case(tokens, heads, kv_heads, head_dim, seed=tokens)
    want_cache = cache.clone()
    want_q = _torch_form(qkv, cos, sin, slots, want_cache, heads, kv_heads, head_dim)
    got_q = cpu_rope_kv.rope_kv_write(qkv, cos.contiguous(), sin.contiguous(), slots, cache, heads)
    assert torch.equal(got_q, want_q)
    assert torch.equal(cache, want_cache)  # the written slots, and every other slot untouched


def test_rows_of_a_wider_view_and_an_empty_step() -> None:
    heads, kv_heads, head_dim = 4, 2, 8
    qkv, cos, sin, slots, cache = _case(5, heads, kv_heads, head_dim)
    wide = torch.cat([qkv, torch.randn(5, 7)], dim=1)[:, : qkv.shape[1]]  # row stride past the width
    want_cache = cache.clone()
    want_q = _torch_form(qkv, cos, sin, slots, want_cache, heads, kv_heads, head_dim)
    assert torch.equal(cpu_rope_kv.rope_kv_write(wide, cos, sin, slots, cache, heads), want_q)
    assert torch.equal(cache, want_cache)
    empty = cpu_rope_kv.rope_kv_write(qkv[:0], cos[:0], sin[:0], slots[:0], cache, heads)
    assert empty.shape == (0, heads, head_dim) and torch.equal(cache, want_cache)


def test_a_slot_outside_the_cache_is_refused_before_anything_is_written() -> None:
    qkv, cos, sin, slots, cache = _case(4, 4, 2, 8)
    before = cache.clone()
    for bad in (12 * 16, -1):
        wrong = slots.clone()
        wrong[3] = bad
        with pytest.raises(ValueError, match="slot outside"):
            cpu_rope_kv.rope_kv_write(qkv, cos, sin, wrong, cache, 4)
        assert torch.equal(cache, before)


def test_misread_tensors_are_refused() -> None:
    qkv, cos, sin, slots, cache = _case(4, 4, 2, 8)
    with pytest.raises(ValueError, match="kv_cache must be"):
        cpu_rope_kv.rope_kv_write(qkv, cos, sin, slots, cache.double(), 4)
    with pytest.raises(ValueError, match="kv_cache must be"):
        cpu_rope_kv.rope_kv_write(qkv, cos, sin, slots, cache.transpose(1, 2), 4)
    with pytest.raises(ValueError, match="qkv must be"):
        cpu_rope_kv.rope_kv_write(qkv[:, :-1], cos, sin, slots, cache, 4)
    with pytest.raises(ValueError, match="qkv must be"):
        cpu_rope_kv.rope_kv_write(qkv.double(), cos, sin, slots, cache, 4)
    with pytest.raises(ValueError, match="cos must be"):
        cpu_rope_kv.rope_kv_write(qkv, cos[:3], sin, slots, cache, 4)
    with pytest.raises(ValueError, match="sin must be"):
        cpu_rope_kv.rope_kv_write(qkv, cos, sin.double(), slots, cache, 4)
    with pytest.raises(ValueError, match="slot_mapping must be"):
        cpu_rope_kv.rope_kv_write(qkv, cos, sin, slots.int(), cache, 4)
