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

    def __init__(self, num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, "
            f"{max_tokens} for the completion). Please reduce the prompt or max_tokens.",
            param="max_tokens" if num_prompt_tokens < max_model_len else "messages",
        )
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len


class EngineDeadError(EngineError):
    """The engine loop has stopped; no request can be served."""


class RequestFailedError(EngineError):
    """The engine failed while running one request; other requests are unaffected."""


DEADLINE_EXCEEDED = "deadline_exceeded"  # RequestOutput.error of a request aborted in the queue
