"""The model-version repository: registered versions, their states and each name's traffic plan.

Each public method is one transaction, and every change writes its audit event in the same
transaction (like `TenancyRepo`). The server (its fleet of engines) and the CLI both go through
here; a change made directly on the database is picked up by a server at its next start.
Records, states and the transition table live in `weir.tenancy.catalog.model_version_records` and are
re-exported here, so callers import one module.
"""

from __future__ import annotations

import builtins
import datetime as dt
from collections.abc import Callable
from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from weir.tenancy.catalog.adapters import unload_adapters_of_version
from weir.tenancy.catalog.model_version_records import (
    ALLOWED_TRANSITIONS,
    ModelVersionSpec,
    ModelVersionView,
    TrafficPlan,
    can_transition,
    check_transition,
    validate_model_name,
    validate_version_label,
    version_id,
)
from weir.tenancy.catalog.rollout_guards import pins_without, split_without
from weir.tenancy.errors import (
    FieldError,
    InvalidModelTransitionError,
    ModelVersionExistsError,
    ModelVersionNotFoundError,
    NameInUseError,
    TenantNotFoundError,
)
from weir.tenancy.store.audit import AuditTrail
from weir.tenancy.store.db import Database, utc_now
from weir.tenancy.store.enums import AdapterState, AuditAction, ModelVersionState
from weir.tenancy.store.models import MAX_REASON_LEN, LoraAdapter, ModelTraffic, ModelVersion, Tenant

__all__ = [
    "ALLOWED_TRANSITIONS",
    "InvalidModelTransitionError",
    "ModelVersionExistsError",
    "ModelVersionNotFoundError",
    "ModelVersionRepo",
    "ModelVersionSpec",
    "ModelVersionState",
    "ModelVersionView",
    "TrafficPlan",
    "can_transition",
    "version_id",
]

_ACTOR_LEN = 128


def version_view(row: ModelVersion) -> ModelVersionView:
    """A model-version row, detached."""
    return ModelVersionView(
        id=version_id(row.name, row.version),
        name=row.name,
        version=row.version,
        path=row.path,
        tokenizer=row.tokenizer,
        dtype=row.dtype,
        kv_cache_tokens=row.kv_cache_tokens,
        state=row.state,
        failure_reason=row.failure_reason,
        created_at=row.created_at,
        updated_at=row.updated_at,
        updated_by=row.updated_by,
    )


def _plan(name: str, row: ModelTraffic | None) -> TrafficPlan:
    if row is None:
        return TrafficPlan(name=name, split={}, pins={})
    return TrafficPlan(name=name, split=dict(row.split), pins=dict(row.pins))


