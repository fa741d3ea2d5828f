"""The LoRA adapter repository: register per base version, states with audit, survives a
restart (a new repo on the same database), private adapters invisible to other tenants."""

from __future__ import annotations

import pytest

from tests.tenancy.clock import FakeClock
from weir.tenancy.catalog.adapter_records import AdapterSpec
from weir.tenancy.catalog.adapters import AdapterRepo
from weir.tenancy.catalog.model_versions import ModelVersionRepo, ModelVersionSpec, ModelVersionState
from weir.tenancy.errors import (
    AdapterExistsError,
    AdapterNotFoundError,
    FieldError,
    InvalidAdapterTransitionError,
    ModelVersionNotFoundError,
    TenantNotFoundError,
)
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.records import TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.audit import list_events
from weir.tenancy.store.db import Database
from weir.tenancy.store.enums import AdapterState, AuditAction

ACTOR = "cli test"


@pytest.fixture
def adapters(migrated: Database, clock: FakeClock) -> AdapterRepo:
    tenants = TenancyRepo(migrated, KeyHasher(b"test-pepper"))
    for name in ("acme", "beta"):
        tenants.create_tenant(TenantSpec(name), actor=ACTOR)
    ModelVersionRepo(migrated, clock=clock).register(
        ModelVersionSpec("smol", "v1", "/models/smol"), actor=ACTOR
    )
    return AdapterRepo(migrated, clock=clock)


def test_register_load_and_survive_a_restart(adapters: AdapterRepo, migrated: Database) -> None:
    view = adapters.register(AdapterSpec("acme-support", "smol@v1", "acme/support", "acme"), actor=ACTOR)
    assert view.state is AdapterState.REGISTERED and view.owner_tenant == "acme"
    adapters.register(AdapterSpec("summarizer", "smol@v1", "public/sum"), actor=ACTOR)
    adapters.set_state("acme-support", AdapterState.LOADED, actor=ACTOR)
    adapters.set_state("summarizer", AdapterState.LOADED, actor=ACTOR)
    restarted = AdapterRepo(migrated)
    assert [a.name for a in restarted.list(state=AdapterState.LOADED)] == ["acme-support", "summarizer"]
    assert [a.name for a in restarted.list(model_version="smol@v2")] == []
    restarted.set_state("acme-support", AdapterState.UNLOADED, actor=ACTOR)
    assert restarted.get("acme-support").state is AdapterState.UNLOADED
    with migrated.transaction() as session:
        actions = [e.action for e in list_events(session, tenant="acme")]
    assert actions[:3] == [AuditAction.ADAPTER_STATE, AuditAction.ADAPTER_STATE, AuditAction.ADAPTER_REGISTER]


def test_private_adapters_do_not_exist_for_other_tenants(adapters: AdapterRepo) -> None:
    adapters.register(AdapterSpec("acme-support", "smol@v1", "acme/support", "acme"), actor=ACTOR)
    adapters.register(AdapterSpec("summarizer", "smol@v1", "public/sum"), actor=ACTOR)
    for name in ("acme-support", "summarizer"):
        adapters.set_state(name, AdapterState.LOADED, actor=ACTOR)
    assert [a.name for a in adapters.visible_to("acme")] == ["acme-support", "summarizer"]
    assert [a.name for a in adapters.visible_to("beta")] == ["summarizer"]
    assert adapters.resolve("acme-support", "acme").name == "acme-support"
    with pytest.raises(AdapterNotFoundError) as private:
        adapters.resolve("acme-support", "beta")
    with pytest.raises(AdapterNotFoundError) as missing:
        adapters.resolve("acme-nothing", "beta")
    assert str(private.value) == str(missing.value).replace("acme-nothing", "acme-support")


def test_refusals(adapters: AdapterRepo) -> None:
    adapters.register(AdapterSpec("a", "smol@v1", "a"), actor=ACTOR)
    with pytest.raises(AdapterExistsError):
        adapters.register(AdapterSpec("a", "smol@v1", "b"), actor=ACTOR)
    with pytest.raises(ModelVersionNotFoundError):
        adapters.register(AdapterSpec("b", "smol@v9", "b"), actor=ACTOR)
    with pytest.raises(TenantNotFoundError):
        adapters.register(AdapterSpec("c", "smol@v1", "c", "nobody"), actor=ACTOR)
    with pytest.raises(InvalidAdapterTransitionError, match="registered; it cannot become unloaded"):
        adapters.set_state("a", AdapterState.UNLOADED, actor=ACTOR)
    with pytest.raises(FieldError):
        AdapterSpec("smol@v1", "smol@v1", "x")  # '@' would read as a model version
    with pytest.raises(FieldError):
        AdapterSpec("x", "smol", "x")
    failed = adapters.set_state("a", AdapterState.FAILED, reason="NaN in layer 3", actor=ACTOR)
    assert failed.failure_reason == "NaN in layer 3"


