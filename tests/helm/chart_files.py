"""The chart's files, read the same way by every test of helm/weir."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "weir"
TEMPLATES = CHART / "templates"
HELPERS = TEMPLATES / "_helpers.tpl"

COMMENT = re.compile(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", re.S)


def read(path: Path) -> str:
    """A chart file's text."""
    return path.read_text(encoding="utf-8")


def template_files() -> list[Path]:
    """Every file under templates/, helpers and NOTES included, by name."""
    return sorted(p for p in TEMPLATES.iterdir() if p.is_file())


def templates() -> dict[str, str]:
    """Template name -> text with template comments removed."""
    return {p.name: COMMENT.sub("", read(p)) for p in template_files()}


def chart_values() -> dict[str, Any]:
    """values.yaml, parsed."""
    values = yaml.safe_load(read(CHART / "values.yaml"))
    assert isinstance(values, dict)
    return values


def lookup(values: dict[str, Any], dotted: str) -> Any:
    """The value at a dotted path; KeyError naming the first missing part."""
    node: Any = values
    walked: list[str] = []
    for part in dotted.split("."):
        walked.append(part)
        if not isinstance(node, dict) or part not in node:
            raise KeyError(".".join(walked))
        node = node[part]
    return node
