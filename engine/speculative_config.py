"""Speculative decoding settings: the drafter, k, and when a step is too large to speculate."""

from __future__ import annotations

import enum
from dataclasses import dataclass

# Verify tokens of one step (decodes x (1 + k)) up to which verifying stays cheap: measured with
# bench/experiments/spec_decode.py (crossover) for SmolLM2 on this repository's 2-core CPU, a verify
# forward costs <= 2x a decode forward up to 2 decodes (1.05x at 1, 1.38x at 2, 2.31x at 4), so
# 2 x (1 + 4). docs/benchmarks.md has the figures; other machines should measure their own.
DEFAULT_MAX_VERIFY_TOKENS = 10
MAX_SPECULATIVE_TOKENS = 16


class SpeculativeMethod(enum.Enum):
    """Where draft tokens come from."""

    OFF = "off"
    NGRAM = "ngram"  # prompt lookup: copy what followed the latest earlier occurrence of the suffix
    DRAFT = "draft"  # a small model sharing the target's tokenizer


@dataclass(frozen=True)
class SpeculativeConfig:
    """How the engine speculates. `method` OFF: never (the default)."""

    method: SpeculativeMethod = SpeculativeMethod.OFF
    num_speculative_tokens: int = 4  # k: most draft tokens verified per request and step
    draft_model_path: str | None = None  # with DRAFT
    ngram_min: int = 2  # shortest suffix the n-gram drafter looks up
    ngram_max: int = 4  # longest suffix, tried first
    # A step whose decodes would verify more tokens than this runs without speculation: past it
    # the forward is compute-bound and verifying drafts costs more than it saves.
    max_verify_tokens: int = DEFAULT_MAX_VERIFY_TOKENS

    def __post_init__(self) -> None:
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"num_speculative_tokens must be in [1, {MAX_SPECULATIVE_TOKENS}], "
                f"got {self.num_speculative_tokens}"
            )
        if (self.method is SpeculativeMethod.DRAFT) != bool(self.draft_model_path):
            raise ValueError("draft_model_path is required with the draft method, and only with it")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")
        if self.max_verify_tokens < 2:
            raise ValueError(f"max_verify_tokens must be >= 2, got {self.max_verify_tokens}")

    @property
    def enabled(self) -> bool:
        return self.method is not SpeculativeMethod.OFF

    @classmethod
    def parse(cls, spec: str, num_speculative_tokens: int = 4) -> SpeculativeConfig:
        """From the `--speculative` syntax: `off`, `ngram` or `draft:<path>`. Raises ValueError."""
        text = spec.strip()
        if text.startswith("draft:"):
            path = text[len("draft:") :].strip()
            if not path:
                raise ValueError("speculative: draft:<path> needs the draft model's path")
            return cls(SpeculativeMethod.DRAFT, num_speculative_tokens, draft_model_path=path)
        try:
            method = SpeculativeMethod(text)
        except ValueError:
            raise ValueError(f"speculative must be off, ngram or draft:<path>, got {spec!r}") from None
        if method is SpeculativeMethod.DRAFT:
            raise ValueError("speculative: draft:<path> needs the draft model's path")
        return cls(method, num_speculative_tokens)

    def describe(self) -> str:
        """The `--speculative` form of this config."""
        if self.method is SpeculativeMethod.DRAFT:
            return f"draft:{self.draft_model_path}"
        return self.method.value
