"""Shared prefixes: token sequences an admin made reusable across tenants.

A registered prefix is hashed from the shared root (`block_hash.SHARED_SCOPE`), so its blocks
are one set of cache entries that every tenant's request beginning with it can reference. Only
its full blocks are shared; a request's tokens after them chain from the tenant's own root
again (see `block_hash`). A pinned prefix's blocks are never evicted: the pins are counted in
the block pool only (by hash), so blocks computed later are pinned the moment they are cached.

Matching a prompt costs one hash per matched block and stops at the first block that belongs
to no registered prefix. Plain Python, no torch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from weir.engine.kv.block_hash import hash_block, hash_blocks
from weir.engine.kv.block_pool import BlockPool
from weir.engine.kv.prefix_cache_types import (
    InvalidPrefixError,
    PinCapacityError,
    SharedPrefixInfo,
    UnknownPrefixError,
)

MAX_PREFIXES = 1024


@dataclass
class SharedPrefix:
    """One registered prefix and the chained hashes of its full blocks."""

    prefix_id: str
    name: str
    token_ids: tuple[int, ...]  # the shared (full-block) part of what was registered
    num_given_tokens: int  # tokens given at registration; a partial last block is not shared
    hashes: tuple[bytes, ...]
    pinned: bool
    created_at: float


class SharedPrefixRegistry:
    """The registered shared prefixes of one engine (one model version)."""

    def __init__(self, pool: BlockPool, block_size: int, shared_root: bytes, max_pinned_blocks: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self.shared_root = shared_root
        self.max_pinned_blocks = max_pinned_blocks
        self._prefixes: dict[str, SharedPrefix] = {}
        self._boundaries: dict[bytes, int] = {}  # hash of a prefix's last full block -> how many prefixes
        self._members: dict[bytes, int] = {}  # hash of any block of any prefix -> how many prefixes
        self._max_blocks = 0

    def __len__(self) -> int:
        return len(self._prefixes)

    def register(self, token_ids: Sequence[int], name: str = "", pin: bool = False) -> SharedPrefix:
        """Register (idempotently: the id is a digest of the full blocks) and optionally pin."""
        if len(token_ids) < self.block_size:
            raise InvalidPrefixError(
                f"a shared prefix needs at least one full block ({self.block_size} tokens), "
                f"got {len(token_ids)}",
                param="token_ids",
            )
        hashes = hash_blocks(self.shared_root, token_ids, self.block_size)
        prefix_id = hashes[-1].hex()[:24]
        existing = self._prefixes.get(prefix_id)
        if existing is not None:
            if pin and not existing.pinned:
                self.pin(prefix_id)
            return existing
        if len(self._prefixes) >= MAX_PREFIXES:
            raise InvalidPrefixError(f"at most {MAX_PREFIXES} shared prefixes", param="token_ids")
        if pin:
            self._check_pin_capacity(hashes)
        num_shared = len(hashes) * self.block_size
        prefix = SharedPrefix(
            prefix_id=prefix_id,
            name=name or f"prefix-{prefix_id[:8]}",
            token_ids=tuple(token_ids[:num_shared]),
            num_given_tokens=len(token_ids),
            hashes=tuple(hashes),
            pinned=False,
            created_at=time.time(),
        )
        self._prefixes[prefix_id] = prefix
        _inc(self._boundaries, hashes[-1])
        for h in hashes:
            _inc(self._members, h)
        self._max_blocks = max(self._max_blocks, len(hashes))
        if pin:
            self.pin(prefix_id)
        return prefix

    def unregister(self, prefix_id: str) -> SharedPrefix:
        """Forget a prefix (unpinning it first). Its cached blocks become ordinary, evictable ones."""
        prefix = self.get(prefix_id)
        if prefix.pinned:
            self.unpin(prefix_id)
        del self._prefixes[prefix_id]
        _dec(self._boundaries, prefix.hashes[-1])
        for h in prefix.hashes:
            _dec(self._members, h)
        self._max_blocks = max((len(p.hashes) for p in self._prefixes.values()), default=0)
        return prefix

    def get(self, prefix_id: str) -> SharedPrefix:
        prefix = self._prefixes.get(prefix_id)
        if prefix is None:
            raise UnknownPrefixError(prefix_id)
        return prefix

    def prefixes(self) -> list[SharedPrefix]:
        return sorted(self._prefixes.values(), key=lambda p: (p.created_at, p.prefix_id))

    def _check_pin_capacity(self, hashes: Sequence[bytes]) -> None:
        new = sum(1 for h in set(hashes) if not self.pool.is_pinned(h))
        total = self.pool.num_pinned_hashes + new
        if total > self.max_pinned_blocks:
            raise PinCapacityError(total, self.max_pinned_blocks)

    def pin(self, prefix_id: str) -> SharedPrefix:
        """Keep the prefix's blocks in the cache for good (once computed)."""
        prefix = self.get(prefix_id)
        if prefix.pinned:
            return prefix
        self._check_pin_capacity(prefix.hashes)
        for h in prefix.hashes:
            self.pool.pin(h)
        prefix.pinned = True
        return prefix

    def unpin(self, prefix_id: str) -> SharedPrefix:
        """Let the prefix's blocks be evicted again like any cached block."""
        prefix = self.get(prefix_id)
        if not prefix.pinned:
            return prefix
        for h in prefix.hashes:
            self.pool.unpin(h)
        prefix.pinned = False
        return prefix

    def match(self, prompt_token_ids: Sequence[int]) -> list[bytes]:
        """Shared hashes of the longest registered prefix `prompt_token_ids` begins with ([] if none)."""
        if not self._prefixes:
            return []
        bs = self.block_size
        prev = self.shared_root
        hashes: list[bytes] = []
        best = 0
        for i in range(min(len(prompt_token_ids) // bs, self._max_blocks)):
            prev = hash_block(prev, prompt_token_ids[i * bs : (i + 1) * bs])
            if prev not in self._members:
                break
            hashes.append(prev)
            if prev in self._boundaries:
                best = i + 1
        return hashes[:best]

    def info(self, prefix: SharedPrefix) -> SharedPrefixInfo:
        """The prefix as the control API reports it."""
        return SharedPrefixInfo(
            prefix_id=prefix.prefix_id,
            name=prefix.name,
            num_tokens=prefix.num_given_tokens,
            num_shared_tokens=len(prefix.token_ids),
            num_blocks=len(prefix.hashes),
            num_cached_blocks=sum(1 for h in prefix.hashes if self.pool.lookup(h) is not None),
            pinned=prefix.pinned,
            created_at=prefix.created_at,
        )


def _inc(counts: dict[bytes, int], key: bytes) -> None:
    counts[key] = counts.get(key, 0) + 1


def _dec(counts: dict[bytes, int], key: bytes) -> None:
    n = counts[key] - 1
    if n:
        counts[key] = n
    else:
        del counts[key]
