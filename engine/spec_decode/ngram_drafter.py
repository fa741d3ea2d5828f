"""Prompt-lookup (n-gram) drafting: no model, just the request's own tokens.

If the last n tokens of a sequence occurred earlier in it (prompt or output), the tokens that
followed that occurrence are proposed. Longer suffixes are tried first (`ngram_max` down to
`ngram_min`) and the latest occurrence wins. Copy-heavy answers (edits, summaries, code
rewrites, quotes) are where this pays: the answer repeats spans of the prompt.

Each request keeps an index, per n, from n-gram to the end of its latest occurrence, extended
incrementally as tokens arrive: a lookup is O(ngram_max) dictionary probes, not a scan.
Plain Python; each draft token is a point mass (q = 1), so verification accepts a token with
the target's probability of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from weir.engine.output import SchedulerOutput
from weir.engine.request import Request
from weir.engine.sampling.draft_verifier import Draft


@dataclass
class _NgramIndex:
    """n -> {n-gram: end (exclusive) of its latest occurrence}, over ends < `num_indexed`."""

    ngram_min: int
    ngram_max: int
    latest: dict[int, dict[tuple[int, ...], int]] = field(default_factory=dict)
    num_indexed: int = 0  # occurrences ending before this position are indexed

    def extend(self, tokens: list[int], upto: int) -> None:
        """Index every occurrence that ends before `upto`."""
        for end in range(max(self.num_indexed, 1), upto):
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self.latest.setdefault(n, {})[tuple(tokens[end - n : end])] = end
        self.num_indexed = max(self.num_indexed, upto)

    def lookup(self, tokens: list[int], k: int) -> tuple[int, ...]:
        """Up to `k` tokens that followed the latest earlier occurrence of the longest suffix."""
        num = len(tokens)
        self.extend(tokens, num)  # ends < num: the suffix itself (ending at num) is never its own match
        for n in range(min(self.ngram_max, num - 1), self.ngram_min - 1, -1):
            end = self.latest.get(n, {}).get(tuple(tokens[num - n :]))
            if end is not None:
                return tuple(tokens[end : min(end + k, num)])
        return ()


class NgramDrafter:
    """A `Drafter` that looks drafts up in each request's own tokens."""

    def __init__(self, ngram_min: int = 2, ngram_max: int = 4) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self._indexes: dict[str, _NgramIndex] = {}

    def propose(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> dict[str, Draft]:
        for rid in out.finished_ids:
            self._indexes.pop(rid, None)
        drafts: dict[str, Draft] = {}
        for s in out.scheduled:
            if s.num_spec_slots == 0:
                continue
            req = requests.get(s.request_id)
            if req is None:
                continue
            tokens = self.draft_tokens(req, s.num_spec_slots)
            if tokens:
                drafts[s.request_id] = Draft(tokens)
        return drafts

    def draft_tokens(self, req: Request, k: int) -> tuple[int, ...]:
        """Up to `k` draft tokens for `req` (its index is kept for its next steps)."""
        index = self._indexes.get(req.request_id)
        if index is None:
            index = self._indexes[req.request_id] = _NgramIndex(self.ngram_min, self.ngram_max)
        return index.lookup(req.all_token_ids, k)

    def forget_all(self) -> None:
        self._indexes.clear()
