"""weir.kernels.paged_attention against the torch oracle weir.kernels.reference.paged_attention."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kernels.interpret import interpreted
from tests.kernels.steps import Step, random_step
from weir.kernels import reference
from weir.kernels.paged_attention import paged_attention

# bfloat16 tl.dot is not emulated by the CPU interpreter; it runs in weir_bench.gpu_check on a GPU
DTYPES = [torch.float32, torch.float16] + ([] if interpreted() else [torch.bfloat16])
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _check(step: Step) -> None:
    reference.write_kv(step.key, step.value, step.kv_cache, step.metadata.slot_mapping)
    md = step.metadata
    scale = step.query.shape[-1] ** -0.5
    expected = reference.paged_attention(
        step.query, step.kv_cache, md.block_tables, md.query_start_loc_cpu, md.seq_lens_cpu, scale
    )
    got = paged_attention(
        step.query, step.kv_cache, md.block_tables, md.query_start_loc, md.seq_lens, md.max_query_len, scale
    )
    tol = TOL[step.query.dtype]
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads"),
    [(4, 4), (4, 2), (6, 2), (4, 1)],
    ids=["mha", "gqa", "gqa3", "mqa"],
)
def test_mixed_step_matches_reference(
    device: torch.device, dtype: torch.dtype, block_size: int, num_heads: int, num_kv_heads: int
) -> None:
    # a chunk with cached context, a decode row, a whole new prompt, a decode row on a page
    # boundary, and a chunk longer than one query tile (64 rows / group)
    q_lens = [7, 1, 5, 1, 40]
    num_cached = [3, 20, 0, 2 * block_size, 9]
    step = random_step(
        q_lens,
        num_cached,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=32,
        block_size=block_size,
        dtype=dtype,
        device=device,
    )
    _check(step)


@pytest.mark.parametrize("head_dim", [24, 64])
def test_decode_only_step_and_padded_head_dim(device: torch.device, head_dim: int) -> None:
    step = random_step(
        [1] * 5,
        [0, 1, 15, 16, 70],
        num_heads=9,
        num_kv_heads=3,
        head_dim=head_dim,
        block_size=16,
        dtype=torch.float32,
        device=device,
        seed=1,
    )
    _check(step)


@settings(max_examples=12, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(1, 20), st.integers(0, 40)), min_size=1, max_size=4),
    group=st.sampled_from([1, 2, 3]),
    block_size=st.sampled_from([1, 8, 16]),
    seed=st.integers(0, 2**16),
)
def test_random_steps_match_reference(
    lens: list[tuple[int, int]], group: int, block_size: int, seed: int
) -> None:
    from tests.kernels.conftest import DEVICE

    step = random_step(
        [q for q, _ in lens],
        [c for _, c in lens],
        num_heads=2 * group,
        num_kv_heads=2,
        head_dim=16,
        block_size=block_size,
        dtype=torch.float32,
        device=DEVICE,
        seed=seed,
    )
    _check(step)


def test_empty_sequence_rows_and_out_argument(device: torch.device) -> None:
    """A sequence with no new tokens is skipped; the result lands in the given `out`."""
    step = random_step(
        [3, 1],
        [2, 5],
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        block_size=16,
        dtype=torch.float32,
        device=device,
    )
    reference.write_kv(step.key, step.value, step.kv_cache, step.metadata.slot_mapping)
    md = step.metadata
    # a third sequence that is in the batch with no new tokens
    starts = torch.tensor([0, 3, 3, 4], dtype=torch.int32, device=device)
    seq_lens = torch.tensor([5, 4, 6], dtype=torch.int32, device=device)
    tables = torch.cat([md.block_tables[:1], md.block_tables[:1], md.block_tables[1:]])
    out = torch.full_like(step.query, float("nan"))
    got = paged_attention(step.query, step.kv_cache, tables, starts, seq_lens, 3, 0.25, out=out)
    assert got is out
    expected = reference.paged_attention(step.query, step.kv_cache, tables, (0, 3, 3, 4), (5, 4, 6), 0.25)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)


def _args(device: torch.device) -> dict[str, object]:
    step = random_step(
        [2], [3], num_heads=4, num_kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32, device=device
    )
    md = step.metadata
    return dict(
        query=step.query,
        kv_cache=step.kv_cache,
        block_tables=md.block_tables,
        query_start_loc=md.query_start_loc,
        seq_lens=md.seq_lens,
        max_query_len=2,
        scale=0.25,
    )


@pytest.mark.parametrize(
    ("name", "bad", "message"),
    [
        ("block_tables", lambda a: a["block_tables"].long(), "block_tables must have dtype"),
        ("query", lambda a: a["query"][..., :8], "query has size 8 in dimension 2"),
        ("query", lambda a: a["query"][:, :3], "not a multiple"),
        ("query", lambda a: a["query"].half(), "query dtype"),
        ("query", lambda a: a["query"].transpose(1, 2), "query must have stride 1"),
        ("query_start_loc", lambda a: a["query_start_loc"][:1], "query_start_loc has size 1"),
        ("seq_lens", lambda a: a["seq_lens"].float(), "seq_lens must have dtype"),
        ("kv_cache", lambda a: a["kv_cache"][0], "kv_cache must have 5 dimensions"),
        ("max_query_len", lambda a: 0, "max_query_len must be >= 1"),
        ("scale", lambda a: float("nan"), "scale must be"),
    ],
)
def test_rejects_bad_arguments_naming_them(device: torch.device, name: str, bad, message: str) -> None:  # type: ignore[no-untyped-def]
    args = _args(device)
    args[name] = bad(args)
    with pytest.raises(ValueError, match=message):
        paged_attention(**args)  # type: ignore[arg-type]
