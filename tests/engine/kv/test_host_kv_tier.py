"""The host KV tier: swap-out and swap-in, demotion and promotion, and a two-tier state machine.

The state machine drives a KV cache manager with a host tier through allocate / compute / fork /
preempt (swap or recompute) / swap-in / re-admit / free / abort while swapped / evict (demote) /
lookup (promote) / flush / pin, letting several of them share one step, as the scheduler does.
At each step boundary it performs the step's copies in the runner's order (swap-out, copy-on-
write, swap-in) on a model of every slot of both tiers and checks that every running request sees
its tokens, every swapped request's host blocks hold them, and every cached block in either tier
holds the tokens its hash stands for. After every rule, ref counts in both tiers equal the
references held (tables, swap records, the step's held host blocks); at the end nothing leaks.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import invariant, precondition, rule

from tests.engine.kv_machine import BS, SCOPES, KVMachineBase, assert_ref_counts
from tests.engine.kv_machine import make_request as _req
from weir.engine.config import PreemptionMode
from weir.engine.kv.block_hash import SHARED_SCOPE, CacheKeyRoot
from weir.engine.kv.block_pool import BlockPool
from weir.engine.kv.host_kv_tier import HostKVTier
from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.kv.swap_policy import SwapPolicy
from weir.engine.request import Request


def _kv(num_blocks: int = 33, host: int = 16, share: float = 1.0, mode: PreemptionMode = PreemptionMode.SWAP):
    return KVCacheManager(
        num_blocks,
        BS,
        lambda scope: CacheKeyRoot("m", "t", "r", "f32", scope).digest(),
        watermark=0.0,
        tenant_cache_share=share,
        host_num_blocks=host,
        swap_policy=SwapPolicy(block_bytes=1, mode=mode),
    )


def _run(kv: KVCacheManager, req: Request) -> None:
    computed, num_hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens, computed)
    req.num_computed_tokens = req.num_tokens
    kv.cache_full_blocks(req)


def test_swap_out_copies_only_what_the_host_lacks_and_swap_in_restores_the_table() -> None:
    kv = _kv()
    req = _req("r", list(range(1, 8)))  # 3 full blocks (cached) + 1 partial
    _run(kv, req)
    device_ids = [b.block_id for b in kv.blocks("r")]
    assert kv.preempt(req) is PreemptionMode.SWAP and kv.is_swapped("r")
    assert kv.blocks("r") == [] and kv.num_free_blocks == kv.num_total_blocks
    out = kv.copy_plan.take_transfers()
    assert [d for d, _ in out.swap_out] == device_ids and not out.swap_in
    assert kv.host is not None and kv.host.stats().num_swapped_requests == 1
    assert kv.swap_in(req)
    assert req.num_computed_tokens == 7
    back = kv.copy_plan.take_transfers()
    # The three cached blocks are still cached on the device: only the partial block comes back.
    assert len(back.swap_in) == 1 and back.swapped_in_ids == ("r",)
    assert [b.block_id for b in kv.blocks("r")][:3] == device_ids[:3]
    kv.free(req)
    assert kv.host.pool.num_free_blocks == kv.host.pool.num_usable_blocks


def test_a_victim_swaps_only_when_the_host_has_room_else_it_recomputes() -> None:
    kv = _kv(host=2)
    req = _req("r", list(range(1, 8)))
    _run(kv, req)
    assert kv.preempt(req) is PreemptionMode.RECOMPUTE  # 4 blocks, 2 host blocks
    assert not kv.is_swapped("r")


def test_a_tenants_swapped_requests_hold_at_most_its_share_of_the_host_pool() -> None:
    kv = _kv(host=8, share=0.5)  # 4 host blocks per scope
    first, second = _req("a1", list(range(1, 8))), _req("a2", list(range(11, 18)))  # 4 blocks each
    other = _req("b1", list(range(1, 8)), scope="b")
    for req in (first, second, other):
        _run(kv, req)
    assert kv.preempt(first) is PreemptionMode.SWAP
    assert kv.preempt(second) is PreemptionMode.RECOMPUTE  # the host has room, but not a's share
    assert kv.preempt(other) is PreemptionMode.SWAP  # another tenant still swaps
    kv.drop_swapped(first)
    assert kv.host is not None and kv.host.swapped_blocks_by_scope == {"b": 4}


def test_a_request_filled_by_this_steps_swap_in_is_never_swapped_out_in_it() -> None:
    kv = _kv()
    req = _req("r", list(range(1, 8)))
    _run(kv, req)
    kv.preempt(req)
    assert kv.swap_in(req)
    assert kv.preempt(req) is PreemptionMode.RECOMPUTE  # its swap-in copies have not run yet
    kv.copy_plan.take_transfers()
    kv.free(req)


def test_evicted_blocks_are_demoted_and_a_later_hit_promotes_them() -> None:
    kv = _kv(num_blocks=5, host=8)  # 4 usable device blocks
    first = _req("1", [1, 2, 3, 4, 5, 6, 7])
    _run(kv, first)
    kv.free(first)
    kv.copy_plan.take_transfers()
    other = _req("2", [9, 9, 9, 9, 9, 9, 9])
    _run(kv, other)  # evicts first's three cached blocks: demoted
    assert kv.host is not None and kv.host.num_demotions == 3
    assert len(kv.copy_plan.take_transfers().swap_out) == 3
    kv.free(other)
    again = _req("3", [1, 2, 3, 4, 5, 6, 7, 8])
    computed, num_hit = kv.get_computed_blocks(again)
    assert num_hit == 6 and all(kv.host.owns(b) for b in computed)
    assert kv.allocate_slots(again, again.num_tokens, computed)
    plan = kv.copy_plan.take_transfers()
    assert len(plan.swap_in) == 3 and plan.swapped_in_ids == ("3",)
    assert kv.host.num_promotions == 3
    assert all(
        kv.pool.lookup(b.block_hash) is d
        for b, d in zip(computed, kv.blocks("3"), strict=False)
        if b.block_hash
    )


def test_a_copy_on_write_of_a_block_promoted_in_the_same_step_copies_from_the_host() -> None:
    # The runner copies device blocks before the host fills them (engine/kv/kv_swap.py): a fork
    # that writes into a prefix block promoted in this step must take that block's host copy.
    kv = _kv(num_blocks=6, host=8)
    first = _req("1", [1, 2, 3, 4, 5, 6, 7])
    _run(kv, first)
    kv.free(first)
    kv.copy_plan.take_transfers()
    other = _req("2", [9] * 9)
    _run(kv, other)  # demotes first's three cached blocks
    kv.free(other)
    kv.copy_plan.take_transfers()
    kv.copy_plan.take_copies()
    parent = _req("3", [1, 2, 3, 4, 5, 6, 7, 8])
    computed, num_hit = kv.get_computed_blocks(parent)
    assert num_hit == 6 and kv.allocate_slots(parent, parent.num_tokens, computed)
    parent.num_computed_tokens = num_hit
    child = _req("4", [1, 2, 3, 9])
    child.num_computed_tokens = 3
    kv.fork(parent, child)
    assert kv.allocate_slots(child, 4)  # writes token 3 into the shared second block: copy first
    promoted = kv.blocks("3")[1].block_id
    written = kv.blocks("4")[1].block_id
    assert written != promoted
    assert all(src != promoted for src, _ in kv.copy_plan.take_copies())
    swap_in = dict((dst, src) for src, dst in kv.copy_plan.take_transfers().swap_in)
    assert swap_in[written] == swap_in[promoted]


def test_a_tenant_never_finds_another_tenants_private_block_on_the_host() -> None:
    kv = _kv(num_blocks=5, host=8)
    mine = _req("1", [1, 2, 3, 4, 5, 6, 7], scope="a")
    _run(kv, mine)
    kv.free(mine)
    _run(kv, _req("2", [9] * 7, scope="c"))  # demotes a's blocks
    assert kv.host is not None and kv.host.num_demotions == 3
    theirs = _req("3", [1, 2, 3, 4, 5, 6, 7], scope="b")
    assert kv.get_computed_blocks(theirs) == ([], 0)
    assert kv.get_computed_blocks(_req("4", [1, 2, 3, 4, 5, 6, 7], scope="a"))[1] == 6


def test_host_pins_follow_the_device_pins() -> None:
    device = BlockPool(5)
    host = HostKVTier(4, device, BS, SwapPolicy(block_bytes=1))
    (a,) = device.allocate(1)
    device.cache(a, b"h", "s")
    device.free([a])
    device.allocate(4)  # evicts a: demoted
    hb = host.lookup(b"h")
    assert hb is not None and hb.ref_cnt == 0 and host.pool.num_free_blocks == 4
    device.pin(b"h")
    assert hb.pinned and host.pool.num_free_blocks == 3  # held: never evicted from the host either
    device.unpin(b"h")
    assert not hb.pinned and host.pool.num_free_blocks == 4


def test_the_host_tier_needs_a_block() -> None:
    with pytest.raises(ValueError, match="host num_blocks"):
        HostKVTier(0, BlockPool(3), BS, SwapPolicy(block_bytes=1))


# -- the state machine -------------------------------------------------------------------------------

tokens = st.lists(st.integers(1, 2), min_size=1, max_size=9)
MODES = (PreemptionMode.SWAP, PreemptionMode.RECOMPUTE, PreemptionMode.AUTO)


class TwoTierMachine(KVMachineBase):
    """Random request lifecycles over a 9-block device pool and an 8-block host pool."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = _kv(num_blocks=10, host=8, share=0.5)
        self.live: dict[str, Request] = {}
        self.preempted: dict[str, Request] = {}
        self.swapped: dict[str, Request] = {}
        self.device: dict[int, list[int | None]] = {}  # device block id -> token in each slot
        self.host: dict[int, list[int | None]] = {}  # host block id -> token in each slot
        self.expected: dict[bytes, list[int]] = {}  # cached hash -> the tokens of its block
        self.next_id = 0
        self.next_token = 100

    @property
    def tier(self) -> HostKVTier:
        assert self.kv.host is not None
        return self.kv.host

    # -- the step boundary: the runner's copies, then the content checks --------------------------

    def _apply(self) -> None:
        copies = self.kv.copy_plan.take_copies()
        plan = self.kv.copy_plan.take_transfers()
        blank: list[int | None] = [None] * BS
        for d, h in plan.swap_out:
            self.host[h] = list(self.device.get(d, blank))
        for src, dst in copies:
            self.device[dst] = list(self.device.get(src, blank))
        for h, d in plan.swap_in:
            self.device[d] = list(self.host.get(h, blank))
        self._check_contents()

    def _check_contents(self) -> None:
        for rid, req in self.live.items():
            table = self.kv.blocks(rid)
            for p in range(req.num_computed_tokens):
                assert self.device[table[p // BS].block_id][p % BS] == req.token_at(p), "device KV lost"
        for rid, req in self.swapped.items():
            record = self.tier.records[rid]
            assert record.num_computed_tokens == req.num_computed_tokens
            for p in range(req.num_computed_tokens):
                assert self.host[record.host_blocks[p // BS].block_id][p % BS] == req.token_at(p), (
                    "host KV lost"
                )
        for pool, content in ((self.kv.pool, self.device), (self.tier.pool, self.host)):
            for h, block in pool.cached.items():
                if h in self.expected:
                    assert content[block.block_id] == self.expected[h], "a cached block holds other tokens"

    def _admit(self, req: Request) -> bool:
        computed, num_hit = self.kv.get_computed_blocks(req)
        if not self.kv.allocate_slots(req, req.num_tokens, computed):
            return False
        req.num_computed_tokens = num_hit
        self.live[req.request_id] = req
        return True

    # -- rules --------------------------------------------------------------------------------------

    @rule(prompt=tokens, scope=st.sampled_from(SCOPES))
    def add(self, prompt: list[int], scope: str) -> None:
        req = _req(self._new_id(), prompt, scope)
        if not self._admit(req):
            self.kv.free(req)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), n=st.integers(1, 5))
    def compute(self, data: st.DataObject, n: int) -> None:
        req = self._pick(data, self.live)
        if req.num_remaining == 0:
            self.next_token += 1
            req.output_token_ids.append(self.next_token % 4 + 1)
        num_new = min(n, req.num_remaining)
        if not self.kv.allocate_slots(req, req.num_computed_tokens + num_new):
            return
        self._apply()  # the step's copies run before its forward writes
        table = self.kv.blocks(req.request_id)
        for p in range(req.num_computed_tokens, req.num_computed_tokens + num_new):
            block = table[p // BS]
            assert block.ref_cnt == 1 and block.block_hash is None, "wrote into a shared or cached block"
            self.device.setdefault(block.block_id, [None] * BS)[p % BS] = req.token_at(p)
        req.num_computed_tokens += num_new
        self.kv.cache_full_blocks(req)
        self._record_cached(req)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), mode=st.sampled_from(MODES))
    def preempt(self, data: st.DataObject, mode: PreemptionMode) -> None:
        req = self._pick(data, self.live)
        del self.live[req.request_id]
        self.tier.swap_policy.mode = mode
        if self.kv.preempt(req) is PreemptionMode.SWAP:
            assert self.kv.is_swapped(req.request_id)
            self.swapped[req.request_id] = req
        else:
            assert mode is not PreemptionMode.SWAP or not self.kv.is_swapped(req.request_id)
            req.num_computed_tokens = 0
            self.preempted[req.request_id] = req

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        req = self._pick(data, self.swapped)
        computed = req.num_computed_tokens
        if self.kv.swap_in(req):
            assert req.num_computed_tokens == computed
            del self.swapped[req.request_id]
            self.live[req.request_id] = req
        else:
            assert self.kv.is_swapped(req.request_id) and not self.kv.blocks(req.request_id)

    @precondition(lambda self: self.preempted)
    @rule(data=st.data())
    def readmit(self, data: st.DataObject) -> None:
        req = self._pick(data, self.preempted)
        if self._admit(req):
            del self.preempted[req.request_id]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        self.kv.free(self.live.pop(self._pick(data, self.live).request_id))

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def abort_while_swapped(self, data: st.DataObject) -> None:
        req = self.swapped.pop(self._pick(data, self.swapped).request_id)
        self.kv.free(req)
        assert not self.kv.is_swapped(req.request_id)

    def _complete(self, req: Request) -> None:
        """Admit `req` (prefix hits, promotions), compute all its tokens in one step, free it."""
        if not self._admit(req):
            self.kv.free(req)
            return
        self._apply()
        table = self.kv.blocks(req.request_id)
        for p in range(req.num_computed_tokens, req.num_tokens):
            self.device.setdefault(table[p // BS].block_id, [None] * BS)[p % BS] = req.token_at(p)
        req.num_computed_tokens = req.num_tokens
        self.kv.cache_full_blocks(req)
        self._record_cached(req)
        del self.live[req.request_id]
        self.kv.free(req)

    @rule(prompt=tokens, scope=st.sampled_from(SCOPES))
    def complete(self, prompt: list[int], scope: str) -> None:
        self._complete(_req(self._new_id(), prompt, scope))

    @rule(scope=st.sampled_from(SCOPES), size=st.integers(2, 8))
    def churn(self, scope: str, size: int) -> None:
        """A request of fresh tokens runs and ends: the device evicts (and demotes) to fit it."""
        self.next_token += 1
        self._complete(_req(self._new_id(), [1000 * self.next_token + i for i in range(size)], scope))

    @rule(scope=st.sampled_from((*SCOPES, SHARED_SCOPE)))
    def evict(self, scope: str) -> None:
        self.kv.pool.evict_lru_of_scope(scope)  # demotes to the host tier

    @rule(prompt=tokens, scope=st.sampled_from(SCOPES))
    def lookup(self, prompt: list[int], scope: str) -> None:
        self._apply()
        req = _req(self._new_id(), prompt, scope)
        hits, num_hit = self.kv.get_computed_blocks(req)
        assert num_hit < req.num_tokens
        for p in range(num_hit):
            block = hits[p // BS]
            content = self.host if self.tier.owns(block) else self.device
            assert block.cache_scope in (scope, SHARED_SCOPE), "found another scope's block"
            assert content[block.block_id][p % BS] == req.token_at(p)
        self.kv.free(req)

    @rule()
    def step(self) -> None:
        self._apply()

    @rule(scope=st.sampled_from((*SCOPES, None)), pinned=st.booleans())
    def flush(self, scope: str | None, pinned: bool) -> None:
        self.kv.flush({scope} if scope is not None else None, include_pinned=pinned)

    # -- invariants ---------------------------------------------------------------------------------

    @invariant()
    def device_ref_counts_match_tables(self) -> None:
        assert_ref_counts(self.kv.pool, (block for rid in self.live for block in self.kv.blocks(rid)))
        for rid in (*self.swapped, *self.preempted):
            assert self.kv.blocks(rid) == []

    @invariant()
    def host_ref_counts_match_records_and_the_step(self) -> None:
        tier = self.tier
        assert set(tier.records) == set(self.swapped)
        pool = tier.pool
        assert_ref_counts(
            pool, [*(b for r in tier.records.values() for b in r.host_blocks), *tier._plan.held]
        )
        assert pool.num_free_blocks == sum(1 for b in pool.blocks[1:] if b.ref_cnt == 0 and not b.pinned)

    @invariant()
    def swapped_requests_keep_their_scopes_share(self) -> None:
        charged: dict[str, int] = {}
        for record in self.tier.records.values():
            if record.num_charged:
                charged[record.scope] = charged.get(record.scope, 0) + record.num_charged
        assert self.tier.swapped_blocks_by_scope == charged
        assert all(n <= self.tier.max_cached_blocks_per_scope for n in charged.values())

    @invariant()
    def both_tiers_keep_caps_and_pins(self) -> None:
        for pool, cap in (
            (self.kv.pool, self.kv.max_cached_blocks_per_scope),
            (self.tier.pool, self.tier.max_cached_blocks_per_scope),
        ):
            for h, block in pool.cached.items():
                assert block.block_hash == h and block.pinned == pool.is_pinned(h)
            for scope in SCOPES:
                assert pool.num_cached_blocks(scope) <= cap

    def teardown(self) -> None:
        for group in (self.live, self.swapped, self.preempted):
            for req in group.values():
                self.kv.free(req)
            group.clear()
        self._apply()
        for prefix in self.kv.shared_prefixes.prefixes():
            self.kv.shared_prefixes.unregister(prefix.prefix_id)
        for pool in (self.kv.pool, self.tier.pool):
            assert pool.num_free_blocks == pool.num_usable_blocks, "blocks leaked"
            assert all(b.ref_cnt == 0 for b in pool.blocks[1:])
        assert not self.tier.records


TestTwoTierMachine = TwoTierMachine.TestCase
TestTwoTierMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
