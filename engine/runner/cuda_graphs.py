"""CUDA graphs for decode steps: capture once per batch-size bucket, replay with new inputs.

A decode step of a small model is dominated by kernel-launch overhead (SmolLM2 launches ~10
kernels per layer x 30 layers for a few microseconds of work each). A CUDA graph records the
whole forward once and replays it with one launch. Replay reuses the recorded pointers and
launch grids, so every input lives in a static buffer that each step overwrites, and the
batch is padded up to the nearest captured size:

- padding rows have slot -1 (the cache write skips them) and context length 0 (attention
  reads nothing for them); their outputs are discarded;
- block tables are as wide as `max_model_len` needs, so any decode step fits;
- only decode-only steps (one new token per sequence) replay; prefill and mixed steps, and
  batches larger than the largest bucket, run eagerly.

This requires a forward that reads no host-side metadata: the model's fused Triton path with
`weir.engine.models.attention_triton.TritonAttentionBackend`. `build_decode_graphs` decides whether to use graphs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from weir.engine.config import EngineConfig
from weir.engine.models.attention import AttentionMetadata

logger = logging.getLogger("weir.engine")

# the model's forward: (input_ids, positions, kv_caches, metadata) -> hidden [num_tokens, hidden]
ModelForward = Callable[[torch.Tensor, torch.Tensor, list[torch.Tensor], AttentionMetadata], torch.Tensor]

MAX_BUCKET = 256  # larger decode batches are launch-bound no more: run them eagerly


def decode_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """Batch sizes to capture: 1, 2, 4, 8, then every multiple of 8 up to max_num_seqs (<= 256).

    Multiples of 8 bound the padding waste at 7 rows while keeping the number of graphs (and
    the capture time at start-up) small.
    """
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    top = min(max_num_seqs, MAX_BUCKET)
    sizes = [s for s in (1, 2, 4) if s < top] + list(range(8, top, 8)) + [top]
    return tuple(sorted(set(sizes)))


class Replay(Protocol):
    """Re-runs a recorded forward; returns its (static) output tensor."""

    def __call__(self) -> torch.Tensor: ...


class GraphCapture(Protocol):
    """How a forward over static buffers is recorded for replay."""

    def capture(self, fn: Callable[[], torch.Tensor]) -> Replay: ...


class CudaGraphCapture:
    """Records with `torch.cuda.graph`; all graphs share one memory pool (they never run at once)."""

    def __init__(self, num_warmup: int = 2) -> None:
        self.num_warmup = num_warmup
        self._pool: Any = None  # torch's opaque pool handle

    def capture(self, fn: Callable[[], torch.Tensor]) -> Replay:
        # Warm up on a side stream first: Triton compiles and cuBLAS picks its kernels and
        # workspaces outside the capture, where allocations and host syncs are allowed.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.num_warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = fn()
        self._pool = graph.pool()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay


class EagerCapture:
    """Runs the forward once at capture, like a real capture, and replays by running it again
    over the same static buffers (tests, no CUDA)."""

    def capture(self, fn: Callable[[], torch.Tensor]) -> Replay:
        fn()
        return fn


class DecodeGraphs:
    """Static input buffers plus one recorded forward per bucket; `run` pads, copies, replays."""

    def __init__(
        self,
        forward: ModelForward,
        kv_caches: list[torch.Tensor],
        block_size: int,
        max_model_len: int,
        buckets: Sequence[int],
        device: torch.device,
        capture: GraphCapture,
    ) -> None:
        if not buckets or any(b < 1 for b in buckets):
            raise ValueError(f"buckets must be non-empty positive sizes, got {tuple(buckets)}")
        self.buckets = tuple(sorted(set(buckets)))
        self.block_size = block_size
        self.max_blocks = -(-max_model_len // block_size)
        largest = self.buckets[-1]
        self._input_ids = torch.zeros(largest, dtype=torch.int64, device=device)
        self._positions = torch.zeros(largest, dtype=torch.int64, device=device)
        self._slot_mapping = torch.full((largest,), -1, dtype=torch.int64, device=device)
        self._query_start_loc = torch.arange(largest + 1, dtype=torch.int32, device=device)
        self._seq_lens = torch.zeros(largest, dtype=torch.int32, device=device)
        self._block_tables = torch.zeros(largest, self.max_blocks, dtype=torch.int32, device=device)
        self._replays: dict[int, Replay] = {}
        self.num_replays = 0  # decode steps served by a graph (observability, benchmarks)
        # Capture runs the forward over these initial values: slot -1 and length 0 on every
        # row, so capturing writes nothing into the KV cache.
        with torch.inference_mode():
            for size in reversed(self.buckets):  # largest first: later graphs reuse its pool memory
                metadata = self._metadata(size, max_model_len)

                def fn(size: int = size, metadata: AttentionMetadata = metadata) -> torch.Tensor:
                    return forward(self._input_ids[:size], self._positions[:size], kv_caches, metadata)

                self._replays[size] = capture.capture(fn)

    def _metadata(self, size: int, max_model_len: int) -> AttentionMetadata:
        """Metadata over the static buffers. Its host tuples are placeholders: the Triton path
        reads only the device tensors, whose contents change at every replay."""
        return AttentionMetadata(
            slot_mapping=self._slot_mapping[:size],
            query_start_loc=self._query_start_loc[: size + 1],
            seq_lens=self._seq_lens[:size],
            block_tables=self._block_tables[:size],
            query_start_loc_cpu=tuple(range(size + 1)),
            seq_lens_cpu=(1,) * size,
            max_query_len=1,
            max_seq_len=max_model_len,
            block_size=self.block_size,
        )

    def bucket_for(self, metadata: AttentionMetadata, num_tokens: int) -> int | None:
        """The captured size this step replays in, or None if it must run eagerly."""
        num_seqs = metadata.num_seqs
        if not metadata.is_decode_only or num_tokens != num_seqs or num_seqs > self.buckets[-1]:
            return None
        if metadata.block_size != self.block_size or metadata.block_tables.shape[1] > self.max_blocks:
            return None
        return next(b for b in self.buckets if b >= num_seqs)

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata, bucket: int
    ) -> torch.Tensor:  # [num_tokens, hidden], a view of the graph's output: use before the next run
        """Copy the step into the static buffers (padding the rest of the bucket) and replay."""
        n = input_ids.shape[0]
        width = metadata.block_tables.shape[1]
        self._input_ids[:n].copy_(input_ids)
        self._positions[:n].copy_(positions)
        self._slot_mapping[:n].copy_(metadata.slot_mapping)
        self._seq_lens[:n].copy_(metadata.seq_lens)
        self._block_tables[:n, :width].copy_(metadata.block_tables)
        if n < bucket:  # padding rows: write no K/V, read no context
            self._input_ids[n:bucket].zero_()
            self._positions[n:bucket].zero_()
            self._slot_mapping[n:bucket].fill_(-1)
            self._seq_lens[n:bucket].zero_()
        self.num_replays += 1
        return self._replays[bucket]()[:n]


def build_decode_graphs(
    config: EngineConfig,
    model: torch.nn.Module,
    kv_caches: list[torch.Tensor],
    max_model_len: int,
    device: torch.device,
) -> DecodeGraphs | None:
    """Capture decode graphs when the config allows it (None: on CUDA) and the model can be captured.

    The model must run its fused Triton path (`model.fused_kernels`); the torch attention path
    reads host-side lengths and cannot be replayed with new ones.
    """
    if config.use_cuda_graphs is False:
        return None
    fused = bool(getattr(model, "fused_kernels", False))
    if device.type != "cuda" or not fused:
        if config.use_cuda_graphs:
            logger.warning(
                "use_cuda_graphs=True ignored: CUDA graphs need a CUDA device and the Triton path "
                "(device=%s, fused kernels=%s)",
                device,
                fused,
            )
        return None
    buckets = decode_buckets(config.scheduler.max_num_seqs)
    graphs = DecodeGraphs(
        model, kv_caches, config.cache.block_size, max_model_len, buckets, device, CudaGraphCapture()
    )
    logger.info("captured decode CUDA graphs for batch sizes %s", buckets)
    return graphs
