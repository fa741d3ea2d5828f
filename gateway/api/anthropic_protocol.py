"""A Messages body (`weir.gateway.api.anthropic_bodies`) as the chat route's own request.

`POST /v1/messages` runs as a chat completion: the same `ChatCompletionRequest` (messages, tools,
sampling) goes through the same steps (`weir.gateway.routes.openai`). The mapping:

- `system` is the first message (role `system`); a string or text blocks;
- a user message's text blocks are its content; each `tool_result` block becomes a `tool`
  message answering its `tool_use_id` (before the text, as Anthropic clients put them first);
- an assistant message's `tool_use` blocks are its `tool_calls` (the input as JSON arguments);
- `tools` are functions whose parameters are the `input_schema`; `tool_choice` `auto`, `any`,
  `tool` and `none` are `auto`, `required`, a named function and `none`, and
  `disable_parallel_tool_use` is `parallel_tool_calls: false`;
- `max_tokens`, `temperature`, `top_p`, `top_k`, `stop_sequences` (as stop strings) and
  `metadata.user_id` (as `user`) are the sampling and output options.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from weir.engine.structured.grammar import ConstraintSpec
from weir.gateway.api import anthropic_bodies as ab
from weir.gateway.api import structured_bodies as sb
from weir.gateway.api.openai_bodies.params import bad_request
from weir.gateway.api.openai_bodies.requests import Role
from weir.gateway.api.protocol import ChatCompletionRequest, ChatMessage, GenerationOptions, check_chat_counts
from weir.gateway.api.tool_calls import calls_schema, tools_request
from weir.gateway.http.errors import BadRequestError
from weir.gateway.settings.settings_prompts import DEFAULT_MAX_CHAT_MESSAGES


def _text(content: str | list[ab.TextBlock]) -> str:
    return content if isinstance(content, str) else "".join(block.text for block in content)


def _user_messages(message: ab.MessageParam, index: int) -> list[ChatMessage]:
    if isinstance(message.content, str):
        return [ChatMessage(Role.USER, message.content)]
    results, texts = [], []
    for j, block in enumerate(message.content):
        if isinstance(block, ab.ToolUseBlock):
            raise BadRequestError(
                f"'messages[{index}].content[{j}].type': a 'tool_use' block belongs in an assistant message",
                param=f"messages[{index}].content[{j}].type",
            )
        if isinstance(block, ab.ToolResultBlock):
            text = _text(block.content)
            results.append(
                ChatMessage(
                    Role.TOOL, f"Error: {text}" if block.is_error else text, None, (), block.tool_use_id
                )
            )
        else:
            texts.append(block.text)
    return results + ([ChatMessage(Role.USER, "".join(texts))] if texts or not results else [])


def _assistant_message(message: ab.MessageParam, index: int) -> ChatMessage:
    if isinstance(message.content, str):
        return ChatMessage(Role.ASSISTANT, message.content)
    texts, calls = [], []
    for j, block in enumerate(message.content):
        if isinstance(block, ab.ToolResultBlock):
            raise BadRequestError(
                f"'messages[{index}].content[{j}].type': a 'tool_result' block belongs in a user message",
                param=f"messages[{index}].content[{j}].type",
            )
        if isinstance(block, ab.ToolUseBlock):
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append(
                sb.ToolCall(id=block.id, function=sb.FunctionCall(name=block.name, arguments=arguments))
            )
        else:
            texts.append(block.text)
    return ChatMessage(Role.ASSISTANT, "".join(texts), None, tuple(calls))


def chat_messages(body: ab.MessagesBody) -> tuple[ChatMessage, ...]:
    """The conversation as the chat route's messages."""
    out: list[ChatMessage] = []
    if body.system is not None and _text(body.system):
        out.append(ChatMessage(Role.SYSTEM, _text(body.system)))
    for i, message in enumerate(body.messages):
        if message.role == "user":
            out.extend(_user_messages(message, i))
        else:
            out.append(_assistant_message(message, i))
    return tuple(out)


def _tool_fields(body: ab.MessagesBody) -> sb.ToolFields:
    tools = [
        sb.ToolDefinition(
            type="function",
            function=sb.FunctionDefinition(name=t.name, description=t.description, parameters=t.input_schema),
        )
        for t in body.tools or ()
    ]
    choice: Any = None
    parallel: bool | None = None
    given = body.tool_choice
    if isinstance(given, ab.ToolChoiceNone):
        choice = "none"
    elif given is not None:
        parallel = False if given.disable_parallel_tool_use else None
        if isinstance(given, ab.ToolChoiceAuto):
            choice = "auto"
        elif isinstance(given, ab.ToolChoiceAny):
            choice = "required"
        else:
            if given.name not in {t.name for t in body.tools or ()}:
                raise BadRequestError(
                    f"'tool_choice.name' {given.name[:64]!r} is not one of the tools",
                    param="tool_choice.name",
                )
            choice = sb.NamedToolChoice(type="function", function=sb.NamedFunction(name=given.name))
    return sb.ToolFields.model_construct(tools=tools, tool_choice=choice, parallel_tool_calls=parallel)


def _options(body: ab.MessagesBody) -> GenerationOptions:
    sampling: dict[str, Any] = {"temperature": 1.0 if body.temperature is None else body.temperature}
    if body.top_p is not None:
        sampling["top_p"] = body.top_p
    if body.top_k is not None:
        sampling["top_k"] = body.top_k
    if body.stop_sequences:
        sampling["stop"] = tuple(body.stop_sequences)
    return GenerationOptions(
        max_tokens=body.max_tokens,
        sampling=sampling,
        user=body.metadata.user_id if body.metadata is not None else None,
        stream=body.stream,
        include_usage=True,  # Anthropic's answers always end with the usage
    )


def parse_messages_request(
    data: Mapping[str, Any], max_messages: int = DEFAULT_MAX_CHAT_MESSAGES
) -> ChatCompletionRequest:
    """Validate a Messages body of at most `max_messages` messages (and content blocks) and
    translate it into the chat route's request."""
    check_chat_counts(data, max_messages)
    try:
        body = ab.MessagesBody.model_validate(data)
    except ValidationError as exc:
        raise bad_request(exc) from None
    tools = tools_request(_tool_fields(body))
    options = _options(body)
    if tools is not None and tools.constrained:
        options = replace(options, constraint=ConstraintSpec.tool_calls(calls_schema(tools), "tools"))
    return ChatCompletionRequest(model=body.model, messages=chat_messages(body), options=options, tools=tools)
