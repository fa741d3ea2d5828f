"""The LoRA adapter repository: registered adapters, their states, and which tenant may call which.

Each public method is one transaction, and every change writes its audit event in the same
transaction (like `ModelVersionRepo`). A server reloads the adapters in state `loaded` at start,
so registrations and states survive restarts.
"""

from __future__ import annotations

import builtins
import datetime as dt
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from weir.tenancy.catalog.adapter_records import (
    ADAPTER_TRANSITIONS,
    AdapterSpec,
    AdapterView,
    validate_adapter_name,
)
from weir.tenancy.errors import (
    AdapterExistsError,
    AdapterNotFoundError,
    FieldError,
    InvalidAdapterTransitionError,
    ModelVersionNotFoundError,
    NameInUseError,
    TenantNotFoundError,
)
from weir.tenancy.store.audit import AuditTrail
from weir.tenancy.store.db import Database, utc_now
from weir.tenancy.store.enums import AdapterState, AuditAction
from weir.tenancy.store.models import MAX_REASON_LEN, LoraAdapter, LoraAdapterGrant, ModelVersion, Tenant

_ACTOR_LEN = 128


def adapter_view(row: LoraAdapter) -> AdapterView:
    return AdapterView(
        name=row.name,
        model_version=row.model_version,
        path=row.path,
        owner_tenant=row.owner.name if row.owner is not None else None,
        state=row.state,
        failure_reason=row.failure_reason,
        created_at=row.created_at,
        updated_at=row.updated_at,
        updated_by=row.updated_by,
        allowed_tenants=tuple(sorted(g.tenant.name for g in row.grants)),
    )


def unload_adapters_of_version(
    session: Session, model_version: str, now: dt.datetime, actor: str
) -> list[str]:
    """Move every adapter of `model_version` recorded as loaded to `unloaded`, each with its audit
    event, in the caller's transaction: a retired version's engine holds no adapter any more.
    Returns their names."""
    rows = session.scalars(
        select(LoraAdapter)
        .where(LoraAdapter.model_version == model_version, LoraAdapter.state == AdapterState.LOADED)
        .order_by(LoraAdapter.name)
    ).unique()
    names: list[str] = []
    for row in rows:
        _move(
            session,
            row,
            AdapterState.UNLOADED,
            now,
            actor,
            f"its base model version {model_version} was retired",
        )
        names.append(row.name)
    return names


def _move(
    session: Session,
    row: LoraAdapter,
    state: AdapterState,
    now: dt.datetime,
    actor: str,
    reason: str | None,
) -> None:
    """Record `row`'s move to `state` and its audit event (the failure reason is kept only for
    `failed`; the event's reason says why either way)."""
    previous = row.state
    row.state = state
    row.failure_reason = (reason or "")[:MAX_REASON_LEN] if state is AdapterState.FAILED else None
    row.updated_at = now
    row.updated_by = actor[:_ACTOR_LEN]
    AuditTrail(session, now, actor).record(
        AuditAction.ADAPTER_STATE,
        tenant=row.owner.name if row.owner is not None else None,
        target=row.name,
        details={
            "from": previous.value,
            "to": state.value,
            "reason": row.failure_reason if state is AdapterState.FAILED else reason,
        },
    )


