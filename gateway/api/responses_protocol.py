"""A Responses body (`weir.gateway.api.responses_bodies`) as the chat route's own request.

`POST /v1/responses` runs as a chat completion: the conversation's items become chat messages
and go through the chat route's steps (`weir.gateway.routes.openai`). The mapping:

- `instructions` is the first message (role `system`); it is not inherited through
  `previous_response_id`, as OpenAI does it;
- a `message` item is a message of its role (`developer` stays `developer`), its parts' text
  joined; an earlier answer's `output_text` and `refusal` parts are its text;
- `function_call` items are the `tool_calls` of one assistant message (with the assistant text
  right before them, if any); a `function_call_output` is a `tool` message answering `call_id`;
- `tools` (flat function tools), `tool_choice` (`none`, `auto`, `required`, or
  `{"type": "function", "name"}`) and `parallel_tool_calls` are the chat's tool fields;
- `text.format` is `response_format` (`json_schema` constrains the answer to its `schema`);
- `max_output_tokens`, `temperature` (default 1), `top_p`, `user` (or `safety_identifier`) and
  `priority` are the sampling and output options.

Items are kept, stored and listed in one normal form (`normal_items`): a plain JSON object per
item with the fields this server reads (a message's content always as a list of parts, as
OpenAI lists input items), so a stored conversation validates again as input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import TypeAdapter, ValidationError

from weir.engine.structured.grammar import ConstraintSpec
from weir.gateway.api import responses_bodies as rb
from weir.gateway.api import structured_bodies as sb
from weir.gateway.api.json_schema_support import check_schema
from weir.gateway.api.openai_bodies.params import bad_request, error_path
from weir.gateway.api.openai_bodies.requests import Role
from weir.gateway.api.protocol import ChatCompletionRequest, ChatMessage, GenerationOptions, check_chat_counts
from weir.gateway.api.tool_calls import ToolsRequest, calls_schema, tools_request
from weir.gateway.http.errors import BadRequestError

_ITEMS: TypeAdapter[list[rb.InputItem]] = TypeAdapter(list[rb.InputItem])
Item = rb.MessageItem | rb.FunctionCallItem | rb.FunctionCallOutputItem
_ROLES = {"user": Role.USER, "assistant": Role.ASSISTANT, "system": Role.SYSTEM, "developer": Role.DEVELOPER}


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated `POST /v1/responses` body: the body itself (echoed in the answer), this
    request's items in normal form, and the options and tools of the chat it runs as."""

    body: rb.ResponsesBody
    items: tuple[dict[str, Any], ...]
    options: GenerationOptions
    tools: ToolsRequest | None
    # Each normal-form item already validated, by its id (the item kept with it, so the id
    # stays its own): a conversation is validated once however often truncation rebuilds it.
    _validated: dict[int, tuple[dict[str, Any], Item]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def _items(self, conversation: Sequence[dict[str, Any]]) -> list[Item]:
        known = self._validated
        new = [item for item in conversation if known.get(id(item), (None,))[0] is not item]
        if new:
            for item, valid in zip(new, validate_items(new, "previous_response_id"), strict=True):
                known[id(item)] = (item, valid)
        return [known[id(item)][1] for item in conversation]

    def chat(self, conversation: Sequence[dict[str, Any]]) -> ChatCompletionRequest:
        """The chat request of `conversation` (normal-form items) behind the instructions."""
        messages = chat_messages(self._items(conversation))
        if self.body.instructions:
            messages = (ChatMessage(Role.SYSTEM, self.body.instructions), *messages)
        return ChatCompletionRequest(self.body.model, messages, self.options, self.tools)


def _part_text(part: rb.InputTextPart | rb.OutputTextPart | rb.RefusalPart) -> str:
    return part.refusal if isinstance(part, rb.RefusalPart) else part.text


def _text(content: str | Sequence[rb.InputTextPart | rb.OutputTextPart | rb.RefusalPart]) -> str:
    return content if isinstance(content, str) else "".join(_part_text(p) for p in content)


def normal_items(
    items: Iterable[rb.MessageItem | rb.FunctionCallItem | rb.FunctionCallOutputItem],
) -> list[dict[str, Any]]:
    """Items as plain JSON objects with the fields this server reads (what is stored and listed)."""
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, rb.MessageItem):
            if isinstance(item.content, str):
                kind = "output_text" if item.role == "assistant" else "input_text"
                content: Any = [{"type": kind, "text": item.content}]
            else:
                content = [
                    {"type": p.type, "refusal": p.refusal}
                    if isinstance(p, rb.RefusalPart)
                    else {"type": p.type, "text": p.text}
                    for p in item.content
                ]
            out.append({"type": "message", "role": item.role, "content": content})
        elif isinstance(item, rb.FunctionCallItem):
            out.append(
                {
                    "type": "function_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    "arguments": item.arguments,
                }
            )
        else:
            output = _text(item.output)
            out.append({"type": "function_call_output", "call_id": item.call_id, "output": output})
    return out


