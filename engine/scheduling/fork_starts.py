"""Forks: sequences that start on another sequence's KV blocks instead of computing its prompt.

Two kinds. The other choices of an n>1 request (the children) wait out of the queue for the
first choice's (the parent's) prefill, then start on its prompt blocks and compute only the
last prompt token themselves, for their own sample (`start_children`); if the parent ends before
that (abort, error, deadline) they queue on their own (`release_children`). Beam search forks a
running beam at once (`fork_now`). Either way the child references the parent's blocks
(copy-on-write: the partial last block is copied when first written). The parent <-> children
bookkeeping is `PendingForks` (engine/sampling/fork_tracker.py); this class does what a start or
release means for the scheduler's requests, its queue and the KV cache. Plain Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable

from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.request import Request, RequestStatus
from weir.engine.sampling.fork_tracker import PendingForks
from weir.engine.scheduling.request_queue import WaitingQueue


class ForkStarts:
    """The scheduler's forks: children waiting on their parent's prefill, and beams forked at once."""

    def __init__(
        self,
        kv: KVCacheManager,
        requests: dict[str, Request],
        waiting: WaitingQueue,
        start_running: Callable[[Request], None],
        on_own: Callable[[Request], None],
    ) -> None:
        self.kv = kv
        self._requests = requests  # the scheduler's (shared, not copied)
        self._waiting = waiting
        self._start_running = start_running  # the scheduler's: status, running set, residency
        self._on_own = on_own  # a waiting child becomes a request of its own (its queue deadline counts)
        self.pending = PendingForks()  # n>1 choices awaiting their first choice's prefill

    def __bool__(self) -> bool:
        return bool(self.pending)

    def __len__(self) -> int:
        """Children waiting, over all parents."""
        return len(self.pending)

    def num_seats(self, req: Request) -> int:
        """Running slots `req` takes with the forks waiting on it."""
        return 1 + self.pending.num_children(req.request_id)

    def add_group(self, parent: Request, children: list[Request]) -> None:
        """`children` (the queued `parent`'s prompt) wait for its prefill."""
        for child in children:
            self._requests[child.request_id] = child
            child.status = RequestStatus.WAITING
            child.latency = parent.latency
        self.pending.add(parent, children)

    def fork_now(self, parent: Request, child: Request) -> None:
        """Start `child` running at once on `parent`'s blocks for its first `child.num_computed_tokens`
        tokens (beam search). Its tokens must begin with those of the parent."""
        self.kv.fork(parent, child)
        self._requests[child.request_id] = child
        child.latency = parent.latency
        self._start_running(child)

    def start_children(self, parent: Request) -> None:
        """The parent's prompt is computed: its waiting children start on its blocks."""
        for child in self.pending.take_children(parent.request_id):
            child.num_computed_tokens = child.num_prompt_tokens - 1
            child.num_cached_tokens = parent.num_cached_tokens
            self.kv.fork(parent, child)
            self._on_own(child)
            self._start_running(child)

    def release_children(self, parent: Request) -> None:
        """The parent ended before its prefill (abort, error, deadline): its children queue on their own."""
        for child in self.pending.take_children(parent.request_id):
            self._waiting.add(child)
            self._on_own(child)
