"""The memory-bandwidth roofline of a decode step: bytes that must cross HBM / the bandwidth.

A decode step of B sequences multiplies B rows by every weight matrix, which at small B is
far below the GPU's compute peak: the step is bound by reading the weights and the KV cache
once. The fastest possible step therefore takes `bytes / bandwidth`, and
`B / that time` is the best decode throughput the hardware allows for that batch.

Counted: every linear weight (and bias) and norm weight once; the LM head's matrix once (the
embedding table when tied; untied, the input table is only gathered, B rows); the K/V of
every context token of every sequence, in every layer; the new tokens' K/V written once.
Not counted: activations, logits, sampling (small next to the weights at decode batch sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from weir.engine.config import ModelConfig

H200_HBM_BYTES_PER_S = 4.8e12  # NVIDIA's H200 SXM datasheet: 4.8 TB/s


@dataclass(frozen=True)
class DecodeStepBytes:
    """Bytes one decode step must move, split by kind."""

    weights: int
    kv_read: int
    kv_write: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_read + self.kv_write


def weight_bytes_read(model: ModelConfig, dtype_bytes: int, batch_size: int) -> int:
    """Weights a forward of `batch_size` tokens reads (see the module docstring)."""
    params = model.num_params()
    if not model.tie_word_embeddings:
        params -= model.vocab_size * model.hidden_size  # the input table: only B rows gathered
        params += batch_size * model.hidden_size
    return params * dtype_bytes


def decode_step_bytes(
    model: ModelConfig,
    weight_dtype_bytes: int,
    kv_dtype_bytes: int,
    context_lens: Sequence[int],  # each sequence's context length, including its new token
) -> DecodeStepBytes:
    """Bytes one decode step of `len(context_lens)` sequences moves through HBM."""
    if not context_lens:
        raise ValueError("context_lens must name at least one sequence")
    if any(n < 1 for n in context_lens):
        raise ValueError(f"context lengths must be >= 1, got {list(context_lens)}")
    per_token = model.kv_bytes_per_token(kv_dtype_bytes)
    batch = len(context_lens)
    return DecodeStepBytes(
        weights=weight_bytes_read(model, weight_dtype_bytes, batch),
        kv_read=sum(context_lens) * per_token,
        kv_write=batch * per_token,
    )


def roofline_tokens_per_s(step: DecodeStepBytes, batch_size: int, bytes_per_s: float) -> float:
    """Upper bound on decode tokens/s: batch_size tokens per `step.total / bytes_per_s` seconds."""
    if bytes_per_s <= 0:
        raise ValueError(f"bytes_per_s must be > 0, got {bytes_per_s}")
    return batch_size * bytes_per_s / step.total
