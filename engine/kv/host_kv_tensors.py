"""The host KV pool's tensors and the copies between them and the device's (`KVTransfers`).

The host caches have the device caches' layout, one tensor per layer:
`[2 (K, V), num_blocks, block_size, num_kv_heads, head_dim]`, in pinned memory on CUDA (so
copies are asynchronous DMA) and ordinary memory on CPU.

`HostKVCopier` performs a step's plan in the order `weir.engine.kv.kv_swap` states: swap-out before the
copy-on-write copies, swap-in after them. On CPU these are plain indexed copies. On CUDA they go
on a side stream:

- swap-out gathers the blocks into a device staging buffer (after the compute stream's last
  writes); the compute stream waits only for that gather, so the device -> host transfer of the
  staging buffer overlaps with this step's forward. The host cache is written from the pinned
  staging buffer at the start of the next step (`finish_pending`), before anything reads it.
- swap-in gathers host blocks into a pinned buffer, copies it to the device and scatters it into
  the caches on the side stream after the copy-on-write copies; the compute stream waits for it
  before the forward, while the CPU prepares the step's tensors.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field

import torch

from weir.engine.config import EngineConfig, ModelConfig
from weir.engine.kv.kv_tensors import kv_cache_shape

logger = logging.getLogger("weir.engine")


def allocate_host_kv_caches(
    config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    """One zeroed host cache tensor per layer (see `kv_cache_shape`); pinned when `device` is CUDA."""
    shape = kv_cache_shape(config, num_blocks, block_size)
    pin = device.type == "cuda"
    return [torch.zeros(shape, dtype=dtype, pin_memory=pin) for _ in range(config.num_layers)]


@dataclass
class _PendingOut:
    """A device -> host transfer in flight on CUDA: staging buffers to scatter into the host caches."""

    host_ids: torch.Tensor  # [num_blocks] int64, CPU
    staged: list[torch.Tensor]  # per layer: [2, num_blocks, block_size, kv_heads, head_dim], pinned
    done: torch.cuda.Event


@dataclass
class HostKVCopier:
    """Copies blocks between the device KV caches and the host KV caches."""

    device_caches: list[torch.Tensor]
    host_caches: list[torch.Tensor]
    device: torch.device
    copy_bytes_per_s: float = 0.0  # measured by `measure_copy_bandwidth`; 0: not measured
    _stream: torch.cuda.Stream | None = field(default=None, init=False, repr=False)
    _pending: list[_PendingOut] = field(default_factory=list, init=False, repr=False)
    _keep: list[torch.Tensor] = field(default_factory=list, init=False, repr=False)
    _pending_ids: set[int] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.device_caches) != len(self.host_caches):
            raise ValueError("host and device caches must have one tensor per layer each")
        for d, h in zip(self.device_caches, self.host_caches, strict=True):
            if d.shape[0] != h.shape[0] or d.shape[2:] != h.shape[2:] or d.dtype != h.dtype:
                raise ValueError(f"host cache {tuple(h.shape)} does not match device cache {tuple(d.shape)}")
        if self.device.type == "cuda":
            self._stream = torch.cuda.Stream(device=self.device)

    @property
    def num_host_blocks(self) -> int:
        return int(self.host_caches[0].shape[1]) if self.host_caches else 0

    def finish_pending(self) -> None:
        """Land the last step's device -> host transfers in the host caches (CUDA only)."""
        for p in self._pending:
            p.done.synchronize()
            for host, staged in zip(self.host_caches, p.staged, strict=True):
                host.index_copy_(1, p.host_ids, staged)
        self._pending.clear()
        self._pending_ids.clear()
        self._keep.clear()

    def swap_out(self, pairs: tuple[tuple[int, int], ...]) -> None:
        """Copy device blocks to host blocks: `pairs` of (device block, host block)."""
        self.finish_pending()
        if not pairs:
            return
        dev_ids, host_ids = _block_ids(pairs)
        if self._stream is None:
            _copy_blocks(self.device_caches, dev_ids, self.host_caches, host_ids)
            return
        compute = torch.cuda.current_stream(self.device)
        dev_ids = dev_ids.to(self.device)
        self._stream.wait_stream(compute)  # the blocks hold what the last step wrote
        gathered = torch.cuda.Event()
        done = torch.cuda.Event()
        staged: list[torch.Tensor] = []
        with torch.cuda.stream(self._stream):
            on_device = [dev.index_select(1, dev_ids) for dev in self.device_caches]  # [2, n, bs, h, d] each
            gathered.record(self._stream)
            for block in on_device:
                pinned = torch.empty(block.shape, dtype=block.dtype, pin_memory=True)
                pinned.copy_(block, non_blocking=True)
                staged.append(pinned)
            done.record(self._stream)
        compute.wait_event(gathered)  # freed blocks may be written from now on; the transfer goes on
        self._pending.append(_PendingOut(host_ids, staged, done))
        self._pending_ids.update(h for _, h in pairs)

    def swap_in(self, pairs: tuple[tuple[int, int], ...]) -> None:
        """Copy host blocks to device blocks: `pairs` of (host block, device block)."""
        if not pairs:
            return
        if any(h in self._pending_ids for h, _ in pairs):
            self.finish_pending()  # a block swapped out earlier in this step is read back now
        host_ids, dev_ids = _block_ids(pairs)
        if self._stream is None:
            _copy_blocks(self.host_caches, host_ids, self.device_caches, dev_ids)
            return
        compute = torch.cuda.current_stream(self.device)
        dev_ids = dev_ids.to(self.device)
        self._stream.wait_stream(compute)  # after this step's copy-on-write copies
        with torch.cuda.stream(self._stream):
            for dev, host in zip(self.device_caches, self.host_caches, strict=True):
                shape = (host.shape[0], len(pairs), *host.shape[2:])
                pinned = torch.empty(shape, dtype=host.dtype, pin_memory=True)
                torch.index_select(host, 1, host_ids, out=pinned)  # [2, n, bs, h, d]
                on_device = pinned.to(self.device, non_blocking=True)
                dev.index_copy_(1, dev_ids, on_device)
                self._keep.append(pinned)  # alive until the copy is done (next step)
        compute.wait_stream(self._stream)  # the forward reads these blocks

    def synchronize(self) -> None:
        """Wait for every copy issued so far (start-up measurement, tests)."""
        if self._stream is not None:
            self._stream.synchronize()
        self.finish_pending()


