"""The fields of the OpenAI request bodies, declared once, with their bounds.

`gateway.protocol` validates bodies with these declarations, `gateway.openapi` renders the
request schemas of `/openapi.json` from them, so the document states exactly what is enforced,
and the fields of `SAMPLING_FIELDS` become the `engine.request.SamplingParams` keywords of the
same name. Adding a sampling parameter is one declaration here, listed in `SAMPLING_FIELDS`, plus
its field on `SamplingParams` and its use in `engine.sampler`.
The bounds are the "input bounds" of docs/security.md: everything that costs engine time has one.
"""

from __future__ import annotations

from typing import Any

from gateway.api_fields import (
    INT32_MAX,
    SEED_MAX,
    SEED_MIN,
    BoolField,
    IntField,
    NumberField,
    OptionalBoolField,
    StopField,
    StringField,
    TokenBiasField,
    TokenIdsField,
    token_id_schema,
)

MAX_LOGPROBS = 20
MAX_N = 16  # choices per prompt, and beams per prompt with use_beam_search
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 512  # per stop string; each is matched against the tail of every sequence
MAX_STOP_TOKEN_IDS = 64
MAX_PROMPTS = 128  # prompts in one batched /v1/completions request
# Whole-request bounds (all prompts together): the prompt tokens to prefill, and the sequences
# (prompts x n, or prompts x beams) one request may put in the engine.
MAX_REQUEST_PROMPT_TOKENS = 65536  # or the model's context, when that is longer
MAX_REQUEST_SEQUENCES = 256
MAX_USER_CHARS = 256
# Messages in one chat, and content parts across them; `--max-chat-messages` may set another bound.
DEFAULT_MAX_CHAT_MESSAGES = 2048
MAX_LOGIT_BIAS = 300  # entries, as OpenAI allows

MAX_TOKENS = IntField("max_tokens", 1, INT32_MAX, description="Prompt + max_tokens must fit the context.")
MAX_COMPLETION_TOKENS = IntField(
    "max_completion_tokens", 1, INT32_MAX, description="The newer name of max_tokens; wins over it."
)
TEMPERATURE = NumberField("temperature", 0.0, None, 1.0)
TOP_P = NumberField("top_p", 0.0, 1.0, 1.0, exclusive_minimum=True)
N = IntField("n", 1, MAX_N, default=1)
SEED = IntField(
    "seed", SEED_MIN, SEED_MAX, description="Same seed, same parameters: the same tokens. n > 1: seed + i."
)
PRESENCE_PENALTY = NumberField("presence_penalty", -2.0, 2.0, 0.0)
FREQUENCY_PENALTY = NumberField("frequency_penalty", -2.0, 2.0, 0.0)
TOP_K = IntField("top_k", -1, INT32_MAX, default=-1, description="Extension. -1 disables.", excluded=0)
MIN_P = NumberField("min_p", 0.0, 1.0, 0.0, "Extension.")
REPETITION_PENALTY = NumberField("repetition_penalty", 0.0, None, 1.0, "Extension.", exclusive_minimum=True)
IGNORE_EOS = BoolField("ignore_eos", False, "Extension.")
SKIP_SPECIAL_TOKENS = BoolField("skip_special_tokens", True, "Extension.")
STREAM = BoolField("stream", False)
USE_BEAM_SEARCH = BoolField("use_beam_search", False, "Extension: the n best of beam_width beams.")
BEAM_WIDTH = IntField("beam_width", 1, MAX_N, description="Extension, with use_beam_search. Default: n.")
LENGTH_PENALTY = NumberField("length_penalty", -10.0, 10.0, 1.0, "Extension, with use_beam_search.")
SPECULATIVE = OptionalBoolField(
    "speculative",
    "Extension. false: no speculative decoding for this request; true: speculate where the server "
    "does (refused with use_beam_search). Left out: the server's setting.",
)
USER = StringField("user", MAX_USER_CHARS)
CHAT_LOGPROBS = BoolField("logprobs", False)
TOP_LOGPROBS = IntField("top_logprobs", 0, MAX_LOGPROBS, description="Requires logprobs: true.")
COMPLETION_LOGPROBS = IntField("logprobs", 0, MAX_LOGPROBS)
BEST_OF = IntField("best_of", 1, MAX_N, description="Only equal to n is supported.")
STOP = StopField("stop", MAX_STOP_STRINGS, MAX_STOP_CHARS)
STOP_TOKEN_IDS = TokenIdsField("stop_token_ids", MAX_STOP_TOKEN_IDS, "Extension.")
LOGIT_BIAS = TokenBiasField(
    "logit_bias",
    MAX_LOGIT_BIAS,
    -100.0,
    100.0,
    "Added to the token's logit before sampling: -100 bans it, 100 all but forces it. "
    "Ids beyond the model's vocabulary are ignored.",
)

