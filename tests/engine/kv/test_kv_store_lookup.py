"""The three-tier lookup (device -> host -> shared store) as a hypothesis state machine.

It extends the host tier's two-tier machine (tests/engine/kv/test_host_kv_tier.py) with a store
tier over an in-memory store model (the I/O threads and Redis are tested apart, in
store/test_client.py, and together in store/test_tier.py). At each step boundary the
runner's copies run in their order, the store's writes included (`store_out` reads device
blocks first, `store_in` writes fetched payloads last). Beside the two-tier checks (every
running request sees its tokens, every cached block in any tier holds the tokens of its hash,
ref counts equal the references held, nothing leaks), it checks that every block the store
holds holds the tokens its key stands for, that a request only ever lands blocks of its own
scope (or the shared one), and that the bytes held for fetches are exactly those in flight and
landed, back to zero at the end. Fetches answer, miss, fail or time out at random, and the
store evicts and flushes entries behind the engine's back.
"""

from __future__ import annotations

import json

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import invariant, precondition, rule

from tests.engine.kv.test_host_kv_tier import TwoTierMachine, tokens
from tests.engine.kv_machine import BS, SCOPES
from tests.engine.kv_machine import make_request as _req
from weir.engine.kv.block_hash import SHARED_SCOPE, CacheKeyRoot
from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.kv.store.codec import FetchResult, block_key
from weir.engine.kv.store.stats import BreakerState, StoreCounters
from weir.engine.kv.store.tier import KVStoreTier
from weir.engine.kv.swap_policy import SwapPolicy


class FakeStoreIO:
    """The store model: key -> payload (a block's tokens as JSON); fetches answered on demand."""

    value_bytes = 10
    max_entries_in_scope = 1000

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.pending: list[tuple[int, list[bytes]]] = []
        self.done: list[FetchResult] = []
        self.flushed: list[bytes] = []
        self.on_ready = None
        self.next_ticket = 0

    def fetch(self, keys: list[bytes], owner: str = "") -> int | None:
        self.next_ticket += 1
        self.pending.append((self.next_ticket, keys))
        return self.next_ticket

    def cancel(self, ticket: int) -> None:
        self.pending = [(t, k) for t, k in self.pending if t != ticket]

    def write_room(self, scope: str) -> int:
        return 1000

    def count_dropped(self, scope: str, n: int) -> None:
        pass

    def answer(self, mode: str) -> None:
        """Answer every pending fetch: 'ok' (the chain as far as the store has it), 'fail', 'late'."""
        for ticket, keys in self.pending:
            payloads: list[bytes] = []
            for k in keys:
                if k not in self.data:
                    break
                payloads.append(self.data[k])
            self.done.append(
                FetchResult(ticket, tuple(payloads) if mode == "ok" else (), len(keys), mode == "fail")
            )
        self.pending.clear()

    def poll(self) -> list[FetchResult]:
        out, self.done = self.done, []
        return out

    def flush(self, pattern: bytes) -> None:
        self.flushed.append(pattern)
        self.data.clear()  # the model forgets everything: a flush may remove more than asked, never less

    @property
    def fetch_bytes_per_s(self) -> float:
        return 0.0

    @property
    def breaker_state(self) -> BreakerState:
        return BreakerState.CLOSED

    def snapshot(self) -> StoreCounters:
        return StoreCounters()

    def close(self) -> None:
        pass


