"""Request fields of structured outputs and tool calling, declared once as pydantic v2 models.

- `response_format` (OpenAI, chat and completions): `text`, `json_object`, `json_schema`;
- `structured_outputs` (vLLM's field, so vLLM clients work unchanged): exactly one of `json`,
  `regex`, `choice`, `grammar` (xgrammar's EBNF);
- `tools`, `tool_choice`, `parallel_tool_calls` (chat), and the `tool_calls` / `tool_call_id` of
  conversation messages.

Validation and `/openapi.json` (`gateway.openapi`) both derive from these models. A body that
does not validate is a 400 naming the field's path (`response_format.json_schema.name`). The
mapping to what the engine runs (a `ConstraintSpec`) is here too: `constraint_of`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from engine.grammar import ConstraintSpec
from gateway.errors import BadRequestError

# OpenAI's rule for function and schema names.
NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
MAX_TOOLS = 128  # OpenAI's limit on functions per request


class _Body(BaseModel):
    """Unknown keys are ignored (clients send extras), as for the other fields of a body."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class JsonSchemaSpec(_Body):
    """`response_format.json_schema`: the schema the answer must validate against."""

    name: str = Field(pattern=NAME_PATTERN, description="The schema's name (letters, digits, _ and -).")
    description: str | None = None
    schema_: dict[str, Any] = Field(
        default_factory=dict, alias="schema", description="A JSON Schema; {} admits any JSON object."
    )
    strict: bool | None = Field(
        default=None, description="Accepted for compatibility: the answer always follows the schema exactly."
    )


class TextFormat(_Body):
    type: Literal["text"]


class JsonObjectFormat(_Body):
    type: Literal["json_object"]


