"""The zero-cost engine: outputs per token and choice, finish reasons, stats, the Protocol."""

from __future__ import annotations

import asyncio

import pytest

from weir.engine.client import EngineRequest
from weir.engine.output import RequestOutput
from weir.engine.request import FinishReason, SamplingParams
from weir_bench.null_engine import NullEngine


def _collect(engine: NullEngine, params: SamplingParams) -> list[RequestOutput]:
    async def run() -> list[RequestOutput]:
        request = EngineRequest(request_id="r", prompt_token_ids=(1, 2, 3), sampling_params=params)
        return [out async for out in engine.generate(request)]

    return asyncio.run(run())


def test_is_healthy_from_the_start() -> None:
    # Its methods match EngineClient's: tests/engine/test_engine_client.py.
    health = NullEngine().health()
    assert health.alive and health.ready


def test_one_output_per_token_and_choice_ending_at_num_tokens() -> None:
    outputs = _collect(
        NullEngine(num_tokens=4, token_id=7, token_text=" x"), SamplingParams(max_tokens=10, n=2)
    )
    assert len(outputs) == 8
    assert [o.index for o in outputs] == [0, 1] * 4
    assert all(o.new_token_ids == (7,) and o.new_text == " x" for o in outputs)
    finished = [o for o in outputs if o.finished]
    assert [o.index for o in finished] == [0, 1]
    assert all(o.finish_reason is FinishReason.STOP and o.num_output_tokens == 4 for o in finished)
    assert all(o.metrics is not None and o.num_prompt_tokens == 3 for o in finished)


def test_max_tokens_caps_the_answer_with_length() -> None:
    outputs = _collect(NullEngine(num_tokens=16), SamplingParams(max_tokens=2))
    assert len(outputs) == 2
    assert outputs[-1].finish_reason is FinishReason.LENGTH


def test_stats_count_tokens_and_nothing_stays_running() -> None:
    engine = NullEngine(num_tokens=3)
    _collect(engine, SamplingParams(max_tokens=8))
    asyncio.run(engine.abort("unknown"))
    stats = engine.stats()
    assert (stats.num_running, stats.num_prompt_tokens_total, stats.num_generation_tokens_total) == (0, 3, 3)
    assert stats.num_free_blocks == stats.num_total_blocks
    assert engine.num_aborts == 1


def test_rejects_a_bad_token_count() -> None:
    with pytest.raises(ValueError, match="num_tokens"):
        NullEngine(num_tokens=0)
