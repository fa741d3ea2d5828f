"""The traffic router: pins first, weighted split by request id, never a version that may not serve."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from weir.gateway.fleet.traffic_router import RoutePlan, choose_version, request_bucket

VERSIONS = ("v1", "v2", "v3")


def test_the_split_is_followed_by_request_id_and_is_sticky() -> None:
    plan = RoutePlan(split={"v1": 90, "v2": 10})
    picks = [choose_version(plan, ["v1", "v2"], "t", f"req-{i}") for i in range(5000)]
    share = picks.count("v2") / len(picks)
    assert 0.08 < share < 0.12  # a deterministic hash over 5000 ids: 10% within sampling noise
    assert all(choose_version(plan, ["v1", "v2"], "t", f"req-{i}") == picks[i] for i in range(200))


def test_a_pinned_tenant_stays_on_its_version_at_a_full_split_elsewhere() -> None:
    plan = RoutePlan(split={"v2": 100}, pins={"acme": "v1"})
    assert {choose_version(plan, ["v1", "v2"], "acme", f"r{i}") for i in range(100)} == {"v1"}
    assert {choose_version(plan, ["v1", "v2"], "other", f"r{i}") for i in range(100)} == {"v2"}


def test_a_pin_to_a_version_that_no_longer_serves_falls_back_to_the_split() -> None:
    plan = RoutePlan(split={"v2": 100}, pins={"acme": "v1"})
    assert choose_version(plan, ["v2"], "acme", "r") == "v2"


def test_a_drained_versions_share_goes_to_the_others() -> None:
    plan = RoutePlan(split={"v1": 50, "v2": 50})
    assert {choose_version(plan, ["v2"], "t", f"r{i}") for i in range(100)} == {"v2"}


def test_no_plan_uses_the_version_ready_last_and_nothing_ready_is_none() -> None:
    assert choose_version(RoutePlan(), ["v1", "v2"], "t", "r") == "v2"
    assert choose_version(RoutePlan(split={"v3": 100}), ["v1"], "t", "r") == "v1"
    assert choose_version(RoutePlan(split={"v1": 100}), [], "t", "r") is None


def test_a_negative_or_non_integer_share_is_refused() -> None:
    with pytest.raises(ValueError, match="split"):
        RoutePlan(split={"v1": -1})
    with pytest.raises(ValueError, match="split"):
        RoutePlan(split={"v1": 1.5})  # type: ignore[dict-item]


@settings(max_examples=200, deadline=None)
@given(
    split=st.dictionaries(st.sampled_from(VERSIONS), st.integers(0, 100)),
    pins=st.dictionaries(st.sampled_from(("a", "b")), st.sampled_from(VERSIONS)),
    routable=st.lists(st.sampled_from(VERSIONS), unique=True),
    tenant=st.sampled_from(("a", "b", "c")),
    request_id=st.text(max_size=20),
)
def test_the_choice_is_always_routable_pinned_when_it_can_be_and_deterministic(
    split: dict[str, int], pins: dict[str, str], routable: list[str], tenant: str, request_id: str
) -> None:
    plan = RoutePlan(split=split, pins=pins)
    chosen = choose_version(plan, routable, tenant, request_id)
    assert chosen == choose_version(plan, routable, tenant, request_id)
    if not routable:
        assert chosen is None
        return
    assert chosen in routable
    if pins.get(tenant) in routable:
        assert chosen == pins[tenant]
    elif any(split.get(v, 0) > 0 for v in routable):
        assert split.get(chosen, 0) > 0  # a version with no share never gets split traffic
    assert 0 <= request_bucket(request_id) < 10_000
