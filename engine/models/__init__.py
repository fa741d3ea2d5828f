"""Model implementations, looked up by the `model_type` of a Hugging Face config, and their layers: attention backends and RoPE."""

from __future__ import annotations

from weir.engine.models.llama import LlamaForCausalLM

# config.json model_type -> our implementation; the Llama family differs only in flags of ModelConfig
_MODEL_CLASSES: dict[str, type[LlamaForCausalLM]] = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "qwen3": LlamaForCausalLM,
}


def get_model_class(model_type: str) -> type[LlamaForCausalLM]:
    """The class implementing `model_type`; ValueError naming the supported ones otherwise."""
    try:
        return _MODEL_CLASSES[model_type]
    except KeyError:
        supported = ", ".join(sorted(_MODEL_CLASSES))
        raise ValueError(f"unsupported model_type {model_type!r} (supported: {supported})") from None


__all__ = ["LlamaForCausalLM", "get_model_class"]