def _block_ids(pairs: tuple[tuple[int, int], ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The (source, destination) block ids of `pairs`, as two int64 CPU tensors [n]."""
    ids = torch.tensor(pairs, dtype=torch.int64)  # [n, 2]
    return ids[:, 0].contiguous(), ids[:, 1].contiguous()


def _copy_blocks(
    src: list[torch.Tensor], src_ids: torch.Tensor, dst: list[torch.Tensor], dst_ids: torch.Tensor
) -> None:
    """Synchronous copy of blocks `src_ids` of each layer's `src` cache into blocks `dst_ids` of `dst`."""
    for s, d in zip(src, dst, strict=True):
        d.index_copy_(1, dst_ids, s.index_select(1, src_ids))


def measure_copy_bandwidth(copier: HostKVCopier, num_blocks: int = 8, repeats: int = 3) -> float:
    """Bytes per second of copying blocks device -> host and back, measured now (median of
    `repeats`). Uses the first `num_blocks` blocks of both pools: call before any request runs."""
    n = min(num_blocks, int(copier.device_caches[0].shape[1]) - 1, copier.num_host_blocks - 1)
    if n < 1:
        raise ValueError("both pools need at least two blocks to measure the copy bandwidth")
    block_bytes = sum(c[:, 0].numel() * c.element_size() for c in copier.device_caches)
    pairs = tuple((i, i) for i in range(1, n + 1))
    rates = []
    for _ in range(repeats):
        copier.synchronize()
        t0 = time.perf_counter()
        copier.swap_out(pairs)
        copier.swap_in(pairs)
        copier.synchronize()
        if copier.device.type == "cuda":
            torch.cuda.synchronize(copier.device)
        elapsed = time.perf_counter() - t0
        rates.append(2 * n * block_bytes / max(elapsed, 1e-9))
    return statistics.median(rates)


def build_host_kv(
    config: EngineConfig,
    model_config: ModelConfig,
    kv_caches: list[torch.Tensor],
    kv_dtype: torch.dtype,
    device: torch.device,
) -> HostKVCopier | None:
    """The host KV tier's tensors (pinned on CUDA) with the copy bandwidth measured now; None
    when `config.cache.host_num_blocks` is 0."""
    num_host = config.cache.host_num_blocks
    if not num_host:
        return None
    host_caches = allocate_host_kv_caches(
        model_config, num_host + 1, config.cache.block_size, kv_dtype, device
    )
    copier = HostKVCopier(kv_caches, host_caches, device)
    copier.copy_bytes_per_s = measure_copy_bandwidth(copier)  # copies blocks still zero both ways
    logger.info(
        "host KV tier: %d blocks (%.1f MiB), copy bandwidth %.2f GB/s measured",
        num_host,
        num_host * sum(c[:, 0].numel() * c.element_size() for c in host_caches) / 2**20,
        copier.copy_bytes_per_s / 1e9,
    )
    return copier
