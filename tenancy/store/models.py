"""SQLAlchemy 2.x tables of the tenancy database (SQLite and PostgreSQL).

Types are chosen to be portable: enums are stored as short strings (no native PostgreSQL enum,
so adding a member needs no DDL), lists as JSON, times as UTC timestamps. The migrations in
`migrations/versions/` must produce exactly this schema; a test compares them.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Date,
    DateTime,
    Dialect,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from weir.engine.request import FinishReason, Priority
from weir.tenancy.store.enums import AdapterState, AuditAction, ModelVersionState, TenantStatus, UsageStatus

NAME_LEN = 64
# The catalog's names and texts (weir.tenancy.catalog): model name, version label, weights path,
# failure reason, adapter name.
MAX_NAME_LEN = 128
MAX_VERSION_LEN = 64
MAX_PATH_LEN = 4096
MAX_REASON_LEN = 2000
MAX_ADAPTER_NAME_LEN = 128
KEY_ID_LEN = 32
HASH_LEN = 64
USER_LEN = 256  # the request's `user` field as stored (weir.gateway.api.openai_bodies.requests bounds it)
ENDPOINT_LEN = 32  # a usage record's endpoint name
PRINCIPAL_LEN = 96  # a budget bucket's subject: "key:<id>:tokens"
MODEL_VERSION_ID_LEN = MAX_NAME_LEN + 1 + MAX_VERSION_LEN  # name@version
CURRENCY_LEN = 3
RESPONSE_ID_LEN = 64  # resp_ and 32 hex digits, with room

# Deterministic constraint names, so migrations can drop and alter them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a 64-bit id.
BigIntId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[dt.datetime]):
    """A timezone-aware UTC datetime on every backend.

    SQLite has no time zones: values are stored as naive UTC and come back tagged as UTC.
    Naive datetimes are refused on the way in, so local times can never sneak in.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; use an aware datetime")
        value = value.astimezone(dt.UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def _lower_names(enum_cls: type[enum.Enum]) -> list[str]:
    return [member.name.lower() for member in enum_cls]


def _values(enum_cls: type[enum.Enum]) -> list[str]:
    return [str(member.value) for member in enum_cls]


def _str_enum(enum_cls: type[enum.Enum], length: int, *, by_name: bool = False) -> Enum:
    """An enum stored as VARCHAR(length) holding the member's value (or lower-case name)."""
    return Enum(
        enum_cls,
        native_enum=False,
        create_constraint=False,
        length=length,
        values_callable=_lower_names if by_name else _values,
        validate_strings=True,
    )


class Base(DeclarativeBase):
    """Declarative base; its metadata is what Alembic compares against."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Tenant(Base):
    """A customer of the service. `name` is the stable id carried in TenantContext.tenant_id."""

    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN), unique=True)
    status: Mapped[TenantStatus] = mapped_column(_str_enum(TenantStatus, 16))
    priority: Mapped[Priority] = mapped_column(_str_enum(Priority, 16, by_name=True))
    weight: Mapped[float] = mapped_column(Float)  # fair-share weight in the scheduler
    cache_scope: Mapped[str] = mapped_column(String(128))  # prefix-cache scope; the name by default
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())

    quota: Mapped[Quota] = relationship(back_populates="tenant", uselist=False, lazy="joined")


class Quota(Base):
    """A tenant's limits (one row per tenant); NULL means unlimited.

    Kept apart from `tenants` so per-replica token budget leases (issue 6) can reference the
    tenant's integer id and be updated without touching the tenant row.
    """

    __tablename__ = "quotas"

    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    tokens_per_day: Mapped[int | None] = mapped_column(BigInteger)
    max_concurrent: Mapped[int | None] = mapped_column(Integer)
    max_prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    max_output_tokens: Mapped[int | None] = mapped_column(Integer)
    models: Mapped[list[str]] = mapped_column(JSON)  # empty list: every model
    requests_per_minute: Mapped[int | None] = mapped_column(BigInteger)  # added by 0006
    ttft_slo_ms: Mapped[int | None] = mapped_column(Integer)
    tpot_slo_ms: Mapped[int | None] = mapped_column(Integer)
    # Output tokens reserved per sequence for a request without max_tokens; NULL: the server's.
    default_max_tokens_reservation: Mapped[int | None] = mapped_column(Integer)
    # Stored /v1/responses (0013): the tenant's storage quota and retention; NULL: the server's.
    response_storage_bytes: Mapped[int | None] = mapped_column(BigInteger)
    response_retention_s: Mapped[int | None] = mapped_column(BigInteger)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())

    tenant: Mapped[Tenant] = relationship(back_populates="quota")


class ApiKey(Base):
    """A tenant API key. `id` is the key's public id; only a hash of the whole key is stored."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(KEY_ID_LEN), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    secret_hash: Mapped[str] = mapped_column(String(HASH_LEN))
    scopes: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    # Updated when a replica's cache misses, so it is accurate to the auth cache TTL.
    last_used_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())

    tenant: Mapped[Tenant] = relationship(lazy="joined")
    limits: Mapped[KeyLimit | None] = relationship(
        back_populates="key", uselist=False, lazy="joined", cascade="all, delete-orphan"
    )


