"""Budgets over windows: tokens or money of a tenant or of one of its keys, with soft and hard limits.

A budget counts what its principal uses in the current window (`weir.tenancy.budgets.budget_windows`: minute,
hour, day or month in a time zone, or rolling). A hard limit refuses a request whose reservation
would take the window past it (429, `Retry-After` = until enough of the window is over); a soft
limit only alerts (an audit event in the same transaction, and a metric by the caller), once per
window: when a request settles (its real use known, not its reservation) and the window's count
has reached it. A rolling window alerts again once the bucket that alerted has left it.

Exact across replicas: every take and settlement is one transaction on the shared database that
first locks the budgets' rows (`SELECT ... FOR UPDATE` on PostgreSQL, in id order so two
requests cannot deadlock; on SQLite a first write takes the file's write lock), then sums the
window's buckets, checks and adds. Only principals with such budgets pay these round trips.

Units: `tokens` (prompt plus output, as the token budgets count them) or `micros` (micro-units of
the price table's currency, `weir.tenancy.budgets.money`).

A new budget starts with what its principal already used in its current window: the transaction
that creates it adds the usage records of each bucket still counted (billed tokens, or their
recorded spend), so `used` is never below what was served in the window before the budget was
set. Requests still in flight then are charged when they settle (`weir.gateway.admission.
window_budget_gate`), not here: their records are written after this transaction.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from weir.tenancy.budgets.budget_windows import WindowKind, WindowSpec
from weir.tenancy.budgets.window_budget_records import (
    Budget,
    BudgetNotFoundError,
    BudgetSpec,
    BudgetUnit,
    Charge,
    Refusal,
    SoftAlert,
    TakeResult,
    budget_details,
)
from weir.tenancy.errors import KeyNotFoundError, TenantNotFoundError
from weir.tenancy.store.audit import AuditTrail
from weir.tenancy.store.db import Database
from weir.tenancy.store.enums import AuditAction
from weir.tenancy.store.models import ApiKey, Tenant, WindowBudget, WindowBudgetUsage
from weir.tenancy.store.models import UsageRecord as UsageRow


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _spec_of(row: WindowBudget) -> WindowSpec:
    return WindowSpec(WindowKind(row.window), row.time_zone, row.rolling_s)


def _budget(row: WindowBudget, tenant: str) -> Budget:
    return Budget(
        row.id, tenant, row.key_id, BudgetUnit(row.unit), _spec_of(row), row.soft_limit, row.hard_limit
    )


class WindowBudgetStore:
    """Window budgets and their counts over one `Database`."""

    def __init__(
        self,
        db: Database,
        *,
        clock: Callable[[], float] = time.time,
        now: Callable[[], dt.datetime] = utc_now,
        timeout_s: float | None = 2.0,
    ) -> None:
        self.db = db
        self.clock = clock
        self._now = now
        self._timeout_s = timeout_s
        self._sqlite_lock = threading.Lock()

    # -- admin -----------------------------------------------------------------------------------

    def set_budget(self, spec: BudgetSpec, *, actor: str) -> Budget:
        """Create the budget, or change the limits of the one with the same principal, unit and window."""
        now = self._now()
        with self.db.transaction() as session:
            tenant = session.scalars(select(Tenant).where(Tenant.name == spec.tenant)).one_or_none()
            if tenant is None:
                raise TenantNotFoundError(spec.tenant)
            if spec.key_id is not None:
                key = session.get(ApiKey, spec.key_id)
                if key is None or key.tenant_id != tenant.id:
                    raise KeyNotFoundError(spec.key_id)
            w = spec.window
            row = session.scalars(
                select(WindowBudget).where(
                    WindowBudget.tenant_id == tenant.id,
                    WindowBudget.key_id.is_(None)
                    if spec.key_id is None
                    else WindowBudget.key_id == spec.key_id,
                    WindowBudget.unit == spec.unit.value,
                    WindowBudget.window == w.kind.value,
                    WindowBudget.time_zone == w.time_zone,
                    WindowBudget.rolling_s.is_(None)
                    if w.rolling_s is None
                    else WindowBudget.rolling_s == w.rolling_s,
                )
            ).first()
            created = row is None
            if row is None:
                row = WindowBudget(
                    tenant_id=tenant.id,
                    key_id=spec.key_id,
                    unit=spec.unit.value,
                    window=w.kind.value,
                    time_zone=w.time_zone,
                    rolling_s=w.rolling_s,
                )
                session.add(row)
            row.soft_limit, row.hard_limit = spec.soft_limit, spec.hard_limit
            row.updated_at, row.updated_by = now, actor[:128]
            session.flush()
            budget = _budget(row, tenant.name)
            if created:
                self._seed(session, budget, tenant.id, self.clock())
            AuditTrail(session, now, actor).record(
                AuditAction.BUDGET_SET, tenant=tenant.name, target=spec.key_id, details=budget_details(budget)
            )
            return budget

    def _seed(self, session: Session, budget: Budget, tenant_id: int, t: float) -> None:
        """Count what the principal's usage records hold in each bucket of the current window."""
        amount = (
            UsageRow.prompt_tokens + UsageRow.completion_tokens
            if budget.unit is BudgetUnit.TOKENS
            else func.coalesce(UsageRow.spend_micros, 0)
        )
        whose = [UsageRow.tenant_id == tenant_id]
        if budget.key_id is not None:
            whose.append(UsageRow.key_id == budget.key_id)
        for start, end in budget.window.counted_buckets(t):
            total = session.scalar(
                select(func.coalesce(func.sum(amount), 0)).where(
                    *whose,
                    UsageRow.created_at >= dt.datetime.fromtimestamp(start, dt.UTC),
                    UsageRow.created_at < dt.datetime.fromtimestamp(end, dt.UTC),
                )
            )
            if total:
                self._add(session, budget, start, int(total))

    def delete_budget(self, budget_id: int, *, actor: str) -> Budget:
        now = self._now()
        with self.db.transaction() as session:
            found = session.execute(
                select(WindowBudget, Tenant.name)
                .join(Tenant, Tenant.id == WindowBudget.tenant_id)
                .where(WindowBudget.id == budget_id)
            ).one_or_none()
            if found is None:
                raise BudgetNotFoundError(budget_id)
            row, tenant = found
            budget = _budget(row, tenant)
            session.execute(delete(WindowBudgetUsage).where(WindowBudgetUsage.budget_id == budget_id))
            session.delete(row)
            AuditTrail(session, now, actor).record(
                AuditAction.BUDGET_DELETE, tenant=tenant, target=budget.key_id, details=budget_details(budget)
            )
            return budget

    def list_budgets(self, tenant: str | None = None) -> list[Budget]:
        with self.db.transaction() as session:
            query = select(WindowBudget, Tenant.name).join(Tenant, Tenant.id == WindowBudget.tenant_id)
            if tenant is not None:
                query = query.where(Tenant.name == tenant)
            return [_budget(r, name) for r, name in session.execute(query.order_by(WindowBudget.id))]

    def used(self, budget: Budget, t: float | None = None) -> int:
        """What the budget's current window has counted at `t` (now by default)."""
        t = self.clock() if t is None else t
        with self.db.transaction() as session:
            return self._used(session, budget, t)

    # -- admission -------------------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[Session]:
        if self.db.backend == "sqlite":
            with self._sqlite_lock, self.db.transaction(timeout_s=self._timeout_s) as session:
                yield session
        else:
            with self.db.transaction(timeout_s=self._timeout_s) as session:
                yield session

    def _lock_rows(self, session: Session, budgets: Sequence[Budget]) -> set[int]:
        """Lock the budgets' rows (PostgreSQL) and return the ids that still exist."""
        ids = sorted({b.id for b in budgets})
        query = select(WindowBudget.id).where(WindowBudget.id.in_(ids)).order_by(WindowBudget.id)
        if self.db.backend == "postgresql":
            query = query.with_for_update()
        else:
            # SQLite locks the whole file: a write first takes the write lock (waiting up to the
            # busy timeout) before anything is read, so two connections cannot both read then add.
            session.execute(update(WindowBudget).where(WindowBudget.id.in_(ids)).values(id=WindowBudget.id))
        return set(session.scalars(query))

    @staticmethod
    def _used(session: Session, budget: Budget, t: float) -> int:
        w = budget.window
        total = session.scalar(
            select(func.coalesce(func.sum(WindowBudgetUsage.used), 0)).where(
                WindowBudgetUsage.budget_id == budget.id,
                WindowBudgetUsage.bucket_start >= w.counted_from(t),
                WindowBudgetUsage.bucket_start <= w.bucket_start(t),
            )
        )
        return int(total or 0)

    def _retry_after(
        self, session: Session, budget: Budget, used: int, amount: int, t: float
    ) -> float | None:
        """Seconds until `amount` fits under the hard limit, as buckets leave the window."""
        limit = budget.hard_limit
        assert limit is not None
        if amount > limit:
            return None
        w = budget.window
        if w.kind is not WindowKind.ROLLING:
            return max(0.0, w.reset_at(t) - t)
        rows = session.execute(
            select(WindowBudgetUsage.bucket_start, WindowBudgetUsage.used)
            .where(
                WindowBudgetUsage.budget_id == budget.id,
                WindowBudgetUsage.bucket_start >= w.counted_from(t),
                WindowBudgetUsage.bucket_start <= w.bucket_start(t),
            )
            .order_by(WindowBudgetUsage.bucket_start)
        ).all()
        left = used
        for start, n in rows:
            left -= int(n)
            if left + amount <= limit:
                return max(0.0, w.expires_at(int(start)) - t)
        return max(0.0, w.reset_at(t) - t)

    def _add(self, session: Session, budget: Budget, bucket_start: int, amount: int) -> None:
        insert = postgresql.insert if self.db.backend == "postgresql" else sqlite.insert
        stmt = insert(WindowBudgetUsage).values(budget_id=budget.id, bucket_start=bucket_start, used=amount)
        session.execute(
            stmt.on_conflict_do_update(
                index_elements=["budget_id", "bucket_start"],
                set_={"used": WindowBudgetUsage.used + stmt.excluded.used},
            )
        )

    def _alert(self, session: Session, budget: Budget, used: int, t: float) -> SoftAlert | None:
        """Alert if the window's count reached the soft limit and this window has not alerted yet."""
        soft = budget.soft_limit
        if soft is None or used < soft:
            return None
        w = budget.window
        last = session.scalar(select(WindowBudget.soft_alerted_at).where(WindowBudget.id == budget.id))
        if last is not None and last >= w.counted_from(t):
            return None  # this window (or, rolling, a bucket still in it) has alerted already
        start = w.bucket_start(t)
        session.execute(
            update(WindowBudget).where(WindowBudget.id == budget.id).values(soft_alerted_at=start)
        )
        AuditTrail(session, dt.datetime.fromtimestamp(t, dt.UTC), "weir").record(
            AuditAction.BUDGET_SOFT_LIMIT,
            tenant=budget.tenant,
            target=budget.key_id,
            details={**budget_details(budget), "used": used, "window_start": start},
        )
        return SoftAlert(budget, used, start)

    def take(self, amounts: Sequence[tuple[Budget, int]], t: float | None = None) -> TakeResult:
        """Add each amount to its budget's current bucket, all or none: a hard limit that would be
        passed refuses the lot (the first such budget is named)."""
        t = self.clock() if t is None else t
        with self._locked() as session:
            alive = self._lock_rows(session, [b for b, _ in amounts])
            counted = [(b, n, self._used(session, b, t)) for b, n in amounts if b.id in alive]
            for budget, amount, used in counted:  # check every budget before adding to any
                if budget.hard_limit is not None and used + amount > budget.hard_limit:
                    refusal = Refusal(
                        budget,
                        used,
                        amount,
                        max(0.0, budget.window.reset_at(t) - t),
                        self._retry_after(session, budget, used, amount, t),
                    )
                    return TakeResult((), refusal)
            charges: list[Charge] = []
            for budget, amount, _ in counted:
                start = budget.window.bucket_start(t)
                if amount:
                    self._add(session, budget, start, amount)
                charges.append(Charge(budget, start, amount))
            return TakeResult(tuple(charges))

    def settle(
        self, charges: Sequence[Charge], actual: Sequence[int], t: float | None = None
    ) -> tuple[SoftAlert, ...]:
        """Replace each charge's reserved amount by what was really used (refund or overshoot),
        in the bucket it was counted in (a refund after the window ended lowers nothing current)."""
        t = self.clock() if t is None else t
        alerts: list[SoftAlert] = []
        with self._locked() as session:
            alive = self._lock_rows(session, [c.budget for c in charges])
            for charge, used_now in zip(charges, actual, strict=True):
                if charge.budget.id not in alive:
                    continue
                delta = max(0, used_now) - charge.amount
                if delta:
                    self._add(session, charge.budget, charge.bucket_start, delta)
                alert = self._alert(session, charge.budget, self._used(session, charge.budget, t), t)
                if alert is not None:
                    alerts.append(alert)
        return tuple(alerts)
