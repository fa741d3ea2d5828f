"""What the gateway knows about the caller once its API key is checked."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from weir.engine.request import Priority
from weir.tenancy.quota_limits import KEY_LIMIT_FIELDS, QuotaLimits, quota_values

__all__ = ["KEY_LIMIT_FIELDS", "QuotaLimits", "TenantContext", "key_limits_dict", "narrowest"]


@dataclass(frozen=True)
class TenantContext:
    """The authenticated caller: derived on the server from the API key, never from the body."""

    tenant_id: str  # stable id (the tenant's name)
    key_id: str  # public id of the API key
    priority: Priority
    weight: float
    cache_scope: str  # prefix-cache scope; the tenant by default
    quota: QuotaLimits
    scopes: tuple[str, ...] = ()
    # The key's own limits, nested in the tenant's: the tighter of `quota` and `key_quota` applies.
    key_quota: QuotaLimits = field(default_factory=QuotaLimits)

    def allows_model(self, name: str) -> bool:
        """Whether both the tenant and the key may use the model `name` (an empty list: any)."""
        return all(not q.models or name in q.models for q in (self.quota, self.key_quota))

    @property
    def limits(self) -> QuotaLimits:
        """The per-request bounds that apply (prompt and output sizes): the tighter of tenant and key.

        Budgets (tokens and requests per minute, tokens per day, concurrency) are not merged here:
        the tenant's and the key's are counted apart, each against its own limit.
        """
        return narrowest(self.quota, self.key_quota)


def _tighter(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def key_limits_dict(limits: QuotaLimits) -> dict[str, object]:
    """A key's own limits by name (None: the tenant's): the admin API's and the audit log's form."""
    return quota_values(limits, KEY_LIMIT_FIELDS)


def narrowest(tenant: QuotaLimits, key: QuotaLimits) -> QuotaLimits:
    """The tenant's limits narrowed by its key's: each numeric limit the smaller of the two.

    `models` is the tenant's list when the key names none, the key's when the tenant names none,
    else their intersection (which may be empty: see `TenantContext.allows_model`).
    """
    if key == QuotaLimits():
        return tenant
    if not key.models:
        models = tenant.models
    elif not tenant.models:
        models = key.models
    else:
        models = tuple(m for m in key.models if m in tenant.models)
    tighter = {n: _tighter(getattr(tenant, n), getattr(key, n)) for n in KEY_LIMIT_FIELDS if n != "models"}
    return replace(tenant, models=models, **tighter)
