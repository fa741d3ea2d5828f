"""What the gateway knows about the caller once its API key is checked."""

from __future__ import annotations

from dataclasses import dataclass, fields

from engine.request import Priority


@dataclass(frozen=True)
class QuotaLimits:
    """A tenant's limits; None means unlimited."""

    tokens_per_minute: int | None = None
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
