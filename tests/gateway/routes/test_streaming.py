"""Running requests against the engine: disconnects abort at once, failures stay per request."""

from __future__ import annotations

import asyncio
import json

import httpx

from tests.gateway.conftest import Live
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, serve_in_thread, wait_until
from weir.engine.errors import RequestFailedError
from weir.gateway.admission.accounting import Outcome, UsageJournal, UsageRecord
from weir.gateway.routes.streaming import OutputMerger

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "tell me a story"}]}


def sse_events(lines: list[str]) -> list[str]:
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


def test_disconnect_mid_stream_aborts_and_frees_every_block(live: Live) -> None:
    engine = live.engine
    engine.token_delay_s = 0.02
    total = engine.num_total_blocks
    with live.client.stream(
        "POST", "/v1/chat/completions", json={**CHAT, "max_tokens": 200, "stream": True}
    ) as r:
        assert r.status_code == 200
        # Keep the iterator referenced: dropping it makes httpx close the connection early.
        lines = r.iter_lines()
        events = [line for line in (next(lines) for _ in range(12)) if line.startswith("data: ")]
        assert len(events) == 6
        assert engine.num_free_blocks < total  # the request holds blocks while it streams
    # Closing the response closes the connection: the gateway must abort at once.
    assert wait_until(lambda: engine.num_free_blocks == total and engine.num_active == 0)
    assert engine.aborted == [engine.requests[0].request_id]


def test_disconnect_before_the_first_token_aborts(live: Live) -> None:
    engine = live.engine
    engine.first_token_delay_s = 30.0  # stuck in the queue
    total = engine.num_total_blocks

    def send() -> None:
        try:
            live.client.post("/v1/chat/completions", json={**CHAT, "stream": True}, timeout=0.5)
        except httpx.TimeoutException:
            pass  # the client gives up and disconnects

    send()
    assert wait_until(lambda: engine.num_free_blocks == total and engine.num_active == 0)
    assert engine.aborted == [engine.requests[0].request_id]


def test_disconnect_of_a_non_streaming_request_aborts(live: Live) -> None:
    engine = live.engine
    engine.token_delay_s = 0.05
    try:
        live.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 200}, timeout=0.5)
    except httpx.TimeoutException:
        pass
    assert wait_until(lambda: engine.num_active == 0 and engine.num_free_blocks == engine.num_total_blocks)
    assert len(engine.aborted) == 1


def test_completed_requests_are_not_aborted_and_blocks_return(live: Live) -> None:
    r = live.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 8, "n": 3})
    assert r.status_code == 200
    assert live.engine.aborted == []
    assert wait_until(lambda: live.engine.num_free_blocks == live.engine.num_total_blocks)


def test_failure_before_first_output_gets_a_status_code(live: Live) -> None:
    live.engine.fail_request = lambda req: RequestFailedError("boom")
    r = live.client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 500
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == "engine_error"


def test_failure_mid_stream_sends_an_error_event_then_done(live: Live) -> None:
    live.engine.raise_after_tokens = 3
    with live.client.stream(
        "POST", "/v1/chat/completions", json={**CHAT, "max_tokens": 50, "stream": True}
    ) as r:
        assert r.status_code == 200
        events = sse_events(list(r.iter_lines()))
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])
    assert error["error"]["type"] == "server_error" and "injected" in error["error"]["message"]
    assert sum(1 for e in events if '"content":"' in e and '"content":""' not in e) == 3
    assert wait_until(lambda: live.engine.num_free_blocks == live.engine.num_total_blocks)


def test_error_finish_reason_fails_the_request(live: Live) -> None:
    live.engine.error_after_tokens = 2
    r = live.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 50})
    assert r.status_code == 500
    assert "injected error" in r.json()["error"]["message"]


def test_one_failing_request_does_not_affect_the_next(live: Live) -> None:
    live.engine.fail_request = lambda req: (
        RequestFailedError("boom") if len(live.engine.requests) == 1 else None
    )
    assert live.client.post("/v1/chat/completions", json=CHAT).status_code == 500
    ok = live.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"


def test_dead_engine_is_503(live: Live) -> None:
    live.engine.alive = False
    r = live.client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "engine_unavailable"


