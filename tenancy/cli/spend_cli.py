"""`weir admin prices ...` and `weir admin budgets ...`: the price table and window budgets.

With `--server URL` each command goes to the running server's admin API; without it, to the
database. Either way the change is audited, and servers apply it within their auth cache TTL.
`weir.tenancy.cli.cli` adds these commands under `weir admin`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from weir.tenancy.admin_bodies.spend_api import JsonObject
from weir.tenancy.budgets.budget_windows import WindowKind
from weir.tenancy.budgets.window_budget_records import BudgetUnit
from weir.tenancy.cli.cli_support import AdminCommands, SchemaCheck, SettingsOf, integer, subcommands
from weir.tenancy.cli.spend_admin import HttpSpendAdmin, SpendAdmin, SpendAdminBackend


def _options_body(args: argparse.Namespace, fields: Sequence[str], optional: Sequence[str]) -> JsonObject:
    """An admin API body from the command's options, each stored under its body field's name; an
    optional one left unset stays out of the body (the server's default applies)."""
    body: JsonObject = {field: getattr(args, field) for field in fields}
    body.update({field: getattr(args, field) for field in optional if getattr(args, field) is not None})
    return body


def price_body(args: argparse.Namespace) -> JsonObject:
    """The admin API's price body from the command's options (amounts stay decimal text)."""
    return _options_body(
        args,
        ("model", "currency", "input_per_million", "output_per_million"),
        ("cached_input_per_million", "effective_from"),
    )


def budget_body(args: argparse.Namespace) -> JsonObject:
    """The admin API's window budget body from the command's options."""
    return _options_body(
        args, ("tenant", "unit", "window", "time_zone", "soft_limit", "hard_limit"), ("key_id", "rolling_s")
    )


def add_spend_commands(
    admin_sub: argparse._SubParsersAction,
    conn: argparse.ArgumentParser,
    settings_of: SettingsOf,
    check_schema: SchemaCheck,
) -> None:
    """Add `prices` and `budgets` under `weir admin`; `conn` is the connection parent parser."""

    c: AdminCommands[SpendAdminBackend] = AdminCommands(
        conn, settings_of, check_schema, HttpSpendAdmin, lambda database, settings: SpendAdmin(database)
    )
    p_sub = subcommands(admin_sub, "prices", "the price table: per model version, per million tokens")
    p = c.leaf(p_sub, "set", "add a price, effective now or from a later time")
    p.add_argument("model", help="a model version (name@version) or a model (every version without its own)")
    p.add_argument(
        "--currency", default="USD", help="three capital letters (default USD; one per deployment)"
    )
    p.add_argument("--input", dest="input_per_million", required=True, metavar="AMOUNT",
                   help="per million uncached prompt tokens, e.g. 0.15")  # fmt: skip
    p.add_argument("--cached-input", dest="cached_input_per_million", metavar="AMOUNT",
                   help="per million prompt tokens served from the prefix cache (default: --input)")  # fmt: skip
    p.add_argument("--output", dest="output_per_million", required=True, metavar="AMOUNT",
                   help="per million output tokens")  # fmt: skip
    p.add_argument("--effective-from", dest="effective_from", metavar="TIME",
                   help="ISO 8601 time with a zone, not in the past (default: now)")  # fmt: skip
    p.set_defaults(func=c.command(lambda b, a: b.set_price(price_body(a))))
    p = c.leaf(p_sub, "list", "every price, oldest first per model")
    p.add_argument("--model", help="only this model or model version")
    p.set_defaults(func=c.command(lambda b, a: b.list_prices(a.model)))

    b_sub = subcommands(
        admin_sub,
        "budgets",
        "token and money budgets of tenants and keys over minute/hour/day/month/rolling windows",
    )
    p = c.leaf(b_sub, "set", "set a budget (same principal, unit and window: its limits change)")
    p.add_argument("tenant")
    p.add_argument("--key", dest="key_id", metavar="KEY_ID", help="a key of the tenant (default: the tenant)")
    p.add_argument("--unit", required=True, choices=[u.value for u in BudgetUnit],
                   help="tokens, or micros (micro-units of the price table's currency)")  # fmt: skip
    p.add_argument("--window", required=True, choices=[w.value for w in WindowKind])
    p.add_argument("--time-zone", dest="time_zone", default="UTC",
                   help="IANA zone of day and month windows (default UTC)")  # fmt: skip
    p.add_argument("--rolling-s", dest="rolling_s", type=integer, metavar="SECONDS",
                   help="length of a rolling window (a multiple of 60)")  # fmt: skip
    p.add_argument("--soft", dest="soft_limit", type=integer, metavar="N",
                   help="alert (metric and audit event) when reached")  # fmt: skip
    p.add_argument(
        "--hard", dest="hard_limit", type=integer, metavar="N", help="refuse (429) what would pass it"
    )
    p.set_defaults(func=c.command(lambda b, a: b.set_budget(budget_body(a))))
    p = c.leaf(b_sub, "list", "budgets with their current window's count and reset")
    p.add_argument("--tenant")
    p.set_defaults(func=c.command(lambda b, a: b.list_budgets(a.tenant)))
    p = c.leaf(b_sub, "delete", "remove a budget")
    p.add_argument("budget_id", type=integer)
    p.set_defaults(func=c.command(lambda b, a: b.delete_budget(a.budget_id)))