class ThreeTierMachine(TwoTierMachine):
    """The two-tier machine with a store tier under the host tier."""

    def __init__(self) -> None:
        super().__init__()
        self.io = FakeStoreIO()
        self.now = 0.0
        self.store = KVStoreTier(
            self.io,
            namespace="ns",
            model_version="m",
            block_size=BS,
            prefill_seconds=lambda n: 1.0,
            timeout_s=1.0,
            max_fetch_bytes=10_000,
            ttl_s=100.0,
            clock=lambda: self.now,
        )
        self.kv = KVCacheManager(
            10,
            BS,
            lambda scope: CacheKeyRoot("m", "t", "r", "f32", scope).digest(),
            watermark=0.0,
            tenant_cache_share=0.5,
            host_num_blocks=8,
            swap_policy=SwapPolicy(block_bytes=1),
            store=self.store,
        )
        self.fetching: dict[str, object] = {}
        self.key_tokens: dict[bytes, list[int]] = {}  # store key -> the tokens its hash stands for

    def _apply(self) -> None:
        copies = self.kv.copy_plan.take_copies()
        plan = self.kv.copy_plan.take_transfers()
        blank: list[int | None] = [None] * BS
        for d, tag in plan.store_out:  # first: read before anything of the step writes
            content = self.device[d]
            assert None not in content, "a partial block was written to the store"
            self.io.data[tag.key] = json.dumps(content).encode()
        for d, h in plan.swap_out:
            self.host[h] = list(self.device.get(d, blank))
        for src, dst in copies:
            self.device[dst] = list(self.device.get(src, blank))
        for h, d in plan.swap_in:
            self.device[d] = list(self.host.get(h, blank))
        for d, payload in plan.store_in:  # last
            self.device[d] = json.loads(payload)
        self._check_contents()

    def _record_cached(self, req) -> None:  # type: ignore[no-untyped-def]
        super()._record_cached(req)
        for h, toks in self.expected.items():
            self.key_tokens.setdefault(block_key("ns", h), toks)

    # -- store rules ------------------------------------------------------------------------------

    @rule(prompt=tokens, scope=st.sampled_from(SCOPES), mode=st.sampled_from(("ok", "ok", "fail", "late")))
    def fetch(self, prompt: list[int], scope: str, mode: str) -> None:
        """A request that misses device and host asks the store, waits, and is admitted on what landed."""
        self._apply()
        req = _req(self._new_id(), prompt, scope)
        _, num_hit = self.kv.get_computed_blocks(req)
        if self.kv.start_fetch(req, num_hit):
            assert not self.kv.start_fetch(req, num_hit), "a request asks the store once"
            if mode == "late":
                self.now += 2.0  # past its deadline: the answer is ignored
                assert req.request_id in self.store.poll()
            self.io.answer(mode)
            ended = self.store.poll()
            assert mode == "late" or ended == [req.request_id]
            for payload_scope in (s for _, _, s in self.kv.lookup._chain(req.request_id).store_hits):
                assert payload_scope in (scope, SHARED_SCOPE)
        if not self._admit(req):
            self.kv.free(req)

    @precondition(lambda self: self.io.data)
    @rule(data=st.data())
    def store_evicts(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.io.data)))
        del self.io.data[key]

    @rule(scope=st.sampled_from((*SCOPES, None)))
    def store_flush(self, scope: str | None) -> None:
        self.kv.flush({scope} if scope is not None else None)
        assert self.io.flushed

    @rule(data=st.data())
    def store_garbage(self, data: st.DataObject) -> None:
        """Another writer overwrote an entry: the real client's MAC refuses it; here the model
        drops it (what the client passes on), so the request recomputes that block."""
        if self.io.data:
            del self.io.data[data.draw(st.sampled_from(sorted(self.io.data)))]

    # -- invariants ---------------------------------------------------------------------------------

    @invariant()
    def the_store_holds_what_each_key_stands_for(self) -> None:
        for key, payload in self.io.data.items():
            if key in self.key_tokens:
                assert json.loads(payload) == self.key_tokens[key], "the store holds other tokens"

    @invariant()
    def held_fetch_bytes_are_in_flight_and_landed(self) -> None:
        tier = self.store
        landed = sum(len(v) for v in tier._landed.values()) * self.io.value_bytes
        in_flight = sum(f.num_bytes for f in tier._fetches.values())
        assert tier._held_bytes == landed + in_flight

    def teardown(self) -> None:
        super().teardown()
        assert self.store._held_bytes == 0 and not self.store._landed and not self.store._fetches


