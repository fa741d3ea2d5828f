"""Waiting-queue orderings, chosen by `QueuePolicy`. Plain Python, no torch.

Ordering is kept apart from admission: the scheduler asks the queue for the next candidate and
decides on its own whether it fits.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator

from engine.config import QueuePolicy
from engine.request import Request


class WaitingQueue(ABC):
    """The engine's single waiting queue."""

    @abstractmethod
    def add(self, req: Request) -> None:
        """Enqueue a new request."""

    @abstractmethod
    def prepend(self, req: Request) -> None:
        """Re-enqueue a preempted request ahead of others of its rank."""

    @abstractmethod
    def peek(self) -> Request | None:
        """The next candidate, without removing it."""

    @abstractmethod
    def remove(self, req: Request) -> None:
        """Remove a request (scheduled or aborted); O(1) or O(log n)."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]: ...

    def pop(self) -> Request:
        req = self.peek()
        if req is None:
            raise IndexError("waiting queue is empty")
        self.remove(req)
        return req

    def on_tokens_served(self, req: Request, num_tokens: int) -> None:  # noqa: B027 - optional hook
        """Hook for policies that account served tokens (fair share)."""

    def on_running(self, req: Request, delta: int) -> None:  # noqa: B027 - optional hook
        """Hook: a request started (+1) or stopped (-1) running."""

    def victim_key(self, req: Request) -> tuple[float, ...]:
        """Larger key = preempted first. Default: the latest arrival."""
        return (req.arrival_s,)


class FCFSQueue(WaitingQueue):
    """First come, first served."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, Request] = OrderedDict()

    def add(self, req: Request) -> None:
        self._items[req.request_id] = req

    def prepend(self, req: Request) -> None:
        self._items[req.request_id] = req
        self._items.move_to_end(req.request_id, last=False)

    def peek(self) -> Request | None:
        return next(iter(self._items.values()), None)

    def remove(self, req: Request) -> None:
        self._items.pop(req.request_id, None)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._items.values()))


class PriorityQueue(WaitingQueue):
    """Priority class first, then arrival. A heap with lazy deletion."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, str]] = []
        self._live: dict[str, tuple[Request, int]] = {}  # id -> (request, seq of its live heap entry)
        self._seq = itertools.count()

    def _push(self, req: Request, arrival: float) -> None:
        seq = next(self._seq)
        self._live[req.request_id] = (req, seq)
        heapq.heappush(self._heap, (int(req.priority), arrival, seq, req.request_id))

    def add(self, req: Request) -> None:
        self._push(req, req.arrival_s)

    def prepend(self, req: Request) -> None:
        self._push(req, float("-inf"))

    def peek(self) -> Request | None:
        while self._heap:
            _, _, seq, rid = self._heap[0]
            live = self._live.get(rid)
            if live is not None and live[1] == seq:
                return live[0]
            heapq.heappop(self._heap)
        return None

    def remove(self, req: Request) -> None:
        self._live.pop(req.request_id, None)

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Request]:
        return iter(sorted((r for r, _ in self._live.values()), key=lambda r: (int(r.priority), r.arrival_s)))

    def victim_key(self, req: Request) -> tuple[float, ...]:
        return (int(req.priority), req.arrival_s)


def make_waiting_queue(policy: QueuePolicy) -> WaitingQueue:
    """The queue implementation for a policy."""
    if policy is QueuePolicy.FCFS:
        return FCFSQueue()
    if policy is QueuePolicy.PRIORITY:
        return PriorityQueue()
    from engine.fair_queue import FairQueue

    return FairQueue()
