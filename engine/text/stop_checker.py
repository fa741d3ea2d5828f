"""When a request stops, and which of its text may be streamed already.

Stop strings can span token boundaries, so text whose tail could still grow into a stop string is
held back until the next tokens decide it. The held tail is at most the longest stop string minus
one character, and only the held tail plus the new text is searched: a stop string cannot start
earlier, because its beginning would then have been held back too.

Precedence when several conditions meet on one token: a stop string found in the text (it ends
the text earliest), then a stop token (EOS unless `ignore_eos`, or one of `stop_token_ids`), then
`max_tokens`. EOS reports `stop_reason=None` (the natural end, as vLLM does); a stop token id or
a stop string reports itself. When several stop strings match, the one that ends first wins (then
the longer one): generation stops as soon as a stop string is complete, so the choice does not
depend on how the text was split into tokens.
"""

from __future__ import annotations

from weir.engine.request import FinishReason, SamplingParams, TokenDelta


class StopChecker:
    """Stop conditions of one request, fed one token and its new text at a time."""

    def __init__(self, params: SamplingParams, eos_token_ids: tuple[int, ...]) -> None:
        self._params = params
        self._eos_token_ids = frozenset(() if params.ignore_eos else eos_token_ids)
        self._stop_token_ids = frozenset(params.stop_token_ids)
        self._stops = params.stop
        self._max_stop_len = max((len(s) for s in self._stops), default=0)
        self._stop_first_chars = frozenset(s[0] for s in self._stops)
        self._held = ""  # a tail that may be the beginning of a stop string
        self._num_output_tokens = 0
        self._finished = False

    @property
    def num_output_tokens(self) -> int:
        return self._num_output_tokens

    @property
    def finished(self) -> bool:
        return self._finished

    def is_stop_token(self, token_id: int) -> bool:
        """Whether `token_id` ends the request by itself (EOS unless ignored, or a stop token id)."""
        return token_id in self._stop_token_ids or token_id in self._eos_token_ids

    def is_last_token(self, token_id: int) -> bool:
        """Whether the request ends with this token whatever its text (stop token or max_tokens)."""
        return self.is_stop_token(token_id) or self._num_output_tokens + 1 >= self._params.max_tokens

    def step(self, token_id: int, new_text: str) -> TokenDelta:
        """Account one output token whose decoded text is `new_text`; decide whether to stop.

        When the token is a stop token, `new_text` is whatever the caller wants streamed for it
        (usually nothing unless `include_stop_str_in_output`) plus any text still held back by
        the detokenizer, which is released at the end.
        """
        if self._finished:
            raise RuntimeError("step() called after the request finished")
        self._num_output_tokens += 1
        buffer = self._held + new_text
        self._held = ""

        match = self._find_stop(buffer)
        if match is not None:
            start, stop = match
            end = start + len(stop) if self._params.include_stop_str_in_output else start
            self._finished = True
            return TokenDelta(buffer[:end], FinishReason.STOP, stop)

        if self.is_stop_token(token_id):
            self._finished = True
            # A stop token id reports itself; EOS is the natural end and reports None.
            reason = token_id if token_id in self._stop_token_ids else None
            return TokenDelta(buffer, FinishReason.STOP, reason)
        if self._num_output_tokens >= self._params.max_tokens:
            self._finished = True
            return TokenDelta(buffer, FinishReason.LENGTH, None)

        held = self._held_length(buffer)
        self._held = buffer[len(buffer) - held :] if held else ""
        return TokenDelta(buffer[: len(buffer) - held])

    def _find_stop(self, buffer: str) -> tuple[int, str] | None:
        """The (start, stop string) of the match that ends first in `buffer`, if any."""
        best: tuple[int, str] | None = None
        best_end = 0
        for stop in self._stops:
            start = buffer.find(stop)
            if start < 0:
                continue
            end = start + len(stop)
            if best is None or end < best_end or (end == best_end and start < best[0]):
                best, best_end = (start, stop), end
        return best

    def _held_length(self, buffer: str) -> int:
        """Length of the longest tail of `buffer` that is a proper prefix of some stop string."""
        if not self._stops:
            return 0
        # Leftmost candidate first: the first tail that fits is the longest.
        for start in range(max(0, len(buffer) - self._max_stop_len + 1), len(buffer)):
            if buffer[start] not in self._stop_first_chars:
                continue
            tail = buffer[start:]
            if any(stop.startswith(tail) for stop in self._stops):
                return len(buffer) - start
        return 0
