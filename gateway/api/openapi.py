"""The OpenAPI 3.1 description of the whole API, served at `/openapi.json`.

Every operation the app serves is listed, the admin ones included, with its security scheme
(`bearer`: a tenant's API key; `admin_token`: the operator's). The OpenAI request bodies and
answers are generated from the pydantic models the validator and the tests use
(`weir.gateway.api.openai_bodies`), with the served model names as the `model` enum and token ids bounded
by the vocabulary, so that a client generating requests from this document
(a fuzzer, an SDK generator) sends what the server accepts. OpenAI clients may send more fields,
which are ignored.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Collection
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from weir.gateway.api import anthropic_bodies as ab
from weir.gateway.api import responses_bodies as resb
from weir.gateway.api import tokenize_bodies as tb
from weir.gateway.api.openai_bodies import requests as rb
from weir.gateway.api.openai_bodies.responses import ANSWERS
from weir.gateway.api.openapi_admin import ADMIN, admin_paths
from weir.gateway.api.openapi_admin import SCHEMAS as ADMIN_SCHEMAS

_PREFIX_CACHE = "/admin/v1/prefix-cache"
_MODELS = "/admin/v1/models"  # the model-version routes, mounted only with a fleet that loads
_ADAPTERS = "/admin/v1/adapters"  # the LoRA adapter routes, likewise
_CONVERTER = re.compile(r"\{(\w+):\w+\}")  # Starlette's {name:path} is OpenAPI's {name}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERRORS = {
    str(code): _json(_ref("Error"), text)
    for code, text in [
        (
            400,
            "Invalid field (named in error.param), malformed JSON, or prompt + max_tokens beyond the context",
        ),
        (401, "Missing or invalid API key or admin token"),
        (403, "The API key may not use this model or operation"),
        (404, "Unknown model or resource"),
        (408, "The request body was not received in time"),
        (409, "Conflict with the current state (e.g. the tenant exists)"),
        (413, "Request body too large"),
        (422, "Well-formed, but a value is not acceptable (admin fields; chat template)"),
        (429, "Rate limit or budget exceeded"),
        (500, "Engine failure on this request"),
        (
            503,
            "Engine or database unavailable, shutting down, or the model has no ready version (Retry-After)",
        ),
    ]
}


def _generation(summary: str, request: str, response: str, chunk: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {
                "200": {
                    "description": "The completion, or an SSE stream of chunks",
                    "content": {
                        "application/json": {"schema": _ref(response)},
                        # Each event's data (but the last, `[DONE]`).
                        "text/event-stream": {"schema": _ref(chunk)},
                    },
                },
                **_ERRORS,
            },
        }
    }


def _messages() -> dict[str, Any]:
    """`POST /v1/messages`: Anthropic's Messages API (its keys as `x-api-key` or bearer)."""
    errors = {code: _json(_ref("AnthropicError"), item["description"]) for code, item in _ERRORS.items()}
    return {
        "post": {
            "summary": "Anthropic Messages (run as a chat completion)",
            "security": [{"bearer": []}, {"x_api_key": []}],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref("MessagesRequest")}},
            },
            "responses": {
                "200": {
                    "description": "The message, or an SSE stream of its events (message_start ... message_stop)",
                    "content": {
                        "application/json": {"schema": _ref("AnthropicMessage")},
                        "text/event-stream": {},
                    },
                },
                **{c: errors[c] for c in errors if c not in ("409", "422")},
            },
        }
    }


def _responses() -> dict[str, Any]:
    """OpenAI's Responses API: create, and the stored responses of the caller's tenant."""
    response_id = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    stored = {c: _ERRORS[c] for c in ("401", "404", "429", "503")}
    listing = [
        *response_id,
        {"name": "order", "in": "query", "schema": {"type": "string", "enum": ["asc", "desc"]}},
        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
        {"name": "after", "in": "query", "schema": {"type": "string"}},
    ]
    return {
        "/v1/responses": {
            "post": {
                "summary": "OpenAI Responses (run as a chat completion; stored per tenant unless store: false)",
                "security": [{"bearer": []}],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("ResponsesRequest")}},
                },
                "responses": {
                    "200": {
                        "description": "The response, or an SSE stream of its typed events "
                        "(response.created ... response.completed)",
                        "content": {
                            "application/json": {"schema": _ref("ResponseObject")},
                            "text/event-stream": {},
                        },
                    },
                    **{c: _ERRORS[c] for c in _ERRORS if c not in ("409", "422")},
                },
            }
        },
        "/v1/responses/{response_id}": {
            "get": {
                "summary": "A stored response of this tenant",
                "security": [{"bearer": []}],
                "parameters": response_id,
                "responses": {"200": _json(_ref("ResponseObject"), "The response"), **stored},
            },
            "delete": {
                "summary": "Delete a stored response of this tenant",
                "security": [{"bearer": []}],
                "parameters": response_id,
                "responses": {"200": _json(_ref("DeletedResponse"), "Deleted"), **stored},
            },
        },
        "/v1/responses/{response_id}/input_items": {
            "get": {
                "summary": "The input items that made a stored response's prompt",
                "security": [{"bearer": []}],
                "parameters": listing,
                "responses": {
                    "200": _json(_ref("InputItemList"), "A page of items"),
                    **stored,
                    "400": _ERRORS["400"],
                },
            }
        },
    }


