"""Tool calling: the prompt that offers the tools, the grammar that forces a call, the answer's parser.

SmolLM2's chat template has no `tools` support, so every model is offered its tools the same
way: a system message (`tools_prompt`) lists the functions with their JSON-Schema parameters and
asks for calls in one of two formats:

- `tool_choice: "auto"`: the model may answer in text, or write each call as
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the Hermes / Qwen format);
  `ToolCallParser` finds those blocks, and text around them stays the message's content. The
  arguments are not constrained: a block that does not parse, or names no offered function,
  stays text.
- `"required"` or a named function: the answer is constrained by a grammar (`calls_schema`) to a
  JSON array of calls, each `{"name": <an offered function>, "arguments": <its parameters>}`, so
  the arguments always validate against the function's schema. One call only unless
  `parallel_tool_calls` (the default) allows more, up to `MAX_PARALLEL_CALLS`. A function's
  parameters that use `$ref` move to the root's `$defs` (`relocate_refs`), so their references
  still resolve inside the bigger schema. The engine keeps room to close the array before
  `max_tokens` (`weir.engine.structured.call_closing`), so a constrained answer always ends with complete calls.

Every function's parameters are checked against the keywords the grammar enforces
(`weir.gateway.api.json_schema_support`) whatever the tool choice, so a schema is refused or served
the same way in every mode.

Earlier calls of the conversation (assistant `tool_calls`) are rendered back into the assistant
message in the `<tool_call>` format, and `tool` messages keep their role, so the model sees the
same format it is asked for. The legacy `functions` / `function_call` fields are refused (400).
"""

from __future__ import annotations

import enum
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from weir.engine.structured.grammar import ConstraintSpec
from weir.gateway.api.json_schema_support import check_schema, relocate_refs
from weir.gateway.api.structured_bodies import FunctionDefinition, NamedToolChoice, ToolCall, ToolFields
from weir.gateway.http.errors import BadRequestError

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(_OPEN) + r"(.*?)(?:" + re.escape(_CLOSE) + r"|$)", re.DOTALL)
_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}
# The most calls one constrained answer may hold with `parallel_tool_calls` (one without).
MAX_PARALLEL_CALLS = 8


class ToolChoiceMode(enum.Enum):
    """How the model may use its tools."""

    AUTO = "auto"  # text or calls, its choice (parsed, not constrained)
    REQUIRED = "required"  # at least one call to any offered function (constrained)
    NAMED = "named"  # calls of one named function (constrained)


@dataclass(frozen=True)
class ToolsRequest:
    """The validated tool fields of a chat request that uses tools."""

    functions: tuple[FunctionDefinition, ...]
    mode: ToolChoiceMode
    parallel: bool = True
    named: str | None = None

    @property
    def constrained(self) -> bool:
        return self.mode is not ToolChoiceMode.AUTO

    def offered(self) -> tuple[FunctionDefinition, ...]:
        """The functions the answer may call (only the named one for a named choice)."""
        if self.named is None:
            return self.functions
        return tuple(f for f in self.functions if f.name == self.named)


def tools_request(fields: ToolFields) -> ToolsRequest | None:
    """The request's tool use, or None when it has no tools or `tool_choice` is `none`."""
    choice = fields.tool_choice
    if not fields.tools:
        if choice is not None and choice != "none":
            raise BadRequestError("'tool_choice' is only allowed when 'tools' are given", param="tool_choice")
        if fields.parallel_tool_calls is not None:
            return None  # harmless without tools, as OpenAI treats it
        return None
    names = [t.function.name for t in fields.tools]
    if len(set(names)) != len(names):
        raise BadRequestError("'tools' has two functions with the same name", param="tools")
    functions = tuple(t.function for t in fields.tools)
    for i, function in enumerate(functions):
        if function.parameters is not None:
            check_schema(function.parameters, f"tools[{i}].function.parameters")
    parallel = fields.parallel_tool_calls is not False
    if choice == "none":
        return None
    if choice is None or choice == "auto":
        return ToolsRequest(functions, ToolChoiceMode.AUTO, parallel)
    if choice == "required":
        return ToolsRequest(functions, ToolChoiceMode.REQUIRED, parallel)
    assert isinstance(choice, NamedToolChoice)
    if choice.function.name not in names:
        raise BadRequestError(
            f"'tool_choice.function.name' {choice.function.name!r} is not one of the tools",
            param="tool_choice.function.name",
        )
    return ToolsRequest(functions, ToolChoiceMode.NAMED, parallel, choice.function.name)


def _parameters(function: FunctionDefinition) -> dict[str, Any]:
    return function.parameters if function.parameters else _NO_ARGUMENTS


def _has_ref(schema: Any) -> bool:
    if isinstance(schema, dict):
        return "$ref" in schema or any(_has_ref(v) for v in schema.values())
    return isinstance(schema, list) and any(_has_ref(v) for v in schema)


