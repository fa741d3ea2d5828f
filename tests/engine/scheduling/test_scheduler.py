"""Scheduler: chunked prefill, decode-first budgets, preemption, abort, batch policies."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from tests.engine.sim import Sim, reference_output
from weir.engine.config import BatchPolicy, QueuePolicy, SchedulerConfig
from weir.engine.errors import ContextLengthError
from weir.engine.request import Priority, RequestStatus

PROMPTS = [list(range(1, n + 1)) for n in (1, 3, 17, 40, 9, 64, 5, 33)]


def _run(config: SchedulerConfig, num_blocks: int = 200, caching: bool = True) -> Sim:
    sim = Sim(config, num_blocks=num_blocks, caching=caching)
    for i, p in enumerate(PROMPTS):
        sim.add(f"r{i}", [t + i for t in p], max_tokens=6 + i)
    sim.run()
    return sim


@pytest.mark.parametrize("budget", [1, 7, 64, 4096])
def test_chunked_prefill_gives_the_same_tokens(budget: int) -> None:
    sim = _run(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8, max_model_len=256))
    for i, p in enumerate(PROMPTS):
        assert sim.outputs[f"r{i}"] == reference_output([t + i for t in p], 6 + i)
    assert sim.kv.num_free_blocks == sim.kv.num_total_blocks


def test_decodes_come_first_and_prefill_takes_the_rest() -> None:
    sim = Sim(SchedulerConfig(max_num_batched_tokens=10, max_num_seqs=4, max_model_len=256))
    sim.add("a", [1, 2, 3], max_tokens=5)
    sim.step()  # a prefilled, first token sampled
    sim.add("b", list(range(50)), max_tokens=2)
    sim.step()
    out = sim.steps[-1]
    assert out.scheduled[0].request_id == "a" and out.scheduled[0].num_tokens == 1
    assert out.scheduled[1].request_id == "b" and out.scheduled[1].num_tokens == 9
    assert not out.scheduled[1].samples


def test_preemption_by_recompute_gives_the_same_tokens() -> None:
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256)
    sim = _run(config, num_blocks=30, caching=False)
    assert sim.sched.num_preemptions > 0
    for i, p in enumerate(PROMPTS):
        assert sim.outputs[f"r{i}"] == reference_output([t + i for t in p], 6 + i)
    assert sim.kv.num_free_blocks == sim.kv.num_total_blocks


def test_abort_mid_prefill_and_mid_decode_returns_every_block() -> None:
    sim = Sim(SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=4, max_model_len=256), caching=False)
    sim.add("decode", [5, 6], max_tokens=50)
    sim.add("prefill", list(range(40)), max_tokens=4)
    for _ in range(3):
        sim.step()
    assert sim.sched.requests["prefill"].num_computed_tokens < 40
    assert sim.sched.requests["decode"].num_output_tokens > 0
    sim.sched.finish_request("prefill", RequestStatus.FINISHED_ABORTED)
    sim.sched.finish_request("decode", RequestStatus.FINISHED_ABORTED)
    assert sim.kv.num_free_blocks == sim.kv.num_total_blocks
    assert not sim.sched.has_unfinished()


def test_request_that_can_never_fit_is_refused() -> None:
    sim = Sim(SchedulerConfig(max_model_len=32))
    with pytest.raises(ContextLengthError):
        sim.add("big", list(range(30)), max_tokens=10)


def test_prefix_cache_hit_skips_computed_blocks() -> None:
    sim = Sim(SchedulerConfig(max_num_batched_tokens=256, max_model_len=256))
    prompt = list(range(100, 140))
    sim.add("first", prompt, max_tokens=2)
    sim.run()
    req = sim.add("second", prompt, max_tokens=2)
    sim.run()
    assert req.num_cached_tokens == 36  # 9 full blocks of 4; the last block is recomputed
    assert sim.outputs["second"] == sim.outputs["first"]


def test_priority_policy_serves_interactive_first() -> None:
    sim = Sim(SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=1, queue_policy=QueuePolicy.PRIORITY))
    sim.add("batch", [1, 2, 3], max_tokens=2, priority=Priority.BATCH)
    sim.add("interactive", [4, 5, 6], max_tokens=2, priority=Priority.INTERACTIVE)
    sim.step()
    assert [s.request_id for s in sim.steps[-1].scheduled] == ["interactive"]


def test_priority_preempts_lower_class_when_blocks_are_short() -> None:
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, queue_policy=QueuePolicy.PRIORITY)
    sim = Sim(config, num_blocks=6, caching=False)
    sim.add("batch", list(range(12)), max_tokens=12, priority=Priority.BATCH)
    sim.step()
    sim.add("interactive", list(range(12)), max_tokens=12, priority=Priority.INTERACTIVE)
    sim.run()
    assert sim.sched.num_preemptions >= 1
    assert sim.outputs["batch"] == reference_output(list(range(12)), 12)


def test_static_batch_waits_for_a_full_batch() -> None:
    config = SchedulerConfig(batch_policy=BatchPolicy.STATIC, static_batch_size=3, static_max_wait_s=100)
    sim = Sim(config)
    sim.add("a", [1, 2], max_tokens=3)
    sim.add("b", [1, 3], max_tokens=3)
    sim.step()
    assert sim.steps[-1].scheduled == ()
    sim.add("c", [1, 4], max_tokens=9)
    sim.step()
    assert {s.request_id for s in sim.steps[-1].scheduled} == {"a", "b", "c"}
    sim.add("d", [9], max_tokens=1)
    for _ in range(4):
        sim.step()
        assert "d" not in {s.request_id for s in sim.steps[-1].scheduled}  # batch runs to completion


def test_dynamic_batch_fires_after_its_window() -> None:
    config = SchedulerConfig(batch_policy=BatchPolicy.DYNAMIC, dynamic_window_s=0.05, max_num_seqs=8)
    sim = Sim(config)
    sim.add("a", [1, 2], max_tokens=2)
    sim.step()
    assert sim.steps[-1].scheduled == ()
    sim.clock.now += 0.1
    sim.step()
    assert [s.request_id for s in sim.steps[-1].scheduled] == ["a"]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 30), st.integers(1, 8), st.booleans()), min_size=1, max_size=8),
    st.integers(1, 32),
    st.integers(12, 40),
)
def test_random_workloads_never_leak_blocks(reqs, budget, num_blocks) -> None:  # type: ignore[no-untyped-def]
    sim = Sim(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=4, max_model_len=64), num_blocks)
    for i, (plen, mt, _abort) in enumerate(reqs):
        sim.add(f"r{i}", [i + 1] * plen, mt)
    sim.step()
    for i, (_, _, abort) in enumerate(reqs):
        if abort:
            sim.sched.finish_request(f"r{i}", RequestStatus.FINISHED_ABORTED)
    sim.run()
    assert sim.kv.num_free_blocks == sim.kv.num_total_blocks
    for b in sim.kv.pool.blocks[1:]:
        assert b.ref_cnt == 0
    for i, (plen, mt, abort) in enumerate(reqs):
        if not abort:
            assert sim.outputs[f"r{i}"] == reference_output([i + 1] * plen, mt)


def test_tenant_cap_holds_in_the_scheduler() -> None:
    sim = Sim(
        SchedulerConfig(max_num_batched_tokens=64, max_model_len=256), num_blocks=40, tenant_cache_share=0.25
    )
    sim.add("quiet", list(range(500, 520)), max_tokens=1, tenant="quiet")
    sim.run()
    for i in range(40):
        sim.add(f"n{i}", [i + 1] * 4 + list(range(600 + 10 * i, 610 + 10 * i)), max_tokens=2, tenant="noisy")
        sim.run()
        assert sim.kv.pool.num_cached_blocks("noisy") <= sim.kv.max_cached_blocks_per_scope == 10
    again = sim.add("quiet2", list(range(500, 520)), max_tokens=1, tenant="quiet")
    sim.run()
    assert again.num_cached_tokens == 16


def test_a_displaced_request_is_not_displaced_for_a_fair_share_again_before_its_next_token() -> None:
    # The livelock the progress machine found: two tenants of one class, each needing most of
    # the pool, displaced each other (min residency passed) while recomputing, before either's
    # next token. A request displaced once must compute past what it held before it can be again.
    config = SchedulerConfig(
        max_num_batched_tokens=6,
        max_num_seqs=4,
        max_model_len=72,
        queue_policy=QueuePolicy.FAIR,
        min_residency_steps=2,
    )
    sim = Sim(config, num_blocks=18, caching=False)
    req = sim.add("c", list(range(1, 41)), 12, tenant="c", priority=Priority.INTERACTIVE)
    while len(req.output_token_ids) < 4:
        sim.step()
    sched = sim.sched
    held = req.num_tokens
    sched.preemption.preempt(req)
    assert req.status is RequestStatus.PREEMPTED and req.num_computed_tokens == 0
    sim.step()  # readmitted, recomputing
    assert req.status is RequestStatus.RUNNING
    steps = 0
    while req.num_computed_tokens < held:
        steps += 1
        if steps > config.min_residency_steps:
            assert sched.preemption.settled(req) and not sched.preemption.may_share_preempt(req)
        sim.step()
    assert steps > config.min_residency_steps  # the recompute outlasted the residency
    assert sched.preemption.may_share_preempt(req)  # past its old tokens (its next token sampled): fair game
    sim.run()
    assert sim.outputs["c"] == reference_output(list(range(1, 41)), 12)  # recomputed, unchanged


def _ids(sim: Sim) -> set[str]:
    return {s.request_id for s in sim.steps[-1].scheduled}


def test_an_admission_hold_keeps_a_new_prompt_out_of_running_streams_until_it_has_waited() -> None:
    """Continuous batching with `admission_hold_s`: while sequences run, a new request waits until
    it has waited the hold (then its prompt joins the next step), the running ones decoding on."""
    sim = Sim(SchedulerConfig(max_num_seqs=8, max_model_len=256, admission_hold_s=0.5))
    sim.add("a", [1, 2, 3], max_tokens=40)
    sim.add("b", [4, 5], max_tokens=40)
    sim.step()
    assert _ids(sim) == {"a", "b"}  # nothing ran: admitted at once
    sim.add("c", [6, 7, 8], max_tokens=4)
    for _ in range(3):
        sim.step()
        assert _ids(sim) == {"a", "b"}  # decodes only: c is held
        sim.clock.now += 0.1
    sim.clock.now += 0.3  # c has now waited 0.6 s
    sim.step()
    assert _ids(sim) == {"a", "b", "c"}
    sim.run()
    assert sim.outputs["c"] == reference_output([6, 7, 8], 4)  # held, not changed


def test_the_hold_ends_when_as_many_requests_wait_as_run() -> None:
    sim = Sim(SchedulerConfig(max_num_seqs=8, max_model_len=256, admission_hold_s=100.0))
    sim.add("a", [1, 2, 3], max_tokens=40)
    sim.add("b", [4, 5], max_tokens=40)
    sim.step()
    sim.add("c", [6], max_tokens=3)
    sim.step()
    assert _ids(sim) == {"a", "b"}  # one waits, two run
    sim.add("d", [7], max_tokens=3)
    sim.step()
    assert _ids(sim) == {"a", "b", "c", "d"}  # two wait, two run: both prompts in one step


def test_no_hold_admits_at_once_and_a_hold_never_delays_an_idle_engine() -> None:
    for hold in (0.0, 100.0):
        sim = Sim(SchedulerConfig(max_num_seqs=8, max_model_len=256, admission_hold_s=hold))
        sim.add("a", [1, 2, 3], max_tokens=2)
        sim.step()
        assert _ids(sim) == {"a"}  # nothing running: never held
        sim.run()
        sim.add("b", [4, 5], max_tokens=9)
        sim.add("a2", [1], max_tokens=9)
        sim.step()
        assert _ids(sim) == {"b", "a2"}
        sim.add("c", [6], max_tokens=2)
        sim.step()
        assert ("c" in _ids(sim)) == (hold == 0.0)
    with pytest.raises(ValueError, match="admission_hold_s"):
        SchedulerConfig(admission_hold_s=-1.0)
    with pytest.raises(ValueError, match="admission_hold_s"):
        SchedulerConfig(admission_hold_s=float("inf"))


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 30), st.integers(1, 8)), min_size=1, max_size=8),
    st.floats(0.0, 0.5),
)
def test_held_requests_all_finish_with_their_tokens_and_every_block_back(
    reqs: list[tuple[int, int]], hold: float
) -> None:
    """Whatever arrives, with any hold: every request finishes with the reference tokens (the hold
    delays admission, never starves it: the clock advances 10 ms a step) and no block leaks."""
    sim = Sim(
        SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=4, max_model_len=256, admission_hold_s=hold)
    )
    for i, (length, max_tokens) in enumerate(reqs):
        sim.add(f"r{i}", [(i * 7 + t) % 50 + 1 for t in range(length)], max_tokens=max_tokens)
        sim.step()
        sim.clock.now += 0.01
    for _ in range(2_000):
        if not sim.sched.has_unfinished():
            break
        sim.step()
        sim.clock.now += 0.01
    for i, (length, max_tokens) in enumerate(reqs):
        assert sim.outputs[f"r{i}"] == reference_output(
            [(i * 7 + t) % 50 + 1 for t in range(length)], max_tokens
        )
    assert sim.kv.num_free_blocks == sim.kv.num_total_blocks


def test_the_hold_counts_the_longest_wait_not_a_fresher_head() -> None:
    """Under the priority queue a newer, higher-class request heads the queue; the hold ends when
    the request that has waited longest reaches it, so resending fresh heads cannot hold others."""
    sim = Sim(
        SchedulerConfig(
            max_num_seqs=8, max_model_len=256, admission_hold_s=0.5, queue_policy=QueuePolicy.PRIORITY
        )
    )
    sim.add("a", [1, 2, 3], max_tokens=60)
    sim.add("b", [4, 5], max_tokens=60)
    sim.add("c", [6, 7], max_tokens=60)
    sim.step()
    sim.add("old", [8], max_tokens=3, priority=Priority.BATCH)
    sim.clock.now += 0.45
    sim.add("fresh", [9], max_tokens=3, priority=Priority.INTERACTIVE)  # now the head, just arrived
    sim.step()
    assert _ids(sim) == {"a", "b", "c"}  # two wait, three run, nobody has waited 0.5 s
    sim.clock.now += 0.1
    sim.step()
    assert {"old", "fresh"} <= _ids(sim)  # "old" has waited the hold: both are admitted
