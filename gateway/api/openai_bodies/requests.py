"""The bodies of `POST /v1/chat/completions` and `POST /v1/completions`.

Unknown fields are ignored (OpenAI clients send extras) and a field sent as null is a field left
out. The bounds are `weir.engine.sampling_bounds`, the defaults `SamplingParams`'s own. Counts that
would make validation itself slow (messages, content parts, token ids, prompts) are checked
before these models run (`weir.gateway.api.protocol`); what needs the routed model (its vocabulary, its
context) is checked after.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Strict,
    Tag,
    model_validator,
)
from pydantic.functional_validators import PlainValidator
from pydantic.json_schema import WithJsonSchema
from pydantic_core import PydanticCustomError

from weir.engine import sampling_bounds as b
from weir.engine.errors import InvalidRequestError
from weir.engine.request import Priority, SamplingParams
from weir.gateway.api import structured_bodies as sb
from weir.gateway.api.openai_bodies.fields import AS_INT, AS_NUMBER, bad_value, unsupported
from weir.gateway.api.openai_bodies.union_tags import string_or_list_discriminator

MAX_PROMPTS = 128  # prompts in one batched /v1/completions request
# Whole-request bounds (all prompts together): the prompt tokens to prefill, and the sequences
# (prompts x n, or prompts x beams) one request may put in the engine.
MAX_REQUEST_PROMPT_TOKENS = 65536  # or the model's context, when that is longer
MAX_REQUEST_SEQUENCES = 256
MAX_USER_CHARS = 256
# Token ids as JSON keys (`logit_bias`): no sign, no leading zero, at most 9 digits.
TOKEN_KEY_PATTERN = "^(0|[1-9][0-9]{0,8})$"
# Marks a token id in the generated schema: `/openapi.json` bounds it by the served vocabulary.
TOKEN_ID_MARK = "x-weir-token-id"

_DEFAULTS = SamplingParams()


class StrictBody(BaseModel):
    """A body (or part of one) validated from parsed JSON: strict types, extras ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class NullIsAbsentBody(StrictBody):
    """A body whose fields sent as null read as left out (clients send `"x": null` for "not set")."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        if isinstance(data, dict) and None in data.values():
            return {k: v for k, v in data.items() if v is not None}
        return data


TokenId = Annotated[int, Field(ge=0, le=b.INT32_MAX, json_schema_extra={TOKEN_ID_MARK: True}), AS_INT]
Penalty = Annotated[float, Field(ge=b.PENALTY_MIN, le=b.PENALTY_MAX, allow_inf_nan=False), AS_NUMBER]
Bias = Annotated[float, Field(ge=b.LOGIT_BIAS_MIN, le=b.LOGIT_BIAS_MAX, allow_inf_nan=False), AS_NUMBER]
Count = Annotated[int, Field(ge=1, le=b.MAX_N), AS_INT]  # n, best_of, beam_width
Logprobs = Annotated[int, Field(ge=0, le=b.MAX_LOGPROBS), AS_INT]
MaxTokens = Annotated[int, Field(ge=1, le=b.INT32_MAX), AS_INT]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
StopString = Annotated[str, Field(min_length=1, max_length=b.MAX_STOP_CHARS)]
BiasKey = Annotated[str, Field(pattern=TOKEN_KEY_PATTERN)]


def _not_zero(value: int) -> int:
    if value == 0:
        raise bad_value("top_k must be -1 (disabled) or at least 1, not 0")
    return value


def _priority(value: Any) -> Priority:
    """A priority class by name (any case) or by number; JSON's 1.0 is 1."""
    if isinstance(value, str):
        try:
            return Priority.parse(value)
        except InvalidRequestError as exc:
            raise bad_value(exc.message.replace("{", "(").replace("}", ")")) from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if value in {p.value for p in Priority}:
            return Priority(value)
        raise bad_value("'priority' must be 0, 1, 2 or interactive, standard, batch")
    raise PydanticCustomError("invalid_type", "'priority' must be a string or an integer")


_PRIORITY_SCHEMA = {
    "oneOf": [
        {"type": "string", "enum": [p.name.lower() for p in Priority]},
        {"type": "integer", "minimum": min(Priority), "maximum": max(Priority)},
    ],
    "description": "Extension. May only lower the API key's priority class.",
}


def _only_false(name: str) -> Any:
    def check(value: Any) -> Any:
        if value not in (False, [], {}):
            raise unsupported(name)
        return value

    return AfterValidator(check)


# A priority class by name or number (`priority`, an extension of the generation bodies).
PriorityValue = Annotated[Priority, PlainValidator(_priority), WithJsonSchema(_PRIORITY_SCHEMA)]


class StreamOptions(StrictBody):
    include_usage: bool | None = None