class AdapterRepo:
    """LoRA adapters over one `Database`; `actor` names who acted, for the audit log."""

    def __init__(self, db: Database, *, clock: Callable[[], dt.datetime] = utc_now) -> None:
        self.db = db
        self._clock = clock

    def _row(self, session: Session, name: str) -> LoraAdapter:
        row = session.scalars(select(LoraAdapter).where(LoraAdapter.name == name)).unique().one_or_none()
        if row is None:
            raise AdapterNotFoundError(name)
        return row

    def register(self, spec: AdapterSpec, *, actor: str) -> AdapterView:
        """Record an adapter in state `registered`. Its base version and owner must exist."""
        if not isinstance(spec, AdapterSpec):
            raise FieldError("body", "must be an AdapterSpec")
        now = self._clock()
        base_name, base_version = spec.model_version.split("@")
        try:
            with self.db.transaction() as session:
                found = session.scalars(
                    select(ModelVersion.id).where(
                        ModelVersion.name == base_name, ModelVersion.version == base_version
                    )
                ).first()
                if found is None:
                    raise ModelVersionNotFoundError(base_name, base_version)
                # Clients call models and adapters by the same `model` field: a model name wins,
                # so an adapter under one could never be reached. (A version id holds '@', which
                # adapter names may not.)
                model = select(ModelVersion.id).where(ModelVersion.name == spec.name)
                if session.scalars(model).first() is not None:
                    raise NameInUseError(spec.name, f"the model {spec.name!r}")
                owner_id = None
                if spec.owner_tenant is not None:
                    owner_id = session.scalars(
                        select(Tenant.id).where(Tenant.name == spec.owner_tenant)
                    ).first()
                    if owner_id is None:
                        raise TenantNotFoundError(spec.owner_tenant)
                row = LoraAdapter(
                    name=spec.name,
                    model_version=spec.model_version,
                    path=spec.path,
                    owner_tenant_id=owner_id,
                    state=AdapterState.REGISTERED,
                    failure_reason=None,
                    created_at=now,
                    updated_at=now,
                    updated_by=actor[:_ACTOR_LEN],
                )
                session.add(row)
                session.flush()  # a duplicate name fails here
                AuditTrail(session, now, actor).record(
                    AuditAction.ADAPTER_REGISTER,
                    tenant=spec.owner_tenant,
                    target=spec.name,
                    details={
                        "model_version": spec.model_version,
                        "path": spec.path,
                        "public": spec.owner_tenant is None,
                    },
                )
                session.refresh(row)
                return adapter_view(row)
        except IntegrityError:
            raise AdapterExistsError(spec.name) from None

    def get(self, name: str) -> AdapterView:
        """One adapter, whoever owns it (admin); AdapterNotFoundError if absent."""
        validate_adapter_name(name)
        with self.db.transaction() as session:
            return adapter_view(self._row(session, name))

    def list(
        self, model_version: str | None = None, state: AdapterState | None = None
    ) -> builtins.list[AdapterView]:
        """Every adapter (of one base version, in one state, if given), by name."""
        query = select(LoraAdapter).order_by(LoraAdapter.name)
        if model_version is not None:
            query = query.where(LoraAdapter.model_version == model_version)
        if state is not None:
            query = query.where(LoraAdapter.state == state)
        with self.db.transaction() as session:
            return [adapter_view(row) for row in session.scalars(query).unique()]

    def visible_to(self, tenant: str) -> builtins.list[AdapterView]:
        """The loaded adapters `tenant` may call: the public ones, its own and those granted to it."""
        loaded = self.list(state=AdapterState.LOADED)
        return [view for view in loaded if view.visible_to(tenant)]

    def resolve(self, name: str, tenant: str) -> AdapterView:
        """The adapter `name` as `tenant` may call it; AdapterNotFoundError, with the same
        message, when it does not exist and when it is another tenant's private adapter."""
        with self.db.transaction() as session:
            row = session.scalars(select(LoraAdapter).where(LoraAdapter.name == name)).unique().one_or_none()
            view = adapter_view(row) if row is not None else None
        if view is None or not view.visible_to(tenant):
            raise AdapterNotFoundError(name)
        return view

    def set_state(
        self, name: str, state: AdapterState, *, reason: str | None = None, actor: str
    ) -> AdapterView:
        """Move an adapter along an allowed edge (InvalidAdapterTransitionError otherwise)."""
        if not isinstance(state, AdapterState):
            raise FieldError("state", f"must be one of {', '.join(s.value for s in AdapterState)}")
        now = self._clock()
        with self.db.transaction() as session:
            row = self._row(session, name)
            if state not in ADAPTER_TRANSITIONS[row.state]:
                allowed = sorted(s.value for s in ADAPTER_TRANSITIONS[row.state])
                raise InvalidAdapterTransitionError(name, row.state.value, state.value, allowed)
            _move(session, row, state, now, actor, reason if state is AdapterState.FAILED else None)
            return adapter_view(row)

    def grant(self, name: str, tenant: str, *, actor: str) -> AdapterView:
        """Let `tenant` call adapter `name` (it stops being public if it was). Idempotent."""
        return self._access(name, tenant, True, actor)

    def revoke(self, name: str, tenant: str, *, actor: str) -> AdapterView:
        """Take `tenant` off the adapter's access list (its owner keeps access). Idempotent."""
        return self._access(name, tenant, False, actor)

    def _access(self, name: str, tenant: str, allow: bool, actor: str) -> AdapterView:
        validate_adapter_name(name)
        now = self._clock()
        with self.db.transaction() as session:
            row = self._row(session, name)
            tenant_id = session.scalars(select(Tenant.id).where(Tenant.name == tenant)).first()
            if tenant_id is None:
                raise TenantNotFoundError(tenant)
            held = next((g for g in row.grants if g.tenant_id == tenant_id), None)
            if allow == (held is not None):
                return adapter_view(row)
            if allow:
                row.grants.append(LoraAdapterGrant(adapter_id=row.id, tenant_id=tenant_id))
            else:
                row.grants.remove(held)  # type: ignore[arg-type]
            row.updated_at = now
            row.updated_by = actor[:_ACTOR_LEN]
            session.flush()
            session.refresh(row)
            AuditTrail(session, now, actor).record(
                AuditAction.ADAPTER_ACCESS,
                tenant=tenant,
                target=name,
                details={"granted" if allow else "revoked": tenant},
            )
            return adapter_view(row)
