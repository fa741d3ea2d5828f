"""The OpenAPI 3.1 description of the whole API, served at `/openapi.json`.

Every operation the app serves is listed, the admin ones included, with its security scheme
(`bearer`: a tenant's API key; `admin_token`: the operator's). The generation request bodies are
rendered from the field declarations the validator uses (`gateway.openai_fields`), with the
served model names as the `model` enum, so that a client generating requests from this document
(a fuzzer, an SDK generator) sends what the server accepts. OpenAI clients may send more fields,
which are ignored.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection
from typing import Any

from gateway.openai_fields import chat_request_schema, completion_request_schema
from gateway.openapi_admin import ADMIN, admin_paths
from gateway.openapi_admin import SCHEMAS as ADMIN_SCHEMAS
from gateway.structured_bodies import openapi_properties

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
        (503, "Engine or database unavailable, or shutting down"),
    ]
}

_USAGE = {
    "type": "object",
    "properties": {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"},
        "total_tokens": {"type": "integer"},
        "prompt_tokens_details": {"type": "object", "properties": {"cached_tokens": {"type": "integer"}}},
    },
}

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                },
            }
        },
    },
    "Usage": _USAGE,
    "ChatCompletion": {
        "type": "object",
        "description": "With stream: true, a text/event-stream of chat.completion.chunk objects ending "
        "with `data: [DONE]`.",
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "chat.completion"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "system_fingerprint": {"type": "string"},
            "choices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "index": {"type": "integer"},
                        "message": {
                            "type": "object",
                            "properties": {"role": {"const": "assistant"}, "content": {"type": "string"}},
                        },
                        "logprobs": {"type": ["object", "null"]},
                        "finish_reason": {"type": "string", "enum": ["stop", "length", "abort"]},
                    },
                },
            },
            "usage": _ref("Usage"),
        },
    },
    "Completion": {
        "type": "object",
        "description": "With stream: true, a text/event-stream of text_completion chunks ending with "
        "`data: [DONE]`.",
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "text_completion"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "index": {"type": "integer"},
                        "text": {"type": "string"},
                        "logprobs": {"type": ["object", "null"]},
                        "finish_reason": {"type": "string"},
                    },
                },
            },
            "usage": _ref("Usage"),
        },
    },
    "Model": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
            "max_model_len": {"type": "integer"},
        },
    },
}


def _generation(summary: str, request: str, response: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {
                "200": {
                    "description": "The completion, or an SSE stream of chunks",
                    "content": {"application/json": {"schema": _ref(response)}, "text/event-stream": {}},
                },
                **_ERRORS,
            },
        }
    }


def _add_structured_fields(schemas: dict[str, Any]) -> None:
    """Structured outputs and tools (declared as pydantic models) on the generation bodies."""
    chat, completion, message, defs = openapi_properties()
    chat_body, completion_body = schemas["ChatCompletionRequest"], schemas["CompletionRequest"]
    chat_body["properties"].update(chat)
    completion_body["properties"].update(completion)
    chat_body["properties"]["messages"]["items"]["properties"].update(message)
    schemas.update(defs)
    schemas["ChatCompletion"] = copy.deepcopy(schemas["ChatCompletion"])  # not the module's own
    choice = schemas["ChatCompletion"]["properties"]["choices"]["items"]["properties"]
    choice["message"]["properties"]["content"] = {"type": ["string", "null"]}
    choice["message"]["properties"]["tool_calls"] = message["tool_calls"]
    choice["finish_reason"]["enum"] = ["stop", "length", "abort", "tool_calls"]


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
        "/v1/chat/completions": _generation("Chat completion", "ChatCompletionRequest", "ChatCompletion"),
        "/v1/completions": _generation("Completion", "CompletionRequest", "Completion"),
        "/v1/models": {
            "get": {
                "summary": "Models this API key may use",
                "security": [{"bearer": []}],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "object": {"const": "list"},
                                "data": {"type": "array", "items": _ref("Model")},
                            },
                        },
                        "The models",
                    ),
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
                    "200": _json(_ref("Model"), "The model"),
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
    schemas = {
        **_SCHEMAS,
        "ChatCompletionRequest": chat_request_schema(names, vocab_size),
        "CompletionRequest": completion_request_schema(names, vocab_size),
        **ADMIN_SCHEMAS,
    }
    _add_structured_fields(schemas)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Weir", "version": version, "description": "OpenAI-compatible inference gateway."},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "A tenant's API key."},
                "admin_token": {"type": "http", "scheme": "bearer", "description": "The admin token."},
            },
        },
    }


def _under(path: str, mounted: str) -> bool:
    """Whether the documented `path` is the routed path `mounted` or lies under that mount."""
    return path == mounted or path.startswith(mounted + "/")
