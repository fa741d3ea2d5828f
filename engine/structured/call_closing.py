"""Room to close a forced tool call: an answer under `tool_choice: required` ends complete.

A grammar guarantees the shape of what a model writes, not that it finishes before
`max_tokens`: a sampled model may still be listing calls when its budget runs out, and the
answer would be a partial array. For a tool-call grammar the engine keeps room to close it:

- `closing_path` walks a fork of the matcher to an end of the grammar: forced text (keys, the
  function's name) in the backend's jump-forward tokens, otherwise one single-character token at
  a time, trying the characters that close JSON first (`]`, `}`, `"`, a digit, `null`...).
  The walk is deterministic, so after taking its first token the rest of the path is the walk
  from the next state: its length only shrinks while the path is followed.
- `ClosingConstraint` is the matcher of such a request. While the budget left is larger than
  the path plus the stop token, it admits what the grammar admits; when they are equal it admits
  only the path's next token (then the stop token), so the model writes the shortest closing the
  walk found, and the answer ends with `stop` and complete calls.
- `ClosableConstraint.min_tokens` is that length from the grammar's start, plus the stop token:
  the gateway refuses a `max_tokens` below it with a 400 naming `max_tokens`, so the invariant
  holds from the first token.
- A token off the path can make the path longer (a `,` that starts another call, the letter that
  picks a costlier function). So once the budget left is within `reserve` (the longest of the
  functions' shortest calls) of the path, only the path is followed, except that text inside a
  free string (which leaves the path as it is) may go on. A single choice that costs more than
  the reserve (a deep optional object chosen late) can still run out: the answer then ends
  with `length`, as before.

The walk costs a few matcher steps per token of the path; it runs again only when the model's
token leaves the path. Nothing here imports torch beyond the bitmask the sampler hands in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from weir.engine.structured.constraints import CompiledConstraint, TokenConstraint

# Tried in this order at each step of the walk: what closes a JSON value first, then what opens
# the shortest values, then separators and letters (enum and const strings).
CLOSING_CHARACTERS = ']}"0123456789nft-.[{,: abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_'
MAX_CLOSING_TOKENS = 4096  # a walk longer than this: the grammar has no short end (refused)
_BITS = 32
_STRUCTURAL = frozenset('"{}[],:\\')


@dataclass(frozen=True)
class ClosingAlphabet:
    """The single-character tokens of `CLOSING_CHARACTERS` in one vocabulary, in their order, and
    the tokens without a JSON structural character (`plain_ids`: they continue a string, number or
    literal, and never open a new value)."""

    token_ids: tuple[int, ...]
    plain_ids: tuple[int, ...] = ()
    quote_id: int = -1  # `"`, tried first inside a free string (where `]` and `}` are content)
    probe_id: int = -1  # `#`: admitted inside a free string, never outside one

    def order(self, in_string: bool) -> tuple[int, ...]:
        if in_string and self.quote_id >= 0:
            return (self.quote_id, *self.token_ids)
        return self.token_ids

    @classmethod
    def of(cls, tokenizer: Any) -> ClosingAlphabet:
        ids = []
        for char in CLOSING_CHARACTERS:
            encoded = tokenizer.encode(char, add_special_tokens=False)
            if len(encoded) == 1 and tokenizer.decode(encoded) == char:
                ids.append(int(encoded[0]))
        # The vocabulary's own strings, not decoded (decoding 49k tokens one by one takes seconds):
        # printable ASCII is itself in byte-level and SentencePiece vocabularies alike, and a
        # byte-fallback token (`<0x22>`) counts as structural.
        special = set(getattr(tokenizer, "all_special_ids", ()))
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        plain = tuple(
            i
            for i, piece in enumerate(pieces)
            if piece
            and i not in special
            and not _STRUCTURAL.intersection(piece)
            and not piece.startswith("<0x")
        )
        quote, probe = (tokenizer.encode(c, add_special_tokens=False) for c in '"#')
        return cls(
            tuple(ids),
            plain,
            int(quote[0]) if len(quote) == 1 else -1,
            int(probe[0]) if len(probe) == 1 else -1,
        )


@dataclass(frozen=True)
class ClosableConstraint(CompiledConstraint):
    """A compiled tool-call grammar that the engine closes before `max_tokens` (`ClosingConstraint`).

    `min_tokens` is the fewest output tokens that hold its closing walk from the start and the
    stop token: a smaller `max_tokens` cannot be served complete.
    """

    alphabet: ClosingAlphabet = ClosingAlphabet(())
    min_tokens: int = 1
    # Budget kept beyond the closing path before only the path is followed: the longest of the
    # shortest complete answers that start with one of the `openings` given to `closable`.
    reserve: int = 1
    plain_bits: Any = field(default=None, compare=False, repr=False)  # int32 [words], `plain_ids` packed
    plain_set: frozenset[int] = field(default=frozenset(), compare=False, repr=False)

    def closing_matcher(self, max_tokens: int) -> ClosingConstraint:
        """A fresh matcher that keeps room to close within `max_tokens` output tokens."""
        return ClosingConstraint(self, max_tokens)


def closable(
    compiled: CompiledConstraint, alphabet: ClosingAlphabet, openings: Sequence[str] = ()
) -> ClosableConstraint | None:
    """`compiled` as a `ClosableConstraint`, or None when its walk finds no end within
    `MAX_CLOSING_TOKENS` tokens. `openings` are the texts that commit an answer to its costliest
    choices (`[{"name": "<function>"` for each function): the reserve is the longest of them
    with its closing walk, so that a choice the model makes while the budget is not yet tight
    cannot leave it without room to close."""
    probe = ClosableConstraint(compiled.kind, compiled.grammar, compiled.key, alphabet)
    matcher = probe.matcher()
    path = closing_path(matcher.fork_backend(), alphabet, matcher.vocab_size)
    if path is None:
        return None
    reserve = len(path) + 1
    for opening in openings:
        fork = matcher.fork_backend()
        if not fork.accept_string(opening):
            continue
        after = closing_path(fork, alphabet, matcher.vocab_size)
        if after is None:
            return None
        reserve = max(reserve, len(opening) + len(after) + 1)
    return ClosableConstraint(
        compiled.kind,
        compiled.grammar,
        compiled.key,
        alphabet,
        len(path) + 1,
        reserve,
        _packed(alphabet.plain_ids, matcher.vocab_size),
        frozenset(alphabet.plain_ids),
    )


def _packed(token_ids: Sequence[int], vocab_size: int) -> torch.Tensor:
    words = torch.zeros((vocab_size + _BITS - 1) // _BITS, dtype=torch.int64)  # [words]
    ids = torch.tensor([t for t in token_ids if t < vocab_size], dtype=torch.int64)
    words.index_add_(0, ids // _BITS, torch.ones_like(ids) << (ids % _BITS))
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def new_matcher(compiled: CompiledConstraint, max_tokens: int) -> TokenConstraint:
    """The matcher of one sequence: a closing one for a `ClosableConstraint`, a plain one otherwise."""
    if isinstance(compiled, ClosableConstraint):
        return compiled.closing_matcher(max_tokens)
    return compiled.matcher()


def _take_admitted(matcher: Any, vocab_size: int, stops: set[int], tries: int = 64) -> int | None:
    """Accept the lowest admitted token that is not a stop token (the mask also marks special
    tokens the matcher then refuses); None if none of the first `tries` is accepted."""
    import xgrammar

    bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(bitmask, 0)
    for word, value in enumerate(bitmask[0].tolist()):
        bits = value & 0xFFFFFFFF
        while bits:
            low = bits & -bits
            token = word * _BITS + low.bit_length() - 1
            bits ^= low
            if token in stops:
                continue
            if matcher.accept_token(token):
                return token
            tries -= 1
            if tries <= 0:
                return None
    return None


def _in_string(matcher: Any, probe_id: int) -> bool:
    """Whether `matcher` (a walk's own fork) is inside a free string; it is left unchanged."""
    if probe_id < 0 or not matcher.accept_token(probe_id):
        return False
    matcher.rollback(1)
    return True


def closing_path(
    matcher: Any, alphabet: ClosingAlphabet, vocab_size: int, limit: int = MAX_CLOSING_TOKENS
) -> tuple[int, ...] | None:
    """The tokens that take `matcher` (an xgrammar matcher, left unchanged) to where its grammar
    may end, by the deterministic walk; None if it needs more than `limit` tokens."""
    fork = matcher.fork()
    stops = set(fork.stop_token_ids)
    path: list[int] = []
    while not fork.is_completed():
        if len(path) >= limit:
            return None
        jump = fork.find_jump_forward_tokens()  # forced text (keys, names) in long tokens
        if jump and all(fork.accept_token(t) for t in jump):
            path.extend(jump)
            continue
        for token in alphabet.order(_in_string(fork, alphabet.probe_id)):
            if fork.accept_token(token):
                path.append(token)
                break
        else:  # a character outside the alphabet (an unusual const): the lowest admitted token
            taken = _take_admitted(fork, vocab_size, stops)
            if taken is None:
                return None
            path.append(taken)
    return tuple(path)


class ClosingConstraint(TokenConstraint):
    """A tool-call matcher that forces the closing walk when the budget left only holds it."""

    def __init__(self, compiled: ClosableConstraint, max_tokens: int) -> None:
        super().__init__(compiled)
        self._alphabet = compiled.alphabet
        self._max_tokens = max_tokens
        self._path: tuple[int, ...] | None = None
        self._reserve = compiled.reserve
        self._plain_bits = compiled.plain_bits
        self._plain_set = compiled.plain_set

    def forced_token(self) -> int | None:
        """The only token the budget leaves room for now, or None while the grammar is free."""
        if self.is_terminated:
            return None
        if self._path is None:
            self._path = closing_path(self._matcher, self._alphabet, self.vocab_size) or ()
        remaining = self._max_tokens - self.num_accepted
        if len(self._path) + 1 < remaining:
            return None
        return self._path[0] if self._path else self._stop_token()

    def _stop_token(self) -> int | None:
        stops = list(self._matcher.stop_token_ids)
        return int(stops[0]) if stops else None

    def _tight(self) -> bool:
        """Whether the budget left is within one call's worth of the closing path: from here on
        the path is followed, except for free text inside a string, so no new value opens."""
        if self._path is None:
            self._path = closing_path(self._matcher, self._alphabet, self.vocab_size) or ()
        return self._max_tokens - self.num_accepted <= len(self._path) + 1 + self._reserve

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        # The walk forks the matcher: never while a worker computes its mask ahead (if the base
        # class does that), so read that mask first.
        super().fill_bitmask(bitmask, row)
        forced = self.forced_token()
        if forced is None and self._tight():
            if self._plain_bits is not None and _in_string(self._matcher.fork(), self._alphabet.probe_id):
                # Inside a free string, text without a quote or backslash leaves the closing
                # path as it is: the model may go on writing it.
                bitmask[row, : self._plain_bits.shape[0]] &= self._plain_bits
                self._admit(bitmask, row, self._path[0] if self._path else self._stop_token())
                return
            forced = self._path[0] if self._path else self._stop_token()
        if forced is None:
            return
        bitmask[row] = 0
        self._admit(bitmask, row, forced)

    @staticmethod
    def _admit(bitmask: Any, row: int, token: int | None) -> None:
        if token is None:
            return
        word, bit = divmod(token, _BITS)
        bitmask[row, word] |= (1 << bit) if bit < _BITS - 1 else -(1 << (_BITS - 1))

    def accept(self, token_id: int) -> None:
        super().accept(token_id)
        path = self._path
        if path and path[0] == token_id:
            self._path = path[1:]
        elif not (path and path[0] == self._alphabet.quote_id and token_id in self._plain_set):
            # Plain text inside a string that could close now leaves the path as it was (most
            # tokens of a call): the walk runs again only after the structure moved.
            self._path = None
