"""Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over a flat token list and a paged KV cache.

One forward runs a whole mixed step: prefill chunks of several sequences and single decode
tokens, laid back to back in the token dimension, with no batch dimension and no padding.
Where each token's K/V goes and which keys it sees is in `AttentionMetadata`; the attention
backend does the paging, this module only does the dense math.

Numerics follow Hugging Face's implementation (RMSNorm in float32 then cast, RoPE tables in
float32 then cast, rotation in the activation dtype) so logits agree with HF's to ~1e-5 in fp32.
Differences on purpose: q/k/v and gate/up projections are fused into one matmul each (weights
concatenated at load), and Mistral/Qwen sliding windows are not applied (the loader caps
`max_model_len` at the window instead, where full and windowed attention coincide).

On CUDA with the Triton attention backend the model takes a second path (`fused_kernels`):
residual add + RMSNorm, RoPE and SiLU-and-mul run as fused Triton kernels (see kernels/), and
the residual stream is carried beside the hidden state so each add is fused into the next
norm. That path reads no host-side metadata, so a decode step can be captured in a CUDA
graph. The plain-torch path below is the CPU path and the numerical reference.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata
from engine.config import ModelConfig
from engine.models.lora import LoraStep, ProjectionLora, build_projection_loras
from engine.models.native_ops import NativeOps
from engine.models.packed_linear import PackedLinear, pack_linear_layers
from engine.rope import RotaryEmbedding


def _empty_param(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    # Uninitialised: every parameter is overwritten by load_weights, and random init of a big
    # model on CPU would cost seconds for nothing. No grad: this is an inference engine.
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class Linear(nn.Module):
    """y = x W^T (+ b), with parameters left uninitialised until weights are loaded."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype, device: torch.device
    ):
        super().__init__()
        self.weight = _empty_param((out_features, in_features), dtype, device)
        self.bias = _empty_param((out_features,), dtype, device) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """RMSNorm computed in float32 and cast back before the weight multiply, like HF."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.weight = _empty_param((dim,), dtype, device)
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
            from kernels.cpu_rope_kv import rope_kv_write

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
        from kernels.rotary import apply_rotary_

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
            from kernels.cpu_silu_mul import silu_mul

            return self._down(silu_mul(gate_up), lora)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)  # [num_tokens, intermediate]
        return self._down(F.silu(gate) * up, lora)

    def forward_fused(self, x: torch.Tensor, lora: LoraStep | None = None) -> torch.Tensor:
        """As `forward`, with silu(gate) * up in one Triton kernel."""
        from kernels.silu_mul import silu_mul

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
        (`kernels.cpu_rms_norm`); the residual stream is updated in place."""
        from kernels.cpu_rms_norm import add_rms_norm

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
        from kernels.rms_norm import fused_add_rms_norm, rms_norm

        ln1, ln2 = self.input_layernorm, self.post_attention_layernorm
        if residual is None:  # first layer: the embeddings are the residual stream
            residual = hidden
            normed = rms_norm(hidden, ln1.weight, ln1.eps)
        else:
            normed, residual = fused_add_rms_norm(hidden, residual, ln1.weight, ln1.eps)
        attn_out = self.self_attn.forward_fused(normed, positions, kv_cache, attn_metadata, lora)
        normed, residual = fused_add_rms_norm(attn_out, residual, ln2.weight, ln2.eps)
        return self.mlp.forward_fused(normed, lora), residual


def _triton_on_cuda(attn_backend: AttentionBackend, device: torch.device) -> bool:
    # Asking the backend rather than importing the Triton one keeps triton unimported on the torch path.
    return device.type == "cuda" and attn_backend.uses_triton


_LAYER_WEIGHT = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


