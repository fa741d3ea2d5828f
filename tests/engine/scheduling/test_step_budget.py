"""The step budget controller on a simulated clock: step time = a + c * decodes + b * prefill
tokens, with seeded noise.

Nothing here measures real time: every "second" is computed by the fake cost model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.engine.sim import Sim, reference_output
from weir.engine.config import QueuePolicy, SchedulerConfig
from weir.engine.scheduling.step_budget import StepBudget, StepBudgetConfig


@dataclass
class FakeCost:
    """A machine whose step takes `a + c * decodes + b * prefill tokens` seconds (c None: b),
    times a seeded noise factor."""

    a: float
    b: float
    noise: float = 0.03
    seed: int = 0
    c: float | None = None

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def seconds(self, num_tokens: int, num_decodes: int = 0) -> float:
        c = self.b if self.c is None else self.c
        exact = self.a + c * num_decodes + self.b * (num_tokens - num_decodes)
        return exact * (1.0 + self.rng.uniform(-self.noise, self.noise))


def _drive(ctrl: StepBudget, cost: FakeCost, num_steps: int, num_decodes: int = 4) -> list[tuple[int, float]]:
    """Steps that always have prefill work: each uses its whole budget. Returns (tokens, seconds)."""
    trace = []
    for _ in range(num_steps):
        tokens = ctrl.budget(num_decodes, has_prefill_work=True)
        seconds = cost.seconds(tokens, num_decodes)
        ctrl.observe(tokens, seconds, num_decodes)
        trace.append((tokens, seconds))
    return trace


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_converges_to_the_target_step_time(seed: int) -> None:
    # A 2-core CPU: 40 ms a step, 2 ms per token; 200 ms target -> 80 tokens.
    ctrl = StepBudget(StepBudgetConfig(max_tokens=2048, target_step_s=0.2))
    cost = FakeCost(a=0.04, b=0.002, seed=seed)
    trace = _drive(ctrl, cost, 60)
    settled = [s for _, s in trace[15:]]  # N = 15 steps to converge
    assert abs(_mean(settled) - 0.2) < 0.01
    assert all(abs(s - 0.2) < 0.03 for s in settled)  # noise is 3% of a step; the budget 6 tokens
    assert all(abs(t - 80) <= 12 for t, _ in trace[15:])
    fitted = ctrl.stats().cost
    assert fitted is not None and fitted.per_token_s == pytest.approx(0.002, rel=0.25)


def test_adapts_when_the_cost_per_token_changes() -> None:
    ctrl = StepBudget(StepBudgetConfig(max_tokens=2048, target_step_s=0.2))
    cost = FakeCost(a=0.04, b=0.002, seed=3)
    _drive(ctrl, cost, 40)
    cost.b = 0.004  # the machine got busy: every token now costs twice as much -> 40 tokens
    trace = _drive(ctrl, cost, 90)
    assert trace[0][1] > 0.3  # the first step after the change overshoots
    # the misses while it adapts widen the margin, so the steps stay short a while, then return
    assert all(s < 0.215 for _, s in trace[15:])
    settled = trace[50:]
    assert 0.175 < _mean([s for _, s in settled]) <= 0.2  # under the target by the planned margin
    assert all(abs(t - 40) <= 8 for t, _ in settled)
    cost.b, cost.a = 0.0005, 0.01  # a faster machine: (0.2 - 0.01) / 0.0005 = 380 tokens
    trace = _drive(ctrl, cost, 60)
    # it grows at most 2x a step (no jump to 2048 on a fit it has not tested), to 380 less the
    # margin the misses of the change left: at most 25% ((0.16 - 0.012) / 0.0005 = 296)
    assert max(t for t, _ in trace) <= 512  # twice the largest step before (256: the probe's)
    assert all(290 <= t <= 390 for t, _ in trace[20:])
    assert all(s < 0.215 for _, s in trace[5:])  # past the first doublings


def test_a_fast_machine_gets_the_maximum_and_a_slow_one_the_floor() -> None:
    fast = StepBudget(StepBudgetConfig(max_tokens=512, target_step_s=0.05))
    _drive(fast, FakeCost(a=0.005, b=1e-6), 30)
    assert fast.budget(8, True) == 512
    slow = StepBudget(StepBudgetConfig(max_tokens=512, target_step_s=0.05, min_prefill_chunk=16))
    _drive(slow, FakeCost(a=0.08, b=0.01), 30)  # a decode step alone misses the target
    assert slow.budget(8, True) == 8 + 16  # every decode, plus the minimum prefill chunk
    assert slow.budget(8, False) == 8


def test_the_prefill_floor_shrinks_where_the_minimum_chunk_would_break_the_target() -> None:
    # a loaded 2-core CPU under a 300 ms interactive target: 37 ms a step, 11 ms a token; 32
    # tokens would take 352 ms on their own
    ctrl = StepBudget(StepBudgetConfig(max_tokens=512, target_step_s=0.3, min_prefill_chunk=32))
    cost = FakeCost(a=0.037, b=0.011, noise=0.0)
    _drive(ctrl, cost, 40)
    planned = 0.3 / (1.0 + ctrl.margin)
    floor = ctrl.prefill_floor(planned)
    assert 1 <= floor < 32 and floor * 0.011 <= (planned - 0.037) / 4 + 1e-9
    assert ctrl.budget(8, True) >= 8 + floor
    # decodes are not cut to one row by a chunk that cannot fit: 8 rows and the floor fit 300 ms
    capacity = ctrl.decode_capacity(0.3, True)
    assert capacity is not None and capacity >= 8
    # a fast machine keeps the whole chunk
    fast = StepBudget(StepBudgetConfig(max_tokens=512, target_step_s=0.3, min_prefill_chunk=32))
    _drive(fast, FakeCost(a=0.02, b=0.0017, noise=0.0), 40)
    assert fast.prefill_floor(0.3) == 32


def test_ttft_deadlines_keep_the_prefill_floor_up_to_the_minimum_chunk() -> None:
    # the loaded CPU above: the shrunk floor would trickle a prompt in a few tokens a step
    ctrl = StepBudget(StepBudgetConfig(max_tokens=512, target_step_s=0.3, min_prefill_chunk=32))
    _drive(ctrl, FakeCost(a=0.037, b=0.011, noise=0.0), 40)
    floor = ctrl.prefill_floor(0.3 / (1.0 + ctrl.margin))
    assert floor < 20
    assert ctrl.budget(8, True, 0.3, ttft_tokens=20) >= 8 + 20  # what the deadlines need
    assert ctrl.budget(8, True, 0.3, ttft_tokens=500) >= 8 + 32  # up to the minimum chunk
    assert ctrl.budget(8, True, 0.3, ttft_tokens=500) < 8 + 500
    assert ctrl.budget(8, False, 0.3, ttft_tokens=500) == ctrl.budget(8, False, 0.3)  # no prefill work


def test_the_lifted_step_is_priced_by_the_fit_with_the_chunk_capped() -> None:
    ctrl = StepBudget(StepBudgetConfig(max_tokens=512, target_step_s=0.3, min_prefill_chunk=32))
    assert ctrl.lifted_step_s(8, 20) is None  # nothing fitted yet
    _drive(ctrl, FakeCost(a=0.037, b=0.011, noise=0.0), 40)
    cost = ctrl.model.cost
    assert cost is not None
    assert ctrl.lifted_step_s(8, 20) == pytest.approx(cost.seconds(8 + 20, 8))
    assert ctrl.lifted_step_s(8, 500) == pytest.approx(cost.seconds(8 + 32, 8))  # the minimum chunk at most


def test_without_a_target_the_budget_is_fixed_and_the_cost_is_still_fitted() -> None:
    ctrl = StepBudget(StepBudgetConfig(max_tokens=2048))
    cost = FakeCost(a=0.04, b=0.002, seed=4)
    for tokens in [8, 500, 8, 8, 1000, 8, 300] * 3:
        assert ctrl.budget(8, True) == 2048
        ctrl.observe(tokens, cost.seconds(tokens))
    stats = ctrl.stats()
    assert stats.token_budget == 2048 and stats.target_step_s is None
    assert stats.cost is not None and stats.cost.per_token_s == pytest.approx(0.002, rel=0.1)


def test_probe_before_the_cost_is_known() -> None:
    ctrl = StepBudget(StepBudgetConfig(max_tokens=1000, target_step_s=0.1, initial_tokens=64))
    assert ctrl.stats().cost is None
    assert ctrl.budget(0, True) == 64
    ctrl.observe(64, 0.2)
    assert ctrl.budget(0, True) == 128
    ctrl.observe(128, 0.3)  # a size 64 tokens away: the slope is known now
    assert ctrl.stats().cost is not None


def test_a_fit_made_by_one_stalled_step_is_dropped_when_the_steps_keep_beating_it() -> None:
    """Measured in `weir serve`: the benchmark client's start-up held a 64-token step 1.9 s, the
    first fit made of it said 27 ms a token, and every later step of ~30 tokens (one size, which
    cannot move a slope pulled towards its last value) kept it there at a tenth of its time."""
    ctrl = StepBudget(StepBudgetConfig(max_tokens=2048, target_step_s=0.8, initial_tokens=64))
    ctrl.observe(8, 0.0365)
    ctrl.observe(64, 1.92)
    stalled = ctrl.stats().cost
    assert stalled is not None and stalled.per_token_s > 0.02
    cost = FakeCost(a=0.03, b=0.0025, noise=0.03)
    budgets = [int(t) for t, _ in _drive(ctrl, cost, 10, num_decodes=0)]
    assert ctrl.model.num_resets == ctrl.stats().num_fit_resets == 1
    assert all(b < 32 for b in budgets[:3])  # three steps in a row under half their fitted time...
    # ...then the budget probes again from those steps: twice the largest, at least the initial 64
    assert budgets[3] == max(64, 2 * max(budgets[:3])) and budgets[4] == 2 * budgets[3]
    refit = ctrl.stats().cost
    assert refit is not None and refit.per_token_s == pytest.approx(0.0025, rel=0.2)
    assert budgets[-1] > 250  # ~0.8 s of 2.5 ms tokens


def test_decode_steps_faster_than_the_fit_do_not_drop_it() -> None:
    """One or two decode rows run on one thread, eight on two: their times are not on one line
    with the rest, and the end of a run (a few streams left) must not leave the engine unfitted."""
    ctrl = StepBudget(StepBudgetConfig(max_tokens=2048, target_step_s=0.8))
    _drive(ctrl, FakeCost(a=0.04, b=0.002, noise=0.0), 40, num_decodes=8)
    for _ in range(20):
        ctrl.observe(1, 0.005, 1)  # a lone decode at an eighth of the fitted overhead
    assert ctrl.model.num_resets == 0 and ctrl.stats().cost is not None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_noisy_machine_keeps_its_fit(seed: int) -> None:
    ctrl = StepBudget(StepBudgetConfig(max_tokens=2048, target_step_s=0.2))
    _drive(ctrl, FakeCost(a=0.04, b=0.002, noise=0.3, seed=seed), 400)  # ±30% a step
    assert ctrl.model.num_resets == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 8, "target_step_s": 0.0}, "target_step_s"),
        ({"max_tokens": 8, "target_step_s": float("inf")}, "target_step_s"),
        ({"max_tokens": 8, "min_prefill_chunk": 0}, "min_prefill_chunk"),
        ({"max_tokens": 8, "forgetting": 1.0}, "forgetting"),
        ({"max_tokens": 8, "initial_tokens": 0}, "initial_tokens"),
    ],
)
def test_bad_config_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        StepBudgetConfig(**kwargs)
    if field == "target_step_s":
        with pytest.raises(ValueError, match=field):
            SchedulerConfig(target_step_s=kwargs["target_step_s"])


class StepBudgetMachine(RuleBasedStateMachine):
    """Whatever the machine does (any step costs, even a target below a step's overhead), every
    budget leaves room for each decode and, when prefill waits, the prefill floor: the minimum
    chunk, or fewer tokens (at least one) where the chunk would take over a quarter of the step."""

    def __init__(self) -> None:
        super().__init__()
        self.ctrl = StepBudget(StepBudgetConfig(max_tokens=256, target_step_s=0.1, min_prefill_chunk=16))

    @rule(
        tokens=st.integers(0, 300),
        seconds=st.one_of(st.floats(-1.0, 30.0), st.sampled_from([float("nan"), float("inf")])),
    )
    def observe(self, tokens: int, seconds: float) -> None:
        self.ctrl.observe(tokens, seconds)

    @rule(num_decodes=st.integers(0, 300), prefill=st.booleans())
    def budget(self, num_decodes: int, prefill: bool) -> None:
        floor = self.ctrl.prefill_floor(0.1 / (1.0 + self.ctrl.margin))
        budget = self.ctrl.budget(num_decodes, prefill)
        assert 0 <= budget <= 256 and 1 <= floor <= 16
        assert budget >= min(256, num_decodes + (floor if prefill else 0))
        assert budget >= 1 or not (num_decodes or prefill)

    @invariant()
    def fitted_cost_is_sane(self) -> None:
        cost = self.ctrl.stats().cost
        if cost is not None:
            assert cost.per_token_s > 0 and cost.overhead_s >= 0


TestStepBudgetMachine = StepBudgetMachine.TestCase
TestStepBudgetMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


# -- in the scheduler -------------------------------------------------------------------------


def _serve(sim: Sim, cost: FakeCost, max_steps: int = 5_000) -> list[tuple[int, float]]:
    """Run the sim to the end on the fake cost model; returns each step's budget and simulated seconds."""
    ctrl = sim.sched.step_budget
    times = []
    for _ in range(max_steps):
        if not sim.sched.has_unfinished():
            return times
        sim.step()
        out = sim.steps[-1]
        seconds = cost.seconds(out.num_tokens, out.num_decodes)
        assert out.num_tokens <= ctrl.last_budget  # the budget is applied
        ctrl.observe(out.num_tokens, seconds, out.num_decodes)
        sim.clock.now += seconds
        times.append((ctrl.last_budget, seconds))
    raise AssertionError("simulation did not finish")


def _loaded_sim(
    max_num_seqs: int, target_s: float, num_prompts: int, prompt_len: int, max_tokens: int
) -> tuple[Sim, dict[str, list[int]]]:
    """A scheduler under a target step time with `num_prompts` distinct prompts queued at once."""
    config = SchedulerConfig(
        max_num_batched_tokens=2048, max_num_seqs=max_num_seqs, max_model_len=512, target_step_s=target_s
    )
    sim = Sim(config, num_blocks=50 * num_prompts, caching=False)
    prompts = {f"r{i}": [(7 * i + j) % 50 + 1 for j in range(prompt_len)] for i in range(num_prompts)}
    for rid, prompt in prompts.items():
        sim.add(rid, prompt, max_tokens=max_tokens)
    return sim, prompts


def test_scheduler_applies_the_budget_and_keeps_the_tokens() -> None:
    sim, prompts = _loaded_sim(max_num_seqs=8, target_s=0.2, num_prompts=16, prompt_len=120, max_tokens=24)
    times = _serve(sim, FakeCost(a=0.04, b=0.002, seed=5))
    for rid, prompt in prompts.items():
        assert sim.outputs[rid] == reference_output(prompt, 24)
    steps = list(zip(times, sim.steps, strict=True))[10:]  # past the probe
    full = [s for (budget, s), out in steps if out.num_tokens == budget]
    assert len(full) > 10  # steps with prefill work use the whole budget, and take the target time
    assert all(abs(s - 0.2) < 0.03 for s in full)
    # A step never feeds more than about 80 tokens (0.2 s): a fixed budget of 2048 would have fed
    # all 8 prompts (960 tokens, 1.96 s) in the first step.
    assert max(out.num_tokens for _, out in steps) <= 100
    assert max(s for (_, s), _ in steps) < 0.23


def test_the_earliest_prompt_gets_the_budget_first() -> None:
    config = SchedulerConfig(
        max_num_batched_tokens=2048, max_num_seqs=8, max_model_len=512, target_step_s=0.2
    )
    sim = Sim(config, num_blocks=400, caching=False)
    for rid in ("a", "b", "c"):
        sim.add(rid, list(range(1, 301)), max_tokens=2)
    _serve(sim, FakeCost(a=0.04, b=0.002, seed=6))
    first_token = {}
    for step, out in enumerate(sim.steps):
        prefilling = [s for s in out.scheduled if s.num_computed_tokens < 300]
        assert [s.request_id for s in prefilling] == sorted(s.request_id for s in prefilling)
        # every chunk but the last completes its prompt: the budget is not sliced across prompts
        assert all(s.num_computed_tokens + s.num_tokens == 300 for s in prefilling[:-1])
        for s in out.scheduled:
            if s.samples:
                first_token.setdefault(s.request_id, step)
    assert first_token["a"] < first_token["b"] < first_token["c"]


@settings(max_examples=25, deadline=None)
@given(
    prompt_lens=st.lists(st.integers(1, 200), min_size=1, max_size=10),
    overhead=st.floats(0.001, 0.5),
    per_token=st.floats(1e-5, 0.05),
    target=st.floats(0.01, 0.5),
    seed=st.integers(0, 1000),
)
def test_no_waiting_request_starves(
    prompt_lens: list[int], overhead: float, per_token: float, target: float, seed: int
) -> None:
    config = SchedulerConfig(
        max_num_batched_tokens=512,
        max_num_seqs=4,
        max_model_len=512,
        target_step_s=target,
        queue_policy=QueuePolicy.FCFS,
    )
    sim = Sim(config, num_blocks=600, caching=False)
    prompts = {f"r{i}": [(i + j) % 90 + 1 for j in range(n)] for i, n in enumerate(prompt_lens)}
    for rid, prompt in prompts.items():
        sim.add(rid, prompt, max_tokens=5)
    cost = FakeCost(a=overhead, b=per_token, seed=seed)
    ctrl = sim.sched.step_budget
    for _ in range(5_000):
        if not sim.sched.has_unfinished():
            break
        # a waiting request may also be held back by the running cap: then the running ones
        # finish (bounded by max_tokens) and it is admitted, which the end of the test checks
        prefill_waits = any(r.num_remaining > 1 for r in sim.sched.running.values()) or (
            len(sim.sched.waiting) > 0
            and sim.sched.num_running < config.max_num_seqs
            and ctrl.admits(sim.sched.num_running)
        )
        sim.step()
        out = sim.steps[-1]
        if prefill_waits:  # however slow the machine, some prompt moves forward every step
            assert any(s.num_computed_tokens < len(prompts[s.request_id]) for s in out.scheduled)
        seconds = cost.seconds(out.num_tokens, out.num_decodes)
        ctrl.observe(out.num_tokens, seconds, out.num_decodes)
        sim.clock.now += seconds
    assert not sim.sched.has_unfinished()
    for rid, prompt in prompts.items():
        assert sim.outputs[rid] == reference_output(prompt, 5)


def test_a_decode_costlier_than_a_prefill_token_is_fitted_apart() -> None:
    # A CPU: 35 ms a step, 5 ms per decode row (attention over its context, logits), 1.7 ms per
    # prefill token. One slope for both would be wrong for every step shape.
    ctrl = StepBudget(StepBudgetConfig(max_tokens=2048, target_step_s=0.2))
    cost = FakeCost(a=0.035, b=0.0017, c=0.005, seed=8)
    rng = random.Random(9)
    for _ in range(80):
        decodes = rng.randint(2, 24)
        tokens = ctrl.budget(decodes, has_prefill_work=True)
        ctrl.observe(tokens, cost.seconds(tokens, decodes), decodes)
    fitted = ctrl.stats().cost
    assert fitted is not None
    assert fitted.per_decode_s == pytest.approx(0.005, rel=0.15)
    assert fitted.per_token_s == pytest.approx(0.0017, rel=0.15)
    # 20 decodes: (0.2 - 0.035 - 0.1) / 0.0017 = 38 prefill tokens
    assert abs(ctrl.budget(20, True) - (20 + 38)) <= 6
    # the cap: (0.2 - 0.035 - 32 * 0.0017) / 0.005 = 22 sequences
    cap = ctrl.max_running()
    assert cap is not None and abs(cap - 22) <= 3
    assert ctrl.admits(0) and ctrl.admits(cap - 1) and not ctrl.admits(cap)


def test_one_sequence_always_runs_and_no_target_caps_nothing() -> None:
    slow = StepBudget(StepBudgetConfig(max_tokens=512, target_step_s=0.05))
    _drive(slow, FakeCost(a=0.08, b=0.01), 30)  # one decode step alone misses the target
    assert slow.max_running() == 1 and slow.admits(0) and not slow.admits(1)
    free = StepBudget(StepBudgetConfig(max_tokens=512))
    _drive(free, FakeCost(a=0.08, b=0.01), 30)
    assert free.max_running() is None and free.admits(500)


def test_running_decodes_stay_within_the_target_under_overload() -> None:
    # 40 requests at once, decodes costlier than prefill tokens: without the cap all 32 seats
    # would run and a decode step alone would take 0.035 + 32 * 0.006 = 0.23 s > 0.15 s.
    sim, prompts = _loaded_sim(max_num_seqs=32, target_s=0.15, num_prompts=40, prompt_len=60, max_tokens=30)
    times = _serve(sim, FakeCost(a=0.035, b=0.0017, c=0.006, seed=10))
    for rid, prompt in prompts.items():
        assert sim.outputs[rid] == reference_output(prompt, 30)
    settled = [(s, len(out.scheduled)) for (_, s), out in zip(times, sim.steps, strict=True)][40:]
    assert max(n for _, n in settled) < 32  # the cap, not the seats, bounds the batch
    assert sum(s for s, _ in settled) / len(settled) < 0.16
    assert sorted(s for s, _ in settled)[int(0.95 * len(settled))] < 0.18


def test_decode_rows_over_long_contexts_are_fitted_dearer() -> None:
    # A decode row costs 2 ms plus 10 us per context token it attends over (attention): at 2,000
    # tokens of context a row costs 22 ms, at 100 tokens 3 ms. The fit finds the context term,
    # and the running cap and the decode capacity follow the contexts that run.
    ctrl = StepBudget(StepBudgetConfig(max_tokens=2048, target_step_s=0.5))
    rng = random.Random(11)
    for _ in range(200):
        decodes = rng.randint(2, 20)
        mean_ctx = rng.choice([100, 500, 1000, 2000])
        context = decodes * mean_ctx
        tokens = ctrl.budget(decodes, has_prefill_work=True, decode_context=context)
        seconds = (0.03 + 0.002 * decodes + 0.0017 * (tokens - decodes) + 1e-5 * context) * (
            1.0 + rng.uniform(-0.02, 0.02)
        )
        ctrl.observe(tokens, seconds, decodes, context)
    fitted = ctrl.stats().cost
    assert fitted is not None
    assert fitted.per_context_token_s == pytest.approx(1e-5, rel=0.25)
    short = ctrl.decode_capacity(0.3, has_prefill_work=False, mean_context=100)
    long = ctrl.decode_capacity(0.3, has_prefill_work=False, mean_context=2000)
    assert short is not None and long is not None and long * 3 < short
