"""The discriminators of the request bodies' tagged unions (OpenAI's, Anthropic's, the Responses API's).

A body field that takes one of several shapes is a pydantic union tagged by a function of the raw
value. Two kinds recur:

- by the JSON object's `type` (`{"type": "text", ...}` or `{"type": "tool_use", ...}`):
  `type_discriminator`, whose error names the types this server reads;
- a string or a list (`"hi"` or `[{"type": "text", "text": "hi"}]`): `string_or_list_discriminator`.

Every tag starts with `~` so that an error's path leaves it out (`weir.gateway.api.openai_bodies.params`):
`messages[0].content[1].type`, not `messages[0].content.~parts[1].type`. A value no member fits
gets the discriminator's own error (`invalid_type`, `invalid_value`, `unsupported_parameter`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Discriminator


def type_tag(value: Any, known: tuple[str, ...]) -> str | None:
    """`~` + the `type` of a JSON object (validation) or a model (serialization) when it is one of
    `known`; None for anything else."""
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "~" + kind if kind in known else None


def type_discriminator(known: tuple[str, ...], error_type: str, refused: str = "") -> Discriminator:
    """A union tagged by `type` among `known` (each member's `Tag` is `~` + its type); any other
    value is an `error_type` error naming them, then `refused` (what this server does not read)."""
    expected = known[0] if len(known) == 1 else "one of " + ", ".join(known)
    return Discriminator(
        lambda value: type_tag(value, known),
        custom_error_type=error_type,
        custom_error_message=f"'type' must be {expected}" + (f" ({refused})" if refused else ""),
    )


def string_or_list_discriminator(list_tag: str, items: str) -> Discriminator:
    """A union of a string (`Tag("~text")`) and a list (`Tag("~" + list_tag)`) of `items`."""

    def tag(value: Any) -> str | None:
        return "~text" if isinstance(value, str) else "~" + list_tag if isinstance(value, list) else None

    return Discriminator(
        tag, custom_error_type="invalid_type", custom_error_message=f"must be a string or a list of {items}"
    )
