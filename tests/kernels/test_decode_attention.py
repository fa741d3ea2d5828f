"""weir.kernels.decode_attention (the CPU path of every step) against the oracle weir.kernels.reference.paged_attention."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kernels.steps import Step, random_step
from weir.kernels import reference
from weir.kernels.decode_attention import (
    MAX_GROUPS,
    decode_attention,
    mixed_attention,
    plan_decode,
    plan_step,
)

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
    (group,) = plan_decode(step.metadata.block_tables, step.metadata.seq_lens_cpu, 16).groups
    assert group.mask is None and group.rows is None
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


def test_one_long_context_gets_its_own_group() -> None:
    # 22 short chats and one long one: padding every row to the long one would waste ~3x
    step = _step([200] * 11 + [770] + [190] * 11, 9, 3, 16)
    plan = plan_decode(step.metadata.block_tables, step.metadata.seq_lens_cpu, 16)
    assert len(plan.groups) == 2
    long_group = next(g for g in plan.groups if g.num_seqs == 1)
    assert long_group.rows is not None and long_group.rows.tolist() == [11]
    got, expected = _both(step)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=2e-6)


def test_similar_lengths_stay_one_group_in_order() -> None:
    step = _step([100, 120, 90, 110], 4, 2, 16)
    (group,) = plan_decode(step.metadata.block_tables, step.metadata.seq_lens_cpu, 16).groups
    assert group.rows is None


@settings(max_examples=60, deadline=None)
@given(lens=st.lists(st.integers(1, 2000), min_size=1, max_size=40), block_size=st.sampled_from([1, 16]))
def test_groups_cover_every_row_once_and_bound_the_padding(lens: list[int], block_size: int) -> None:
    blocks = [(n + block_size - 1) // block_size for n in lens]
    tables = torch.zeros(len(lens), max(blocks), dtype=torch.int32)
    plan = plan_decode(tables, lens, block_size)
    assert 1 <= len(plan.groups) <= MAX_GROUPS
    rows = [r for g in plan.groups for r in (g.rows.tolist() if g.rows is not None else range(len(lens)))]
    assert sorted(rows) == list(range(len(lens)))
    padded = sum(g.num_seqs * g.padded_len // block_size for g in plan.groups)
    if len(plan.groups) < MAX_GROUPS:  # the last group takes the rest, unbounded
        assert padded <= 1.5 * sum(blocks) + 1e-9


def _mixed(q_lens: list[int], num_cached: list[int], kv: tuple[int, int], block_size: int, seed: int):
    step = random_step(
        q_lens,
        num_cached,
        num_heads=kv[0],
        num_kv_heads=kv[1],
        head_dim=16,
        block_size=block_size,
        dtype=torch.float32,
        device=CPU,
        seed=seed,
    )
    md = step.metadata
    reference.write_kv(step.key, step.value, step.kv_cache, md.slot_mapping)
    scale = 16**-0.5
    expected = reference.paged_attention(
        step.query, step.kv_cache, md.block_tables, md.query_start_loc_cpu, md.seq_lens_cpu, scale
    )
    plan = plan_step(md.block_tables, md.query_start_loc_cpu, md.seq_lens_cpu, md.block_size)
    got = mixed_attention(
        step.query, step.kv_cache, md.block_tables, md.query_start_loc_cpu, md.seq_lens_cpu, plan, scale
    )
    return plan, got, expected


def test_mixed_step_with_decodes_first_uses_a_slice() -> None:
    plan, got, expected = _mixed([1, 1, 1, 7, 20], [30, 400, 5, 0, 13], (4, 2), 8, 0)
    assert plan.decode is not None and plan.decode_tokens == slice(0, 3) and plan.prefill_rows == (3, 4)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=2e-6)


@settings(max_examples=40, deadline=None)
@given(
    seqs=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 90)), min_size=1, max_size=7),
    kv=st.sampled_from([(4, 4), (6, 2), (4, 1)]),
    block_size=st.sampled_from([1, 4, 16]),
    seed=st.integers(0, 10_000),
)
def test_mixed_steps_match_the_oracle(
    seqs: list[tuple[int, int]], kv: tuple[int, int], block_size: int, seed: int
) -> None:
    # decode rows (q_len 1) anywhere among prefill chunks, any context lengths
    q_lens = [q if q > 4 else 1 for q, _ in seqs]
    _, got, expected = _mixed(q_lens, [c for _, c in seqs], kv, block_size, seed)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=2e-6)
