"""One declaration per scalar API field: the validator reads it, `/openapi.json` is rendered from it.

A field knows its JSON type, its bounds and its default. `read` returns the typed value or raises
a 400 naming the field; `schema` is its JSON Schema. So the constraints the document states are
the ones the gateway enforces, by construction (tests/gateway/test_openapi.py checks both ways).
"""

from __future__ import annotations

import math
import re
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

    def schema(self, vocab_size: int | None = None) -> dict[str, Any]:
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

    def schema(self, vocab_size: int | None = None) -> dict[str, Any]:
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

    def schema(self, vocab_size: int | None = None) -> dict[str, Any]:
        return _finish({"type": "boolean"}, self.default, self.description)


@dataclass(frozen=True)
class OptionalBoolField:
    """A JSON boolean that may be left out: None then, so the server's default applies."""

    name: str
    description: str = ""

    def read(self, data: Mapping[str, Any]) -> bool | None:
        value = data.get(self.name)
        if value is not None and not isinstance(value, bool):
            raise _wrong_type(self.name, "a boolean", value)
        return value

    def schema(self, vocab_size: int | None = None) -> dict[str, Any]:
        return _finish({"type": "boolean"}, None, self.description)


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

    def schema(self, vocab_size: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "string", "maxLength": self.max_length}
        if self.min_length:
            out["minLength"] = self.min_length
        return _finish(out, None, self.description)


@dataclass(frozen=True)
class StopField:
    """A string or a list of strings, each `1..max_chars` long, at most `max_items` of them."""

    name: str
    max_items: int
    max_chars: int
    description: str = ""

    def read(self, data: Mapping[str, Any]) -> tuple[str, ...]:
        value = data.get(self.name)
        if value is None:
            return ()
        stops = (value,) if isinstance(value, str) else value
        if not isinstance(stops, list | tuple) or not all(isinstance(s, str) for s in stops):
            raise _wrong_type(self.name, "a string or a list of strings", value)
        if len(stops) > self.max_items:
            raise BadRequestError(
                f"'{self.name}' may hold at most {self.max_items} strings, got {len(stops)}", param=self.name
            )
        for stop in stops:
            if not 1 <= len(stop) <= self.max_chars:
                raise BadRequestError(
                    f"each stop string must be 1-{self.max_chars} characters, got {len(stop)}",
                    param=self.name,
                )
        return tuple(stops)

    def schema(self, vocab_size: int | None = None) -> dict[str, Any]:
        one = {"type": "string", "minLength": 1, "maxLength": self.max_chars}
        alternatives = [one, {"type": "array", "items": one, "maxItems": self.max_items}, {"type": "null"}]
        return _finish({"oneOf": alternatives}, None, self.description)


def token_id_schema(vocab_size: int | None) -> dict[str, Any]:
    """A token id: below the vocabulary size when the server knows it."""
    return {"type": "integer", "minimum": 0, "maximum": INT32_MAX if vocab_size is None else vocab_size - 1}


@dataclass(frozen=True)
class TokenIdsField:
    """A list of at most `max_items` token ids."""

    name: str
    max_items: int
    description: str = ""

    def read(self, data: Mapping[str, Any]) -> tuple[int, ...]:
        value = data.get(self.name)
        if value is None:
            return ()
        ids = as_int_list(value)
        if ids is None:
            raise BadRequestError(
                f"'{self.name}' must be a list of integers", param=self.name, code="invalid_type"
            )
        if len(ids) > self.max_items:
            raise BadRequestError(
                f"'{self.name}' may hold at most {self.max_items} ids, got {len(ids)}", param=self.name
            )
        if not all(0 <= t <= INT32_MAX for t in ids):
            raise BadRequestError(f"'{self.name}' must be token ids in [0, {INT32_MAX}]", param=self.name)
        return ids

    def schema(self, vocab_size: int | None = None) -> dict[str, Any]:
        out = {"type": "array", "items": token_id_schema(vocab_size), "maxItems": self.max_items}
        return _finish(out, None, self.description)


@dataclass(frozen=True)
class TokenBiasField:
    """OpenAI's `logit_bias`: a map of token id (a decimal string: JSON keys are strings) to a
    number in [minimum, maximum], at most `max_items` entries; read as (token id, bias) pairs."""

    name: str
    max_items: int
    minimum: float
    maximum: float
    description: str = ""
    # Token ids as JSON keys: no sign, no leading zero, at most 9 digits (beyond any vocabulary).
    key_pattern: str = "^(0|[1-9][0-9]{0,8})$"

    def read(self, data: Mapping[str, Any]) -> tuple[tuple[int, float], ...]:
        value = data.get(self.name)
        if value is None:
            return ()
        if not isinstance(value, dict):
            raise _wrong_type(self.name, "an object mapping token ids to numbers", value)
        if len(value) > self.max_items:
            raise _out_of_range(self.name, f"{len(value)} entries", f"at most {self.max_items} entries")
        pairs = []
        for key, bias in value.items():
            if not re.fullmatch(self.key_pattern, key):
                shown = key if len(key) <= 32 else key[:32] + "..."
                raise _out_of_range(self.name, f"the key {shown!r}", "keyed by token ids (decimal strings)")
            pairs.append(
                (int(key), NumberField(self.name, self.minimum, self.maximum, 0.0).read({self.name: bias}))
            )
        return tuple(pairs)

    def schema(self, vocab_size: int | None = None) -> dict[str, Any]:
        out = {
            "type": "object",
            "maxProperties": self.max_items,
            "propertyNames": {"pattern": self.key_pattern},
            "additionalProperties": {"type": "number", "minimum": self.minimum, "maximum": self.maximum},
        }
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
