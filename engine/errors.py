"""Typed engine errors. The gateway maps each kind to an HTTP status in one place."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(EngineError, ValueError):
    """A request's parameters are invalid; it never enters the queue.

    `param` names the offending field so the HTTP layer can report it.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class ContextLengthError(InvalidRequestError):
    """Prompt plus requested output does not fit the model's context."""

    def __init__(
        self, num_prompt_tokens: int, max_tokens: int, max_model_len: int, prompt_param: str = "prompt"
    ) -> None:
        # `prompt_param`: the body field that holds the prompt (`messages` for a chat).
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, "
            f"{max_tokens} for the completion). Please reduce the prompt or max_tokens.",
            param="max_tokens" if num_prompt_tokens < max_model_len else prompt_param,
        )
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len

    @classmethod
    def check(
        cls, num_prompt_tokens: int, max_tokens: int, max_model_len: int, prompt_param: str = "prompt"
    ) -> None:
        """Raise unless the prompt and `max_tokens` fit the context: the one context-length check
        (the gateway's routes, the engine's validation and the scheduler call it)."""
        if num_prompt_tokens + max_tokens > max_model_len:
            raise cls(num_prompt_tokens, max_tokens, max_model_len, prompt_param)


class EngineDeadError(EngineError):
    """The engine loop has stopped; no request can be served."""


class RequestFailedError(EngineError):
    """The engine failed while running one request; other requests are unaffected."""


DEADLINE_EXCEEDED = "deadline_exceeded"  # RequestOutput.error of a request aborted in the queue


class KVCapacityError(ContextLengthError):
    """A request can never fit the KV cache pool, even with nothing else running.

    A 400 like `ContextLengthError`: the request is refused before it enters the queue, instead
    of being admitted, preempted, and then never admitted again. `param` is `max_tokens` when one
    sequence alone is too long, `n` or `beam_width` when each sequence fits but the group (whose
    sequences run together, sharing the prompt's full blocks) does not.
    """

    def __init__(
        self,
        num_prompt_tokens: int,
        max_tokens: int,
        num_sequences: int,
        num_blocks_needed: int,
        num_blocks_usable: int,
        block_size: int,
        param: str = "max_tokens",
    ) -> None:
        seqs = f" for {num_sequences} sequences" if num_sequences > 1 else ""
        InvalidRequestError.__init__(
            self,
            f"This request can never fit the server's KV cache: {num_prompt_tokens} prompt tokens + "
            f"{max_tokens} max_tokens{seqs} need {num_blocks_needed} blocks of {block_size} tokens, "
            f"and the cache has {num_blocks_usable} blocks ({num_blocks_usable * block_size} tokens) for "
            "one request. Please reduce the prompt, max_tokens, n or beam_width.",
            param=param,
        )
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = num_blocks_usable * block_size
        self.num_sequences = num_sequences
        self.num_blocks_needed = num_blocks_needed


class RetryableEngineError(EngineError):
    """The engine failed while running this request and recovered; the request may be retried.

    The gateway answers 503 (code `ENGINE_RETRYABLE`), which the OpenAI clients retry.
    """


# RequestOutput.error of a request failed by an engine fault that did not stem from the request
# (the model forward raised, or the engine loop restarted): the gateway answers 503, retryable.
ENGINE_RETRYABLE = "engine_retryable"