class KeyLimit(Base):
    """An API key's own limits, nested in its tenant's (the tighter applies); NULL: the tenant's.

    No row: the key has no limits of its own. Kept apart from `api_keys` like `quotas` is from
    `tenants`, so a key's budget rows and its limits change without touching the key.
    """

    __tablename__ = "key_limits"

    key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"), primary_key=True)
    requests_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    tokens_per_day: Mapped[int | None] = mapped_column(BigInteger)
    max_concurrent: Mapped[int | None] = mapped_column(Integer)
    max_prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    max_output_tokens: Mapped[int | None] = mapped_column(Integer)
    models: Mapped[list[str]] = mapped_column(JSON)  # empty list: the tenant's models
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())

    key: Mapped[ApiKey] = relationship(back_populates="limits")


class UsageRecord(Base):
    """One row per request that reached the engine: completed, failed or cancelled."""

    __tablename__ = "usage_records"
    __table_args__ = (
        Index("ix_usage_records_tenant_day", "tenant_id", "day"),
        # One record per request: a record replayed from the usage spool is stored once.
        Index("ux_usage_records_request_tenant", "request_id", "tenant_id", unique=True),
    )

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(128))
    # No cascades: billing history must not disappear with a tenant or a key.
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"))
    model: Mapped[str] = mapped_column(String(256))  # the model name the client asked for
    # The id (name@version) of the model version that generated the tokens; NULL before 0005
    # and for requests that never reached a version.
    model_version: Mapped[str | None] = mapped_column(String(MODEL_VERSION_ID_LEN))
    # The LoRA adapter the request ran through; NULL for the base model and before 0006.
    adapter: Mapped[str | None] = mapped_column(String(MAX_ADAPTER_NAME_LEN))
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer)  # prompt tokens served from the prefix cache
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    e2e_ms: Mapped[float | None] = mapped_column(Float)
    status: Mapped[UsageStatus] = mapped_column(_str_enum(UsageStatus, 16))
    finish_reason: Mapped[FinishReason | None] = mapped_column(_str_enum(FinishReason, 16))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    # The UTC day of created_at, stored so per-day reports group portably and use the index.
    day: Mapped[dt.date] = mapped_column(Date)
    # The request's `user` field (the client's end user), bounded; NULL: not given (or before 0006).
    user: Mapped[str | None] = mapped_column(String(USER_LEN))
    # Spend (issue 25, 0008): micro-units of `currency` at the price (`model_prices.id`) in effect
    # at created_at; NULL: no price for the model (or written before 0008). Never rewritten by a
    # price change.
    spend_micros: Mapped[int | None] = mapped_column(BigInteger)
    currency: Mapped[str | None] = mapped_column(String(CURRENCY_LEN))
    price_id: Mapped[int | None] = mapped_column(Integer)
    # The API the request came through (chat.completion, text_completion, message, response,
    # tokenize: weir.gateway.api.protocol.Endpoint's values); NULL before 0012.
    endpoint: Mapped[str | None] = mapped_column(String(ENDPOINT_LEN))


