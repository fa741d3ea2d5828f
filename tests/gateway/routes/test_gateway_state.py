"""Lifecycle state: the generation responses in flight, which the shutdown waits for.

(Draining itself is tested through the app in test_app.py and through the signal in test_server.py.)
"""

from __future__ import annotations

import asyncio

import httpx

from tests.gateway.conftest import Live
from tests.gateway.harness import MODEL, wait_until
from weir.gateway.routes.gateway_state import GatewayState

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "tell me a story"}]}


def test_wait_idle_waits_for_the_last_request_and_times_out_otherwise() -> None:
    async def run() -> tuple[bool, bool, bool]:
        state = GatewayState()
        state.request_started()
        state.request_started()
        timed_out = await state.wait_idle(timeout_s=0.01)
        state.request_finished()
        still_one = await state.wait_idle(timeout_s=0.01)
        asyncio.get_running_loop().call_later(0.01, state.request_finished)
        return timed_out, still_one, await state.wait_idle(timeout_s=10)

    assert asyncio.run(run()) == (False, False, True)


def test_a_stream_counts_as_active_until_it_has_settled(live: Live) -> None:
    state: GatewayState = live.app.state.gateway
    live.engine.token_delay_s = 0.02
    with live.client.stream(
        "POST", "/v1/chat/completions", json={**CHAT, "max_tokens": 200, "stream": True}
    ) as r:
        lines = r.iter_lines()  # keep it referenced, or httpx closes the connection early
        assert next(line for line in lines if line.startswith("data: "))
        assert state.num_active == 1
    # The client went away: the response settles (abort, usage) and stops counting.
    assert wait_until(lambda: state.num_active == 0 and live.engine.num_active == 0)


def test_completed_and_timed_out_requests_stop_counting(live: Live) -> None:
    state: GatewayState = live.app.state.gateway
    assert live.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4}).status_code == 200
    assert wait_until(lambda: state.num_active == 0)
    live.engine.first_token_delay_s = 30.0  # stuck in the queue until the client gives up
    try:
        live.client.post("/v1/chat/completions", json=CHAT, timeout=0.5)
    except httpx.TimeoutException:
        pass
    assert wait_until(lambda: state.num_active == 0 and live.engine.num_active == 0)
