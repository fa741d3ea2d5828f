"""engine/runner/mask_prefetch.py: a slow grammar mask delays only its own request.

The slow grammar here is a real compiled grammar whose matcher's mask computation waits on a
gate the test holds shut: the mask is "slow" for exactly as long as the test says, with no
timing in the assertions. A victim request beside it must get every token while the gate is
shut; the slow request then either finishes correctly once its masks arrive, or fails alone with
`grammar_timeout` once its mask has been late past the time limit (on the engine's simulated
clock), with its blocks freed.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.tiny_models import make_tiny_model
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, MaskConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.llm_engine import LLMEngine
from weir.engine.request import FinishReason, Request, SamplingParams
from weir.engine.runner.mask_prefetch import GRAMMAR_TIMEOUT, MaskPrefetcher
from weir.engine.structured.constraints import CompiledConstraint, TokenConstraint
from weir.engine.structured.grammar import ConstraintSpec, GrammarBackend

BS = 4
PATTERN = "a[a-z]{3,12}"


class _Gate:
    """Shut: every mask computation waits; open: they run. Counts the masks computed."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.num_computed = 0


class _GatedMatcher(TokenConstraint):
    def __init__(self, compiled: GatedConstraint) -> None:
        super().__init__(compiled)
        self._gate = compiled.gate

    def _compute_mask(self) -> torch.Tensor:
        self._gate.open.wait(timeout=60)  # bounded: a test that forgets to open still ends
        self._gate.num_computed += 1
        return super()._compute_mask()


@dataclass(frozen=True)
class GatedConstraint(CompiledConstraint):
    gate: _Gate = _Gate()

    def matcher(self) -> TokenConstraint:
        return _GatedMatcher(self)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("masks"), arch="llama", num_kv_heads=2)


def _engine(path: Path, clock: _Clock, timeout_s: float = 5.0) -> LLMEngine:
    return build_engine(
        EngineConfig(
            model_path=str(path),
            cache=CacheConfig(block_size=BS, num_blocks=200),
            scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256),
            masks=MaskConfig(num_workers=2, timeout_s=timeout_s, grace_s=0.0),
        ),
        clock=clock,
    )


def _gated(engine: LLMEngine) -> GatedConstraint:
    mc = engine.model_config
    backend = GrammarBackend(engine.tokenizer, mc.vocab_size, mc.eos_token_ids)
    compiled = backend.compile(ConstraintSpec.regex(PATTERN, "structured_outputs.regex"))
    return GatedConstraint(compiled.kind, compiled.grammar, gate=_Gate())


def _victim(rid: str = "victim", max_tokens: int = 24) -> EngineRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return EngineRequest(rid, (5, 6, 7, 8, 9, 10), params, tenant_id="b")


def _hostile(compiled: CompiledConstraint) -> EngineRequest:
    params = SamplingParams(max_tokens=20, temperature=1.0, seed=3)
    return EngineRequest("hostile", (11, 12, 13, 14), params, constraint=compiled, tenant_id="a")


class _Outputs:
    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.text: dict[str, str] = {}
        self.done: dict[str, tuple[FinishReason | None, str | None]] = {}

    def step(self, engine: LLMEngine) -> None:
        for o in engine.step():
            self.tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            self.text[o.request_id] = self.text.get(o.request_id, "") + o.new_text
            if o.finished:
                self.done[o.request_id] = (o.finish_reason, o.error)


def _free_blocks_all_back(engine: LLMEngine) -> bool:
    pool = engine.kv.pool
    return pool.num_free_blocks == pool.num_usable_blocks - pool.num_pinned_blocks


