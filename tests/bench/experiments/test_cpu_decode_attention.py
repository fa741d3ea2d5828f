"""weir_bench.experiments.cpu_decode_attention: the step it times is the real kernel over scattered
blocks, and one run reports it against the read of the same bytes."""

from __future__ import annotations

import argparse

import pytest
import torch

from weir.kernels import cpu_decode_attention, reference
from weir_bench.experiments import cpu_decode_attention as experiment

pytestmark = pytest.mark.skipif(not cpu_decode_attention.available(), reason="no C compiler here")


def test_the_kernel_pass_equals_the_reference_attention() -> None:
    table, num_bytes = experiment.workload(3, 37, 2, (4, 2), 16, 8)
    per_seq = (37 + 7) // 8
    assert num_bytes == 2 * (2 * 3 * per_seq * 8 * 2 * 16 * 4)  # layers x K/V of the used blocks
    outs = table["kernel"]()
    assert isinstance(outs, list) and len(outs) == 2 and outs[0].shape == (3, 4, 16)
    # the same workload again (seeded): layer 0 against the reference
    gen = torch.Generator().manual_seed(0)
    num_blocks = 2 * 3 * per_seq + 8
    cache = torch.randn(2, num_blocks, 8, 2, 16, generator=gen)
    torch.randn(2, num_blocks, 8, 2, 16, generator=gen)  # layer 1
    tables = torch.randperm(num_blocks, generator=gen)[: 3 * per_seq].view(3, per_seq).to(torch.int32)
    query = torch.randn(3, 4, 16, generator=gen)
    want = reference.paged_attention(
        query, cache, tables, torch.tensor([0, 1, 2, 3]), torch.tensor([37] * 3), 16**-0.5
    )
    torch.testing.assert_close(outs[0], want, atol=2e-6, rtol=2e-5)


def test_one_run_reports_the_kernel_against_the_read() -> None:
    args = argparse.Namespace(
        batch=2, context_len=20, layers=2, heads=4, kv_heads=2, head_dim=16, block_size=8, reps=2
    )
    report = experiment.run(args)
    assert report["kv_bytes"] > 0 and report["kernel_wall_ms"] > 0 and report["sum_wall_ms"] > 0
    assert report["kernel_over_sum_wall"] > 0 and report["reps"] == 2
