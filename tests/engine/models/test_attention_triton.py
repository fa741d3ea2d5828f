"""TritonAttentionBackend against TorchAttentionBackend (cache contents and attention output)."""

from __future__ import annotations

from tests.kernels.interpret import kernel_device

DEVICE = kernel_device()  # before kernels.* is imported: TRITON_INTERPRET=1 without CUDA

import dataclasses  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.kernels.steps import random_step  # noqa: E402
from weir.engine.models.attention import TorchAttentionBackend  # noqa: E402
from weir.engine.models.attention_triton import TritonAttentionBackend  # noqa: E402


@pytest.fixture
def device() -> torch.device:
    return DEVICE


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
def test_matches_the_torch_backend(device: torch.device, block_size: int, cache_dtype: torch.dtype) -> None:
    step = random_step(
        [6, 1, 1, 19],
        [10, 33, 0, 4],
        num_heads=6,
        num_kv_heads=2,
        head_dim=32,
        block_size=block_size,
        dtype=torch.float32,
        device=device,
    )
    cache = step.kv_cache.to(cache_dtype)
    expected_cache = cache.clone()
    expected = TorchAttentionBackend().forward(
        step.query, step.key, step.value, expected_cache, step.metadata, 0.2
    )
    got = TritonAttentionBackend().forward(step.query, step.key, step.value, cache, step.metadata, 0.2)
    assert got.dtype == step.query.dtype  # a lower-precision cache does not leak into the model
    assert torch.equal(cache, expected_cache)
    tol = 2e-5 if cache_dtype == torch.float32 else 2e-3
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


def test_reads_no_host_metadata(device: torch.device) -> None:
    """The host tuples may be stale (a replayed CUDA graph): only device tensors are used."""
    step = random_step(
        [1, 1],
        [5, 40],
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        block_size=16,
        dtype=torch.float32,
        device=device,
    )
    expected = TorchAttentionBackend().forward(
        step.query, step.key, step.value, step.kv_cache.clone(), step.metadata, 0.25
    )
    stale = dataclasses.replace(
        step.metadata, seq_lens_cpu=(1, 1), query_start_loc_cpu=(0, 0, 0), max_seq_len=1
    )
    got = TritonAttentionBackend().forward(step.query, step.key, step.value, step.kv_cache, stale, 0.25)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5)


def test_rejects_a_metadata_block_size_that_is_not_the_cache_s(device: torch.device) -> None:
    step = random_step(
        [2], [0], num_heads=2, num_kv_heads=1, head_dim=16, block_size=16, dtype=torch.float32, device=device
    )
    bad = dataclasses.replace(step.metadata, block_size=32)
    with pytest.raises(ValueError, match="metadata.block_size=32"):
        TritonAttentionBackend().forward(step.query, step.key, step.value, step.kv_cache, bad, 0.25)
