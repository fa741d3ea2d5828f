"""Forks: n>1 choices start on their parent's prompt blocks, or queue on their own without it."""

from __future__ import annotations

from tests.engine.sim import Sim, reference_output, sim_request
from weir.engine.config import SchedulerConfig
from weir.engine.request import RequestStatus


def _fork_group(sim: Sim, prompt: list[int], n: int, max_tokens: int) -> list:
    reqs = [sim_request(f"g#{i}", prompt, max_tokens, cache_scope="t") for i in range(n)]
    sim.sched.add_fork_group(reqs[0], reqs[1:])
    for r in reqs:
        sim.outputs[r.request_id] = []
    return reqs


def test_forks_share_the_prompt_blocks_and_compute_one_token_each() -> None:
    sim = Sim(SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=256))
    prompt = list(range(50, 60))  # 2 full blocks of 4 + 2 tokens
    reqs = _fork_group(sim, prompt, 4, max_tokens=3)
    sim.step()
    assert [s.request_id for s in sim.steps[-1].scheduled] == ["g#0"]
    tables = [list(sim.kv.blocks(r.request_id)) for r in reqs]
    assert all(t[:2] == tables[0][:2] for t in tables)
    assert [b.ref_cnt for b in tables[0][:3]] == [4, 4, 4]
    sim.step()  # every child feeds position 9 into its own copy of the partial block
    out = sim.steps[-1]
    assert sorted(s.num_tokens for s in out.scheduled) == [1, 1, 1, 1]
    assert len(out.blocks_to_copy) == 3 and {src for src, _ in out.blocks_to_copy} == {tables[0][2].block_id}
    sim.run()
    prefill = sum(s.num_tokens for o in sim.steps for s in o.scheduled)
    assert prefill == 10 + 3 + 4 * 2  # prompt once, one token per fork, then decodes
    for r in reqs:
        assert sim.outputs[r.request_id] == reference_output(prompt, 3)
    assert sim.kv.num_free_blocks == sim.kv.num_total_blocks


def test_forks_of_an_aborted_parent_run_on_their_own() -> None:
    sim = Sim(SchedulerConfig(max_num_batched_tokens=4, max_num_seqs=8, max_model_len=256))
    reqs = _fork_group(sim, list(range(20)), 3, max_tokens=2)
    sim.step()  # the parent is mid-prefill
    sim.sched.finish_request("g#0", RequestStatus.FINISHED_ABORTED)
    sim.sched.finish_request("g#2", RequestStatus.FINISHED_ABORTED)
    sim.run()
    assert sim.outputs["g#1"] == reference_output(list(range(20)), 2)
    assert reqs[1].num_cached_tokens == 4  # the parent's first chunk was cached
    assert sim.kv.num_free_blocks == sim.kv.num_total_blocks and not sim.sched.has_unfinished()


def test_a_fork_group_waits_for_seats_for_all_its_choices() -> None:
    sim = Sim(SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=4, max_model_len=256))
    sim.add("busy", [1, 2, 3], max_tokens=5)
    sim.step()
    _fork_group(sim, list(range(9)), 4, max_tokens=2)
    sim.step()
    assert [s.request_id for s in sim.steps[-1].scheduled] == ["busy"]
    sim.run()
    assert sim.kv.num_free_blocks == sim.kv.num_total_blocks


def test_deadline_bookkeeping_of_forks_balances() -> None:
    sim = Sim(SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=256))
    reqs = [sim_request(f"d#{i}", list(range(9)), 2, deadline_s=100.0) for i in range(3)]
    sim.sched.add_fork_group(reqs[0], reqs[1:])
    for r in reqs:
        sim.outputs[r.request_id] = []
    sim.run()
    assert sim.sched._num_deadlines == 0
