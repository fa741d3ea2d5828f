"""Random Llama-shaped models for benchmarks (default 8 layers, hidden 512, GQA), with a real tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path


def make_random_llama(
    out_dir: Path,
    tokenizer_dir: Path,
    *,
    num_layers: int = 8,
    hidden_size: int = 512,
    num_heads: int = 8,
    num_kv_heads: int = 2,
    seed: int = 0,
) -> Path:
    """Save (once) a random GQA Llama (default: 8 layers, hidden 512) with `tokenizer_dir`'s tokenizer.

    Scheduling, admission and caching do not care what the tokens say, so a random model of a
    chosen size stands in for a real one when only its shape matters.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if (out_dir / "config.json").exists():
        return out_dir
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
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


def make_tiny_llama(out_dir: Path, tokenizer_dir: Path) -> Path:
    """Save (once) a random 2-layer, hidden-256 Llama with a real tokenizer.

    On a small, shared CPU this model keeps engine steps short enough for a 2 s TTFT objective
    to be meaningful.
    """
    return make_random_llama(
        out_dir, tokenizer_dir, num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2
    )
