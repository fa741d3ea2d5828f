"""What the `weir db` / `weir admin` command modules share: where the database or the server is,
one-line errors with exit statuses, and printing results as the admin API's JSON.

The schema check (`weir.migrations.migrate.check_migrated`) comes in as a `SchemaCheck` from the
composition root (`weir.migrations.cli`): tenancy stands below migrations and never imports it.

`weir.tenancy.cli.cli` (tenants, keys, quotas, usage, audit), `weir.tenancy.cli.model_cli` (model
versions), `weir.tenancy.cli.spend_cli` (prices, budgets) and `weir.tenancy.cli.adapter_cli` (LoRA
adapters) all build on it: each declares its resource's commands through one `AdminCommands`, so
`--server`, `--database-url` and `--data-dir` mean the same everywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from sqlalchemy import Engine

from weir.tenancy.cli.admin_client import HttpAdmin, JsonObject
from weir.tenancy.errors import TenancyError
from weir.tenancy.store.db import Database, sqlite_url_for

T = TypeVar("T")
# Raises `MigrationRequiredError` unless the database is at the schema this code expects.
SchemaCheck = Callable[[Engine], None]


class CliSettings(Protocol):
    """What the commands need from the server settings (`weir.gateway.settings.settings.Settings` fits)."""

    @property
    def resolved_database_url(self) -> str: ...

    @property
    def key_pepper(self) -> str | None: ...

    @property
    def admin_token(self) -> str | None: ...


SettingsFactory = Callable[[argparse.Namespace], CliSettings]
SettingsOf = Callable[[argparse.Namespace], CliSettings | None]
Handler = Callable[[argparse.Namespace], int]


class CliError(Exception):
    """A usage problem the CLI reports in one line (exit status 2)."""


def database_url(args: argparse.Namespace, settings: CliSettings | None) -> str:
    """`--database-url`, else `--data-dir`'s SQLite file, else the settings' database."""
    if args.database_url:
        return str(args.database_url)
    if args.data_dir:
        return sqlite_url_for(Path(args.data_dir))
    if settings is not None:
        return settings.resolved_database_url
    raise CliError("no database given: pass --database-url URL or --data-dir DIR")


def print_json(obj: JsonObject) -> None:
    """A result on stdout, as indented JSON."""
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


def guard(handler: Handler) -> Handler:
    """Turn expected failures into a one-line message and an exit status."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except CliError as exc:
            print(f"weir: {exc}", file=sys.stderr)
            return 2
        except TenancyError as exc:
            print(f"weir: {exc.message}", file=sys.stderr)
            return 1

    return run


_Backend = TypeVar("_Backend")


def json_command(
    backend: Callable[[argparse.Namespace], AbstractContextManager[_Backend]],
    op: Callable[[_Backend, argparse.Namespace], JsonObject],
) -> Handler:
    """A subcommand that runs `op` on the backend `backend(args)` opens and prints its answer as
    JSON, behind `guard`."""

    def run(args: argparse.Namespace) -> int:
        with backend(args) as b:
            print_json(op(b, args))
        return 0

    return guard(run)


def connection_parser() -> argparse.ArgumentParser:
    """The parent parser of every `weir admin` leaf: the database, or a server and its token."""
    conn = argparse.ArgumentParser(add_help=False)
    g = conn.add_argument_group("where (default: the database from the settings)")
    g.add_argument("--database-url", dest="database_url", help="SQLAlchemy URL of the database")
    g.add_argument("--data-dir", dest="data_dir", help="use the SQLite database in this data directory")
    g.add_argument(
        "--server", dest="server", metavar="URL", help="talk to a running server's admin API instead"
    )
    g.add_argument(
        "--admin-token", dest="admin_token", help="admin token for --server (default: WEIR_ADMIN_TOKEN)"
    )
    return conn


@contextmanager
def open_backend(
    args: argparse.Namespace,
    settings: CliSettings | None,
    direct: Callable[[Database], T],
    http: Callable[[HttpAdmin], T],
    check_schema: SchemaCheck,
) -> Iterator[T]:
    """The backend the options select: `http(server)` with `--server`, else `direct(database)`
    on a database that passes `check_schema`; closed on exit."""
    if args.server:
        if args.database_url or args.data_dir:
            raise CliError("give either --server or a database, not both")
        token = args.admin_token or (settings.admin_token if settings is not None else None)
        if not token:
            raise CliError("--server needs --admin-token (or WEIR_ADMIN_TOKEN)")
        server = HttpAdmin.connect(args.server, token)
        try:
            yield http(server)
        finally:
            server.close()
        return
    database = Database(database_url(args, settings))
    try:
        check_schema(database.engine)
        yield direct(database)
    finally:
        database.dispose()


def integer(value: str) -> int:
    """An argparse `type`: a whole number."""
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError("must be an integer") from None


def subcommands(
    parent: argparse._SubParsersAction, name: str, help_text: str, description: str | None = None
) -> argparse._SubParsersAction:
    """`weir admin NAME ...`: a command group whose subcommand is required (`args.NAME_command`)."""
    group = parent.add_parser(name, help=help_text, description=description)
    return group.add_subparsers(dest=f"{name}_command", required=True)


@dataclass(frozen=True)
class AdminCommands(Generic[T]):
    """One resource's `weir admin` commands: the backend the options select and leaves that print its
    answers as JSON.

    `direct` makes the backend over the database (with the settings, or None), `http` the one over a
    running server; a resource only a server holds has no `direct` and says `server_only` without
    `--server`. `where`, when given, follows each leaf's help in its description. A leaf is
    `p = c.leaf(sub, name, help)`, its arguments, then `p.set_defaults(func=c.command(op))`."""

    conn: argparse.ArgumentParser  # the connection options (`connection_parser`)
    settings_of: SettingsOf
    check_schema: SchemaCheck
    http: Callable[[HttpAdmin], T]
    direct: Callable[[Database, CliSettings | None], T] | None = None
    server_only: str = ""
    where: str | None = None

    @contextmanager
    def backend(self, args: argparse.Namespace) -> Iterator[T]:
        """The backend `args` select (see `open_backend`), closed on exit."""
        direct = self.direct
        if direct is None and not args.server:
            raise CliError(self.server_only)
        settings = self.settings_of(args)

        def on_database(database: Database) -> T:
            assert direct is not None  # without --server only a resource with a database backend gets here
            return direct(database, settings)

        with open_backend(args, settings, on_database, self.http, self.check_schema) as chosen:
            yield chosen

    def command(self, op: Callable[[T, argparse.Namespace], JsonObject]) -> Handler:
        """A leaf's `func`: run `op` on the backend and print its answer as JSON (`json_command`)."""
        return json_command(self.backend, op)

    def leaf(self, parent: argparse._SubParsersAction, name: str, help_text: str) -> argparse.ArgumentParser:
        """A subcommand with the connection options."""
        description = None if self.where is None else f"{help_text}. {self.where}"
        return parent.add_parser(name, help=help_text, description=description, parents=[self.conn])


def add_database_options(parser: argparse.ArgumentParser) -> None:
    """`--database-url` and `--data-dir` (the commands that only ever use the database)."""
    parser.add_argument(
        "--database-url", dest="database_url", help="SQLAlchemy URL (default: from the settings)"
    )
    parser.add_argument("--data-dir", dest="data_dir", help="use the SQLite database in this data directory")
