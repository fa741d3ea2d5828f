"""OpenAI request bodies parsed into typed, validated dataclasses.

Unknown fields are ignored (OpenAI clients send extras); a known field of the wrong type or out of
its bounds is a 400 naming the field. The fields and their bounds are declared once, in
`gateway.openai_fields`, which `/openapi.json` is rendered from too; the sampling fields are read
into `SamplingParams` keywords by name, with no copy here. `engine.request.SamplingParams`
checks the ranges again when the routes build it, before anything reaches the engine.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from engine.errors import InvalidRequestError
from engine.grammar import ConstraintSpec
from engine.request import Priority, SamplingParams
from gateway import openai_fields as f
from gateway import structured_bodies as sb
from gateway.api_fields import as_int_list
from gateway.errors import BadRequestError
from gateway.json_body import loads_bounded
from gateway.tool_calls import ToolsRequest, calls_schema, render_calls, tools_prompt, tools_request

MAX_LOGPROBS = f.MAX_LOGPROBS


class Endpoint(enum.Enum):
    """The generation endpoints; the value is the OpenAI `object` prefix of their responses."""

    CHAT = "chat.completion"
    COMPLETIONS = "text_completion"


class Role(enum.Enum):
    """Chat message roles. `developer` is OpenAI's newer name for `system`."""

    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True)
class ChatMessage:
    """One message, its content flattened to text; an assistant's calls, a tool answer's call id."""

    role: Role
    content: str
    name: str | None = None
    tool_calls: tuple[sb.ToolCall, ...] = ()
    tool_call_id: str | None = None

    def to_template(self) -> dict[str, str]:
        """The dict a Hugging Face chat template expects.

        An assistant's earlier calls are written into its content in the format the model is
        asked to call tools in (`gateway.tool_calls`), since templates without tool support
        (SmolLM2's) would drop them.
        """
        # Templates written before OpenAI renamed the role only know `system`.
        role = Role.SYSTEM if self.role is Role.DEVELOPER else self.role
        content = self.content
        if self.tool_calls:
            content = (content + "\n" if content else "") + render_calls(self.tool_calls)
        message = {"role": role.value, "content": content}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


