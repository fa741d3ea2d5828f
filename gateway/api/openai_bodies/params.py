"""A pydantic `ValidationError` as the 400 OpenAI clients expect, naming the field in `param`.

The first error decides. Its location becomes a path (`messages[0].content[0].type`,
`stream_options.include_usage`); union tags (`~text`) are left out of it. Fields whose inside is
not a field of its own (a list of stop strings, a map of token biases, the prompts, the tools)
are named as a whole, as OpenAI names them. The error code says what kind of problem it is.
"""

from __future__ import annotations

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from weir.gateway.http.errors import BadRequestError

# Named as a whole: `param` is the body field, the message says where inside it.
WHOLE_FIELDS = frozenset(
    {
        "stop",
        "stop_token_ids",
        "logit_bias",
        "prompt",
        "priority",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    }
)
# Error types that mean a value of the wrong JSON type.
_TYPE_ERRORS = frozenset({"model_type", "model_attributes_type", "union_tag_not_found", "invalid_type"})
# Error types this layer raises with their own `code` (see `weir.gateway.api.openai_bodies.fields`).
_OWN_CODES = frozenset({"unsupported_parameter", "invalid_value"})


def error_path(loc: tuple[int | str, ...], prefix: str = "") -> str:
    """`loc` as a field path under `prefix`, without union tags."""
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not part.startswith("~"):
            path += f".{part}" if path else part
    return path


def _code(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind == "missing":
        return "missing_required_parameter"
    if kind in _OWN_CODES:
        return kind
    if kind in _TYPE_ERRORS or kind.endswith("_type"):
        return "invalid_type"
    return "invalid_value"


def bad_request(exc: ValidationError, prefix: str = "") -> BadRequestError:
    """The first error of `exc` as a 400; `prefix`: the path of the validated value in its body."""
    error = exc.errors(include_url=False, include_context=False, include_input=False)[0]
    path = error_path(error["loc"], prefix)
    top = path.split(".")[0].split("[")[0]
    param = top if top in WHOLE_FIELDS else path
    if error["type"] == "missing":
        return BadRequestError(f"'{path}' is required", param=param or None, code=_code(error))
    where = f"'{path}': " if path else ""
    return BadRequestError(where + error["msg"], param=param or None, code=_code(error))