TestThreeTierMachine = ThreeTierMachine.TestCase
TestThreeTierMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_a_landed_chain_is_admitted_into_device_blocks_that_hold_its_tokens() -> None:
    m = ThreeTierMachine()
    m.complete([1, 2, 1, 2, 1], "a")  # computed, cached, ended: written behind with the next step
    m._apply()
    assert len(m.io.data) == 2
    m.kv.flush({"a"})  # the device and host forget it; the model store too, so write it again
    m.io.flushed.clear()
    m.store._remembered.clear()
    m.complete([1, 2, 1, 2, 1], "a")
    m._apply()
    m.kv.pool.flush()
    assert m.kv.host is not None
    m.kv.host.pool.flush()
    req = _req("x", [1, 2, 1, 2, 1, 2], "a")
    _, num_hit = m.kv.get_computed_blocks(req)
    assert num_hit == 0 and m.kv.start_fetch(req, 0)
    m.io.answer("ok")
    assert m.store.poll() == ["x"]
    computed, num_hit = m.kv.get_computed_blocks(req)
    assert num_hit == 4 and not computed  # both store blocks; the third full block holds the last token
    assert m.kv.allocate_slots(req, req.num_tokens, computed)
    m.live["x"] = req
    req.num_computed_tokens = num_hit
    m._apply()  # checks that the device blocks hold the request's tokens
    assert m.store.decisions.num_landed_blocks == 2
    m.teardown()


def test_store_hits_of_a_request_preempted_before_its_step_are_not_left_cached() -> None:
    # Admitted on two landed store blocks, then preempted in the same schedule (its copies never
    # run): the next request with that prefix must not find those unfilled blocks cached.
    m = ThreeTierMachine()
    m.complete([1, 2, 1, 2, 1], "a")
    m._apply()
    m.kv.flush({"a"})
    m.io.flushed.clear()
    m.store._remembered.clear()
    m.complete([1, 2, 1, 2, 1], "a")
    m._apply()
    m.kv.pool.flush()
    assert m.kv.host is not None
    m.kv.host.pool.flush()
    req = _req("x", [1, 2, 1, 2, 1, 2], "a")
    _, num_hit = m.kv.get_computed_blocks(req)
    assert num_hit == 0 and m.kv.start_fetch(req, 0)
    m.io.answer("ok")
    assert m.store.poll() == ["x"]
    computed, num_hit = m.kv.get_computed_blocks(req)
    assert num_hit == 4 and m.kv.allocate_slots(req, req.num_tokens, computed)
    m.kv.free(req, keep_hashes=True)  # preempted before the step that would fill them
    again = _req("y", [1, 2, 1, 2, 1, 2], "a")
    _, num_hit = m.kv.get_computed_blocks(again)
    assert num_hit == 0  # the store's blocks were never copied in: not a device hit
    m.kv.free(req)
    m.teardown()


def test_a_tier_rebuilt_by_a_reset_never_takes_its_predecessors_late_answer() -> None:
    io = FakeStoreIO()
    io.data[block_key("ns", b"\x01" * 32)] = b"[1, 2]"

    def tier() -> KVStoreTier:
        return KVStoreTier(io, "ns", "m", BS, lambda n: 0.0, 1.0, 10_000, 100.0, clock=lambda: 0.0)

    old, new = tier(), tier()
    assert old.try_fetch("r1", [b"\x01" * 32])
    assert new.try_fetch("r1", [b"\x02" * 32])  # the same request id after the reset, another chain
    io.answer("ok")
    assert new.poll() == ["r1"]
    assert new.landed("r1") == {}  # the old tier's answer (block \x01) is not taken for it


