"""Lifecycle state: draining flag and waiting for in-flight requests to settle."""

from __future__ import annotations

import asyncio

from gateway.state import GatewayState


def test_wait_idle() -> None:
    async def run() -> tuple[bool, bool]:
        state = GatewayState()
        state.request_started()
        assert not await state.wait_idle(timeout_s=0.01)
        asyncio.get_running_loop().call_later(0.01, state.request_finished)
        return await state.wait_idle(timeout_s=10), state.draining

    assert asyncio.run(run()) == (True, False)


def test_drain() -> None:
    state = GatewayState()
    state.begin_drain()
    assert state.draining
