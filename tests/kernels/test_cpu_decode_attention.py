"""weir.kernels.cpu_decode_attention (the C kernel, the cache read in place) against the oracle
weir.kernels.reference.paged_attention, directly and through the decode plan the engine uses."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kernels.steps import Step, random_step
from weir.kernels import cpu_decode_attention, reference
from weir.kernels.decode_attention import decode_attention, plan_decode

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(not cpu_decode_attention.available(), reason="no C compiler here")


def _step(
    num_cached: list[int], heads: tuple[int, int], head_dim: int, block_size: int, seed: int = 0
) -> Step:
    step = random_step(
        [1] * len(num_cached),
        num_cached,
        num_heads=heads[0],
        num_kv_heads=heads[1],
        head_dim=head_dim,
        block_size=block_size,
        dtype=torch.float32,
        device=CPU,
        seed=seed,
    )
    reference.write_kv(step.key, step.value, step.kv_cache, step.metadata.slot_mapping)
    return step


def _oracle(step: Step, scale: float) -> torch.Tensor:
    md = step.metadata
    return reference.paged_attention(
        step.query, step.kv_cache, md.block_tables, md.query_start_loc_cpu, md.seq_lens_cpu, scale
    )


def _native(step: Step, scale: float) -> torch.Tensor:
    md = step.metadata
    plan = cpu_decode_attention.plan(md.block_tables, md.seq_lens_cpu, md.block_size)
    return cpu_decode_attention.decode_attention(step.query, step.kv_cache, plan, scale)


@pytest.mark.parametrize(
    "head_dim", [64, 128, 24, 20, 256], ids=["avx64", "avx128", "avx24", "plain20", "plain256"]
)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (9, 3), (8, 1)], ids=["mha", "gqa3", "mqa"])
def test_matches_the_oracle(head_dim: int, num_heads: int, num_kv_heads: int) -> None:
    # a one-token context, a partial block, exactly whole blocks, several blocks
    step = _step([0, 5, 15, 31, 64, 130], (num_heads, num_kv_heads), head_dim, 16)
    scale = head_dim**-0.5
    torch.testing.assert_close(_native(step, scale), _oracle(step, scale), atol=2e-6, rtol=2e-5)


@settings(max_examples=40, deadline=None)
@given(
    num_cached=st.lists(st.integers(0, 300), min_size=1, max_size=8),
    heads=st.sampled_from([(4, 4), (6, 2), (9, 3), (4, 1)]),
    head_dim=st.sampled_from([8, 16, 64, 12]),
    block_size=st.sampled_from([1, 4, 16, 32]),
    seed=st.integers(0, 10_000),
)
def test_matches_the_oracle_on_random_steps(
    num_cached: list[int], heads: tuple[int, int], head_dim: int, block_size: int, seed: int
) -> None:
    step = _step(num_cached, heads, head_dim, block_size, seed)
    torch.testing.assert_close(_native(step, 0.3), _oracle(step, 0.3), atol=2e-6, rtol=2e-5)


def test_large_scores_do_not_overflow_the_softmax() -> None:
    step = _step([40, 100], (4, 2), 64, 16, seed=3)
    step.query.mul_(200.0)  # scores in the thousands: exp would overflow without the running max
    got = _native(step, 1.0)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, _oracle(step, 1.0), atol=1e-4, rtol=1e-4)


def test_the_engine_plan_takes_the_kernel_where_asked() -> None:
    step = _step([10, 50, 200], (9, 3), 64, 16)
    md = step.metadata
    torch_plan = plan_decode(md.block_tables, md.seq_lens_cpu, 16)
    native_plan = plan_decode(md.block_tables, md.seq_lens_cpu, 16, native=True)
    assert torch_plan.native is None and native_plan.native is not None
    expected = _oracle(step, 0.125)
    torch.testing.assert_close(decode_attention(step.query, step.kv_cache, native_plan, 0.125), expected)
    torch.testing.assert_close(decode_attention(step.query, step.kv_cache, torch_plan, 0.125), expected)
    # a cache the kernel does not take (bfloat16): the plan's torch groups serve it
    bf16 = step.kv_cache.to(torch.bfloat16)
    got = decode_attention(step.query.to(torch.bfloat16), bf16, native_plan, 0.125)
    assert got.dtype == torch.bfloat16


def test_arguments_the_kernel_would_misread_are_refused() -> None:
    step = _step([3, 7], (4, 2), 16, 4)
    md = step.metadata
    with pytest.raises(ValueError, match="context lengths"):
        cpu_decode_attention.plan(md.block_tables, (4, 10_000), 4)
    with pytest.raises(ValueError, match="context lengths"):
        cpu_decode_attention.plan(md.block_tables, (0, 8), 4)
    with pytest.raises(ValueError, match="2 block tables for 3"):
        cpu_decode_attention.plan(md.block_tables, (1, 2, 3), 4)
    with pytest.raises(ValueError, match=">= 0"):
        cpu_decode_attention.plan(-torch.ones_like(md.block_tables), (4, 8), 4)
    plan = cpu_decode_attention.plan(md.block_tables, md.seq_lens_cpu, 4)
    with pytest.raises(ValueError, match="2 sequences"):
        cpu_decode_attention.decode_attention(step.query[:1], step.kv_cache, plan, 1.0)
    with pytest.raises(ValueError, match="blocks"):  # the plan reads blocks this cache does not hold
        cpu_decode_attention.decode_attention(step.query, step.kv_cache[:, :1].contiguous(), plan, 1.0)
    with pytest.raises(ValueError, match="outside the kernel"):
        cpu_decode_attention.decode_attention(step.query[:, :3], step.kv_cache, plan, 1.0)
    with pytest.raises(ValueError, match="float32"):
        cpu_decode_attention.decode_attention(step.query.double(), step.kv_cache, plan, 1.0)