def _tokenizer(summary: str, request: str, answer: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {"200": _json(_ref(answer), "OK"), **_ERRORS},
        }
    }


def _answer_and_body_schemas() -> dict[str, Any]:
    """The component schemas of the bodies and answers, as pydantic generates them from the models
    (the same for every app; `openapi_schema` adds what the served models decide)."""
    global _GENERATED
    if _GENERATED is None:
        models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
            (rb.ChatCompletionBody, "validation"),
            (rb.CompletionBody, "validation"),
            (ab.MessagesBody, "validation"),
            (resb.ResponsesBody, "validation"),
            (tb.TokenizeBody, "validation"),
            (tb.DetokenizeBody, "validation"),
            *((answer, "serialization") for answer in ANSWERS),
            *((answer, "serialization") for answer in _OTHER_ANSWERS),
        ]
        _, top = models_json_schema(models, ref_template=_REF)
        text = json.dumps(top["$defs"])
        for model, name in _COMPONENT_NAMES.items():  # the class name, as a key and in references
            text = text.replace(f'"{model}"', f'"{name}"').replace(f'/{model}"', f'/{name}"')
        _GENERATED = json.loads(text)
    return _GENERATED


# The documented names of the request bodies, as clients have known them.
_COMPONENT_NAMES = {
    "ChatCompletionBody": "ChatCompletionRequest",
    "CompletionBody": "CompletionRequest",
    "MessagesBody": "MessagesRequest",
    "ResponsesBody": "ResponsesRequest",
    "TokenizeBody": "TokenizeRequest",
    "DetokenizeBody": "DetokenizeRequest",
}
_OTHER_ANSWERS: tuple[type[BaseModel], ...] = (
    ab.AnthropicMessage,
    ab.AnthropicError,
    *resb.RESPONSES_ANSWERS,
    tb.TokenizeAnswer,
    tb.DetokenizeAnswer,
)


_REF = "#/components/schemas/{model}"
_GENERATED: dict[str, Any] | None = None


def _bound_token_ids(schema: Any, vocab_size: int | None) -> None:
    """Token ids (marked by the models) below the vocabulary size, where the server knows it."""
    stack = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.pop(rb.TOKEN_ID_MARK, False) and vocab_size is not None:
                item["maximum"] = vocab_size - 1
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _schemas(models: list[str], vocab_size: int | None) -> dict[str, Any]:
    schemas = copy.deepcopy(_answer_and_body_schemas())
    _bound_token_ids(schemas, vocab_size)
    model = {"type": "string", "enum": models} if models else {"type": "string", "minLength": 1}
    for body in ("ChatCompletionRequest", "CompletionRequest", "MessagesRequest", "ResponsesRequest"):
        schemas[body]["properties"]["model"] = model
    for body in ("TokenizeRequest", "DetokenizeRequest"):  # optional there: null or left out
        schemas[body]["properties"]["model"] = {"anyOf": [model, {"type": "null"}], "default": None}
    # `/tokenize` takes exactly one of the two.
    schemas["TokenizeRequest"]["oneOf"] = [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}, "messages": {"type": "null"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}, "prompt": {"type": "null"}}},
    ]
    # Fields that only make sense with another one set (the validator refuses them otherwise).
    needs_stream = {"properties": {"stream": {"const": True}}, "required": ["stream"]}
    schemas["ChatCompletionRequest"]["dependentSchemas"] = {
        "top_logprobs": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]},
        "stream_options": needs_stream,
    }
    schemas["CompletionRequest"]["dependentSchemas"] = {"stream_options": needs_stream}
    schemas["ResponsesRequest"]["dependentSchemas"] = {"stream_options": needs_stream}
    schemas["Error"] = _ref("ErrorBody")  # the name the admin operations refer to
    return schemas