class AuditEvent(Base):
    """One row per admin action. `tenant` is a name, not a foreign key, so the log outlives rows."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[AuditAction] = mapped_column(_str_enum(AuditAction, 32))
    tenant: Mapped[str | None] = mapped_column(String(NAME_LEN), index=True)
    target: Mapped[str | None] = mapped_column(String(128))  # e.g. a key's public id
    details: Mapped[dict[str, Any]] = mapped_column(JSON)  # never secrets


class AdminToken(Base):
    """The hash of the admin bearer token. A single row (id 1), so two replicas bootstrapping at
    once cannot both win: the second insert fails on the primary key."""

    __tablename__ = "admin_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    token_hash: Mapped[str] = mapped_column(String(HASH_LEN))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())


class BudgetBucket(Base):
    """A tenant's token budget shared by every replica, which lease it in chunks (weir.tenancy.budgets.leases).

    `tokens` is the tokens-per-minute bucket's level at `refilled_at`; `day_used` counts tokens
    leased on UTC day `day` against the daily cap. Times are epoch seconds and days are days since
    the epoch, so one conditional UPDATE can refill and take on SQLite and PostgreSQL alike.
    """

    __tablename__ = "budget_buckets"

    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    refilled_at: Mapped[float] = mapped_column(Float)
    day: Mapped[int] = mapped_column(Integer)
    day_used: Mapped[int] = mapped_column(BigInteger)


class PrincipalBucket(Base):
    """A budget shared by the replicas, like `BudgetBucket`, for any principal and unit.

    `subject` names what is limited and in what unit: `key:<key id>:tokens`,
    `key:<key id>:requests`, `tenant:<name>:requests` (`weir.tenancy.budgets.leases.BucketRows`). The tenant's
    token budget keeps its `budget_buckets` row. No foreign key: a subject outlives nothing it
    names (keys are revoked, never deleted), and a row of a deleted tenant is merely unused.
    """

    __tablename__ = "principal_buckets"

    subject: Mapped[str] = mapped_column(String(PRINCIPAL_LEN), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    refilled_at: Mapped[float] = mapped_column(Float)
    day: Mapped[int] = mapped_column(Integer)
    day_used: Mapped[int] = mapped_column(BigInteger)


class ModelVersion(Base):
    """One registered version of a model: where its weights are, how to run it, its state.

    Rows are never deleted (a retired version stays, for the audit trail and usage records that
    name it). The version's public id is `name@version` (`weir.tenancy.catalog.model_version_records`).
    """

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(MAX_NAME_LEN))
    version: Mapped[str] = mapped_column(String(MAX_VERSION_LEN))
    path: Mapped[str] = mapped_column(String(MAX_PATH_LEN))
    tokenizer: Mapped[str | None] = mapped_column(String(MAX_PATH_LEN))  # NULL: the weights folder's
    dtype: Mapped[str | None] = mapped_column(String(16))  # NULL: the server's
    kv_cache_tokens: Mapped[int | None] = mapped_column(Integer)  # NULL: the server's KV budget
    state: Mapped[ModelVersionState] = mapped_column(_str_enum(ModelVersionState, 16))
    failure_reason: Mapped[str | None] = mapped_column(String(MAX_REASON_LEN))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    updated_by: Mapped[str] = mapped_column(String(128))


class ModelTraffic(Base):
    """A model name's traffic plan: split (version -> percent) and pins (tenant -> version)."""

    __tablename__ = "model_traffic"

    name: Mapped[str] = mapped_column(String(MAX_NAME_LEN), primary_key=True)
    split: Mapped[dict[str, int]] = mapped_column(JSON)
    pins: Mapped[dict[str, str]] = mapped_column(JSON)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    updated_by: Mapped[str] = mapped_column(String(128))


class LoraAdapter(Base):
    """A registered LoRA adapter of one base model version: its folder, owner and state.

    Rows are never deleted (usage records name them). `owner_tenant_id` NULL: public.
    """

    __tablename__ = "lora_adapters"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(MAX_ADAPTER_NAME_LEN), unique=True)
    model_version: Mapped[str] = mapped_column(String(MODEL_VERSION_ID_LEN))
    path: Mapped[str] = mapped_column(String(MAX_PATH_LEN))
    owner_tenant_id: Mapped[int | None] = mapped_column(ForeignKey("tenants.id"))
    state: Mapped[AdapterState] = mapped_column(_str_enum(AdapterState, 16))
    failure_reason: Mapped[str | None] = mapped_column(String(MAX_REASON_LEN))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    updated_by: Mapped[str] = mapped_column(String(128))

    owner: Mapped[Tenant | None] = relationship(lazy="joined")
    grants: Mapped[list[LoraAdapterGrant]] = relationship(
        lazy="selectin", cascade="all, delete-orphan", order_by="LoraAdapterGrant.tenant_id"
    )


