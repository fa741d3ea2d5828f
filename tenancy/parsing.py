"""Validate decoded JSON against a body model; the first problem as a `FieldError` naming the field.

`FieldError("body", ...)` (the body is not an object) is answered 400, any other field 422
(`weir.gateway.http.errors`), as the hand-made codecs did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from weir.tenancy.errors import FieldError

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

_MESSAGES = {
    "missing": "is required",
    "extra_forbidden": "unknown field",
    "unexpected_keyword_argument": "unknown field",
    "model_type": "must be a JSON object",
    "dataclass_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object",
    "dict_type": "must be a JSON object",
}


def field_error(exc: ValidationError, where: str = "body") -> FieldError:
    """The first error of `exc` as a `FieldError`; `where` prefixes the field (`body`: none)."""
    error: Any = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    # A list item is named by its list (`scopes`, not `scopes.0`), as the admin API always has.
    loc = [str(part) for part in error.get("loc", ()) if not isinstance(part, int)]
    path = ([] if where == "body" else where.split(".")) + loc
    message = _MESSAGES.get(str(error.get("type")), str(error.get("msg", "is invalid")))
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return FieldError(".".join(path) or "body", message)


def parse_model(model: type[M], body: object, where: str = "body") -> M:
    """`body` (decoded JSON) as `model`; a `FieldError` naming the first bad field."""
    return _validated(model.model_validate, body, where)


def parse_with(adapter: TypeAdapter[T], body: object, where: str = "body") -> T:
    """Like `parse_model`, through a `TypeAdapter` (for a dataclass such as `QuotaLimits`)."""
    return _validated(adapter.validate_python, body, where)


def _validated(validate: Callable[[dict[Any, Any]], T], body: object, where: str) -> T:
    if not isinstance(body, dict):
        raise FieldError(where, "must be a JSON object")
    try:
        return validate(body)
    except ValidationError as exc:
        raise field_error(exc, where) from None
