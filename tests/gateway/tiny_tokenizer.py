"""A tiny word-level Hugging Face tokenizer with a ChatML chat template, built in memory.

Every word the fake engine generates is in its vocabulary, so logprob token strings decode.
"""

from __future__ import annotations

from typing import Any

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The words the fake engine writes; the prompt words of the tests are added to the vocabulary too.
WORDS = (
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon",
)  # fmt: skip
PROMPT_WORDS = ("hello", "world", "say", "something", "user", "assistant", "system", "you", "are", "helpful",
                "count", "to", "ten", "please", "story", "tell", "me", "a")  # fmt: skip


def build_tokenizer() -> Any:
    """A `PreTrainedTokenizerFast`: specials first, then WORDS (ids 4..23), then prompt words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *WORDS, *PROMPT_WORDS))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
        chat_template=CHAT_TEMPLATE,
    )


def word_token_id(word: str) -> int:
    """The id of one of WORDS."""
    return len(SPECIAL_TOKENS) + WORDS.index(word)
