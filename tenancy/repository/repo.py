"""The tenancy repository: every query the gateway, the admin API and the CLI make.

Each public method is one transaction. Admin actions write their audit event in the same
transaction, so the log never misses an action that happened nor records one that did not.
Methods are synchronous; async callers use a thread pool.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from weir.tenancy.budgets.prices import apply_spend
from weir.tenancy.context import QuotaLimits, key_limits_dict
from weir.tenancy.errors import (
    FieldError,
    KeyInactiveError,
    KeyNotFoundError,
    TenantExistsError,
    TenantNotFoundError,
)
from weir.tenancy.keys.cache_scopes import resolve_cache_scope
from weir.tenancy.keys.keys import KeyHasher, generate_key
from weir.tenancy.repository.records import (
    ApiKeyView,
    IssuedKey,
    KeyRecord,
    KeySpec,
    TenantSpec,
    TenantUpdate,
    TenantView,
    validate_key_limits,
    validate_quota,
)
from weir.tenancy.repository.row_mapping import (
    apply_key_limits,
    apply_quota,
    key_limits_view,
    key_view,
    quota_view,
    tenant_view,
)
from weir.tenancy.store.audit import AuditEventView, AuditTrail, list_events
from weir.tenancy.store.db import Database, utc_now
from weir.tenancy.store.enums import AuditAction, KeyScope, KeyState, TenantStatus
from weir.tenancy.store.field_rules import validate_tenant_name
from weir.tenancy.store.models import AdminToken, ApiKey, KeyLimit, Quota, Tenant
from weir.tenancy.usage.usage import (
    daily_usage,
    daily_usage_query,
    latest_per_request,
    upsert_usage,
    usage_row,
)
from weir.tenancy.usage.usage_records import ENDPOINT_RE, DailyUsage, UsageRecordIn
from weir.tenancy.usage.usage_report import (
    ReportQuery,
    UsageReport,
    build_report,
    page_statement,
    totals_statement,
)
from weir.tenancy.usage.usage_rollups import daily_rollup_query, rollup_statements

_ADMIN_TOKEN_ROW = 1


class TenancyRepo:
    """Tenants, quotas, keys, usage and audit over one `Database`.

    `actor` arguments name who acted (e.g. `admin-api 10.0.0.7`, `cli`) for the audit log.
    """

    def __init__(
        self, db: Database, hasher: KeyHasher, *, clock: Callable[[], dt.datetime] = utc_now
    ) -> None:
        self.db = db
        self.hasher = hasher
        self._clock = clock

    def now(self) -> dt.datetime:
        """The repository's clock (injectable for tests of expiry)."""
        return self._clock()

    # -- tenants ---------------------------------------------------------------------------------

    def _tenant_row(self, session: Session, name: str) -> Tenant:
        row = session.scalars(select(Tenant).where(Tenant.name == name)).one_or_none()
        if row is None:
            raise TenantNotFoundError(name)
        return row

    def create_tenant(self, spec: TenantSpec, *, actor: str) -> TenantView:
        """Create a tenant with its quota.

        `TenantExistsError` if the name is taken; `CacheScopeConflictError` if its cache scope would
        be shared without `spec.share_cache_scope_with` asking for it.
        """
        now = self.now()
        try:
            with self.db.transaction() as session:
                scope = resolve_cache_scope(
                    session, spec.name, spec.cache_scope, spec.share_cache_scope_with, new_tenant=True
                )
                row = Tenant(
                    name=spec.name,
                    status=TenantStatus.ACTIVE,
                    priority=spec.priority,
                    weight=spec.weight,
                    cache_scope=scope,
                    created_at=now,
                    updated_at=now,
                )
                quota = Quota(tenant=row)
                apply_quota(quota, spec.quota, now)
                row.quota = quota
                session.add(row)
                session.flush()  # surfaces a duplicate name here, inside the transaction
                details: dict[str, object] = {
                    "priority": spec.priority.name.lower(),
                    "weight": spec.weight,
                    "cache_scope": row.cache_scope,
                    "quota": spec.quota.as_dict(),
                }
                if spec.share_cache_scope_with is not None:
                    details["share_cache_scope_with"] = spec.share_cache_scope_with
                AuditTrail(session, now, actor).record(
                    AuditAction.TENANT_CREATE, tenant=spec.name, details=details
                )
                return tenant_view(row)
        except IntegrityError:
            raise TenantExistsError(spec.name) from None

    def list_tenants(self) -> list[TenantView]:
        """Every tenant, by name."""
        with self.db.transaction() as session:
            return [
                tenant_view(row) for row in session.scalars(select(Tenant).order_by(Tenant.name)).unique()
            ]

    def tenant_names(self) -> list[str]:
        """Every tenant's name, sorted (no quotas loaded: the console's tenant pickers)."""
        with self.db.transaction() as session:
            return list(session.scalars(select(Tenant.name).order_by(Tenant.name)))

    def search_tenants(self, text: str, *, limit: int, offset: int = 0) -> tuple[list[TenantView], int]:
        """One page of the tenants whose name contains `text` (case-insensitive), by name, and how
        many match in all."""
        if isinstance(limit, bool) or limit < 1 or isinstance(offset, bool) or offset < 0:
            raise FieldError("limit", "must be positive, and offset not negative")
        where = Tenant.name.contains(text.lower(), autoescape=True)
        with self.db.transaction() as session:
            total = session.scalar(select(func.count()).select_from(Tenant).where(where)) or 0
            rows = session.scalars(
                select(Tenant).where(where).order_by(Tenant.name).limit(limit).offset(offset)
            )
            return [tenant_view(row) for row in rows.unique()], total

    def get_tenant(self, name: str) -> TenantView:
        """One tenant; `TenantNotFoundError` if absent."""
        with self.db.transaction() as session:
            return tenant_view(self._tenant_row(session, name))

    def update_tenant(self, name: str, change: TenantUpdate, *, actor: str) -> TenantView:
        """Change priority, weight, cache scope or status; fields left None are kept.

        A new cache scope follows the rules of `create_tenant` (`CacheScopeConflictError`).
        """
        now = self.now()
        with self.db.transaction() as session:
            row = self._tenant_row(session, name)
            details: dict[str, object] = {}
            if change.priority is not None and change.priority != row.priority:
                row.priority = change.priority
                details["priority"] = change.priority.name.lower()
            if change.weight is not None and change.weight != row.weight:
                row.weight = change.weight
                details["weight"] = change.weight
            if change.cache_scope is not None or change.share_cache_scope_with is not None:
                scope = resolve_cache_scope(
                    session, name, change.cache_scope, change.share_cache_scope_with, new_tenant=False
                )
                if scope != row.cache_scope:
                    row.cache_scope = scope
                    details["cache_scope"] = scope
                    if change.share_cache_scope_with is not None:
                        details["share_cache_scope_with"] = change.share_cache_scope_with
            if change.status is not None and change.status != row.status:
                row.status = change.status
                details["status"] = change.status.value
            if details:
                row.updated_at = now
                action = (
                    AuditAction.TENANT_SUSPEND
                    if details.keys() == {"status"} and change.status is TenantStatus.SUSPENDED
                    else AuditAction.TENANT_UPDATE
                )
                AuditTrail(session, now, actor).record(action, tenant=name, details=details)
            return tenant_view(row)

    def suspend_tenant(self, name: str, *, actor: str) -> TenantView:
        """Suspend a tenant: its keys get 403 until it is set active again."""
        return self.update_tenant(name, TenantUpdate(status=TenantStatus.SUSPENDED), actor=actor)

    def set_quota(self, name: str, quota: QuotaLimits, *, actor: str) -> TenantView:
        """Replace a tenant's whole quota (fields left None become unlimited)."""
        validate_quota(quota)
        now = self.now()
        with self.db.transaction() as session:
            row = self._tenant_row(session, name)
            if row.quota is None:
                row.quota = Quota(tenant=row)
            apply_quota(row.quota, quota, now)
            row.updated_at = now
            AuditTrail(session, now, actor).record(
                AuditAction.QUOTA_SET, tenant=name, details=quota.as_dict()
            )
            return tenant_view(row)

    # -- keys ------------------------------------------------------------------------------------

    def _new_key(self, session: Session, tenant: Tenant, spec: KeySpec, now: dt.datetime) -> IssuedKey:
        parsed = generate_key()
        row = ApiKey(
            id=parsed.key_id,
            tenant_id=tenant.id,
            secret_hash=self.hasher.hash(parsed.key),
            scopes=[s.value for s in spec.scopes],
            created_at=now,
            expires_at=spec.expires_at,
        )
        session.add(row)
        session.flush()
        return IssuedKey(key=parsed.key, view=key_view(row, tenant.name))

    def issue_key(self, tenant: str, spec: KeySpec, *, actor: str) -> IssuedKey:
        """A new key for the tenant. The returned `IssuedKey.key` is the only copy of the secret."""
        now = self.now()
        if spec.expires_at is not None and spec.expires_at <= now:
            raise FieldError("expires_at", "must be in the future")
        with self.db.transaction() as session:
            row = self._tenant_row(session, tenant)
            issued = self._new_key(session, row, spec, now)
            AuditTrail(session, now, actor).record(
                AuditAction.KEY_ISSUE,
                tenant=tenant,
                target=issued.view.id,
                details={
                    "scopes": [s.value for s in spec.scopes],
                    "expires_at": spec.expires_at.isoformat() if spec.expires_at else None,
                },
            )
            return issued

    def list_keys(self, tenant: str) -> list[ApiKeyView]:
        """A tenant's keys, revoked and expired ones included, oldest first."""
        with self.db.transaction() as session:
            row = self._tenant_row(session, tenant)
            query = select(ApiKey).where(ApiKey.tenant_id == row.id).order_by(ApiKey.created_at, ApiKey.id)
            return [key_view(k, tenant) for k in session.scalars(query).unique()]

    def _key_row(self, session: Session, key_id: str) -> ApiKey:
        row = session.get(ApiKey, key_id)
        if row is None:
            raise KeyNotFoundError(key_id)
        return row

    def get_key(self, key_id: str) -> ApiKeyView:
        """One key's metadata; `KeyNotFoundError` if absent."""
        with self.db.transaction() as session:
            row = self._key_row(session, key_id)
            return key_view(row, row.tenant.name)

    def revoke_key(self, key_id: str, *, actor: str) -> ApiKeyView:
        """Revoke a key for good. Revoking a revoked key changes nothing and logs nothing."""
        now = self.now()
        with self.db.transaction() as session:
            row = self._key_row(session, key_id)
            if row.revoked_at is None:
                row.revoked_at = now
                AuditTrail(session, now, actor).record(
                    AuditAction.KEY_REVOKE, tenant=row.tenant.name, target=key_id
                )
            return key_view(row, row.tenant.name)

    def set_key_limits(self, key_id: str, limits: QuotaLimits, *, actor: str) -> ApiKeyView:
        """Replace a key's own limits (fields left None: the tenant's); audited with old and new."""
        now = self.now()
        with self.db.transaction() as session:
            row = self._key_row(session, key_id)
            validate_key_limits(limits, quota_view(row.tenant.quota))
            before = key_limits_view(row.limits)
            if row.limits is None:
                row.limits = KeyLimit(key_id=key_id)
            apply_key_limits(row.limits, limits, now)
            AuditTrail(session, now, actor).record(
                AuditAction.KEY_LIMITS_SET,
                tenant=row.tenant.name,
                target=key_id,
                details={"limits": key_limits_dict(limits), "previous": key_limits_dict(before)},
            )
            session.flush()
            return key_view(row, row.tenant.name)

    def rotate_key(self, key_id: str, *, actor: str) -> IssuedKey:
        """Issue a replacement with the same scopes, expiry and limits; revoke the old key at once.

        For a rollout without a gap, issue a second key, switch clients, then revoke the first.
        """
        now = self.now()
        with self.db.transaction() as session:
            old = self._key_row(session, key_id)
            state = key_view(old, old.tenant.name).state(now)
            if state is not KeyState.ACTIVE:
                raise KeyInactiveError(key_id, state.value)
            spec = KeySpec(scopes=tuple(KeyScope(s) for s in old.scopes), expires_at=old.expires_at)
            issued = self._new_key(session, old.tenant, spec, now)
            if old.limits is not None:
                new = self._key_row(session, issued.view.id)
                new.limits = KeyLimit(key_id=new.id)
                apply_key_limits(new.limits, key_limits_view(old.limits), now)
                session.flush()
                issued = IssuedKey(key=issued.key, view=key_view(new, old.tenant.name))
            old.revoked_at = now
            AuditTrail(session, now, actor).record(
                AuditAction.KEY_ROTATE,
                tenant=old.tenant.name,
                target=key_id,
                details={"replaced_by": issued.view.id},
            )
            return issued

    def lookup_key(self, key_id: str, *, timeout_s: float | None = None) -> KeyRecord | None:
        """Everything authentication needs about a key, in one query; None if unknown.

        `timeout_s` bounds the wait on a locked database (then an OperationalError is raised).
        """
        with self.db.transaction(timeout_s=timeout_s) as session:
            row = session.get(ApiKey, key_id)
            if row is None:
                return None
            tenant = tenant_view(row.tenant)
            return KeyRecord(view=key_view(row, tenant.name), secret_hash=row.secret_hash, tenant=tenant)

    def key_ids(self, *, timeout_s: float | None = None) -> frozenset[str]:
        """The id of every key stored (any state): one query, no secrets read."""
        with self.db.transaction(timeout_s=timeout_s) as session:
            return frozenset(session.scalars(select(ApiKey.id)))

    def touch_key(self, key_id: str, when: dt.datetime, *, timeout_s: float | None = None) -> None:
        """Record that a key was used (called on auth-cache misses, not on every request)."""
        with self.db.transaction(timeout_s=timeout_s) as session:
            session.execute(update(ApiKey).where(ApiKey.id == key_id).values(last_used_at=when))

    # -- usage -----------------------------------------------------------------------------------

    def record_usage(self, record: UsageRecordIn) -> None:
        """Write one request's usage record."""
        self.record_usages([record])

    def record_usages(self, records: Sequence[UsageRecordIn]) -> None:
        """Write several usage records in one transaction (all or none).

        One row per (request_id, tenant): a later record replaces the stored one (a stream's
        provisional records, then its final one), so replaying the spool in order after an
        outage or a crash stores each request once, in its latest state.
        """
        if not records:
            return
        now = self.now()
        names = {r.tenant_id for r in records}
        try:
            with self.db.transaction() as session:
                found = session.execute(select(Tenant.name, Tenant.id).where(Tenant.name.in_(names))).tuples()
                ids = {name: tenant_id for name, tenant_id in found}
                missing = names - ids.keys()
                if missing:
                    raise TenantNotFoundError(sorted(missing)[0])
                rows = latest_per_request([usage_row(r, ids[r.tenant_id], now) for r in records])
                apply_spend(
                    session, rows
                )  # the price in effect at each record's time (weir.tenancy.budgets.prices)
                # Core, not the ORM's bulk insert (the same table, types and statement): its
                # per-row bookkeeping was ~half of a batch's Python in the usage writer's thread.
                session.connection().execute(upsert_usage(self.db.backend), rows)
        except IntegrityError:
            # Tenants were checked above, so a key is unknown. Find which, in a fresh transaction
            # (PostgreSQL refuses further queries in the failed one).
            key_ids = {r.key_id for r in records if r.key_id is not None}
            with self.db.transaction() as session:
                known = set(session.scalars(select(ApiKey.id).where(ApiKey.id.in_(key_ids))))
            unknown = sorted(key_ids - known)
            raise KeyNotFoundError(unknown[0] if unknown else "?") from None

    def usage_by_day(
        self,
        tenant: str,
        *,
        since: dt.date | None = None,
        until: dt.date | None = None,
        endpoint: str | None = None,
    ) -> list[DailyUsage]:
        """A tenant's usage per UTC day between `since` and `until` (inclusive), oldest first;
        of one `endpoint` only when given (read from the records: the rollups do not keep it)."""
        validate_tenant_name(tenant, "tenant")
        if since is not None and until is not None and since > until:
            raise FieldError("since", "must not be after until")
        if endpoint is not None and ENDPOINT_RE.fullmatch(endpoint) is None:
            raise FieldError(
                "endpoint", "must be an endpoint name: 1-32 lowercase letters, dots or underscores"
            )
        with self.db.transaction() as session:
            tenant_id = self._tenant_row(session, tenant).id
            if endpoint is None:
                query = daily_rollup_query(tenant_id, since, until)
            else:
                query = daily_usage_query(tenant_id, since, until, endpoint)
            return [daily_usage(row) for row in session.execute(query)]

    def usage_report(self, query: ReportQuery) -> UsageReport:
        """One page of a grouped usage report over a time range, and the range's exact totals.

        Both queries run in one transaction (on PostgreSQL its default READ COMMITTED lets a
        record committed in between count in one and not the other; the range's totals and a
        page are each exact). An unknown tenant filter is 404, as for `usage_by_day`.
        """
        with self.db.transaction() as session:
            tenant_id = None
            if query.tenant is not None:
                validate_tenant_name(query.tenant, "tenant")
                tenant_id = self._tenant_row(session, query.tenant).id
            statements = rollup_statements(query, tenant_id)
            if statements is None:  # by hour or endpoint: the records
                statements = page_statement(query, tenant_id), totals_statement(query, tenant_id)
            page = list(session.execute(statements[0]))
            totals = session.execute(statements[1]).one()
            return build_report(query, page, totals)

    # -- audit -----------------------------------------------------------------------------------

    def list_audit(
        self, *, tenant: str | None = None, limit: int = 100, before_id: int | None = None
    ) -> list[AuditEventView]:
        """Audit events, newest first; filter by tenant; page with `before_id`."""
        with self.db.transaction() as session:
            return list_events(session, tenant=tenant, limit=limit, before_id=before_id)

    # -- admin token -----------------------------------------------------------------------------

    def admin_token_hash(self) -> str | None:
        """The stored hash of the admin token, if one was ever stored."""
        with self.db.transaction() as session:
            row = session.get(AdminToken, _ADMIN_TOKEN_ROW)
            return None if row is None else row.token_hash

    def store_admin_token(self, token: str, *, actor: str, replace: bool) -> bool:
        """Store the hash of an admin token. Without `replace`, only if none is stored yet.

        Returns whether it was stored. Two replicas bootstrapping at once: exactly one wins.
        """
        now = self.now()
        token_hash = self.hasher.hash(token)
        try:
            with self.db.transaction() as session:
                row = session.get(AdminToken, _ADMIN_TOKEN_ROW)
                if row is not None and not replace:
                    return False
                if row is None:
                    session.add(AdminToken(id=_ADMIN_TOKEN_ROW, token_hash=token_hash, created_at=now))
                else:
                    row.token_hash = token_hash
                    row.created_at = now
                session.flush()
                AuditTrail(session, now, actor).record(AuditAction.ADMIN_TOKEN_SET)
                return True
        except IntegrityError:
            return False
