"""`weir admin models ...`: register model versions, load them, move traffic, drain, retire, roll back.

With `--server URL` each command goes to the running server, which acts at once (a load reads
the weights and warms up before it answers). Without it the command changes the database only:
a server picks the change up at its next start, and `load` just marks the version `loading`
for that start to load. `weir.tenancy.cli.cli` adds these commands under `weir admin`.
"""

from __future__ import annotations

import argparse

from weir.tenancy.catalog.model_version_records import ModelVersionSpec, TrafficPlan
from weir.tenancy.catalog.model_versions import ModelVersionRepo
from weir.tenancy.cli.cli_support import (
    AdminCommands,
    CliError,
    SchemaCheck,
    SettingsOf,
    integer,
    subcommands,
)
from weir.tenancy.cli.model_admin_client import DirectModelAdmin, HttpModelAdmin, ModelAdminBackend

_WHERE = (
    "With --server the running server acts at once; without it only the database changes and a "
    "server picks the change up at its next start."
)
_FORCE_HELP = (
    "even if it is the model's last ready version: its requests are then answered 503 "
    "model_unavailable until a version is ready again (refused without --force)"
)
_LOAD_HELP = (
    "load a version and warm it up (with --server: ready when this returns; on the database: marks "
    "it loading, and the next server start loads it)"
)


def parse_split(text: str) -> dict[str, int]:
    """`v1=90,v2=10` -> {"v1": 90, "v2": 10}; an empty string is an empty split (no plan)."""
    split: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        version, sep, percent = part.partition("=")
        if not sep or not version.strip():
            raise CliError(f"--split: expected VERSION=PERCENT, got {part!r}")
        try:
            value = int(percent.strip())
        except ValueError:
            raise CliError(
                f"--split: {version.strip()}'s percent must be an integer, got {percent!r}"
            ) from None
        if version.strip() in split:
            raise CliError(f"--split: {version.strip()} is given twice")
        split[version.strip()] = value
    return split


def parse_pins(items: list[str]) -> dict[str, str]:
    """Repeated `tenant=version` -> {"tenant": "version"}."""
    pins: dict[str, str] = {}
    for item in items:
        tenant, sep, version = item.partition("=")
        if not sep or not tenant.strip() or not version.strip():
            raise CliError(f"--pin: expected TENANT=VERSION, got {item!r}")
        if tenant.strip() in pins:
            raise CliError(f"--pin: {tenant.strip()} is pinned twice")
        pins[tenant.strip()] = version.strip()
    return pins


def add_model_commands(
    admin_sub: argparse._SubParsersAction,
    conn: argparse.ArgumentParser,
    settings_of: SettingsOf,
    check_schema: SchemaCheck,
) -> None:
    """Add `models` and its subcommands under `weir admin`; `conn` is the connection parent parser."""

    c: AdminCommands[ModelAdminBackend] = AdminCommands(
        conn,
        settings_of,
        check_schema,
        HttpModelAdmin,
        lambda database, settings: DirectModelAdmin(ModelVersionRepo(database)),
        where=_WHERE,
    )
    m_sub = subcommands(
        admin_sub,
        "models",
        "model versions: register, load, traffic, drain, retire, rollback",
        f"Model versions and rollouts. {_WHERE}",
    )

    p = c.leaf(m_sub, "list", "every model version with its state and traffic share")
    p.add_argument("name", nargs="?", help="only this model name")
    p.set_defaults(func=c.command(lambda b, a: b.list_models(a.name)))

    p = c.leaf(m_sub, "register", "register a new version of a model (state: registered)")
    p.add_argument("name")
    p.add_argument("version")
    p.add_argument("path", help="the weights folder (as the server sees it)")
    p.add_argument("--dtype", help="float32, float16 or bfloat16 (default: the server's)")
    p.add_argument("--kv-cache-tokens", type=integer, metavar="N",
                   help="this version's KV pool in tokens (default: the server's budget)")  # fmt: skip
    p.add_argument("--tokenizer", help="tokenizer folder (default: the weights folder)")
    p.set_defaults(
        func=c.command(
            lambda b, a: b.register(
                ModelVersionSpec(a.name, a.version, a.path, a.tokenizer, a.dtype, a.kv_cache_tokens)
            )
        )
    )

    p = c.leaf(m_sub, "load", _LOAD_HELP)
    p.add_argument("name")
    p.add_argument("version")
    p.set_defaults(func=c.command(lambda b, a: b.load(a.name, a.version)))

    p = c.leaf(m_sub, "traffic", "set a model's traffic plan: the split of new requests, and tenant pins")
    p.add_argument("name")
    p.add_argument("--split", required=True, metavar="V=PCT,...",
                   help="e.g. v1=90,v2=10 (percents sum to 100); '' clears the split")  # fmt: skip
    p.add_argument("--pin", dest="pins", action="append", default=[], metavar="TENANT=VERSION",
                   help="keep a tenant on a version whatever the split; repeat for several")  # fmt: skip
    p.set_defaults(
        func=c.command(
            lambda b, a: b.set_traffic(TrafficPlan(a.name, parse_split(a.split), parse_pins(a.pins)))
        )
    )

    p = c.leaf(m_sub, "drain", "stop sending new requests to a version; in-flight ones finish on it")
    p.add_argument("name")
    p.add_argument("version")
    p.add_argument("--force", action="store_true", help=_FORCE_HELP)
    p.set_defaults(func=c.command(lambda b, a: b.drain(a.name, a.version, a.force)))

    p = c.leaf(m_sub, "retire", "unload a drained version and free its memory and cached blocks")
    p.add_argument("name")
    p.add_argument("version")
    p.add_argument("--force", action="store_true", help=_FORCE_HELP)
    p.set_defaults(func=c.command(lambda b, a: b.retire(a.name, a.version, a.force)))

    p = c.leaf(m_sub, "rollback", "send all of a model's traffic back to one version and drain the others")
    p.add_argument("name")
    p.add_argument("--to", required=True, metavar="VERSION", help="a ready (or draining) version")
    p.set_defaults(func=c.command(lambda b, a: b.rollback(a.name, a.to)))
