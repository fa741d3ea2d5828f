"""Which prefix-cache scope a tenant may take: private unless shared on purpose.

Tenants that share a cache scope can read each other's cached prefixes (and time them), so a
scope is shared only when an admin asks for it with `share_cache_scope_with`; every other clash
is refused with `CacheScopeConflictError`.
"""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from weir.tenancy.errors import CacheScopeConflictError, FieldError
from weir.tenancy.store.models import Tenant

_SHARE_HINT = "; to share a scope on purpose, send share_cache_scope_with naming a tenant that uses it"


def resolve_cache_scope(
    session: Session,
    name: str,
    requested: str | None,
    share_with: str | None,
    *,
    new_tenant: bool,
) -> str:
    """The cache scope tenant `name` may take; `CacheScopeConflictError` on an accidental share.

    A scope is private unless shared on purpose: it must not be another tenant's scope nor
    another tenant's name (the default scope of that name), and a new tenant must not be
    named after another tenant's scope. `share_with` joins that tenant's scope explicitly.
    """
    if share_with is not None:
        partner = session.scalars(select(Tenant).where(Tenant.name == share_with)).one_or_none()
        if partner is None:
            raise FieldError("share_cache_scope_with", f"no tenant named {share_with!r}")
        scope = partner.cache_scope
    else:
        scope = requested if requested is not None else name
    clashes = or_(Tenant.cache_scope == scope, Tenant.name == scope)
    if new_tenant:
        clashes = or_(clashes, Tenant.cache_scope == name)
    query = select(Tenant.name, Tenant.cache_scope).where(Tenant.name != name, clashes).order_by(Tenant.name)
    for other, other_scope in session.execute(query).tuples():
        if share_with is not None and other_scope == scope:
            continue  # the scope being joined on purpose
        if other_scope == name and (other_scope != scope or requested is None):
            # The default scope is the name: a tenant named after a scope would join it.
            raise CacheScopeConflictError(
                "name",
                f"tenant name {name!r} is tenant {other!r}'s cache scope, which a tenant of that "
                f"name would join; choose another name, or send share_cache_scope_with: {other!r} "
                "to share it",
            )
        if other_scope == scope:
            raise CacheScopeConflictError(
                "cache_scope", f"cache scope {scope!r} is already tenant {other!r}'s cache scope{_SHARE_HINT}"
            )
        raise CacheScopeConflictError(
            "cache_scope", f"cache scope {scope!r} is the name of tenant {other!r}{_SHARE_HINT}"
        )
    return scope
