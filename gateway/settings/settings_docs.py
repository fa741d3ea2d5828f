"""docs/operations.md's table of `weir serve` settings, made from their declarations.

The table sits between two marker comments in the page; `make settings-reference` rewrites it and
tests/gateway/settings/test_settings_reference.py fails while the page's copy differs.
"""

from __future__ import annotations

from collections.abc import Sequence

from weir.gateway.settings.setting_field import DeclaredSetting

TABLE_BEGIN = (
    "<!-- settings table: made from gateway/settings/settings_*.py by `make settings-reference`; "
    "edit the declarations, not these rows -->"
)
TABLE_END = "<!-- end of the settings table -->"


def settings_table(declared: Sequence[DeclaredSetting]) -> str:
    """The Markdown table: flag, variable, default and meaning of every setting."""
    rows = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for setting in declared:
        cells = (_flag_cell(setting), f"`{setting.env}`", _default_cell(setting), _meaning(setting))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def with_table(page: str, table: str) -> str:
    """`page` with the text between the markers replaced by `table`. Raises ValueError without them."""
    start, end = page.find(TABLE_BEGIN), page.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no {TABLE_BEGIN!r} ... {TABLE_END!r} section")
    return page[: start + len(TABLE_BEGIN)] + "\n" + table + "\n" + page[end:]


def _flag_cell(setting: DeclaredSetting) -> str:
    if setting.flag is None:
        return "(env only)"
    metavar = setting.info.metavar
    if metavar is None or metavar.startswith("{"):
        return f"`{setting.flag}`"
    return f"`{setting.flag} {metavar}`"


def _default_cell(setting: DeclaredSetting) -> str:
    if setting.info.default_text is not None:
        return setting.info.default_text
    return f"`{setting.default_display()}`"


def _meaning(setting: DeclaredSetting) -> str:
    text = setting.info.doc or setting.info.help
    choices = setting.choices
    if choices is not None and setting.info.doc is None:
        text += ": " + ", ".join(f"`{choice}`" for choice in choices)
    return text.replace("|", "\\|")
