"""Device blocks to store payloads and back: a saved block loads into another block bit for bit."""

from __future__ import annotations

import pytest
import torch

from weir.engine.kv.store.codec import StoreWrite
from weir.engine.kv.store.tensors import StoreBlockIO


def _caches(dtype: torch.dtype, layers: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 6, 4, 2, 8, generator=g).to(dtype) for _ in range(layers)]  # [2, blocks, bs, h, d]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_saved_blocks_load_back_into_other_blocks_exactly(dtype: torch.dtype) -> None:
    caches = _caches(dtype)
    saved: list[tuple[StoreWrite, bytes]] = []
    io = StoreBlockIO(caches, torch.device("cpu"), lambda tag, payload: saved.append((tag, payload)) or True)
    tags = [StoreWrite(f"k{i}".encode(), b"idx", "a") for i in range(2)]
    io.save(((1, tags[0]), (3, tags[1])))
    assert [t for t, _ in saved] == tags
    assert all(len(p) == io.payload_bytes == 3 * 2 * 4 * 2 * 8 * caches[0].element_size() for _, p in saved)
    io.load(((5, saved[0][1]), (2, saved[1][1])))
    for c in caches:
        assert torch.equal(c[:, 5], c[:, 1]) and torch.equal(c[:, 2], c[:, 3])


def test_a_payload_of_another_size_is_refused() -> None:
    io = StoreBlockIO(_caches(torch.float32), torch.device("cpu"), lambda tag, payload: True)
    with pytest.raises(ValueError, match="payloads"):
        io.load(((1, b"short"),))
