"""AsyncEngine: streams across threads, validation on the engine thread, one abort per request.

Bounded: every wait polls a condition a fixed number of times; no timing thresholds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tests.engine.tiny_models import make_tiny_model
from weir.engine.async_engine import AsyncEngine
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.errors import InvalidRequestError
from weir.engine.llm_engine import LLMEngine
from weir.engine.output import RequestOutput
from weir.engine.request import FinishReason, SamplingParams

LONG = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
SHORT = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("async-engine"), arch="llama", num_kv_heads=2, max_position_embeddings=256
    )


class _Recorded:
    """The core's abort and validate calls, with the thread each ran on."""

    def __init__(self, core: LLMEngine) -> None:
        self.aborts: list[str] = []
        self.validate_threads: list[str] = []
        abort, validate = core.abort, core.validate

        def recording_abort(request_id: str) -> list[RequestOutput]:
            self.aborts.append(request_id)
            return abort(request_id)

        def recording_validate(er: EngineRequest) -> None:
            self.validate_threads.append(threading.current_thread().name)
            validate(er)

        core.abort = recording_abort  # type: ignore[method-assign]
        core.validate = recording_validate  # type: ignore[method-assign]


def _run(tiny: Path, body: Callable[[AsyncEngine, LLMEngine, _Recorded], Awaitable[None]]) -> None:
    core = build_engine(
        EngineConfig(
            model_path=str(tiny),
            cache=CacheConfig(block_size=16, num_blocks=64),
            scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=256),
        )
    )
    recorded = _Recorded(core)

    async def main() -> None:
        engine = AsyncEngine(core=core)
        await engine.start(warmup=False)
        try:
            await body(engine, core, recorded)
        finally:
            await engine.shutdown()

    asyncio.run(main())


async def _poll(predicate: Callable[[], bool], attempts: int = 200) -> bool:
    for _ in range(attempts):
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


def _idle(core: LLMEngine) -> bool:
    return not core.has_unfinished() and core.kv.num_free_blocks == core.kv.num_total_blocks


def test_a_finished_stream_is_never_aborted(tiny: Path) -> None:
    async def body(engine: AsyncEngine, core: LLMEngine, recorded: _Recorded) -> None:
        request = EngineRequest("done", (5, 6, 7), SamplingParams(max_tokens=3, temperature=0.0, n=2))
        outs = [o async for o in engine.generate(request)]
        assert sorted(o.index for o in outs if o.finished) == [0, 1]
        assert all(o.finish_reason is FinishReason.LENGTH for o in outs if o.finished)
        await engine.abort("done")  # late: the request is over, nothing is sent
        assert await _poll(lambda: _idle(core))
        assert recorded.aborts == []

    _run(tiny, body)


def test_closing_a_stream_early_aborts_it_once(tiny: Path) -> None:
    async def body(engine: AsyncEngine, core: LLMEngine, recorded: _Recorded) -> None:
        stream = engine.generate(EngineRequest("cut", (5, 6, 7), LONG))
        first = await stream.__anext__()
        assert first.new_token_ids and not first.finished
        await stream.aclose()
        assert await _poll(lambda: _idle(core) and recorded.aborts == ["cut"])

    _run(tiny, body)


def test_abort_then_close_sends_one_abort(tiny: Path) -> None:
    """The gateway aborts, then closes the stream (and may abort again): the engine hears it once."""

    async def body(engine: AsyncEngine, core: LLMEngine, recorded: _Recorded) -> None:
        stream = engine.generate(EngineRequest("gone", (5, 6, 7), LONG))
        await stream.__anext__()
        await engine.abort("gone")
        await stream.aclose()
        await engine.abort("gone")
        assert await _poll(lambda: _idle(core))
        assert recorded.aborts == ["gone"]

    _run(tiny, body)