def test_a_victim_streams_every_token_while_a_grammar_mask_is_held(tiny: Path) -> None:
    clock = _Clock()
    engine = _engine(tiny, clock)
    compiled = _gated(engine)
    out = _Outputs()
    engine.add_request(_hostile(compiled))
    engine.add_request(_victim())
    for _ in range(200):
        if "victim" in out.done:
            break
        out.step(engine)
    assert out.done["victim"] == (FinishReason.LENGTH, None)
    assert len(out.tokens["victim"]) == 24
    assert "hostile" not in out.done and not out.tokens.get("hostile")  # it waits for its first mask
    assert engine.stats().num_grammar_masks_late >= 1
    compiled.gate.open.set()  # the masks arrive: the slow request goes on, and follows its grammar
    for _ in range(20_000):  # bounded; an idle step waits as the engine loop would, for a worker
        if not engine.has_unfinished():
            break
        out.step(engine)
        if engine.last_step_idle:
            time.sleep(0.001)
    reason, error = out.done["hostile"]
    assert error is None and reason in (FinishReason.STOP, FinishReason.LENGTH)
    text = out.text["hostile"]
    assert re.fullmatch(PATTERN, text) if reason is FinishReason.STOP else re.match("a[a-z]*$", text)
    assert compiled.gate.num_computed == len(out.tokens["hostile"])  # one mask per sampled token
    assert _free_blocks_all_back(engine)


def test_a_mask_late_past_its_limit_fails_its_request_alone(tiny: Path) -> None:
    clock = _Clock()
    engine = _engine(tiny, clock, timeout_s=2.0)
    compiled = _gated(engine)
    out = _Outputs()
    engine.add_request(_hostile(compiled))
    engine.add_request(_victim(max_tokens=64))
    try:
        for _ in range(5):
            out.step(engine)
        assert "hostile" not in out.done
        # Its time budget runs from when a worker takes its mask (workers run at the lowest priority).
        assert _wait_until(lambda: engine.masks._workers().run_started_s("hostile") is not None)
        assert engine.idle_timeout_s(60.0) <= 2.0  # an idle engine wakes for the deadline
        clock.now += 2.5
        out.step(engine)
        reason, error = out.done["hostile"]
        assert reason is FinishReason.ERROR and error is not None and GRAMMAR_TIMEOUT in error
        assert "hostile" not in engine.scheduler.requests  # its blocks are freed with it
        assert engine.stats().num_grammar_mask_timeouts == 1
        for _ in range(200):
            if not engine.has_unfinished():
                break
            out.step(engine)
        assert out.done["victim"] == (FinishReason.LENGTH, None) and len(out.tokens["victim"]) == 64
        assert _free_blocks_all_back(engine)
    finally:
        compiled.gate.open.set()


def test_masks_ready_in_time_cost_no_step(tiny: Path) -> None:
    """With the masks open, a constrained request never sits a step out (grace covers them)."""
    clock = _Clock()
    engine = build_engine(
        EngineConfig(
            model_path=str(tiny),
            cache=CacheConfig(block_size=BS, num_blocks=200),
            masks=MaskConfig(grace_s=5.0),
        ),
        clock=clock,
    )
    compiled = _gated(engine)
    compiled.gate.open.set()
    out = _Outputs()
    engine.add_request(_hostile(compiled))
    for _ in range(200):
        if not engine.has_unfinished():
            break
        out.step(engine)
    assert out.done["hostile"][1] is None
    assert engine.stats().num_grammar_masks_late == 0


# -- the prefetcher alone ------------------------------------------------------------------


class _FakeConstraint:
    """A matcher stand-in whose next mask is a future the test resolves."""

    def __init__(self) -> None:
        self.started = 0
        self.num_late_steps = 0
        self.is_terminated = False
        self._ready = threading.Event()
        self._has = False

    @property
    def has_next_mask(self) -> bool:
        return self._has

    @property
    def mask_ready(self) -> bool:
        return not self._has or self._ready.is_set()

    @property
    def late(self) -> bool:
        return self.num_late_steps > 0 and not self.mask_ready

    def start_mask(self, submit: Any, on_done: Any) -> bool:
        if self._has:
            return False
        self._has = True
        self.started += 1
        self.future = submit(lambda: self._ready.wait(10))
        return True

    def wait_mask(self, timeout_s: float) -> bool:
        return self._ready.wait(timeout_s) if self._has else True


def _request(rid: str, constraint: Any) -> Request:
    req = Request(rid, (1, 2, 3), SamplingParams(max_tokens=4))
    req.constraint = constraint
    return req


