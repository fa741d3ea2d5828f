"""OpenAI request bodies, validated by their models (`weir.gateway.api.openai_bodies.requests`), as the
typed requests the routes run.

Before a model runs, the counts that would make validation itself slow are bounded (messages and
content parts, token ids, prompts); after it, the checks between fields (`top_logprobs` needs
`logprobs`, a constraint excludes beam search). Each failure is a 400 naming the field. The
sampling fields become `SamplingParams` keywords of the same name.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from pydantic import ValidationError

from weir.engine.request import Priority, SamplingParams
from weir.engine.structured.grammar import ConstraintSpec
from weir.gateway.api import structured_bodies as sb
from weir.gateway.api.openai_bodies import requests as rb
from weir.gateway.api.openai_bodies.params import bad_request
from weir.gateway.api.openai_bodies.requests import Role
from weir.gateway.api.tool_calls import ToolsRequest, calls_schema, render_calls, tools_prompt, tools_request
from weir.gateway.http.errors import BadRequestError
from weir.gateway.http.json_body import loads_bounded
from weir.gateway.settings.settings_prompts import DEFAULT_MAX_CHAT_MESSAGES


class Endpoint(enum.Enum):
    """The endpoints a usage record names; for the OpenAI ones the value is the `object` prefix of
    their responses."""

    CHAT = "chat.completion"
    COMPLETIONS = "text_completion"
    MESSAGES = "message"  # Anthropic's `POST /v1/messages`, run as a chat
    RESPONSES = "response"  # OpenAI's `POST /v1/responses`, run as a chat
    TOKENIZE = "tokenize"  # `POST /tokenize` and `/detokenize`: admitted, nothing generated


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
        asked to call tools in (`weir.gateway.api.tool_calls`), since templates without tool support
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
    # `SamplingParams` keyword -> value, one per name of `openai_bodies.requests.SAMPLING_FIELDS`.
    sampling: Mapping[str, Any] = field(default_factory=dict)
    logprobs: int | None = None  # top alternatives per token; 0: the sampled token only; None: off
    beam_width: int | None = None  # None: n
    priority: Priority | None = None
    user: str | None = None
    stream: bool = False
    include_usage: bool = False
    # What the answer is constrained to (`response_format`, `structured_outputs`, a forced tool
    # call); compiled by the route (`weir.gateway.prompts.grammar`) before the request is queued.
    constraint: ConstraintSpec | None = None

    @property
    def n(self) -> int:
        return int(self.sampling.get("n", 1))

    @property
    def use_beam_search(self) -> bool:
        return bool(self.sampling.get("use_beam_search", False))

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


BodyT = TypeVar("BodyT", bound=rb.GenerationBody)


def _validate(model: type[BodyT], data: Mapping[str, Any]) -> BodyT:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise bad_request(exc) from None


def _reject_unsupported(data: Mapping[str, Any], *names: str) -> None:
    """Fields we know but do not implement (undocumented: the legacy function calling ones)."""
    for name in names:
        if data.get(name) is not None:
            hint = (
                " (the legacy function calling fields); use 'tools' and 'tool_choice'"
                if "function" in name
                else ""
            )
            raise BadRequestError(
                f"'{name}' is not supported by this server{hint}", param=name, code="unsupported_parameter"
            )


def _options(body: rb.GenerationBody, logprobs: int | None) -> GenerationOptions:
    include_usage = False
    if body.stream_options is not None:
        if not body.stream:
            raise BadRequestError(
                "'stream_options' is only allowed with stream: true", param="stream_options"
            )
        include_usage = bool(body.stream_options.include_usage)
    sampling: dict[str, Any] = {name: getattr(body, name) for name in rb.SAMPLING_FIELDS}
    if body.stop is not None:
        sampling["stop"] = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop)
    if body.stop_token_ids is not None:
        sampling["stop_token_ids"] = tuple(body.stop_token_ids)
    if body.logit_bias is not None:
        sampling["logit_bias"] = tuple((int(k), v) for k, v in body.logit_bias.items())
    # max_completion_tokens is the newer name; it wins when both are sent.
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    options = GenerationOptions(
        max_tokens=max_tokens,
        sampling=sampling,
        logprobs=logprobs,
        beam_width=body.beam_width,
        priority=body.priority,
        user=body.user,
        stream=body.stream,
        include_usage=include_usage,
    )
    return _with_constraint(options, sb.constraint_of(body.response_format, body.structured_outputs))


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


def check_chat_counts(data: Mapping[str, Any], max_messages: int, field: str = "messages") -> None:
    """Messages (`field`: `messages`, or a Responses body's `input` items), and content parts
    across them, counted before any is read: 250,000 empty messages cost seconds to validate and
    render. An input item's parts are its `content`, or a function call output's `output`."""
    messages = data.get(field)
    if not isinstance(messages, list):
        return
    chat = field == "messages"
    noun, code = ("messages", "too_many_messages") if chat else ("items", "too_many_items")
    if len(messages) > max_messages:
        raise BadRequestError(
            f"'{field}' may hold at most {max_messages} {noun}, got {len(messages)}", param=field, code=code
        )
    parts_left = max_messages
    for i, message in enumerate(messages):
        content = None
        if isinstance(message, dict):
            content = message.get("content") if chat else message.get("content", message.get("output"))
        if isinstance(content, list):
            if len(content) > parts_left:
                param = f"{field}[{i}].content" if chat else f"{field}[{i}]"
                raise BadRequestError(
                    f"'{param}' may hold at most {parts_left} content parts (with those of the {noun} "
                    f"before it), got {len(content)}",
                    param=param,
                    code=code,
                )
            parts_left -= len(content)


def message_of(body: rb.ChatMessageBody) -> ChatMessage:
    content = body.content
    text = content if isinstance(content, str) else "".join(p.text for p in content or ())
    role = body.role
    calls = tuple(body.tool_calls or ()) if role is Role.ASSISTANT else ()
    call_id = body.tool_call_id if role is Role.TOOL else None
    return ChatMessage(role, text, body.name, calls, call_id)


def parse_chat_request(
    data: Mapping[str, Any], max_messages: int = DEFAULT_MAX_CHAT_MESSAGES
) -> ChatCompletionRequest:
    """Validate a chat completion body of at most `max_messages` messages (and content parts)."""
    check_chat_counts(data, max_messages)
    _reject_unsupported(data, "functions", "function_call")
    body = _validate(rb.ChatCompletionBody, data)
    if body.top_logprobs is not None and not body.logprobs:
        raise BadRequestError("'top_logprobs' requires 'logprobs': true", param="top_logprobs")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    options = _options(body, logprobs)
    tool_fields = sb.ToolFields.model_construct(
        tools=body.tools or [], tool_choice=body.tool_choice, parallel_tool_calls=body.parallel_tool_calls
    )
    tools = tools_request(tool_fields)
    if tools is not None and tools.constrained:
        if options.constraint is not None:
            raise BadRequestError(
                "a required or named 'tool_choice' cannot be combined with 'response_format'",
                param="tool_choice",
            )
        options = _with_constraint(options, ConstraintSpec.tool_calls(calls_schema(tools), "tools"))
    messages = tuple(message_of(m) for m in body.messages)
    return ChatCompletionRequest(model=body.model, messages=messages, options=options, tools=tools)


def _too_many_ids(num_ids: int, max_ids: int) -> BadRequestError:
    return BadRequestError(
        f"the prompts hold {num_ids} token ids together; one request may hold at most {max_ids}",
        param="prompt",
        code="prompt_too_long",
    )


def _check_prompt_counts(data: Mapping[str, Any], max_ids: int) -> None:
    """Token ids and prompts counted before they are read, so a list of millions costs no scan."""
    value = data.get("prompt")
    if not isinstance(value, list):
        return
    if len(value) > max_ids:
        raise _too_many_ids(len(value), max_ids)
    num_ids = sum(len(p) for p in value if isinstance(p, list))
    if num_ids > max_ids:
        raise _too_many_ids(num_ids, max_ids)
    if len(value) > rb.MAX_PROMPTS and value and not isinstance(value[0], int | float):
        raise BadRequestError(
            f"'prompt' may hold at most {rb.MAX_PROMPTS} prompts, got {len(value)}", param="prompt"
        )


def parse_completion_request(
    data: Mapping[str, Any], max_prompt_ids: int = rb.MAX_REQUEST_PROMPT_TOKENS
) -> CompletionRequest:
    """Validate a (legacy) completion body holding at most `max_prompt_ids` token ids in all."""
    _check_prompt_counts(data, max_prompt_ids)
    _reject_unsupported(data, "suffix", "functions", "function_call")
    body = _validate(rb.CompletionBody, data)
    options = _options(body, body.logprobs)
    if body.best_of is not None and body.best_of != options.n:
        raise BadRequestError(
            "'best_of' other than n is not supported", param="best_of", code="unsupported_parameter"
        )
    prompt = body.prompt
    prompts: tuple[str | tuple[int, ...], ...]
    if isinstance(prompt, str):
        prompts = (prompt,)
    elif isinstance(prompt[0], str):
        prompts = tuple(prompt)  # type: ignore[arg-type]
    elif isinstance(prompt[0], int):
        prompts = (tuple(prompt),)  # type: ignore[arg-type]
    else:
        prompts = tuple(tuple(ids) for ids in prompt)  # type: ignore[union-attr]
    return CompletionRequest(model=body.model, prompts=prompts, options=options)
