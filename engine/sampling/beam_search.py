"""Beam search as transformers does it, one decoding step at a time, without tensors.

The engine runs each live beam as a sequence in the batch and hands this class the best
(token, logprob) pairs of every beam; this class picks the next beams and keeps the finished
hypotheses. The arithmetic mirrors `GenerationMixin._beam_search` (transformers 4.5x / 5.x),
float32 rounding included, so the same logits give the same beams:

- candidates are ranked by the running sum of log-probabilities (float32), flattened over
  beams, and the best `max(2, 1 + number of end tokens) * beam_width` are kept;
- a candidate ending in an end token, or reaching `max_tokens`, finishes; it joins the finished
  hypotheses only when it ranks among the first `beam_width`, scored `sum / length ** length_penalty`
  where length counts the generated tokens, the end token included;
- the next live beams are the best `beam_width` unfinished candidates;
- the search stops at `max_tokens`, or per `EarlyStopping` (transformers' `early_stopping`).

Each beam only needs its own best `beam_width + number of end tokens` candidates: the global
ranking is settled once `beam_width` unfinished candidates are found, and no beam can place more
than that many before it. Plain Python, no torch.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass

_F32 = struct.Struct("f")


def _f32(x: float) -> float:
    """Round a Python float to float32, as a float32 tensor op would store it."""
    return float(_F32.unpack(_F32.pack(x))[0])


class EarlyStopping(enum.Enum):
    """When the search may end before `max_tokens` (transformers' `early_stopping`)."""

    HEURISTIC = "heuristic"  # False: stop once no live beam can beat the worst finished one at its length
    ON_FULL = "on_full"  # True: stop as soon as `beam_width` hypotheses have finished
    NEVER = "never"  # "never": like HEURISTIC, but with a positive length penalty assume max_tokens


@dataclass(frozen=True)
class Beam:
    """A live beam: its generated tokens and their summed log-probability (float32)."""

    token_ids: tuple[int, ...]
    sum_logprobs: float


@dataclass(frozen=True)
class BeamChoice:
    """One beam of the next step: `parent` (index into the current live beams) + `token_id`."""

    parent: int
    token_id: int
    sum_logprobs: float


@dataclass(frozen=True)
class Hypothesis:
    """A finished sequence and its length-penalised score."""

    token_ids: tuple[int, ...]
    score: float
    sum_logprobs: float
    ended: bool  # True when it ended with an end token (not by reaching max_tokens)


class BeamSearch:
    """The state of one beam search: live beams and finished hypotheses."""

    def __init__(
        self,
        beam_width: int,
        max_tokens: int,
        end_token_ids: Sequence[int],
        length_penalty: float = 1.0,
        early_stopping: EarlyStopping = EarlyStopping.HEURISTIC,
    ) -> None:
        if beam_width < 1:
            raise ValueError(f"beam_width must be >= 1, got {beam_width}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.beam_width = beam_width
        self.max_tokens = max_tokens
        self.end_token_ids = frozenset(end_token_ids)
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.num_keep = max(2, 1 + len(self.end_token_ids)) * beam_width
        self.live: list[Beam] = [Beam((), 0.0)]
        self.finished: list[Hypothesis] = []
        self.done = False

    @property
    def num_candidates_per_beam(self) -> int:
        """How many best (token, logprob) pairs each live beam must supply."""
        return self.beam_width + len(self.end_token_ids)

    def _penalised(self, sum_logprobs: float, length: int) -> float:
        return _f32(sum_logprobs / _f32(float(length) ** self.length_penalty))

    def step(self, top_logprobs: Sequence[Sequence[tuple[int, float]]]) -> list[BeamChoice]:
        """Advance by one token. `top_logprobs[i]`: beam i's best (token id, logprob), best first.

        Returns the next live beams (empty once `done`).
        """
        if self.done:
            raise ValueError("the beam search is done")
        if len(top_logprobs) != len(self.live):
            raise ValueError(f"expected candidates for {len(self.live)} beams, got {len(top_logprobs)}")
        k = self.beam_width
        length = len(self.live[0].token_ids) + 1  # generated tokens after this step
        at_max = length >= self.max_tokens
        m = self.num_candidates_per_beam
        candidates: list[tuple[float, int, int]] = []  # (sum, beam, token)
        for b, (beam, top) in enumerate(zip(self.live, top_logprobs, strict=True)):
            for token_id, logprob in top[:m]:
                candidates.append((_f32(beam.sum_logprobs + logprob), b, token_id))
        # Best first; ties go to the lower flat index (beam, then token), as topk tends to.
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
        candidates = candidates[: self.num_keep]

        ended = [at_max or c[2] in self.end_token_ids for c in candidates]
        new_finished = [
            Hypothesis(self.live[b].token_ids + (t,), self._penalised(s, length), s, t in self.end_token_ids)
            for (s, b, t), e in zip(candidates[:k], ended[:k], strict=True)
            if e
        ]
        if new_finished:
            # Earlier hypotheses win ties (they come first in transformers' merge).
            merged = self.finished + new_finished
            merged.sort(key=lambda h: -h.score)
            self.finished = merged[:k]

        choices = [BeamChoice(b, t, s) for (s, b, t), e in zip(candidates, ended, strict=True) if not e][:k]
        if all(ended) or not choices or self._should_stop(choices[0].sum_logprobs, length):
            self.done = True
            self.live = []
            return []
        self.live = [Beam(self.live[c.parent].token_ids + (c.token_id,), c.sum_logprobs) for c in choices]
        return choices

    def _should_stop(self, best_live_sum: float, length: int) -> bool:
        if len(self.finished) < self.beam_width:
            return False
        if self.early_stopping is EarlyStopping.ON_FULL:
            return True
        if self.early_stopping is EarlyStopping.NEVER and self.length_penalty > 0:
            length = self.max_tokens
        best_possible = self._penalised(best_live_sum, length)
        return not best_possible > min(h.score for h in self.finished)

    def best(self, n: int) -> list[Hypothesis]:
        """The `n` best finished hypotheses, best first."""
        return self.finished[:n]
