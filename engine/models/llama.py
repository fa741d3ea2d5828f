"""Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over a flat token list and a paged KV cache.

One forward runs a whole mixed step: prefill chunks of several sequences and single decode
tokens, laid back to back in the token dimension, with no batch dimension and no padding.
Where each token's K/V goes and which keys it sees is in `AttentionMetadata`; the attention
backend does the paging, this module only does the dense math.

The layers are in engine/models/llama_layers.py; this module holds the whole model: the layer
stack, the LM head, the CPU path's switches (packed linears, C small ops), LoRA slots and weight
loading. Numerics follow Hugging Face's implementation, so logits agree with HF's to ~1e-5 in
fp32. Differences on purpose: q/k/v and gate/up projections are fused into one matmul each (weights
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

from weir.engine.config import ModelConfig
from weir.engine.lora.lora_deltas import LoraStep, ProjectionLora, build_projection_loras
from weir.engine.models.attention import AttentionBackend, AttentionMetadata
from weir.engine.models.llama_layers import Linear, LlamaDecoderLayer, RMSNorm, empty_param
from weir.engine.models.native_decode import NativeDecodeLayers
from weir.engine.models.native_ops import NativeOps
from weir.engine.models.packed_linear import PackedLinear, pack_linear_layers
from weir.engine.models.rope import RotaryEmbedding


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
        self.embed_tokens = empty_param((config.vocab_size, config.hidden_size), dtype, self.device)
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
            else empty_param((config.vocab_size, config.hidden_size), dtype, self.device)
        )
        self.packed_head: PackedLinear | None = None  # set by pack_linear_weights
        # A decode step's layers in one C call (engine/models/native_decode.py): built by
        # pack_linear_weights where every linear gets its C kernel.
        self.native_decode: NativeDecodeLayers | None = None
        self.num_lora_slots = 0  # set by enable_lora
        # The torch path's hand-fused small ops: RoPE tables gathered once per step, q and k
        # rotated in one pass, RMSNorm as one op in float32; the same bits as without (off: the
        # path before them, kept for the A/B in bench/experiments/decode_roofline.py).
        self.fused_ops = True

    def enable_lora(self, num_slots: int, max_rank: int) -> int:
        """Give every projection `num_slots` LoRA slots of rank up to `max_rank` (all zero).

        Returns the bytes the slots take. The base weights are untouched (packed or not): the
        delta is added after each base projection (engine/lora/lora_deltas.py).
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
        if row_inputs:
            self.native_decode = NativeDecodeLayers.build(
                self.layers, self.norm, self.config, self.dtype, self.native_ops
            )
            built = self.native_decode is not None
            self.native_ops_built.decode_layers = self.native_ops.decode_layers = built

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
        if self.native_decode is not None:  # a decode step within its reach: every layer in one C call
            out = self.native_decode.forward(hidden, rope_tables, lora, kv_caches, attn_metadata)
            if out is not None:
                return out
        if self.native_ops.norms:
            from weir.kernels.cpu_rms_norm import add_rms_norm

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
        from weir.kernels.rms_norm import fused_add_rms_norm

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
