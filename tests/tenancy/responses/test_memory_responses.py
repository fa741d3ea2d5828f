"""The in-memory response store against a model of it (hypothesis state machine): every record
read back per tenant, bytes counted, expiry on read and sweep."""

from __future__ import annotations

import datetime as dt

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.tenancy.clock import START
from weir.tenancy.responses.memory_responses import MemoryResponseStore
from weir.tenancy.responses.response_records import StoredResponse

TENANTS = st.sampled_from(["a", "b"])
IDS = st.sampled_from([f"resp_{i}" for i in range(5)])


class MemoryStoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryResponseStore()
        self.model: dict[tuple[str, str], StoredResponse] = {}
        self.now = START

    @rule(tenant=TENANTS, response_id=IDS, text=st.text(max_size=20), life_s=st.integers(1, 100))
    def put(self, tenant: str, response_id: str, text: str, life_s: int) -> None:
        record = StoredResponse(
            response_id, {"t": text}, ({"x": 1},), self.now, self.now + dt.timedelta(seconds=life_s)
        )
        self.store.put(tenant, record)
        self.model[(tenant, response_id)] = record

    @rule(tenant=TENANTS, response_id=IDS)
    def get(self, tenant: str, response_id: str) -> None:
        expected = self.model.get((tenant, response_id))
        if expected is not None and expected.expires_at <= self.now:
            del self.model[(tenant, response_id)]
            expected = None
        assert self.store.get(tenant, response_id, self.now) == expected

    @rule(tenant=TENANTS, response_id=IDS)
    def delete(self, tenant: str, response_id: str) -> None:
        assert self.store.delete(tenant, response_id) == (
            self.model.pop((tenant, response_id), None) is not None
        )

    @rule(seconds=st.integers(0, 60))
    def advance(self, seconds: int) -> None:
        self.now += dt.timedelta(seconds=seconds)

    @rule()
    def sweep(self) -> None:
        expired = [k for k, r in self.model.items() if r.expires_at <= self.now]
        assert self.store.sweep(self.now) == len(expired)
        for k in expired:
            del self.model[k]

    @invariant()
    def bytes_counted(self) -> None:
        for tenant in ("a", "b"):
            expected = sum(
                r.num_bytes for (t, _), r in self.model.items() if t == tenant and r.expires_at > self.now
            )
            assert self.store.bytes_used(tenant, self.now) == expected


TestMemoryStore = MemoryStoreMachine.TestCase
