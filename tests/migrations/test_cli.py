"""`weir db` (weir.migrations.cli), and `weir admin` refusing a database that is not migrated."""

from __future__ import annotations

from pathlib import Path

import pytest

from weir.migrations import cli
from weir.tenancy.store.db import sqlite_url_for


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_db_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = str(tmp_path / "data")
    code, out, _ = run(capsys, "db", "current", "--data-dir", data)
    assert code == 1 and "weir db upgrade" in out
    code, _, err = run(capsys, "admin", "tenants", "list", "--data-dir", data)
    assert code == 1 and "weir db upgrade" in err  # refuses an un-migrated database
    assert run(capsys, "db", "upgrade", "--data-dir", data)[0] == 0
    code, out, _ = run(capsys, "db", "current", "--database-url", sqlite_url_for(Path(data)))
    assert code == 0 and "up to date" in out
    assert run(capsys, "db", "downgrade", "--data-dir", data, "--revision", "base")[0] == 0
    assert run(capsys, "db", "current", "--data-dir", data)[0] == 1


def test_no_database_given(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "db", "upgrade")
    assert code == 2 and "--database-url" in err
