"""Grammar masks computed ahead, off the engine step, so one slow grammar delays only its own request.

A constrained sequence needs its grammar's mask of allowed tokens before each sample. Computing
it inside the step (as the sampler once did) put every grammar's cost on every request in the
batch: a regex with nested counted repetitions took minutes per mask and held the whole engine.
Here each mask starts on worker threads shared fairly between tenants (`mask_pool`) as soon as
the sequence runs with a new grammar state (xgrammar releases the GIL while it fills a mask), and
runs while the step's forward does. Then:

- the runner samples a row only if its mask is ready, after waiting at most `grace_s` for the
  whole batch's masks together; a row whose mask is not ready sits the step out (its token is
  not sampled and its last position is fed again next step) and is marked late;
- the scheduler leaves late rows out of the next steps (no forward for a row that cannot sample)
  until their mask arrives; the worker wakes the engine when it does;
- a mask still late `timeout_s` after a worker took it (or `queue_timeout_s` after it was asked
  for, if it never got one) fails its request alone with `GRAMMAR_TIMEOUT`, freeing its blocks.
  Time spent queued behind other tenants' masks is not charged to the request's budget. A worker thread cannot be stopped: the gateway's cost bounds on grammars
  (`weir.gateway.prompts.grammar`) keep what a single mask may cost small, and this is the net
  under them.

Plain Python over the requests' matchers; no torch here.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from weir.engine.config import MaskConfig
from weir.engine.request import Request
from weir.engine.structured.mask_pool import FairMaskPool

GRAMMAR_TIMEOUT = "grammar_timeout"


def timeout_error(request_id: str, timeout_s: float, num_late_steps: int) -> str:
    """The error a request fails with when its grammar's mask is too slow."""
    return (
        f"{GRAMMAR_TIMEOUT}: the grammar of request {request_id} took more than {timeout_s:g} s to "
        f"compute its next allowed tokens (it sat out {num_late_steps} steps); simplify the "
        "constraint (fewer nested repetitions or alternatives)"
    )


class MaskPrefetcher:
    """Starts each running sequence's next grammar mask on the tenants' shared workers and times
    them out."""

    def __init__(self, config: MaskConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or MaskConfig()
        self.clock = clock
        self._pool: FairMaskPool | None = None  # started with the first constrained request
        self._asked_s: dict[str, float] = {}  # request id -> when its pending mask was asked for
        # Called (on a worker thread) when a mask is ready: the engine's loop wakes for it.
        self.on_ready: Callable[[], None] = lambda: None
        self.num_started = 0
        self.num_late_rows = 0  # rows that sat a step out for their mask
        self.num_timeouts = 0  # requests failed because their mask stayed late

    def _workers(self) -> FairMaskPool:
        if self._pool is None:
            self._pool = FairMaskPool(self.config.num_workers, self.config.max_workers, self.clock)
        return self._pool

    def _done(self, _: Future[Any]) -> None:
        self.on_ready()

    def start(self, running: Iterable[Request]) -> None:
        """Start the next mask of every running constrained sequence that has none under way."""
        now: float | None = None
        for req in running:
            constraint = req.constraint
            if constraint is None or constraint.has_next_mask:
                continue
            submit = functools.partial(self._workers().submit, req.tenant_id, req.request_id)
            if constraint.start_mask(submit, self._done):
                now = self.clock() if now is None else now
                self._asked_s[req.request_id] = now
                self.num_started += 1

    def wait_ready(self, requests: Iterable[Request]) -> list[Request]:
        """The requests (of those given) whose mask is not ready after one shared `grace_s` wait;
        each is marked late for the step. A mask not yet under way (a sequence admitted in this
        step) starts first: no mask is ever computed inside the step."""
        reqs = list(requests)
        self.start(reqs)
        deadline = time.monotonic() + self.config.grace_s
        late: list[Request] = []
        for req in reqs:
            constraint = req.constraint
            if constraint is None or constraint.wait_mask(max(0.0, deadline - time.monotonic())):
                continue
            constraint.num_late_steps += 1
            late.append(req)
        self.num_late_rows += len(late)
        return late

    def _deadline_s(self, rid: str, asked: float) -> tuple[float, float]:
        """(when the pending mask of `rid` times out, the budget that applies). A mask's budget runs
        from when a worker took it; one still waiting for a worker (other tenants' masks hold them
        all) has the longer queue budget from when it was asked for."""
        ran = self._pool.run_started_s(rid) if self._pool is not None else None
        if ran is None:
            return asked + self.config.queue_timeout_s, self.config.queue_timeout_s
        return ran + self.config.timeout_s, self.config.timeout_s

    def _forget(self, rid: str) -> None:
        del self._asked_s[rid]
        if self._pool is not None:
            self._pool.forget(rid)

    def overdue(self, requests: Mapping[str, Request]) -> list[tuple[str, str]]:
        """(request id, error) of the requests whose mask has run past `timeout_s` (or waited for a
        worker past `queue_timeout_s`); forgets the masks that are ready and the requests that are gone."""
        if not self._asked_s:
            return []
        now = self.clock()
        failed: list[tuple[str, str]] = []
        for rid, asked in list(self._asked_s.items()):
            req = requests.get(rid)
            constraint = req.constraint if req is not None else None
            if constraint is None or constraint.mask_ready or not constraint.has_next_mask:
                self._forget(rid)
                continue
            deadline_s, budget_s = self._deadline_s(rid, asked)
            if now >= deadline_s:
                self._forget(rid)
                self.num_timeouts += 1
                failed.append((rid, timeout_error(rid, budget_s, constraint.num_late_steps)))
        return failed

    def next_deadline_s(self) -> float | None:
        """When the earliest pending mask times out; None when none is pending."""
        if not self._asked_s:
            return None
        return min(self._deadline_s(rid, asked)[0] for rid, asked in self._asked_s.items())

    @property
    def num_pending(self) -> int:
        return len(self._asked_s)

    @property
    def num_extra_workers_started(self) -> int:
        """Threads started beyond `num_workers` so that a tenant got a worker at once."""
        return self._pool.num_extra_started if self._pool is not None else 0

    def close(self) -> None:
        """Stop the workers (a mask under way finishes in the background)."""
        if self._pool is not None:
            self._pool.close()