class GenerationBody(NullIsAbsentBody):
    """The fields both generation bodies share: sampling, output and stream options."""

    model: str = Field(min_length=1)  # `/openapi.json` lists the served names
    # Read into `SamplingParams` keywords of the same name (`SAMPLING_FIELDS`).
    temperature: Annotated[float, Field(ge=0.0, allow_inf_nan=False), AS_NUMBER] = _DEFAULTS.temperature
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False), AS_NUMBER] = _DEFAULTS.top_p
    n: Count = _DEFAULTS.n
    seed: Annotated[int, Field(ge=b.SEED_MIN, le=b.SEED_MAX), AS_INT] | None = Field(
        None, description="Same seed, same parameters: the same tokens. n > 1: seed + i."
    )
    presence_penalty: Penalty = _DEFAULTS.presence_penalty
    frequency_penalty: Penalty = _DEFAULTS.frequency_penalty
    top_k: Annotated[Annotated[int, Field(ge=-1, le=b.INT32_MAX), AS_INT], AfterValidator(_not_zero)] = Field(
        _DEFAULTS.top_k, description="Extension. -1 disables.", json_schema_extra={"not": {"const": 0}}
    )
    min_p: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False), AS_NUMBER] = Field(
        _DEFAULTS.min_p, description="Extension."
    )
    repetition_penalty: Annotated[float, Field(gt=0.0, allow_inf_nan=False), AS_NUMBER] = Field(
        _DEFAULTS.repetition_penalty, description="Extension."
    )
    ignore_eos: bool = Field(_DEFAULTS.ignore_eos, description="Extension.")
    skip_special_tokens: bool = Field(_DEFAULTS.skip_special_tokens, description="Extension.")
    use_beam_search: bool = Field(
        _DEFAULTS.use_beam_search, description="Extension: the n best of beam_width beams."
    )
    length_penalty: Annotated[
        float, Field(ge=b.LENGTH_PENALTY_MIN, le=b.LENGTH_PENALTY_MAX, allow_inf_nan=False), AS_NUMBER
    ] = Field(_DEFAULTS.length_penalty, description="Extension, with use_beam_search.")
    stop: StopString | Annotated[list[StopString], Field(max_length=b.MAX_STOP_STRINGS)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=b.MAX_STOP_TOKEN_IDS)] | None = Field(
        None, description="Extension."
    )
    logit_bias: (
        Annotated[
            dict[BiasKey, Bias],
            Field(max_length=b.MAX_LOGIT_BIAS, json_schema_extra={"additionalProperties": False}),
        ]
        | None
    ) = Field(
        None,
        description="Added to the token's logit before sampling: -100 bans it, 100 all but forces it. "
        "Ids beyond the model's vocabulary are ignored.",
    )
    speculative: bool | None = Field(
        None,
        description="Extension. false: no speculative decoding for this request; true: speculate where the "
        "server does (refused with use_beam_search). Left out: the server's setting.",
    )
    # Read by the gateway itself (max_tokens is resolved per prompt, beam_width defaults to n).
    max_tokens: MaxTokens | None = Field(None, description="Prompt + max_tokens must fit the context.")
    max_completion_tokens: MaxTokens | None = Field(
        None, description="The newer name of max_tokens; wins over it."
    )
    stream: bool = False
    stream_options: StreamOptions | None = Field(None, description="Only with stream: true.")
    beam_width: Count | None = Field(None, description="Extension, with use_beam_search. Default: n.")
    user: str | None = Field(None, max_length=MAX_USER_CHARS)
    priority: PriorityValue | None = None
    response_format: sb.ResponseFormat | None = None
    structured_outputs: sb.StructuredOutputs | None = None


# `SamplingParams` keywords read from a body under the same name.
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "n",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "skip_special_tokens",
    "use_beam_search",
    "length_penalty",
    "speculative",
)


def _text_part_type(value: str) -> str:
    if value != "text":
        raise PydanticCustomError(
            "unsupported_parameter",
            "content part type {type} is not supported; only 'text'",
            {"type": repr(value)[:40]},
        )
    return value


class ContentPart(StrictBody):
    type: Annotated[str, AfterValidator(_text_part_type)] = Field(json_schema_extra={"const": "text"})
    text: str


Content = Annotated[
    Annotated[str, Tag("~text")] | Annotated[list[ContentPart], Tag("~parts")],
    string_or_list_discriminator("parts", "content parts"),
]


class Role(enum.Enum):
    """Chat message roles. `developer` is OpenAI's newer name for `system`."""

    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class ChatMessageBody(StrictBody):
    """One message of a chat; `tool_calls` count in an assistant's, `tool_call_id` in a tool's."""

    role: Annotated[Role, Strict(False)]  # by its value
    content: Content | None = None
    name: str | None = None
    tool_calls: list[sb.ToolCall] | None = None
    tool_call_id: str | None = Field(None, description="In a `tool` message: the call it answers.")


class ChatCompletionBody(GenerationBody):
    """A `POST /v1/chat/completions` body."""

    messages: list[ChatMessageBody] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: Logprobs | None = Field(None, description="Requires logprobs: true.")
    tools: Annotated[list[sb.ToolDefinition], Field(max_length=sb.MAX_TOOLS)] | None = None
    tool_choice: sb.ToolChoice | None = None
    parallel_tool_calls: bool | None = Field(
        None, description="More than one call per answer (default true)."
    )


def _prompt_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "~text"
    if not isinstance(value, list) or not value:
        return None
    first = value[0]
    if isinstance(first, str):
        return "~texts"
    if isinstance(first, list):
        return "~id_lists"
    return "~ids"


Prompt = Annotated[
    Annotated[Annotated[str, Field(min_length=1)], Tag("~text")]
    | Annotated[
        list[Annotated[str, Field(min_length=1)]], Tag("~texts"), Field(min_length=1, max_length=MAX_PROMPTS)
    ]
    | Annotated[TokenIds, Tag("~ids")]
    | Annotated[list[TokenIds], Tag("~id_lists"), Field(min_length=1, max_length=MAX_PROMPTS)],
    Discriminator(
        _prompt_kind,
        custom_error_type="invalid_type",
        custom_error_message="must be a string, a list of strings, a list of token ids or a list of token-id lists",
    ),
]


class CompletionBody(GenerationBody):
    """A (legacy) `POST /v1/completions` body; each prompt is text or token ids."""

    prompt: Prompt
    logprobs: Logprobs | None = None
    best_of: Count | None = Field(None, description="Only equal to n is supported.")
    echo: Annotated[bool, _only_false("echo")] = Field(
        False, description="Not supported: false only.", json_schema_extra={"const": False}
    )
    tools: Annotated[list[Any], _only_false("tools")] | None = Field(
        None, max_length=0, description="Not supported: empty only."
    )
