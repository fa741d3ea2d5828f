"""The bodies the OpenAI routes answer with: completions, streamed chunks, usage, models, errors.

`/openapi.json` documents the answers from these models, and tests/gateway/api/test_openapi_answers.py
validates real answers of every route against that document, so the renderers
(`weir.gateway.api.responses`, `weir.gateway.api.usage.Usage.to_openai`, the model cards) cannot drift from it.
The renderers build the bytes by hand on the per-token path, for speed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from weir.gateway.api.structured_bodies import ToolCall

FinishReason = Literal["stop", "length", "abort", "error", "tool_calls"]


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromptTokensDetails(Answer):
    cached_tokens: int = Field(description="Prompt tokens served from the prefix cache.")


class CompletionTokensDetails(Answer):
    """Speculative decoding's counts (OpenAI's predicted outputs): only for a request that speculated."""

    accepted_prediction_tokens: int
    rejected_prediction_tokens: int


class Usage(Answer):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None


class TopLogprob(Answer):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(Answer):
    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None


class AssistantMessage(Answer):
    role: Literal["assistant"]
    content: str | None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChoicesAnswer(Answer):
    """The head of every chat and completion answer and stream chunk; each names its `object`."""

    id: str
    object: str
    created: int
    model: str
    system_fingerprint: str | None = None


class ChatChoice(Answer):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletion(ChoicesAnswer):
    """The answer of `POST /v1/chat/completions`; with stream: true, an SSE stream of
    `ChatCompletionChunk` ending with `data: [DONE]`."""

    object: Literal["chat.completion"]
    choices: list[ChatChoice]
    usage: Usage


class FunctionCallDelta(Answer):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Answer):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class ChatDelta(Answer):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(Answer):
    index: int
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(ChoicesAnswer):
    """One event of a streamed chat answer; the last, with stream_options.include_usage, has no
    choices and the usage."""

    object: Literal["chat.completion.chunk"]
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(Answer):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(Answer):
    text: str
    index: int
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class Completion(ChoicesAnswer):
    """The answer of `POST /v1/completions`; with stream: true, an SSE stream of
    `CompletionChunk` ending with `data: [DONE]`."""

    object: Literal["text_completion"]
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunk(ChoicesAnswer):
    """One event of a streamed completion (the object name is the answer's, as OpenAI sends it);
    `usage` only in the last, with stream_options.include_usage, which has no choices."""

    object: Literal["text_completion"]
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(Answer):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int | None = None
    parent: str | None = Field(None, description="A LoRA adapter's base model.")
    root: str | None = None


class ModelList(Answer):
    object: Literal["list"]
    data: list[ModelCard]


class ErrorDetail(Answer):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(Answer):
    """Every error answer: `{"error": {"message", "type", "param", "code"}}`."""

    error: ErrorDetail


# The answers `/openapi.json` declares, by component name.
ANSWERS: tuple[type[Answer], ...] = (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
    ModelCard,
    ModelList,
    ErrorBody,
)
