"""The bodies of OpenAI's Responses API (`/v1/responses`), declared once as pydantic v2 models.

The request is strict at the top: a field this server does not know, or knows and does not
implement (built-in tools, `background`, `conversation`, `reasoning`, `include`, ...), is a 400
naming it, since a client that sent it expects something this server would not do. Inside the
input items, fields the SDKs send back from earlier answers (`id`, `status`, `annotations`,
`logprobs`) are ignored. A null field is a field left out, as in the chat body.

Input items are `message` (a string, or `input_text` / `output_text` / `refusal` parts; a
role-only item without `type` is a message too), `function_call` and `function_call_output`;
anything else (images, files, reasoning, item references) is refused by its `type`. Tools are
function tools in the Responses' flat shape (`{"type": "function", "name", "parameters"}`).

The answers (`ResponseObject`, its items, the input items list, the deletion) are declared here
for `/openapi.json`; `weir.gateway.api.responses_stream` writes them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Discriminator, Field, Tag
from pydantic_core import PydanticCustomError

from weir.gateway.api import structured_bodies as sb
from weir.gateway.api.openai_bodies.fields import AS_NUMBER, unsupported
from weir.gateway.api.openai_bodies.requests import (
    MAX_USER_CHARS,
    MaxTokens,
    NullIsAbsentBody,
    PriorityValue,
)
from weir.gateway.api.openai_bodies.responses import Answer
from weir.gateway.api.openai_bodies.union_tags import (
    string_or_list_discriminator,
    type_discriminator,
    type_tag,
)

MAX_METADATA_PAIRS = 16  # OpenAI's bounds on `metadata`
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_RESPONSE_ID_CHARS = 64
MAX_CALL_ID_CHARS = 256


class ItemBody(NullIsAbsentBody):
    """A part of an input item: a null field is a field left out; unknown fields are ignored."""


class InputTextPart(ItemBody):
    type: Literal["input_text"]
    text: str


class OutputTextPart(ItemBody):
    """An earlier answer's text, sent back in an assistant message."""

    type: Literal["output_text"]
    text: str


class RefusalPart(ItemBody):
    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[
    Annotated[InputTextPart, Tag("~input_text")]
    | Annotated[OutputTextPart, Tag("~output_text")]
    | Annotated[RefusalPart, Tag("~refusal")],
    type_discriminator(
        ("input_text", "output_text", "refusal"),
        "unsupported_parameter",
        "this server reads no images, files or audio",
    ),
]


MessageContent = Annotated[
    Annotated[str, Tag("~text")] | Annotated[list[ContentPart], Tag("~parts")],
    string_or_list_discriminator("parts", "content parts"),
]


class MessageItem(ItemBody):
    """A message of the conversation (OpenAI's `EasyInputMessage` and `message` items)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: MessageContent


class FunctionCallItem(ItemBody):
    """A call the model made earlier, sent back with the conversation."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=MAX_CALL_ID_CHARS)
    name: str = Field(pattern=sb.NAME_PATTERN)
    arguments: str = Field(description="The arguments as a JSON object in a string.")


