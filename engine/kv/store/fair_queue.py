"""The shared KV store's I/O queues: bounded, per owner, served fairly (plain Python, thread-safe).

The store's fetch threads and its write thread (`weir.engine.kv.store.client`) each take
their work from a `FairQueue`, so one tenant flooding the store can neither take every thread
nor fill the queue another tenant's work waits in:

- each owner (a tenant for fetches, a cache scope for writes) has its own queue of at most
  `max_per_owner` items, and all of them together at most `max_items`. `put` never blocks: a
  queue that is full for an owner refuses its item, and when the whole queue is full an owner
  with at least two fewer items than the longest queue takes that owner's newest item's place
  (the item is *shed*: handed back to be counted and answered as a miss). So an owner is only
  ever refused for its own backlog, never for another's;
- a taker gets the next item of the owner with the fewest items being worked on, ties going to
  the owner served least recently (round robin), and never one of an owner already at
  `max_running_per_owner` (the fetch threads keep one for the others);
- `cancel` takes an item out before any taker got it (its request is gone).

Like `weir.engine.structured.mask_pool.FairMaskPool`, which shares the grammar workers the same
way. No torch, no redis.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class QueuedJob(Generic[T]):
    owner: str
    key: int  # names the job for `cancel` (0: never cancelled)
    item: T


class FairQueue(Generic[T]):
    """Bounded per-owner queues, taken round robin by the owners' running counts."""

    def __init__(self, max_items: int, max_per_owner: int, max_running_per_owner: int | None = None) -> None:
        if max_items < 1 or max_per_owner < 1:
            raise ValueError(f"need max_items and max_per_owner >= 1, got {max_items} and {max_per_owner}")
        if max_running_per_owner is not None and max_running_per_owner < 1:
            raise ValueError(f"max_running_per_owner must be >= 1, got {max_running_per_owner}")
        self.max_items = max_items
        self.max_per_owner = max_per_owner
        self.max_running_per_owner = max_running_per_owner  # None: `done` is never called
        self._cv = threading.Condition()
        self._queues: dict[str, deque[QueuedJob[T]]] = {}  # owner -> its items, oldest first
        self._running: dict[str, int] = {}  # owner -> its items taken and not `done` yet
        self._last_served: dict[str, int] = {}  # owner -> take counter when last served
        self._served = 0
        self._size = 0
        self._closed = False
        self._kicked = False

    # -- producers ---------------------------------------------------------------------------------

    def put(self, owner: str, key: int, item: T) -> tuple[bool, list[QueuedJob[T]]]:
        """Queue `item` for `owner`: (accepted, the jobs shed to make room for it)."""
        with self._cv:
            if self._closed:
                return False, []
            n = self._len(owner)
            if n >= self.max_per_owner:
                return False, []
            shed: list[QueuedJob[T]] = []
            if self._size >= self.max_items:
                longest = max(self._queues, key=lambda o: len(self._queues[o]))
                if len(self._queues[longest]) < n + 2:
                    return False, []  # its own backlog is as long as anyone's
                shed.append(self._pop(longest, newest=True))
            self._queues.setdefault(owner, deque()).append(QueuedJob(owner, key, item))
            self._size += 1
            self._cv.notify()
            return True, shed

    def room(self, owner: str) -> int:
        """How many items `owner` could queue now (a lower bound; 0: `put` would refuse)."""
        with self._cv:
            if self._closed:
                return 0
            n = self._len(owner)
            own = self.max_per_owner - n
            free = self.max_items - self._size
            if free >= own:
                return max(own, 0)
            longest = max((len(q) for o, q in self._queues.items() if o != owner), default=0)
            return max(free, 1 if longest >= n + 2 and own > 0 else 0)

    def cancel(self, key: int) -> QueuedJob[T] | None:
        """Take the queued job `key` out (None: a taker has it, or there is none)."""
        with self._cv:
            for owner, q in self._queues.items():
                for job in q:
                    if job.key == key:
                        q.remove(job)
                        self._size -= 1
                        if not q:
                            del self._queues[owner]
                        return job
            return None

    # -- takers ------------------------------------------------------------------------------------

    def take(self, max_jobs: int = 1, timeout: float | None = None) -> list[QueuedJob[T]] | None:
        """Up to `max_jobs` jobs, waiting for one; [] after `timeout` or a `kick`; None once closed
        and empty."""
        with self._cv:
            while True:
                jobs = self._pick(max_jobs)
                if jobs:
                    return jobs
                if self._closed:
                    return None
                if self._kicked:
                    self._kicked = False
                    return []
                if not self._cv.wait(timeout):
                    return []

    def done(self, owner: str) -> None:
        """A job of `owner` taken earlier is finished (with `max_running_per_owner` only)."""
        with self._cv:
            left = self._running.pop(owner, 0) - 1
            if left > 0:
                self._running[owner] = left
            self._cv.notify_all()  # a job held back by its owner's cap may go now

    def kick(self) -> None:
        """Wake a waiting taker with [] (other work arrived beside the queue)."""
        with self._cv:
            self._kicked = True
            self._cv.notify_all()

    def close(self, discard: bool) -> list[QueuedJob[T]]:
        """No more puts; takers drain what is queued (unless `discard`: returned) and get None."""
        with self._cv:
            self._closed = True
            dropped: list[QueuedJob[T]] = []
            if discard:
                for q in self._queues.values():
                    dropped.extend(q)
                self._queues.clear()
                self._size = 0
            self._cv.notify_all()
            return dropped

    # -- state ---------------------------------------------------------------------------------------

    def queued(self, owner: str | None = None) -> int:
        with self._cv:
            return self._size if owner is None else self._len(owner)

    def running(self, owner: str) -> int:
        with self._cv:
            return self._running.get(owner, 0)

    # -- internals (under the lock) ---------------------------------------------------------------------

    def _len(self, owner: str) -> int:
        q = self._queues.get(owner)
        return len(q) if q is not None else 0

    def _pop(self, owner: str, newest: bool = False) -> QueuedJob[T]:
        q = self._queues[owner]
        job = q.pop() if newest else q.popleft()
        self._size -= 1
        if not q:
            del self._queues[owner]
        return job

    def _pick(self, max_jobs: int) -> list[QueuedJob[T]]:
        cap = self.max_running_per_owner
        jobs: list[QueuedJob[T]] = []
        while len(jobs) < max_jobs and self._queues:
            eligible = [o for o in self._queues if cap is None or self._running.get(o, 0) < cap]
            if not eligible:
                break
            owner = min(eligible, key=lambda o: (self._running.get(o, 0), self._last_served.get(o, -1)))
            jobs.append(self._pop(owner))
            self._served += 1
            self._last_served[owner] = self._served
            if cap is not None:
                self._running[owner] = self._running.get(owner, 0) + 1
        if len(self._last_served) > 4 * (len(self._queues) + len(self._running)) + 64:
            live = self._queues.keys() | self._running.keys()
            self._last_served = {o: s for o, s in self._last_served.items() if o in live}
        return jobs
