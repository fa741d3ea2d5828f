"""Block pool: O(1) free queue, ref counts, prefix-cache map, and a hypothesis state machine."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from weir.engine.kv.block_hash import SHARED_SCOPE
from weir.engine.kv.block_pool import Block, BlockPool, FreeBlockQueue


def test_null_block_is_never_allocated() -> None:
    pool = BlockPool(4)
    got = pool.allocate(3)
    assert sorted(b.block_id for b in got) == [1, 2, 3]
    with pytest.raises(ValueError):
        pool.allocate(1)


def test_free_queue_remove_from_middle() -> None:
    blocks = [Block(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    q.remove(blocks[2])
    assert [b.block_id for b in q] == [0, 1, 3, 4]
    assert q.popleft().block_id == 0
    assert q.num_free == 3


def test_double_free_raises() -> None:
    pool = BlockPool(3)
    (b,) = pool.allocate(1)
    pool.free([b])
    with pytest.raises(ValueError, match="double free"):
        pool.free([b])


def test_cached_block_is_revived_then_evicted_lru() -> None:
    pool = BlockPool(3)
    a, b = pool.allocate(2)
    pool.cache(a, b"ha", "t1")
    pool.cache(b, b"hb", "t1")
    pool.free([b, a])  # b freed first -> evicted first
    assert pool.lookup(b"ha") is a
    pool.touch([a])
    assert a.ref_cnt == 1 and pool.num_free_blocks == 1
    (c,) = pool.allocate(1)
    assert c is b and pool.lookup(b"hb") is None
    assert pool.num_evictions == 1


def test_uncached_free_block_loses_nothing() -> None:
    pool = BlockPool(2, enable_caching=False)
    (a,) = pool.allocate(1)
    pool.cache(a, b"h", "s")
    assert pool.lookup(b"h") is None


def test_uncached_free_blocks_are_used_before_any_cached_block_is_evicted() -> None:
    pool = BlockPool(5)
    a, b, c = pool.allocate(3)
    pool.cache(a, b"ha", "t")
    pool.free([a])  # cached: tail
    pool.free([b, c])  # plain: head
    got = pool.allocate(3)
    assert got[:2] in ([c, b], [b, c]) and pool.lookup(b"ha") is a
    assert pool.num_evictions == 0
    pool.free(got)


def test_scope_lru_eviction_is_its_own_oldest_block_and_moves_it_to_the_head() -> None:
    pool = BlockPool(6)
    blocks = pool.allocate(5)
    for i, (blk, scope) in enumerate(zip(blocks, ["x", "y", "x", "y", "x"], strict=True)):
        pool.cache(blk, bytes([i]), scope)
    pool.free(blocks)  # freed in order: 0 is the oldest
    assert pool.num_free_cached_blocks("x") == 3
    assert pool.evict_lru_of_scope("x")
    assert pool.lookup(bytes([0])) is None and pool.lookup(bytes([1])) is not None
    assert pool.evictions_by_scope == {"x": 1} and pool.num_cached_blocks("x") == 2
    assert pool.allocate(1)[0] is blocks[0]  # the evicted block is reused first
    assert not pool.evict_lru_of_scope("z")


def test_room_in_scope_evicts_the_scopes_own_oldest_block_at_its_cap() -> None:
    pool = BlockPool(6)
    a, b, c = pool.allocate(3)
    pool.cache(a, b"a", "x")
    pool.cache(b, b"b", "x")
    assert pool.room_in_scope("x", cap=3) and pool.num_evictions == 0  # under the cap
    assert not pool.room_in_scope("x", cap=2)  # at the cap, every block in use
    pool.free([a])
    assert pool.room_in_scope("x", cap=2) and pool.lookup(b"a") is None  # its own LRU block went
    pool.cache(c, b"c", SHARED_SCOPE)
    assert pool.room_in_scope(SHARED_SCOPE, cap=1)  # the shared scope has no cap


def test_pinned_blocks_are_never_evicted_until_unpinned() -> None:
    pool = BlockPool(3)
    pool.pin(b"p")
    a, b = pool.allocate(2)
    pool.cache(a, b"p", "<shared>")
    assert a.pinned and pool.num_pinned_blocks == 1
    pool.free([a, b])
    assert pool.num_free_blocks == 1  # a is held
    assert pool.allocate(1) == [b]
    with pytest.raises(ValueError):
        pool.allocate(1)
    assert pool.flush() == 0  # pinned survive a flush
    pool.unpin(b"p")
    assert not a.pinned and pool.num_free_blocks == 1 and pool.lookup(b"p") is a
    pool.touch([a])
    pool.pin(b"p")
    pool.free([a])
    assert pool.num_free_blocks == 0
    assert pool.flush(include_pinned=True) == 1 and pool.num_free_blocks == 1


def test_flush_by_scope_keeps_blocks_in_use_with_their_requests() -> None:
    pool = BlockPool(4)
    a, b, c = pool.allocate(3)
    for blk, h, scope in ((a, b"a", "x"), (b, b"b", "x"), (c, b"c", "y")):
        pool.cache(blk, h, scope)
    pool.free([b])
    assert pool.flush(lambda blk: blk.cache_scope == "x") == 2
    assert a.ref_cnt == 1 and a.block_hash is None and pool.lookup(b"c") is c
    assert pool.num_free_blocks == 1 and pool.num_cached_blocks("x") == 0


class BlockPoolMachine(RuleBasedStateMachine):
    """Random allocate / share / free / cache / lookup sequences keep the pool consistent."""

    owned = Bundle("owned")

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(9)
        self.refs: dict[int, int] = {}  # our model of ref counts of handed-out blocks
        self.next_hash = 0

    @rule(target=owned, n=st.integers(1, 3))
    def allocate(self, n: int):  # type: ignore[no-untyped-def]
        if n > self.pool.num_free_blocks:
            with pytest.raises(ValueError):
                self.pool.allocate(n)
            return []
        blocks = self.pool.allocate(n)
        for b in blocks:
            assert self.refs.get(b.block_id, 0) == 0, "allocated a block still referenced"
            self.refs[b.block_id] = 1
        return blocks

    @rule(target=owned, blocks=owned)
    def share(self, blocks):  # type: ignore[no-untyped-def]
        live = [b for b in blocks if self.refs.get(b.block_id, 0) > 0]
        self.pool.touch(live)
        for b in live:
            self.refs[b.block_id] += 1
        return live

    @rule(blocks=consumes(owned))
    def free(self, blocks):  # type: ignore[no-untyped-def]
        for b in reversed(blocks):
            if self.refs.get(b.block_id, 0) > 0:
                self.pool.free([b])
                self.refs[b.block_id] -= 1

    @rule(blocks=owned)
    def cache(self, blocks):  # type: ignore[no-untyped-def]
        for b in blocks:
            if self.refs.get(b.block_id, 0) > 0:
                self.next_hash += 1
                self.pool.cache(b, self.next_hash.to_bytes(8, "little"), "s")

    @rule(h=st.integers(1, 40))
    def lookup_and_revive(self, h: int) -> None:
        block = self.pool.lookup(h.to_bytes(8, "little"))
        if block is not None:
            assert block.block_hash == h.to_bytes(8, "little")
            self.pool.touch([block])
            self.refs[block.block_id] = self.refs.get(block.block_id, 0) + 1
            self.pool.free([block])
            self.refs[block.block_id] -= 1

    @invariant()
    def counts_agree(self) -> None:
        for block in self.pool.blocks[1:]:
            assert block.ref_cnt == self.refs.get(block.block_id, 0)
            assert block.ref_cnt >= 0
            assert self.pool.free_queue.contains(block) == (block.ref_cnt == 0)
        assert self.pool.num_free_blocks == sum(1 for b in self.pool.blocks[1:] if b.ref_cnt == 0)
        for h, block in self.pool.cached.items():
            assert block.block_hash == h


TestBlockPoolMachine = BlockPoolMachine.TestCase
TestBlockPoolMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_pins_are_counted_per_hash_and_the_last_unpin_releases() -> None:
    pool = BlockPool(3)
    pool.pin(b"p")
    pool.pin(b"p")
    pool.pin(b"q")
    assert pool.num_pinned_hashes == 2
    pool.unpin(b"p")
    assert pool.is_pinned(b"p") and pool.num_pinned_hashes == 2
    pool.unpin(b"p")
    assert not pool.is_pinned(b"p") and pool.num_pinned_hashes == 1
    with pytest.raises(ValueError):
        pool.unpin(b"p")