def test_validation_runs_once_on_the_engine_thread(tiny: Path) -> None:
    async def body(engine: AsyncEngine, core: LLMEngine, recorded: _Recorded) -> None:
        vocab = core.model_config.vocab_size
        with pytest.raises(InvalidRequestError) as info:
            async for _ in engine.generate(EngineRequest("bad", (5, vocab), SHORT)):
                pass
        assert info.value.param == "prompt"
        assert [o.finish_reason async for o in engine.generate(EngineRequest("ok", (5, 6), SHORT))][-1] is (
            FinishReason.LENGTH
        )
        assert recorded.validate_threads == ["weir-engine", "weir-engine"]
        assert recorded.aborts == []  # a refused request has nothing to abort

    _run(tiny, body)


def test_a_duplicate_id_is_refused_and_the_first_stream_still_aborts(tiny: Path) -> None:
    async def body(engine: AsyncEngine, core: LLMEngine, recorded: _Recorded) -> None:
        first = engine.generate(EngineRequest("twin", (5, 6, 7), LONG))
        await first.__anext__()
        with pytest.raises(InvalidRequestError) as info:
            async for _ in engine.generate(EngineRequest("twin", (8, 9), SHORT)):
                pass
        assert info.value.param == "request_id"
        await first.aclose()
        assert await _poll(lambda: _idle(core) and recorded.aborts == ["twin"])

    _run(tiny, body)


def test_an_abort_reports_the_prompt_tokens_computed(tiny: Path) -> None:
    """Issue 21 item 4: the gateway bills a prefill its client cancelled; the engine says how much."""
    core = build_engine(
        EngineConfig(
            model_path=str(tiny),
            cache=CacheConfig(block_size=16, num_blocks=64),
            scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256),
        )
    )
    core.add_request(EngineRequest("mid", tuple([5] * 200), replace(LONG, n=2, max_tokens=8)))
    assert core.step() == []  # one chunk of the prefill, no token yet
    outs = core.abort("mid")
    assert sorted(o.num_computed_prompt_tokens for o in outs) == [0, 64]  # the fork had not started
    assert all(o.finished and o.finish_reason is FinishReason.ABORT for o in outs)

    async def body(engine: AsyncEngine, core: LLMEngine, recorded: _Recorded) -> None:
        stream = engine.generate(EngineRequest("running", (5, 6, 7), LONG))
        assert (await stream.__anext__()).new_token_ids
        assert await engine.abort("running") == 3  # the whole prompt
        cut = engine.generate(EngineRequest("closed", (5, 6, 7, 8), LONG))
        await cut.__anext__()
        await cut.aclose()  # its own abort; the caller's abort reads the report
        assert await engine.abort("closed") == 4
        assert await engine.abort("closed") is None  # read once
        assert await engine.abort("never") is None
        assert await _poll(lambda: _idle(core))

    _run(tiny, body)


def test_the_start_up_warm_up_leaves_no_measured_rate(tiny: Path) -> None:
    """Admission predicts first tokens from the measured prefill rate: the warm-up's 8-token
    prompt is no measure of anyone's (it predicted 3 s for a chat with nothing ahead)."""
    core = build_engine(
        EngineConfig(
            model_path=str(tiny),
            cache=CacheConfig(block_size=16, num_blocks=64),
            scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=256),
        )
    )

    async def main() -> None:
        engine = AsyncEngine(core=core)
        await engine.start()  # with the warm-up
        try:
            assert core.num_prompt_tokens_total == 8  # the warm-up ran
            assert core.stats().prefill_tokens_per_s == 0.0 and core.rates.decode.value == 0.0
            er = EngineRequest(
                request_id="r",
                prompt_token_ids=tuple(range(1, 41)),
                sampling_params=SamplingParams(max_tokens=2),
            )
            async for _ in engine.generate(er):
                pass
            assert core.stats().prefill_tokens_per_s > 0.0  # a real prompt is measured
        finally:
            await engine.shutdown()

    asyncio.run(main())
