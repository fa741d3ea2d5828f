"""The layers of the Llama-family decoder (engine/models/llama.py): linear, RMSNorm, attention, MLP
and the pre-norm decoder block, each with the CPU path's hand-fused forms and the CUDA path's fused
Triton forms beside the plain torch one.

Numerics follow Hugging Face's implementation (RMSNorm in float32 then cast, RoPE tables in
float32 then cast, rotation in the activation dtype) so logits agree with HF's to ~1e-5 in fp32.
q/k/v and gate/up are fused into one projection each (`qkv_proj`, `gate_up_proj`); the model's
weight loading fills them from the checkpoint's separate tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from weir.engine.config import ModelConfig
from weir.engine.lora.lora_deltas import LoraStep, ProjectionLora
from weir.engine.models.attention import AttentionBackend, AttentionMetadata
from weir.engine.models.native_ops import NativeOps
from weir.engine.models.rope import RotaryEmbedding


def empty_param(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    # Uninitialised: every parameter is overwritten by load_weights, and random init of a big
    # model on CPU would cost seconds for nothing. No grad: this is an inference engine.
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class Linear(nn.Module):
    """y = x W^T (+ b), with parameters left uninitialised until weights are loaded."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype, device: torch.device
    ):
        super().__init__()
        self.weight = empty_param((out_features, in_features), dtype, device)
        self.bias = empty_param((out_features,), dtype, device) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 and cast back before the weight multiply, like HF."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.weight = empty_param((dim,), dtype, device)
        self.eps = eps

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        """`fused` (float32 only, else ignored): one `F.rms_norm` call instead of six ops, the same
        bits (tests/engine/models/test_llama.py checks them equal)."""
        if fused and x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        input_dtype = x.dtype
        x32 = x.to(torch.float32)
        variance = x32.pow(2).mean(-1, keepdim=True)
        x32 = x32 * torch.rsqrt(variance + self.eps)
        return self.weight * x32.to(input_dtype)


def has_o_proj_bias(config: ModelConfig) -> bool:
    """Llama and Qwen3 put `attention_bias` on o_proj too; Qwen2 has q/k/v biases only."""
    return config.attention_bias and config.model_type != "qwen2"


