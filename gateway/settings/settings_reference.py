"""Rewrite (or check) what is made from the settings' declarations outside the code:
docs/operations.md's table and the Helm chart's `config:` values, schema and ConfigMap list.

    python -m weir.gateway.settings.settings_reference [--check] [--root DIR]

`make settings-reference` runs it from the checkout; `--check` exits 1 naming each file that
differs (tests/gateway/settings/test_settings_reference.py makes the same comparison).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from weir.gateway.settings.setting_field import DeclaredSetting
from weir.gateway.settings.settings import declared
from weir.gateway.settings.settings_chart import (
    config_block,
    env_pairs,
    with_config_block,
    with_env_pairs,
    with_schema,
)
from weir.gateway.settings.settings_docs import settings_table, with_table

OPERATIONS = Path("docs/operations.md")
VALUES = Path("helm/weir/values.yaml")
SCHEMA = Path("helm/weir/values.schema.json")
HELPERS = Path("helm/weir/templates/_helpers.tpl")


def _schema_text(text: str, settings: Sequence[DeclaredSetting]) -> str:
    return json.dumps(with_schema(json.loads(text), settings), indent=2, ensure_ascii=False) + "\n"


# Each file and how its made parts are put into its current text.
MADE: dict[Path, Callable[[str, Sequence[DeclaredSetting]], str]] = {
    OPERATIONS: lambda text, settings: with_table(text, settings_table(settings)),
    VALUES: lambda text, settings: with_config_block(text, config_block(settings)),
    SCHEMA: _schema_text,
    HELPERS: lambda text, settings: with_env_pairs(text, env_pairs(settings)),
}


def stale_files(root: Path) -> dict[Path, str]:
    """Each file under `root` whose made parts differ from the declarations: path -> its new text."""
    stale = {}
    for path, make in MADE.items():
        text = (root / path).read_text(encoding="utf-8")
        new = make(text, declared())
        if new != text:
            stale[path] = new
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="only report the files that differ")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: here)")
    args = parser.parse_args(argv)
    stale = stale_files(args.root)
    for path, text in stale.items():
        if args.check:
            print(f"{path}: differs from the settings' declarations", file=sys.stderr)
        else:
            (args.root / path).write_text(text, encoding="utf-8")
            print(f"{path}: rewritten")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
