"""One declaration per `weir serve` setting, and what the rest of Weir reads from it.

A setting is a field of `Settings` (gateway/settings/settings.py) declared with `setting(...)`:
its type and default, its bounds (pydantic's `ge`/`gt`/`le`/`lt`, checked on every construction)
and a `SettingInfo`: the help line, the longer text of docs/operations.md where it says more, how
a default that is not a plain value reads, and the few names that do not follow from the field's
(`--model` for `model_path`). From these come the `WEIR_*` environment reader
(settings_sources.py), the `weir serve` flags (serve_flags.py), docs/operations.md's table and the
Helm chart's values schema (settings_reference.py).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import annotated_types
from pydantic import Field
from pydantic.fields import FieldInfo

from weir.gateway.settings.settings_parsing import bool_text, choices_of, parser_for, without_none

ENV_PREFIX = "WEIR_"


@dataclass(frozen=True)
class SettingInfo:
    """What a setting says beside its type, default and bounds.

    `help`: the one line of `weir serve --help` (the env name and the default are added to it).
    `doc`: docs/operations.md's text, Markdown, where it says more than `help`.
    `default_text`: how the default reads where it is not a plain value (None: "the model's").
    `env`/`flag`: where the name does not follow from the field's (`WEIR_<NAME>`, `--<name>`; the
    chart's key is the variable's name in camelCase); `secret`: read from the environment only, never a flag, never in the
    chart's values, never shown. `in_chart` False: the chart passes it another way.
    `parse`: the text parser where the type's is not enough.
    """

    help: str
    doc: str | None = None
    default_text: str | None = None
    env: str | None = None
    flag: str | None = None
    metavar: str | None = None
    secret: bool = False
    in_chart: bool = True
    parse: Callable[[str], Any] | None = None

    def __call__(self, schema: dict[str, Any]) -> None:
        """pydantic's `json_schema_extra` hook: nothing to add (the info is read as itself)."""


def setting(
    default: Any = None,
    help: str = "",
    *,
    default_factory: Callable[[], Any] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    finite: bool = False,
    pattern: str | None = None,
    min_length: int | None = None,
    **info: Any,
) -> Any:
    """A setting's declaration: a pydantic `Field` carrying its `SettingInfo`."""
    if not help.strip():
        raise TypeError("a setting is declared with its help line")
    extra = SettingInfo(help=help, **info)
    bounds: dict[str, Any] = {
        "ge": ge,
        "gt": gt,
        "le": le,
        "lt": lt,
        "pattern": pattern,
        "min_length": min_length,
    }
    if finite:
        bounds["allow_inf_nan"] = False
    given = {key: value for key, value in bounds.items() if value is not None}
    given.update(description=help, json_schema_extra=extra, repr=not extra.secret)
    if default_factory is not None:
        return Field(default_factory=default_factory, **given)
    return Field(default, **given)


@dataclass(frozen=True)
class DeclaredSetting:
    """One setting as declared: its field name, type, pydantic field and `SettingInfo`."""

    name: str
    annotation: Any
    field: FieldInfo
    info: SettingInfo

    @property
    def env(self) -> str:
        return self.info.env or ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str | None:
        """The `weir serve` flag; None for a secret (environment only)."""
        if self.info.secret:
            return None
        return self.info.flag or "--" + self.name.replace("_", "-")

    @property
    def helm_key(self) -> str | None:
        """The key under the chart's `config:`, the variable's name in camelCase (`WEIR_MODEL`:
        `model`); None where the chart does not take it there."""
        if self.info.secret or not self.info.in_chart:
            return None
        head, *rest = self.env.removeprefix(ENV_PREFIX).lower().split("_")
        return head + "".join(part.capitalize() for part in rest)

    @property
    def kind(self) -> Any:
        """The declared type without `| None`."""
        return without_none(self.annotation)

    @property
    def optional(self) -> bool:
        return self.kind is not self.annotation

    @property
    def choices(self) -> tuple[str, ...] | None:
        return choices_of(self.annotation)

    def parse(self, text: str) -> Any:
        return (self.info.parse or parser_for(self.annotation))(text)

    def bound(self, kind: type) -> Any:
        """The bound of this kind (annotated_types.Ge, Gt, Le or Lt) declared on the field, or None."""
        for item in self.field.metadata:
            if isinstance(item, kind):
                return item
        return None

    def bounds_text(self) -> str | None:
        """`in [1, 64]`, `>= 0`, `in (0, 1]`, `> 0`: the declared bounds as the messages say them."""
        ge, gt = self.bound(annotated_types.Ge), self.bound(annotated_types.Gt)
        le, lt = self.bound(annotated_types.Le), self.bound(annotated_types.Lt)
        low = (f"[{ge.ge}", ">=", ge.ge) if ge else (f"({gt.gt}", ">", gt.gt) if gt else None
        high = (f"{le.le}]", "<=", le.le) if le else (f"{lt.lt})", "<", lt.lt) if lt else None
        if low and high:
            return f"in {low[0]}, {high[0]}"
        if low or high:
            _, op, value = low or high  # type: ignore[misc]
            return f"{op} {value}"
        return None

    def default_value(self) -> Any:
        if self.field.default_factory is not None:
            return self.field.default_factory()  # type: ignore[call-arg]
        return self.field.default

    def default_display(self) -> str:
        """The default as help and docs say it: `default_text`, else the value (`on`/`off`,
        an enum's value, a number without a trailing `.0`)."""
        if self.info.default_text is not None:
            return self.info.default_text
        return display_value(self.default_value())


def display_value(value: Any) -> str:
    if isinstance(value, bool):
        return bool_text(value)
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    if value is None:
        return "none"
    return str(value)


def declared_settings(cls: type) -> list[DeclaredSetting]:
    """The settings a pydantic dataclass declares with `setting(...)`, in field order."""
    pydantic_fields: dict[str, FieldInfo] = cls.__pydantic_fields__  # type: ignore[attr-defined]
    declared = []
    for field in dataclasses.fields(cls):
        info = pydantic_fields[field.name]
        extra = info.json_schema_extra
        if not isinstance(extra, SettingInfo):
            raise TypeError(f"{cls.__name__}.{field.name} is not declared with setting(...)")
        declared.append(DeclaredSetting(field.name, info.annotation, info, extra))
    return declared
