"""One sequence's token counts over the vocabulary, kept up to date step by step for its penalties.

Repetition, presence and frequency penalties need, each step, how often every vocabulary token
occurred in the sequence's prompt and output. Counting them again every step costs time that
grows with the sequence (a 60,000-token prompt took ~1 s of Python per step on this host), and it
was spent inside the step that every request of the batch waits for: one tenant's long penalised
prompt slowed every other tenant's tokens. `TokenCounts` counts the prompt once and adds only the
tokens appended since the last step, so a row's cost is O(vocabulary + new tokens) whatever its
length. The runner keeps one per penalised request and forgets it when the request ends.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def count_tokens(token_ids: Sequence[int], vocab_size: int, device: torch.device) -> torch.Tensor:
    """How many times each id occurs in `token_ids`, as a [vocab_size] float32 tensor; ids the
    vocabulary does not cover are not counted."""
    if not token_ids:
        return torch.zeros(vocab_size, dtype=torch.float32, device=device)
    ids = torch.tensor(token_ids, dtype=torch.long, device=device).clamp_(0, vocab_size)  # [n]
    return torch.bincount(ids, minlength=vocab_size + 1)[:vocab_size].to(torch.float32)  # [vocab]


class TokenCounts:
    """The prompt's and the output's token counts of one sequence ([vocab] float32 each).

    The vocabulary is the logits' width, given with each call; a different width starts over.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._vocab_size = 0
        self._prompt: torch.Tensor | None = None  # counted on first use
        self._output = torch.zeros(0, dtype=torch.float32, device=device)
        self._num_output = 0  # output tokens counted so far

    def _bind(self, vocab_size: int) -> None:
        if vocab_size != self._vocab_size:
            self._vocab_size = vocab_size
            self._prompt = None
            self._output = torch.zeros(vocab_size, dtype=torch.float32, device=self.device)  # [vocab]
            self._num_output = 0

    def prompt(self, prompt_token_ids: Sequence[int], vocab_size: int) -> torch.Tensor:
        """The prompt's counts ([vocab]); the prompt never changes, so it is counted once."""
        self._bind(vocab_size)
        if self._prompt is None:
            self._prompt = count_tokens(prompt_token_ids, vocab_size, self.device)
        return self._prompt

    def output(self, output_token_ids: Sequence[int], vocab_size: int) -> torch.Tensor:
        """The output's counts ([vocab]), after counting the tokens appended since the last call.

        An output shorter than what was counted (never the case for one sequence) is counted again.
        """
        self._bind(vocab_size)
        num = len(output_token_ids)
        if num < self._num_output:
            self._output = count_tokens(output_token_ids, vocab_size, self.device)
        elif num > self._num_output:
            self._output += count_tokens(output_token_ids[self._num_output :], vocab_size, self.device)
        self._num_output = num
        return self._output
