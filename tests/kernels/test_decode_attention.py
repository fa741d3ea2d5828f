"""kernels.decode_attention (the CPU decode path) against the oracle kernels.reference.paged_attention."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import reference
from kernels.decode_attention import decode_attention, plan_decode
from tests.kernels.steps import Step, random_step

CPU = torch.device("cpu")


def _step(num_cached: list[int], num_heads: int, num_kv_heads: int, block_size: int, seed: int = 0) -> Step:
    return random_step(
        [1] * len(num_cached),
        num_cached,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=16,
        block_size=block_size,
        dtype=torch.float32,
        device=CPU,
        seed=seed,
    )


def _both(step: Step) -> tuple[torch.Tensor, torch.Tensor]:
    md = step.metadata
    reference.write_kv(step.key, step.value, step.kv_cache, md.slot_mapping)
    scale = step.query.shape[-1] ** -0.5
    expected = reference.paged_attention(
        step.query, step.kv_cache, md.block_tables, md.query_start_loc_cpu, md.seq_lens_cpu, scale
    )
    plan = plan_decode(md.block_tables, md.seq_lens_cpu, md.block_size)
    return decode_attention(step.query, step.kv_cache, plan, scale), expected


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads"), [(4, 4), (4, 2), (9, 3), (4, 1)], ids=["mha", "gqa", "gqa3", "mqa"]
)
def test_matches_the_oracle(block_size: int, num_heads: int, num_kv_heads: int) -> None:
    # mixed lengths: padded rows, a row exactly a whole number of blocks, a one-token context
    got, expected = _both(_step([0, 5, 15, 31, 64, 130], num_heads, num_kv_heads, block_size))
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=2e-6)


def test_no_padding_needs_no_mask() -> None:
    step = _step([15, 15], 4, 2, 16)  # both contexts are exactly one block
    assert plan_decode(step.metadata.block_tables, step.metadata.seq_lens_cpu, 16).mask is None
    got, expected = _both(step)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=2e-6)


@settings(max_examples=30, deadline=None)
@given(
    num_cached=st.lists(st.integers(0, 70), min_size=1, max_size=6),
    kv=st.sampled_from([(4, 4), (6, 2), (4, 1)]),
    block_size=st.sampled_from([1, 4, 8]),
    seed=st.integers(0, 10_000),
)
def test_matches_the_oracle_on_random_steps(
    num_cached: list[int], kv: tuple[int, int], block_size: int, seed: int
) -> None:
    got, expected = _both(_step(num_cached, kv[0], kv[1], block_size, seed))
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=2e-6)


def test_bad_shapes_are_refused_with_a_message() -> None:
    step = _step([3, 7], 4, 2, 4)
    md = step.metadata
    with pytest.raises(ValueError, match="rows for 3 sequences"):
        plan_decode(md.block_tables, (4, 8, 1), 4)
    with pytest.raises(ValueError, match="needs 5 blocks"):
        plan_decode(md.block_tables, (4, 20), 4)
    with pytest.raises(ValueError, match=">= 1 token"):
        plan_decode(md.block_tables, (0, 8), 4)
    plan = plan_decode(md.block_tables, md.seq_lens_cpu, 4)
    with pytest.raises(ValueError, match="does not fit"):
        decode_attention(step.query[:1], step.kv_cache, plan, 1.0)
