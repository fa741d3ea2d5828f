"""KV cache manager: lookups, per-scope caps, shared prefixes, forks with copy-on-write.

The state machine drives allocate / compute (append) / fork / preempt / free / evict / flush /
lookup / register / pin over a tiny pool and checks after every step that ref counts equal the
references held, that a referenced block is never free, that nothing leaks, that a scope never
exceeds its cap, and, through a model of every KV slot's content, that a cache hit or a fork
only ever hands out blocks holding exactly the tokens the request expects.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import invariant, precondition, rule

from tests.engine.kv_machine import BS, SCOPES, KVMachineBase, assert_ref_counts
from weir.engine.kv.block_hash import SHARED_SCOPE, CacheKeyRoot
from weir.engine.kv.kv_cache_manager import KVCacheManager
from weir.engine.request import Request, SamplingParams


def _root(
    scope: str, model_version: str = "m", tokenizer: str = "t", rope: str = "r", dtype: str = "f32"
) -> bytes:
    return CacheKeyRoot(model_version, tokenizer, rope, dtype, scope).digest()


def _kv(num_blocks: int = 33, share: float = 1.0, **root: str) -> KVCacheManager:
    return KVCacheManager(
        num_blocks, BS, lambda scope: _root(scope, **root), watermark=0.0, tenant_cache_share=share
    )


def _req(rid: str, prompt: list[int], scope: str = "a", tenant: str | None = None) -> Request:
    return Request(
        rid, list(prompt), SamplingParams(max_tokens=64), tenant_id=tenant or scope, cache_scope=scope
    )


def _admit(kv: KVCacheManager, req: Request) -> int:
    computed, num_hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens, computed)
    req.num_computed_tokens = num_hit
    kv.lookup.record_lookup(req, num_hit)
    return num_hit


def _compute_all(kv: KVCacheManager, req: Request) -> None:
    assert kv.allocate_slots(req, req.num_tokens)
    req.num_computed_tokens = req.num_tokens
    kv.cache_full_blocks(req)


def test_a_second_identical_prompt_hits_all_but_the_last_block() -> None:
    kv = _kv()
    first = _req("1", list(range(10)))
    assert _admit(kv, first) == 0
    _compute_all(kv, first)
    second = _req("2", list(range(10)))
    assert _admit(kv, second) == 8  # 5 full blocks; the last is recomputed for its logits
    assert kv.blocks(second.request_id)[:4] == kv.blocks(first.request_id)[:4]
    assert (
        kv.lookup.totals.hit_tokens == 8
        and kv.lookup.totals.queried_tokens == 20
        and kv.lookup.totals.num_queries == 2
    )


@pytest.mark.parametrize(
    "other",
    [
        dict(scope="b"),
        dict(model_version="m2"),
        dict(tokenizer="t2"),
        dict(rope="r2"),
        dict(dtype="bf16"),
    ],
)
def test_no_hit_across_any_root_key(other: dict[str, str]) -> None:
    """Two tenants, model versions, tokenizers, RoPE configs or KV dtypes never share a block."""
    scope = other.pop("scope", "a")
    a = _kv()
    b = _kv(**other)
    prompt = list(range(40))
    ha = a.lookup.hashes(_req("x", prompt, "a"))
    hb = b.lookup.hashes(_req("y", prompt, scope))
    assert len(ha) == len(hb) == 20 and not set(ha) & set(hb)
    # In one pool: the blocks computed under one root are invisible under the other.
    first = _req("1", prompt, "a")
    _admit(a, first)
    _compute_all(a, first)
    a.free(first)
    a.lookup._root_digest = lambda s: _root(s, **other)  # e.g. the same pool after a model version change
    a.lookup._roots.clear()
    assert _admit(a, _req("2", prompt, scope)) == 0


def test_tenants_do_not_share_blocks_in_one_pool() -> None:
    kv = _kv()
    first = _req("1", list(range(12)), "a")
    _admit(kv, first)
    _compute_all(kv, first)
    other = _req("2", list(range(12)), "b")
    assert _admit(kv, other) == 0
    assert not set(kv.blocks("1")) & set(kv.blocks("2"))


def test_shared_prefix_is_shared_and_what_follows_stays_private() -> None:
    kv = _kv()
    system = list(range(100, 108))  # 4 full blocks
    kv.shared_prefixes.register(system, "sys")
    a = _req("a1", system + [1, 2, 3, 4], "a")
    _admit(kv, a)
    _compute_all(kv, a)
    shared = kv.blocks("a1")[:4]
    assert all(blk.cache_scope == SHARED_SCOPE for blk in shared)
    assert all(blk.cache_scope == "a" for blk in kv.blocks("a1")[4:6])
    # Tenant b finds the shared blocks, not a's continuation.
    b = _req("b1", system + [1, 2, 3, 4], "b")
    assert _admit(kv, b) == 8
    assert kv.blocks("b1")[:4] == shared
    assert not set(kv.blocks("b1")[4:]) & set(kv.blocks("a1")[4:])
    # A prompt that only shares part of the prefix shares nothing from the shared scope.
    c = _req("c1", system[:5] + [9, 9, 9], "b")
    assert kv.lookup.hashes(c)[0] != kv.lookup.hashes(b)[0]
    # Tenant a's own continuation is found by tenant a.
    a2 = _req("a2", system + [1, 2, 3, 4, 5], "a")
    assert _admit(kv, a2) == 12


def test_pinned_shared_prefix_survives_a_flood() -> None:
    kv = _kv(num_blocks=21)
    system = list(range(100, 108))
    prefix = kv.shared_prefixes.register(system, "sys", pin=True)
    warm = _req("w", system, "<admin>")
    _admit(kv, warm)
    _compute_all(kv, warm)
    kv.free(warm)
    assert kv.pool.num_pinned_blocks == 4
    for i in range(30):  # unique prompts, far more than the pool
        r = _req(f"f{i}", [1000 + i] * 12, "noisy")
        _admit(kv, r)
        _compute_all(kv, r)
        kv.free(r)
    assert all(kv.pool.lookup(h) is not None for h in prefix.hashes)
    kv.shared_prefixes.unpin(prefix.prefix_id)
    assert kv.pool.num_pinned_blocks == 0 and kv.num_free_blocks == kv.num_total_blocks


def test_per_tenant_cap_holds_under_a_flood_of_unique_prompts() -> None:
    kv = _kv(num_blocks=41, share=0.25)  # 40 usable blocks: at most 10 cached per scope
    cap = kv.max_cached_blocks_per_scope
    assert cap == 10
    quiet = _req("q", list(range(500, 508)), "quiet")
    _admit(kv, quiet)
    _compute_all(kv, quiet)
    kv.free(quiet)
    for i in range(200):
        r = _req(f"n{i}", [i, i + 1, i + 2] * 3, "noisy")
        _admit(kv, r)
        _compute_all(kv, r)
        assert kv.pool.num_cached_blocks("noisy") <= cap
        kv.free(r)
    assert kv.pool.num_cached_blocks("noisy") == cap
    # The quiet tenant's prefix was never evicted by the noisy one.
    again = _req("q2", list(range(500, 508)), "quiet")
    assert _admit(kv, again) == 6
    assert kv.pool.evictions_by_scope.get("quiet", 0) == 0


def test_fork_shares_blocks_and_copies_the_partial_block_on_write() -> None:
    kv = _kv()
    parent = _req("p", list(range(7)))  # blocks: 3 full + 1 partial (1 token)
    _admit(kv, parent)
    _compute_all(kv, parent)
    children = []
    for i in range(3):
        child = _req(f"c{i}", list(range(7)))
        child.num_computed_tokens = 6  # recomputes the last prompt token for its own sample
        kv.fork(parent, child)
        children.append(child)
    table = kv.blocks("p")
    assert [b.ref_cnt for b in table] == [4, 4, 4, 1]  # the 4th block is not shared: position 6 starts it
    # With an odd cut the partial block is shared and copied on the first write.
    child = _req("odd", list(range(7)) + [50])
    child.num_computed_tokens = 5
    kv.fork(parent, child)
    assert kv.blocks("odd")[2] is table[2] and table[2].ref_cnt == 5
    assert kv.allocate_slots(child, 8)
    assert kv.copy_plan.take_copies() == ((table[2].block_id, kv.blocks("odd")[2].block_id),)
    assert table[2].ref_cnt == 4 and kv.blocks("odd")[2].ref_cnt == 1


# -- the state machine -------------------------------------------------------------------------------

tokens = st.lists(st.integers(1, 3), min_size=1, max_size=9)


class KVMachine(KVMachineBase):
    """Random request lifecycles over a 12-block pool with caps, shared prefixes and forks."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = _kv(num_blocks=13, share=0.5)
        self.live: dict[str, Request] = {}
        self.preempted: dict[str, Request] = {}
        self.content: dict[int, list[int | None]] = {}  # block id -> token in each slot
        self.expected: dict[bytes, list[int]] = {}  # cached hash -> the tokens of its block
        self.next_id = 0
        self.next_token = 100

    # -- helpers ----------------------------------------------------------------------------------

    def _check_hits(self, req: Request, num_hit: int) -> None:
        for p in range(num_hit):
            block = self.kv.blocks(req.request_id)[p // BS]
            assert block.cache_scope in (req.cache_scope, SHARED_SCOPE)
            assert self.content[block.block_id][p % BS] == req.token_at(p), "a hit holds other tokens"

    def _admit(self, req: Request) -> bool:
        computed, num_hit = self.kv.get_computed_blocks(req)
        if not self.kv.allocate_slots(req, req.num_tokens, computed):
            return False
        req.num_computed_tokens = num_hit
        self.kv.mark_inflight(req)
        self._check_hits(req, num_hit)
        self.live[req.request_id] = req
        return True

    # -- rules --------------------------------------------------------------------------------------

    @rule(prompt=tokens, scope=st.sampled_from(SCOPES))
    def add(self, prompt: list[int], scope: str) -> None:
        req = _req(self._new_id(), prompt, scope)
        if not self._admit(req):
            self.kv.free(req)

    @precondition(lambda self: self.preempted)
    @rule(data=st.data())
    def readmit(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.preempted)))
        req = self.preempted[rid]
        if self._admit(req):
            del self.preempted[rid]

    @precondition(lambda self: self.live)
    @rule(data=st.data(), n=st.integers(1, 5))
    def compute(self, data: st.DataObject, n: int) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        req = self.live[rid]
        if req.num_remaining == 0:
            self.next_token += 1
            req.output_token_ids.append(self.next_token % 4 + 1)  # "sample" a token
        num_new = min(n, req.num_remaining)
        if not self.kv.allocate_slots(req, req.num_computed_tokens + num_new):
            return
        for src, dst in self.kv.copy_plan.take_copies():
            self.content[dst] = list(self.content[src])
        table = self.kv.blocks(rid)
        for p in range(req.num_computed_tokens, req.num_computed_tokens + num_new):
            block = table[p // BS]
            assert block.ref_cnt == 1 and block.block_hash is None, "wrote into a shared or cached block"
            slots = self.content.setdefault(block.block_id, [None] * BS)
            slots[p % BS] = req.token_at(p)
        req.num_computed_tokens += num_new
        self.kv.cache_full_blocks(req)
        self._record_cached(req)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        self.kv.free(self.live.pop(rid))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        req = self.live.pop(rid)
        self.kv.free(req, keep_hashes=True)
        req.num_computed_tokens = 0
        self.preempted[rid] = req

    @rule(scope=st.sampled_from((*SCOPES, SHARED_SCOPE)))
    def evict_lru(self, scope: str) -> None:
        self.kv.pool.evict_lru_of_scope(scope)

    @rule(scope=st.sampled_from((*SCOPES, None)), pinned=st.booleans())
    def flush(self, scope: str | None, pinned: bool) -> None:
        self.kv.flush({scope} if scope is not None else None, include_pinned=pinned)

    @rule(prompt=tokens, scope=st.sampled_from(SCOPES))
    def lookup(self, prompt: list[int], scope: str) -> None:
        req = _req(self._new_id(), prompt, scope)
        hits, num_hit = self.kv.get_computed_blocks(req)
        assert num_hit < req.num_tokens
        for p in range(num_hit):
            assert self.content[hits[p // BS].block_id][p % BS] == req.token_at(p)
        self.kv.free(req)

    # -- invariants ---------------------------------------------------------------------------------

    @invariant()
    def ref_counts_match_references(self) -> None:
        pool = self.kv.pool
        assert_ref_counts(pool, (block for rid in self.live for block in self.kv.blocks(rid)))
        assert pool.num_free_blocks == sum(1 for b in pool.blocks[1:] if b.ref_cnt == 0 and not b.pinned)
        assert len(list(pool.free_queue)) == pool.num_free_blocks

    @invariant()
    def cache_map_is_consistent(self) -> None:
        pool = self.kv.pool
        by_scope: dict[str, int] = {}
        for h, block in pool.cached.items():
            assert block.block_hash == h
            assert block.pinned == pool.is_pinned(h)
            by_scope[block.cache_scope or ""] = by_scope.get(block.cache_scope or "", 0) + 1
            assert self.content[block.block_id] == self.expected[h], "a cached block changed"
        for scope, n in pool.cached_blocks_by_scope.items():
            assert by_scope.get(scope, 0) == n
        for scope in SCOPES:
            assert pool.num_cached_blocks(scope) <= self.kv.max_cached_blocks_per_scope
            free_cached = {
                b.block_id
                for b in pool.blocks[1:]
                if b.cache_scope == scope and b.ref_cnt == 0 and not b.pinned
            }
            assert set(pool._scope_free.get(scope, {})) == free_cached
        assert pool.num_pinned_blocks == sum(1 for b in pool.blocks[1:] if b.pinned)

    @invariant()
    def live_requests_see_their_tokens(self) -> None:
        for rid, req in self.live.items():
            table = self.kv.blocks(rid)
            assert len(table) * BS >= req.num_computed_tokens
            for p in range(req.num_computed_tokens):
                assert self.content[table[p // BS].block_id][p % BS] == req.token_at(p)

    def teardown(self) -> None:
        for req in self.live.values():
            self.kv.free(req)
        for prefix in self.kv.shared_prefixes.prefixes():
            self.kv.shared_prefixes.unregister(prefix.prefix_id)
        pool = self.kv.pool
        assert pool.num_free_blocks == pool.num_usable_blocks, "blocks leaked"
        assert all(b.ref_cnt == 0 for b in pool.blocks[1:])
        assert not self.kv.lookup.num_inflight


TestKVMachine = KVMachine.TestCase
TestKVMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
