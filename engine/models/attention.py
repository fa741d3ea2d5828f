"""Attention metadata for one mixed step, and the backend interface kernels plug into.

KV cache layout, per layer: one tensor `[2, num_blocks, block_size, num_kv_heads, head_dim]`
(index 0 = K, 1 = V). A token at position p of a sequence lives in slot
`block_table[p // block_size] * block_size + p % block_size`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch

from weir.kernels import reference
from weir.kernels.decode_attention import StepPlan, decode_attention, mixed_attention, plan_step


@dataclass(frozen=True)
class AttentionMetadata:
    """Where this step's tokens go in the paged cache and which keys each query sees.

    Sequences are laid out back to back in the flattened token dimension. Sequence i owns
    tokens `query_start_loc[i]:query_start_loc[i+1]`; they sit at the last positions of its
    context of `seq_lens[i]` tokens, so causal masking is offset by `seq_lens[i] - query_len`.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32, context length including this step's tokens
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32, padded with 0
    query_start_loc_cpu: tuple[int, ...]
    seq_lens_cpu: tuple[int, ...]
    max_query_len: int
    max_seq_len: int
    block_size: int

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


class AttentionBackend(abc.ABC):
    """Writes this step's K/V into the cache, then attends over the paged context.

    `uses_triton` tells the model whether the fused Triton path (and CUDA graphs) may be used.
    """

    uses_triton: bool

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Store this step's keys and values, then attend over each sequence's paged context."""
        self.write_kv(key, value, kv_cache, metadata)
        return self.attend(query, kv_cache, metadata, scale)

    @abc.abstractmethod
    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        """Store this step's keys and values in their slots (`metadata.slot_mapping`)."""

    @abc.abstractmethod
    def attend(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """`forward` without the store: this step's K/V are already in the cache."""


class TorchAttentionBackend(AttentionBackend):
    """The plain-torch path used on CPU, and the oracle the Triton kernels are tested against.

    `fused_decode`: every step's decode rows go through `weir.kernels.decode_attention` (grouped by
    context length so one long sequence does not pad the others), whose plan is built on the first
    layer of the step and reused by the others; prefill chunks take the oracle's per-sequence path.
    Off: the whole step goes through `weir.kernels.reference.paged_attention`.

    `native_decode` (with `fused_decode`): on a float32 CPU cache the decode rows go through the C
    kernel of `weir.kernels.cpu_decode_attention` instead (the cache read in place, no gather), where
    it builds on this machine; off: the torch groups (the A/B in bench/experiments/decode_roofline.py).
    """

    uses_triton = False

    def __init__(self, fused_decode: bool = True, native_decode: bool = True) -> None:
        self.fused_decode = fused_decode
        self.native_decode = native_decode
        self._plan_metadata: AttentionMetadata | None = None  # the step `_plan` belongs to
        self._plan: StepPlan | None = None

    def _step_plan(self, metadata: AttentionMetadata) -> StepPlan:
        if self._plan is None or self._plan_metadata is not metadata:
            self._plan = plan_step(
                metadata.block_tables,
                metadata.query_start_loc_cpu,
                metadata.seq_lens_cpu,
                metadata.block_size,
                native=self.native_decode,
            )
            self._plan_metadata = metadata
        return self._plan

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> None:
        reference.write_kv(key, value, kv_cache, metadata.slot_mapping)

    def attend(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        """`forward` without the store (the CPU path's RoPE kernel stored K/V: engine/models/native_ops.py)."""
        if not self.fused_decode:
            return reference.paged_attention(
                query,
                kv_cache,
                metadata.block_tables,
                metadata.query_start_loc_cpu,
                metadata.seq_lens_cpu,
                scale,
            )
        plan = self._step_plan(metadata)
        if plan.decode is not None and plan.decode.num_seqs == query.shape[0]:  # decode-only
            return decode_attention(query, kv_cache, plan.decode, scale)
        return mixed_attention(
            query,
            kv_cache,
            metadata.block_tables,
            metadata.query_start_loc_cpu,
            metadata.seq_lens_cpu,
            plan,
            scale,
        )
