"""Factories for tiny random Hugging Face models (and a tiny tokenizer) saved to a folder.

Engine tests import these: `make_tiny_model(tmp_path, arch="qwen3", num_kv_heads=1)` returns a
folder that looks like a real HF checkpoint (config.json, generation_config.json,
model.safetensors, tokenizer files with a chat template), built from a fixed seed so that two
calls with the same arguments give the same weights.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from weir.engine.models.attention import AttentionMetadata

Arch = Literal["llama", "mistral", "qwen2", "qwen3"]

# ChatML, the format of SmolLM2 and Qwen
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you today? I am fine, thank you.",
    "A tenant sends a request to the gateway, which admits it or rejects it at once.",
    "The scheduler runs decode tokens first, then chunked prefill within the token budget.",
    "Paged attention stores keys and values in fixed-size blocks of the cache.",
    "user assistant system: what is the capital of France? Paris is the capital of France.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
)


def make_tiny_tokenizer(out_dir: Path, vocab_size: int = 320) -> int:
    """Train a byte-level BPE tokenizer on a few sentences, save it with a chat template.

    Byte-level means any text encodes (unknown words fall back to bytes). Returns the number of
    tokens, specials included.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return len(fast)


def _hf_config(
    arch: Arch,
    vocab_size: int,
    hidden_size: int,
    intermediate_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_position_embeddings: int,
    rope_parameters: dict[str, Any],
    tie: bool,
    initializer_range: float,
    eos_token_id: int,
    bos_token_id: int,
    extra: dict[str, Any],
) -> Any:
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    config_class = {
        "llama": LlamaConfig,
        "mistral": MistralConfig,
        "qwen2": Qwen2Config,
        "qwen3": Qwen3Config,
    }[arch]
    kwargs: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=rope_parameters,
        tie_word_embeddings=tie,
        initializer_range=initializer_range,
        rms_norm_eps=1e-6,
        eos_token_id=eos_token_id,
        bos_token_id=bos_token_id,
        pad_token_id=bos_token_id,
    )
    if arch == "mistral":
        kwargs["sliding_window"] = None
    kwargs.update(extra)
    return config_class(**kwargs)


def make_tiny_model(
    out_dir: Path,
    arch: Arch = "llama",
    *,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    intermediate_size: int = 128,
    max_position_embeddings: int = 256,
    rope_theta: float = 10000.0,
    rope_scaling: dict[str, Any] | None = None,
    tie: bool = False,
    seed: int = 0,
    initializer_range: float = 0.1,
    vocab_size: int | None = None,
    extra_config: dict[str, Any] | None = None,
) -> Path:
    """Save a random `arch` model with a tokenizer into `out_dir` and return `out_dir`.

    `rope_scaling` is merged into HF's `rope_parameters` (e.g. {"rope_type": "yarn", "factor": 4.0}).
    `vocab_size` defaults to the tokenizer's size, so every id the model emits decodes.
    Norm weights and biases are perturbed away from HF's 1/0 init so that loading them wrongly
    shows up in the logits. The global torch RNG state is left untouched.
    """
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    num_tokens = make_tiny_tokenizer(out_dir)
    vocab = vocab_size or num_tokens
    ids = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}  # specials come first in BPE training
    rope_parameters: dict[str, Any] = {"rope_type": "default", "rope_theta": rope_theta}
    rope_parameters.update(rope_scaling or {})
    config = _hf_config(
        arch,
        vocab_size=vocab,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads or num_heads,
        head_dim=head_dim or hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=rope_parameters,
        tie=tie,
        initializer_range=initializer_range,
        eos_token_id=ids["<|im_end|>"],
        bos_token_id=ids["<|endoftext|>"],
        extra=extra_config or {},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.mul_(1 + 0.2 * torch.randn_like(param))
                elif name.endswith("bias"):
                    param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(out_dir)
    # Chat models list their end-of-turn token only in generation_config.json: mimic that
    generation = {
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "do_sample": False,
    }
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return out_dir


def load_hf_model(path: Path, dtype: torch.dtype = torch.float32) -> Any:
    """The reference: transformers' own implementation of the saved model, in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    return model.eval()


def build_metadata(
    block_tables: Sequence[Sequence[int]],
    num_computed: Sequence[int],
    num_new: Sequence[int],
    block_size: int,
    device: torch.device | str = "cpu",
) -> tuple[AttentionMetadata, torch.Tensor]:
    """Hand-built AttentionMetadata for sequences laid back to back, plus their positions.

    Sequence i already has `num_computed[i]` tokens in its cache blocks `block_tables[i]` and
    adds `num_new[i]` tokens this step. Returns (metadata, positions [num_tokens] int64).
    """
    slots: list[int] = []
    positions: list[int] = []
    starts = [0]
    seq_lens: list[int] = []
    for table, done, new in zip(block_tables, num_computed, num_new, strict=True):
        for pos in range(done, done + new):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
            positions.append(pos)
        starts.append(starts[-1] + new)
        seq_lens.append(done + new)
    max_blocks = max(len(t) for t in block_tables)
    padded = [list(t) + [0] * (max_blocks - len(t)) for t in block_tables]
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
        query_start_loc_cpu=tuple(starts),
        seq_lens_cpu=tuple(seq_lens),
        max_query_len=max(num_new),
        max_seq_len=max(seq_lens),
        block_size=block_size,
    )
    return metadata, torch.tensor(positions, dtype=torch.int64, device=device)
