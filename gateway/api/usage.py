"""The token counts of one HTTP request, and their OpenAI `usage` shape.

Plain data that the answer formatters (OpenAI, Anthropic) read and the accounting
(weir.gateway.admission.accounting) settles and records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Usage:
    """Token counts of one HTTP request, over all its prompts and choices.

    `completion_tokens` counts the tokens returned, as OpenAI's `usage` does; what was computed,
    and is billed, can be more: beam search decodes `beam_width` beams and returns `n` of them.
    `computed_prompt_tokens` is the prompt work done (a request cancelled during its prefill is
    billed the part computed, prefix-cache hits included, though no token came).
    """

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    computed_completion_tokens: int | None = None  # None: the same as completion_tokens
    # None: the whole prompt when an output token came, else nothing (no report of the work).
    computed_prompt_tokens: int | None = None
    # Speculative decoding: draft tokens verified for the request, and of them accepted.
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def billed_completion_tokens(self) -> int:
        """Output tokens computed for the request: what settlement and usage records charge."""
        if self.computed_completion_tokens is None:
            return self.completion_tokens
        return max(self.completion_tokens, self.computed_completion_tokens)

    @property
    def billed_prompt_tokens(self) -> int:
        """Prompt tokens computed for the request: what settlement and usage records charge."""
        if self.computed_prompt_tokens is not None:
            return min(self.computed_prompt_tokens, self.prompt_tokens)
        return self.prompt_tokens if self.billed_completion_tokens > 0 else 0

    @property
    def billed_total_tokens(self) -> int:
        return self.billed_prompt_tokens + self.billed_completion_tokens

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI `usage` object."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            **self._speculation(),
        }

    def _speculation(self) -> dict[str, Any]:
        """OpenAI's prediction counts, for a request that speculated: drafted = accepted + rejected."""
        if not self.draft_tokens:
            return {}
        return {
            "completion_tokens_details": {
                "accepted_prediction_tokens": self.accepted_draft_tokens,
                "rejected_prediction_tokens": self.draft_tokens - self.accepted_draft_tokens,
            }
        }
