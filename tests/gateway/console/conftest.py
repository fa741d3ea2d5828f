"""The `console` fixture: the console on a minimal app over a fresh SQLite repository."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.console.console_harness import Console, make_console


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    with make_console(tmp_path) as c:
        yield c
