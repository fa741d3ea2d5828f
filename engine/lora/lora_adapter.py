"""Read and check a LoRA adapter in PEFT format: `adapter_config.json` + `adapter_model.safetensors`.

An adapter is untrusted input (an operator registers it, a customer may have trained it), so
everything is checked before a byte of it reaches a slot: the folder must lie under the
configured adapter directory (symlinks resolved), the config must be a plain LoRA (no DoRA, no
per-module ranks, no extra trained modules, no biases), the rank at most the configured maximum,
every tensor a `lora_A`/`lora_B` of one of the seven Llama projections with exactly the shape
the base model implies, and every value finite. Any failure raises `AdapterLoadError` naming
the problem; nothing is half-loaded.

The result keeps PEFT's factors as they are, A `[r, in]` and B `[out, r]`, with the scaling
(`lora_alpha / r`, or `/ sqrt(r)` for rsLoRA) kept apart: the delta of a projection is
`scaling * (x A^T) B^T`, what PEFT's merged weight `W + scaling * B A` computes.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from weir.engine.config import ModelConfig
from weir.engine.lora.lora_types import AdapterLoadError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# The projections an adapter may target, in the order the fused projections hold them.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MAX_CONFIG_BYTES = 1 << 20
_TENSOR_NAME = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\."
    r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.lora_([AB])\.weight$"
)
_PARENT = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


def projection_shape(config: ModelConfig, target: str) -> tuple[int, int]:
    """(in_features, out_features) of one of the base model's projections."""
    q_size = config.num_heads * config.head_dim
    kv_size = config.num_kv_heads * config.head_dim
    h, i = config.hidden_size, config.intermediate_size
    shapes = {
        "q_proj": (h, q_size),
        "k_proj": (h, kv_size),
        "v_proj": (h, kv_size),
        "o_proj": (q_size, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    return shapes[target]


@dataclass(frozen=True)
class LoraAdapter:
    """A checked adapter in host memory: per (layer, projection) its factors A `[r, in]` and
    B `[out, r]`, in float32. Projections it does not train are absent (their delta is zero)."""

    name: str
    path: str
    rank: int
    scaling: float
    fingerprint: str  # digest of the config and weights: part of the prefix-cache key
    base_model: str
    weights: Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def target_modules(self) -> tuple[str, ...]:
        present = {target for _, target in self.weights}
        return tuple(t for t in TARGET_MODULES if t in present)

    @property
    def num_bytes(self) -> int:
        return sum(
            a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values()
        )


def resolve_adapter_path(path: str | Path, adapter_dir: str | Path | None) -> Path:
    """The adapter folder, resolved, if it lies under `adapter_dir`; else AdapterLoadError.

    Symlinks are resolved first, so a link inside the directory that points outside is refused.
    """
    if adapter_dir is None:
        raise AdapterLoadError("no adapter directory is configured: adapters cannot be loaded from disk")
    root = Path(adapter_dir).resolve()
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = root / candidate
    resolved = candidate.resolve()
    if not resolved.is_relative_to(root):
        raise AdapterLoadError(f"adapter path {str(path)!r} is outside the adapter directory")
    if not resolved.is_dir():
        raise AdapterLoadError(f"adapter path {str(path)!r} is not a folder")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        f = (resolved / name).resolve()
        if not f.is_relative_to(root):
            raise AdapterLoadError(f"{name} of adapter {str(path)!r} links outside the adapter directory")
        if not f.is_file():
            raise AdapterLoadError(f"adapter {str(path)!r} has no {name}")
    return resolved


def _read_config(folder: Path) -> dict[str, Any]:
    raw = (folder / CONFIG_FILE).read_bytes()
    if len(raw) > MAX_CONFIG_BYTES:
        raise AdapterLoadError(f"{CONFIG_FILE} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        config = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterLoadError(f"{CONFIG_FILE} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterLoadError(f"{CONFIG_FILE} must hold a JSON object")
    return config


def _check_config(config: dict[str, Any], max_rank: int) -> tuple[int, float]:
    """(rank, scaling) of a plain LoRA config, or AdapterLoadError."""
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterLoadError(f"peft_type {config.get('peft_type')!r} is not LORA")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterLoadError(f"adapter rank r must be an integer >= 1, got {rank!r}")
    if rank > max_rank:
        raise AdapterLoadError(f"adapter rank {rank} is over the configured maximum {max_rank}")
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise AdapterLoadError(f"lora_alpha must be a finite number, got {alpha!r}")
    for key in ("rank_pattern", "alpha_pattern"):
        if config.get(key):
            raise AdapterLoadError(f"{key} (per-module ranks) is not supported")
    if config.get("use_dora"):
        raise AdapterLoadError("DoRA adapters (use_dora) are not supported")
    if config.get("modules_to_save"):
        raise AdapterLoadError("modules_to_save (extra trained modules) is not supported")
    if config.get("bias", "none") != "none":
        raise AdapterLoadError(f"bias {config.get('bias')!r} is not supported, only 'none'")
    if config.get("fan_in_fan_out"):
        raise AdapterLoadError("fan_in_fan_out is not supported for Llama-family models")
    targets = config.get("target_modules")
    if isinstance(targets, list) and not set(targets) <= set(TARGET_MODULES):
        extra = sorted(set(map(str, targets)) - set(TARGET_MODULES))
        raise AdapterLoadError(f"target_modules {extra} are not supported (only {', '.join(TARGET_MODULES)})")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(scaling)


def _same_base(adapter_base: str, accepted: frozenset[str]) -> bool:
    # Compared by last path component: "HuggingFaceTB/SmolLM2-135M-Instruct" and a local
    # ".../SmolLM2-135M-Instruct" are the same base; shapes are checked regardless.
    def tail(name: str) -> str:
        return name.rstrip("/").rsplit("/", 1)[-1].lower()

    return tail(adapter_base) in {tail(a) for a in accepted if a}


def load_adapter(
    name: str,
    path: str | Path,
    adapter_dir: str | Path | None,
    model_config: ModelConfig,
    max_rank: int,
    base_models: frozenset[str] = frozenset(),
) -> LoraAdapter:
    """Read and check the PEFT adapter at `path` for a base model of `model_config`.

    `base_models`: the names the base model goes by (its folder, its hub name); an adapter whose
    `base_model_name_or_path` is set and matches none of them is refused. Empty: not checked.
    """
    from safetensors import SafetensorError, safe_open

    folder = resolve_adapter_path(path, adapter_dir)
    config = _read_config(folder)
    rank, scaling = _check_config(config, max_rank)
    adapter_base = config.get("base_model_name_or_path") or ""
    if not isinstance(adapter_base, str):
        raise AdapterLoadError("base_model_name_or_path must be a string")
    if adapter_base and base_models and not _same_base(adapter_base, base_models):
        raise AdapterLoadError(
            f"adapter was trained for base model {adapter_base!r}, not this one ({', '.join(sorted(base_models))})"
        )
    digest = hashlib.sha256()
    digest.update((folder / CONFIG_FILE).read_bytes())
    with open(folder / WEIGHTS_FILE, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    factors: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(folder / WEIGHTS_FILE), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has keys(), not iteration)
                m = _TENSOR_NAME.match(key)
                if m is None:
                    raise AdapterLoadError(f"unexpected tensor {key!r} in {WEIGHTS_FILE}")
                layer, target, which = int(m.group(1)), m.group(2), m.group(3)
                if f".{_PARENT[target]}.{target}." not in key:
                    raise AdapterLoadError(f"unexpected tensor {key!r} in {WEIGHTS_FILE}")
                if layer >= model_config.num_layers:
                    raise AdapterLoadError(
                        f"tensor {key!r} is for layer {layer}; the base model has {model_config.num_layers} layers"
                    )
                factors.setdefault((layer, target), {})[which] = f.get_tensor(key)
    except SafetensorError as exc:
        raise AdapterLoadError(f"{WEIGHTS_FILE} is not a valid safetensors file: {exc}") from None
    if not factors:
        raise AdapterLoadError(f"{WEIGHTS_FILE} holds no LoRA tensors")
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, target), pair in sorted(factors.items()):
        where = f"layer {layer} {target}"
        if set(pair) != {"A", "B"}:
            raise AdapterLoadError(f"{where} has lora_{''.join(pair)} without its pair")
        a, b = pair["A"], pair["B"]
        if not (a.is_floating_point() and b.is_floating_point()):
            raise AdapterLoadError(f"{where}: LoRA weights must be floating point, got {a.dtype}/{b.dtype}")
        in_features, out_features = projection_shape(model_config, target)
        if tuple(a.shape) != (rank, in_features) or tuple(b.shape) != (out_features, rank):
            raise AdapterLoadError(
                f"{where}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)}, the base model and rank "
                f"{rank} imply {(rank, in_features)} / {(out_features, rank)}"
            )
        a32, b32 = a.to(torch.float32), b.to(torch.float32)
        if not (torch.isfinite(a32).all() and torch.isfinite(b32).all()):
            raise AdapterLoadError(f"{where}: LoRA weights contain NaN or Inf")
        weights[(layer, target)] = (a32.contiguous(), b32.contiguous())
    return LoraAdapter(
        name=name,
        path=str(folder),
        rank=rank,
        scaling=scaling,
        fingerprint=digest.hexdigest()[:32],
        base_model=adapter_base,
        weights=weights,
    )
