"""Block bytes for the shared KV store tier: device KV blocks to bytes and back (the torch side).

A block's payload is every layer's K and V of that block, layer after layer, each
`[2 (K, V), block_size, num_kv_heads, head_dim]` in the KV dtype, raw bytes in the machine's
order: `payload_bytes` = layers x 2 x block_size x kv heads x head dim x itemsize. The chained
hash already pins the model version and the KV dtype, so a payload is only ever read back into
caches of the same layout; its length is checked against it before (`weir.engine.kv.store.codec.unseal`).

`StoreBlockIO.save` runs first in a step's transfers (`weir.engine.kv.kv_swap`): it gathers the
blocks, copies them to the CPU once and hands each block's bytes to the write queue (`sink`),
which seals and writes them on its own thread. `load` runs last: one host -> device copy of the
step's fetched payloads, scattered into their fresh device blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from weir.engine.kv.store.codec import StoreWrite


@dataclass
class StoreBlockIO:
    """Reads device blocks out as payloads and writes payloads into device blocks."""

    caches: list[torch.Tensor]  # per layer: [2, num_blocks, block_size, kv_heads, head_dim]
    device: torch.device
    sink: Callable[[StoreWrite, bytes], bool]  # queue one block's write; False: dropped

    def __post_init__(self) -> None:
        first = self.caches[0]
        if any(c.shape != first.shape or c.dtype != first.dtype for c in self.caches):
            raise ValueError("the store tier needs every layer's KV cache in one shape and dtype")
        self.block_shape = (len(self.caches), first.shape[0], *first.shape[2:])  # [L, 2, bs, h, d]
        # `weir.engine.kv.kv_tensors.kv_block_bytes` of the model, which sizes the store's values
        self.payload_bytes = math.prod(self.block_shape) * first.element_size()

    def save(self, pairs: tuple[tuple[int, StoreWrite], ...]) -> None:
        """Hand the bytes of device blocks to the write queue: `pairs` of (block id, its write)."""
        if not pairs:
            return
        ids = torch.tensor([b for b, _ in pairs], dtype=torch.int64, device=self.device)
        gathered = torch.stack([c.index_select(1, ids) for c in self.caches])  # [L, 2, n, bs, h, d]
        blocks = gathered.permute(2, 0, 1, 3, 4, 5).contiguous().cpu()  # [n, L, 2, bs, h, d]
        raw = blocks.view(len(pairs), -1).view(torch.uint8).numpy()  # [n, payload_bytes]
        for (_, tag), row in zip(pairs, raw, strict=True):
            self.sink(tag, row.tobytes())

    def load(self, pairs: tuple[tuple[int, bytes], ...]) -> None:
        """Write fetched payloads into device blocks: `pairs` of (block id, payload)."""
        if not pairs:
            return
        n = len(pairs)
        buf = bytearray(b"".join(p for _, p in pairs))
        if len(buf) != n * self.payload_bytes:
            raise ValueError(f"store payloads of {len(buf)} bytes for {n} blocks of {self.payload_bytes}")
        dtype = self.caches[0].dtype
        flat = torch.frombuffer(buf, dtype=torch.uint8).view(dtype)
        blocks = flat.view(n, *self.block_shape).to(self.device)  # [n, L, 2, bs, h, d]
        by_layer = blocks.permute(1, 2, 0, 3, 4, 5)  # [L, 2, n, bs, h, d]
        ids = torch.tensor([b for b, _ in pairs], dtype=torch.int64, device=self.device)
        for layer, cache in enumerate(self.caches):
            cache.index_copy_(1, ids, by_layer[layer])
