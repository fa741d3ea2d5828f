"""Read a Hugging Face model folder: config.json -> ModelConfig, *.safetensors -> our model.

Only the configuration goes through transformers (`AutoConfig`, which also normalises old-style
`rope_theta`/`rope_scaling` keys); the weights are read with safetensors directly and poured
into our own `weir.engine.models` implementation, never into transformers' model classes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from weir.engine.config import ModelConfig, RopeConfig, RopeScalingType
from weir.engine.errors import EngineError
from weir.engine.models.attention import AttentionBackend

# model_type values of config.json this engine runs; all of them map to weir.engine.models.llama
SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


class ModelLoadError(EngineError, ValueError):
    """The model folder is missing, incomplete, or describes a model this engine cannot run."""


def _rope_parameters(hf_config: Any) -> dict[str, Any]:
    """The flat RoPE parameter dict, from transformers-5 `rope_parameters` or the older
    top-level `rope_theta` plus optional `rope_scaling` dict."""
    params = getattr(hf_config, "rope_parameters", None)
    if params:
        params = dict(params)
    else:
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
    if any(isinstance(value, dict) for value in params.values()):
        raise ModelLoadError("per-layer-type rope_parameters are not supported")
    if params.get("rope_theta") is None:
        params["rope_theta"] = getattr(hf_config, "rope_theta", None) or 10000.0
    if "partial_rotary_factor" not in params and getattr(hf_config, "partial_rotary_factor", None):
        params["partial_rotary_factor"] = hf_config.partial_rotary_factor
    return params


def rope_config_from_hf(hf_config: Any) -> RopeConfig:
    """Translate the HF RoPE settings, applying HF's defaults for missing scaling keys."""
    params = _rope_parameters(hf_config)
    max_pos = int(hf_config.max_position_embeddings)
    type_name = params.get("rope_type") or params.get("type") or "default"
    try:
        scaling_type = RopeScalingType(type_name)
    except ValueError:
        supported = ", ".join(t.value for t in RopeScalingType)
        raise ModelLoadError(f"rope_type {type_name!r} is not supported (supported: {supported})") from None
    if params.get("truncate", True) is False:
        raise ModelLoadError("rope_parameters.truncate=false (YaRN without truncation) is not supported")
    original_max = params.get("original_max_position_embeddings")
    if scaling_type in (RopeScalingType.LLAMA3, RopeScalingType.YARN):
        # like HF: a top-level original_max_position_embeddings (Phi3 style) wins, else max positions
        original_max = getattr(hf_config, "original_max_position_embeddings", None) or original_max or max_pos
    factor = params.get("factor")
    if factor is None:
        if scaling_type is RopeScalingType.YARN:
            factor = max_pos / (original_max or max_pos)
        elif scaling_type is not RopeScalingType.NONE:
            raise ModelLoadError(f"rope_parameters.factor is required for rope_type {type_name!r}")
        else:
            factor = 1.0
    try:
        rope = RopeConfig(
            theta=float(params["rope_theta"]),
            scaling_type=scaling_type,
            factor=float(factor),
            max_position_embeddings=max_pos,
            original_max_position_embeddings=int(original_max) if original_max is not None else None,
            low_freq_factor=float(params.get("low_freq_factor") or 1.0),
            high_freq_factor=float(params.get("high_freq_factor") or 4.0),
            # HF treats 0/None as "use the paper's default"
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            attention_factor=_optional_float(params.get("attention_factor")),
            mscale=_optional_float(params.get("mscale")),
            mscale_all_dim=_optional_float(params.get("mscale_all_dim")),
            partial_rotary_factor=float(params.get("partial_rotary_factor") or 1.0),
        )
    except ValueError as exc:
        raise ModelLoadError(f"invalid RoPE configuration: {exc}") from exc
    if rope.partial_rotary_factor != 1.0:
        raise ModelLoadError(
            f"partial_rotary_factor={rope.partial_rotary_factor} is not supported (only 1.0)"
        )
    return rope


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _as_id_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def model_config_from_hf(hf_config: Any, generation_config: dict[str, Any] | None = None) -> ModelConfig:
    """Build our ModelConfig from a transformers config object (or anything with its attributes).

    `generation_config` is the parsed generation_config.json, if any: its eos ids are added to
    the config's (chat models often list their end-of-turn token only there).
    """
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"unsupported architecture model_type={model_type!r} "
            f"(supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))})"
        )
    hidden_act = getattr(hf_config, "hidden_act", "silu")
    if hidden_act != "silu":
        raise ModelLoadError(f"hidden_act={hidden_act!r} is not supported (only silu)")
    num_heads = int(hf_config.num_attention_heads)
    num_kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or num_heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads)
    max_pos = int(hf_config.max_position_embeddings)

    # Qwen2 always has q/k/v biases; Llama and Qwen3 follow config.attention_bias
    attention_bias = True if model_type == "qwen2" else bool(getattr(hf_config, "attention_bias", False))
    sliding_window = getattr(hf_config, "sliding_window", None)
    if model_type in ("qwen2", "qwen3") and not getattr(hf_config, "use_sliding_window", False):
        sliding_window = None
    # We attend over the full context. Capping the length at the window keeps that exact.
    max_model_len = min(max_pos, sliding_window) if sliding_window else max_pos

    eos_ids = list(_as_id_tuple(getattr(hf_config, "eos_token_id", None)))
    if generation_config:
        eos_ids += [i for i in _as_id_tuple(generation_config.get("eos_token_id")) if i not in eos_ids]
    bos = getattr(hf_config, "bos_token_id", None)
    if bos is None and generation_config:
        bos = generation_config.get("bos_token_id")
    try:
        return ModelConfig(
            model_type=model_type,
            vocab_size=int(hf_config.vocab_size),
            hidden_size=int(hf_config.hidden_size),
            intermediate_size=int(hf_config.intermediate_size),
            num_layers=int(hf_config.num_hidden_layers),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(hf_config.rms_norm_eps),
            rope=rope_config_from_hf(hf_config),
            max_model_len=max_model_len,
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            attention_bias=attention_bias,
            qk_norm=model_type == "qwen3",
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
            eos_token_ids=tuple(eos_ids),
            bos_token_id=int(bos) if bos is not None else None,
            sliding_window=int(sliding_window) if sliding_window else None,
        )
    except ValueError as exc:
        if isinstance(exc, ModelLoadError):
            raise
        raise ModelLoadError(f"invalid model configuration: {exc}") from exc


