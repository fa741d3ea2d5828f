"""The CPU float32 decode step's layers in one C call, for the steps that call can take.

Layer by layer (engine/models/llama_layers.py, `forward_native_norms`), a decode step of a few
rows already runs every op of a layer as a C kernel; what is left between them is Python: ~270
ctypes calls a step for SmolLM2's 30 layers, each with its checks and output tensor, and the GIL
taken back after each. `NativeDecodeLayers` hands a whole step's layers to
`weir.kernels.cpu_decode_layers` instead: the same kernels in the same order (the same bits), one call.

It takes a step when every one of these holds, and otherwise returns None so that the model runs
its layers one by one:

- the step is decode-only (one token a sequence) and has at most as many rows as every linear's
  C kernel takes (`PackedLinear.row_inputs`, decided per host at start-up);
- no token of the step uses a LoRA adapter;
- the model's switches are all on: the hand-fused ops, the C norms, RoPE + K/V store and
  SiLU-and-mul, `decode_layers` itself (engine/models/native_ops.py), and the attention backend's
  C decode attention (the A/B in bench/experiments/decode_roofline.py flips them).

It is built (`build`) once the linears are packed with their row copies, for models without
per-head q/k norms (Qwen3 keeps the layer-by-layer path); None where it does not apply.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from weir.engine.config import ModelConfig
from weir.engine.lora.lora_deltas import LoraStep
from weir.engine.models.attention import AttentionMetadata, TorchAttentionBackend
from weir.engine.models.llama_layers import LlamaDecoderLayer, RMSNorm
from weir.engine.models.native_ops import NativeOps
from weir.engine.models.packed_linear import PackedLinear
from weir.kernels import cpu_decode_attention, cpu_decode_layers
from weir.kernels.cpu_decode_layers import DecodeLayers, LayerWeights, ModelShape
from weir.kernels.cpu_small_gemm import SmallGemm


def _row_gemm(linear: object) -> tuple[SmallGemm, int] | None:
    """A packed linear's C kernel and its reach in rows, or None."""
    if isinstance(linear, PackedLinear) and linear.row_gemm is not None and linear.row_inputs > 0:
        return linear.row_gemm, linear.row_inputs
    return None


class NativeDecodeLayers:
    """A model's layers for the decode steps within the C kernels' reach."""

    def __init__(self, layers: DecodeLayers, max_rows: int, backend: TorchAttentionBackend, ops: NativeOps):
        self.layers = layers
        self.max_rows = max_rows  # the fewest rows any linear's C kernel takes
        self.backend = backend
        self.ops = ops  # the model's switches, shared with it and every layer
        self.steps_taken = 0  # steps run through the C driver (tests and benchmarks read it)

    @classmethod
    def build(
        cls,
        layers: nn.ModuleList,
        final_norm: RMSNorm,
        config: ModelConfig,
        dtype: torch.dtype,
        ops: NativeOps,
    ) -> NativeDecodeLayers | None:
        """A model's layers (engine/models/llama.py) laid out for the C driver, or None where it
        does not apply."""
        if (
            final_norm.weight.device.type != "cpu"
            or dtype != torch.float32
            or config.qk_norm
            or not cpu_decode_layers.available()
        ):
            return None
        weights: list[LayerWeights] = []
        reaches: list[int] = []
        backends = set()
        for layer in layers:
            assert isinstance(layer, LlamaDecoderLayer)
            attn, mlp = layer.self_attn, layer.mlp
            gemms: list[SmallGemm] = []
            for proj in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
                found = _row_gemm(proj)
                if found is None:
                    return None
                gemms.append(found[0])
                reaches.append(found[1])
            qkv, o, gate_up, down = gemms
            backends.add(attn.attn_backend)
            weights.append(
                LayerWeights(
                    layer.input_layernorm.weight.data,
                    qkv,
                    o,
                    layer.post_attention_layernorm.weight.data,
                    gate_up,
                    down,
                )
            )
        backend = backends.pop() if len(backends) == 1 else None  # one backend shared by every layer
        if not isinstance(backend, TorchAttentionBackend):
            return None
        epsilons = {layer.input_layernorm.eps for layer in layers} | {
            layer.post_attention_layernorm.eps for layer in layers
        }
        scales = {layer.self_attn.scale for layer in layers}
        if len(epsilons) != 1 or len(scales) != 1:
            return None
        shape = ModelShape(
            num_heads=config.num_heads,
            kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            eps=epsilons.pop(),
            final_eps=final_norm.eps,
            scale=scales.pop(),
        )
        return cls(DecodeLayers(weights, final_norm.weight.data, shape), min(reaches), backend, ops)

    def forward(
        self,
        embeddings: torch.Tensor,  # [num_tokens, hidden]: this step's own (the residual stream, in place)
        rope_tables: tuple[torch.Tensor, torch.Tensor] | None,  # RotaryEmbedding.tables; None: unfused ops
        lora: LoraStep | None,
        kv_caches: Sequence[torch.Tensor],
        metadata: AttentionMetadata,
    ) -> torch.Tensor | None:  # [num_tokens, hidden]: the final norm's output; None: not this step
        """The step's final hidden states, or None (nothing done) where the step is outside its reach."""
        rows = embeddings.shape[0]
        backend, ops = self.backend, self.ops
        if (
            rope_tables is None
            or lora is not None
            or not (ops.decode_layers and ops.norms and ops.rope_kv and ops.silu_mul)
            or not metadata.is_decode_only
            or rows > self.max_rows
            or rows != metadata.num_seqs
            or not (backend.fused_decode and backend.native_decode)
            or kv_caches[0].dtype != torch.float32
        ):
            return None
        plan = cpu_decode_attention.plan(metadata.block_tables, metadata.seq_lens_cpu, metadata.block_size)
        out = self.layers(embeddings, *rope_tables, metadata.slot_mapping, plan, kv_caches)
        self.steps_taken += 1
        return out