@dataclass(frozen=True)
class GenerationOptions:
    """The sampling and output fields shared by both endpoints, as the client sent them."""

    max_tokens: int | None  # None: the endpoint's default
    # `SamplingParams` keyword -> value, one per field of `openai_fields.SAMPLING_FIELDS`.
    sampling: Mapping[str, Any] = field(default_factory=dict)
    logprobs: int | None = None  # top alternatives per token; 0: the sampled token only; None: off
    beam_width: int | None = None  # None: n
    priority: Priority | None = None
    user: str | None = None
    stream: bool = False
    include_usage: bool = False
    # What the answer is constrained to (`response_format`, `structured_outputs`, a forced tool
    # call); compiled by the route (`gateway.grammar`) before the request is queued.
    constraint: ConstraintSpec | None = None

    @property
    def n(self) -> int:
        return int(self.sampling.get(f.N.name, 1))

    @property
    def use_beam_search(self) -> bool:
        return bool(self.sampling.get(f.USE_BEAM_SEARCH.name, False))

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's parameters for one prompt; `max_tokens` is resolved by the route
        (the client's, or the endpoint's default within the context and the key's quota)."""
        beam_width = self.beam_width if self.beam_width is not None else self.n
        return SamplingParams(
            max_tokens=max_tokens, logprobs=self.logprobs, beam_width=beam_width, **self.sampling
        )


@dataclass(frozen=True)
class ChatCompletionRequest:
    """A validated `POST /v1/chat/completions` body."""

    model: str
    messages: tuple[ChatMessage, ...]
    options: GenerationOptions
    tools: ToolsRequest | None = None  # None: no tools, or tool_choice "none"

    def prompt_messages(self) -> tuple[ChatMessage, ...]:
        """The messages to render: with tools, their offer joins (or becomes) the system message."""
        if self.tools is None:
            return self.messages
        offer = tools_prompt(self.tools)
        first = self.messages[0]
        if first.role in (Role.SYSTEM, Role.DEVELOPER):
            return (replace(first, content=f"{first.content}\n\n{offer}"), *self.messages[1:])
        return (ChatMessage(Role.SYSTEM, offer), *self.messages)


@dataclass(frozen=True)
class CompletionRequest:
    """A validated `POST /v1/completions` body; each prompt is text or token ids."""

    model: str
    prompts: tuple[str | tuple[int, ...], ...]
    options: GenerationOptions


def decode_json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 (also for too deep nesting and lone surrogates)."""
    data = loads_bounded(body)
    if not isinstance(data, dict):
        raise BadRequestError("request body must be a JSON object", code="invalid_json")
    return data


class _Fields:
    """Typed getters over a JSON object; each raises a 400 naming the field."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data

    def _bad(self, name: str, expected: str) -> BadRequestError:
        got = type(self.data[name]).__name__ if self.data[name] is not None else "null"
        return BadRequestError(f"'{name}' must be {expected}, got {got}", param=name, code="invalid_type")

    def opt_string(self, name: str) -> str | None:
        value = self.data.get(name)
        if value is not None and not isinstance(value, str):
            raise self._bad(name, "a string")
        return value

    def required_str(self, name: str) -> str:
        value = self.opt_string(name)
        if not value:
            raise BadRequestError(f"'{name}' is required", param=name, code="missing_required_parameter")
        return value

    def object_or_none(self, name: str) -> Mapping[str, Any] | None:
        value = self.data.get(name)
        if value is not None and not isinstance(value, dict):
            raise self._bad(name, "an object")
        return value

    def reject_unsupported(self, name: str, allowed: Any = None) -> None:
        """A field we know but do not implement: fine when absent or equal to `allowed`."""
        value = self.data.get(name)
        if value is None or value == allowed or value == [] or value == {}:
            return
        raise BadRequestError(
            f"'{name}' is not supported by this server", param=name, code="unsupported_parameter"
        )


def _priority(fields: _Fields) -> Priority | None:
    value = fields.data.get("priority")
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return Priority.parse(value)
        except InvalidRequestError as exc:
            raise BadRequestError(exc.message, param="priority") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON has one number type
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return Priority(value)
        except ValueError:
            raise BadRequestError(
                f"'priority' must be 0, 1, 2 or interactive, standard, batch; got {value}", param="priority"
            ) from None
    raise fields._bad("priority", "a string or an integer")


def _options(fields: _Fields, logprobs: int | None) -> GenerationOptions:
    data = fields.data
    stream = f.STREAM.read(data)
    stream_options = fields.object_or_none("stream_options")
    include_usage = False
    if stream_options is not None:
        if not stream:
            raise BadRequestError(
                "'stream_options' is only allowed with stream: true", param="stream_options"
            )
        value = stream_options.get("include_usage")
        if value is not None and not isinstance(value, bool):
            raise BadRequestError(
                "'stream_options.include_usage' must be a boolean", param="stream_options.include_usage"
            )
        include_usage = bool(value)
    # max_completion_tokens is the newer name; it wins when both are sent.
    max_tokens = f.MAX_COMPLETION_TOKENS.read(data)
    if max_tokens is None:
        max_tokens = f.MAX_TOKENS.read(data)
    return GenerationOptions(
        max_tokens=max_tokens,
        sampling={spec.name: spec.read(data) for spec in f.SAMPLING_FIELDS},
        logprobs=logprobs,
        beam_width=f.BEAM_WIDTH.read(data),
        priority=_priority(fields),
        user=f.USER.read(data),
        stream=stream,
        include_usage=include_usage,
    )


def _message_content(value: Any, param: str, max_parts: int) -> tuple[str, int]:
    """The content as text, and how many content parts it had."""
    if value is None:
        return "", 0
    if isinstance(value, str):
        return value, 0
    if isinstance(value, list):
        if len(value) > max_parts:
            raise BadRequestError(
                f"'{param}' may hold at most {max_parts} content parts (with those of the messages "
                f"before it), got {len(value)}",
                param=param,
                code="too_many_messages",
            )
        parts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise BadRequestError(f"'{param}[{i}]' must be a content part object", param=f"{param}[{i}]")
            if part["type"] != "text":
                raise BadRequestError(
                    f"content part type {part['type']!r} is not supported; only 'text'",
                    param=f"{param}[{i}].type",
                    code="unsupported_parameter",
                )
            if not isinstance(part.get("text"), str):
                raise BadRequestError(f"'{param}[{i}].text' must be a string", param=f"{param}[{i}].text")
            parts.append(part["text"])
        return "".join(parts), len(value)
    raise BadRequestError(f"'{param}' must be a string or a list of content parts", param=param)


def _messages(fields: _Fields, max_messages: int) -> tuple[ChatMessage, ...]:
    value = fields.data.get("messages")
    if value is None:
        raise BadRequestError("'messages' is required", param="messages", code="missing_required_parameter")
    if not isinstance(value, list) or not value:
        raise BadRequestError("'messages' must be a non-empty list of messages", param="messages")
    # Counted before any message is read: 250,000 empty messages cost seconds to read and render.
    if len(value) > max_messages:
        raise BadRequestError(
            f"'messages' may hold at most {max_messages} messages, got {len(value)}",
            param="messages",
            code="too_many_messages",
        )
    parts_left = max_messages  # content parts, across all messages
    messages = []
    for i, item in enumerate(value):
        param = f"messages[{i}]"
        if not isinstance(item, dict):
            raise BadRequestError(f"'{param}' must be an object", param=param)
        try:
            role = Role(item.get("role"))
        except ValueError:
            raise BadRequestError(
                f"'{param}.role' must be one of {', '.join(r.value for r in Role)}", param=f"{param}.role"
            ) from None
        name = item.get("name")
        if name is not None and not isinstance(name, str):
            raise BadRequestError(f"'{param}.name' must be a string", param=f"{param}.name")
        calls: tuple[sb.ToolCall, ...] = ()
        if role is Role.ASSISTANT and item.get("tool_calls"):
            calls = sb.parse_tool_calls(item["tool_calls"], f"{param}.tool_calls")
        call_id = item.get("tool_call_id") if role is Role.TOOL else None
        if call_id is not None and not isinstance(call_id, str):
            raise BadRequestError(f"'{param}.tool_call_id' must be a string", param=f"{param}.tool_call_id")
        content, num_parts = _message_content(item.get("content"), f"{param}.content", parts_left)
        parts_left -= num_parts
        messages.append(ChatMessage(role, content, name, calls, call_id))
    return tuple(messages)


def _reject_legacy_functions(fields: _Fields) -> None:
    for name in ("functions", "function_call"):
        if fields.data.get(name) is not None:
            raise BadRequestError(
                f"'{name}' (the legacy function calling fields) is not supported; use 'tools' and 'tool_choice'",
                param=name,
                code="unsupported_parameter",
            )


def _constraint(fields: _Fields) -> ConstraintSpec | None:
    """`response_format` / `structured_outputs` as what the engine constrains the answer to."""
    return sb.constraint_of(
        sb.parse_response_format(fields.data.get("response_format")),
        sb.parse_structured_outputs(fields.data.get("structured_outputs")),
    )


def _with_constraint(options: GenerationOptions, spec: ConstraintSpec | None) -> GenerationOptions:
    if spec is None:
        return options
    if options.use_beam_search:
        raise BadRequestError(
            "structured outputs and tool calls are not supported with beam search",
            param=spec.param.split(".")[0],
            code="unsupported_parameter",
        )
    return replace(options, constraint=spec)


def parse_chat_request(
    data: Mapping[str, Any], max_messages: int = f.DEFAULT_MAX_CHAT_MESSAGES
) -> ChatCompletionRequest:
    """Validate a chat completion body of at most `max_messages` messages (and content parts)."""
    fields = _Fields(data)
    model = fields.required_str("model")
    messages = _messages(fields, max_messages)
    _reject_legacy_functions(fields)
    spec = _constraint(fields)
    tools = tools_request(sb.parse_tool_fields(data))
    if tools is not None and tools.constrained:
        if spec is not None:
            raise BadRequestError(
                "a required or named 'tool_choice' cannot be combined with 'response_format'",
                param="tool_choice",
            )
        spec = ConstraintSpec.tool_calls(calls_schema(tools), "tools")
    logprobs_on = f.CHAT_LOGPROBS.read(data)
    top_logprobs = f.TOP_LOGPROBS.read(data)
    if top_logprobs is not None and not logprobs_on:
        raise BadRequestError("'top_logprobs' requires 'logprobs': true", param="top_logprobs")
    logprobs = (top_logprobs or 0) if logprobs_on else None
    options = _with_constraint(_options(fields, logprobs), spec)
    return ChatCompletionRequest(model=model, messages=messages, options=options, tools=tools)


def _too_many_ids(num_ids: int, max_ids: int) -> BadRequestError:
    return BadRequestError(
        f"the prompts hold {num_ids} token ids together; one request may hold at most {max_ids}",
        param="prompt",
        code="prompt_too_long",
    )


def _too_many_prompts(num_prompts: int) -> BadRequestError:
    return BadRequestError(
        f"'prompt' may hold at most {f.MAX_PROMPTS} prompts, got {num_prompts}", param="prompt"
    )


def _prompts(fields: _Fields, max_ids: int) -> tuple[str | tuple[int, ...], ...]:
    value = fields.data.get("prompt")
    if value is None:
        raise BadRequestError("'prompt' is required", param="prompt", code="missing_required_parameter")
    if isinstance(value, str):
        return (value,)

    if isinstance(value, list) and value:
        # Counted before the ids are read, so a list of millions costs no scan.
        if len(value) > max_ids:
            raise _too_many_ids(len(value), max_ids)
        if len(value) > f.MAX_PROMPTS and all(isinstance(p, list) for p in value):
            raise _too_many_prompts(len(value))
        num_ids = sum(len(p) for p in value if isinstance(p, list))
        if num_ids > max_ids:
            raise _too_many_ids(num_ids, max_ids)
        single = as_int_list(value)
        if single is not None:
            return (single,)
        batch: tuple[str | tuple[int, ...], ...] | None = None
        if all(isinstance(p, str) for p in value):
            batch = tuple(value)
        else:
            lists = [as_int_list(p) for p in value]
            if all(ids for ids in lists):
                batch = tuple(ids for ids in lists if ids)
        if batch is not None:
            if len(batch) > f.MAX_PROMPTS:
                raise _too_many_prompts(len(batch))
            return batch
    raise BadRequestError(
        "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists",
        param="prompt",
    )


def parse_completion_request(
    data: Mapping[str, Any], max_prompt_ids: int = f.MAX_REQUEST_PROMPT_TOKENS
) -> CompletionRequest:
    """Validate a (legacy) completion body holding at most `max_prompt_ids` token ids in all."""
    fields = _Fields(data)
    model = fields.required_str("model")
    prompts = _prompts(fields, max_prompt_ids)
    fields.reject_unsupported("tools")
    _reject_legacy_functions(fields)
    spec = _constraint(fields)
    fields.reject_unsupported("echo", allowed=False)
    fields.reject_unsupported("suffix")
    options = _with_constraint(_options(fields, f.COMPLETION_LOGPROBS.read(data)), spec)
    best_of = f.BEST_OF.read(data)
    if best_of is not None and best_of != options.n:
        raise BadRequestError(
            "'best_of' other than n is not supported", param="best_of", code="unsupported_parameter"
        )
    return CompletionRequest(model=model, prompts=prompts, options=options)