def validate_items(
    items: Sequence[dict[str, Any]], param: str
) -> list[rb.MessageItem | rb.FunctionCallItem | rb.FunctionCallOutputItem]:
    """Stored items (and earlier outputs) read back as input items; `param` names them on failure."""
    try:
        return _ITEMS.validate_python(list(items))
    except ValidationError as exc:
        raise bad_request(exc, param) from None


def chat_messages(
    items: Sequence[rb.MessageItem | rb.FunctionCallItem | rb.FunctionCallOutputItem],
) -> tuple[ChatMessage, ...]:
    """The conversation's items as the chat route's messages."""
    out: list[ChatMessage] = []
    for item in items:
        if isinstance(item, rb.MessageItem):
            out.append(ChatMessage(_ROLES[item.role], _text(item.content)))
        elif isinstance(item, rb.FunctionCallItem):
            call = sb.ToolCall(
                id=item.call_id, function=sb.FunctionCall(name=item.name, arguments=item.arguments)
            )
            last = out[-1] if out else None
            if last is not None and last.role is Role.ASSISTANT:
                out[-1] = replace(last, tool_calls=(*last.tool_calls, call))
            else:
                out.append(ChatMessage(Role.ASSISTANT, "", None, (call,)))
        else:
            output = _text(item.output)
            out.append(ChatMessage(Role.TOOL, output, None, (), item.call_id))
    return tuple(out)


