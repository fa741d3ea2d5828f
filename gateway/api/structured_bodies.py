"""Request fields of structured outputs and tool calling, declared once as pydantic v2 models.

- `response_format` (OpenAI, chat and completions): `text`, `json_object`, `json_schema`;
- `structured_outputs` (vLLM's field, so vLLM clients work unchanged): exactly one of `json`,
  `regex`, `choice`, `grammar` (xgrammar's EBNF);
- `tools`, `tool_choice`, `parallel_tool_calls` (chat), and the `tool_calls` / `tool_call_id` of
  conversation messages.

They are fields of the chat and completion bodies (`weir.gateway.api.openai_bodies.requests`), which
validation and `/openapi.json` derive from. A field that does not validate is a 400 naming its
path (`response_format.json_schema.name`). The mapping to what the engine runs (a
`ConstraintSpec`) is here too: `constraint_of`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Tag, ValidationError, model_validator

from weir.engine.structured.grammar import ConstraintSpec
from weir.gateway.api.json_schema_support import check_schema
from weir.gateway.api.openai_bodies.params import bad_request
from weir.gateway.api.openai_bodies.union_tags import type_discriminator
from weir.gateway.http.errors import BadRequestError

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


# Tagged by `type`; the tags start with `~` so that error paths leave them out
# (`weir.gateway.api.openai_bodies.params`).
ResponseFormat = Annotated[
    Annotated[TextFormat, Tag("~text")]
    | Annotated[JsonObjectFormat, Tag("~json_object")]
    | Annotated[JsonSchemaFormat, Tag("~json_schema")],
    type_discriminator(("text", "json_object", "json_schema"), "invalid_value"),
]


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
        default=None,
        description="A JSON Schema of the arguments object; omitted: no arguments. Keywords the "
        "grammar cannot enforce are refused (docs/structured-outputs.md).",
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


def parse_tool_fields(data: Mapping[str, Any]) -> ToolFields:
    given = {k: data[k] for k in ("tools", "tool_choice", "parallel_tool_calls") if data.get(k) is not None}
    try:
        return ToolFields.model_validate(given)
    except ValidationError as exc:
        raise bad_request(exc) from None


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
        check_schema(schema, "response_format.json_schema.schema")
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
        check_schema(given, "structured_outputs.json")
        return ConstraintSpec.json_schema(given, "structured_outputs.json")
    if structured.regex is not None:
        return ConstraintSpec.regex(structured.regex, "structured_outputs.regex")
    if structured.choice is not None:
        return ConstraintSpec.choice(structured.choice, "structured_outputs.choice")
    assert structured.grammar is not None  # the model validator leaves exactly one
    return ConstraintSpec.grammar(structured.grammar, "structured_outputs.grammar")
