"""The engine's waiting queue and its orderings, one class per `QueuePolicy`. Plain Python, no torch.

Ordering is kept apart from admission: the scheduler asks the queue for the next candidate and
decides on its own whether it fits.

Fair share (`FairQueue`) is in the spirit of the Virtual Token Counter (Sheng et al., OSDI'24):
each tenant's counter grows by the prefill and decode tokens actually served to it, divided by
its weight. The tenant with the smallest counter (within the best priority class waiting) goes
next. A tenant that becomes active starts at the current minimum counter of active tenants, so
idling banks no credit. O(number of active tenants) per pick, which is small.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator

from weir.engine.config import QueuePolicy
from weir.engine.request import Request


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


class FairQueue(WaitingQueue):
    """Per-tenant FIFO queues picked by (priority of head, virtual counter, arrival of head)."""

    def __init__(self) -> None:
        super().__init__()
        self._queues: dict[str, OrderedDict[str, Request]] = {}
        self.counters: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self._active: set[str] = set()  # tenants with waiting or running work
        self._running: dict[str, int] = {}
        self._len = 0

    def _activate(self, tenant: str) -> None:
        if tenant in self._active:
            return
        others = [self.counters[t] for t in self._active if t in self.counters]
        floor = min(others) if others else 0.0
        self.counters[tenant] = max(self.counters.get(tenant, 0.0), floor)
        self._active.add(tenant)

    def _maybe_deactivate(self, tenant: str) -> None:
        if not self._queues.get(tenant) and not self._running.get(tenant):
            self._active.discard(tenant)

    def _add(self, req: Request) -> None:
        # The latest request carries the tenant's current weight (an admin may have changed it).
        self.weights[req.tenant_id] = req.weight
        self._activate(req.tenant_id)
        self._queues.setdefault(req.tenant_id, OrderedDict())[req.request_id] = req
        self._len += 1

    def _prepend(self, req: Request) -> None:
        self._add(req)
        self._queues[req.tenant_id].move_to_end(req.request_id, last=False)

    def peek(self) -> Request | None:
        best: Request | None = None
        best_key: tuple[int, float, float] | None = None
        for tenant, q in self._queues.items():
            if not q:
                continue
            head = next(iter(q.values()))
            key = (int(head.priority), self.counters.get(tenant, 0.0), head.arrival_s)
            if best_key is None or key < best_key:
                best, best_key = head, key
        return best

    def _remove(self, req: Request) -> None:
        q = self._queues.get(req.tenant_id)
        if q is not None and q.pop(req.request_id, None) is not None:
            self._len -= 1
            self._maybe_deactivate(req.tenant_id)

    def on_running(self, req: Request, delta: int) -> None:
        """Track running requests per tenant so a tenant stays active while served."""
        n = self._running.get(req.tenant_id, 0) + delta
        self._running[req.tenant_id] = max(0, n)
        if delta > 0:
            self._activate(req.tenant_id)
        else:
            self._maybe_deactivate(req.tenant_id)

    def on_tokens_served(self, req: Request, num_tokens: int) -> None:
        self.counters[req.tenant_id] = self.counters.get(req.tenant_id, 0.0) + num_tokens / self.weights.get(
            req.tenant_id, 1.0
        )

    def victim_key(self, req: Request) -> tuple[float, ...]:
        return (int(req.priority), self.counters.get(req.tenant_id, 0.0), req.arrival_s)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Request]:
        return iter([r for q in self._queues.values() for r in q.values()])


_QUEUE_CLASSES: dict[QueuePolicy, type[WaitingQueue]] = {
    QueuePolicy.FCFS: FCFSQueue,
    QueuePolicy.PRIORITY: PriorityQueue,
    QueuePolicy.FAIR: FairQueue,
}


def make_waiting_queue(policy: QueuePolicy) -> WaitingQueue:
    """The queue implementation for a policy."""
    return _QUEUE_CLASSES[policy]()
