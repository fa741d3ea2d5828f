"""The engine's view of the model's tokenizer: its fingerprint and the engine thread's own copy."""

from __future__ import annotations

import copy
import hashlib
import logging
from typing import Any

logger = logging.getLogger("weir.engine")


def tokenizer_fingerprint(tokenizer: object) -> str:
    """A digest of the vocabulary and special tokens: a different tokenizer never shares a cache."""
    h = hashlib.sha256()
    vocab: dict[str, int] = getattr(tokenizer, "get_vocab", dict)()
    for tok, idx in sorted(vocab.items(), key=lambda kv: kv[1]):
        h.update(f"{idx}:{tok}\n".encode())
    h.update(repr(getattr(tokenizer, "all_special_ids", [])).encode())
    return h.hexdigest()[:16]


def own_tokenizer(tokenizer: Any) -> Any:
    """A private copy of the tokenizer for the engine thread.

    A Hugging Face fast tokenizer is not safe to share between threads (its Rust object can
    panic with "Already borrowed" when one thread changes its truncation or padding while
    another uses it); the gateway encodes on its threads, the engine thread decodes on its copy.
    """
    if tokenizer is None:
        return None
    try:
        return copy.deepcopy(tokenizer)
    except Exception:  # a tokenizer that cannot be copied is shared, as before
        logger.warning("could not copy the tokenizer for the engine thread; sharing it", exc_info=True)
        return tokenizer