class LlamaAttention(nn.Module):
    """Fused qkv projection, optional per-head q/k RMSNorm (Qwen3), RoPE, paged attention, o_proj."""

    def __init__(
        self,
        config: ModelConfig,
        rotary: RotaryEmbedding,
        attn_backend: AttentionBackend,
        dtype: torch.dtype,
        device: torch.device,
        native_ops: NativeOps | None = None,
    ):
        super().__init__()
        self.native_ops = native_ops or NativeOps()  # the model's, shared by every layer
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.scale = config.head_dim**-0.5
        self.qkv_proj = Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, config.attention_bias, dtype, device
        )
        self.o_proj = Linear(self.q_size, config.hidden_size, has_o_proj_bias(config), dtype, device)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype, device) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype, device) if config.qk_norm else None
        self.rotary = rotary
        self.attn_backend = attn_backend
        self.qkv_lora: ProjectionLora | None = None  # set by LlamaForCausalLM.enable_lora
        self.o_lora: ProjectionLora | None = None

    def _qkv(self, hidden: torch.Tensor, lora: LoraStep | None) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)  # [num_tokens, q_size + 2 * kv_size]
        if lora is not None and self.qkv_lora is not None:
            lora.apply(qkv, hidden, self.qkv_lora)
        return qkv

    def _o(self, out: torch.Tensor, lora: LoraStep | None) -> torch.Tensor:
        y = self.o_proj(out)  # [num_tokens, hidden]
        if lora is not None and self.o_lora is not None:
            lora.apply(y, out, self.o_lora)
        return y

    def forward(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden]
        positions: torch.Tensor,  # [num_tokens] int64
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        attn_metadata: AttentionMetadata,
        lora: LoraStep | None = None,
        rope_tables: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:  # [num_tokens, hidden]
        """`rope_tables`: the step's cos and sin (`RotaryEmbedding.tables`), gathered once for every
        layer; q and k then rotate together (models without q/k norms)."""
        num_tokens = hidden.shape[0]
        qkv = self._qkv(hidden, lora)  # [num_tokens, q_size + 2 * kv_size]
        if rope_tables is not None and self.q_norm is None:
            return self._forward_joint_rope(qkv, kv_cache, attn_metadata, lora, rope_tables)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim).contiguous()
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        if rope_tables is not None:
            cos, sin = rope_tables
            q, k = self.rotary.rotate(q, cos, sin), self.rotary.rotate(k, cos, sin)
        else:
            q, k = self.rotary.apply(q, k, positions)
        out = self.attn_backend.forward(q, k, v, kv_cache, attn_metadata, self.scale)
        return self._o(out.reshape(num_tokens, self.q_size), lora)

    def _forward_joint_rope(
        self,
        qkv: torch.Tensor,  # [num_tokens, q_size + 2 * kv_size]
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        lora: LoraStep | None,
        rope_tables: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:  # [num_tokens, hidden]
        num_tokens = qkv.shape[0]
        if self.native_ops.rope_kv and kv_cache.dtype == torch.float32:
            from weir.kernels.cpu_rope_kv import rope_kv_write

            # q rotated out of qkv; k rotated and v copied straight into their cache slots
            q = rope_kv_write(qkv, *rope_tables, attn_metadata.slot_mapping, kv_cache, self.num_heads)
            out = self.attn_backend.attend(q, kv_cache, attn_metadata, self.scale)
            return self._o(out.reshape(num_tokens, self.q_size), lora)
        num_qk_heads = self.num_heads + self.num_kv_heads
        qk = qkv[:, : self.q_size + self.kv_size].view(num_tokens, num_qk_heads, self.head_dim)
        qk = self.rotary.rotate(qk, *rope_tables)  # [num_tokens, heads + kv_heads, head_dim]
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, self.q_size + self.kv_size :].reshape(num_tokens, self.num_kv_heads, self.head_dim)
        out = self.attn_backend.forward(q, k, v.contiguous(), kv_cache, attn_metadata, self.scale)
        return self._o(out.reshape(num_tokens, self.q_size), lora)

    def forward_fused(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden]
        positions: torch.Tensor,  # [num_tokens] int64
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        lora: LoraStep | None = None,
    ) -> torch.Tensor:  # [num_tokens, hidden]
        """As `forward`, with RoPE applied in place by the Triton kernel on views of the qkv output."""
        from weir.kernels.rotary import apply_rotary_

        num_tokens = hidden.shape[0]
        qkv = self._qkv(hidden, lora)  # [num_tokens, q_size + 2 * kv_size]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)  # strided: the cache write reads it in place
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q)
            k = self.k_norm(k)
        apply_rotary_(q, k, self.rotary.cos, self.rotary.sin, positions)
        out = self.attn_backend.forward(q, k, v, kv_cache, attn_metadata, self.scale)
        return self._o(out.reshape(num_tokens, self.q_size), lora)


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up fused into one matmul."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        native_ops: NativeOps | None = None,
    ):
        super().__init__()
        self.native_ops = native_ops or NativeOps()  # the model's, shared by every layer
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = Linear(
            config.hidden_size, 2 * config.intermediate_size, config.mlp_bias, dtype, device
        )
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, config.mlp_bias, dtype, device)
        self.gate_up_lora: ProjectionLora | None = None  # set by LlamaForCausalLM.enable_lora
        self.down_lora: ProjectionLora | None = None

    def _gate_up(self, x: torch.Tensor, lora: LoraStep | None) -> torch.Tensor:
        y = self.gate_up_proj(x)  # [num_tokens, 2 * intermediate]
        if lora is not None and self.gate_up_lora is not None:
            lora.apply(y, x, self.gate_up_lora)
        return y

    def _down(self, x: torch.Tensor, lora: LoraStep | None) -> torch.Tensor:
        y = self.down_proj(x)  # [num_tokens, hidden]
        if lora is not None and self.down_lora is not None:
            lora.apply(y, x, self.down_lora)
        return y

    def forward(self, x: torch.Tensor, lora: LoraStep | None = None) -> torch.Tensor:
        gate_up = self._gate_up(x, lora)  # [num_tokens, 2 * intermediate]
        if self.native_ops.silu_mul and gate_up.dtype == torch.float32:
            from weir.kernels.cpu_silu_mul import silu_mul

            return self._down(silu_mul(gate_up), lora)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)  # [num_tokens, intermediate]
        return self._down(F.silu(gate) * up, lora)

    def forward_fused(self, x: torch.Tensor, lora: LoraStep | None = None) -> torch.Tensor:
        """As `forward`, with silu(gate) * up in one Triton kernel."""
        from weir.kernels.silu_mul import silu_mul

        return self._down(silu_mul(self._gate_up(x, lora)), lora)  # silu_mul: [num_tokens, intermediate]


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(
        self,
        config: ModelConfig,
        rotary: RotaryEmbedding,
        attn_backend: AttentionBackend,
        dtype: torch.dtype,
        device: torch.device,
        native_ops: NativeOps | None = None,
    ):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.self_attn = LlamaAttention(config, rotary, attn_backend, dtype, device, native_ops)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.mlp = LlamaMLP(config, dtype, device, native_ops)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        lora: LoraStep | None = None,
        rope_tables: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """`rope_tables` given: the CPU path's hand-fused ops (`LlamaForCausalLM.fused_ops`)."""
        fused = rope_tables is not None
        hidden = hidden + self.self_attn(
            self.input_layernorm(hidden, fused), positions, kv_cache, attn_metadata, lora, rope_tables
        )
        return hidden + self.mlp(self.post_attention_layernorm(hidden, fused), lora)

    def forward_native_norms(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden]: the previous layer's MLP output (or the embeddings)
        residual: torch.Tensor | None,  # [num_tokens, hidden]: the residual stream before that output
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        lora: LoraStep | None,
        rope_tables: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (this layer's MLP output, residual stream before it)
        """As `forward` on the CPU in float32, each residual add and the RMSNorm after it one C call
        (`weir.kernels.cpu_rms_norm`); the residual stream is updated in place."""
        from weir.kernels.cpu_rms_norm import add_rms_norm

        ln1, ln2 = self.input_layernorm, self.post_attention_layernorm
        normed, residual = add_rms_norm(hidden, residual, ln1.weight, ln1.eps)
        attn_out = self.self_attn(normed, positions, kv_cache, attn_metadata, lora, rope_tables)
        normed, residual = add_rms_norm(attn_out, residual, ln2.weight, ln2.eps)
        return self.mlp(normed, lora), residual

    def forward_fused(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden]: the previous layer's MLP output (or the embeddings)
        residual: torch.Tensor | None,  # [num_tokens, hidden]: the residual stream before that output
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        lora: LoraStep | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (this layer's MLP output, residual stream before it)
        """As `forward`, with each residual add fused into the RMSNorm that follows it.

        The residual stream is updated in place; `forward`'s `x + f(norm(x))` is the same sum.
        """
        from weir.kernels.rms_norm import fused_add_rms_norm, rms_norm

        ln1, ln2 = self.input_layernorm, self.post_attention_layernorm
        if residual is None:  # first layer: the embeddings are the residual stream
            residual = hidden
            normed = rms_norm(hidden, ln1.weight, ln1.eps)
        else:
            normed, residual = fused_add_rms_norm(hidden, residual, ln1.weight, ln1.eps)
        attn_out = self.self_attn.forward_fused(normed, positions, kv_cache, attn_metadata, lora)
        normed, residual = fused_add_rms_norm(attn_out, residual, ln2.weight, ln2.eps)
        return self.mlp.forward_fused(normed, lora), residual
