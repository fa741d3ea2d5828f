"""The scheduler's SLO planning on a simulated clock (engine/scheduling/step_plan.py, Scheduler.schedule).

A CPU-like machine: a step takes `35 ms + 20 ms per decode row + 1.7 ms per prefill token`
(seeded 3% noise). Every second here is computed by that model, never measured; the "ITL" and
"TTFT" checked are the simulated times the scheduler's own plan produces.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tests.engine.latency_scenarios import SCENARIO_CLASS_TARGETS
from tests.engine.scheduling.test_step_budget import FakeCost
from tests.engine.sim import Sim, next_token, reference_output, sim_request
from weir.engine.config import QueuePolicy, SchedulerConfig
from weir.engine.request import Priority, Request
from weir.engine.scheduling.slo_tally import PreemptReason


@dataclass
class TimedSim:
    """The sim with each step taking the fake machine's time, fed back to the step budget."""

    sim: Sim
    cost: FakeCost
    caps: list[int | None] = field(default_factory=list)
    preempted_at: dict[str, list[int]] = field(default_factory=dict)
    step_no: int = 0
    busy_tokens: int = 0
    prefill_served: Counter[str] = field(default_factory=Counter)  # prompt tokens per tenant

    @property
    def sched(self):  # noqa: ANN201 - the sim's scheduler
        return self.sim.sched

    def add(
        self, rid: str, n: int, max_tokens: int, tenant: str, priority: Priority, weight: float = 1.0
    ) -> Request:
        prompt = [(hash(rid) + j) % 97 + 1 for j in range(n)]
        req = sim_request(
            rid,
            prompt,
            max_tokens,
            tenant_id=tenant,
            priority=priority,
            weight=weight,
            arrival_s=self.sim.clock.now,
        )
        self.sched.add_request(req)
        self.sim.outputs[rid] = []
        return req

    def step(self) -> None:
        sched, clock = self.sched, self.sim.clock
        out = sched.schedule()
        self.step_no += 1
        for rid in out.preempted_ids:
            self.preempted_at.setdefault(rid, []).append(self.step_no)
        seconds = self.cost.seconds(out.num_tokens, out.num_decodes) if out.num_tokens else 0.01
        clock.now += seconds
        if out.num_tokens:
            sched.step_budget.observe(out.num_tokens, seconds, out.num_decodes, out.num_decode_context_tokens)
        self.busy_tokens += out.num_tokens
        sampled = {}
        for s in out.scheduled:
            req = sched.requests[s.request_id]
            self.sim.served[req.tenant_id] = self.sim.served.get(req.tenant_id, 0) + s.num_tokens
            prompt_part = min(s.num_tokens, max(0, req.num_prompt_tokens - s.num_computed_tokens))
            self.prefill_served[req.tenant_id] += prompt_part
            if s.samples:
                sampled[s.request_id] = next_token(req.all_token_ids)
        update = sched.update_from_output(out, sampled)
        assert not update.failed
        for a in update.appended:
            self.sim.outputs[a.request.request_id].append(a.token_id)
        self.caps.append(sched.step_budget.max_running())


def _timed(
    per_decode_s: float = 0.02,
    min_residency_steps: int = 16,
    max_num_seqs: int = 64,
    num_blocks: int = 20_000,
) -> TimedSim:
    """A 2,048-token, 64-seat scheduler with the CPU's class targets and an 800 ms throughput step."""
    config = SchedulerConfig(
        max_num_batched_tokens=2048,
        max_num_seqs=max_num_seqs,
        max_model_len=2048,
        queue_policy=QueuePolicy.FAIR,
        target_step_s=0.8,
        class_targets=SCENARIO_CLASS_TARGETS,
        min_residency_steps=min_residency_steps,
    )
    sim = Sim(config, num_blocks=num_blocks, block_size=16, caching=False)
    return TimedSim(sim, FakeCost(a=0.035, b=0.0017, c=per_decode_s, seed=4))


def _itls(req: Request) -> list[float]:
    return req.times.itl_s


