"""`weir admin ...`: tenant administration (tenants, keys, quotas, usage, audit, models, adapters).

`weir.migrations.cli` (beside `weir db ...`) calls `add_admin_commands(subparsers, settings_of,
check_schema)`; each leaf parser sets
`func` (called as `args.func(args)`, returning the exit status). The database comes from
`--database-url`, else `--data-dir` (its SQLite file), else the settings. `weir admin` talks to
the database directly, or to a running server with `--server URL` (the admin token from
`--admin-token` or the settings). Results are printed as the admin API's JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from weir.engine.request import Priority
from weir.tenancy.admin_bodies.fields import parse_date, parse_datetime
from weir.tenancy.cli.adapter_cli import add_adapter_commands
from weir.tenancy.cli.admin_client import CLI_ACTOR, AdminBackend, DirectAdmin, HttpAdmin
from weir.tenancy.cli.cli_support import (
    AdminCommands,
    CliSettings,
    SchemaCheck,
    SettingsOf,
    add_database_options,
    connection_parser,
    guard,
    print_json,
    subcommands,
)
from weir.tenancy.cli.cli_support import database_url as _database_url
from weir.tenancy.cli.model_cli import add_model_commands
from weir.tenancy.cli.spend_cli import add_spend_commands
from weir.tenancy.errors import FieldError
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.quota_limits import (
    KEY_LIMIT_FIELDS,
    QUOTA_FIELDS,
    QuotaLimits,
    quota_field_description,
    quota_from,
)
from weir.tenancy.repository.admin_token import reset_admin_token
from weir.tenancy.repository.records import KeySpec, TenantSpec, TenantUpdate
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.db import Database, utc_now
from weir.tenancy.store.enums import KeyScope, TenantStatus
from weir.tenancy.usage.usage_report import (
    DEFAULT_GROUP_BY,
    DEFAULT_LIMIT,
    FORMATS,
    GROUPS,
    MAX_LIMIT,
    report_csv,
    report_query,
)

__all__ = ["CliSettings", "add_admin_commands"]

_SHARE_HELP = "join this tenant's prefix-cache scope on purpose (audited); a scope is never shared otherwise"


# -- weir admin ------------------------------------------------------------------------------------


def _add_limit_options(
    parser: argparse.ArgumentParser, title: str, names: tuple[str, ...], models: str
) -> None:
    g = parser.add_argument_group(title)
    for name in names:
        if name == "models":
            g.add_argument("--model", dest="models", action="append", default=[], metavar="NAME", help=models)
        else:
            metavar = "MS" if name.endswith("_ms") else "N"
            g.add_argument(
                f"--{name.replace('_', '-')}", type=int, metavar=metavar, help=quota_field_description(name)
            )


def add_quota_options(parser: argparse.ArgumentParser) -> None:
    models = "an allowed model; repeat for several (omitted: every model)"
    _add_limit_options(parser, "quota (omitted: unlimited)", QUOTA_FIELDS, models)


def _quota_from(args: argparse.Namespace) -> QuotaLimits:
    return quota_from(args, QUOTA_FIELDS)


def add_key_limit_options(parser: argparse.ArgumentParser) -> None:
    title = "the key's own limits (omitted: its tenant's; the tighter applies)"
    models = "an allowed model, one of the tenant's; repeat for several (omitted: the tenant's)"
    _add_limit_options(parser, title, KEY_LIMIT_FIELDS, models)


def _key_limits_from(args: argparse.Namespace) -> QuotaLimits:
    return quota_from(args, KEY_LIMIT_FIELDS)


def _priority(value: str) -> Priority:
    try:
        return Priority[value.upper()]
    except KeyError:
        raise argparse.ArgumentTypeError("must be one of interactive, standard, batch") from None


def _key_spec(args: argparse.Namespace) -> KeySpec:
    scopes = tuple(KeyScope(s) for s in args.scopes) if args.scopes else tuple(KeyScope)
    expires_at = None
    if args.expires_at is not None:
        expires_at = parse_datetime(args.expires_at, "--expires-at")
    elif args.expires_in_days is not None:
        if args.expires_in_days <= 0:
            raise FieldError("--expires-in-days", "must be positive")
        expires_at = utc_now() + dt.timedelta(days=args.expires_in_days)
    return KeySpec(scopes=scopes, expires_at=expires_at)


def _direct(database: Database, settings: CliSettings | None) -> AdminBackend:
    pepper = settings.key_pepper if settings is not None else None
    return DirectAdmin(TenancyRepo(database, KeyHasher.from_pepper(pepper)))


def _server(server: HttpAdmin) -> AdminBackend:
    return server


def add_admin_commands(
    subparsers: argparse._SubParsersAction, settings_of: SettingsOf, check_schema: SchemaCheck
) -> None:
    """Add `admin` to a `weir` parser; a direct (database) command runs only past `check_schema`."""
    conn = connection_parser()
    c = AdminCommands(conn, settings_of, check_schema, _server, _direct)

    def report(args: argparse.Namespace) -> int:
        query = report_query(args)
        with c.backend(args) as b:
            body = b.usage_report(query)
        if args.format == "csv":
            sys.stdout.write(report_csv(body))
        else:
            print_json(body)
        return 0

    admin = subparsers.add_parser(
        "admin", help="tenants, API keys, quotas, usage, the audit log, models, LoRA adapters"
    )
    admin_sub = admin.add_subparsers(dest="admin_command", required=True)
    add_model_commands(admin_sub, conn, settings_of, check_schema)
    add_spend_commands(admin_sub, conn, settings_of, check_schema)  # prices and window budgets (issue 25)
    add_adapter_commands(admin_sub, conn, settings_of, check_schema)

    # tenants
    t_sub = subcommands(admin_sub, "tenants", "create, list, show, update, suspend tenants")
    p = c.leaf(t_sub, "create", "create a tenant")
    p.add_argument("name")
    p.add_argument(
        "--priority", type=_priority, default=Priority.STANDARD, help="interactive, standard or batch"
    )
    p.add_argument("--weight", type=float, default=1.0, help="fair-share weight (default 1)")
    p.add_argument("--cache-scope", help="prefix-cache scope (default: the tenant's name)")
    p.add_argument("--share-cache-scope-with", metavar="TENANT", help=_SHARE_HELP)
    add_quota_options(p)
    p.set_defaults(
        func=c.command(
            lambda b, a: b.create_tenant(
                TenantSpec(
                    a.name,
                    a.priority,
                    a.weight,
                    a.cache_scope,
                    quota=_quota_from(a),
                    share_cache_scope_with=a.share_cache_scope_with,
                )
            )
        )
    )
    p = c.leaf(t_sub, "list", "list tenants")
    p.set_defaults(func=c.command(lambda b, a: b.list_tenants()))
    p = c.leaf(t_sub, "get", "show one tenant")
    p.add_argument("name")
    p.set_defaults(func=c.command(lambda b, a: b.get_tenant(a.name)))
    p = c.leaf(t_sub, "update", "change a tenant's priority, weight, cache scope or status")
    p.add_argument("name")
    p.add_argument("--priority", type=_priority)
    p.add_argument("--weight", type=float)
    p.add_argument("--cache-scope")
    p.add_argument("--share-cache-scope-with", metavar="TENANT", help=_SHARE_HELP)
    p.add_argument("--status", type=TenantStatus, choices=list(TenantStatus))
    p.set_defaults(
        func=c.command(
            lambda b, a: b.update_tenant(
                a.name,
                TenantUpdate(
                    a.priority,
                    a.weight,
                    a.cache_scope,
                    a.status,
                    share_cache_scope_with=a.share_cache_scope_with,
                ),
            )
        )
    )
    p = c.leaf(t_sub, "suspend", "suspend a tenant (its keys get 403)")
    p.add_argument("name")
    p.set_defaults(func=c.command(lambda b, a: b.suspend_tenant(a.name)))

    # keys
    k_sub = subcommands(admin_sub, "keys", "issue, list, revoke, rotate API keys; set their limits")
    p = c.leaf(k_sub, "issue", "issue a key; the key is printed only this once")
    p.add_argument("tenant")
    p.add_argument("--scope", dest="scopes", action="append", choices=[s.value for s in KeyScope],
                   help="repeat for several (default: all)")  # fmt: skip
    when = p.add_mutually_exclusive_group()
    when.add_argument("--expires-at", help="ISO 8601 time with a zone, e.g. 2030-01-01T00:00:00Z")
    when.add_argument("--expires-in-days", type=int, metavar="N")
    p.set_defaults(func=c.command(lambda b, a: b.issue_key(a.tenant, _key_spec(a))))
    p = c.leaf(k_sub, "list", "list a tenant's keys (never their secrets)")
    p.add_argument("tenant")
    p.set_defaults(func=c.command(lambda b, a: b.list_keys(a.tenant)))
    p = c.leaf(k_sub, "revoke", "revoke a key")
    p.add_argument("key_id")
    p.set_defaults(func=c.command(lambda b, a: b.revoke_key(a.key_id)))
    p = c.leaf(k_sub, "rotate", "issue a replacement key and revoke the old one")
    p.add_argument("key_id")
    p.set_defaults(func=c.command(lambda b, a: b.rotate_key(a.key_id)))
    p = c.leaf(k_sub, "limits", "replace a key's own limits (omitted: its tenant's)")
    p.add_argument("key_id")
    add_key_limit_options(p)
    p.set_defaults(func=c.command(lambda b, a: b.set_key_limits(a.key_id, _key_limits_from(a))))

    # quota
    q_sub = subcommands(admin_sub, "quota", "set a tenant's quota")
    p = c.leaf(q_sub, "set", "replace a tenant's whole quota (omitted fields: unlimited)")
    p.add_argument("tenant")
    add_quota_options(p)
    p.set_defaults(func=c.command(lambda b, a: b.set_quota(a.tenant, _quota_from(a))))

    # usage and audit
    u_sub = subcommands(admin_sub, "usage", "usage: a tenant's per UTC day, or grouped reports")
    p = c.leaf(u_sub, "daily", "a tenant's usage per UTC day")
    p.add_argument("tenant")
    p.add_argument("--since", type=_date, metavar="YYYY-MM-DD")
    p.add_argument("--until", type=_date, metavar="YYYY-MM-DD")
    p.set_defaults(func=c.command(lambda b, a: b.usage(a.tenant, a.since, a.until)))
    p = c.leaf(u_sub, "report", "usage over [since, until) grouped, one page, JSON or CSV")
    p.add_argument("--since", required=True, help="YYYY-MM-DD (midnight UTC) or ISO 8601 time with a zone")
    p.add_argument("--until", required=True, help="exclusive; same forms as --since")
    p.add_argument(
        "--group-by", default=",".join(DEFAULT_GROUP_BY), help=f"comma-separated: {', '.join(GROUPS)}"
    )
    p.add_argument("--tenant")
    p.add_argument("--key-id")
    p.add_argument("--endpoint", help="only this endpoint's records (chat.completion, response, ...)")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help=f"groups per page, 1-{MAX_LIMIT}")
    p.add_argument("--offset", type=int, default=0, help="the previous page's next_offset")
    p.add_argument("--format", choices=FORMATS, default="json")
    p.set_defaults(func=guard(report))
    p = c.leaf(admin_sub, "audit", "the audit log, newest first")
    p.add_argument("--tenant")
    p.add_argument("--limit", type=int, default=100)
    p.set_defaults(func=c.command(lambda b, a: b.audit(a.tenant, a.limit)))

    # admin token (database only: a server cannot hand out its own replacement token)
    tk_sub = subcommands(admin_sub, "token", "the admin token")
    p = tk_sub.add_parser("reset", help="generate a new admin token, store its hash, print it once")
    add_database_options(p)

    def do_reset(args: argparse.Namespace) -> int:
        settings = settings_of(args)
        database = Database(_database_url(args, settings))
        try:
            check_schema(database.engine)
            repo = TenancyRepo(database, KeyHasher.from_pepper(settings.key_pepper if settings else None))
            print(reset_admin_token(repo, actor=CLI_ACTOR))
        finally:
            database.dispose()
        if settings is not None and settings.admin_token:
            print(
                "weir: note: WEIR_ADMIN_TOKEN is set and takes precedence over the stored token",
                file=sys.stderr,
            )
        return 0

    p.set_defaults(func=guard(do_reset))


def _date(value: str) -> dt.date:
    try:
        return parse_date(value, "date")
    except FieldError:
        raise argparse.ArgumentTypeError("must be a date, YYYY-MM-DD") from None
