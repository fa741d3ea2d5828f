"""Issue 10, the engine survives itself: the async loop restarts after an exception it could not
contain, never spins when nothing is schedulable, and detokenizes on its own tokenizer copy.

Bounded: every wait polls a condition a fixed number of times; no timing thresholds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from tests.engine.tiny_models import make_tiny_model
from weir.engine.async_engine import AsyncEngine
from weir.engine.client import EngineHealth, EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.errors import EngineDeadError, RetryableEngineError
from weir.engine.faults import FaultInjector
from weir.engine.llm_engine import LLMEngine
from weir.engine.output import RequestOutput
from weir.engine.request import FinishReason, Request, SamplingParams

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("async-faults"), arch="llama", num_kv_heads=2, max_position_embeddings=256
    )


def _core(path: Path, faults: FaultInjector | None = None, num_blocks: int = 64) -> LLMEngine:
    return build_engine(
        EngineConfig(
            model_path=str(path),
            cache=CacheConfig(block_size=16, num_blocks=num_blocks),
            scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=256),
        ),
        faults=faults,
    )


async def _collect(engine: AsyncEngine, rid: str, prompt: tuple[int, ...]) -> list[RequestOutput]:
    return [o async for o in engine.generate(EngineRequest(rid, prompt, GREEDY))]


async def _poll(predicate, attempts: int = 200) -> bool:  # type: ignore[no-untyped-def]
    for _ in range(attempts):
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return bool(predicate())


class _SchedulerFaults(FaultInjector):
    """Raises in the scheduler while armed (`remaining` times); records health during restarts."""

    def __init__(self) -> None:
        self.remaining = 0
        self.engine: AsyncEngine | None = None
        self.health_during_restart: list[EngineHealth] = []

    def before_schedule(self) -> None:
        if self.remaining > 0:
            self.remaining -= 1
            raise RuntimeError("injected scheduler fault")

    def on_restart(self) -> None:
        assert self.engine is not None
        self.health_during_restart.append(self.engine.health())


def test_a_scheduler_fault_restarts_the_loop_on_a_clean_state(tiny: Path) -> None:
    async def main() -> None:
        faults = _SchedulerFaults()
        core = _core(tiny, faults)
        engine = faults.engine = AsyncEngine(core=core)
        await engine.start(warmup=False)
        try:
            assert engine.health().ready
            faults.remaining = 1
            with pytest.raises(RetryableEngineError):
                await _collect(engine, "in-flight", (5, 6, 7))
            assert [h.ready for h in faults.health_during_restart] == [False]
            assert faults.health_during_restart[0].alive
            assert engine.health().ready and engine.stats().num_restarts == 1
            later = await _collect(engine, "later", (5, 6, 7))
            assert later[-1].finish_reason is FinishReason.LENGTH and len(later) == GREEDY.max_tokens
            assert await _poll(lambda: engine.stats().num_free_blocks == engine.stats().num_total_blocks)
        finally:
            await engine.shutdown()

    asyncio.run(main())


def test_too_many_restarts_in_the_window_mean_dead(tiny: Path) -> None:
    async def main() -> None:
        faults = _SchedulerFaults()
        faults.remaining = 10**6  # the fault never goes away
        engine = faults.engine = AsyncEngine(core=_core(tiny, faults), max_restarts=2, restart_window_s=3600)
        await engine.start(warmup=False)
        try:
            for i in range(3):  # restarts 1 and 2 are allowed, the third is one too many
                with pytest.raises((RetryableEngineError, EngineDeadError)) as info:
                    await _collect(engine, f"r{i}", (5, 6))
            assert info.type is EngineDeadError
            assert await _poll(lambda: not engine.health().alive)
            with pytest.raises(EngineDeadError):
                await _collect(engine, "after", (5, 6))
        finally:
            await engine.shutdown()

    asyncio.run(main())


def test_the_engine_thread_sleeps_when_nothing_is_schedulable(tiny: Path) -> None:
    """Defect 2: a request that can never be admitted made the loop step in a busy loop."""

    async def main() -> None:
        core = _core(tiny, num_blocks=9)  # 8 usable blocks: 128 tokens
        stuck = Request("stuck", [5] * 20, SamplingParams(max_tokens=8))
        stuck.output_token_ids = [6] * 200  # forced in past validation: it can never be admitted
        core.scheduler.add_request(stuck)
        engine = AsyncEngine(core=core)
        await engine.start(warmup=False)
        try:
            assert await _poll(lambda: engine.num_idle_waits >= 3)
            # Every step was idle and each was followed by a sleep (a spinning loop would have run
            # thousands of steps by now, with no sleep between them).
            assert engine.num_steps <= engine.num_idle_waits + 1
            assert engine.health().ready
        finally:
            await engine.shutdown()

    asyncio.run(main())


def test_the_engine_thread_detokenizes_with_its_own_tokenizer(tiny: Path) -> None:
    """Fast tokenizers must not be shared across threads ("Already borrowed"): the gateway encodes
    on its threads with the callers' tokenizer while the engine thread decodes with its copy."""
    core = _core(tiny)
    assert core._engine_tokenizer is not core.tokenizer
    assert core.beams.tokenizer is core._engine_tokenizer
    gateway_tokenizer = core.tokenizer
    text = "The quick brown fox jumps over the lazy dog. " * 40
    errors: list[BaseException] = []
    stop = threading.Event()

    def hammer(i: int) -> None:
        n = 0
        while not stop.is_set():
            try:
                gateway_tokenizer([text] * 2, truncation=True, max_length=8 + (n + i) % 40)
                gateway_tokenizer.encode(text, add_special_tokens=True)
                gateway_tokenizer.decode(list(range(3, 60)))
            except BaseException as exc:  # noqa: BLE001 - any error here is the failure under test
                errors.append(exc)
                return
            n += 1

    async def main() -> list[list[int]]:
        engine = AsyncEngine(core=core)
        await engine.start(warmup=False)
        try:
            runs = [_collect(engine, f"r{i}", tuple(range(3 + i, 40 + i))) for i in range(8)]
            return [[t for o in outs for t in o.new_token_ids] for outs in await asyncio.gather(*runs)]
        finally:
            await engine.shutdown()

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    try:
        started = time.monotonic()
        tokens = asyncio.run(main())
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    assert all(len(t) == GREEDY.max_tokens for t in tokens), time.monotonic() - started
