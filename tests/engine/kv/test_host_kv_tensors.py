"""Host KV tensors and the copier: the layout of the device caches, copies both ways, the bandwidth."""

from __future__ import annotations

import pytest
import torch

from weir.engine.kv.host_kv_tensors import HostKVCopier, allocate_host_kv_caches, measure_copy_bandwidth

SHAPE = (2, 6, 4, 2, 8)  # [K/V, blocks, block_size, kv heads, head dim]


def _copier(num_host: int = 5) -> HostKVCopier:
    gen = torch.Generator().manual_seed(0)
    device = [torch.randn(SHAPE, generator=gen) for _ in range(3)]
    host = [torch.zeros((2, num_host, *SHAPE[2:])) for _ in range(3)]
    return HostKVCopier(device, host, torch.device("cpu"))


def test_blocks_go_to_the_host_and_come_back_to_other_blocks() -> None:
    copier = _copier()
    before = [c.clone() for c in copier.device_caches]
    copier.swap_out(((1, 3), (4, 1)))
    copier.synchronize()
    for dev, host in zip(before, copier.host_caches, strict=True):
        assert torch.equal(host[:, 3], dev[:, 1]) and torch.equal(host[:, 1], dev[:, 4])
    copier.swap_in(((3, 5), (1, 2)))
    copier.synchronize()
    for old, dev in zip(before, copier.device_caches, strict=True):
        assert torch.equal(dev[:, 5], old[:, 1]) and torch.equal(dev[:, 2], old[:, 4])
        assert torch.equal(dev[:, 0], old[:, 0])  # untouched blocks stay


def test_host_caches_have_the_device_layout() -> None:
    from weir.engine.config import ModelConfig, RopeConfig

    config = ModelConfig("llama", 10, 16, 32, 2, 4, 2, 4, 1e-6, RopeConfig(), 64)
    caches = allocate_host_kv_caches(config, 3, 8, torch.float16, torch.device("cpu"))
    assert len(caches) == 2 and caches[0].shape == (2, 3, 8, 2, 4) and caches[0].dtype == torch.float16


def test_a_host_cache_of_another_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="does not match"):
        HostKVCopier([torch.zeros(SHAPE)], [torch.zeros((2, 3, 4, 2, 4))], torch.device("cpu"))
    with pytest.raises(ValueError, match="one tensor per layer"):
        HostKVCopier([torch.zeros(SHAPE)], [], torch.device("cpu"))


def test_the_bandwidth_is_measured() -> None:
    assert measure_copy_bandwidth(_copier(), num_blocks=2) > 0
    with pytest.raises(ValueError, match="at least two blocks"):
        measure_copy_bandwidth(_copier(num_host=1))
