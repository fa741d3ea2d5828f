"""One request's output side: each sampled token in, streamable text and finish state out.

The engine loop owns one `OutputProcessor` per request (per choice when n > 1) and calls `step`
once per sampled token. It combines the incremental detokenizer (byte-correct text) with the stop
checker (EOS, stop token ids, stop strings, max_tokens), so the text it returns is exactly what
the client may see: concatenating every `TokenDelta.text` gives the final text.

The text of a stop token (EOS or one of `stop_token_ids`) is left out unless
`include_stop_str_in_output`, like a stop string; with `skip_special_tokens` it is empty anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

from weir.engine.request import FinishReason, SamplingParams, TokenDelta
from weir.engine.text.detokenizer import IncrementalDetokenizer, TokenizerLike
from weir.engine.text.stop_checker import StopChecker


class OutputProcessor:
    """Detokenizes and checks stop conditions for one request, one token at a time.

    `tokenizer` may be None for token-only serving (benchmarks, engine tests): the text is then
    always empty, and stop strings are refused because they could never match.
    """

    def __init__(
        self,
        tokenizer: TokenizerLike | None,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        eos_token_ids: tuple[int, ...],
    ) -> None:
        if tokenizer is None and params.stop:
            raise ValueError("stop strings need a tokenizer; the OutputProcessor was given none")
        self._params = params
        self._detokenizer = (
            None
            if tokenizer is None
            else IncrementalDetokenizer(tokenizer, prompt_token_ids, params.skip_special_tokens)
        )
        self._stop_checker = StopChecker(params, eos_token_ids)
        self._pieces: list[str] = []
        self._finish_reason: FinishReason | None = None
        self._stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self._finish_reason is not None

    @property
    def finish_reason(self) -> FinishReason | None:
        return self._finish_reason

    @property
    def stop_reason(self) -> str | int | None:
        return self._stop_reason

    @property
    def num_output_tokens(self) -> int:
        return self._stop_checker.num_output_tokens

    @property
    def output_text(self) -> str:
        """All text streamed so far (the final text once finished)."""
        return "".join(self._pieces)

    def step(self, token_id: int) -> TokenDelta:
        """Account one sampled token. Raises RuntimeError once the request has finished.

        With several tokens per step (speculative decoding) call it for each in order and stop at
        the first finished output: the later tokens are not part of the answer.
        """
        if self.finished:
            raise RuntimeError("step() called after the request finished")
        text = self._detokenize(token_id)
        decision = self._stop_checker.step(token_id, text)
        self._finish_reason = decision.finish_reason
        self._stop_reason = decision.stop_reason
        if decision.text:
            self._pieces.append(decision.text)
        return decision

    def _detokenize(self, token_id: int) -> str:
        detokenizer = self._detokenizer
        if detokenizer is None:
            return ""
        last = self._stop_checker.is_last_token(token_id)
        if self._stop_checker.is_stop_token(token_id) and not self._params.include_stop_str_in_output:
            text = ""
        else:
            text = detokenizer.push([token_id])
        # The last token releases an incomplete trailing character too (as U+FFFD).
        return text + detokenizer.flush() if last else text
