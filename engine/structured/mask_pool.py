"""The worker threads that compute grammar masks, shared fairly between tenants.

A plain `ThreadPoolExecutor` serves masks first come, first served: a tenant whose grammars are
slow (seconds a mask, within the gateway's cost bounds) could occupy every worker, and another
tenant's cheap mask would queue behind them, its request sitting steps out and at last timing out
for a cost that was never its own. Here:

- each owner (a tenant) has its own queue; a free worker takes the next job of the owner with the
  fewest masks running (ties: the owner served least recently), so owners share the workers;
- when every worker is busy and an owner with nothing running has a job waiting, one more thread
  starts (up to `max_workers`): a tenant whose masks are slow keeps its workers, and everyone
  else still gets one at once. Threads beyond `num_workers` end when they find nothing to do;
- each job's run start is kept (`run_started_s`), so a request's time budget counts the time its
  mask actually ran, not the time it queued behind others.

A running mask cannot be stopped (xgrammar fills it in C); the gateway's grammar cost bounds keep
each one short. Threads run at the lowest CPU priority (`worker_priority`). No torch here.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from weir.engine.structured.worker_priority import lower_thread_priority

T = TypeVar("T")


@dataclass
class _Job:
    key: str
    owner: str
    future: Future[Any]
    fn: Callable[[], Any]


class FairMaskPool:
    """Runs jobs per owner on `num_workers` threads (growing to `max_workers` for idle owners)."""

    def __init__(
        self,
        num_workers: int,
        max_workers: int,
        clock: Callable[[], float] = time.monotonic,
        name: str = "weir-mask",
    ) -> None:
        if not 1 <= num_workers <= max_workers:
            raise ValueError(f"need 1 <= num_workers <= max_workers, got {num_workers} and {max_workers}")
        self.num_workers = num_workers
        self.max_workers = max_workers
        self.clock = clock
        self._name = name
        self._cv = threading.Condition()
        self._queues: dict[str, deque[_Job]] = {}  # owner -> its waiting jobs, oldest first
        self._running: dict[str, int] = {}  # owner -> its jobs on a worker now
        self._last_served: dict[str, int] = {}  # owner -> dispatch counter when last served
        self._dispatched = 0
        self._run_started: dict[str, float] = {}  # job key -> clock() when a worker took it
        self._threads = 0
        self._idle = 0
        self._closed = False
        self.num_extra_started = 0  # threads started beyond num_workers for an owner with none running

    def submit(self, owner: str, key: str, fn: Callable[[], T]) -> Future[T]:
        """Queue `fn` for `owner`; `key` names the job for `run_started_s` (one job per key at a time)."""
        future: Future[T] = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("the mask pool is closed")
            self._queues.setdefault(owner, deque()).append(_Job(key, owner, future, fn))
            self._run_started.pop(key, None)
            if self._idle:
                self._cv.notify()
            elif self._threads < self.num_workers or (
                self._threads < self.max_workers
                and not self._running.get(owner)
                and len(self._queues[owner]) == 1
            ):
                self._start_thread()
        return future

    def run_started_s(self, key: str) -> float | None:
        """When a worker took the job `key` (by `clock`); None while it waits (or once it is gone)."""
        with self._cv:
            return self._run_started.get(key)

    def forget(self, key: str) -> None:
        """Drop what is kept about a finished (or abandoned) job."""
        with self._cv:
            self._run_started.pop(key, None)

    @property
    def num_threads(self) -> int:
        with self._cv:
            return self._threads

    def num_waiting(self, owner: str | None = None) -> int:
        with self._cv:
            if owner is not None:
                return len(self._queues.get(owner, ()))
            return sum(len(q) for q in self._queues.values())

    def close(self) -> None:
        """Cancel the waiting jobs and let the threads end (a job under way finishes)."""
        with self._cv:
            self._closed = True
            for queue in self._queues.values():
                for job in queue:
                    job.future.cancel()
            self._queues.clear()
            self._cv.notify_all()

    def _start_thread(self) -> None:
        if self._threads >= self.num_workers:
            self.num_extra_started += 1
        self._threads += 1
        threading.Thread(target=self._work, name=f"{self._name}-{self._threads}", daemon=True).start()

    def _next_job(self) -> _Job | None:
        if not self._queues:  # an owner's queue is dropped once empty: every one here has a job
            return None
        owner = min(self._queues, key=lambda o: (self._running.get(o, 0), self._last_served.get(o, -1)))
        job = self._queues[owner].popleft()
        if not self._queues[owner]:
            del self._queues[owner]
        self._dispatched += 1
        self._last_served[owner] = self._dispatched
        self._running[owner] = self._running.get(owner, 0) + 1
        self._run_started[job.key] = self.clock()
        return job

    def _work(self) -> None:
        lower_thread_priority()
        while True:
            with self._cv:
                job = self._next_job()
                while job is None:
                    if self._closed or self._threads > self.num_workers:
                        self._threads -= 1
                        return
                    self._idle += 1
                    self._cv.wait()
                    self._idle -= 1
                    job = self._next_job()
            if job.future.set_running_or_notify_cancel():
                try:
                    job.future.set_result(job.fn())
                except BaseException as exc:  # the job's own failure belongs to its future
                    job.future.set_exception(exc)
            with self._cv:
                left = self._running[job.owner] - 1
                if left:
                    self._running[job.owner] = left
                else:
                    del self._running[job.owner]
                    if job.owner not in self._queues:
                        self._last_served.pop(job.owner, None)