def test_an_access_list_opens_an_adapter_to_the_granted_tenants_only(
    adapters: AdapterRepo, migrated: Database
) -> None:
    TenancyRepo(migrated, KeyHasher(b"test-pepper")).create_tenant(TenantSpec("gamma"), actor=ACTOR)
    adapters.register(AdapterSpec("shared", "smol@v1", "shared"), actor=ACTOR)
    adapters.set_state("shared", AdapterState.LOADED, actor=ACTOR)
    assert adapters.get("shared").is_public
    view = adapters.grant("shared", "beta", actor=ACTOR)
    assert view.allowed_tenants == ("beta",) and not view.is_public
    assert adapters.grant("shared", "beta", actor=ACTOR).allowed_tenants == ("beta",)  # idempotent
    assert [a.name for a in adapters.visible_to("beta")] == ["shared"]
    assert adapters.visible_to("acme") == [] and adapters.visible_to("gamma") == []
    with pytest.raises(AdapterNotFoundError, match="does not exist"):
        adapters.resolve("shared", "gamma")
    # An owned adapter granted to another tenant: owner and grantee, nobody else.
    adapters.register(AdapterSpec("acme-x", "smol@v1", "acme/x", "acme"), actor=ACTOR)
    adapters.grant("acme-x", "gamma", actor=ACTOR)
    assert adapters.resolve("acme-x", "gamma").name == "acme-x"
    assert adapters.resolve("acme-x", "acme").name == "acme-x"
    with pytest.raises(AdapterNotFoundError):
        adapters.resolve("acme-x", "beta")
    assert adapters.revoke("acme-x", "gamma", actor=ACTOR).allowed_tenants == ()
    with pytest.raises(AdapterNotFoundError):
        adapters.resolve("acme-x", "gamma")
    with pytest.raises(TenantNotFoundError):
        adapters.grant("shared", "nobody", actor=ACTOR)
    with pytest.raises(AdapterNotFoundError):
        adapters.grant("missing", "beta", actor=ACTOR)
    # Survives a restart; every change is audited.
    assert AdapterRepo(migrated).get("shared").allowed_tenants == ("beta",)
    with migrated.transaction() as session:
        actions = [e.action for e in list_events(session, tenant="gamma")]
    assert actions.count(AuditAction.ADAPTER_ACCESS) == 2


def test_retired_is_final(adapters: AdapterRepo) -> None:
    adapters.register(AdapterSpec("old", "smol@v1", "old"), actor=ACTOR)
    adapters.set_state("old", AdapterState.LOADED, actor=ACTOR)
    with pytest.raises(InvalidAdapterTransitionError):
        adapters.set_state("old", AdapterState.RETIRED, actor=ACTOR)  # unload first
    adapters.set_state("old", AdapterState.UNLOADED, actor=ACTOR)
    assert adapters.set_state("old", AdapterState.RETIRED, actor=ACTOR).state is AdapterState.RETIRED
    for state in AdapterState:
        with pytest.raises(InvalidAdapterTransitionError):
            adapters.set_state("old", state, actor=ACTOR)


def test_retiring_the_base_version_unloads_its_loaded_adapters_with_audit(
    adapters: AdapterRepo, migrated: Database, clock: FakeClock
) -> None:
    versions = ModelVersionRepo(migrated, clock=clock)
    versions.register(ModelVersionSpec("smol", "v2", "/models/smol2"), actor=ACTOR)
    adapters.register(AdapterSpec("acme-support", "smol@v1", "acme/support", "acme"), actor=ACTOR)
    adapters.register(AdapterSpec("summarizer", "smol@v1", "public/sum"), actor=ACTOR)
    adapters.register(AdapterSpec("idle", "smol@v1", "public/idle"), actor=ACTOR)
    adapters.register(AdapterSpec("other", "smol@v2", "public/other"), actor=ACTOR)
    for name in ("acme-support", "summarizer", "other"):
        adapters.set_state(name, AdapterState.LOADED, actor=ACTOR)
    for state in (
        ModelVersionState.LOADING,
        ModelVersionState.READY,
        ModelVersionState.DRAINING,
        ModelVersionState.RETIRED,
    ):
        versions.set_state("smol", "v1", state, actor="retirer")
    assert {a.name: a.state for a in AdapterRepo(migrated).list()} == {
        "acme-support": AdapterState.UNLOADED,
        "summarizer": AdapterState.UNLOADED,
        "idle": AdapterState.REGISTERED,  # never loaded: left as it was
        "other": AdapterState.LOADED,  # another version's
    }
    with migrated.transaction() as session:
        events = [
            e for e in list_events(session) if e.action is AuditAction.ADAPTER_STATE and e.actor == "retirer"
        ]
    assert sorted((e.target, e.tenant, e.details["from"], e.details["to"]) for e in events) == [
        ("acme-support", "acme", "loaded", "unloaded"),
        ("summarizer", None, "loaded", "unloaded"),
    ]
    assert all("smol@v1 was retired" in str(e.details["reason"]) for e in events)
