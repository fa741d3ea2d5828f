"""weir.kernels.prefill_attention (the CPU path of prefill chunks) against the oracle
weir.kernels.reference.prefill_attention_into: prefix and chunk apart, merged by log-sum-exp."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.kernels import prefill_attention, reference

CPU = torch.device("cpu")


def _context(q_len: int, prefix: int, heads: tuple[int, int], dtype: torch.dtype, seed: int):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    num_heads, num_kv_heads = heads
    query = torch.randn(q_len, num_heads, 16, generator=g).to(dtype)
    key = torch.randn(prefix + q_len, num_kv_heads, 16, generator=g).to(dtype)
    value = torch.randn(prefix + q_len, num_kv_heads, 16, generator=g).to(dtype)
    return query, key, value


def _oracle(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    return reference.chunk_attention(query, key, value, scale)


@settings(max_examples=40, deadline=None)
@given(
    q_len=st.integers(2, 70),
    prefix=st.integers(0, 200),
    heads=st.sampled_from([(4, 4), (6, 2), (9, 3), (4, 1)]),
    seed=st.integers(0, 10_000),
)
def test_a_chunk_matches_the_oracle(q_len: int, prefix: int, heads: tuple[int, int], seed: int) -> None:
    query, key, value = _context(q_len, prefix, heads, torch.float32, seed)
    got = prefill_attention.chunk_attention(query, key, value, 0.25)
    torch.testing.assert_close(got, _oracle(query, key, value, 0.25), atol=2e-6, rtol=2e-6)


def test_bfloat16_stays_within_its_rounding() -> None:
    query, key, value = _context(40, 100, (9, 3), torch.bfloat16, 1)
    got = prefill_attention.chunk_attention(query, key, value, 0.25)
    want = _oracle(query.float(), key.float(), value.float(), 0.25)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


def test_the_paged_path_writes_every_chunk_at_its_tokens() -> None:
    # two sequences in a 4-token-block cache: a chunk over a cached prefix, and a whole prompt
    torch.manual_seed(0)
    kv_cache = torch.randn(2, 20, 4, 2, 16)
    tables = torch.tensor([[3, 7, 1, 9, 0], [12, 5, 0, 0, 0]], dtype=torch.int32)
    query = torch.randn(9 + 6, 4, 16)
    starts, lens = (0, 9, 15), (17, 6)
    want = torch.zeros_like(query)
    reference.prefill_attention_into(want, query, kv_cache, tables, starts, lens, (0, 1), 0.3)
    got = torch.zeros_like(query)
    attend = prefill_attention.best_chunk_attention()
    assert attend is prefill_attention.chunk_attention
    reference.prefill_attention_into(got, query, kv_cache, tables, starts, lens, (0, 1), 0.3, attend)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-6)


def test_without_the_flash_op_the_oracle_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefill_attention, "_FLASH", None)
    assert not prefill_attention.available()
    kv_cache = torch.randn(2, 8, 4, 2, 16)
    tables = torch.tensor([[2, 5, 1]], dtype=torch.int32)
    query = torch.randn(5, 4, 16)
    want = torch.zeros_like(query)
    reference.prefill_attention_into(want, query, kv_cache, tables, (0, 5), (11,), (0,), 0.3)
    got = torch.zeros_like(query)
    attend = prefill_attention.best_chunk_attention()
    assert attend is reference.chunk_attention
    reference.prefill_attention_into(got, query, kv_cache, tables, (0, 5), (11,), (0,), 0.3, attend)
    torch.testing.assert_close(got, want)