def openapi_schema(
    version: str = "0.1.0",
    *,
    models: Collection[str] = (),
    vocab_size: int | None = None,
    mounted: Collection[str] | None = None,
) -> dict[str, Any]:
    """The document for `/openapi.json`.

    `models`: the served model names (the `model` enum; empty: any string). `vocab_size`: bounds
    token ids. `mounted`: the top-level paths the app serves (a route's or a mount's path); the
    admin and usage operations are listed only where they are mounted; None lists them all.
    """
    probe = {
        "200": {"description": "OK"},
        "503": {"description": "Not alive / not ready"},
    }
    names = sorted(models)
    paths: dict[str, Any] = {
        "/v1/chat/completions": _generation(
            "Chat completion", "ChatCompletionRequest", "ChatCompletion", "ChatCompletionChunk"
        ),
        "/v1/completions": _generation("Completion", "CompletionRequest", "Completion", "CompletionChunk"),
        "/v1/messages": _messages(),
        **_responses(),
        "/tokenize": _tokenizer("Token ids of a prompt or a chat", "TokenizeRequest", "TokenizeAnswer"),
        "/detokenize": _tokenizer("The text of token ids", "DetokenizeRequest", "DetokenizeAnswer"),
        "/v1/models": {
            "get": {
                "summary": "Models this API key may use",
                "security": [{"bearer": []}],
                "responses": {
                    "200": _json(_ref("ModelList"), "The models"),
                    "401": _ERRORS["401"],
                    "429": _ERRORS["429"],
                    "503": _ERRORS["503"],
                },
            }
        },
        "/v1/models/{model}": {
            "get": {
                "summary": "One model",
                "security": [{"bearer": []}],
                "parameters": [
                    {
                        "name": "model",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "enum": names} if names else {"type": "string"},
                    }
                ],
                "responses": {
                    "200": _json(_ref("ModelCard"), "The model"),
                    **{c: _ERRORS[c] for c in ("401", "403", "404", "429", "503")},
                },
            }
        },
        "/health": {"get": {"summary": "Liveness", "security": [], "responses": probe}},
        "/ready": {
            "get": {
                "summary": "Readiness: model loaded and warm, not draining",
                "security": [],
                "responses": probe,
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (names every tenant: the admin token, or the metrics port)",
                "security": ADMIN,
                "responses": {"200": {"description": "OK", "content": {"text/plain": {}}}},
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "security": [],
                "responses": {"200": {"description": "OK", "content": {"application/json": {}}}},
            }
        },
    }
    paths |= admin_paths(_ERRORS)
    if mounted is not None:
        prefixes = [_CONVERTER.sub(r"{\1}", m).rstrip("/") for m in mounted]
        # The prefix-cache API is its own mount; /admin/v1's catch-all would answer it with 404.
        paths = {
            p: item
            for p, item in paths.items()
            if any(_under(p, m) for m in prefixes)
            and (not _under(p, _PREFIX_CACHE) or _PREFIX_CACHE in prefixes)
            and (not _under(p, _MODELS) or _MODELS in prefixes)
            and (not _under(p, _ADAPTERS) or _ADAPTERS in prefixes)
        }
    schemas = {**_schemas(names, vocab_size), **ADMIN_SCHEMAS}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Weir",
            "version": version,
            "description": "OpenAI-compatible inference gateway (chat, completions, Responses; and "
            "Anthropic's Messages API).",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "A tenant's API key."},
                "x_api_key": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "x-api-key",
                    "description": "A tenant's API key, as Anthropic's clients send it (/v1/messages).",
                },
                "admin_token": {"type": "http", "scheme": "bearer", "description": "The admin token."},
            },
        },
    }


def _under(path: str, mounted: str) -> bool:
    """Whether the documented `path` is the routed path `mounted` or lies under that mount."""
    return path == mounted or path.startswith(mounted + "/")


class LiveDocument:
    """`/openapi.json` for an app whose served models change (versions loaded, rolled out,
    retired): rendered again when the model names or the vocabulary change, else served as is."""

    def __init__(self, version: str = "0.1.0", mounted: Collection[str] | None = None) -> None:
        self.version = version
        self.mounted = mounted
        self._key: tuple[tuple[str, ...], int | None] | None = None
        self._body = b""

    def render(self, models: Collection[str], vocab_size: int | None) -> bytes:
        key = (tuple(sorted(models)), vocab_size)
        if key != self._key:
            doc = openapi_schema(self.version, models=key[0], vocab_size=vocab_size, mounted=self.mounted)
            self._body, self._key = json.dumps(doc).encode(), key
        return self._body
