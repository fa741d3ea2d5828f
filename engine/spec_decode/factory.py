"""Build the drafter an `EngineConfig` asks for (None when speculation is off)."""

from __future__ import annotations

from typing import Any

import torch

from weir.engine.config import EngineConfig, ModelConfig
from weir.engine.engine_tokenizer import tokenizer_fingerprint
from weir.engine.runner.runner import ModelRunner
from weir.engine.spec_decode.draft_model_drafter import DraftModelDrafter
from weir.engine.spec_decode.drafter import Drafter
from weir.engine.spec_decode.ngram_drafter import NgramDrafter
from weir.engine.speculative_config import SpeculativeMethod


class DraftModelMismatchError(ValueError):
    """The draft model cannot draft for this target (vocabulary, tokenizer or context)."""


def build_drafter(
    config: EngineConfig,
    model_config: ModelConfig,
    tokenizer: Any,
    target: ModelRunner,
    num_blocks: int,
    attn_backend: Any,
    pack_linear: bool,
) -> Drafter | None:
    """The n-gram drafter, or a draft model loaded next to the target (its own KV tensors, the
    target's block tables); None when `config.speculative` is off.

    A draft model must share the target's tokenizer (same vocabulary and special tokens, so the
    same id means the same token), have a head of the same vocabulary size, and reach the
    engine's context length; otherwise DraftModelMismatchError says which.
    """
    spec = config.speculative
    if spec.method is SpeculativeMethod.OFF:
        return None
    if spec.method is SpeculativeMethod.NGRAM:
        return NgramDrafter(spec.ngram_min, spec.ngram_max)
    from transformers import AutoTokenizer

    from weir.engine.kv.kv_tensors import allocate_kv_caches
    from weir.engine.runner.loader import load_model, load_model_config

    path = str(spec.draft_model_path)
    max_len = min(config.scheduler.max_model_len, model_config.max_model_len)
    draft_config = load_model_config(path)
    if draft_config.vocab_size != model_config.vocab_size:
        raise DraftModelMismatchError(
            f"draft model {path} has a vocabulary of {draft_config.vocab_size} tokens, the target "
            f"{model_config.vocab_size}: a draft model must share the target's tokenizer"
        )
    draft_tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer_fingerprint(draft_tokenizer) != tokenizer_fingerprint(tokenizer):
        raise DraftModelMismatchError(
            f"draft model {path} has a different tokenizer from the target's (vocabulary or special "
            "tokens differ): a draft model must share the target's tokenizer"
        )
    if draft_config.max_model_len < max_len:
        raise DraftModelMismatchError(
            f"draft model {path} has a context of {draft_config.max_model_len} tokens, less than the "
            f"engine's {max_len}: lower --max-model-len or choose another draft model"
        )
    dtype = getattr(torch, config.dtype)
    device = torch.device(config.device)
    model, draft_config = load_model(
        path, dtype=dtype, device=device, attn_backend=attn_backend, pack_linear=pack_linear
    )
    kv_dtype = getattr(torch, config.cache.kv_dtype)
    kv_caches = allocate_kv_caches(draft_config, num_blocks, config.cache.block_size, kv_dtype, device)
    draft = ModelRunner(model, kv_caches, config.cache.block_size, device)
    chunk = config.scheduler.long_prefill_threshold or config.scheduler.max_num_batched_tokens
    return DraftModelDrafter(draft, target, max_feed_tokens=chunk)