def test_the_fetch_of_a_request_that_ended_is_cancelled_and_its_bytes_freed() -> None:
    io = FakeStoreIO()
    tier = KVStoreTier(io, "ns", "m", BS, lambda n: 0.0, 1.0, 10_000, 100.0, clock=lambda: 0.0)
    for i in range(50):  # a flood of requests aborted while their fetches wait
        assert tier.try_fetch(f"x{i}", [bytes([i]) * 32], "flooder")
        tier.end(f"x{i}")
    assert io.pending == [] and tier._held_bytes == 0 and not tier._held_by_owner and not tier._owner_of
    assert tier.try_fetch("y", [b"\xff" * 32], "victim")
    io.answer("ok")
    assert tier.poll() == ["y"]


def test_a_tenant_holds_at_most_its_share_of_the_fetch_bytes() -> None:
    io = FakeStoreIO()
    tier = KVStoreTier(
        io, "ns", "m", BS, lambda n: 0.0, 1.0, 100, 100.0, clock=lambda: 0.0, tenant_share=0.5
    )  # 10 bytes a block: 5 blocks per tenant
    assert tier.try_fetch("x1", [b"\x01" * 32] * 3, "flooder")
    assert not tier.try_fetch("x2", [b"\x02" * 32] * 3, "flooder")
    assert not tier.try_fetch("x2", [b"\x02" * 32] * 3, "flooder")  # looked at again: one decision
    assert tier.decisions.num_tenant_over_bytes == 1
    assert tier.try_fetch("y", [b"\x03" * 32] * 3, "victim")


def test_a_refused_fetch_recomputes_and_counts_once_per_request() -> None:
    io = FakeStoreIO()
    io.fetch = lambda keys, owner="": None  # type: ignore[method-assign]  # the queue is full
    tier = KVStoreTier(io, "ns", "m", BS, lambda n: 0.0, 1.0, 10_000, 100.0, clock=lambda: 0.0)
    for _ in range(3):
        assert not tier.try_fetch("x", [b"\x01" * 32], "a")
    assert tier.decisions.num_queue_full == 1 and tier.decisions.num_fetched == 0
    assert tier._held_bytes == 0
    tier.end("x")
    assert not tier.try_fetch("x", [b"\x01" * 32], "a")  # a new request of that id: a new decision
    assert tier.decisions.num_queue_full == 2


def test_planned_writes_are_dropped_before_their_bytes_are_read_when_there_is_no_room() -> None:
    dropped: dict[str, int] = {}

    class RoomIO(FakeStoreIO):
        state = BreakerState.CLOSED
        rooms = {"a": 1, "b": 5}

        def write_room(self, scope: str) -> int:
            return self.rooms[scope]

        def count_dropped(self, scope: str, n: int) -> None:
            dropped[scope] = dropped.get(scope, 0) + n

        @property
        def breaker_state(self) -> BreakerState:
            return self.state

    io = RoomIO()
    tier = KVStoreTier(io, "ns", "m", BS, lambda n: 0.0, 1.0, 10_000, 100.0, clock=lambda: 0.0)
    for i in range(3):
        tier.plan_write(i, bytes([i]) * 32, "a")
        tier.plan_write(10 + i, bytes([10 + i]) * 32, "b")
    saves = tier.take_saves()
    assert [b for b, _ in saves] == [0, 10, 11, 12]  # scope a had room for one
    assert dropped == {"a": 2}
    io.state = BreakerState.OPEN
    tier.plan_write(20, b"\x14" * 32, "b")
    assert not tier.has_saves and dropped == {"a": 2, "b": 1}


def test_a_request_freed_before_its_store_fill_runs_writes_none_of_those_blocks_back() -> None:
    """Found by the machine: a fetched block cached at admission whose fill is dropped (the
    request ended in the same step) was written back to the store holding another block's bytes."""
    m = ThreeTierMachine()
    m.complete(prompt=[2, 1, 1, 1], scope="b")
    m.store_flush(scope="b")
    m.fetch(mode="ok", prompt=[2, 1, 1], scope="b")
    m.store_flush(scope="a")
    req = m.live.pop(next(iter(m.live)))
    m.kv.free(req)
    m.step()
    m.the_store_holds_what_each_key_stands_for()
