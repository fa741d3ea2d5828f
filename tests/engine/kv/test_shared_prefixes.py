"""Shared prefixes: idempotent registration, longest match on full blocks, pins and their budget."""

from __future__ import annotations

import pytest

from weir.engine.kv.block_hash import SHARED_SCOPE, CacheKeyRoot
from weir.engine.kv.block_pool import BlockPool
from weir.engine.kv.prefix_cache_types import InvalidPrefixError, PinCapacityError, UnknownPrefixError
from weir.engine.kv.shared_prefixes import SharedPrefixRegistry

BS = 4


def _registry(num_blocks: int = 17, max_pinned: int = 4) -> SharedPrefixRegistry:
    root = CacheKeyRoot("m", "t", "r", "float32", SHARED_SCOPE).digest()
    return SharedPrefixRegistry(BlockPool(num_blocks), BS, root, max_pinned_blocks=max_pinned)


def test_registration_is_idempotent_and_keeps_full_blocks_only() -> None:
    reg = _registry()
    a = reg.register(list(range(10)), "sys")
    b = reg.register(list(range(10)))
    assert a is b and len(reg) == 1
    assert a.token_ids == tuple(range(8)) and len(a.hashes) == 2
    info = reg.info(a)
    assert (info.num_tokens, info.num_shared_tokens, info.num_blocks, info.num_cached_blocks) == (10, 8, 2, 0)
    with pytest.raises(InvalidPrefixError):
        reg.register([1, 2, 3])  # shorter than a block


def test_match_takes_the_longest_registered_prefix_on_whole_prefixes_only() -> None:
    reg = _registry()
    assert reg.match(list(range(20))) == []
    short = reg.register(list(range(4)))
    long = reg.register(list(range(12)))
    assert reg.match(list(range(20))) == list(long.hashes)
    assert reg.match(list(range(9)) + [99, 99, 99]) == list(short.hashes)  # only part of `long`
    assert reg.match([0, 1, 2]) == []
    assert reg.match([5] + list(range(1, 20))) == []
    reg.unregister(long.prefix_id)
    assert reg.match(list(range(20))) == list(short.hashes)
    with pytest.raises(UnknownPrefixError):
        reg.get(long.prefix_id)


def test_pins_reach_the_pool_and_respect_the_pinned_budget() -> None:
    reg = _registry(max_pinned=4)
    a = reg.register(list(range(12)), pin=True)  # 3 blocks
    assert a.pinned and all(reg.pool.is_pinned(h) for h in a.hashes)
    b = reg.register(list(range(8)))  # nested in a: no new pinned hash
    reg.pin(b.prefix_id)
    c = reg.register(list(range(50, 58)))
    with pytest.raises(PinCapacityError):
        reg.pin(c.prefix_id)
    assert not c.pinned
    reg.unpin(a.prefix_id)
    assert reg.pool.is_pinned(b.hashes[0]) and not reg.pool.is_pinned(a.hashes[2])
    reg.pin(c.prefix_id)
    reg.unregister(b.prefix_id)
    reg.unregister(c.prefix_id)
    assert not any(reg.pool.is_pinned(h) for h in a.hashes + c.hashes)


def test_the_pin_budget_reads_the_pools_one_pin_count() -> None:
    reg = _registry(max_pinned=4)
    a = reg.register(list(range(12)), pin=True)  # 3 blocks
    reg.register(list(range(8)), pin=True)  # nested in a: its 2 hashes are pinned twice
    assert reg.pool.num_pinned_hashes == 3
    reg.unpin(a.prefix_id)  # the nested prefix still holds its 2
    assert reg.pool.num_pinned_hashes == 2
    assert reg.pool.is_pinned(a.hashes[1]) and not reg.pool.is_pinned(a.hashes[2])
    reg.register(list(range(50, 58)), pin=True)  # 2 more: the whole budget of 4
    with pytest.raises(PinCapacityError):
        reg.register(list(range(60, 64)), pin=True)
    assert reg.pool.num_pinned_hashes == 4
