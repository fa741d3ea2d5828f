"""Per-request block tables on top of the block pool, with prefix-cache lookup and caching.

Plain Python, no torch. The scheduler asks it for blocks; the runner only sees block ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.block_hash import hash_blocks
from engine.block_pool import Block, BlockPool
from engine.request import Request


@dataclass
class PrefixCacheCounters:
    """Prefix-cache lookups in tokens, overall and per tenant."""

    queried_tokens: int = 0
    hit_tokens: int = 0


class KVCacheManager:
    """Allocates and frees the blocks of each request and finds cached prefixes."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        root_digest: Callable[[str], bytes],
        enable_caching: bool = True,
        watermark: float = 0.01,
        tenant_cache_share: float = 1.0,
    ) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_caching)
        self.enable_caching = enable_caching
        self._root_digest = root_digest
        self.watermark_blocks = int(watermark * num_blocks)
        self.max_cached_blocks_per_scope = max(1, int(tenant_cache_share * self.pool.num_usable_blocks))
        self.req_blocks: dict[str, list[Block]] = {}
        self.req_hashes: dict[str, list[bytes]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # per request: full blocks already registered
        self.totals = PrefixCacheCounters()
        self.by_tenant: dict[str, PrefixCacheCounters] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_total_blocks(self) -> int:
        return self.pool.num_usable_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_ids(self, request_id: str) -> tuple[int, ...]:
        return tuple(b.block_id for b in self.req_blocks.get(request_id, ()))

    def _hashes(self, req: Request) -> list[bytes]:
        """Chained hashes of the request's full blocks (prompt and output), extended lazily."""
        hashes = self.req_hashes.setdefault(req.request_id, [])
        num_full = req.num_tokens // self.block_size
        if len(hashes) < num_full:
            parent = hashes[-1] if hashes else self._root_digest(req.cache_scope)
            tokens = req.all_token_ids[: num_full * self.block_size]
            hashes.extend(hash_blocks(parent, tokens, self.block_size, start=len(hashes), parent=parent))
        return hashes

    def get_computed_blocks(self, req: Request) -> tuple[list[Block], int]:
        """Longest cached prefix of a request that has computed nothing yet.

        At least the last token is always left to compute, so its logits exist.
        """
        if not self.enable_caching or req.num_computed_tokens > 0:
            return [], 0
        hits: list[Block] = []
        for h in self._hashes(req):
            block = self.pool.lookup(h)
            if block is None:
                break
            hits.append(block)
        if hits and len(hits) * self.block_size >= req.num_tokens:
            hits.pop()
        counters = self.by_tenant.setdefault(req.tenant_id, PrefixCacheCounters())
        num_hit = len(hits) * self.block_size
        for c in (self.totals, counters):
            c.queried_tokens += req.num_tokens
            c.hit_tokens += num_hit
        return hits, num_hit

    def can_fit(self, req: Request, num_total_tokens: int, computed: list[Block], watermark: bool) -> bool:
        have = len(self.req_blocks.get(req.request_id, ())) + len(computed)
        need_new = max(0, self.blocks_for(num_total_tokens) - have)
        revived = sum(1 for b in computed if b.ref_cnt == 0)
        reserve = self.watermark_blocks if watermark else 0
        return need_new + revived <= self.pool.num_free_blocks - reserve

    def allocate_slots(
        self,
        req: Request,
        num_total_tokens: int,
        computed: list[Block] | None = None,
        watermark: bool = False,
    ) -> bool:
        """Make the request's block table hold `num_total_tokens` tokens. False if blocks are short."""
        computed = computed or []
        if not self.can_fit(req, num_total_tokens, computed, watermark):
            return False
        blocks = self.req_blocks.setdefault(req.request_id, [])
        if computed:
            self.pool.touch(computed)
            blocks.extend(computed)
            self.num_cached_blocks[req.request_id] = len(blocks)
        need_new = self.blocks_for(num_total_tokens) - len(blocks)
        if need_new > 0:
            blocks.extend(self.pool.allocate(need_new))
        return True

    def cache_full_blocks(self, req: Request) -> None:
        """Register the request's newly computed full blocks in the prefix cache."""
        if not self.enable_caching:
            return
        num_full = req.num_computed_tokens // self.block_size
        done = self.num_cached_blocks.get(req.request_id, 0)
        if num_full <= done:
            return
        hashes = self._hashes(req)
        blocks = self.req_blocks[req.request_id]
        pool = self.pool
        for i in range(done, num_full):
            if pool.cached_blocks_by_scope.get(req.cache_scope, 0) >= self.max_cached_blocks_per_scope:
                if not pool.evict_scope_lru(req.cache_scope, self.max_cached_blocks_per_scope - 1):
                    break  # the scope's share is all in use: leave further blocks uncached
            pool.cache(blocks[i], hashes[i], req.cache_scope)
        self.num_cached_blocks[req.request_id] = num_full

    def free(self, req: Request, keep_hashes: bool = False) -> None:
        """Return all of a request's blocks, tail first (so tails are evicted first)."""
        blocks = self.req_blocks.pop(req.request_id, None)
        if blocks:
            self.pool.free(reversed(blocks))
        self.num_cached_blocks.pop(req.request_id, None)
        if not keep_hashes:
            self.req_hashes.pop(req.request_id, None)
