"""What the gateway knows about the caller once its API key is checked."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from engine.request import Priority


@dataclass(frozen=True)
class QuotaLimits:
    """A tenant's limits; None means unlimited."""

    tokens_per_minute: int | None = None
    requests_per_minute: int | None = None
    tokens_per_day: int | None = None
    max_concurrent: int | None = None
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    models: tuple[str, ...] = ()  # empty: every model
    ttft_slo_ms: int | None = None
    tpot_slo_ms: int | None = None
    # Output tokens reserved per sequence for a request without max_tokens; None: the server's.
    default_max_tokens_reservation: int | None = None

    def as_dict(self) -> dict[str, object]:
        """Every field by name (None: unlimited), `models` as a list: the admin API's and the audit log's form."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}


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


# The limits an API key may set: budgets and request bounds (SLOs and reservations are the tenant's).
KEY_LIMIT_FIELDS = (
    "requests_per_minute",
    "tokens_per_minute",
    "tokens_per_day",
    "max_concurrent",
    "max_prompt_tokens",
    "max_output_tokens",
    "models",
)


def key_limits_dict(limits: QuotaLimits) -> dict[str, object]:
    """A key's own limits by name (None: the tenant's): the admin API's and the audit log's form."""
    full = limits.as_dict()
    return {name: full[name] for name in KEY_LIMIT_FIELDS}


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
    return replace(
        tenant,
        requests_per_minute=_tighter(tenant.requests_per_minute, key.requests_per_minute),
        tokens_per_minute=_tighter(tenant.tokens_per_minute, key.tokens_per_minute),
        tokens_per_day=_tighter(tenant.tokens_per_day, key.tokens_per_day),
        max_concurrent=_tighter(tenant.max_concurrent, key.max_concurrent),
        max_prompt_tokens=_tighter(tenant.max_prompt_tokens, key.max_prompt_tokens),
        max_output_tokens=_tighter(tenant.max_output_tokens, key.max_output_tokens),
        models=models,
    )