class JsonSchemaFormat(_Body):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class StructuredOutputs(_Body):
    """vLLM's `structured_outputs`: exactly one constraint on the answer's text."""

    json_: dict[str, Any] | str | None = Field(
        default=None, alias="json", description="A JSON Schema (an object, or its JSON text)."
    )
    regex: str | None = Field(default=None, description="The answer matches this regular expression.")
    choice: list[str] | None = Field(default=None, min_length=1, description="The answer is one of these.")
    grammar: str | None = Field(
        default=None, description="An EBNF grammar (xgrammar's syntax, root rule `root`)."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [v for v in (self.json_, self.regex, self.choice, self.grammar) if v is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of json, regex, choice, grammar")
        return self


class FunctionDefinition(_Body):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(
        default=None, description="A JSON Schema of the arguments object; omitted: no arguments."
    )
    strict: bool | None = None


class ToolDefinition(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(_Body):
    name: str
    arguments: str = Field(description="The arguments as a JSON object in a string.")


class ToolCall(_Body):
    """A call in an assistant message (`message.tool_calls[]`), in requests and answers."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolFields(_Body):
    """The tool fields of a chat body, validated together."""

    tools: list[ToolDefinition] = Field(default_factory=list, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None


_RESPONSE_FORMAT: TypeAdapter[Any] = TypeAdapter(ResponseFormat)
_TOOL_CALLS: TypeAdapter[list[ToolCall]] = TypeAdapter(list[ToolCall])


def validation_error(exc: ValidationError, param: str, tagged: bool = False) -> BadRequestError:
    """The first error of `exc` as a 400 naming the field's path under `param`.

    `tagged`: `exc` comes from a discriminated union, whose paths start with the tag's value.
    """
    err = exc.errors()[0]
    loc = err["loc"][1:] if tagged else err["loc"]
    path = param + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
    path = path.removeprefix(".")
    return BadRequestError(f"'{path}': {err['msg']}", param=path, code="invalid_value")


def _validate(adapter: TypeAdapter[Any], value: Any, param: str, tagged: bool = False) -> Any:
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        raise validation_error(exc, param, tagged) from None


def parse_response_format(value: Any) -> TextFormat | JsonObjectFormat | JsonSchemaFormat | None:
    return None if value is None else _validate(_RESPONSE_FORMAT, value, "response_format", tagged=True)


def parse_structured_outputs(value: Any) -> StructuredOutputs | None:
    if value is None:
        return None
    try:
        return StructuredOutputs.model_validate(value)
    except ValidationError as exc:
        raise validation_error(exc, "structured_outputs") from None


def parse_tool_fields(data: Mapping[str, Any]) -> ToolFields:
    given = {k: data[k] for k in ("tools", "tool_choice", "parallel_tool_calls") if data.get(k) is not None}
    try:
        return ToolFields.model_validate(given)
    except ValidationError as exc:
        # `param` is the body field (`tools`), as for the other top-level fields; the message
        # names the path inside it.
        error = validation_error(exc, "")
        field = (error.param or "tools").split(".")[0].split("[")[0]
        raise BadRequestError(error.message, param=field, code="invalid_value") from None


def parse_tool_calls(value: Any, param: str) -> tuple[ToolCall, ...]:
    return tuple(_validate(_TOOL_CALLS, value, param))


def constraint_of(
    response_format: TextFormat | JsonObjectFormat | JsonSchemaFormat | None,
    structured: StructuredOutputs | None,
) -> ConstraintSpec | None:
    """What the engine must constrain the answer to, from the two fields (at most one may be set)."""
    if structured is not None and not (response_format is None or isinstance(response_format, TextFormat)):
        raise BadRequestError(
            "give either 'response_format' or 'structured_outputs', not both", param="structured_outputs"
        )
    if isinstance(response_format, JsonObjectFormat):
        return ConstraintSpec.json_object("response_format")
    if isinstance(response_format, JsonSchemaFormat):
        schema = response_format.json_schema.schema_ or {"type": "object"}
        return ConstraintSpec.json_schema(schema, "response_format.json_schema.schema")
    if structured is None:
        return None
    if structured.json_ is not None:
        given: Any = structured.json_
        if isinstance(given, str):
            try:
                given = json.loads(given)
            except ValueError:
                raise BadRequestError(
                    "'structured_outputs.json' is not valid JSON", param="structured_outputs.json"
                ) from None
        return ConstraintSpec.json_schema(given, "structured_outputs.json")
    if structured.regex is not None:
        return ConstraintSpec.regex(structured.regex, "structured_outputs.regex")
    if structured.choice is not None:
        return ConstraintSpec.choice(structured.choice, "structured_outputs.choice")
    assert structured.grammar is not None  # the model validator leaves exactly one
    return ConstraintSpec.grammar(structured.grammar, "structured_outputs.grammar")


_REF_TEMPLATE = "#/components/schemas/{model}"


def _schema_of(adapter: TypeAdapter[Any], defs: dict[str, Any]) -> dict[str, Any]:
    schema = adapter.json_schema(ref_template=_REF_TEMPLATE, by_alias=True)
    defs.update(schema.pop("$defs", {}))
    return schema


def openapi_properties() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The `/openapi.json` rendering of these models, derived from them.

    Returns (properties of a chat body, properties of a completion body, properties a chat
    message adds, the component schemas they reference).
    """
    defs: dict[str, Any] = {}
    common = {
        "response_format": _schema_of(_RESPONSE_FORMAT, defs),
        "structured_outputs": _schema_of(TypeAdapter(StructuredOutputs), defs),
    }
    chat = {
        **common,
        "tools": {**_schema_of(TypeAdapter(list[ToolDefinition]), defs), "maxItems": MAX_TOOLS},
        "tool_choice": _schema_of(TypeAdapter(ToolChoice), defs),
        "parallel_tool_calls": {
            "type": "boolean",
            "description": "More than one call per answer (default true).",
        },
    }
    message = {
        "tool_calls": _schema_of(_TOOL_CALLS, defs),
        "tool_call_id": {"type": "string", "description": "In a `tool` message: the call it answers."},
    }
    return chat, common, message, defs
