"""The model-version repository on SQLite and PostgreSQL: register, states, traffic, rollback,
audit events, and a state machine over random sequences of admin actions."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from sqlalchemy import func, select, text
from sqlalchemy.exc import OperationalError

from tests.tenancy.clock import START, FakeClock
from weir.tenancy.catalog.model_versions import (
    ALLOWED_TRANSITIONS,
    InvalidModelTransitionError,
    ModelVersionExistsError,
    ModelVersionNotFoundError,
    ModelVersionRepo,
    ModelVersionSpec,
    ModelVersionState,
    TrafficPlan,
)
from weir.tenancy.errors import FieldError, TenantNotFoundError
from weir.tenancy.keys.keys import KeyHasher
from weir.tenancy.repository.records import TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.audit import list_events
from weir.tenancy.store.db import Database
from weir.tenancy.store.enums import AuditAction
from weir.tenancy.store.models import Base, ModelVersion

S = ModelVersionState
ACTOR = "cli test"
# A path through the table that reaches each state from `registered`.
PATH_TO = {
    S.REGISTERED: [],
    S.LOADING: [S.LOADING],
    S.READY: [S.LOADING, S.READY],
    S.FAILED: [S.LOADING, S.FAILED],
    S.DRAINING: [S.LOADING, S.READY, S.DRAINING],
    S.RETIRED: [S.LOADING, S.READY, S.DRAINING, S.RETIRED],
}


@pytest.fixture
def models(migrated: Database, clock: FakeClock) -> ModelVersionRepo:
    _tenants(migrated, "acme", "beta", "gamma")  # what the plans below pin
    return ModelVersionRepo(migrated, clock=clock)


def _tenants(db: Database, *names: str) -> None:
    repo = TenancyRepo(db, KeyHasher(b"test-pepper"))
    for name in names:
        repo.create_tenant(TenantSpec(name), actor=ACTOR)


def _spec(version: str = "v1", name: str = "smol") -> ModelVersionSpec:
    return ModelVersionSpec(name, version, f"/models/{name}-{version}", dtype="float32", kv_cache_tokens=2048)


def _walk(models: ModelVersionRepo, name: str, version: str, state: S) -> None:
    for step in PATH_TO[state]:
        models.set_state(name, version, step, reason="boom" if step is S.FAILED else None, actor=ACTOR)


def _audit(models: ModelVersionRepo) -> list[tuple[AuditAction, str | None, dict[str, object]]]:
    """The model events (the fixture's tenants are created first; theirs are left out)."""
    with models.db.transaction() as session:
        events = reversed(list_events(session, limit=1000))
        return [(e.action, e.target, e.details) for e in events if e.action is not AuditAction.TENANT_CREATE]


def test_register_get_and_list(models: ModelVersionRepo, clock: FakeClock) -> None:
    view = models.register(_spec(), actor=ACTOR)
    assert view.id == "smol@v1"
    assert view.state is S.REGISTERED
    assert (view.path, view.dtype, view.kv_cache_tokens, view.tokenizer) == (
        "/models/smol-v1",
        "float32",
        2048,
        None,
    )
    assert view.created_at == view.updated_at == START
    assert view.updated_by == ACTOR and view.failure_reason is None
    assert view.spec == _spec()
    clock.advance(seconds=1)
    models.register(_spec("v2"), actor=ACTOR)
    models.register(_spec("v1", name="other"), actor=ACTOR)
    assert models.get("smol", "v1") == view
    assert [v.id for v in models.list()] == ["other@v1", "smol@v1", "smol@v2"]
    assert [v.id for v in models.list("smol")] == ["smol@v1", "smol@v2"]
    assert models.list("nothing") == []
    assert _audit(models)[0] == (
        AuditAction.MODEL_REGISTER,
        "smol@v1",
        {"path": "/models/smol-v1", "tokenizer": None, "dtype": "float32", "kv_cache_tokens": 2048},
    )


def test_a_version_is_registered_once(models: ModelVersionRepo) -> None:
    models.register(_spec(), actor=ACTOR)
    with pytest.raises(ModelVersionExistsError, match="'smol' already has a version 'v1'"):
        models.register(ModelVersionSpec("smol", "v1", "/elsewhere"), actor=ACTOR)
    assert models.get("smol", "v1").path == "/models/smol-v1"
    assert [e[0] for e in _audit(models)] == [AuditAction.MODEL_REGISTER]


def test_unknown_versions_are_not_found(models: ModelVersionRepo) -> None:
    with pytest.raises(ModelVersionNotFoundError, match="no version 'v1'"):
        models.get("smol", "v1")
    with pytest.raises(ModelVersionNotFoundError):
        models.set_state("smol", "v1", S.LOADING, actor=ACTOR)
    with pytest.raises(ModelVersionNotFoundError, match="has no registered version"):
        models.get_traffic("smol")
    with pytest.raises(ModelVersionNotFoundError):
        models.set_traffic(TrafficPlan("smol", {}, {}), actor=ACTOR)


@pytest.mark.parametrize("start", list(S), ids=str)
def test_every_move_from_every_state_is_applied_or_refused(models: ModelVersionRepo, start: S) -> None:
    for target in S:
        version = f"v-{target.value}"
        models.register(_spec(version), actor=ACTOR)
        _walk(models, "smol", version, start)
        before = models.get("smol", version)
        events = len(_audit(models))
        if target in ALLOWED_TRANSITIONS[start]:
            after = models.set_state("smol", version, target, reason="why", actor="someone")
            assert after.state is target
            assert after.updated_by == "someone"
            action, where, details = _audit(models)[-1]
            assert (action, where) == (AuditAction.MODEL_STATE, f"smol@{version}")
            assert details["from"] == start.value and details["to"] == target.value
        else:
            with pytest.raises(InvalidModelTransitionError):
                models.set_state("smol", version, target, actor="someone")
            assert models.get("smol", version) == before
            assert len(_audit(models)) == events


def test_a_failure_keeps_its_reason_until_a_successful_load(models: ModelVersionRepo) -> None:
    models.register(_spec(), actor=ACTOR)
    models.set_state("smol", "v1", S.LOADING, actor=ACTOR)
    failed = models.set_state("smol", "v1", S.FAILED, reason="x" * 5000, actor=ACTOR)
    assert failed.failure_reason == "x" * 2000
    assert _audit(models)[-1][2]["reason"] == "x" * 2000
    assert models.set_state("smol", "v1", S.LOADING, actor=ACTOR).failure_reason == "x" * 2000
    assert models.set_state("smol", "v1", S.READY, actor=ACTOR).failure_reason is None


def test_a_failure_without_a_reason_says_so(models: ModelVersionRepo) -> None:
    models.register(_spec(), actor=ACTOR)
    models.set_state("smol", "v1", S.LOADING, actor=ACTOR)
    assert models.set_state("smol", "v1", S.FAILED, actor=ACTOR).failure_reason == "unknown failure"


def test_bad_state_arguments_are_field_errors(models: ModelVersionRepo) -> None:
    models.register(_spec(), actor=ACTOR)
    with pytest.raises(FieldError) as info:
        models.set_state("smol", "v1", "loading", actor=ACTOR)  # type: ignore[arg-type]
    assert info.value.field == "state"
    with pytest.raises(FieldError):
        models.get("smol/../x", "v1")
    with pytest.raises(FieldError):
        models.list("bad name")


def test_traffic_plans_name_only_existing_versions(models: ModelVersionRepo, clock: FakeClock) -> None:
    models.register(_spec("v1"), actor=ACTOR)
    models.register(_spec("v2"), actor=ACTOR)
    models.register(_spec("v3", name="other"), actor=ACTOR)
    assert models.get_traffic("smol") == TrafficPlan("smol", {}, {})
    plan = TrafficPlan("smol", {"v1": 90, "v2": 10}, {"acme": "v1"})
    assert models.set_traffic(plan, actor=ACTOR) == plan
    assert models.get_traffic("smol") == plan
    assert _audit(models)[-1] == (
        AuditAction.MODEL_TRAFFIC,
        "smol",
        {"split": {"v1": 90, "v2": 10}, "pins": {"acme": "v1"}},
    )
    with pytest.raises(FieldError) as info:
        models.set_traffic(TrafficPlan("smol", {"v1": 50, "v3": 50}, {}), actor=ACTOR)
    assert info.value.field == "split.v3"  # v3 belongs to another model name
    with pytest.raises(FieldError) as info:
        models.set_traffic(TrafficPlan("smol", {"v1": 100}, {"acme": "v9"}), actor=ACTOR)
    assert info.value.field == "pins.acme"
    with pytest.raises(TenantNotFoundError) as missing:  # issue 21 item 5: was stored silently
        models.set_traffic(TrafficPlan("smol", {"v1": 100}, {"acme": "v1", "acne": "v2"}), actor=ACTOR)
    assert missing.value.field == "pins.acne" and "'acne' not found" in missing.value.message
    assert models.get_traffic("smol") == plan  # refused plans change nothing
    assert models.list_traffic() == {"smol": plan}
    models.set_traffic(TrafficPlan("smol", {}, {}), actor=ACTOR)  # clearing is a plan too
    assert models.get_traffic("smol") == TrafficPlan("smol", {}, {})


def _ready(models: ModelVersionRepo, *versions: str) -> None:
    for version in versions:
        models.register(_spec(version), actor=ACTOR)
        _walk(models, "smol", version, S.READY)


def test_rollback_sends_the_split_back_and_drains_the_rest(models: ModelVersionRepo) -> None:
    _ready(models, "v1", "v2", "v3")
    models.set_traffic(
        TrafficPlan("smol", {"v1": 10, "v2": 90, "v3": 0}, {"acme": "v2", "beta": "v1", "gamma": "v3"}),
        actor=ACTOR,
    )
    plan, drained = models.rollback("smol", "v1", actor=ACTOR)
    assert drained == ["v2"]
    assert plan == TrafficPlan("smol", {"v1": 100}, {"beta": "v1", "gamma": "v3"})
    assert models.get_traffic("smol") == plan
    states = {v.version: v.state for v in models.list("smol")}
    assert states == {"v1": S.READY, "v2": S.DRAINING, "v3": S.READY}  # v3 had no share
    assert _audit(models)[-2:] == [
        (AuditAction.MODEL_STATE, "smol@v2", {"from": "ready", "to": "draining"}),
        (
            AuditAction.MODEL_ROLLBACK,
            "smol",
            {"to": "v1", "drained": ["v2"], "split": {"v1": 100}, "pins": {"beta": "v1", "gamma": "v3"}},
        ),
    ]


def test_rollback_to_a_draining_version_makes_it_ready_again(models: ModelVersionRepo) -> None:
    _ready(models, "v1", "v2")
    models.set_traffic(TrafficPlan("smol", {"v2": 100}, {}), actor=ACTOR)
    models.set_state("smol", "v1", S.DRAINING, actor=ACTOR)
    plan, drained = models.rollback("smol", "v1", actor=ACTOR)
    assert (dict(plan.split), drained) == ({"v1": 100}, ["v2"])
    assert models.get("smol", "v1").state is S.READY


@pytest.mark.parametrize("state", [S.REGISTERED, S.LOADING, S.FAILED, S.RETIRED], ids=str)
def test_rollback_to_a_version_that_cannot_serve_changes_nothing(models: ModelVersionRepo, state: S) -> None:
    _ready(models, "v2")
    models.register(_spec("v1"), actor=ACTOR)
    _walk(models, "smol", "v1", state)
    plan = TrafficPlan("smol", {"v2": 100}, {})
    models.set_traffic(plan, actor=ACTOR)
    with pytest.raises(InvalidModelTransitionError, match="cannot become ready.*load it first"):
        models.rollback("smol", "v1", actor=ACTOR)
    assert models.get_traffic("smol") == plan
    assert models.get("smol", "v2").state is S.READY
    with pytest.raises(ModelVersionNotFoundError):
        models.rollback("smol", "v9", actor=ACTOR)


def test_actor_and_reason_are_bounded(models: ModelVersionRepo) -> None:
    view = models.register(_spec(), actor="a" * 500)
    assert view.updated_by == "a" * 128


# -- state machine -------------------------------------------------------------------------------

NAMES = ("m1", "m2")
VERSIONS = ("v1", "v2", "v3")
TENANTS = ("acme", "beta")
EXISTING_TENANTS = {"acme"}  # a pin to beta is refused


class ModelVersionMachine(RuleBasedStateMachine):
    """Random registers, state changes, traffic plans and rollbacks against a model of the rules.

    Invariants: one row per (name, version); every stored state was reached along an allowed
    edge (the model only follows edges the repository accepted, and refused calls change
    nothing); a stored plan never names a missing version.
    """

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.db = Database(f"sqlite:///{Path(self.tmp.name) / 'weir.db'}")
        Base.metadata.create_all(self.db.engine)
        _tenants(self.db, *EXISTING_TENANTS)
        self.repo = ModelVersionRepo(self.db, clock=FakeClock())
        self.states: dict[tuple[str, str], S] = {}
        self.plans: dict[str, TrafficPlan] = {}

    def teardown(self) -> None:
        self.db.dispose()
        self.tmp.cleanup()

    @rule(name=st.sampled_from(NAMES), version=st.sampled_from(VERSIONS))
    def register(self, name: str, version: str) -> None:
        try:
            self.repo.register(ModelVersionSpec(name, version, "/w"), actor=ACTOR)
        except ModelVersionExistsError:
            assert (name, version) in self.states
            return
        assert (name, version) not in self.states
        self.states[(name, version)] = S.REGISTERED

    @rule(name=st.sampled_from(NAMES), version=st.sampled_from(VERSIONS), state=st.sampled_from(list(S)))
    def set_state(self, name: str, version: str, state: S) -> None:
        key = (name, version)
        try:
            view = self.repo.set_state(name, version, state, reason="r", actor=ACTOR)
        except ModelVersionNotFoundError:
            assert key not in self.states
            return
        except InvalidModelTransitionError:
            assert state not in ALLOWED_TRANSITIONS[self.states[key]]
            return
        assert state in ALLOWED_TRANSITIONS[self.states[key]]
        assert view.state is state
        self.states[key] = state

    @rule(
        name=st.sampled_from(NAMES),
        split=st.sampled_from([{}, {"v1": 100}, {"v1": 50, "v2": 50}, {"v2": 90, "v3": 10}, {"v3": 100}]),
        pins=st.dictionaries(st.sampled_from(TENANTS), st.sampled_from(VERSIONS), max_size=2),
    )
    def set_traffic(self, name: str, split: dict[str, int], pins: dict[str, str]) -> None:
        plan = TrafficPlan(name, split, pins)
        known = {v for (n, v) in self.states if n == name}
        try:
            self.repo.set_traffic(plan, actor=ACTOR)
        except ModelVersionNotFoundError:
            assert not known
            return
        except FieldError:
            assert not plan.versions() <= known
            return
        except TenantNotFoundError:
            assert plan.versions() <= known and not set(plan.pins) <= EXISTING_TENANTS
            return
        assert plan.versions() <= known and set(plan.pins) <= EXISTING_TENANTS
        self.plans[name] = plan

    @rule(name=st.sampled_from(NAMES), to=st.sampled_from(VERSIONS))
    def rollback(self, name: str, to: str) -> None:
        try:
            plan, drained = self.repo.rollback(name, to, actor=ACTOR)
        except ModelVersionNotFoundError:
            assert (name, to) not in self.states
            return
        except InvalidModelTransitionError:
            assert self.states[(name, to)] not in (S.READY, S.DRAINING)
            return
        self.states[(name, to)] = S.READY
        for version in drained:
            assert self.states[(name, version)] is S.READY
            self.states[(name, version)] = S.DRAINING
        assert dict(plan.split) == {to: 100}
        self.plans[name] = plan

    @invariant()
    def rows_match_the_model(self) -> None:
        with self.db.transaction() as session:
            counts = session.execute(
                select(ModelVersion.name, ModelVersion.version, func.count()).group_by(
                    ModelVersion.name, ModelVersion.version
                )
            ).all()
        assert all(n == 1 for _, _, n in counts)
        stored = {(v.name, v.version): v.state for v in self.repo.list()}
        assert stored == self.states

    @invariant()
    def plans_name_existing_versions(self) -> None:
        plans = self.repo.list_traffic()
        assert plans == self.plans
        for name, plan in plans.items():
            assert plan.versions() <= {v for (n, v) in self.states if n == name}


def test_model_version_state_machine() -> None:
    run_state_machine_as_test(
        ModelVersionMachine, settings=settings(max_examples=40, stateful_step_count=25, deadline=None)
    )


def test_two_concurrent_moves_of_one_version_never_both_apply(models: ModelVersionRepo) -> None:
    """A state change holds the row (FOR UPDATE on PostgreSQL; SQLite's single writer): when
    another transaction moves the version first, this one is refused, never applied on top."""
    _ready(models, "v1")
    other = models.db.engine.connect()
    transaction = other.begin()
    if models.db.backend == "postgresql":
        other.execute(text("SELECT id FROM model_versions WHERE version = 'v1' FOR UPDATE"))
    other.execute(text("UPDATE model_versions SET state = 'draining' WHERE version = 'v1'"))
    outcome: list[BaseException | None] = []

    def move() -> None:
        try:
            models.set_state("smol", "v1", S.DRAINING, actor="second")
            outcome.append(None)
        except (InvalidModelTransitionError, OperationalError) as exc:
            outcome.append(exc)

    worker = threading.Thread(target=move)
    worker.start()
    if models.db.backend == "postgresql":
        _wait_for_a_lock_wait(models.db)
    transaction.commit()
    other.close()
    worker.join(timeout=30)
    assert len(outcome) == 1 and outcome[0] is not None  # refused: the move was already made
    assert models.get("smol", "v1").state is S.DRAINING
    assert [e[2] for e in _audit(models) if e[0] is AuditAction.MODEL_STATE][-1] == {
        "from": "loading",
        "to": "ready",
    }


def _wait_for_a_lock_wait(db: Database) -> None:
    # Bounded in count, not time: the worker's SELECT ... FOR UPDATE shows up as waiting on a lock.
    with db.engine.connect() as conn:
        for _ in range(2000):
            waiting = conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
            ).scalar_one()
            if waiting:
                return
            threading.Event().wait(0.005)
