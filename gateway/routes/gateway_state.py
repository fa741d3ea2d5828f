"""Lifecycle state of one app: draining (after SIGTERM) and the generation requests in flight."""

from __future__ import annotations

import asyncio
import time

# After the grace period uvicorn cancels the remaining requests and starts the lifespan shutdown
# at once; their cleanup (abort, usage record) needs a moment more before the engine stops.
CLEANUP_WAIT_S = 5.0


class GatewayState:
    """Draining starts on SIGTERM; `num_active` counts generation responses not yet settled."""

    def __init__(self) -> None:
        self.draining = False
        self.num_active = 0

    def begin_drain(self) -> None:
        """Refuse new generation requests and report not-ready; in-flight ones continue."""
        self.draining = True

    def request_started(self) -> None:
        self.num_active += 1

    def request_finished(self) -> None:
        self.num_active -= 1

    async def wait_idle(self, timeout_s: float = CLEANUP_WAIT_S) -> bool:
        """Wait until every generation response has settled (aborted, accounted); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.num_active and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return self.num_active == 0
