"""Finding a request's cached prefix: its chain of block hashes, looked up tier by tier.

Plain Python, no torch. `weir.engine.kv.kv_cache_manager.KVCacheManager` owns one and keeps the
block tables; this keeps, per request, what the lookup needs:

- The chain: a request's full blocks are hashed (chained, see `block_hash`) once and extended
  as it grows. Its root mixes the cache scope and the LoRA adapter in; a prompt that begins with
  an admin-registered shared prefix chains that part from the shared root
  (`weir.engine.kv.shared_prefixes`).
- Lookup: the longest cached chain on the device, continued in the host tier, then in the
  blocks the store tier landed for the request, always leaving the last token to compute so
  its logits exist. `start_fetch` asks the store for the rest of the chain.
- In flight: the hashes a running request is about to compute are recorded, so the scheduler
  can hold back a request that would compute the same block in the same step.
- Counters: lookups at first admission, overall and per tenant, for stats and the admin API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from weir.engine.kv.block_hash import SHARED_SCOPE, hash_blocks
from weir.engine.kv.block_pool import Block, BlockPool
from weir.engine.kv.host_kv_tier import HostKVTier
from weir.engine.kv.shared_prefixes import SharedPrefixRegistry
from weir.engine.kv.store.tier import KVStoreTier
from weir.engine.request import Request


@dataclass
class PrefixCacheCounters:
    """Prefix-cache lookups (at first admission), overall and per tenant."""

    num_queries: int = 0
    queried_tokens: int = 0
    hit_tokens: int = 0


@dataclass
class _Chain:
    """One request's hash chain and what its lookup found."""

    hashes: list[bytes] | None = None  # chained hashes of its full blocks, extended lazily
    num_shared: int = 0  # leading hashes in the shared scope
    inflight: list[bytes] = field(default_factory=list)  # hashes it is computing, first to register
    # Store hits found by the last lookup, after its device and host hits: (hash, payload, scope).
    store_hits: list[tuple[bytes, bytes, str]] = field(default_factory=list)


