"""The admin token outside the database: generated on first start, reset on demand, shown once.

If no admin token is configured and none is stored, one is generated, only its hash is stored,
and it is returned once so `weir serve` can print it to the console. It is never logged: the
caller prints it to stdout once, and nothing keeps the plain token afterwards.
"""

from __future__ import annotations

from weir.tenancy.keys.keys import generate_admin_token
from weir.tenancy.repository.repo import TenancyRepo

BOOTSTRAP_ACTOR = "bootstrap"


def ensure_admin_token(repo: TenancyRepo, configured_token: str | None) -> str | None:
    """The newly generated admin token, or None when one is configured or already stored.

    Safe with several replicas starting at once: exactly one stores its token (the others get
    None and accept the stored one).
    """
    if configured_token:
        return None
    if repo.admin_token_hash() is not None:
        return None
    token = generate_admin_token()
    if not repo.store_admin_token(token, actor=BOOTSTRAP_ACTOR, replace=False):
        return None  # another replica won the race
    return token


def reset_admin_token(repo: TenancyRepo, *, actor: str) -> str:
    """Replace the stored admin token with a new one and return it (e.g. when it was lost)."""
    token = generate_admin_token()
    repo.store_admin_token(token, actor=actor, replace=True)
    return token


def admin_token_banner(token: str) -> str:
    """The message `weir serve` prints once, to stdout, when it generated the admin token."""
    return (
        "\n"
        "  Generated an admin token for /admin/v1 and `weir admin --server ...`.\n"
        "  It is shown only this once; only its hash is stored:\n\n"
        f"      {token}\n\n"
        "  Set WEIR_ADMIN_TOKEN to use your own, or run `weir admin token reset` to replace it.\n"
    )
