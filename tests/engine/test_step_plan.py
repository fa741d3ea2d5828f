"""engine/step_plan.py: the step target, the orders and the weighted fair shares."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.latency_targets import CPU_CLASS_TARGETS, LatencyTargets
from engine.request import Priority, Request, SamplingParams
from engine.step_plan import decode_key, fair_shares, owes_itl, prefill_key, step_target_s


def _req(
    rid: str, priority: Priority, arrival: float = 0.0, latency: LatencyTargets | None = None
) -> Request:
    req = Request(rid, [1, 2], SamplingParams(max_tokens=4), priority=priority, arrival_s=arrival)
    req.latency = latency if latency is not None else CPU_CLASS_TARGETS.of(priority)
    return req


def test_the_step_target_is_the_tightest_itl_running_else_the_throughput_target() -> None:
    batch = [_req("b", Priority.BATCH)]
    assert step_target_s(batch, 0.8) == 0.8  # only batch: the throughput-optimal step
    assert step_target_s(batch, None) is None
    mixed = [*batch, _req("s", Priority.STANDARD), _req("i", Priority.INTERACTIVE)]
    assert step_target_s(mixed, 0.8) == 0.3
    assert step_target_s(mixed, 0.2) == 0.2  # never longer than the configured step
    tenant = _req("t", Priority.STANDARD, latency=LatencyTargets(itl_s=0.15))
    assert step_target_s([*mixed, tenant], None) == 0.15  # a tenant's tpot_slo_ms is tighter


def test_prefills_go_by_class_then_ttft_deadline() -> None:
    late_interactive = _req("i1", Priority.INTERACTIVE, arrival=5.0)
    early_interactive = _req("i0", Priority.INTERACTIVE, arrival=1.0)
    tight = _req("i2", Priority.INTERACTIVE, arrival=4.0, latency=LatencyTargets(ttft_s=0.5))
    standard = _req("s", Priority.STANDARD, arrival=0.0)
    batch = _req("b", Priority.BATCH, arrival=-10.0)
    got = sorted([batch, standard, late_interactive, early_interactive, tight], key=prefill_key)
    assert [r.request_id for r in got] == ["i0", "i2", "i1", "s", "b"]


def test_decodes_that_wait_longest_go_first_within_a_class() -> None:
    a, b = _req("a", Priority.BATCH), _req("b", Priority.BATCH)
    a.times.token_s.append(3.0)
    b.times.token_s.append(2.0)
    assert sorted([a, b], key=decode_key) == [b, a]
    assert owes_itl(_req("i", Priority.INTERACTIVE), 0.3)
    assert not owes_itl(a, 0.3) and not owes_itl(_req("s", Priority.STANDARD), 0.3)


def test_fair_shares_by_weight_and_demand() -> None:
    assert fair_shares(100, {"a": 1000, "b": 1000}, {"a": 1.0, "b": 1.0}) == {"a": 50, "b": 50}
    assert fair_shares(90, {"a": 1000, "b": 1000}, {"a": 2.0, "b": 1.0}) == {"a": 60, "b": 30}
    assert fair_shares(100, {"a": 1000, "b": 10}, {"a": 1.0, "b": 1.0}) == {"a": 90, "b": 10}
    assert fair_shares(100, {"a": 20, "b": 10}, {}) == {"a": 20, "b": 10}
    assert fair_shares(0, {"a": 5}, {}) == {"a": 0}


@given(
    budget=st.integers(0, 5000),
    tenants=st.dictionaries(
        st.sampled_from("abcdef"), st.tuples(st.integers(0, 3000), st.floats(0.1, 10.0)), min_size=1
    ),
)
def test_fair_shares_are_max_min_fair(budget: int, tenants: dict[str, tuple[int, float]]) -> None:
    demands = {t: d for t, (d, _) in tenants.items()}
    weights = {t: w for t, (_, w) in tenants.items()}
    shares = fair_shares(budget, demands, weights)
    assert all(0 <= shares[t] <= demands[t] for t in demands)
    assert sum(shares.values()) == min(budget, sum(demands.values()))
    # a tenant cut short has at least as much per unit of weight as any other (rounding: 1 token each)
    for t, s in shares.items():
        if s < demands[t]:
            for o, so in shares.items():
                assert (s + 1) / weights[t] >= (so - 1) / weights[o] - 1e-9
