"""Fair share between tenants: priority class, then a per-tenant virtual token counter, then arrival.

In the spirit of the Virtual Token Counter (Sheng et al., OSDI'24): each tenant's counter grows
by the prefill and decode tokens actually served to it, divided by its weight. The tenant with
the smallest counter (within the best priority class waiting) goes next. A tenant that becomes
active starts at the current minimum counter of active tenants, so idling banks no credit.
Plain Python; O(number of active tenants) per pick, which is small.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from engine.policies import WaitingQueue
from engine.request import Request


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

    def set_weight(self, tenant_id: str, weight: float) -> None:
        if weight <= 0:
            raise ValueError(f"weight must be > 0, got {weight}")
        self.weights[tenant_id] = weight

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
