"""Small in-memory tokenizers whose tokens split multi-byte characters, for detokenizer tests.

`byte_level_tokenizer()` is a byte-level BPE (the GPT-2 / SmolLM2 / Llama-3 family) trained on a
few sentences full of accents, CJK and emoji, with a vocabulary small enough that most of those
characters span two or more tokens. `metaspace_tokenizer()` is a SentencePiece-style BPE
(Llama-2 / Mistral family: "▁" for spaces, byte fallback, leading space dropped on decode).
Both are cached: building them takes a few milliseconds, but hypothesis calls them often.
"""

from __future__ import annotations

import json
from functools import cache

from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you today? I am fine, thank you.",
    "Café crème, naïve façade, über Ärger, señor, Ünïcödé.",
    "日本語のテキストを書きます。東京は大きい都市です。",
    "中文字符测试，你好世界。",
    "Привет, мир! Как дела?",
    "Emoji: 😀 🎉 👍🏽 🚀 ❤️ and € 100, £ 50, ¥ 1000.",
    "Stop here. STOP. The end.",
)


@cache
def byte_level_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with ChatML special tokens; EOS is <|im_end|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )


@cache
def metaspace_tokenizer(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE: "▁" marks spaces, unknown characters fall back to byte tokens."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    # Train on ASCII only so accented and CJK characters go through byte fallback.
    tokenizer.train_from_iterator([line for line in CORPUS if line.isascii()], trainer)
    # Byte tokens are ordinary vocabulary entries (not special: skip_special_tokens keeps them),
    # as in the Llama-2 conversion; the trainer cannot add them, so edit the serialised model.
    data = json.loads(tokenizer.to_str())
    vocab = data["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    data["model"]["byte_fallback"] = True
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
