"""engine/scheduling/step_plan.py: the step target, the orders and the weighted fair shares."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.engine.latency_scenarios import SCENARIO_CLASS_TARGETS
from weir.engine.latency_targets import LatencyTargets
from weir.engine.request import Priority, Request, SamplingParams
from weir.engine.scheduling.step_plan import (
    decode_key,
    fair_rows,
    fair_shares,
    first_answer_yields,
    owes_itl,
    prefill_key,
    share_victim,
    step_target_s,
    ttft_tokens,
)


def _req(
    rid: str,
    priority: Priority,
    arrival: float = 0.0,
    latency: LatencyTargets | None = None,
    tenant: str = "default",
    weight: float = 1.0,
) -> Request:
    req = Request(
        rid,
        [1, 2],
        SamplingParams(max_tokens=4),
        priority=priority,
        arrival_s=arrival,
        tenant_id=tenant,
        weight=weight,
    )
    req.latency = latency if latency is not None else SCENARIO_CLASS_TARGETS.of(priority)
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


def test_ttft_tokens_spread_each_prompt_over_the_steps_left_before_its_deadline() -> None:
    def prompt(rid: str, tokens: int, arrival: float, ttft: float | None) -> Request:
        req = Request(rid, list(range(tokens)), SamplingParams(max_tokens=4), arrival_s=arrival)
        req.latency = LatencyTargets(ttft_s=ttft)
        return req

    chat = prompt("c", 70, arrival=0.0, ttft=2.0)  # 2 s left at 0: 6 steps of 300 ms, 12 tokens each
    assert ttft_tokens([chat], now=0.0, step_s=0.3) == 12
    assert ttft_tokens([chat], now=1.5, step_s=0.3) == 70  # one step left: all of it
    assert ttft_tokens([chat], now=5.0, step_s=0.3) == 0  # missed already: not at the others' cost
    chat.num_computed_tokens = 40
    assert ttft_tokens([chat], now=0.0, step_s=0.3) == 5  # what is left of it
    untimed = prompt("u", 500, arrival=0.0, ttft=None)
    assert ttft_tokens([untimed], now=0.0, step_s=0.3) == 0
    assert ttft_tokens([chat, untimed, prompt("t", 90, 0.0, 0.9)], now=0.0, step_s=0.3) == 30


def test_ttft_tokens_count_the_prompts_served_before_each() -> None:
    def prompt(rid: str, tokens: int, arrival: float, ttft: float, priority: Priority) -> Request:
        req = Request(rid, list(range(tokens)), SamplingParams(max_tokens=4), priority=priority)
        req.arrival_s = arrival
        req.latency = LatencyTargets(ttft_s=ttft)
        return req

    chats = [prompt(f"c{i}", 70, 0.0, 2.0, Priority.INTERACTIVE) for i in range(3)]
    # Served one after another: the last finishes after all 210 tokens, within 6 steps.
    assert ttft_tokens(chats, now=0.0, step_s=0.3) == 35
    assert ttft_tokens(list(reversed(chats)), now=0.0, step_s=0.3) == 35  # any order given
    # An earlier deadline goes first: 90 tokens in 3 steps (30), then 160 in 6 (27).
    early = prompt("e", 90, 0.0, 0.9, Priority.INTERACTIVE)
    assert ttft_tokens([chats[0], early], now=0.0, step_s=0.3) == 30
    # A better class goes first whatever its deadline: the chat then finishes after 160 tokens.
    slow_interactive = prompt("s", 90, 0.0, 10.0, Priority.INTERACTIVE)
    standard = prompt("d", 70, 0.0, 2.0, Priority.STANDARD)
    assert ttft_tokens([standard, slow_interactive], now=0.0, step_s=0.3) == 27
    # A prompt past its deadline neither needs nor delays: only the chat's own 70 count.
    late = prompt("l", 500, 0.0, 0.1, Priority.INTERACTIVE)
    assert ttft_tokens([late, chats[0]], now=0.2, step_s=0.3) == -(-70 // 6)


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


def test_fair_rows_share_a_class_between_tenants_and_keep_better_classes_whole() -> None:
    wide = [_req(f"a{i}", Priority.STANDARD, tenant="wide") for i in range(16)]  # beam 16 / n = 16
    lone = _req("v", Priority.STANDARD, tenant="lone")
    chat = _req("i", Priority.INTERACTIVE, tenant="chat")
    kept = fair_rows([*wide, lone, chat], 5)
    assert kept[0] is chat  # the better class first, whole
    assert lone in kept  # one row of its own: within its share of the 4 rows left
    assert sum(r.tenant_id == "wide" for r in kept) == 3
    for i, r in enumerate(wide):
        r.times.token_s.append(float(i))
    assert [r.request_id for r in fair_rows(wide, 3)] == ["a0", "a1", "a2"]  # least recently served
    assert fair_rows([*wide, lone], 100) == [*wide, lone]  # everything fits: nothing sits out
    assert fair_rows([*wide, lone], 0) == []


@given(
    capacity=st.integers(0, 40),
    rows=st.lists(
        st.tuples(st.sampled_from(list(Priority)), st.sampled_from("abcd"), st.floats(0.5, 4.0)), max_size=40
    ),
)
def test_fair_rows_fill_the_capacity_by_class_and_weight(
    capacity: int, rows: list[tuple[Priority, str, float]]
) -> None:
    weight_of: dict[str, float] = {}
    reqs = []
    for i, (prio, tenant, weight) in enumerate(rows):
        weight_of.setdefault(tenant, weight)
        reqs.append(_req(f"r{i}", prio, tenant=tenant, weight=weight_of[tenant]))
    kept = fair_rows(reqs, capacity)
    assert len(kept) == min(capacity, len(reqs)) and len({id(r) for r in kept}) == len(kept)
    worst_kept = max((int(r.priority) for r in kept), default=-1)
    # a better class is never cut for a worse one
    assert all(r in kept for r in reqs if int(r.priority) < worst_kept)
    # within the class that was cut, the rows follow the weighted max-min shares
    cut = [r for r in reqs if int(r.priority) == worst_kept]
    demands: dict[str, int] = {}
    for r in cut:
        demands[r.tenant_id] = demands.get(r.tenant_id, 0) + 1
    room = capacity - sum(int(r.priority) < worst_kept for r in kept)
    if cut and len(cut) > room:
        shares = fair_shares(room, demands, weight_of)
        for tenant, share in shares.items():
            assert sum(r.tenant_id == tenant and int(r.priority) == worst_kept for r in kept) == share


def _always(req: Request) -> bool:
    return True


def test_share_victim_takes_from_the_tenant_over_its_share_only() -> None:
    wide = [_req(f"w{i}", Priority.STANDARD, arrival=float(i), tenant="wide") for i in range(6)]
    for i, r in enumerate(wide):
        r.num_computed_tokens = 100 - i
    lone = _req("v", Priority.STANDARD, tenant="lone")
    head = _req("h", Priority.STANDARD, tenant="lone")
    batch = [_req(f"b{i}", Priority.BATCH, tenant="flood") for i in range(10)]
    running = [*wide, lone, *batch]
    # seats: 7 held in the class + 1; lone would hold 2 of 8, wide holds 6 > 4
    assert share_victim(head, running, lambda r: 1, 1, _always) is wide[-1]  # the least advanced
    # none of wide's requests may be preempted yet (minimum residency): nobody is
    assert share_victim(head, running, lambda r: 1, 1, lambda r: r.tenant_id != "wide") is None
    # the head's own tenant already holds its share: it waits
    crowded = [*wide[:3], *[_req(f"v{i}", Priority.STANDARD, tenant="lone") for i in range(3)]]
    assert share_victim(head, crowded, lambda r: 1, 1, _always) is None
    # a heavier weight is a bigger share: wide at weight 3 holds 6 of 8, its share is 6
    heavy = [_req(f"w{i}", Priority.STANDARD, tenant="wide", weight=3.0) for i in range(6)]
    assert share_victim(head, [*heavy, lone], lambda r: 1, 1, _always) is None
    # other classes never count or lose: only batch runs beside a standard head
    assert share_victim(head, batch, lambda r: 1, 1, _always) is None
    # by KV blocks: one long answer holding 40 blocks against a 3-block head
    long = _req("l", Priority.STANDARD, tenant="long")
    blocks = {"l": 40, "v": 2}
    assert share_victim(head, [long, lone], lambda r: blocks[r.request_id], 3, _always) is long


@given(
    held=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 20)), max_size=12),
    need=st.integers(1, 20),
    head_tenant=st.sampled_from("abcd"),
)
def test_share_victim_never_takes_from_a_tenant_within_its_share(
    held: list[tuple[str, int]], need: int, head_tenant: str
) -> None:
    running = [_req(f"r{i}", Priority.STANDARD, tenant=t) for i, (t, _) in enumerate(held)]
    size = {f"r{i}": n for i, (_, n) in enumerate(held)}
    head = _req("h", Priority.STANDARD, tenant=head_tenant)
    victim = share_victim(head, running, lambda r: size[r.request_id], need, _always)
    if victim is None:
        return
    per: dict[str, int] = {}
    for r in running:
        per[r.tenant_id] = per.get(r.tenant_id, 0) + size[r.request_id]
    tenants = set(per) | {head_tenant}
    total = sum(per.values()) + need
    assert victim.tenant_id != head_tenant
    assert per[victim.tenant_id] > total / len(tenants)  # over its (equal-weight) share
    assert per.get(head_tenant, 0) + need <= total / len(tenants)  # the head stays within its own


def _decoding(rid: str, tenant: str, last_token_s: float, priority: Priority = Priority.STANDARD) -> Request:
    req = _req(rid, priority, tenant=tenant)
    req.times.token_s.append(last_token_s)
    return req


def test_the_tenant_with_more_rows_yields_to_another_tenants_first_answer() -> None:
    beams = [_decoding(f"a{i}", "attacker", 9.9) for i in range(16)]
    quiet_row = _decoding("q0", "quiet", 9.9)
    first = _req("q1", Priority.STANDARD, tenant="quiet")
    yields = first_answer_yields([first], [*beams, quiet_row], set(), now=10.0, step_s=0.05)
    assert {r.request_id for r in yields} == {r.request_id for r in beams}  # 16 rows against 1
    # the attacker's own first answers never push the quiet tenant's row out
    attacker_first = _req("a99", Priority.STANDARD, tenant="attacker")
    assert first_answer_yields([attacker_first], [*beams, quiet_row], set(), now=10.0, step_s=0.05) == []


def test_equal_holders_other_classes_and_the_weight_do_not_yield() -> None:
    first = _req("q1", Priority.STANDARD, tenant="quiet")
    one_each = [_decoding("a0", "attacker", 9.9), _decoding("q0", "quiet", 9.9)]
    assert first_answer_yields([first], one_each, set(), now=10.0, step_s=0.05) == []
    batch_rows = [_decoding(f"b{i}", "flood", 9.9, Priority.BATCH) for i in range(8)]
    assert first_answer_yields([first], batch_rows, set(), now=10.0, step_s=0.05) == []
    # two rows at weight 4 hold less per unit of weight than the quiet tenant's one row at weight 1
    heavy = [_decoding(f"h{i}", "heavy", 9.9) for i in range(2)]
    for r in heavy:
        r.weight = 4.0
    assert first_answer_yields([first], [*heavy, one_each[1]], set(), now=10.0, step_s=0.05) == []


def test_a_row_yields_only_within_its_itl_and_never_two_steps_in_a_row() -> None:
    first = _req("q1", Priority.STANDARD, tenant="quiet")
    rows = [_decoding(f"a{i}", "attacker", 9.9) for i in range(4)]
    itl = rows[0].latency.itl_s
    assert itl is not None
    late = _decoding("late", "attacker", 10.0 - itl + 0.05)  # its gap plus two steps passes the ITL
    yields = first_answer_yields([first], [*rows, late], {"a0"}, now=10.0, step_s=0.05)
    assert {r.request_id for r in yields} == {"a1", "a2", "a3"}


def test_beam_rows_that_stream_nothing_yield_however_long_they_ran() -> None:
    first = _req("q1", Priority.STANDARD, tenant="quiet")
    beams = [_req(f"b{i}", Priority.STANDARD, tenant="attacker") for i in range(16)]
    for b in beams:
        b.output_token_ids = [5, 6, 7]  # a beam's tokens, answered at the end: no token_s
    yields = first_answer_yields([first], beams, set(), now=100.0, step_s=0.05)
    assert len(yields) == 16


def test_a_stream_of_new_prompts_counts_as_rows_and_cannot_push_out_a_lone_decode() -> None:
    lone = _decoding("v0", "victim", 9.9)
    # a tenant with no decode rows sends a new short prompt (max_tokens 1) every step
    spam = _req("s0", Priority.STANDARD, tenant="spammer")
    assert first_answer_yields([spam], [lone], set(), now=10.0, step_s=0.05) == []
    # its other prompt chunks in the step count too
    chunks = [_req(f"s{i}", Priority.STANDARD, tenant="spammer") for i in range(1, 4)]
    assert first_answer_yields([spam], [lone], set(), now=10.0, step_s=0.05, others=chunks) == []
    # a quiet tenant's lone prompt still gets a step without a neighbour's two rows
    rows = [_decoding(f"a{i}", "attacker", 9.9) for i in range(2)]
    assert len(first_answer_yields([spam], rows, set(), now=10.0, step_s=0.05)) == 2
