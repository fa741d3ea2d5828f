"""Where a setting's value comes from: a flag, else its `WEIR_*` variable, else its default; and
how a refused value is reported (one line naming the setting, never a secret's value)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from weir.gateway.settings.setting_field import DeclaredSetting

# pydantic's error types for a value outside the declared bounds.
_BOUND_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def given_values(
    declared: Sequence[DeclaredSetting], cli: Mapping[str, Any] | argparse.Namespace, env: Mapping[str, str]
) -> dict[str, Any]:
    """The values given for `declared`: a flag's (None: not given; never a secret's), else the
    `WEIR_*` variable's (empty: unset). Text is parsed by the setting's parser; a value that does
    not parse raises ValueError naming the flag's setting or the variable."""
    flags = vars(cli) if isinstance(cli, argparse.Namespace) else dict(cli)
    values: dict[str, Any] = {}
    for setting in declared:
        flag_value = flags.get(setting.name)
        if setting.flag is not None and flag_value is not None:
            values[setting.name] = _parsed(setting, setting.name, flag_value)
        elif env.get(setting.env):
            values[setting.name] = _parsed(setting, setting.env, env[setting.env])
    return values


def _parsed(setting: DeclaredSetting, source: str, value: Any) -> Any:
    if not isinstance(value, str):
        return value  # parsed already (argparse's type, or a caller's own value)
    try:
        return setting.parse(value)
    except ValueError as exc:
        shown = "" if setting.info.secret else f" {value!r}"
        raise ValueError(f"{source}: cannot parse{shown}: {exc}") from None


def describe_errors(
    declared: Mapping[str, DeclaredSetting], error: ValidationError, given: Mapping[str, Any]
) -> str:
    """pydantic's errors as one line: `port must be in [0, 65535], got 70000; ...`."""
    parts = []
    for item in error.errors(include_url=False):
        if not item["loc"]:  # a check across settings (Settings.__post_init__): its own message
            cause = item.get("ctx", {}).get("error")
            parts.append(str(cause) if cause is not None else item["msg"])
            continue
        name = str(item["loc"][0])
        setting = declared.get(name)
        got = "" if setting is None or setting.info.secret else f", got {given.get(name)!r}"
        bounds = setting.bounds_text() if setting is not None else None
        if item["type"] in _BOUND_ERRORS and bounds:
            parts.append(f"{name} must be {bounds}{got}")
        elif item["type"] == "finite_number":
            parts.append(f"{name} must be a finite number{got}")
        else:
            message = item["msg"]
            parts.append(f"{name}: {message[:1].lower()}{message[1:]}{got}")
    return "; ".join(parts)