class ModelPrice(Base):
    """A price of a model version (`name@version`) or of every version of a model (`name`), from
    `effective_from` until the next price of the same model. Rows are never updated or deleted:
    a price change is a new row, so the spend recorded under an old price stays explained."""

    __tablename__ = "model_prices"
    __table_args__ = (UniqueConstraint("model", "effective_from"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(MODEL_VERSION_ID_LEN))
    currency: Mapped[str] = mapped_column(String(CURRENCY_LEN))
    # Micro-units of the currency per million tokens.
    input_micros: Mapped[int] = mapped_column(BigInteger)
    cached_input_micros: Mapped[int] = mapped_column(BigInteger)
    output_micros: Mapped[int] = mapped_column(BigInteger)
    effective_from: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    created_by: Mapped[str] = mapped_column(String(128))


class WindowBudget(Base):
    """A budget over a window (`weir.tenancy.budgets.budget_windows`) of a tenant, or of one of its keys.

    `unit` is `tokens` or `micros` (money, in the price table's currency). A soft limit alerts
    (metric and audit event) and serves; a hard limit refuses (429). NULL: no such limit.
    """

    __tablename__ = "window_budgets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"))
    unit: Mapped[str] = mapped_column(String(16))
    window: Mapped[str] = mapped_column(String(16))
    time_zone: Mapped[str] = mapped_column(String(64))
    rolling_s: Mapped[int | None] = mapped_column(Integer)
    soft_limit: Mapped[int | None] = mapped_column(BigInteger)
    hard_limit: Mapped[int | None] = mapped_column(BigInteger)
    # The start of the bucket whose window last alerted at the soft limit (epoch seconds).
    soft_alerted_at: Mapped[int | None] = mapped_column(BigInteger)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    updated_by: Mapped[str] = mapped_column(String(128))


class WindowBudgetUsage(Base):
    """What a window budget counted in one bucket (`bucket_start`, epoch seconds)."""

    __tablename__ = "window_budget_usage"

    budget_id: Mapped[int] = mapped_column(
        ForeignKey("window_budgets.id", ondelete="CASCADE"), primary_key=True
    )
    bucket_start: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    used: Mapped[int] = mapped_column(BigInteger)


class LoraAdapterGrant(Base):
    """A tenant besides its owner that may call an adapter (an adapter with grants is not public)."""

    __tablename__ = "lora_adapter_grants"

    adapter_id: Mapped[int] = mapped_column(ForeignKey("lora_adapters.id"), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"), primary_key=True)

    tenant: Mapped[Tenant] = relationship(lazy="joined")


class _UsageDailySums:
    """A per-day rollup of usage records (migration 0010): its dimensions and sums.

    Kept by triggers in the transaction that writes a record (`weir.tenancy.usage.usage_rollups` reads
    them). A nullable dimension is '' here with its bit set in `null_mask`
    (`weir.tenancy.usage.usage_rollups.NULL_BITS`). A row with `requests` 0 has no records left.
    """

    tenant_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    day: Mapped[dt.date] = mapped_column(Date, primary_key=True)
    model: Mapped[str] = mapped_column(String(256), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(KEY_ID_LEN), primary_key=True)
    model_version: Mapped[str] = mapped_column(String(MODEL_VERSION_ID_LEN), primary_key=True)
    adapter: Mapped[str] = mapped_column(String(MAX_ADAPTER_NAME_LEN), primary_key=True)
    currency: Mapped[str] = mapped_column(String(CURRENCY_LEN), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    completed: Mapped[int] = mapped_column(BigInteger)
    failed: Mapped[int] = mapped_column(BigInteger)
    cancelled: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    cached_tokens: Mapped[int] = mapped_column(BigInteger)
    spend_micros: Mapped[int] = mapped_column(BigInteger)
    unpriced: Mapped[int] = mapped_column(BigInteger)


class UsageDaily(_UsageDailySums, Base):
    """Usage per tenant, UTC day, key, model, model version, adapter and currency."""

    __tablename__ = "usage_daily"

    null_mask: Mapped[int] = mapped_column(Integer, primary_key=True)


class UsageDailyUser(_UsageDailySums, Base):
    """`UsageDaily`, also per the request's `user` (read only when a report groups by user)."""

    __tablename__ = "usage_daily_users"

    user: Mapped[str] = mapped_column(String(USER_LEN), primary_key=True)
    null_mask: Mapped[int] = mapped_column(Integer, primary_key=True)


class StoredResponse(Base):
    """A stored answer of `POST /v1/responses` (`store: true`; `weir.tenancy.responses`): the
    response object as answered and the conversation items that made its prompt. Deleted with
    its tenant; expired rows are deleted on read and by the periodic sweep."""

    __tablename__ = "stored_responses"
    __table_args__ = (Index("ix_stored_responses_tenant_expires", "tenant_id", "expires_at"),)

    id: Mapped[str] = mapped_column(String(RESPONSE_ID_LEN), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), index=True)
    num_bytes: Mapped[int] = mapped_column(BigInteger)  # counted in the tenant's storage quota
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    input_items: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
