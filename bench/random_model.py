"""A random Llama-shaped model for benchmarks: 8 layers, hidden 512, GQA, a real tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path


def make_random_llama(out_dir: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Save (once) a random 8-layer hidden-512 GQA Llama using the tokenizer of `tokenizer_dir`."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if (out_dir / "config.json").exists():
        return out_dir
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out_dir)
    return out_dir
