"""Model-version records: the transition table, spec validation against hostile input, traffic plans."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weir.engine.config import ENGINE_DTYPES
from weir.tenancy.catalog.model_version_records import (
    ALLOWED_TRANSITIONS,
    MAX_KV_CACHE_TOKENS,
    ModelVersionSpec,
    TrafficPlan,
    can_transition,
    check_transition,
    validate_model_name,
    version_id,
)
from weir.tenancy.errors import FieldError, InvalidModelTransitionError
from weir.tenancy.store.enums import ModelVersionState, UsageStatus
from weir.tenancy.store.models import MAX_NAME_LEN, MAX_PATH_LEN, MAX_VERSION_LEN, MODEL_VERSION_ID_LEN
from weir.tenancy.usage.usage_records import UsageRecordIn

S = ModelVersionState
# The table, spelt out edge by edge so a change to ALLOWED_TRANSITIONS shows up here.
EXPECTED_EDGES = {
    (S.REGISTERED, S.LOADING),
    (S.LOADING, S.READY),
    (S.LOADING, S.FAILED),
    (S.READY, S.DRAINING),
    (S.DRAINING, S.READY),
    (S.DRAINING, S.RETIRED),
    (S.FAILED, S.LOADING),
    (S.RETIRED, S.LOADING),
}


@pytest.mark.parametrize(("current", "new"), list(itertools.product(S, S)), ids=lambda s: s.value)
def test_every_pair_of_states_is_allowed_or_refused_by_the_table(current: S, new: S) -> None:
    allowed = (current, new) in EXPECTED_EDGES
    assert can_transition(current, new) is allowed
    if allowed:
        check_transition("m", "v1", current, new)
    else:
        with pytest.raises(InvalidModelTransitionError) as info:
            check_transition("m", "v1", current, new)
        assert info.value.current == current.value
        assert info.value.new == new.value
        assert f"it cannot become {new.value}" in info.value.message


def test_the_table_covers_every_state_and_failed_is_reached_only_from_loading() -> None:
    assert set(ALLOWED_TRANSITIONS) == set(S)
    assert {src for src, dst in EXPECTED_EDGES if dst is S.FAILED} == {S.LOADING}
    with pytest.raises(TypeError):
        ALLOWED_TRANSITIONS[S.READY] = frozenset()  # type: ignore[index]


def test_the_refusal_names_the_moves_that_are_allowed() -> None:
    with pytest.raises(InvalidModelTransitionError, match="can become: draining"):
        check_transition("m", "v1", S.READY, S.RETIRED)


def test_a_valid_spec_and_its_id() -> None:
    spec = ModelVersionSpec(
        "SmolLM2-135M", "v1.2_rc-3", "/models/smol", dtype="bfloat16", kv_cache_tokens=4096
    )
    assert spec.id == "SmolLM2-135M@v1.2_rc-3" == version_id(spec.name, spec.version)


def test_every_engine_dtype_is_accepted() -> None:
    for dtype in ENGINE_DTYPES:
        assert ModelVersionSpec("m", "v1", "/w", dtype=dtype).dtype == dtype


HOSTILE_NAMES = [
    "",
    " ",
    "a" * (MAX_NAME_LEN + 1),
    "org/model",  # would break the URL's path segment
    "m@v",  # the id's separator
    "-leading-dash",
    ".hidden",
    "../../etc",
    "name with space",
    "tab\there",
    "nul\x00",
    "é",
    "m\n",
    None,
    7,
    ["m"],
]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=repr)
def test_hostile_names_are_refused(name: object) -> None:
    with pytest.raises(FieldError) as info:
        ModelVersionSpec(name, "v1", "/w")  # type: ignore[arg-type]
    assert info.value.field == "name"


@pytest.mark.parametrize("version", [*HOSTILE_NAMES[:13], "v" * (MAX_VERSION_LEN + 1), None], ids=repr)
def test_hostile_versions_are_refused(version: object) -> None:
    with pytest.raises(FieldError) as info:
        ModelVersionSpec("m", version, "/w")  # type: ignore[arg-type]
    assert info.value.field == "version"


@pytest.mark.parametrize(
    "path", ["", "   ", "p" * (MAX_PATH_LEN + 1), "/w\x00", "/w\nx", None, 3, b"/w"], ids=repr
)
def test_hostile_paths_and_tokenizers_are_refused(path: object) -> None:
    with pytest.raises(FieldError) as info:
        ModelVersionSpec("m", "v1", path)  # type: ignore[arg-type]
    assert info.value.field == "path"
    if path is None:
        return  # no tokenizer: the weights folder's
    with pytest.raises(FieldError) as info:
        ModelVersionSpec("m", "v1", "/w", tokenizer=path)  # type: ignore[arg-type]
    assert info.value.field == "tokenizer"


@pytest.mark.parametrize("dtype", ["fp32", "float64", "int8", "FLOAT32", "", 32])
def test_dtypes_the_engine_cannot_run_are_refused(dtype: object) -> None:
    with pytest.raises(FieldError, match="float32, float16, bfloat16") as info:
        ModelVersionSpec("m", "v1", "/w", dtype=dtype)  # type: ignore[arg-type]
    assert info.value.field == "dtype"


@pytest.mark.parametrize("kv", [0, -1, MAX_KV_CACHE_TOKENS + 1, True, 1.5, "100", 10**30])
def test_kv_budgets_out_of_range_are_refused(kv: object) -> None:
    with pytest.raises(FieldError) as info:
        ModelVersionSpec("m", "v1", "/w", kv_cache_tokens=kv)  # type: ignore[arg-type]
    assert info.value.field == "kv_cache_tokens"


def test_the_kv_budget_bounds_are_inclusive() -> None:
    assert ModelVersionSpec("m", "v1", "/w", kv_cache_tokens=1).kv_cache_tokens == 1
    assert ModelVersionSpec("m", "v1", "/w", kv_cache_tokens=MAX_KV_CACHE_TOKENS).kv_cache_tokens


@given(st.text(max_size=200))
def test_a_name_is_either_refused_or_safe_in_a_url_and_an_id(name: str) -> None:
    try:
        validate_model_name(name)
    except FieldError:
        return
    assert 1 <= len(name) <= MAX_NAME_LEN
    assert not set(name) & set("/@ ?#%\\\x00\n")


def test_the_longest_id_fits_the_usage_column() -> None:
    longest = version_id("n" * MAX_NAME_LEN, "v" * MAX_VERSION_LEN)
    assert len(longest) == MODEL_VERSION_ID_LEN
    UsageRecordIn(
        request_id="r",
        tenant_id="t",
        key_id=None,
        model="n",
        status=UsageStatus.COMPLETED,
        prompt_tokens=1,
        completion_tokens=1,
        model_version=longest,
    )


# -- traffic plans ---------------------------------------------------------------------------------


def test_a_plan_is_copied_and_read_only() -> None:
    split = {"v1": 90, "v2": 10}
    plan = TrafficPlan("m", split, {"acme": "v1"})
    split["v3"] = 5
    assert dict(plan.split) == {"v1": 90, "v2": 10}
    with pytest.raises(TypeError):
        plan.split["v1"] = 100  # type: ignore[index]
    assert plan.versions() == {"v1", "v2"}
    assert plan.percent("v2") == 10 and plan.percent("v9") == 0
    assert plan.pinned_tenants("v1") == ("acme",)


def test_an_empty_split_is_no_plan() -> None:
    assert TrafficPlan("m", {}, {}).versions() == frozenset()


@pytest.mark.parametrize(
    ("split", "field"),
    [
        ({"v1": 90}, "split"),  # sums to 90
        ({"v1": 60, "v2": 60}, "split"),  # each is in range, the sum is not
        ({"v1": 101}, "split.v1"),
        ({"v1": -10, "v2": 110}, "split.v1"),
        ({"v1": 50.0, "v2": 50}, "split.v1"),
        ({"v1": True, "v2": 99}, "split.v1"),
        ({"v1": "100"}, "split.v1"),
        ({"bad/version": 100}, "split"),
        ({"": 100}, "split"),
        ([("v1", 100)], "split"),
        ({f"v{i}": 0 for i in range(65)} | {"v0": 100}, "split"),
    ],
    ids=repr,
)
def test_bad_splits_are_refused(split: object, field: str) -> None:
    with pytest.raises(FieldError) as info:
        TrafficPlan("m", split, {})  # type: ignore[arg-type]
    assert info.value.field == field or info.value.field.startswith(field)


def test_percent_sums_are_checked_after_each_percent() -> None:
    with pytest.raises(FieldError, match="sum to 100, got 120"):
        TrafficPlan("m", {"v1": 60, "v2": 60}, {})


@pytest.mark.parametrize(
    "pins",
    [{"Not-A-Tenant": "v1"}, {"acme": "v/1"}, {"acme": 1}, {"": "v1"}, "acme=v1", {"a" * 65: "v1"}],
    ids=repr,
)
def test_bad_pins_are_refused(pins: object) -> None:
    with pytest.raises(FieldError) as info:
        TrafficPlan("m", {"v1": 100}, pins)  # type: ignore[arg-type]
    assert info.value.field.startswith("pins")


def test_a_plan_names_a_valid_model() -> None:
    with pytest.raises(FieldError) as info:
        TrafficPlan("org/m", {"v1": 100}, {})
    assert info.value.field == "name"


@given(st.dictionaries(st.sampled_from(["v1", "v2", "v3", "v4"]), st.integers(-5, 105), max_size=4))
def test_a_split_is_accepted_exactly_when_its_percents_are_valid(split: dict[str, int]) -> None:
    valid = not split or (all(0 <= p <= 100 for p in split.values()) and sum(split.values()) == 100)
    try:
        plan = TrafficPlan("m", split, {})
    except FieldError:
        assert not valid
        return
    assert valid and dict(plan.split) == split