class ModelVersionRepo:
    """Model versions and traffic plans over one `Database`.

    `actor` arguments name who acted (e.g. `admin-api 10.0.0.7`, `cli`) for the audit log and
    the version's `updated_by`.
    """

    def __init__(self, db: Database, *, clock: Callable[[], dt.datetime] = utc_now) -> None:
        self.db = db
        self._clock = clock

    # -- versions --------------------------------------------------------------------------------

    def _row(self, session: Session, name: str, version: str, *, lock: bool = False) -> ModelVersion:
        query = select(ModelVersion).where(ModelVersion.name == name, ModelVersion.version == version)
        if lock:
            query = query.with_for_update()  # PostgreSQL: two state changes of one row queue up
        row = session.scalars(query).one_or_none()
        if row is None:
            raise ModelVersionNotFoundError(name, version)
        return row

    def _versions_of(self, session: Session, name: str) -> set[str]:
        return set(session.scalars(select(ModelVersion.version).where(ModelVersion.name == name)))

    def register(self, spec: ModelVersionSpec, *, actor: str) -> ModelVersionView:
        """Record a new version in state `registered`; `ModelVersionExistsError` if it exists."""
        if not isinstance(spec, ModelVersionSpec):
            raise FieldError("body", "must be a ModelVersionSpec")
        now = self._clock()
        try:
            with self.db.transaction() as session:
                self._check_name_free(session, spec)
                row = ModelVersion(
                    name=spec.name,
                    version=spec.version,
                    path=spec.path,
                    tokenizer=spec.tokenizer,
                    dtype=spec.dtype,
                    kv_cache_tokens=spec.kv_cache_tokens,
                    state=ModelVersionState.REGISTERED,
                    failure_reason=None,
                    created_at=now,
                    updated_at=now,
                    updated_by=actor[:_ACTOR_LEN],
                )
                session.add(row)
                session.flush()  # surfaces a duplicate (name, version) here
                AuditTrail(session, now, actor).record(
                    AuditAction.MODEL_REGISTER,
                    target=spec.id,
                    details={
                        "path": spec.path,
                        "tokenizer": spec.tokenizer,
                        "dtype": spec.dtype,
                        "kv_cache_tokens": spec.kv_cache_tokens,
                    },
                )
                return version_view(row)
        except IntegrityError:
            raise ModelVersionExistsError(spec.name, spec.version) from None

    def _check_name_free(self, session: Session, spec: ModelVersionSpec) -> None:
        """`NameInUseError` if a LoRA adapter that may still serve is called like the model or the
        version id: clients name both in the same `model` field, and the model would shadow it."""
        clash = select(LoraAdapter.name).where(
            LoraAdapter.name.in_([spec.name, spec.id]), LoraAdapter.state != AdapterState.RETIRED
        )
        taken = session.scalars(clash).first()
        if taken is not None:
            raise NameInUseError(taken, f"the LoRA adapter {taken!r}")

    def get(self, name: str, version: str) -> ModelVersionView:
        """One version; `ModelVersionNotFoundError` if absent."""
        validate_model_name(name)
        validate_version_label(version)
        with self.db.transaction() as session:
            return version_view(self._row(session, name, version))

    def list(self, name: str | None = None) -> builtins.list[ModelVersionView]:
        """Every version (of one model name, if given), by name then registration order."""
        query = select(ModelVersion).order_by(ModelVersion.name, ModelVersion.id)
        if name is not None:
            validate_model_name(name)
            query = query.where(ModelVersion.name == name)
        with self.db.transaction() as session:
            return [version_view(row) for row in session.scalars(query)]

    def set_state(
        self,
        name: str,
        version: str,
        state: ModelVersionState,
        *,
        reason: str | None = None,
        actor: str,
    ) -> ModelVersionView:
        """Move a version along an allowed edge (`InvalidModelTransitionError` otherwise).

        `reason` is kept as the failure reason when the new state is `failed` (truncated to
        2000 characters); a successful load (`ready`) clears an old one.
        """
        if not isinstance(state, ModelVersionState):
            raise FieldError("state", f"must be one of {', '.join(s.value for s in ModelVersionState)}")
        if reason is not None and not isinstance(reason, str):
            raise FieldError("reason", "must be a string or None")
        now = self._clock()
        with self.db.transaction() as session:
            row = self._row(session, name, version, lock=True)
            check_transition(name, version, row.state, state)
            self._move(session, row, state, now, actor, reason)
            return version_view(row)

    # -- traffic ---------------------------------------------------------------------------------

    def get_traffic(self, name: str) -> TrafficPlan:
        """A model name's plan (empty when none was set); `ModelVersionNotFoundError` if the
        name has no version."""
        validate_model_name(name)
        with self.db.transaction() as session:
            if not self._versions_of(session, name):
                raise ModelVersionNotFoundError(name)
            return _plan(name, session.get(ModelTraffic, name))

    def list_traffic(self) -> dict[str, TrafficPlan]:
        """Every stored plan, by model name."""
        with self.db.transaction() as session:
            rows = session.scalars(select(ModelTraffic).order_by(ModelTraffic.name))
            return {row.name: _plan(row.name, row) for row in rows}

    def _store_plan(self, session: Session, plan: TrafficPlan, now: dt.datetime, actor: str) -> None:
        known = self._versions_of(session, plan.name)
        if not known:
            raise ModelVersionNotFoundError(plan.name)
        for version in sorted(plan.split):
            if version not in known:
                raise FieldError(f"split.{version}", f"model {plan.name!r} has no version {version!r}")
        for tenant, version in sorted(plan.pins.items()):
            if version not in known:
                raise FieldError(f"pins.{tenant}", f"model {plan.name!r} has no version {version!r}")
        row = session.get(ModelTraffic, plan.name, with_for_update=True)
        if row is None:
            row = ModelTraffic(name=plan.name)
            session.add(row)
        row.split = dict(plan.split)
        row.pins = dict(plan.pins)
        row.updated_at = now
        row.updated_by = actor[:_ACTOR_LEN]

    def _check_pinned_tenants(self, session: Session, plan: TrafficPlan) -> None:
        """A pin names an existing tenant (`TenantNotFoundError` naming the pin otherwise): a pin
        to a misspelt name would route nobody and be kept silently. Checked when a plan is set,
        not when a rollback rewrites one (its pins were checked when they were set)."""
        if not plan.pins:
            return
        known = set(session.scalars(select(Tenant.name).where(Tenant.name.in_(sorted(plan.pins)))))
        for tenant in sorted(plan.pins):
            if tenant not in known:
                raise TenantNotFoundError(tenant, f"pins.{tenant}", "; pin only tenants that exist")

    def set_traffic(self, plan: TrafficPlan, *, actor: str) -> TrafficPlan:
        """Replace a model name's plan. Every version it names must exist (`FieldError` naming
        the entry otherwise), and every pinned tenant (`TenantNotFoundError`); the versions'
        states are the server's business."""
        if not isinstance(plan, TrafficPlan):
            raise FieldError("body", "must be a TrafficPlan")
        now = self._clock()
        with self.db.transaction() as session:
            self._store_plan(session, plan, now, actor)
            self._check_pinned_tenants(session, plan)  # after the versions: their errors come first
            AuditTrail(session, now, actor).record(
                AuditAction.MODEL_TRAFFIC,
                target=plan.name,
                details={"split": dict(plan.split), "pins": dict(plan.pins)},
            )
        return plan

    def rollback(self, name: str, to: str, *, actor: str) -> tuple[TrafficPlan, builtins.list[str]]:
        """Send all of a name's unpinned traffic back to version `to`, in one transaction.

        `to` must be ready, or draining (it becomes ready again). Every other version that had
        a share of the split and is ready becomes draining; pins to those versions are removed
        (their tenants follow the split, so `to`); other pins stay. Returns the new plan and the
        versions drained.
        """
        validate_model_name(name)
        validate_version_label(to, "to")
        now = self._clock()
        with self.db.transaction() as session:
            target = self._row(session, name, to, lock=True)
            if target.state is ModelVersionState.DRAINING:
                self._move(session, target, ModelVersionState.READY, now, actor)
            elif target.state is not ModelVersionState.READY:
                # A rollback never loads: that is the server's `load`, with its warm-up.
                raise InvalidModelTransitionError(
                    name,
                    to,
                    target.state.value,
                    ModelVersionState.READY.value,
                    [],
                    why="a rollback goes back to a ready or draining version; load it first",
                )
            old = _plan(name, session.get(ModelTraffic, name))
            drained: builtins.list[str] = []
            for version, percent in sorted(old.split.items()):
                if version == to or percent == 0:
                    continue
                row = self._row(session, name, version, lock=True)
                if row.state is ModelVersionState.READY:
                    self._move(session, row, ModelVersionState.DRAINING, now, actor)
                    drained.append(version)
            pins = {t: v for t, v in old.pins.items() if v not in drained}
            plan = TrafficPlan(name=name, split={to: 100}, pins=pins)
            self._store_plan(session, plan, now, actor)
            AuditTrail(session, now, actor).record(
                AuditAction.MODEL_ROLLBACK,
                target=name,
                details={"to": to, "drained": drained, "split": dict(plan.split), "pins": pins},
            )
        return plan, drained

    def _move(
        self,
        session: Session,
        row: ModelVersion,
        state: ModelVersionState,
        now: dt.datetime,
        actor: str,
        reason: str | None = None,
    ) -> None:
        """Apply one checked move as a compare-and-set on the state just read.

        SQLite's driver reads outside the write transaction, so another writer may have moved
        the version between our read and this write; the `state = previous` condition then
        matches nothing and the move is refused, never applied on top of the other one.
        """
        previous = row.state
        values: dict[str, object] = {"state": state, "updated_at": now, "updated_by": actor[:_ACTOR_LEN]}
        if state is ModelVersionState.FAILED:
            values["failure_reason"] = (reason or "unknown failure")[:MAX_REASON_LEN]
        elif state is ModelVersionState.READY:
            values["failure_reason"] = None
        moved = session.execute(
            update(ModelVersion)
            .where(ModelVersion.id == row.id, ModelVersion.state == previous)
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        if cast(CursorResult[Any], moved).rowcount != 1:
            current = session.scalars(select(ModelVersion.state).where(ModelVersion.id == row.id)).one()
            check_transition(row.name, row.version, current, state)  # raises unless allowed now
            raise InvalidModelTransitionError(
                row.name, row.version, current.value, state.value, [], why="it was moved concurrently; retry"
            )
        session.refresh(row)
        details: dict[str, object] = {"from": previous.value, "to": state.value}
        if state is ModelVersionState.FAILED:
            details["reason"] = row.failure_reason
        AuditTrail(session, now, actor).record(
            AuditAction.MODEL_STATE, target=version_id(row.name, row.version), details=details
        )
        if state is ModelVersionState.RETIRED:
            # Its engine is gone: no adapter stays recorded as loaded on it (the CLI's retire on
            # the database, the server's, and a drain completed by a restart alike).
            unload_adapters_of_version(session, version_id(row.name, row.version), now, actor)
            self._drop_from_plan(session, row.name, row.version, now, actor)

    def _drop_from_plan(
        self, session: Session, name: str, version: str, now: dt.datetime, actor: str
    ) -> None:
        """A retired version leaves its model's stored split (the others scaled back to 100) and
        pins: a plan never points at a version that cannot serve."""
        row = session.get(ModelTraffic, name, with_for_update=True)
        if row is None or (version not in row.split and version not in row.pins.values()):
            return
        row.split = split_without(row.split, version)
        row.pins = pins_without(row.pins, version)
        row.updated_at = now
        row.updated_by = actor[:_ACTOR_LEN]
        AuditTrail(session, now, actor).record(
            AuditAction.MODEL_TRAFFIC,
            target=name,
            details={"split": dict(row.split), "pins": dict(row.pins), "retired": version},
        )
