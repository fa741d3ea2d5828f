"""`weir admin adapters ...`: register LoRA adapters, load and unload them, retire them, and
say which tenants may call them.

Every command talks to a running server (`--server URL`, admin token from `--admin-token` or
WEIR_ADMIN_TOKEN): adapters live in its engines, and the server records each change (audited) so
a restart loads the adapters recorded as loaded again. `weir.tenancy.cli.cli` adds these commands under
`weir admin`.
"""

from __future__ import annotations

import argparse

from weir.tenancy.catalog.adapter_records import AdapterSpec
from weir.tenancy.cli.adapter_admin_client import HttpAdapterAdmin
from weir.tenancy.cli.cli_support import AdminCommands, SchemaCheck, SettingsOf, subcommands

_WHERE = "Needs --server URL: adapters are loaded by a running server, which records every change."


def add_adapter_commands(
    admin_sub: argparse._SubParsersAction,
    conn: argparse.ArgumentParser,
    settings_of: SettingsOf,
    check_schema: SchemaCheck,
) -> None:
    """Add `adapters` and its subcommands under `weir admin`; `conn` is the connection parent parser."""
    needs_server = "weir admin adapters needs --server URL (adapters live in a running server)"
    c = AdminCommands(
        conn, settings_of, check_schema, HttpAdapterAdmin, server_only=needs_server, where=_WHERE
    )
    a_sub = subcommands(
        admin_sub,
        "adapters",
        "LoRA adapters: register, load, unload, retire, grant and revoke access",
        f"LoRA adapters of a base model version, called by name in `model`. {_WHERE}",
    )

    p = c.leaf(a_sub, "list", "every adapter with its state, access and runtime")
    p.add_argument("--model-version", metavar="NAME@VERSION", help="only the adapters of this base version")
    p.set_defaults(func=c.command(lambda b, a: b.list_adapters(a.model_version)))

    p = c.leaf(a_sub, "get", "one adapter")
    p.add_argument("name")
    p.set_defaults(func=c.command(lambda b, a: b.get(a.name)))

    p = c.leaf(a_sub, "register", "register an adapter of a base model version (state: registered)")
    p.add_argument("name", help="what clients put in `model`")
    p.add_argument("model_version", metavar="NAME@VERSION", help="the base model version")
    p.add_argument("path", help="the PEFT folder, relative to the server's --adapter-dir")
    p.add_argument("--owner", metavar="TENANT", help="private to this tenant (default: public until granted)")
    p.set_defaults(
        func=c.command(lambda b, a: b.register(AdapterSpec(a.name, a.model_version, a.path, a.owner)))
    )

    p = c.leaf(
        a_sub, "load", "load an adapter onto its base version's engine (refused with the reason if it is bad)"
    )
    p.add_argument("name")
    p.set_defaults(func=c.command(lambda b, a: b.load(a.name)))

    p = c.leaf(a_sub, "unload", "stop routing to an adapter, let its requests finish, then free it")
    p.add_argument("name")
    p.set_defaults(func=c.command(lambda b, a: b.unload(a.name)))

    p = c.leaf(a_sub, "retire", "unload an adapter if loaded and never load it again")
    p.add_argument("name")
    p.set_defaults(func=c.command(lambda b, a: b.retire(a.name)))

    p = c.leaf(a_sub, "grant", "let a tenant call an adapter (an adapter with grants is no longer public)")
    p.add_argument("name")
    p.add_argument("tenant")
    p.set_defaults(func=c.command(lambda b, a: b.grant(a.name, a.tenant)))

    p = c.leaf(a_sub, "revoke", "take a tenant off an adapter's access list")
    p.add_argument("name")
    p.add_argument("tenant")
    p.set_defaults(func=c.command(lambda b, a: b.revoke(a.name, a.tenant)))