def test_the_prefetcher_starts_each_mask_once_and_times_out_the_late() -> None:
    clock = _Clock()
    masks = MaskPrefetcher(MaskConfig(timeout_s=1.0, grace_s=0.0), clock)
    slow, fast = _FakeConstraint(), _FakeConstraint()
    reqs = {"slow": _request("slow", slow), "fast": _request("fast", fast), "free": _request("free", None)}
    masks.start(reqs.values())
    masks.start(reqs.values())
    assert (slow.started, fast.started, masks.num_pending) == (1, 1, 2)
    assert _wait_until(lambda: masks._workers().run_started_s("slow") is not None)
    fast._ready.set()
    late = masks.wait_ready(reqs.values())
    assert [r.request_id for r in late] == ["slow"] and reqs["slow"].awaits_mask
    assert not reqs["fast"].awaits_mask and not reqs["free"].awaits_mask
    assert masks.overdue(reqs) == [] and masks.num_pending == 1  # the ready one is forgotten
    assert masks.next_deadline_s() == pytest.approx(clock.now + 1.0)
    clock.now += 1.0
    ((rid, error),) = masks.overdue(reqs)
    assert rid == "slow" and error.startswith(GRAMMAR_TIMEOUT) and "sat out 1 steps" in error
    assert masks.num_pending == 0 and masks.num_timeouts == 1 and masks.num_late_rows == 1
    assert masks.next_deadline_s() is None
    slow._ready.set()
    masks.close()


def _wait_until(check: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_time_queued_behind_other_masks_is_not_charged_to_the_request() -> None:
    # One worker, no room to grow: b's mask waits while a's runs. Its 1 s budget starts only when
    # a worker takes it; until then only the (longer) queue budget runs.
    clock = _Clock()
    masks = MaskPrefetcher(
        MaskConfig(num_workers=1, max_workers=1, timeout_s=1.0, queue_timeout_s=30.0), clock
    )
    first, queued = _FakeConstraint(), _FakeConstraint()
    reqs = {"a": _request("a", first), "b": _request("b", queued)}
    masks.start(reqs.values())
    assert _wait_until(lambda: masks._workers().run_started_s("a") is not None)
    clock.now += 0.9
    assert masks.next_deadline_s() == pytest.approx(clock.now + 0.1)  # a's 1 s, a's run started first
    first._ready.set()
    assert _wait_until(lambda: masks._workers().run_started_s("b") is not None)
    assert masks.overdue(reqs) == []  # a is ready; b ran for 0 s of its budget
    assert masks.next_deadline_s() == pytest.approx(clock.now + 1.0)
    clock.now += 0.99
    assert masks.overdue(reqs) == []
    queued._ready.set()
    masks.close()


def test_a_mask_that_never_gets_a_worker_fails_after_the_queue_budget() -> None:
    clock = _Clock()
    masks = MaskPrefetcher(
        MaskConfig(num_workers=1, max_workers=1, timeout_s=1.0, queue_timeout_s=3.0), clock
    )
    hog, starved = _FakeConstraint(), _FakeConstraint()
    reqs = {"hog": _request("hog", hog), "starved": _request("starved", starved)}
    masks.start([reqs["hog"]])
    assert _wait_until(lambda: masks._workers().run_started_s("hog") is not None)
    masks.start([reqs["starved"]])
    clock.now += 2.0
    failed = dict(masks.overdue(reqs))
    assert set(failed) == {"hog"} and "1 s" in failed["hog"]  # the hog's own budget ran out
    clock.now += 1.0
    failed = dict(masks.overdue(reqs))
    assert set(failed) == {"starved"} and "3 s" in failed["starved"]
    hog._ready.set()
    starved._ready.set()
    masks.close()


def test_mask_config_is_validated() -> None:
    for bad in (
        {"num_workers": 0},
        {"num_workers": 3, "max_workers": 2},
        {"queue_timeout_s": 0.0},
        {"timeout_s": 0.0},
        {"grace_s": -1.0},
        {"timeout_s": 1.0, "grace_s": 2.0},
    ):
        with pytest.raises(ValueError):
            MaskConfig(**bad)
