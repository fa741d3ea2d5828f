"""Per-request block tables on top of the block pool: allocation, caching, forks and COW.

Plain Python, no torch. The scheduler asks it for blocks; the runner only sees block ids and
the copies it plans (`weir.engine.kv.kv_copy_plan`: the (src, dst) pairs of copy-on-write and
the store's fills).

- Lookup (`weir.engine.kv.prefix_lookup`): at admission the longest cached chain of a request's
  block hashes is referenced instead of recomputed; the blocks it is about to compute are
  recorded in flight, so the scheduler can hold back a request that would compute the same block
  in the same step.
- Per-scope cap: a scope's cached blocks never exceed `tenant_cache_share` of the pool; at the
  cap it evicts its own least recently used free block (O(1)), else leaves the block uncached.
- Fork: a child references its parent's computed blocks. Before a request writes into a block
  that is shared (ref count > 1) or cached (immutable), the block is copied to a fresh one.
- Host tier (optional, `weir.engine.kv.host_kv_tier`): a lookup continues into the host pool, whose hits
  are promoted (copied into device blocks at allocation); `preempt` swaps a victim's blocks to
  the host or drops them, as `weir.engine.kv.swap_policy` decides, and `swap_in` brings them back.
- Store tier (optional, `weir.engine.kv.store.tier`): a lookup that misses both may go on in the
  shared store. `start_fetch` asks for the rest of the chain (the scheduler parks the request
  meanwhile); once its blocks landed, the lookup continues into them and admission copies them into
  fresh device blocks, cached there (`KVTransfers.store_in`). Each block a request registers is
  written behind with the next step's transfers (`KVTransfers.store_out`), and a request that ends
  has any of its cached blocks not written lately written too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from weir.engine.config import PreemptionMode
from weir.engine.kv.block_hash import SHARED_SCOPE
from weir.engine.kv.block_pool import Block, BlockPool
from weir.engine.kv.host_kv_tier import HostKVTier
from weir.engine.kv.kv_copy_plan import KVCopyPlan
from weir.engine.kv.prefix_lookup import PrefixLookup
from weir.engine.kv.shared_prefixes import SharedPrefixRegistry
from weir.engine.kv.store.tier import KVStoreTier
from weir.engine.kv.swap_policy import SwapPolicy
from weir.engine.request import Request

# Pinned shared prefixes may hold at most this share of the pool.
MAX_PINNED_SHARE = 0.5


@dataclass
class _ReqKV:
    """The KV state of one request."""

    blocks: list[Block] = field(default_factory=list)
    num_cached: int = 0  # leading blocks already registered in (or found in) the cache


class KVCacheManager:
    """Allocates and frees the blocks of each request and finds cached prefixes."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        root_digest: Callable[..., bytes],  # (cache scope[, adapter cache key]) -> root
        enable_caching: bool = True,
        watermark: float = 0.01,
        tenant_cache_share: float = 1.0,
        host_num_blocks: int = 0,
        swap_policy: SwapPolicy | None = None,  # the host tier's swap-or-recompute cost model
        store: KVStoreTier | None = None,  # the shared store tier; None: off
    ) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_caching)
        # The host tier: swapped requests and demoted prefix blocks (None: preemption recomputes).
        self.host = None
        if host_num_blocks:
            policy = swap_policy if swap_policy is not None else SwapPolicy(block_bytes=1)
            self.host = HostKVTier(host_num_blocks, self.pool, block_size, policy, tenant_cache_share)
        self.store = store if enable_caching else None
        self.enable_caching = enable_caching
        self.watermark_blocks = int(watermark * num_blocks)
        self.max_cached_blocks_per_scope = max(1, int(tenant_cache_share * self.pool.num_usable_blocks))
        self.shared_prefixes = SharedPrefixRegistry(
            self.pool,
            block_size,
            root_digest(SHARED_SCOPE),
            max_pinned_blocks=int(MAX_PINNED_SHARE * self.pool.num_usable_blocks),
        )
        # Hash chains, the cached prefix across the tiers, blocks in flight, lookup counters.
        self.lookup = PrefixLookup(
            self.pool, block_size, root_digest, self.shared_prefixes, enable_caching, self.host, self.store
        )
        self.copy_plan = KVCopyPlan(self.pool, self.host, self.store)  # what the next step copies
        self._reqs: dict[str, _ReqKV] = {}

    # -- sizes ----------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_total_blocks(self) -> int:
        return self.pool.num_usable_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_ids(self, request_id: str) -> tuple[int, ...]:
        st = self._reqs.get(request_id)
        return tuple(b.block_id for b in st.blocks) if st is not None else ()

    def blocks(self, request_id: str) -> list[Block]:
        """The request's block table (a view; do not modify)."""
        st = self._reqs.get(request_id)
        return st.blocks if st is not None else []

    # -- lookup ---------------------------------------------------------------------------------

    def _state(self, request_id: str) -> _ReqKV:
        st = self._reqs.get(request_id)
        if st is None:
            st = self._reqs[request_id] = _ReqKV()
        return st

    def get_computed_blocks(self, req: Request) -> tuple[list[Block], int]:
        """Longest cached prefix of a request that holds no blocks yet: (blocks, tokens).

        A block missing on the device may be found in the host tier: such a hit is a host block,
        promoted (copied to a device block) by `allocate_slots`; the store's landed blocks after
        those are copied in by `allocate_slots` too (`PrefixLookup.computed_blocks`). At least
        the last token is always left to compute, so its logits exist.
        """
        if not self.enable_caching or self.blocks(req.request_id):
            return [], 0
        return self.lookup.computed_blocks(req)

    def start_fetch(self, req: Request, num_hit_tokens: int) -> bool:
        """Ask the store for the rest of the prompt of `req`, which holds no blocks yet
        (`PrefixLookup.start_fetch`); True: the request waits for them."""
        return not self.blocks(req.request_id) and self.lookup.start_fetch(req, num_hit_tokens)

    # -- allocation -----------------------------------------------------------------------------

    def _cow_indices(self, req: Request, st: _ReqKV, num_total_tokens: int) -> list[int]:
        """Indices of blocks the request is about to write that it must not write in place."""
        first = req.num_computed_tokens // self.block_size
        last = min(len(st.blocks), self.blocks_for(num_total_tokens))
        return [
            i for i in range(first, last) if st.blocks[i].ref_cnt > 1 or st.blocks[i].block_hash is not None
        ]

    def can_fit(self, req: Request, num_total_tokens: int, computed: list[Block], watermark: bool) -> bool:
        st = self._reqs.get(req.request_id)
        have = (len(st.blocks) if st else 0) + len(computed)
        need_new = max(0, self.blocks_for(num_total_tokens) - have)
        if st is not None and st.blocks:
            need_new += len(self._cow_indices(req, st, num_total_tokens))
        revived = 0
        for b in computed:
            if self.host is not None and self.host.owns(b):
                revived += 1  # a host hit takes a fresh device block
            elif b.ref_cnt == 0 and not b.pinned:
                revived += 1
        reserve = self.watermark_blocks if watermark else 0
        return need_new + revived <= self.pool.num_free_blocks - reserve

    def allocate_slots(
        self,
        req: Request,
        num_total_tokens: int,
        computed: list[Block] | None = None,
        watermark: bool = False,
    ) -> bool:
        """Make the request's block table hold `num_total_tokens` tokens. False if blocks are short.

        `computed` are prefix-cache hits (at admission). Blocks the request is about to write
        that are shared or cached are copied first (the pairs go to `copy_plan`).
        """
        computed = computed or []
        if not self.can_fit(req, num_total_tokens, computed, watermark):
            return False
        st = self._state(req.request_id)
        blocks = st.blocks
        if st.blocks:
            for i in self._cow_indices(req, st, num_total_tokens):
                src = blocks[i]
                (dst,) = self.pool.allocate(1)
                self.copy_plan.plan_copy(src.block_id, dst.block_id)
                blocks[i] = dst
                self.pool.free([src])
        if computed:
            self._take_hits(req, computed)
            st.num_cached = len(blocks)
        store_hits = self.lookup.take_store_hits(req.request_id)
        if store_hits:
            self._take_store_hits(req, st, store_hits)
            st.num_cached = len(blocks)
        need_new = self.blocks_for(num_total_tokens) - len(blocks)
        if need_new > 0:
            blocks.extend(self.pool.allocate(need_new))
        return True

    def _take_hits(self, req: Request, computed: list[Block]) -> None:
        """Reference prefix hits; promote the host ones into fresh device blocks, cached again."""
        host = self.host
        on_host = [b for b in computed if host is not None and host.owns(b)]
        if host is None or not on_host:
            self.pool.touch(computed)
            self._state(req.request_id).blocks.extend(computed)
            return
        self.pool.touch([b for b in computed if not host.owns(b)])
        host.hold(on_host)  # before any device allocation, whose evictions may demote into the host
        table = self._state(req.request_id).blocks
        for b in computed:
            if host.owns(b):
                (dst,) = self.pool.allocate(1)
                host.promote(b, dst, req.request_id)
                if b.block_hash is not None:
                    self._cache_block(dst, b.block_hash, b.cache_scope or "")
                b = dst
            table.append(b)

    def _take_store_hits(self, req: Request, st: _ReqKV, store_hits: list[tuple[bytes, bytes, str]]) -> None:
        """Copy the store's landed blocks into fresh device blocks (the step's `store_in`), cached."""
        for block_hash, payload, scope in store_hits:
            (dst,) = self.pool.allocate(1)
            self.copy_plan.plan_store_fill(dst.block_id, payload)
            if block_hash not in self.pool.cached:
                self._cache_block(dst, block_hash, scope)
            st.blocks.append(dst)
        self.copy_plan.filled_from_store(req.request_id)
        if self.store is not None:
            self.store.on_landed(len(store_hits))
            self.store.forget(req.request_id)

    def _cache_block(self, block: Block, block_hash: bytes, scope: str) -> None:
        """Register a device block in the prefix cache, within its scope's cap (else leave it uncached)."""
        if self.pool.room_in_scope(scope, self.max_cached_blocks_per_scope):
            self.pool.cache(block, block_hash, scope)  # else the scope's whole share is in use

    def mark_inflight(self, req: Request) -> None:
        """Record the full prompt blocks `req` will compute, unless another request already is."""
        if self.enable_caching:
            self.lookup.mark_inflight(req, self._state(req.request_id).num_cached)

    # -- caching ----------------------------------------------------------------------------------

    def cache_full_blocks(self, req: Request) -> None:
        """Register the request's newly computed full blocks in the prefix cache."""
        if not self.enable_caching:
            return
        st = self._reqs.get(req.request_id)
        if st is None:
            return
        num_full = min(req.num_computed_tokens // self.block_size, len(st.blocks))
        if num_full <= st.num_cached:
            return
        hashes = self.lookup.hashes(req)
        num_shared = self.lookup.num_shared(req.request_id)
        pool = self.pool
        for i in range(st.num_cached, num_full):
            h = hashes[i]
            self.lookup.computed(req.request_id, h)
            block = st.blocks[i]
            if block.block_hash is not None or h in pool.cached:
                continue
            # The shared scope holds only admin-registered prefixes: it has no cap.
            self._cache_block(block, h, SHARED_SCOPE if i < num_shared else req.cache_scope)
            if self.store is not None and block.block_hash == h and block.cache_scope is not None:
                # Written behind as soon as it is computed (read before the next step writes any
                # block), so another replica finds it while this request still decodes.
                self.store.plan_write(block.block_id, h, block.cache_scope)
        st.num_cached = num_full

    # -- forks and frees --------------------------------------------------------------------------

    def fork(self, parent: Request, child: Request) -> None:
        """Give `child` references to the blocks holding `parent`'s first `child.num_computed_tokens`
        tokens (the child's tokens must begin with those). Writes into them copy first."""
        pst = self._reqs[parent.request_id]
        num_blocks = self.blocks_for(child.num_computed_tokens)
        if num_blocks > len(pst.blocks) or child.num_computed_tokens > parent.num_computed_tokens:
            raise ValueError(f"{parent.request_id} has not computed {child.num_computed_tokens} tokens")
        shared = pst.blocks[:num_blocks]
        self.pool.touch(shared)
        cst = self._state(child.request_id)
        if cst.blocks:
            raise ValueError(f"{child.request_id} already holds blocks")
        cst.blocks = list(shared)
        num_full = child.num_computed_tokens // self.block_size
        self.lookup.fork(parent, child.request_id, num_full)
        cst.num_cached = min(pst.num_cached, num_full)

    def truncate(self, req: Request, num_tokens: int) -> int:
        """Keep only the blocks holding the first `num_tokens` tokens; free the rest, tail first.

        After speculative verification: slots reserved for draft tokens that were rejected (or
        never proposed) are given back. Blocks beyond `num_tokens` are never cached (only computed
        tokens are), so nothing is unregistered. Returns how many blocks were freed.
        """
        st = self._reqs.get(req.request_id)
        keep = self.blocks_for(num_tokens)
        if st is None or len(st.blocks) <= keep:
            return 0
        if num_tokens < req.num_computed_tokens:
            raise ValueError(
                f"cannot truncate {req.request_id} below its {req.num_computed_tokens} computed tokens"
            )
        dropped = st.blocks[keep:]
        del st.blocks[keep:]
        if self.copy_plan.has_pending():
            self.copy_plan.drop_copies_into({b.block_id for b in dropped})
        self.pool.free(reversed(dropped))
        return len(dropped)

    def free(self, req: Request, keep_hashes: bool = False) -> None:
        """Return all of a request's blocks, tail first (so tails are evicted first).

        Without `keep_hashes` the request is gone: a swapped-out request's host blocks go too."""
        if self.host is not None and not keep_hashes:
            self.host.drop(req.request_id)  # it ended while swapped out
        if self.store is not None and not keep_hashes:
            self.store.end(req.request_id)
        self.lookup.release_inflight(req.request_id)
        if not keep_hashes:
            self.lookup.forget(req.request_id)
        st = self._reqs.get(req.request_id)
        if st is None:
            return
        blocks, st.blocks = st.blocks, []
        if blocks and self.host is not None:
            self.host.unfill(blocks)
        if blocks and self.copy_plan.has_pending():
            # A copy into a block given back now must not land on the block's next owner; a store
            # fill that will not run takes the block's hash with it (so it is not written below).
            self.copy_plan.drop_into({b.block_id for b in blocks})
        if self.store is not None and not keep_hashes:
            for b in blocks[: st.num_cached]:  # written behind: read before the next step writes any block
                if b.block_hash is not None and b.cache_scope is not None:
                    self.store.plan_write(b.block_id, b.block_hash, b.cache_scope)
        if blocks:
            self.pool.free(reversed(blocks))
        st.num_cached = 0
        if not keep_hashes:
            del self._reqs[req.request_id]

    # -- admin ------------------------------------------------------------------------------------

    def flush(self, scopes: set[str] | None = None, include_pinned: bool = False) -> int:
        """Forget cached blocks (of `scopes`, or all) in every tier; returns how many on the device
        and the host (the store's removal is queued: `KVStoreTier.flush`)."""
        if self.store is not None:
            self.store.flush(scopes)
        pools = [self.pool] if self.host is None else [self.pool, self.host.pool]
        if scopes is None:
            return sum(p.flush(include_pinned=include_pinned) for p in pools)
        return sum(p.flush(lambda b: b.cache_scope in scopes, include_pinned=include_pinned) for p in pools)

    # -- preemption: swap or recompute --------------------------------------------------------------

    def preempt(self, req: Request, allow_swap: bool = True) -> PreemptionMode:
        """Give back a running request's blocks: swapped to the host tier (if it has one and its
        cost model says so) or freed to recompute; the caller resets a recomputing request."""
        mode = PreemptionMode.RECOMPUTE
        blocks = self.blocks(req.request_id)[: self.blocks_for(req.num_computed_tokens)]
        if self.copy_plan.is_filled_from_store(req.request_id):
            allow_swap = False  # the store's bytes land after this step's swap-out would read them
        if allow_swap and self.host is not None and blocks:
            # A copy-on-write decided this step for a block being swapped out has not run: copy its source.
            cow_src = self.copy_plan.copy_sources()
            sources = [cow_src.get(b.block_id, b.block_id) for b in blocks]
            num_cached = self._state(req.request_id).num_cached
            mode = self.host.preempt(
                req.request_id, blocks, sources, req.num_computed_tokens, num_cached, req.cache_scope
            )
        self.free(req, keep_hashes=True)  # a swapped request's record stays until it ends
        return mode

    def is_swapped(self, request_id: str) -> bool:
        return self.host is not None and request_id in self.host.records

    def swap_in(self, req: Request, watermark: bool = False) -> bool:
        """Bring a swapped-out request's blocks back to the device, with room for its whole known
        sequence; restores `num_computed_tokens`. False (nothing changed) if blocks are short."""
        if self.host is None:
            raise ValueError(f"request {req.request_id!r} is not swapped out")
        reserve = self.watermark_blocks if watermark else 0
        back = self.host.swap_in(req.request_id, self.blocks_for(req.num_tokens), reserve, self._cache_block)
        if back is None:
            return False
        table, record = back
        st = self._state(req.request_id)
        st.blocks = table
        st.num_cached = record.num_cached
        req.num_computed_tokens = record.num_computed_tokens
        return True

    def drop_swapped(self, req: Request) -> None:
        """Forget a swapped-out request's host copy; it recomputes from the start."""
        if self.host is not None:
            self.host.drop(req.request_id)
