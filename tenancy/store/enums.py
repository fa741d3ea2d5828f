"""Enumerations stored in the tenancy database.

Values are lower-case strings: they are what the admin API and the database carry, so renaming a
member is a data migration.
"""

from __future__ import annotations

import enum


class TenantStatus(enum.StrEnum):
    """Whether a tenant may use the service. A suspended tenant's keys get 403, not 401."""

    ACTIVE = "active"
    SUSPENDED = "suspended"


class KeyScope(enum.StrEnum):
    """What an API key may be used for."""

    INFERENCE = "inference"  # the OpenAI-compatible endpoints
    USAGE = "usage"  # GET /v1/usage, the tenant's own usage


ALL_KEY_SCOPES: tuple[KeyScope, ...] = tuple(KeyScope)


class UsageStatus(enum.StrEnum):
    """How a request ended, for billing and for the usage report."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class KeyState(enum.StrEnum):
    """A key's state at a moment in time (derived, never stored)."""

    ACTIVE = "active"
    REVOKED = "revoked"
    EXPIRED = "expired"


class AuditAction(enum.StrEnum):
    """One value per kind of admin action; every admin action writes exactly one event."""

    TENANT_CREATE = "tenant.create"
    TENANT_UPDATE = "tenant.update"
    TENANT_SUSPEND = "tenant.suspend"
    QUOTA_SET = "quota.set"
    KEY_ISSUE = "key.issue"
    KEY_REVOKE = "key.revoke"
    KEY_ROTATE = "key.rotate"
    KEY_LIMITS_SET = "key.limits"
    ADMIN_TOKEN_SET = "admin_token.set"
    MODEL_REGISTER = "model.register"
    MODEL_STATE = "model.state"
    MODEL_TRAFFIC = "model.traffic"
    MODEL_ROLLBACK = "model.rollback"
    ADAPTER_REGISTER = "adapter.register"
    ADAPTER_STATE = "adapter.state"
    PRICE_SET = "price.set"
    BUDGET_SET = "budget.set"
    BUDGET_DELETE = "budget.delete"
    BUDGET_SOFT_LIMIT = "budget.soft_limit"
    ADAPTER_ACCESS = "adapter.access"


class ModelVersionState(enum.StrEnum):
    """Where a model version is in its life. Values are stored in the database."""

    REGISTERED = "registered"  # known, never loaded
    LOADING = "loading"  # weights being loaded and warmed up
    READY = "ready"  # serving (the traffic plan decides how much)
    DRAINING = "draining"  # no new requests; in-flight ones finish on it
    RETIRED = "retired"  # unloaded, memory and cached blocks freed
    FAILED = "failed"  # the last load failed; `failure_reason` says why


class AdapterState(enum.StrEnum):
    """Where an adapter is: registered (not loaded), loaded (servable), unloaded, failed, or
    retired (never loaded again; the row stays, usage records name it)."""

    REGISTERED = "registered"
    LOADED = "loaded"
    UNLOADED = "unloaded"
    FAILED = "failed"
    RETIRED = "retired"