def test_interactive_decodes_keep_their_itl_while_a_batch_tenant_floods() -> None:
    t = _timed()
    for i in range(48):
        t.add(f"b{i}", 200, 80, "flood", Priority.BATCH)
    for _ in range(40):  # the flood fills the machine and the fit settles
        t.step()
    chats = []
    for k in range(6):
        chats.append(t.add(f"q{k}", 60, 24, "quiet", Priority.INTERACTIVE))
        for _ in range(15):
            t.step()
    for _ in range(400):
        if all(c.is_finished for c in chats):
            break
        t.step()
    assert all(c.is_finished for c in chats)
    gaps = sorted(g for c in chats for g in _itls(c))
    # every inter-token gap of the chats within the 300 ms target, up to the fit's noise (3%)
    # and the first plan after an arrival (the cost fit is not exact): p95 within target
    assert gaps[int(0.95 * len(gaps))] <= 0.3
    assert gaps[-1] <= 0.3 * 1.25
    # their first tokens came within their 2 s TTFT target, as the engine's own tally says
    counts = {(c.priority, c.tenant_id): c for c in t.sched.slo.stats().counts}
    quiet = counts[(Priority.INTERACTIVE, "quiet")]
    assert quiet.ttft_met == 6 and quiet.ttft_missed == 0
    # the flood was not stopped: its decodes rotated through the room the 300 ms steps left,
    # and every batch request running while the chats ran got tokens in that time
    assert t.sched.num_deferred_decodes > 0
    flood = [r for r in t.sched.running.values() if r.tenant_id == "flood" and r.times.token_s]
    assert flood and all(r.times.token_s[-1] >= chats[-1].times.first_token_s - 5.0 for r in flood)


def test_batch_alone_gets_the_throughput_step() -> None:
    t = _timed()
    for i in range(30):
        t.add(f"b{i}", 100, 40, "flood", Priority.BATCH)
    steps_s = []
    for _ in range(120):
        before = t.sim.clock.now
        t.step()
        steps_s.append(t.sim.clock.now - before)
    budget = t.sched.step_budget
    assert budget.last_target_s == 0.8  # no ITL target runs: the throughput-optimal step
    assert t.sched.num_deferred_decodes == 0  # nothing sits out
    settled = steps_s[30:]
    assert max(settled) > 0.3  # steps grow past any interactive target when only batch runs


def test_interactive_returns_and_batch_gets_everything_again_when_it_leaves() -> None:
    t = _timed()
    for i in range(40):
        t.add(f"b{i}", 100, 200, "flood", Priority.BATCH)
    for _ in range(30):
        t.step()
    chat = t.add("q", 40, 10, "quiet", Priority.INTERACTIVE)
    while not chat.is_finished:
        t.step()
    deferred = t.sched.num_deferred_decodes
    for _ in range(20):
        t.step()
    assert t.sched.step_budget.last_target_s == 0.8
    assert t.sched.num_deferred_decodes == deferred  # interactive idle: batch is not held back


