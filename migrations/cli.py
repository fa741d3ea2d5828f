"""`weir db ...` (schema migrations) and the composition of the database commands with `weir admin`.

Migrations stand above tenancy (`env.py` reads its tables): the `db` commands live here, and so
does the one place that hands the schema check (`check_migrated`) to tenancy's `weir admin`
commands, which never import `weir.migrations` themselves. `weir/cli.py` calls
`add_subcommands(subparsers, settings_factory)`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from weir.migrations.migrate import check_migrated, current_revision, downgrade, head_revision, upgrade
from weir.tenancy.cli.cli import add_admin_commands
from weir.tenancy.cli.cli_support import (
    CliSettings,
    SettingsFactory,
    SettingsOf,
    add_database_options,
    guard,
)
from weir.tenancy.cli.cli_support import database_url as _database_url
from weir.tenancy.store.db import Database, safe_url

__all__ = ["add_db_commands", "add_subcommands", "main"]


def add_db_commands(subparsers: argparse._SubParsersAction, settings_of: SettingsOf) -> None:
    """Add `db` (upgrade, downgrade, current) to a `weir` parser."""
    db = subparsers.add_parser("db", help="database schema migrations (Alembic)")
    db_sub = db.add_subparsers(dest="db_command", metavar="{upgrade,downgrade,current}", required=True)

    @contextmanager
    def database(args: argparse.Namespace) -> Iterator[Database]:
        database = Database(_database_url(args, settings_of(args)))
        try:
            yield database
        finally:
            database.dispose()

    def do_upgrade(args: argparse.Namespace) -> int:
        with database(args) as db_:
            upgrade(db_.engine, args.revision)
            print(f"{safe_url(db_.url)}: at revision {current_revision(db_.engine)} (head {head_revision()})")
        return 0

    def do_downgrade(args: argparse.Namespace) -> int:
        with database(args) as db_:
            downgrade(db_.engine, args.revision)
            print(f"{safe_url(db_.url)}: at revision {current_revision(db_.engine) or 'base (empty)'}")
        return 0

    def do_current(args: argparse.Namespace) -> int:
        with database(args) as db_:
            current, head = current_revision(db_.engine), head_revision()
            state = "up to date" if current == head else "needs `weir db upgrade`"
            print(f"{safe_url(db_.url)}: at revision {current or 'none'}; head is {head} ({state})")
            return 0 if current == head else 1

    for name, handler, help_text, default_rev in (
        ("upgrade", do_upgrade, "migrate the database to the newest schema", "head"),
        ("downgrade", do_downgrade, "undo migrations (default: one step; 'base' drops all tables)", "-1"),
        ("current", do_current, "show the database's revision; exit 1 unless it is the newest", None),
    ):
        p = db_sub.add_parser(name, help=help_text)
        add_database_options(p)
        if default_rev is not None:
            p.add_argument("--revision", default=default_rev, help=f"target revision (default {default_rev})")
        p.set_defaults(func=guard(handler))


def add_subcommands(
    subparsers: argparse._SubParsersAction, settings_factory: SettingsFactory | None = None
) -> None:
    """Add `db` and `admin` to a `weir` parser. `settings_factory(args)` is called only when a
    command runs (never at import or parse time); without it, --database-url/--data-dir are needed."""

    def settings_of(args: argparse.Namespace) -> CliSettings | None:
        return settings_factory(args) if settings_factory is not None else None

    add_db_commands(subparsers, settings_of)
    add_admin_commands(subparsers, settings_of, check_migrated)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m weir.migrations.cli db|admin ...`, without server settings (pass --database-url)."""
    parser = argparse.ArgumentParser(prog="weir", description="Weir database and tenant administration")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    result: Any = args.func(args)
    return int(result)


if __name__ == "__main__":
    raise SystemExit(main())