def _check_folder(path: Path) -> None:
    if not path.is_dir():
        raise ModelLoadError(f"model folder {str(path)!r} does not exist")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model folder {str(path)!r} has no config.json")


def load_model_config(path: str | Path) -> ModelConfig:
    """ModelConfig of a model folder (config.json + generation_config.json), without the weights."""
    from transformers import AutoConfig  # heavy import, only where a folder is read

    path = Path(path)
    _check_folder(path)
    try:
        hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        raise ModelLoadError(f"cannot read {path / 'config.json'}: {exc}") from exc
    generation_config = None
    generation_path = path / "generation_config.json"
    if generation_path.is_file():
        try:
            generation_config = json.loads(generation_path.read_text())
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"cannot parse {generation_path}: {exc}") from exc
    return model_config_from_hf(hf_config, generation_config)


def weight_files(path: Path) -> list[Path]:
    """The folder's safetensors files, sorted (sharded checkpoints have several)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"model folder {str(path)!r} has no *.safetensors weights")
    return files


def iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, CPU tensor) for every tensor of every file, one at a time to bound peak memory."""
    from safetensors import SafetensorError, safe_open

    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for name in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
                    yield name, handle.get_tensor(name)
        except (OSError, SafetensorError) as exc:
            raise ModelLoadError(f"cannot read weights {file}: {exc}") from exc


def load_model(
    path: str | Path,
    dtype: torch.dtype,
    device: torch.device,
    attn_backend: AttentionBackend,
    max_model_len: int | None = None,
    pack_linear: bool = False,
    row_inputs: int = 0,
) -> tuple[nn.Module, ModelConfig]:
    """Build our model for the folder at `path` and load its weights in `dtype` on `device`.

    `max_model_len` overrides the context length read from config.json (the RoPE table covers
    exactly that many positions): lower it to save memory, or raise it past
    max_position_embeddings for RoPE scalings that extrapolate (dynamic NTK). It may not pass a
    sliding window, since we attend over the full context.

    `pack_linear` takes the CPU fast path (pre-packed oneDNN weights, see
    engine/models/packed_linear.py); ModelLoadError where this build cannot pack `dtype` on `device`.
    `row_inputs` > 0 (with `pack_linear`, float32 only): each linear weight also kept for inputs
    of at most that many rows (engine/models/packed_linear.py).
    """
    from weir.engine.models import get_model_class
    from weir.engine.models.packed_linear import packing_unsupported_reason

    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ModelLoadError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
    unsupported = packing_unsupported_reason(dtype, device) if pack_linear else None
    if unsupported is not None:
        raise ModelLoadError(unsupported)
    if row_inputs and not (pack_linear and dtype == torch.float32):
        raise ModelLoadError(
            f"row weights need pack_linear and float32, got pack_linear={pack_linear} {dtype}"
        )
    if row_inputs < 0:
        raise ModelLoadError(f"row_inputs must be >= 0, got {row_inputs}")
    path = Path(path)
    config = load_model_config(path)
    if max_model_len is not None:
        if max_model_len < 1:
            raise ModelLoadError(f"max_model_len must be >= 1, got {max_model_len}")
        if config.sliding_window is not None and max_model_len > config.sliding_window:
            raise ModelLoadError(
                f"max_model_len={max_model_len} exceeds the sliding window ({config.sliding_window}), "
                "which this engine does not implement"
            )
        config = dataclasses.replace(config, max_model_len=max_model_len)
    files = weight_files(path)
    try:
        model = get_model_class(config.model_type)(
            config, dtype=dtype, device=device, attn_backend=attn_backend
        )
        model.load_weights(iter_safetensors(files))
        if pack_linear:
            model.pack_linear_weights(row_inputs)
    except ValueError as exc:
        if isinstance(exc, ModelLoadError):
            raise
        raise ModelLoadError(f"{path}: {exc}") from exc
    model.eval()
    return model, config
