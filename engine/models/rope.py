"""Rotary position embedding: inverse frequencies per RoPE scaling type, a cos/sin table, apply.

The inverse frequencies follow the Hugging Face formulas (`transformers.modeling_rope_utils`)
step for step, in float32, so that our model and HF's agree to the last bit on the table.

Dynamic NTK scaling: HF recomputes `inv_freq` from the current sequence length whenever a
forward sees a position beyond `max_position_embeddings` (and keeps the largest seen). Below
that length the frequencies equal the unscaled ones, which we match exactly. Beyond it we use,
for the token at position p, the frequencies HF computes for a sequence of length p + 1. That
is what HF's `generate` does when it decodes one token at a time (each key is rotated once,
when it is written), and it makes a token's rotation depend on its position only, never on how
the prompt was chunked or batched - which the paged prefix cache needs. HF's own single-shot
prefill of a prompt longer than `max_position_embeddings` rotates every token with the
frequencies for the whole prompt length instead; we do not reproduce that.
"""

from __future__ import annotations

import math

import torch

from weir.engine.config import RopeConfig, RopeScalingType


def _base_inv_freq(theta: float, dim: int, device: torch.device | None = None) -> torch.Tensor:
    """1 / theta^(2i/dim) for i < dim/2, in float32 like HF."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (theta**exponents)  # [dim // 2]


def _llama3_inv_freq(rope: RopeConfig, dim: int) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between."""
    inv_freq = _base_inv_freq(rope.theta, dim)
    old_context_len = rope.original_max_position_embeddings or rope.max_position_embeddings
    low_freq_wavelen = old_context_len / rope.low_freq_factor
    high_freq_wavelen = old_context_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(rope: RopeConfig) -> float:
    """The factor YaRN multiplies cos and sin by (explicit, or derived from factor and mscale)."""
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.mscale and rope.mscale_all_dim:
        return float(_yarn_mscale(rope.factor, rope.mscale) / _yarn_mscale(rope.factor, rope.mscale_all_dim))
    return _yarn_mscale(rope.factor)


def _yarn_inv_freq(rope: RopeConfig, dim: int) -> torch.Tensor:
    """YaRN: interpolate low frequencies, extrapolate high ones, linear ramp between."""
    base = rope.theta
    original_max = rope.original_max_position_embeddings or rope.max_position_embeddings

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original_max / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    # HF's default `truncate=True`: the ramp bounds are rounded outwards to whole dimensions
    low = max(math.floor(correction_dim(rope.beta_fast)), 0)
    high: float = min(math.ceil(correction_dim(rope.beta_slow)), dim - 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (rope.factor * pos_freqs)
    if low == high:
        high += 0.001  # avoid a division by zero in the ramp, like HF
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_factor = 1 - ramp
    return inv_freq_interpolation * (1 - extrapolation_factor) + inv_freq_extrapolation * extrapolation_factor


def _dynamic_inv_freq(rope: RopeConfig, dim: int, seq_lens: torch.Tensor) -> torch.Tensor:
    """Dynamic NTK frequencies `[len(seq_lens), dim // 2]` for sequences longer than max_position_embeddings.

    HF's `generate` passes the sequence length as an int64 tensor, so the new base is computed in
    float32 tensor arithmetic; we do the same to get the same bits.
    """
    max_pos = rope.max_position_embeddings
    seq_lens = torch.clamp(seq_lens.to(torch.int64), min=max_pos)
    base = rope.theta * ((rope.factor * seq_lens / max_pos) - (rope.factor - 1)) ** (dim / (dim - 2))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim
    return 1.0 / (base[:, None] ** exponents[None, :])


def compute_inv_freq(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies `[dim // 2]` (float32) and the cos/sin scale, for sequences within
    `max_position_embeddings` (dynamic NTK grows beyond that; see `RotaryEmbedding`)."""
    match rope.scaling_type:
        case RopeScalingType.NONE | RopeScalingType.DYNAMIC:
            return _base_inv_freq(rope.theta, dim), 1.0
        case RopeScalingType.LINEAR:
            return _base_inv_freq(rope.theta, dim) / rope.factor, 1.0
        case RopeScalingType.LLAMA3:
            return _llama3_inv_freq(rope, dim), 1.0
        case RopeScalingType.YARN:
            return _yarn_inv_freq(rope, dim), yarn_attention_factor(rope)
    raise ValueError(f"unsupported rope scaling_type {rope.scaling_type}")


def _freqs_table(rope: RopeConfig, dim: int, num_positions: int) -> tuple[torch.Tensor, float]:
    """Angles `[num_positions, dim // 2]` (float32) of every position, and the cos/sin scale."""
    inv_freq, scale = compute_inv_freq(rope, dim)
    positions = torch.arange(num_positions, dtype=torch.int64).float()
    freqs = positions[:, None] * inv_freq[None, :]  # [num_positions, dim // 2]
    max_pos = rope.max_position_embeddings
    if rope.scaling_type is RopeScalingType.DYNAMIC and num_positions > max_pos:
        # position p uses the frequencies of a sequence of length p + 1 (see the module docstring)
        # One call per position: HF computes each from a 0-dim length tensor, and the batched
        # (vectorised) pow differs from that in the last bit for some lengths.
        for p in range(max_pos, num_positions):
            freqs[p] = positions[p] * _dynamic_inv_freq(rope, dim, torch.tensor([p + 1]))[0]
    return freqs, scale


class RotaryEmbedding:
    """A cos/sin table for positions `[0, max_positions)`, applied to q and k by position index.

    Uses the "rotate half" (GPT-NeoX / HF Llama) layout: dimension i pairs with i + dim/2.
    The table is computed in float32 and cast to `dtype`, and the rotation runs in `dtype`,
    the same order of operations as HF so that bf16 results agree too.
    """

    def __init__(
        self,
        rope: RopeConfig,
        head_dim: int,
        max_positions: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if rope.partial_rotary_factor != 1.0:
            raise ValueError(
                f"partial_rotary_factor={rope.partial_rotary_factor} is not supported (only 1.0)"
            )
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
        if max_positions < 1:
            raise ValueError(f"max_positions must be >= 1, got {max_positions}")
        self.rope = rope
        self.head_dim = head_dim
        self.max_positions = max_positions
        freqs, scale = _freqs_table(rope, head_dim, max_positions)
        # HF scales cos/sin in float32 before casting to the activation dtype
        self.cos = (freqs.cos() * scale).to(device=device, dtype=dtype)  # [max_positions, head_dim // 2]
        self.sin = (freqs.sin() * scale).to(device=device, dtype=dtype)

    def apply(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        positions: torch.Tensor,  # [num_tokens] int64
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate each token's q and k by the angle of its position; returns new tensors."""
        cos, sin = self.tables(positions)
        return _rotate(query, cos, sin), _rotate(key, cos, sin)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of each token's position, `[num_tokens, 1, head_dim // 2]` each: gathered
        once per step and shared by every layer (`rotate`)."""
        cos = self.cos.index_select(0, positions)[:, None, :]  # [num_tokens, 1, head_dim // 2]
        sin = self.sin.index_select(0, positions)[:, None, :]
        return cos, sin

    @staticmethod
    def rotate(heads: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate `heads` `[num_tokens, any number of heads, head_dim]` by `tables`' cos and sin.

        q and k heads side by side (one view of the fused qkv output) rotate in one pass: the
        same elementwise operations as `apply`, so the same bits, in half the ops.
        """
        return _rotate(heads, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * [cos, cos] + rotate_half(x) * [sin, sin], written on the two halves."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
