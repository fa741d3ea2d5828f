"""The `weir serve` command-line flags, one per setting that is not a secret, made from the
settings' declarations (gateway/settings/setting_field.py): the name, the value's type and choices,
and the help line with the `WEIR_*` variable and the default.

Each flag's `dest` is its `Settings` field; every default is None so that `Settings.from_sources`
can apply the environment variable or the built-in default when a flag is not given. This module
only declares flags: gateway/settings/settings.py stays the one place that reads the environment and
validates the values.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
from typing import Any

from weir.gateway.settings.setting_field import DeclaredSetting
from weir.gateway.settings.settings import declared, setting_groups


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The `weir serve` flags, listed by settings group. Every default is None so env and built-in
    defaults can apply."""
    for group_class in setting_groups():
        group = parser.add_argument_group((group_class.__doc__ or group_class.__name__).splitlines()[0])
        names = {field.name for field in dataclasses.fields(group_class)}
        for setting in declared():
            if setting.name in names and setting.flag is not None:
                group.add_argument(setting.flag, dest=setting.name, **_argument(setting))


def flag_help(setting: DeclaredSetting) -> str:
    """The help line: the declaration's, then where else the value comes from and its default."""
    return f"{setting.info.help} (env {setting.env}; default {_plain(setting.default_display())})"


def _argument(setting: DeclaredSetting) -> dict[str, Any]:
    kind = setting.kind
    argument: dict[str, Any] = {"help": flag_help(setting).replace("%", "%%"), "default": None}
    choices = setting.choices
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        argument.update(type=kind, choices=list(kind))  # argparse names the choices on a bad value
    elif kind is not bool and choices is not None:
        argument["choices"] = choices
    if setting.info.parse is None and kind is not str:
        argument.setdefault("type", setting.parse)  # a bad number or on/off: argparse's error, exit 2
    if setting.info.metavar is not None:
        argument["metavar"] = setting.info.metavar
    elif choices is not None:
        argument["metavar"] = "{" + ",".join(choices) + "}"
    return argument


def _plain(text: str) -> str:
    """Docs text for a terminal: without Markdown's backticks."""
    return text.replace("`", "")