def calls_schema(req: ToolsRequest) -> dict[str, Any]:
    """The JSON Schema of a constrained answer: an array of 1 to `MAX_PARALLEL_CALLS` calls of the
    offered functions (exactly one without `parallel_tool_calls`).

    A function's parameters that hold a `$ref` are moved to `$defs.<function name>` of the root,
    their references rewritten to point there (a reference is resolved against the root)."""
    defs: dict[str, Any] = {}
    calls = []
    for f in req.offered():
        arguments = _parameters(f)
        if _has_ref(arguments):
            defs[f.name] = relocate_refs(arguments, f"#/$defs/{f.name}")
            arguments = {"$ref": f"#/$defs/{f.name}"}
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": f.name}, "arguments": arguments},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    items = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    schema["maxItems"] = MAX_PARALLEL_CALLS if req.parallel else 1
    if defs:
        schema["$defs"] = defs
    return schema


def constraint(req: ToolsRequest) -> ConstraintSpec | None:
    """The grammar of a constrained tool choice; None for `auto`."""
    return ConstraintSpec.tool_calls(calls_schema(req), "tools") if req.constrained else None


def tools_prompt(req: ToolsRequest) -> str:
    """The system message that offers the tools (the fallback for templates without tools)."""
    listing = "\n".join(
        json.dumps(
            {"name": f.name, "description": f.description or "", "parameters": _parameters(f)},
            ensure_ascii=False,
        )
        for f in req.offered()
    )
    head = f"You can call these functions:\n{listing}\n"
    if req.constrained:
        return (
            head + 'Answer only with a JSON array of calls: [{"name": <function name>, "arguments": '
            "<an object of its parameters>}]."
        )
    return (
        head + "To call a function, answer with one line per call:\n"
        f'{_OPEN}{{"name": <function name>, "arguments": <an object of its parameters>}}{_CLOSE}\n'
        "Otherwise answer the user in plain text."
    )


def render_calls(calls: Sequence[ToolCall]) -> str:
    """Earlier calls of the conversation, as the model is asked to write them."""
    parts = []
    for call in calls:
        try:
            arguments: Any = json.loads(call.function.arguments)
        except ValueError:
            arguments = call.function.arguments
        parts.append(
            _OPEN
            + json.dumps({"name": call.function.name, "arguments": arguments}, ensure_ascii=False)
            + _CLOSE
        )
    return "\n".join(parts)


@dataclass(frozen=True)
class ParsedCall:
    """One call the model made: its id, function name and arguments (a JSON string)."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def _call(item: Any, names: set[str]) -> ParsedCall | None:
    if not isinstance(item, dict) or item.get("name") not in names:
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(
        "call_" + uuid.uuid4().hex[:24], item["name"], json.dumps(arguments, ensure_ascii=False)
    )


class ToolCallParser:
    """Splits one choice's answer into content and calls, as it streams.

    `feed` returns the text that is content for sure (safe to stream now); text that may be a
    call is held back until `finish`, which returns the rest of the content and the calls.
    """

    def __init__(self, req: ToolsRequest) -> None:
        self.req = req
        self._names = {f.name for f in req.offered()}
        self._held = ""

    def feed(self, text: str) -> str:
        if self.req.constrained:
            self._held += text
            return ""
        self._held += text
        start = self._held.find(_OPEN)
        if start < 0:
            # Hold a tail that could still become "<tool_call>".
            start = len(self._held)
            for k in range(min(len(_OPEN) - 1, len(self._held)), 0, -1):
                if _OPEN.startswith(self._held[-k:]):
                    start = len(self._held) - k
                    break
        content, self._held = self._held[:start], self._held[start:]
        return content

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """The content not yet returned, and the calls (none: everything is content)."""
        held, self._held = self._held, ""
        if self.req.constrained:
            try:
                items = json.loads(held)
            except ValueError:
                return held, []
            calls = (
                [c for c in (_call(i, self._names) for i in items) if c] if isinstance(items, list) else []
            )
            return ("", calls) if calls else (held, [])
        calls = []
        for match in _BLOCK.finditer(held):
            try:
                item = json.loads(match.group(1).strip())
            except ValueError:
                continue
            call = _call(item, self._names)
            if call is not None:
                calls.append(call)
        if not calls:
            return held, []
        if not self.req.parallel:
            calls = calls[:1]
        return held[: held.find(_OPEN)].strip(), calls


def split_output(
    parser: ToolCallParser | None, new_text: str, finished: bool
) -> tuple[str, list[ParsedCall]]:
    """The content one engine output adds (all of `new_text` without a parser) and, once the
    choice finished, the calls the parser found in what it held back."""
    if parser is None:
        return new_text, []
    text = parser.feed(new_text)
    if not finished:
        return text, []
    rest, calls = parser.finish()
    return text + rest, calls


def split_answer(tools: ToolsRequest | None, text: str) -> tuple[str, list[ParsedCall]]:
    """A whole answer's content and calls (none without tools): `split_output` in one go."""
    return split_output(ToolCallParser(tools) if tools is not None else None, text, finished=True)
