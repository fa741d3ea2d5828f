"""One declaration per scalar API field: the validator reads it, `/openapi.json` is rendered from it.

A field knows its JSON type, its bounds and its default. `read` returns the typed value or raises
a 400 naming the field; `schema` is its JSON Schema. So the constraints the document states are
the ones the gateway enforces, by construction (tests/gateway/test_openapi.py checks both ways).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.errors import BadRequestError

# torch.Generator.manual_seed accepts exactly this range; the engine checks it too.
SEED_MIN = -(2**63)
SEED_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _wrong_type(name: str, expected: str, value: Any) -> BadRequestError:
    return BadRequestError(
        f"'{name}' must be {expected}, got {_type_name(value)}", param=name, code="invalid_type"
    )


def _out_of_range(name: str, value: object, bounds: str) -> BadRequestError:
    return BadRequestError(f"'{name}' must be {bounds}, got {value}", param=name, code="invalid_value")


@dataclass(frozen=True)
class IntField:
    """An integer; `3.0` is accepted as 3, `true` is not an integer."""

    name: str
    minimum: int
    maximum: int
    default: int | None = None
    description: str = ""
    excluded: int | None = None  # one value inside the bounds that is not allowed (top_k: 0)

    def read(self, data: Mapping[str, Any]) -> int | None:
        """The value, None when absent or null."""
        value = data.get(self.name)
        if value is None:
            return self.default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise _wrong_type(self.name, "an integer", value)
        if not self.minimum <= value <= self.maximum or value == self.excluded:
            bounds = f"an integer in [{self.minimum}, {self.maximum}]"
            if self.excluded is not None:
                bounds += f" other than {self.excluded}"
            raise _out_of_range(self.name, value, bounds)
        return value

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}
        if self.excluded is not None:
            out["not"] = {"const": self.excluded}
        return _finish(out, self.default, self.description)


@dataclass(frozen=True)
class NumberField:
    """A finite number within bounds; `exclusive_minimum` makes the lower bound open."""

    name: str
    minimum: float
    maximum: float | None
    default: float
    description: str = ""
    exclusive_minimum: bool = False

    def read(self, data: Mapping[str, Any]) -> float:
        value = data.get(self.name)
        if value is None:
            return self.default
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _wrong_type(self.name, "a number", value)
        try:
            number = float(value)
        except OverflowError:  # an integer beyond the float range
            number = math.inf
        low_ok = number > self.minimum if self.exclusive_minimum else number >= self.minimum
        high_ok = self.maximum is None or number <= self.maximum
        if not (math.isfinite(number) and low_ok and high_ok):
            low = f"({self.minimum}" if self.exclusive_minimum else f"[{self.minimum}"
            high = "inf)" if self.maximum is None else f"{self.maximum}]"
            raise _out_of_range(self.name, value, f"a finite number in {low}, {high}")
        return number

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "number"}
        out["exclusiveMinimum" if self.exclusive_minimum else "minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return _finish(out, self.default, self.description)


@dataclass(frozen=True)
class BoolField:
    """A JSON boolean."""

    name: str
    default: bool
    description: str = ""

    def read(self, data: Mapping[str, Any]) -> bool:
        value = data.get(self.name)
        if value is None:
            return self.default
        if not isinstance(value, bool):
            raise _wrong_type(self.name, "a boolean", value)
        return value

    def schema(self) -> dict[str, Any]:
        return _finish({"type": "boolean"}, self.default, self.description)


@dataclass(frozen=True)
class StringField:
    """A string of at most `max_length` characters (`min_length` at least)."""

    name: str
    max_length: int
    min_length: int = 0
    description: str = ""

    def read(self, data: Mapping[str, Any]) -> str | None:
        value = data.get(self.name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise _wrong_type(self.name, "a string", value)
        if not self.min_length <= len(value) <= self.max_length:
            raise _out_of_range(
                self.name, f"{len(value)} characters", f"{self.min_length}-{self.max_length} characters"
            )
        return value

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "string", "maxLength": self.max_length}
        if self.min_length:
            out["minLength"] = self.min_length
        return _finish(out, None, self.description)


def _finish(out: dict[str, Any], default: object, description: str) -> dict[str, Any]:
    if default is not None:
        out["default"] = default
    if description:
        out["description"] = description
    return out


def as_int_list(value: Any) -> tuple[int, ...] | None:
    """A JSON list of integers (1.0 is the integer 1, as in JSON Schema; true is not), else None."""
    if not isinstance(value, list):
        return None
    ids = []
    for t in value:
        if isinstance(t, float) and t.is_integer():
            t = int(t)
        if not isinstance(t, int) or isinstance(t, bool):
            return None
        ids.append(t)
    return tuple(ids)