def test_merger_interleaves_prompts_and_closes_streams() -> None:
    from weir.engine.client import EngineRequest
    from weir.engine.request import SamplingParams

    async def run() -> list[tuple[int, int]]:
        engine = FakeEngine()
        requests = [EngineRequest(f"r{i}", (1, 2), SamplingParams(max_tokens=3)) for i in range(3)]
        merger = OutputMerger(engine, requests)
        seen = [(i, len(out.new_token_ids)) async for i, out in merger]
        await merger.aclose()
        assert engine.num_free_blocks == engine.num_total_blocks
        return seen

    seen = asyncio.run(run())
    assert sorted({i for i, _ in seen}) == [0, 1, 2] and len(seen) == 9


def test_merger_propagates_failures_and_cancels_the_rest() -> None:
    from weir.engine.client import EngineRequest
    from weir.engine.request import SamplingParams

    async def run() -> None:
        engine = FakeEngine(token_delay_s=0.01)
        engine.fail_request = lambda req: RequestFailedError("x") if req.request_id == "r1" else None
        requests = [EngineRequest(f"r{i}", (1,), SamplingParams(max_tokens=1000)) for i in range(2)]
        merger = OutputMerger(engine, requests)
        try:
            async for _ in merger:
                pass
        except RequestFailedError:
            pass
        else:
            raise AssertionError("the failure was swallowed")
        await merger.aclose()
        assert engine.num_active == 0 and engine.num_free_blocks == engine.num_total_blocks

    asyncio.run(run())


def test_shielded_work_runs_to_its_end_through_repeated_cancels() -> None:
    from weir.gateway.routes.streaming import _shielded

    async def run() -> list[str]:
        done: list[str] = []
        release = asyncio.Event()

        async def work() -> None:
            await release.wait()
            done.append("finished")

        caller = asyncio.create_task(_shielded(work()))
        for _ in range(3):  # a shutdown may cancel the request's task more than once
            await asyncio.sleep(0)
            caller.cancel()
        await asyncio.sleep(0)
        assert not caller.done() and done == []  # still waiting for the work, not abandoned
        release.set()
        try:
            await caller
        except asyncio.CancelledError:
            done.append("cancel passed on")
        return done

    assert asyncio.run(run()) == ["finished", "cancel passed on"]


def test_a_finished_stream_has_its_final_record_journaled_before_done() -> None:
    """Issue 54 finding 8: the completed record is in the spool before the client sees `[DONE]`,
    so a kill -9 right after cannot leave the stream billed as cancelled from a provisional one."""
    journal: list[UsageRecord] = []
    sink: list[UsageRecord] = []
    app = make_app(FakeEngine(), usage_sink=sink.append, usage_journal=UsageJournal(write=journal.append))
    body = {**CHAT, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            events = sse_events(list(r.iter_lines()))
            # As the client reads `[DONE]`, the completed record is already written.
            assert events[-1] == "[DONE]"
            done_seen = list(journal)
        usage = json.loads(events[-2])["usage"]
        assert done_seen[0].outcome is Outcome.CANCELLED  # the provisional one, before the first byte
        final = done_seen[-1]
        assert final.outcome is Outcome.COMPLETED
        assert final.usage.completion_tokens == usage["completion_tokens"] == 5
        assert final.usage.prompt_tokens == usage["prompt_tokens"]
        assert wait_until(lambda: app.state.gateway.num_active == 0)  # settled
    assert sink == []  # the cleanup after `[DONE]` does not write the record again
    assert journal[-1] is final


def test_a_stream_whose_final_journal_write_fails_is_recorded_by_the_sink() -> None:
    sink: list[UsageRecord] = []

    def broken(record: UsageRecord) -> None:
        if record.outcome is not Outcome.CANCELLED:
            raise OSError("the usage queue is full")

    engine = FakeEngine()
    app = make_app(engine, usage_sink=sink.append, usage_journal=UsageJournal(write=broken))
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        events = sse_events(
            client.post(
                "/v1/chat/completions", json={**CHAT, "max_tokens": 3, "stream": True}
            ).text.splitlines()
        )
        assert events[-1] == "[DONE]"
        assert wait_until(lambda: len(sink) == 1)
    assert sink[0].outcome is Outcome.COMPLETED and sink[0].usage.completion_tokens == 3