# Read into `SamplingParams` keywords of the same name (both endpoints).
SAMPLING_FIELDS = (
    TEMPERATURE,
    TOP_P,
    N,
    SEED,
    PRESENCE_PENALTY,
    FREQUENCY_PENALTY,
    TOP_K,
    MIN_P,
    REPETITION_PENALTY,
    IGNORE_EOS,
    SKIP_SPECIAL_TOKENS,
    USE_BEAM_SEARCH,
    LENGTH_PENALTY,
    STOP,
    STOP_TOKEN_IDS,
    LOGIT_BIAS,
    SPECULATIVE,
)
# Read by the gateway itself (max_tokens is resolved per prompt, beam_width defaults to n).
GATEWAY_FIELDS = (MAX_TOKENS, MAX_COMPLETION_TOKENS, STREAM, BEAM_WIDTH, USER)

PRIORITY_NAMES = ("interactive", "standard", "batch")
ROLES = ("system", "developer", "user", "assistant", "tool")


def sampling_schema(vocab_size: int | None) -> dict[str, Any]:
    """The properties both generation bodies share."""
    return {
        **{f.name: f.schema(vocab_size) for f in (*SAMPLING_FIELDS, *GATEWAY_FIELDS)},
        "stream_options": {
            "type": "object",
            "properties": {"include_usage": {"type": "boolean"}},
            "description": "Only with stream: true.",
        },
        "priority": {
            "oneOf": [
                {"type": "string", "enum": list(PRIORITY_NAMES)},
                {"type": "integer", "minimum": 0, "maximum": len(PRIORITY_NAMES) - 1},
            ],
            "description": "Extension. May only lower the API key's priority class.",
        },
        "response_format": {
            "type": "object",
            "properties": {"type": {"const": "text"}},
            "description": "Only text is supported.",
        },
        "tools": {"type": "array", "maxItems": 0, "description": "Not supported: empty only."},
    }


def _dependencies() -> dict[str, Any]:
    """Fields that only make sense with another one set (the validator refuses them otherwise)."""
    return {
        TOP_LOGPROBS.name: {
            "properties": {CHAT_LOGPROBS.name: {"const": True}},
            "required": [CHAT_LOGPROBS.name],
        },
        "stream_options": {"properties": {STREAM.name: {"const": True}}, "required": [STREAM.name]},
    }


def _model(models: list[str]) -> dict[str, Any]:
    return {"type": "string", "enum": models} if models else {"type": "string", "minLength": 1}


def chat_request_schema(models: list[str], vocab_size: int | None) -> dict[str, Any]:
    """The JSON Schema of a `POST /v1/chat/completions` body."""
    message = {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"type": "string", "enum": list(ROLES)},
            "content": {
                "oneOf": [
                    {"type": "string"},
                    {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["type", "text"],
                            "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                        },
                    },
                    {"type": "null"},
                ]
            },
            "name": {"type": "string"},
        },
    }
    return {
        "type": "object",
        "required": ["model", "messages"],
        "dependentSchemas": _dependencies(),
        "properties": {
            "model": _model(models),
            "messages": {"type": "array", "items": message, "minItems": 1},
            CHAT_LOGPROBS.name: CHAT_LOGPROBS.schema(),
            TOP_LOGPROBS.name: TOP_LOGPROBS.schema(),
            **sampling_schema(vocab_size),
        },
    }


def completion_request_schema(models: list[str], vocab_size: int | None) -> dict[str, Any]:
    """The JSON Schema of a `POST /v1/completions` body."""
    ids = {"type": "array", "items": token_id_schema(vocab_size), "minItems": 1}
    return {
        "type": "object",
        "required": ["model", "prompt"],
        "dependentSchemas": {"stream_options": _dependencies()["stream_options"]},
        "properties": {
            "model": _model(models),
            "prompt": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {
                        "type": "array",
                        "items": {"type": "string", "minLength": 1},
                        "minItems": 1,
                        "maxItems": MAX_PROMPTS,
                    },
                    ids,
                    {"type": "array", "items": ids, "minItems": 1, "maxItems": MAX_PROMPTS},
                ]
            },
            COMPLETION_LOGPROBS.name: COMPLETION_LOGPROBS.schema(),
            BEST_OF.name: BEST_OF.schema(),
            "echo": {"const": False, "description": "Not supported: false only."},
            **sampling_schema(vocab_size),
        },
    }
