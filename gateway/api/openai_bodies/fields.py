"""The JSON scalar types of the OpenAI bodies, as pydantic annotated types.

The bodies validate in strict mode from the parsed JSON (`weir.gateway.http.json_body`): a string is never
an integer and a boolean is never a number. JSON has one number type, so an integral float (3.0)
is the integer 3. A number too large for a float is infinite, and refused as such.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError


def integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _float(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer beyond the float range
            return math.inf
    return value


# Put after a type's `Field` constraints: `Annotated[int, Field(ge=1), AS_INT]` (the constraints
# then apply to the converted value, and `/openapi.json` states them as JSON Schema bounds).
AS_INT = BeforeValidator(integral)
AS_NUMBER = BeforeValidator(_float)


def unsupported(name: str) -> PydanticCustomError:
    """The error of a field this server knows but does not implement."""
    return PydanticCustomError("unsupported_parameter", f"'{name}' is not supported by this server")


def bad_value(message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_value", message)
