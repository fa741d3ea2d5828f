"""AsyncEngine hand-off: a step's outputs reach the event loop through one callback per loop.

The engine thread groups a step's outputs by request and by event loop and makes one
`call_soon_threadsafe` per loop; the loop side puts each request's outputs into its stream, in
order. Fake loops count the calls; a real engine run checks that no more callbacks carry outputs
than steps were run. No timing thresholds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from tests.engine.tiny_models import make_tiny_model
from weir.engine.async_engine import AsyncEngine, _Add, _dispatch
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.engine_stats import EngineStats
from weir.engine.errors import RetryableEngineError
from weir.engine.llm_engine import LLMEngine
from weir.engine.output import RequestOutput
from weir.engine.request import FinishReason, SamplingParams
from weir.engine.runner.mask_prefetch import MaskPrefetcher


class _FakeLoop:
    """Records `call_soon_threadsafe` calls; `run` runs them as the loop would."""

    def __init__(self) -> None:
        self.calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def call_soon_threadsafe(self, fn: Callable[..., Any], *args: Any) -> None:
        self.calls.append((fn, args))

    def run(self) -> None:
        for fn, args in self.calls:
            fn(*args)


class _FakePrefixCache:
    def stats(self) -> object:
        return object()


class _FakeCore:
    """What `_deliver` reads of the core: which requests are still active."""

    def __init__(self) -> None:
        self.active: set[str] = set()
        self.prefix_cache = _FakePrefixCache()
        self.masks = MaskPrefetcher()  # no constrained request: its pool never starts
        self.store_io = None  # no KV store tier

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=0,
            num_waiting=0,
            num_total_blocks=1,
            num_free_blocks=1,
            block_size=16,
            num_prompt_tokens_total=0,
            num_generation_tokens_total=0,
        )

    def is_active(self, request_id: str) -> bool:
        return request_id in self.active


def _output(rid: str, step: int, finished: bool = False, index: int = 0) -> RequestOutput:
    return RequestOutput(
        request_id=rid,
        index=index,
        new_token_ids=(step,),
        new_text=f"t{step}",
        finished=finished,
        finish_reason=FinishReason.LENGTH if finished else None,
        num_prompt_tokens=3,
        num_output_tokens=step,
    )


def _engine() -> tuple[AsyncEngine, _FakeCore]:
    core = _FakeCore()
    return AsyncEngine(core=cast(LLMEngine, core)), core


def _open(
    engine: AsyncEngine, core: _FakeCore, rid: str, loop: _FakeLoop
) -> asyncio.Queue[RequestOutput | BaseException]:
    sink: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
    request = EngineRequest(rid, (1, 2, 3), SamplingParams(max_tokens=4))
    engine._sinks[rid] = _Add(request, sink, cast(asyncio.AbstractEventLoop, loop))
    core.active.add(rid)
    return sink


def _drain(sink: asyncio.Queue[RequestOutput | BaseException]) -> list[RequestOutput | BaseException]:
    items = []
    while not sink.empty():
        items.append(sink.get_nowait())
    return items


def test_one_step_of_many_requests_is_one_loop_callback() -> None:
    engine, core = _engine()
    loop = _FakeLoop()
    sinks = {f"r{i}": _open(engine, core, f"r{i}", loop) for i in range(8)}
    outputs = [_output(rid, 1) for rid in sinks]
    engine._deliver(outputs)
    assert len(loop.calls) == 1
    assert loop.calls[0][0] is _dispatch
    assert all(sink.empty() for sink in sinks.values())  # nothing is put from the engine thread
    loop.run()
    for rid, sink in sinks.items():
        assert _drain(sink) == [o for o in outputs if o.request_id == rid]


def test_outputs_of_one_request_keep_their_order_and_others_go_elsewhere() -> None:
    engine, core = _engine()
    loop = _FakeLoop()
    a, b = _open(engine, core, "a", loop), _open(engine, core, "b", loop)
    # n=2 (two choices of "a") and an abort's outputs after a step: interleaved with "b".
    outputs = [_output("a", 1, index=0), _output("b", 1), _output("a", 1, index=1), _output("b", 2)]
    engine._deliver(outputs)
    assert len(loop.calls) == 1
    loop.run()
    assert _drain(a) == [outputs[0], outputs[2]]
    assert _drain(b) == [outputs[1], outputs[3]]


def test_one_callback_per_event_loop() -> None:
    engine, core = _engine()
    first, second = _FakeLoop(), _FakeLoop()
    sinks = {"x": _open(engine, core, "x", first), "y": _open(engine, core, "y", second)}
    sinks["z"] = _open(engine, core, "z", first)
    engine._deliver([_output(rid, 1) for rid in ("x", "y", "z")])
    assert (len(first.calls), len(second.calls)) == (1, 1)
    first.run()
    second.run()
    assert [len(_drain(s)) for s in sinks.values()] == [1, 1, 1]


def test_no_output_no_callback_and_unknown_requests_are_skipped() -> None:
    engine, core = _engine()
    loop = _FakeLoop()
    _open(engine, core, "known", loop)
    engine._deliver([])
    engine._deliver([_output("unknown", 1)])
    assert loop.calls == []


def test_a_finished_request_leaves_the_sinks() -> None:
    engine, core = _engine()
    loop = _FakeLoop()
    sink = _open(engine, core, "done", loop)
    _open(engine, core, "running", loop)
    core.active.discard("done")
    engine._deliver([_output("done", 4, finished=True), _output("running", 4)])
    assert set(engine._sinks) == {"running"}
    loop.run()
    [last] = _drain(sink)
    assert isinstance(last, RequestOutput) and last.finished


def test_a_restart_fails_every_stream_with_one_callback_per_loop() -> None:
    engine, core = _engine()
    loop = _FakeLoop()
    sinks = [_open(engine, core, f"r{i}", loop) for i in range(5)]
    core.faults = None  # type: ignore[attr-defined]
    core.reset = lambda: None  # type: ignore[attr-defined]
    assert engine._restart(RuntimeError("boom"))
    assert len(loop.calls) == 1 and engine._sinks == {}
    loop.run()
    for sink in sinks:
        [failure] = _drain(sink)
        assert isinstance(failure, RetryableEngineError)


# -- a real engine: callbacks that carry outputs are at most one per step ----------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("handoff"), arch="llama", num_kv_heads=2, max_position_embeddings=256
    )


def test_a_real_engine_hands_outputs_over_once_per_step(tiny: Path) -> None:
    core = build_engine(
        EngineConfig(
            model_path=str(tiny),
            cache=CacheConfig(block_size=16, num_blocks=64),
            scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=256),
        )
    )
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

    async def main() -> tuple[int, int, list[int]]:
        loop = asyncio.get_running_loop()
        num_dispatches = 0
        call_soon_threadsafe = loop.call_soon_threadsafe

        def counting(fn: Callable[..., Any], *args: Any) -> Any:
            nonlocal num_dispatches
            if fn is _dispatch:
                num_dispatches += 1
            return call_soon_threadsafe(fn, *args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        engine = AsyncEngine(core=core)
        await engine.start(warmup=False)
        try:

            async def collect(rid: str) -> int:
                request = EngineRequest(rid, (5, 6, 7, 8), params)
                return sum([len(o.new_token_ids) async for o in engine.generate(request)])

            counts = await asyncio.gather(*(collect(f"s{i}") for i in range(6)))
        finally:
            await engine.shutdown()
        return num_dispatches, engine.num_steps, counts

    num_dispatches, num_steps, counts = asyncio.run(main())
    assert counts == [6] * 6
    # One hand-off per step at most, though six streams got six tokens each (36 outputs).
    assert 0 < num_dispatches <= num_steps