def _both_want_more(t: TimedSim, tenants: set[str]) -> bool:
    """Each tenant has more prompt left running than a whole step's budget (so neither is
    satisfied before its share: max-min fairness gives the other the rest otherwise)."""
    left: Counter[str] = Counter()
    for r in t.sched.running.values():
        if r.num_remaining > 1:
            left[r.tenant_id] += r.num_remaining
    return all(left[x] > 2048 // 4 for x in tenants)


def test_a_tenant_share_of_prefill_within_a_class_follows_the_weights() -> None:
    t = _timed()
    # one tenant floods with long prompts (n=16-like: 16 at a time); the other sends a few
    for i in range(16):
        t.add(f"a{i}", 1800, 4, "attacker", Priority.STANDARD, weight=1.0)
    for i in range(4):
        t.add(f"v{i}", 1800, 4, "victim", Priority.STANDARD, weight=1.0)
    served: Counter[str] = Counter()
    for _ in range(60):
        before = Counter(t.prefill_served)
        both = _both_want_more(t, {"attacker", "victim"})
        t.step()
        if both:
            served.update(t.prefill_served - before)
    assert served["victim"] > 0
    ratio = served["attacker"] / served["victim"]
    assert 0.85 <= ratio <= 1.15  # equal weights: equal prefill per step, not 16:4

    w = _timed()
    for i in range(8):
        w.add(f"a{i}", 1800, 4, "heavy", Priority.STANDARD, weight=2.0)
        w.add(f"v{i}", 1800, 4, "light", Priority.STANDARD, weight=1.0)
    served = Counter()
    for _ in range(40):
        before = Counter(w.prefill_served)
        both = _both_want_more(w, {"heavy", "light"})
        w.step()
        if both:
            served.update(w.prefill_served - before)
    assert 1.7 <= served["heavy"] / served["light"] <= 2.3


def _collapse_scenario(min_residency_steps: int) -> TimedSim:
    """Issue 24's reverted attempt: batch holds every running seat the cap allows, interactive
    chats keep arriving and displace batch past the cap."""
    t = _timed(per_decode_s=0.05, min_residency_steps=min_residency_steps)  # a cap of ~14 seats
    for i in range(60):
        t.add(f"b{i}", 150, 120, "flood", Priority.BATCH)
    for k in range(300):
        if k % 6 == 0 and k // 6 < 40:
            t.add(f"q{k}", 60, 16, "quiet", Priority.INTERACTIVE)
        t.step()
    return t


def test_slo_preemption_does_not_ping_pong() -> None:
    t = _collapse_scenario(min_residency_steps=16)
    slo_preemptions = t.sched.slo.stats().preempted(PreemptReason.SLO)
    assert slo_preemptions > 0  # the scenario does displace
    for rid, steps in t.preempted_at.items():
        # a request resumed is resident 16 steps before it may be preempted again
        assert all(b - a > 16 for a, b in zip(steps, steps[1:], strict=False)), (rid, steps)


def test_the_collapse_scenario_stays_stable() -> None:
    t = _collapse_scenario(min_residency_steps=16)
    caps = [c for c in t.caps[60:] if c is not None]
    # the running cap holds within its hysteresis band instead of swinging (10 <-> 16 before)
    assert max(caps) - min(caps) <= max(2, max(caps) // 4)
    # the machine keeps working: every step fed tokens, and most requests advanced
    assert t.busy_tokens > 0
    quiet = [r for r in t.sched.requests.values() if r.tenant_id == "quiet"]
    done_quiet = [rid for rid in t.sim.outputs if rid.startswith("q") and rid not in t.sched.requests]
    assert len(done_quiet) >= 30 and len(quiet) <= 10
    for rid in done_quiet:
        n = 60
        prompt = [(hash(rid) + j) % 97 + 1 for j in range(n)]
        assert t.sim.outputs[rid] == reference_output(prompt, 16)  # preemptions changed no token
    counts = {(c.priority, c.tenant_id): c for c in t.sched.slo.stats().counts}
    assert counts[(Priority.INTERACTIVE, "quiet")].ttft_met >= 0.9 * len(done_quiet)


def test_without_a_minimum_residency_the_scenario_ping_pongs() -> None:
    """The reproduction: the same scenario with a residency of one step preempts requests again
    within a few steps of their return (what the reverted attempt did); 16 steps stop it above."""
    t = _collapse_scenario(min_residency_steps=1)
    gaps = [b - a for steps in t.preempted_at.values() for a, b in zip(steps, steps[1:], strict=False)]
    assert any(g <= 16 for g in gaps)


def _decoding(t: TimedSim, tenants: set[str]) -> bool:
    """Every tenant named has decodes running and none of its prompts left to compute."""
    running = list(t.sched.running.values())
    return all(
        any(r.tenant_id == x and r.num_remaining == 1 for r in running)
        and not any(r.tenant_id == x and r.num_remaining > 1 for r in running)
        for x in tenants
    )


def test_one_tenant_with_sixteen_rows_does_not_stretch_another_tenants_steps() -> None:
    t = _timed()
    wide = [t.add(f"w{i}", 40, 60, "wide", Priority.INTERACTIVE) for i in range(16)]  # n = 16-like
    lone = t.add("v", 40, 40, "lone", Priority.INTERACTIVE)
    for _ in range(400):
        if lone.is_finished:
            break
        t.step()
    assert lone.is_finished
    gaps = sorted(_itls(lone))
    # 17 decode rows would take 35 + 17 x 20 = 375 ms a step; the wide tenant's rows share what a
    # 300 ms step holds, and the lone row is within its share every step (up to the fit's noise
    # and the first plans, made before the cost fit settles)
    assert gaps[int(0.9 * len(gaps))] <= 0.3
    assert gaps[-1] <= 0.3 * 1.25
    assert t.sched.num_deferred_decodes > 0
    for _ in range(600):
        if all(r.is_finished for r in wide):
            break
        t.step()
    assert all(r.is_finished for r in wide)  # its rows rotated: every one of them finished


def _victim_chats(t: TimedSim, count: int, every_steps: int) -> list[Request]:
    chats = []
    for k in range(count):
        chats.append(t.add(f"v{k}", 30, 4, "victim", Priority.STANDARD))
        for _ in range(every_steps):
            t.step()
    return chats


def test_a_first_answer_does_not_wait_for_another_tenants_sixteen_rows() -> None:
    alone = _timed(per_decode_s=0.005)
    alone.add("warm", 30, 40, "victim", Priority.STANDARD)  # the cost fit settles first
    for _ in range(30):
        alone.step()
    ttft_alone = [c.times.ttft_s for c in _victim_chats(alone, 8, 12)]

    t = _timed(per_decode_s=0.005)
    beams = [t.add(f"a{i}", 8, 400, "attacker", Priority.STANDARD) for i in range(16)]  # beam 16-like
    for _ in range(30):
        t.step()
    chats = _victim_chats(t, 8, 12)
    assert all(c.is_finished for c in chats)
    for c in chats:
        # the step that gave the chat its first token ran without the attacker's rows
        assert not any(c.times.first_token_s in r.times.token_s for r in beams)
    ttft = [c.times.ttft_s for c in chats]
    assert all(x is not None for x in ttft + ttft_alone)
    # 16 rows cost 80 ms a step here (SmolLM2's 16 beam rows: 41 ms): a chat waits for at most
    # the step running when it arrives, and its own step is the one it would take alone
    assert max(ttft) <= max(ttft_alone) + 35e-3 + 16 * 5e-3 + 0.02  # type: ignore[operator]
    # the rows never sat out two steps in a row, and went on within their ITL target
    for r in beams:
        assert max(_itls(r)) <= 0.8
    assert t.sched.num_deferred_decodes > 0


def test_the_tenant_with_more_rows_cannot_push_out_a_lone_row_with_its_first_answers() -> None:
    t = _timed()
    lone = t.add("lone", 30, 120, "victim", Priority.STANDARD)
    for _ in range(5):
        t.step()
    for k in range(40):  # a new short chat from the attacker every step, beside its rows
        t.add(f"a{k}", 30, 60, "attacker", Priority.STANDARD)
        t.step()
    # every step the lone row was in gave it a token: it never sat out for the attacker
    assert len(lone.output_token_ids) >= 40


def test_a_tenant_share_of_decode_rows_within_a_class_follows_the_weights() -> None:
    t = _timed()
    for i in range(16):
        t.add(f"h{i}", 30, 200, "heavy", Priority.INTERACTIVE, weight=2.0)
        t.add(f"l{i}", 30, 200, "light", Priority.INTERACTIVE, weight=1.0)
    served: Counter[str] = Counter()
    for _ in range(120):
        before = Counter(t.sim.served)
        both = _decoding(t, {"heavy", "light"})
        t.step()
        if both:
            served.update(Counter(t.sim.served) - before)
    assert served["light"] > 0
    assert 1.7 <= served["heavy"] / served["light"] <= 2.3  # 2:1 by weight, not 16:16 rows


def _run_until(t: TimedSim, reqs: list[Request], max_steps: int) -> None:
    for _ in range(max_steps):
        if all(r.is_finished for r in reqs):
            return
        t.step()


def test_a_tenant_holding_every_seat_of_its_class_makes_room_for_another() -> None:
    t = _timed(max_num_seqs=16)
    wide = [t.add(f"w{i}", 30, 150, "wide", Priority.STANDARD) for i in range(16)]  # beam 16-like
    for _ in range(20):
        t.step()
    lone = [t.add(f"v{i}", 30, 20, "lone", Priority.STANDARD) for i in range(4)]
    _run_until(t, lone, 200)
    assert all(r.is_finished for r in lone)  # long before the wide tenant's 150-token answers end
    assert not all(r.is_finished for r in wide)
    stats = t.sched.slo.stats()
    assert stats.preempted(PreemptReason.FAIR_SHARE) > 0
    # only the tenant over its share was preempted, each request at most once per residency
    assert all(rid.startswith("w") for rid in t.preempted_at)
    for steps in t.preempted_at.values():
        assert all(b - a > 16 for a, b in zip(steps, steps[1:], strict=False))
    _run_until(t, wide, 2000)
    for r in [*wide, *lone]:  # preemption changed no token
        prompt = [(hash(r.request_id) + j) % 97 + 1 for j in range(30)]
        assert t.sim.outputs[r.request_id] == reference_output(prompt, r.sampling_params.max_tokens)


def test_within_its_share_a_tenant_is_not_preempted_for_another() -> None:
    t = _timed(max_num_seqs=8)
    mine = [t.add(f"a{i}", 30, 120, "a", Priority.STANDARD) for i in range(4)]
    theirs = [t.add(f"b{i}", 30, 120, "b", Priority.STANDARD) for i in range(4)]
    for _ in range(20):
        t.step()
    more = [t.add(f"b{i}", 30, 10, "b", Priority.STANDARD) for i in range(4, 8)]
    for _ in range(60):
        t.step()
    # b already holds its half of the seats: its new requests wait, a keeps its seats
    assert t.sched.slo.stats().preempted(PreemptReason.FAIR_SHARE) == 0
    assert not any(r.is_finished for r in more) or all(r.is_finished for r in theirs)
    assert all(r.num_preemptions == 0 for r in mine)


def test_a_tenant_holding_the_kv_pool_makes_room_for_another_of_its_class() -> None:
    # 48 blocks of 16 tokens; two long answers of one tenant fill the pool as they grow
    t = _timed(num_blocks=48)
    hogs = [t.add(f"h{i}", 16, 370, "hog", Priority.BATCH) for i in range(2)]
    for _ in range(400):
        if t.sched.kv.num_free_blocks < 4:
            break
        t.step()
    assert t.sched.kv.num_free_blocks < 4
    small = t.add("s", 40, 8, "small", Priority.BATCH)
    _run_until(t, [small], 100)
    assert small.is_finished and small.num_preemptions == 0
    assert t.sched.slo.stats().preempted(PreemptReason.FAIR_SHARE) >= 1
    _run_until(t, hogs, 3000)
    for r in hogs:
        prompt = [(hash(r.request_id) + j) % 97 + 1 for j in range(16)]
        assert t.sim.outputs[r.request_id] == reference_output(prompt, 370)


def test_looser_classes_keep_moving_when_owed_decodes_fill_every_step() -> None:
    # decode rows so dear that the interactive tenant's owed rows alone fill a 300 ms step
    t = _timed(per_decode_s=0.06)
    slow = [t.add(f"s{i}", 30, 30, "noisy", Priority.STANDARD) for i in range(4)]
    for _ in range(10):
        t.step()
    chats = [t.add(f"q{i}", 30, 200, "quiet", Priority.INTERACTIVE) for i in range(6)]
    _run_until(t, slow, 400)
    # every standard request still finished while the chats ran: one looser row a step at least
    assert all(r.is_finished for r in slow)
    assert not all(c.is_finished for c in chats)  # ... before the chats ended
    assert t.sched.num_deferred_decodes > 0


def test_a_chat_arriving_on_a_loaded_cpu_is_not_trickled_past_its_ttft() -> None:
    # The served machine of the noisy-neighbour trace: ~240 ms a step before its rows and tokens,
    # 5 ms a prompt token, 8 ms a row. A quarter of what a 300 ms step leaves after that overhead
    # holds ~3 tokens: the shrunk prefill floor took a 70-token chat 20 steps (6 s) to its first
    # token. Its TTFT deadline keeps the floor at what the steps left need.
    t = _timed()
    t.cost = FakeCost(a=0.24, b=0.005, c=0.008, seed=7)
    first = t.add("q0", 60, 400, "quiet", Priority.INTERACTIVE)
    for _ in range(60):  # the first chat decodes and the fit settles on the loaded machine
        t.step()
    floor = t.sched.step_budget.prefill_floor(0.3 / (1.0 + t.sched.step_budget.margin))
    assert floor < 12  # the shrunk floor alone would trickle
    chat = t.add("q1", 70, 8, "quiet", Priority.INTERACTIVE)
    for _ in range(60):
        if chat.is_finished:
            break
        t.step()
    assert chat.times.first_token_s is not None
    assert chat.times.first_token_s - chat.arrival_s <= 2.0
    gaps = sorted(_itls(first)[-20:])  # the running chat kept its ITL meanwhile (3% noise)
    assert gaps[-1] <= 0.3 * 1.1


def test_chats_arriving_together_on_a_loaded_cpu_all_keep_their_ttft() -> None:
    # Two chats of the same tenant at once on the loaded machine above. They are served one after
    # the other, so the second finishes only after both prompts: the floor must cover the tokens
    # of the one before it over its own steps left, not its own alone, and count the steps at
    # the time a step feeding them takes (~400 ms here, not the 300 ms target). Without either,
    # the second chat's first token came after 2.2-2.7 s. (A third at once does not fit: the
    # floor stops at the 32-token minimum chunk, for the running stream's ITL.)
    t = _timed()
    t.cost = FakeCost(a=0.24, b=0.005, c=0.008, seed=7)
    first = t.add("q0", 60, 400, "quiet", Priority.INTERACTIVE)
    for _ in range(60):
        t.step()
    chats = [t.add(f"q{i}", 70, 8, "quiet", Priority.INTERACTIVE) for i in range(1, 3)]
    for _ in range(80):
        if all(c.is_finished for c in chats):
            break
        t.step()
    for chat in chats:
        assert chat.times.first_token_s is not None
        assert chat.times.first_token_s - chat.arrival_s <= 2.0, chat.request_id
    assert first.times.first_token_s is not None and not first.is_finished
