"""How `weir serve` reads a setting's text (a flag's or a `WEIR_*` variable's value).

Each setting's parser follows from its declared type (`parser_for`); a setting whose text has a
form of its own (the forwarded-proxy list) names its parser in its declaration.
"""

from __future__ import annotations

import enum
import ipaddress
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

_TRUE = frozenset({"on", "true", "1", "yes"})
_FALSE = frozenset({"off", "false", "0", "no"})


def parse_bool(value: str) -> bool:
    """`on`/`off` (the spelling of the former ON/OFF settings), `true`/`false`, `yes`/`no`, `1`/`0`."""
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("expected on or off (or true/false, yes/no, 1/0)")


def bool_text(value: bool) -> str:
    """How a boolean setting is written back: `on` or `off`."""
    return "on" if value else "off"


def parse_path(value: str) -> Path:
    return Path(value).expanduser()


def check_forwarded_entry(entry: str) -> None:
    if entry == "*":
        return
    try:
        ipaddress.ip_network(entry, strict=False)
    except ValueError:
        raise ValueError(
            f"forwarded_allow_ips: {entry!r} is not an IP address, a CIDR network or '*'"
        ) from None


def parse_forwarded_allow_ips(value: str) -> tuple[str, ...]:
    """A comma-separated list of proxy addresses or networks (`10.0.0.0/8,192.168.1.7`), or `*`."""
    entries = tuple(part.strip() for part in value.split(",") if part.strip())
    for entry in entries:
        check_forwarded_entry(entry)
    return entries


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def xdg_dir(env: Mapping[str, str], var: str, fallback: str) -> Path:
    """An XDG base directory's `weir` folder: `$var` when set, else `~/<fallback>`."""
    base = env.get(var)
    return (Path(base) if base else Path.home() / fallback) / "weir"


def without_none(annotation: Any) -> Any:
    """`X` of `X | None` (and of `Optional[X]`); any other annotation as it is."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def choices_of(annotation: Any) -> tuple[str, ...] | None:
    """The names a setting of this type may take (an enum's values, a Literal's strings, on/off)."""
    kind = without_none(annotation)
    if kind is bool:
        return ("on", "off")
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return tuple(str(member.value) for member in kind)
    if get_origin(kind) is Literal:
        return tuple(str(arg) for arg in get_args(kind))
    return None


def parser_for(annotation: Any) -> Callable[[str], Any]:
    """The text parser of a setting of this declared type. Raises TypeError for a type it does not
    know: a new kind of setting names its parser in its declaration."""
    kind = without_none(annotation)
    if kind is bool:
        return parse_bool
    if kind in (int, float, str):
        return kind  # type: ignore[no-any-return]
    if kind is Path:
        return parse_path
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind
    if get_origin(kind) is Literal:
        return str
    raise TypeError(f"no text parser for settings of type {annotation!r}")
