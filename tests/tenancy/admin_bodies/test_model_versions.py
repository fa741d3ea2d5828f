"""tenancy/admin_bodies/model_versions.py: the /admin/v1/models JSON shapes both ways, and hostile
request bodies (ported from the tests of the hand-made codec it replaced, assertions unchanged)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tenancy.clock import START
from weir.tenancy.admin_bodies.model_versions import (
    ModelVersion,
    ModelVersionCreate,
    ModelVersionList,
    ModelVersionListing,
    Rollback,
    TrafficBody,
    TrafficPlanBody,
    VersionRuntime,
    parse_rollback,
    parse_spec,
    parse_traffic,
)
from weir.tenancy.catalog.model_version_records import ModelVersionSpec, ModelVersionView, TrafficPlan
from weir.tenancy.errors import FieldError
from weir.tenancy.parsing import parse_model
from weir.tenancy.store.enums import ModelVersionState

# The codec's functions, as the models spell them.
VERSION_FIELDS = tuple(ModelVersion.model_fields)


def version_json(
    view: ModelVersionView, plan: TrafficPlan | None = None, runtime: VersionRuntime | None = None
) -> Any:
    return ModelVersion.of(view, plan, runtime).model_dump(mode="json")


def models_json(
    views: Iterable[ModelVersionView],
    plans: Mapping[str, TrafficPlan],
    runtimes: Mapping[str, VersionRuntime] | None = None,
) -> Any:
    found = runtimes or {}
    versions = [ModelVersion.of(v, plans.get(v.name), found.get(v.id)) for v in views]
    return ModelVersionList.of(versions, plans).model_dump(mode="json")


def spec_json(spec: ModelVersionSpec) -> Any:
    return ModelVersionCreate.model_validate(spec).model_dump(mode="json", exclude_none=True)


def traffic_body_json(plan: TrafficPlan) -> Any:
    return TrafficBody.model_validate(plan).model_dump(mode="json")


def traffic_json(plan: TrafficPlan) -> Any:
    return TrafficPlanBody.model_validate(plan).model_dump(mode="json")


def rollback_json(version: str) -> Any:
    return Rollback(to=version).model_dump(mode="json")


def parse_version_json(obj: object) -> ModelVersionListing:
    return parse_model(ModelVersion, obj, "version").listing()


def parse_traffic_json(obj: object) -> TrafficPlan:
    body = parse_model(TrafficPlanBody, obj)
    return body.plan(body.name)


def parse_models_json(obj: object) -> tuple[list[ModelVersionListing], dict[str, TrafficPlan]]:
    return parse_model(ModelVersionList, obj).parsed()


def _view(version: str = "v1", state: ModelVersionState = ModelVersionState.READY) -> ModelVersionView:
    return ModelVersionView(
        id=f"smol@{version}",
        name="smol",
        version=version,
        path=f"/models/{version}",
        tokenizer=None,
        dtype="bfloat16",
        kv_cache_tokens=4096,
        state=state,
        failure_reason=None,
        created_at=START,
        updated_at=START,
        updated_by="cli",
    )


PLAN = TrafficPlan("smol", {"v1": 90, "v2": 10}, {"acme": "v1", "beta": "v1", "gamma": "v2"})


def _wire(obj: object) -> object:
    return json.loads(json.dumps(obj))  # what actually crosses HTTP


def test_a_version_object_has_the_documented_fields_and_round_trips() -> None:
    obj = _wire(version_json(_view(), PLAN, VersionRuntime(in_flight=3, kv_usage=0.25)))
    assert isinstance(obj, dict) and tuple(obj) == VERSION_FIELDS
    assert obj["id"] == "smol@v1" and obj["state"] == "ready" and obj["created_at"] == "2030-01-01T12:00:00Z"
    assert (obj["traffic_percent"], obj["pinned_tenants"], obj["in_flight"], obj["kv_usage"]) == (
        90,
        ["acme", "beta"],
        3,
        0.25,
    )
    listing = parse_version_json(obj)
    assert listing.view == _view()
    assert (listing.traffic_percent, listing.pinned_tenants) == (90, ("acme", "beta"))
    assert listing.runtime == VersionRuntime(in_flight=3, kv_usage=0.25)


def test_a_version_without_a_plan_or_runtime_has_no_share() -> None:
    obj = version_json(_view("v3", ModelVersionState.REGISTERED))
    assert (obj["traffic_percent"], obj["pinned_tenants"], obj["in_flight"], obj["kv_usage"]) == (
        0,
        [],
        0,
        None,
    )


def test_the_list_round_trips() -> None:
    views = [_view("v1"), _view("v2", ModelVersionState.LOADING)]
    obj = _wire(models_json(views, {"smol": PLAN}, {"smol@v2": VersionRuntime(in_flight=1)}))
    assert isinstance(obj, dict)
    assert obj["traffic"] == {"smol": {"split": {"v1": 90, "v2": 10}, "pins": dict(PLAN.pins)}}
    listings, plans = parse_models_json(obj)
    assert [item.view for item in listings] == views
    assert [item.runtime.in_flight for item in listings] == [0, 1]
    assert plans == {"smol": PLAN}


def test_specs_and_plans_round_trip_through_request_bodies() -> None:
    spec = ModelVersionSpec("smol", "v2", "/w", dtype="float16", kv_cache_tokens=1024, tokenizer="/t")
    assert parse_spec(_wire(spec_json(spec))) == spec
    bare = ModelVersionSpec("smol", "v2", "/w")
    assert spec_json(bare) == {"name": "smol", "version": "v2", "path": "/w"}
    assert parse_spec(_wire(spec_json(bare))) == bare
    assert parse_traffic("smol", _wire(traffic_body_json(PLAN))) == PLAN
    assert parse_traffic_json(_wire(traffic_json(PLAN))) == PLAN
    assert parse_rollback(_wire(rollback_json("v1"))) == "v1"


def test_json_numbers_that_are_integers_are_accepted() -> None:
    assert parse_traffic("smol", {"split": {"v1": 100.0}}).split == {"v1": 100}
    assert (
        parse_spec({"name": "m", "version": "v", "path": "/w", "kv_cache_tokens": 1e3}).kv_cache_tokens
        == 1000
    )


def test_an_absent_part_of_a_plan_is_empty() -> None:
    assert parse_traffic("smol", {}) == TrafficPlan("smol", {}, {})
    assert parse_traffic("smol", {"pins": {"acme": "v1"}}).split == {}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (None, "body"),
        ([], "body"),
        ("name=m", "body"),
        ({"version": "v", "path": "/w"}, "name"),
        ({"name": "m", "path": "/w"}, "version"),
        ({"name": "m", "version": "v"}, "path"),
        ({"name": "m", "version": "v", "path": "/w", "state": "ready"}, "state"),  # not settable
        ({"name": "m", "version": "v", "path": "/w", "id": "x@y"}, "id"),
        ({"name": "m/x", "version": "v", "path": "/w"}, "name"),
        ({"name": "m", "version": "v@1", "path": "/w"}, "version"),
        ({"name": "m", "version": "v", "path": ""}, "path"),
        ({"name": "m", "version": "v", "path": 5}, "path"),
        ({"name": "m", "version": "v", "path": "/w", "dtype": 16}, "dtype"),
        ({"name": "m", "version": "v", "path": "/w", "dtype": "int4"}, "dtype"),
        ({"name": "m", "version": "v", "path": "/w", "kv_cache_tokens": "1024"}, "kv_cache_tokens"),
        ({"name": "m", "version": "v", "path": "/w", "kv_cache_tokens": 1.5}, "kv_cache_tokens"),
        ({"name": "m", "version": "v", "path": "/w", "kv_cache_tokens": -1}, "kv_cache_tokens"),
        ({"name": "m", "version": "v", "path": "/w", "kv_cache_tokens": True}, "kv_cache_tokens"),
        ({"name": "m", "version": "v", "path": "/w", "tokenizer": ["/t"]}, "tokenizer"),
    ],
    ids=repr,
)
def test_hostile_register_bodies_name_the_field(body: object, field: str) -> None:
    with pytest.raises(FieldError) as info:
        parse_spec(body)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (None, "body"),
        ({"split": {"v1": 100}, "weights": {}}, "weights"),
        ({"split": [["v1", 100]]}, "split"),
        ({"split": {"v1": "100"}}, "split.v1"),
        ({"split": {"v1": None}}, "split.v1"),
        ({"split": {"v1": 99.5, "v2": 0.5}}, "split.v1"),
        ({"split": {"v1": 50, "v2": 49}}, "split"),
        ({"split": {"v1": 100}, "pins": ["acme"]}, "pins"),
        ({"split": {"v1": 100}, "pins": {"acme": 1}}, "pins.acme"),
        ({"split": {"v1": 100}, "pins": {"ACME!": "v1"}}, "pins"),
    ],
    ids=repr,
)
def test_hostile_traffic_bodies_name_the_field(body: object, field: str) -> None:
    with pytest.raises(FieldError) as info:
        parse_traffic("smol", body)
    assert info.value.field == field


def test_a_hostile_model_name_in_the_path_is_refused() -> None:
    with pytest.raises(FieldError) as info:
        parse_traffic("../tenants", {"split": {"v1": 100}})
    assert info.value.field == "name"


@pytest.mark.parametrize(
    "body", [None, {}, {"to": None}, {"to": "v/1"}, {"to": "v1", "drain": False}], ids=repr
)
def test_hostile_rollback_bodies_are_refused(body: object) -> None:
    with pytest.raises(FieldError):
        parse_rollback(body)


def test_an_answer_in_another_shape_is_refused() -> None:
    good = _wire(version_json(_view()))
    assert isinstance(good, dict)
    for broken in (
        {**good, "state": "warming"},
        {**good, "id": "other@v1"},
        {**good, "created_at": "yesterday"},
        {**good, "pinned_tenants": "acme"},
        {**good, "kv_usage": "half"},
        {**good, "extra": 1},
        {k: v for k, v in good.items() if k != "path"},
    ):
        with pytest.raises(FieldError):
            parse_version_json(broken)
    with pytest.raises(FieldError):
        parse_models_json({"data": {}, "traffic": {}})
    with pytest.raises(FieldError):
        parse_traffic_json({"split": {"v1": 100}, "pins": {}})  # no name


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
SPEC_LIKE = st.fixed_dictionaries(
    {"name": JSON | st.just("smol"), "version": JSON | st.just("v1"), "path": JSON | st.just("/w")},
    optional={"dtype": JSON, "kv_cache_tokens": JSON, "tokenizer": JSON, "state": JSON},
)
PLAN_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "split": st.dictionaries(st.text(max_size=8), JSON, max_size=4) | JSON,
        "pins": st.dictionaries(st.text(max_size=8), JSON, max_size=4) | JSON,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON, SPEC_LIKE))
def test_any_register_body_parses_or_is_a_field_error(body: object) -> None:
    try:
        spec = parse_spec(body)
    except FieldError:
        return
    assert parse_spec(spec_json(spec)) == spec


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON, PLAN_LIKE), st.text(max_size=12))
def test_any_traffic_body_parses_or_is_a_field_error(body: object, name: str) -> None:
    try:
        plan = parse_traffic(name, body)
    except FieldError:
        return
    assert not plan.split or sum(plan.split.values()) == 100
    assert parse_traffic(name, traffic_body_json(plan)) == plan


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_any_answer_parses_or_is_a_field_error(obj: object) -> None:
    for parse in (parse_version_json, parse_models_json, parse_traffic_json, parse_rollback):
        try:
            parse(obj)
        except FieldError:
            pass
