"""The stall watchdog: counting, and an engine whose scheduler stops feeding tokens is caught,
logged, counted and unstuck by a preemption, with every request still finishing correctly."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.engine.tiny_models import make_tiny_model
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.llm_engine import LLMEngine
from weir.engine.output import SchedulerOutput
from weir.engine.request import SamplingParams
from weir.engine.scheduling.stall_watchdog import StallWatchdog


def test_a_stall_is_reported_after_the_configured_steps_and_counted_once() -> None:
    dog = StallWatchdog(max_stalled_steps=3)
    assert [dog.observe(0, has_work=True) for _ in range(3)] == [False, False, True]
    assert dog.num_stalls == 1 and dog.num_stalled_steps == 0
    assert [dog.observe(0, has_work=True) for _ in range(3)] == [False, False, True]  # persists: again
    assert dog.num_stalls == 2


def test_tokens_or_no_work_reset_the_count() -> None:
    dog = StallWatchdog(max_stalled_steps=2)
    assert not dog.observe(0, has_work=True)
    assert not dog.observe(5, has_work=True)  # a token: progress
    assert not dog.observe(0, has_work=True)
    assert not dog.observe(0, has_work=False)  # nothing to do is not a stall
    assert not dog.observe(0, has_work=True)
    assert dog.num_stalls == 0


def test_the_threshold_is_validated() -> None:
    with pytest.raises(ValueError, match="max_stalled_steps"):
        StallWatchdog(max_stalled_steps=0)
    with pytest.raises(ValueError, match="max_stalled_steps"):
        SchedulerConfig(max_stalled_steps=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("stall"), arch="llama", max_position_embeddings=256)


def _engine(path: Path) -> LLMEngine:
    return build_engine(
        EngineConfig(
            model_path=str(path),
            cache=CacheConfig(block_size=4, num_blocks=64),
            scheduler=SchedulerConfig(max_num_batched_tokens=64, max_model_len=128, max_stalled_steps=5),
        )
    )


def _run(engine: LLMEngine, num_steps: int = 2_000) -> dict[str, list[int]]:
    params = SamplingParams(max_tokens=6, temperature=0.0)
    for i, prompt in enumerate(([5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19])):
        engine.add_request(EngineRequest(f"r{i}", tuple(prompt), params))
    out: dict[str, list[int]] = {f"r{i}": [] for i in range(3)}
    for _ in range(num_steps):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
    assert not engine.has_unfinished()
    return out


def test_a_scheduler_that_stops_feeding_tokens_is_logged_counted_and_unstuck(
    tiny: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reference = _run(_engine(tiny))
    engine = _engine(tiny)
    real_schedule = engine.scheduler.schedule
    calls = {"n": 0}

    def broken_schedule() -> SchedulerOutput:
        """Schedules the first step, then returns empty steps (a bug) until a preemption happens."""
        calls["n"] += 1
        if calls["n"] == 1 or engine.scheduler.num_preemptions:
            return real_schedule()
        return SchedulerOutput(scheduled=())

    engine.scheduler.schedule = broken_schedule  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="weir.engine"):
        ours = _run(engine)
    assert engine.watchdog.num_stalls == 1
    assert engine.stats().num_stalls == 1
    assert engine.scheduler.num_preemptions == 1
    (record,) = [r for r in caplog.records if "engine stall" in r.getMessage()]
    assert "running 3, waiting 0" in record.getMessage()  # the state that explains it
    assert ours == reference  # the victim recomputed: nothing lost, nothing changed
