"""weir_bench.roofline: bytes of a decode step and the bandwidth-bound tokens/s."""

from __future__ import annotations

import dataclasses

import pytest

from weir.engine.config import ModelConfig, RopeConfig
from weir_bench.roofline import (
    H200_HBM_BYTES_PER_S,
    decode_step_bytes,
    roofline_tokens_per_s,
    weight_bytes_read,
)

SMOLLM2 = ModelConfig(
    model_type="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope=RopeConfig(theta=100000.0),
    max_model_len=8192,
    tie_word_embeddings=True,
)


def test_smollm2_step_bytes() -> None:
    step = decode_step_bytes(SMOLLM2, 4, 4, [1024] * 8)
    assert step.weights == SMOLLM2.num_params() * 4  # tied: the table is read whole by the LM head
    assert 134e6 < SMOLLM2.num_params() < 136e6
    per_token = 2 * 30 * 3 * 64 * 4
    assert step.kv_read == 8 * 1024 * per_token
    assert step.kv_write == 8 * per_token
    assert step.total == step.weights + step.kv_read + step.kv_write


def test_untied_input_table_counts_only_the_gathered_rows() -> None:
    untied = dataclasses.replace(SMOLLM2, tie_word_embeddings=False)
    tied_bytes = weight_bytes_read(SMOLLM2, 2, batch_size=4)
    # untied: + the LM head matrix, + 4 gathered rows; the input table is not read whole
    assert weight_bytes_read(untied, 2, batch_size=4) == tied_bytes + 4 * 576 * 2


def test_roofline_tokens_per_s() -> None:
    step = decode_step_bytes(SMOLLM2, 2, 2, [100])
    assert roofline_tokens_per_s(step, 1, H200_HBM_BYTES_PER_S) == pytest.approx(4.8e12 / step.total)
    bigger = decode_step_bytes(SMOLLM2, 2, 2, [100] * 64)
    # batching amortises the weight reads: 64 sequences cost far less than 64 single steps
    assert roofline_tokens_per_s(bigger, 64, 4.8e12) > 30 * roofline_tokens_per_s(step, 1, 4.8e12)


@pytest.mark.parametrize(
    ("lens", "message"), [([], "at least one sequence"), ([3, 0], "context lengths must be >= 1")]
)
def test_rejects_bad_context_lengths(lens: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_step_bytes(SMOLLM2, 2, 2, lens)


def test_rejects_a_non_positive_bandwidth() -> None:
    with pytest.raises(ValueError, match="bytes_per_s"):
        roofline_tokens_per_s(decode_step_bytes(SMOLLM2, 2, 2, [1]), 1, 0.0)