def output_as_items(output: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stored answer's `output` items in normal form: how the next turn reads them."""
    items: list[dict[str, Any]] = []
    for item in output:
        if item.get("type") == "message":
            text = "".join(str(p.get("text", "")) for p in item.get("content", ()))
            items.append(
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
            )
        elif item.get("type") == "function_call":
            items.append({k: item[k] for k in ("type", "call_id", "name", "arguments")})
    return items


def drop_oldest(items: Sequence[dict[str, Any]], num_dropped: int) -> list[dict[str, Any]]:
    """`items` without its `num_dropped` oldest, and without the answers to calls dropped with them."""
    kept = list(items[num_dropped:])
    calls = {i["call_id"] for i in kept if i.get("type") == "function_call"}
    return [i for i in kept if i.get("type") != "function_call_output" or i["call_id"] in calls]


def _tool_fields(body: rb.ResponsesBody) -> sb.ToolFields:
    tools = [
        sb.ToolDefinition(
            type="function",
            function=sb.FunctionDefinition(
                name=t.name, description=t.description, parameters=t.parameters, strict=t.strict
            ),
        )
        for t in body.tools or ()
    ]
    choice: Any = body.tool_choice
    if isinstance(choice, rb.NamedFunctionChoice):
        if choice.name not in {t.name for t in body.tools or ()}:
            raise BadRequestError(
                f"'tool_choice.name' {choice.name[:64]!r} is not one of the tools", param="tool_choice.name"
            )
        choice = sb.NamedToolChoice(type="function", function=sb.NamedFunction(name=choice.name))
    return sb.ToolFields.model_construct(
        tools=tools, tool_choice=choice, parallel_tool_calls=body.parallel_tool_calls
    )


def _constraint(body: rb.ResponsesBody) -> ConstraintSpec | None:
    fmt = body.text.format if body.text is not None else None
    if isinstance(fmt, rb.JsonObjectTextFormat):
        return ConstraintSpec.json_object("text.format")
    if isinstance(fmt, rb.JsonSchemaTextFormat):
        schema = fmt.schema_ or {"type": "object"}
        check_schema(schema, "text.format.schema")
        return ConstraintSpec.json_schema(schema, "text.format.schema")
    return None


def _options(body: rb.ResponsesBody) -> GenerationOptions:
    sampling: dict[str, Any] = {"temperature": 1.0 if body.temperature is None else body.temperature}
    if body.top_p is not None:
        sampling["top_p"] = body.top_p
    return GenerationOptions(
        max_tokens=body.max_output_tokens,
        sampling=sampling,
        priority=body.priority,
        user=body.user if body.user is not None else body.safety_identifier,
        stream=body.stream,
        include_usage=True,  # the last event carries the whole response, usage included
        constraint=_constraint(body),
    )


def _validate(data: Mapping[str, Any]) -> rb.ResponsesBody:
    try:
        return rb.ResponsesBody.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_context=False, include_input=False)[0]
        if error["type"] == "extra_forbidden":
            path = error_path(error["loc"])
            raise BadRequestError(
                f"'{path[:64]}' is not a field this server supports",
                param=path[:64],
                code="unsupported_parameter",
            ) from None
        raise bad_request(exc) from None


def parse_responses_request(data: Mapping[str, Any], max_items: int) -> ResponsesRequest:
    """Validate a Responses body of at most `max_items` input items (and content parts)."""
    check_chat_counts(data, max_items, "input")
    body = _validate(data)
    if body.stream_options is not None and not body.stream:
        raise BadRequestError("'stream_options' is only allowed with stream: true", param="stream_options")
    given = body.input
    validated: list[Item] = (
        [rb.MessageItem(role="user", content=[rb.InputTextPart(type="input_text", text=given)])]
        if isinstance(given, str)
        else list(given)
    )
    items = normal_items(validated)
    tools = tools_request(_tool_fields(body))
    options = _options(body)
    if tools is not None and tools.constrained:
        if options.constraint is not None:
            raise BadRequestError(
                "a required or named 'tool_choice' cannot be combined with a JSON 'text.format'",
                param="tool_choice",
            )
        options = replace(options, constraint=ConstraintSpec.tool_calls(calls_schema(tools), "tools"))
    request = ResponsesRequest(body, tuple(items), options, tools)
    request._validated.update((id(item), (item, valid)) for item, valid in zip(items, validated, strict=True))
    return request


def format_echo(body: rb.ResponsesBody) -> dict[str, Any]:
    """`text` as the answer states it: the format asked for (`{"type": "text"}` by default)."""
    fmt = body.text.format if body.text is not None else None
    if isinstance(fmt, rb.JsonSchemaTextFormat):
        shown: dict[str, Any] = {
            "type": "json_schema",
            "name": fmt.name,
            "schema": fmt.schema_,
            "strict": bool(fmt.strict),
        }
        if fmt.description is not None:
            shown["description"] = fmt.description
        return {"format": shown}
    return {"format": {"type": fmt.type if fmt is not None else "text"}}


def tools_echo(body: rb.ResponsesBody) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters if t.parameters is not None else {"type": "object", "properties": {}},
            "strict": bool(t.strict),
        }
        for t in body.tools or ()
    ]


def tool_choice_echo(body: rb.ResponsesBody) -> Any:
    choice = body.tool_choice
    if isinstance(choice, rb.NamedFunctionChoice):
        return {"type": "function", "name": choice.name}
    return choice if choice is not None else "auto"