class FunctionCallOutputItem(ItemBody):
    """The client's answer to the call `call_id`."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=MAX_CALL_ID_CHARS)
    output: Annotated[
        Annotated[str, Tag("~text")] | Annotated[list[InputTextPart], Tag("~parts")],
        string_or_list_discriminator("parts", "input_text parts"),
    ]


_ITEM_TYPES = ("message", "function_call", "function_call_output")


def _item_kind(value: Any) -> str | None:
    if isinstance(value, dict) and "type" not in value and "role" in value:
        return "~message"
    return type_tag(value, _ITEM_TYPES)


InputItem = Annotated[
    Annotated[MessageItem, Tag("~message")]
    | Annotated[FunctionCallItem, Tag("~function_call")]
    | Annotated[FunctionCallOutputItem, Tag("~function_call_output")],
    Discriminator(
        _item_kind,
        custom_error_type="unsupported_parameter",
        custom_error_message="'type' must be one of message, function_call, function_call_output (this "
        "server keeps no reasoning items, item references, images or files)",
    ),
]


Input = Annotated[
    Annotated[str, Tag("~text")] | Annotated[list[InputItem], Tag("~items"), Field(min_length=1)],
    string_or_list_discriminator("items", "input items"),
]


class FunctionTool(ItemBody):
    """A client function, in the Responses' flat shape."""

    type: Literal["function"]
    name: str = Field(pattern=sb.NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(
        None, description="A JSON Schema of the arguments object (docs/structured-outputs.md)."
    )
    strict: bool | None = Field(None, description="Accepted: arguments of a forced call always validate.")


Tool = Annotated[
    Annotated[FunctionTool, Tag("~function")],
    type_discriminator(
        ("function",),
        "unsupported_parameter",
        "this server runs no built-in tools: web_search, file_search, computer_use, code_interpreter, mcp, ...",
    ),
]


class NamedFunctionChoice(ItemBody):
    type: Literal["function"]
    name: str


ToolChoice = Literal["none", "auto", "required"] | NamedFunctionChoice


class JsonSchemaTextFormat(ItemBody):
    """`text.format` of type `json_schema`: the answer validates against `schema`."""

    type: Literal["json_schema"]
    name: str = Field(pattern=sb.NAME_PATTERN)
    schema_: dict[str, Any] = Field(alias="schema", description="A JSON Schema; {} admits any JSON object.")
    description: str | None = None
    strict: bool | None = Field(None, description="Accepted: the answer always follows the schema exactly.")

    model_config = ConfigDict(populate_by_name=True)


class PlainTextFormat(ItemBody):
    type: Literal["text"]


class JsonObjectTextFormat(ItemBody):
    type: Literal["json_object"]


TextFormat = Annotated[
    Annotated[PlainTextFormat, Tag("~text")]
    | Annotated[JsonObjectTextFormat, Tag("~json_object")]
    | Annotated[JsonSchemaTextFormat, Tag("~json_schema")],
    type_discriminator(("text", "json_object", "json_schema"), "invalid_value"),
]


class TextConfig(ItemBody):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = Field(None, description="Accepted and ignored.")


def _metadata(value: dict[str, str]) -> dict[str, str]:
    if len(value) > MAX_METADATA_PAIRS:
        raise PydanticCustomError("invalid_value", f"at most {MAX_METADATA_PAIRS} pairs")
    for key, text in value.items():
        if len(key) > MAX_METADATA_KEY_CHARS or len(text) > MAX_METADATA_VALUE_CHARS:
            raise PydanticCustomError(
                "invalid_value",
                f"keys hold at most {MAX_METADATA_KEY_CHARS} characters, values {MAX_METADATA_VALUE_CHARS}",
            )
    return value


def _only(name: str, *allowed: Any) -> AfterValidator:
    def check(value: Any) -> Any:
        if value not in allowed:
            raise unsupported(name)
        return value

    return AfterValidator(check)


def _no_reasoning(value: dict[str, Any]) -> dict[str, Any]:
    if any(v is not None for v in value.values()):  # the Agents SDK sends {"effort": null, ...}
        raise unsupported("reasoning")
    return value


class StreamOptionsBody(ItemBody):
    include_obfuscation: bool | None = Field(None, description="Accepted; streams are never padded.")


class ResponsesBody(NullIsAbsentBody):
    """A `POST /v1/responses` body."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    model: str = Field(min_length=1)
    input: Input
    instructions: str | None = Field(None, description="A system message ahead of the input; not inherited.")
    max_output_tokens: MaxTokens | None = Field(None, description="Prompt + max_output_tokens must fit.")
    temperature: Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False), AS_NUMBER] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False), AS_NUMBER] | None = None
    tools: Annotated[list[Tool], Field(max_length=sb.MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = Field(
        None, description="More than one call per answer (default true)."
    )
    text: TextConfig | None = None
    metadata: Annotated[dict[str, str], AfterValidator(_metadata)] | None = Field(
        None, description="Up to 16 pairs, kept with the stored response."
    )
    user: str | None = Field(None, max_length=MAX_USER_CHARS)
    safety_identifier: str | None = Field(None, max_length=MAX_USER_CHARS, description="Read as `user`.")
    prompt_cache_key: str | None = Field(
        None, max_length=256, description="Accepted; the prefix cache is scoped by the API key."
    )
    store: bool = Field(True, description="Keep the response for GET and previous_response_id.")
    previous_response_id: str | None = Field(None, min_length=1, max_length=MAX_RESPONSE_ID_CHARS)
    truncation: Literal["disabled", "auto"] = Field(
        "disabled", description="auto: drop the oldest items of a conversation that outgrows the context."
    )
    stream: bool = False
    stream_options: StreamOptionsBody | None = None
    service_tier: Literal["auto", "default", "flex", "priority"] | None = Field(
        None, description="Accepted and ignored: the API key's priority class decides."
    )
    priority: PriorityValue | None = None
    background: Annotated[bool, _only("background", False)] | None = Field(
        None, description="Not supported: false only."
    )
    include: Annotated[list[str], _only("include", [])] | None = Field(
        None, description="Not supported: empty only."
    )
    reasoning: Annotated[dict[str, Any], AfterValidator(_no_reasoning)] | None = Field(
        None, description="Not supported: empty (or all null) only."
    )


# The answers, as `/openapi.json` declares them.


class OutputText(Answer):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class OutputMessage(Answer):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    status: Literal["completed", "incomplete"]
    content: list[OutputText]


class OutputFunctionCall(Answer):
    id: str
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    status: Literal["completed"]


class InputTokensDetails(Answer):
    cached_tokens: int = Field(description="Prompt tokens served from the prefix cache.")
    cache_write_tokens: int = 0


class OutputTokensDetails(Answer):
    reasoning_tokens: int = 0


class ResponseUsage(Answer):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(Answer):
    reason: Literal["max_output_tokens"]


class ResponseError(Answer):
    code: str
    message: str


class ResponseObject(Answer):
    """A response: the answer of `POST /v1/responses` and `GET /v1/responses/{id}` (streamed: in
    `response.created` ... `response.completed`)."""

    id: str
    object: Literal["response"]
    created_at: int
    completed_at: int | None
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    model: str
    instructions: str | None
    max_output_tokens: int | None
    output: list[OutputMessage | OutputFunctionCall]
    parallel_tool_calls: bool
    previous_response_id: str | None
    store: bool
    temperature: float
    top_p: float
    text: dict[str, Any]
    tool_choice: Any
    tools: list[dict[str, Any]]
    truncation: Literal["disabled", "auto"]
    usage: ResponseUsage | None
    user: str | None
    metadata: dict[str, str]
    background: bool
    service_tier: str


class InputItemList(Answer):
    """`GET /v1/responses/{id}/input_items`: the items that made the response's prompt."""

    object: Literal["list"]
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


class DeletedResponse(Answer):
    id: str
    object: Literal["response.deleted"]
    deleted: Literal[True]


RESPONSES_ANSWERS: tuple[type[Answer], ...] = (ResponseObject, InputItemList, DeletedResponse)