class PrefixLookup:
    """Each request's hash chain, the longest cached prefix across the tiers, blocks in flight."""

    def __init__(
        self,
        pool: BlockPool,
        block_size: int,
        root_digest: Callable[..., bytes],  # (cache scope[, adapter cache key]) -> root
        shared_prefixes: SharedPrefixRegistry,
        enable_caching: bool,
        host: HostKVTier | None,
        store: KVStoreTier | None,
    ) -> None:
        self.pool = pool
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.host = host
        self.store = store
        self._root_digest = root_digest
        self._roots: dict[tuple[str, str], bytes] = {}
        self.shared_prefixes = shared_prefixes
        self._chains: dict[str, _Chain] = {}
        self._inflight: dict[bytes, str] = {}  # block hash -> id of the request computing it
        self.totals = PrefixCacheCounters()
        self.by_tenant: dict[str, PrefixCacheCounters] = {}
        self.scope_of_tenant: dict[str, str] = {}

    def _root(self, scope: str, adapter: str = "") -> bytes:
        """The chain root of a scope, through an adapter (its cache key; "" for the base model)."""
        root = self._roots.get((scope, adapter))
        if root is None:
            digest = self._root_digest(scope, adapter) if adapter else self._root_digest(scope)
            root = self._roots[(scope, adapter)] = digest
        return root

    def _chain(self, request_id: str) -> _Chain:
        chain = self._chains.get(request_id)
        if chain is None:
            chain = self._chains[request_id] = _Chain()
        return chain

    def hashes(self, req: Request) -> list[bytes]:
        """Chained hashes of the request's full blocks (prompt and output), extended lazily.

        A prompt that begins with a registered shared prefix chains that part from the shared
        root; the first block after it mixes the tenant's root back in.
        """
        chain = self._chain(req.request_id)
        if chain.hashes is None:
            # Shared prefixes hold base-model KV: a request through an adapter never chains from them.
            shared = self.enable_caching and req.adapter is None
            chain.hashes = self.shared_prefixes.match(req.prompt_token_ids) if shared else []
            chain.num_shared = len(chain.hashes)
        hashes = chain.hashes
        num_full = req.num_tokens // self.block_size
        if len(hashes) < num_full:
            start = len(hashes)
            tokens = req.all_token_ids[: num_full * self.block_size]
            root = self._root(req.cache_scope, req.adapter.cache_key if req.adapter is not None else "")
            if start == 0:
                hashes.extend(hash_blocks(root, tokens, self.block_size))
            else:
                extra = root if start == chain.num_shared else b""
                hashes.extend(
                    hash_blocks(
                        root, tokens, self.block_size, start=start, parent=hashes[-1], first_extra=extra
                    )
                )
        return hashes

    def num_shared(self, request_id: str) -> int:
        """How many leading blocks of the request's chain are in the shared scope."""
        chain = self._chains.get(request_id)
        return chain.num_shared if chain is not None else 0

    def computed_blocks(self, req: Request) -> tuple[list[Block], int]:
        """Longest cached prefix of `req`: (device or host blocks, tokens, store hits included).

        A block missing on the device may be found in the host tier; past those, the store's
        landed payloads for `req` continue the chain (`take_store_hits`). At least the last token
        is always left to compute, so its logits exist.
        """
        hits: list[Block] = []
        host = self.host
        hashes = self.hashes(req)
        for h in hashes:
            block = self.pool.lookup(h)
            if block is None and host is not None:
                block = host.lookup(h)
            if block is None:
                break
            hits.append(block)
        chain = self._chain(req.request_id)
        chain.store_hits = self._store_hits(req, hashes, len(hits), chain.num_shared)
        if chain.store_hits and (len(hits) + len(chain.store_hits)) * self.block_size >= req.num_tokens:
            chain.store_hits.pop()
        elif hits and len(hits) * self.block_size >= req.num_tokens:
            hits.pop()
        return hits, (len(hits) + len(chain.store_hits)) * self.block_size

    def _store_hits(
        self, req: Request, hashes: list[bytes], start: int, num_shared: int
    ) -> list[tuple[bytes, bytes, str]]:
        """The chain from block `start` on as far as the store's landed payloads for `req` go."""
        landed = self.store.landed(req.request_id) if self.store is not None else None
        if not landed:
            return []
        out: list[tuple[bytes, bytes, str]] = []
        for i in range(start, len(hashes)):
            payload = landed.get(hashes[i])
            if payload is None:
                break
            out.append((hashes[i], payload, SHARED_SCOPE if i < num_shared else req.cache_scope))
        return out

    def take_store_hits(self, request_id: str) -> list[tuple[bytes, bytes, str]]:
        """The store hits the last lookup found for the request: (hash, payload, scope); once."""
        chain = self._chains.get(request_id)
        if chain is None or not chain.store_hits:
            return []
        hits, chain.store_hits = chain.store_hits, []
        return hits

    def start_fetch(self, req: Request, num_hit_tokens: int) -> bool:
        """Ask the store for the blocks of `req`'s prompt after its `num_hit_tokens` cached tokens
        (never its last token's block), if that beats recompute; True: the request waits for them."""
        if self.store is None or req.num_preemptions:
            return False
        hashes = self.hashes(req)
        first = num_hit_tokens // self.block_size
        last = min(len(hashes), (req.num_prompt_tokens - 1) // self.block_size)
        if last <= first:
            return False
        return self.store.try_fetch(req.request_id, hashes[first:last], req.tenant_id)

    def record_lookup(self, req: Request, num_hit_tokens: int) -> None:
        """Count one admission's lookup, overall and for its tenant."""
        counters = self.by_tenant.get(req.tenant_id)
        if counters is None:
            counters = self.by_tenant[req.tenant_id] = PrefixCacheCounters()
        self.scope_of_tenant[req.tenant_id] = req.cache_scope
        for c in (self.totals, counters):
            c.num_queries += 1
            c.queried_tokens += req.num_tokens
            c.hit_tokens += num_hit_tokens

    # -- forks and ends ---------------------------------------------------------------------------

    def fork(self, parent: Request, child_id: str, num_full: int) -> None:
        """`child_id` shares `parent`'s first `num_full` full blocks: it shares their hashes too.

        Only blocks wholly inside the shared tokens are known to hash alike; the rest of the
        child's chain is extended from its own tokens.
        """
        parent_hashes = self.hashes(parent)
        num_shared = self.num_shared(parent.request_id)
        if num_full >= num_shared:
            chain = self._chain(child_id)
            chain.hashes = parent_hashes[:num_full]
            chain.num_shared = num_shared
        # else: the cut falls inside a shared prefix: the child matches the shared prefixes afresh.

    def forget(self, request_id: str) -> None:
        """The request is gone: its chain goes too."""
        self._chains.pop(request_id, None)

    # -- blocks in flight -------------------------------------------------------------------------

    def mark_inflight(self, req: Request, num_cached: int) -> None:
        """Record the full prompt blocks `req` will compute after its `num_cached` cached ones,
        unless another request already is."""
        chain = self._chain(req.request_id)
        hashes = self.hashes(req)
        for i in range(num_cached, min(len(hashes), req.num_prompt_tokens // self.block_size)):
            h = hashes[i]
            if h not in self._inflight and self.pool.lookup(h) is None:
                self._inflight[h] = req.request_id
                chain.inflight.append(h)

    def inflight_owner(self, req: Request, num_hit_tokens: int) -> str | None:
        """The running request computing `req`'s first uncached block right now, if another one."""
        if not self._inflight:
            return None
        i = num_hit_tokens // self.block_size
        hashes = self.hashes(req)
        if i >= len(hashes):
            return None
        owner = self._inflight.get(hashes[i])
        return owner if owner != req.request_id else None

    def computed(self, request_id: str, block_hash: bytes) -> None:
        """The request computed the block of `block_hash`: it is no longer in flight for it."""
        chain = self._chains.get(request_id)
        if chain is not None and chain.inflight and self._inflight.get(block_hash) == request_id:
            del self._inflight[block_hash]

    def release_inflight(self, request_id: str) -> None:
        """The request gave its blocks back: nothing it was computing is in flight any more."""
        chain = self._chains.get(request_id)
        if chain is None:
            return
        for h in chain.inflight:
            if self._inflight.get(h) == request_id:
                del self._inflight[h]
        chain.inflight = []

    @property
    def num_inflight(self) -> int:
        """Blocks some running request is computing right now."""
        return len(self._inflight)
