"""The rollout guards: a model keeps a ready version unless forced; plans name ready versions only
and a retired version leaves them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weir.tenancy.catalog.model_version_records import TrafficPlan
from weir.tenancy.catalog.rollout_guards import (
    check_keeps_serving,
    check_plan_serves,
    pins_without,
    split_without,
)
from weir.tenancy.errors import LastServingVersionError, VersionNotReadyError
from weir.tenancy.store.enums import ModelVersionState

S = ModelVersionState


def test_the_last_ready_version_is_kept_unless_forced() -> None:
    with pytest.raises(LastServingVersionError) as info:
        check_keeps_serving("smol", "v1", ["v1"], "drain", force=False)
    assert "'smol'" in info.value.message and "force" in info.value.message
    with pytest.raises(LastServingVersionError):
        check_keeps_serving("smol", "v1", [], "retire", force=False)
    check_keeps_serving("smol", "v1", ["v1", "v2"], "drain", force=False)  # another serves
    check_keeps_serving("smol", "v1", ["v1"], "drain", force=True)


def test_a_plan_routes_to_ready_versions_only() -> None:
    states = {"v1": S.READY, "v2": S.REGISTERED, "v3": S.DRAINING}
    check_plan_serves(TrafficPlan("smol", {"v1": 100, "v2": 0}, {"acme": "v1"}), states)
    with pytest.raises(VersionNotReadyError) as info:
        check_plan_serves(TrafficPlan("smol", {"v1": 50, "v2": 50}, {}), states)
    assert info.value.field == "split.v2" and "'v2' is registered" in info.value.message
    with pytest.raises(VersionNotReadyError) as pinned:
        check_plan_serves(TrafficPlan("smol", {"v1": 100}, {"acme": "v3"}), states)
    assert pinned.value.field == "pins.acme"


def test_split_without_rescales_to_100() -> None:
    assert split_without({"v1": 90, "v2": 10}, "v2") == {"v1": 100}
    assert split_without({"v1": 100}, "v1") == {}
    assert split_without({"v1": 100, "v2": 0}, "v1") == {}
    assert split_without({"v1": 50, "v2": 25, "v3": 25}, "v3") == {"v1": 67, "v2": 33}
    assert pins_without({"acme": "v1", "beta": "v2"}, "v2") == {"acme": "v1"}


@given(
    st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e"]), st.integers(0, 100), min_size=1),
    st.sampled_from(["a", "b", "c", "d", "e"]),
)
def test_split_without_is_a_valid_split_without_the_version(split: dict[str, int], version: str) -> None:
    out = split_without(split, version)
    assert version not in out
    assert set(out) <= set(split)
    assert out == {} or sum(out.values()) == 100
    if out:
        # Each share is its exact proportion rounded down or up (none with no share gains one).
        total = sum(split[v] for v in out)
        for v, percent in out.items():
            assert abs(percent - split[v] * 100 / total) < 1
            assert split[v] > 0 or percent == 0
