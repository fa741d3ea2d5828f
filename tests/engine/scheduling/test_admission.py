"""Admission: displaced victims sit out the admission, and identical prompts are computed once."""

from __future__ import annotations

from tests.engine.sim import Sim, reference_output
from weir.engine.config import QueuePolicy, SchedulerConfig
from weir.engine.request import Priority


def test_one_tenants_displaced_batch_request_is_not_readmitted_in_the_same_step() -> None:
    """Issue 29: under the fair queue a tenant's victim went back to the head of its own FIFO, was
    admitted again and displaced again by the same interactive request, inside one `schedule()`,
    for ever (the engine thread spun at 100% and no step ever ended)."""
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, queue_policy=QueuePolicy.FAIR)
    sim = Sim(config, num_blocks=6, caching=False)
    sim.add("batch", list(range(12)), max_tokens=12, priority=Priority.BATCH)
    sim.step()
    sim.add("interactive", list(range(12)), max_tokens=12, priority=Priority.INTERACTIVE)
    preempt = sim.kv.preempt
    calls = []

    def counted(req, allow_swap=True):  # type: ignore[no-untyped-def]
        calls.append(req.request_id)
        assert len(calls) < 10, f"one step preempted without end: {calls}"
        return preempt(req, allow_swap)

    sim.kv.preempt = counted  # type: ignore[method-assign]
    sim.step()
    assert calls == ["batch"]
    assert [s.request_id for s in sim.steps[-1].scheduled] == ["interactive"]
    sim.run()
    assert sim.outputs["batch"] == reference_output(list(range(12)), 12)
    assert sim.outputs["interactive"] == reference_output(list(range(12)), 12)


def test_identical_prompts_arriving_together_are_computed_once() -> None:
    sim = Sim(SchedulerConfig(max_num_batched_tokens=256, max_model_len=256))
    prompt = list(range(100, 140))
    a = sim.add("a", prompt, max_tokens=3)
    b = sim.add("b", prompt, max_tokens=3)
    other = sim.add("other", list(range(7, 30)), max_tokens=3)
    sim.step()
    assert {s.request_id for s in sim.steps[-1].scheduled} == {"a", "other"}  # b waits one step
    sim.run()
    assert b.num_cached_tokens == 36 and a.num_cached_tokens == 0 and other.num_cached_tokens == 0
    prefill = sum(s.num_tokens for out in sim.steps for s in out.scheduled if s.request_id == "b")
    assert prefill == 4 + 2  # its last block, then two decodes
    assert sim.outputs["a"] == sim.outputs["b"] == reference_output(prompt, 3)
    assert sim.sched.admission.num_held_back >= 1


def test_without_caching_identical_prompts_run_side_by_side() -> None:
    sim = Sim(SchedulerConfig(max_num_batched_tokens=256, max_model_len=256), caching=False)
    sim.add("a", list(range(40)), max_tokens=2)
    sim.add("b", list(range(40)), max_tokens=2)
    sim.step()
    assert {s.request_id for s in sim.steps[-1].scheduled} == {"a", "b"}
