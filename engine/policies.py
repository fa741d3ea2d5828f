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
    """The engine's single waiting queue.

    It also keeps the tokens waiting per priority class up to date in O(1) per add/remove, so
    stats (read after every engine step) never walk the queue.
    """

    def __init__(self) -> None:
        self._counted: dict[str, tuple[int, int]] = {}  # request id -> (priority, tokens) counted
        self.waiting_tokens_by_priority = [0, 0, 0]

    def add(self, req: Request) -> None:
        """Enqueue a new request."""
        self._count_in(req)
        self._add(req)

    def prepend(self, req: Request) -> None:
        """Re-enqueue a preempted request ahead of others of its rank."""
        self._count_in(req)
        self._prepend(req)

    def remove(self, req: Request) -> None:
        """Remove a request (scheduled or aborted); O(1) or O(log n)."""
        counted = self._counted.pop(req.request_id, None)
        if counted is not None:
            self.waiting_tokens_by_priority[counted[0]] -= counted[1]
        self._remove(req)

    def _count_in(self, req: Request) -> None:
        old = self._counted.get(req.request_id)
        if old is not None:
            self.waiting_tokens_by_priority[old[0]] -= old[1]
        entry = (int(req.priority), req.num_remaining)
        self._counted[req.request_id] = entry
        self.waiting_tokens_by_priority[entry[0]] += entry[1]

    @abstractmethod
    def _add(self, req: Request) -> None: ...

    @abstractmethod
    def _prepend(self, req: Request) -> None: ...

    @abstractmethod
    def _remove(self, req: Request) -> None: ...

    @abstractmethod
    def peek(self) -> Request | None:
        """The next candidate, without removing it."""

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
        super().__init__()
        self._items: OrderedDict[str, Request] = OrderedDict()

    def _add(self, req: Request) -> None:
        self._items[req.request_id] = req

    def _prepend(self, req: Request) -> None:
        self._items[req.request_id] = req
        self._items.move_to_end(req.request_id, last=False)

    def peek(self) -> Request | None:
        return next(iter(self._items.values()), None)

    def _remove(self, req: Request) -> None:
        self._items.pop(req.request_id, None)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._items.values()))


class PriorityQueue(WaitingQueue):
    """Priority class first, then arrival. A heap with lazy deletion."""

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[tuple[int, float, int, str]] = []
        self._live: dict[str, tuple[Request, int]] = {}  # id -> (request, seq of its live heap entry)
        self._seq = itertools.count()

    def _push(self, req: Request, arrival: float) -> None:
        seq = next(self._seq)
        self._live[req.request_id] = (req, seq)
        heapq.heappush(self._heap, (int(req.priority), arrival, seq, req.request_id))

    def _add(self, req: Request) -> None:
        self._push(req, req.arrival_s)

    def _prepend(self, req: Request) -> None:
        self._push(req, float("-inf"))

    def peek(self) -> Request | None:
        while self._heap:
            _, _, seq, rid = self._heap[0]
            live = self._live.get(rid)
            if live is not None and live[1] == seq:
                return live[0]
            heapq.heappop(self._heap)
        return None

    def _remove(self, req: Request) -> None:
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
