"""A test-only fault-injection hook: where the engine calls out so tests can make it fail.

Production passes `faults=None` everywhere; no setting, CLI flag or HTTP field reaches this
object. Tests subclass `FaultInjector` and override the hook they need, raising to simulate a
failure at that point, or blocking to observe the engine mid-way (e.g. `/ready` during a
restart). Every hook runs on the engine thread.
"""

from __future__ import annotations


class FaultInjector:
    """No-op hooks; override one in a test to raise (or wait) at that point of the engine."""

    def before_schedule(self) -> None:
        """Called by `LLMEngine.step` before the scheduler decides the step."""

    def before_forward(self, step: int) -> None:
        """Called by the runner before the model forward of its `step`-th executed step."""

    def before_sample(self, request_id: str) -> None:
        """Called by the runner while preparing the sampling of one request."""

    def before_output(self, request_id: str) -> None:
        """Called by `LLMEngine.step` before it applies a request's sampled token."""

    def on_restart(self) -> None:
        """Called by the async engine loop while it restarts (not ready), before the reset."""
