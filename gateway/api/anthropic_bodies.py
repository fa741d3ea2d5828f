"""The body of `POST /v1/messages` (Anthropic's Messages API), declared once as pydantic v2 models.

Strict like the OpenAI bodies (`weir.gateway.api.openai_bodies.requests`): unknown fields are ignored,
null is a field left out, and a field out of its bounds is a 400 naming its path
(`messages[0].content[1].tool_use_id`). Content blocks are `text`, `tool_use` (an assistant's
call) and `tool_result` (a user's answer to one); images, documents and thinking are refused by
type. The translation into the chat route's request is `weir.gateway.api.anthropic_protocol`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, Tag

from weir.engine import sampling_bounds as b
from weir.gateway.api import structured_bodies as sb
from weir.gateway.api.openai_bodies.fields import AS_INT, AS_NUMBER
from weir.gateway.api.openai_bodies.requests import (
    MAX_USER_CHARS,
    MaxTokens,
    NullIsAbsentBody,
    StopString,
)
from weir.gateway.api.openai_bodies.responses import Answer
from weir.gateway.api.openai_bodies.union_tags import string_or_list_discriminator, type_discriminator


class AnthropicBody(NullIsAbsentBody):
    """A part of a Messages body: a null field is a field left out."""


class TextBlock(AnthropicBody):
    type: Literal["text"]
    text: str


_STRING_OR_BLOCKS = string_or_list_discriminator("blocks", "content blocks")
# A string, or text blocks (`system`, a tool result's content).
TextContent = Annotated[
    Annotated[str, Tag("~text")] | Annotated[list[TextBlock], Tag("~blocks")], _STRING_OR_BLOCKS
]


class ToolUseBlock(AnthropicBody):
    """An assistant's call of a tool, earlier in the conversation."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(pattern=sb.NAME_PATTERN)
    input: dict[str, Any]


class ToolResultBlock(AnthropicBody):
    """A user's answer to the call `tool_use_id`."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: TextContent = ""
    is_error: bool = False


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("~text")]
    | Annotated[ToolUseBlock, Tag("~tool_use")]
    | Annotated[ToolResultBlock, Tag("~tool_result")],
    type_discriminator(
        ("text", "tool_use", "tool_result"),
        "unsupported_parameter",
        "this server reads no images, documents or thinking",
    ),
]


class MessageParam(AnthropicBody):
    role: Literal["user", "assistant"]
    content: Annotated[
        Annotated[str, Tag("~text")] | Annotated[list[ContentBlock], Tag("~blocks")], _STRING_OR_BLOCKS
    ]


class AnthropicTool(AnthropicBody):
    """A client tool: its name, what it does, and the JSON Schema of its input."""

    name: str = Field(pattern=sb.NAME_PATTERN)
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoiceAuto(AnthropicBody):
    type: Literal["auto"]
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(AnthropicBody):
    type: Literal["any"]
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(AnthropicBody):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(AnthropicBody):
    type: Literal["none"]


ToolChoice = Annotated[
    Annotated[ToolChoiceAuto, Tag("~auto")]
    | Annotated[ToolChoiceAny, Tag("~any")]
    | Annotated[ToolChoiceTool, Tag("~tool")]
    | Annotated[ToolChoiceNone, Tag("~none")],
    type_discriminator(("auto", "any", "tool", "none"), "invalid_value"),
]


class Metadata(AnthropicBody):
    user_id: str | None = Field(None, max_length=MAX_USER_CHARS)


class MessagesBody(AnthropicBody):
    """A `POST /v1/messages` body."""

    model: str = Field(min_length=1)
    max_tokens: MaxTokens = Field(description="Prompt + max_tokens must fit the context.")
    messages: list[MessageParam] = Field(min_length=1)
    system: TextContent | None = None
    stop_sequences: Annotated[list[StopString], Field(max_length=b.MAX_STOP_STRINGS)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False), AS_NUMBER] | None = Field(
        None, description="Default 1.0."
    )
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False), AS_NUMBER] | None = None
    top_k: Annotated[int, Field(ge=1, le=b.INT32_MAX), AS_INT] | None = None
    stream: bool = False
    tools: Annotated[list[AnthropicTool], Field(max_length=sb.MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    metadata: Metadata | None = None


# The answers, as `/openapi.json` declares them (`weir.gateway.api.anthropic_stream` writes them).


class AnthropicUsage(Answer):
    input_tokens: int = Field(description="Prompt tokens not read from the prefix cache.")
    output_tokens: int
    cache_read_input_tokens: int = Field(description="Prompt tokens read from the prefix cache.")
    cache_creation_input_tokens: int = 0


class TextBlockAnswer(Answer):
    type: Literal["text"]
    text: str


class ToolUseBlockAnswer(Answer):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class AnthropicMessage(Answer):
    """The answer of `POST /v1/messages` (streamed: as `message_start` ... `message_stop` events)."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[TextBlockAnswer | ToolUseBlockAnswer]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None
    usage: AnthropicUsage


class AnthropicErrorDetail(Answer):
    type: str
    message: str
    param: str | None = None
    code: str | None = None


class AnthropicError(Answer):
    """Every error answer of `/v1/messages`: `{"type": "error", "error": {"type", "message"}}`."""

    type: Literal["error"]
    error: AnthropicErrorDetail