class LlamaForCausalLM(nn.Module):
    """The whole decoder plus LM head. Built directly on `device` in `dtype`; call `load_weights`."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        attn_backend: AttentionBackend,
        fused_kernels: bool | None = None,
    ):
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        # None: the fused Triton path exactly when attention runs through Triton on CUDA.
        # A plain attribute: tests switch it on under the CPU Triton interpreter.
        self.fused_kernels = (
            _triton_on_cuda(attn_backend, self.device) if fused_kernels is None else fused_kernels
        )
        # One table shared by every layer; covers every position the engine may schedule.
        self.rotary = RotaryEmbedding(
            config.rope, config.head_dim, config.max_model_len, dtype=dtype, device=self.device
        )
        self.embed_tokens = _empty_param((config.vocab_size, config.hidden_size), dtype, self.device)
        # The add + RMSNorm, RoPE + K/V store and SiLU-and-mul as C kernels on the CPU in float32
        # (engine/models/native_ops.py; rounding of the norms differs from the torch form, ~1e-7):
        # what builds here, and the switches in use, one object shared by every layer so that
        # the A/B flips an op for the whole model.
        self.native_ops_built = NativeOps.for_model(self.device, dtype)
        self.native_ops = dataclasses.replace(self.native_ops_built)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, self.rotary, attn_backend, dtype, self.device, self.native_ops)
            for _ in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, self.device)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else _empty_param((config.vocab_size, config.hidden_size), dtype, self.device)
        )
        self.packed_head: PackedLinear | None = None  # set by pack_linear_weights
        self.num_lora_slots = 0  # set by enable_lora
        # The torch path's hand-fused small ops: RoPE tables gathered once per step, q and k
        # rotated in one pass, RMSNorm as one op in float32; the same bits as without (off: the
        # path before them, kept for the A/B in bench/experiments/decode_roofline.py).
        self.fused_ops = True

    @property
    def native_norms(self) -> bool:
        """Each residual add and the RMSNorm after it in one C call (`native_ops.norms`)."""
        return self.native_ops.norms

    @native_norms.setter
    def native_norms(self, on: bool) -> None:
        self.native_ops.norms = on

    @property
    def native_norms_built(self) -> bool:
        return self.native_ops_built.norms

    def enable_lora(self, num_slots: int, max_rank: int) -> int:
        """Give every projection `num_slots` LoRA slots of rank up to `max_rank` (all zero).

        Returns the bytes the slots take. The base weights are untouched (packed or not): the
        delta is added after each base projection (engine/models/lora.py).
        """
        num_bytes = 0
        for layer in self.layers:
            assert isinstance(layer, LlamaDecoderLayer)
            loras = build_projection_loras(self.config, num_slots, max_rank, self.dtype, self.device)
            attn, mlp = layer.self_attn, layer.mlp
            attn.qkv_lora, attn.o_lora = loras["qkv"], loras["o"]
            mlp.gate_up_lora, mlp.down_lora = loras["gate_up"], loras["down"]
            num_bytes += sum(p.num_bytes for p in loras.values())
        self.num_lora_slots = num_slots
        return num_bytes

    def _projection_loras(self, layer: LlamaDecoderLayer) -> list[ProjectionLora]:
        attn, mlp = layer.self_attn, layer.mlp
        loras = [attn.qkv_lora, attn.o_lora, mlp.gate_up_lora, mlp.down_lora]
        if any(p is None for p in loras):
            raise RuntimeError("LoRA is not enabled on this model (enable_lora)")
        return [p for p in loras if p is not None]

    def set_lora_slot(
        self,
        slot: int,
        weights: Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] | None,
        scaling: float = 1.0,
    ) -> None:
        """Copy an adapter's factors ((layer, target) -> (A, B)) into `slot`; None clears it."""
        if not 0 <= slot < self.num_lora_slots:
            raise ValueError(f"slot must be in [0, {self.num_lora_slots}), got {slot}")
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, LlamaDecoderLayer)
            for proj in self._projection_loras(layer):
                if weights is None:
                    proj.clear_slot(slot)
                    continue
                factors = {t: weights[(i, t)] for t in proj.targets if (i, t) in weights}
                proj.set_slot(slot, factors, scaling)

    @property
    def is_packed(self) -> bool:
        """Whether `pack_linear_weights` has run (the CPU fast path)."""
        return self.packed_head is not None

    def pack_linear_weights(self, row_inputs: int = 0) -> None:
        """The CPU fast path: every projection and the LM head pre-packed for oneDNN.

        Call once, after `load_weights` (which is refused afterwards: the plain projection
        weights are gone). `row_inputs` > 0: each also keeps a copy for inputs of at most that
        many rows (decode steps of small batches), read at the memory bandwidth. See
        engine/models/packed_linear.py for why and when each is faster.
        """
        if self.is_packed:
            return
        pack_linear_layers(self, Linear, row_inputs)
        # [vocab, hidden]: tied, the embedding table stays as well, since tokens are looked up in it
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        self.packed_head = PackedLinear(head, None, row_inputs)
        self.lm_head = None

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64
        positions: torch.Tensor,  # [num_tokens] int64
        kv_caches: list[torch.Tensor],  # per layer [2, num_blocks, block_size, num_kv_heads, head_dim]
        attn_metadata: AttentionMetadata,
        lora: LoraStep | None = None,
    ) -> torch.Tensor:  # [num_tokens, hidden]
        """Final-norm hidden states of every token of the step; K/V are written to the caches.

        `lora`: the adapter slot of each token (None: no token of the step uses an adapter).
        """
        hidden = F.embedding(input_ids, self.embed_tokens)  # [num_tokens, hidden]
        if self.fused_kernels:
            return self._forward_fused(hidden, positions, kv_caches, attn_metadata, lora)
        rope_tables = self.rotary.tables(positions) if self.fused_ops else None
        if self.native_norms:
            from kernels.cpu_rms_norm import add_rms_norm

            # F.embedding's output is this step's own: the residual stream may be updated in place.
            residual: torch.Tensor | None = None
            for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
                hidden, residual = layer.forward_native_norms(
                    hidden, residual, positions, kv_cache, attn_metadata, lora, rope_tables
                )
            return add_rms_norm(hidden, residual, self.norm.weight, self.norm.eps)[0]
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden = layer(hidden, positions, kv_cache, attn_metadata, lora, rope_tables)
        return self.norm(hidden, self.fused_ops)

    def _forward_fused(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden]
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: AttentionMetadata,
        lora: LoraStep | None = None,
    ) -> torch.Tensor:  # [num_tokens, hidden]
        from kernels.rms_norm import fused_add_rms_norm

        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer.forward_fused(hidden, residual, positions, kv_cache, attn_metadata, lora)
        assert residual is not None  # ModelConfig guarantees num_layers >= 1
        hidden, _ = fused_add_rms_norm(hidden, residual, self.norm.weight, self.norm.eps)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, vocab] float32
        """Logits of the rows the sampler needs (usually each sequence's last token)."""
        if self.packed_head is not None:
            return self.packed_head(hidden).float()
        weight = self.embed_tokens if self.lm_head is None else self.lm_head
        return F.linear(hidden, weight).float()

    # ---- weight loading -------------------------------------------------------------------

    def _weight_targets(self) -> dict[str, torch.Tensor]:
        """HF checkpoint name -> the view of our (possibly fused) tensor it is copied into.

        Fused projections receive several checkpoint tensors at different row offsets.
        """
        c = self.config
        targets: dict[str, torch.Tensor] = {
            "model.embed_tokens.weight": self.embed_tokens,
            "model.norm.weight": self.norm.weight,
        }
        if self.lm_head is not None:
            targets["lm_head.weight"] = self.lm_head
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, LlamaDecoderLayer)
            attn, mlp, prefix = layer.self_attn, layer.mlp, f"model.layers.{i}."
            suffixes = ["weight"] + (["bias"] if c.attention_bias else [])
            for suffix in suffixes:
                q, k, v = getattr(attn.qkv_proj, suffix).split([q_size, kv_size, kv_size])
                targets[f"{prefix}self_attn.q_proj.{suffix}"] = q
                targets[f"{prefix}self_attn.k_proj.{suffix}"] = k
                targets[f"{prefix}self_attn.v_proj.{suffix}"] = v
            targets[f"{prefix}self_attn.o_proj.weight"] = attn.o_proj.weight
            if attn.o_proj.bias is not None:
                targets[f"{prefix}self_attn.o_proj.bias"] = attn.o_proj.bias
            if attn.q_norm is not None and attn.k_norm is not None:
                targets[f"{prefix}self_attn.q_norm.weight"] = attn.q_norm.weight
                targets[f"{prefix}self_attn.k_norm.weight"] = attn.k_norm.weight
            for suffix in ["weight"] + (["bias"] if c.mlp_bias else []):
                gate, up = getattr(mlp.gate_up_proj, suffix).split(c.intermediate_size)
                targets[f"{prefix}mlp.gate_proj.{suffix}"] = gate
                targets[f"{prefix}mlp.up_proj.{suffix}"] = up
                targets[f"{prefix}mlp.down_proj.{suffix}"] = getattr(mlp.down_proj, suffix)
            targets[f"{prefix}input_layernorm.weight"] = layer.input_layernorm.weight
            targets[f"{prefix}post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
        return targets

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named checkpoint tensors into our (fused) parameters, casting to our dtype.

        Raises ValueError naming the tensor on a shape mismatch, an unexpected tensor, or a
        tensor the model needs that the checkpoint lacks.
        """
        if self.is_packed:
            raise ValueError("load_weights after pack_linear_weights: build a fresh model instead")
        targets = self._weight_targets()
        missing = set(targets)
        for name, tensor in weights:
            if name.endswith("rotary_emb.inv_freq"):
                continue  # old checkpoints saved this buffer; we compute it
            if name == "lm_head.weight" and self.lm_head is None:
                continue  # tied: some checkpoints still store the duplicate
            if name not in targets:
                layer = _LAYER_WEIGHT.match(name)
                if layer and int(layer.group(1)) >= self.config.num_layers:
                    raise ValueError(
                        f"checkpoint has {name} but config.num_hidden_layers is {self.config.num_layers}"
                    )
                raise ValueError(f"unexpected tensor {name!r} in checkpoint")
            target = targets[name]
            if tensor.shape != target.shape:
                raise ValueError(
                    f"tensor {name!r} has shape {tuple(tensor.shape)}, the config implies {tuple(target.shape)}"
                )
            with torch.no_grad():
                target.copy_(tensor.to(dtype=self.dtype))
            missing.discard(name)
        if missing:
            names = ", ".join(sorted(missing)[:5])
            raise ValueError(f"checkpoint lacks {len(missing)} tensor(s) the model needs, e.g. {names}")
