"""The OpenAPI 3.1 description of the public API, served at `/openapi.json`.

Hand-written (the handlers parse bodies themselves, so there is nothing to introspect). It lists
the fields this server supports; OpenAI clients may send more, which are ignored.
"""

from __future__ import annotations

from typing import Any


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
        (401, "Missing or invalid API key"),
        (403, "The API key may not use this model"),
        (404, "Unknown model"),
        (413, "Request body too large"),
        (422, "Well-formed, but the model's chat template cannot render the messages"),
        (429, "Rate limit or budget exceeded"),
        (500, "Engine failure on this request"),
        (503, "Engine unavailable or shutting down"),
    ]
}

_SAMPLING: dict[str, Any] = {
    "max_tokens": {"type": "integer", "minimum": 1},
    "max_completion_tokens": {"type": "integer", "minimum": 1, "description": "Wins over max_tokens."},
    "temperature": {"type": "number", "minimum": 0, "default": 1},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1},
    "n": {"type": "integer", "minimum": 1, "maximum": 16, "default": 1},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 16}]},
    "seed": {"type": "integer"},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2, "default": 0},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2, "default": 0},
    "user": {"type": "string"},
    "stream": {"type": "boolean", "default": False},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "top_k": {"type": "integer", "description": "Extension. -1 disables.", "default": -1},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1, "description": "Extension.", "default": 0},
    "repetition_penalty": {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": "Extension.",
        "default": 1,
    },
    "ignore_eos": {"type": "boolean", "description": "Extension.", "default": False},
    "stop_token_ids": {"type": "array", "items": {"type": "integer"}, "description": "Extension."},
    "priority": {
        "oneOf": [{"type": "string", "enum": ["interactive", "standard", "batch"]}, {"type": "integer"}],
        "description": "Extension. May only lower the API key's priority class.",
    },
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
    "ChatMessage": {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
            "content": {
                "oneOf": [
                    {"type": "string"},
                    {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                        },
                    },
                ]
            },
            "name": {"type": "string"},
        },
    },
    "ChatCompletionRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            "model": {"type": "string"},
            "messages": {"type": "array", "items": _ref("ChatMessage"), "minItems": 1},
            "logprobs": {"type": "boolean", "default": False},
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
            **_SAMPLING,
        },
    },
    "CompletionRequest": {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {
            "model": {"type": "string"},
            "prompt": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "string"}},
                    {"type": "array", "items": {"type": "integer"}},
                    {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                ]
            },
            "logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
            **_SAMPLING,
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


def openapi_schema(version: str = "0.1.0") -> dict[str, Any]:
    """The document for `/openapi.json`."""
    probe = {"200": {"description": "OK"}, "503": {"description": "Not alive / not ready"}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Weir", "version": version, "description": "OpenAI-compatible inference gateway."},
        "paths": {
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
                    },
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "One model",
                    "security": [{"bearer": []}],
                    "parameters": [
                        {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                    "responses": {"200": _json(_ref("Model"), "The model"), "404": _ERRORS["404"]},
                }
            },
            "/health": {"get": {"summary": "Liveness", "responses": probe}},
            "/ready": {
                "get": {"summary": "Readiness: model loaded and warm, not draining", "responses": probe}
            },
            "/metrics": {
                "get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "OK"}}}
            },
        },
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
