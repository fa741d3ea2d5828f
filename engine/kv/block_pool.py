"""Physical KV blocks: ref counts, an O(1) LRU free queue, the hash -> block map, pins and caps.

A block whose ref count drops to zero goes to the tail of the free queue but keeps its hash,
so a later request with the same prefix can revive it (a prefix-cache hit). A block that holds
nothing worth keeping (no hash) goes to the head instead, so allocation uses up plain free
blocks before it evicts anything, and then evicts the least recently freed cached block.

Each scope also keeps its free cached blocks in LRU order, so a scope over its cap gives up its
own oldest block in O(1) without scanning the pool. Pinned blocks (shared prefixes an admin
pinned) stay out of the free queue while unreferenced: they are never evicted.

The host tier (engine/kv/host_kv_tier.py) is a second BlockPool: it shares this pool's pin counts
(`pins`, `pin_followers`) and hears of every eviction (`on_evict`), to demote the block.
Plain Python, no torch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from weir.engine.kv.block_hash import SHARED_SCOPE


@dataclass(eq=False)
class Block:
    """One physical KV block."""

    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None
    cache_scope: str | None = None  # scope whose prefix this block caches, for per-scope caps
    pinned: bool = False  # pinned shared prefixes are never evicted
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)


class FreeBlockQueue:
    """Doubly linked list of free blocks: O(1) append at either end, pop-front and remove."""

    def __init__(self, blocks: Iterable[Block]) -> None:
        self._head = Block(-1)
        self._tail = Block(-1)
        self._head.next = self._tail
        self._tail.prev = self._head
        self.num_free = 0
        for b in blocks:
            self.append(b)

    def _insert_after(self, anchor: Block, block: Block) -> None:
        if block.prev is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        after = anchor.next
        if after is None:
            raise ValueError("anchor is not linked")
        anchor.next = block
        block.prev = anchor
        block.next = after
        after.prev = block
        self.num_free += 1

    def append(self, block: Block) -> None:
        """Add at the tail: evicted last."""
        last = self._tail.prev
        if last is None:
            raise ValueError("free queue tail is not linked")
        self._insert_after(last, block)

    def appendleft(self, block: Block) -> None:
        """Add at the head: handed out first."""
        self._insert_after(self._head, block)

    def remove(self, block: Block) -> None:
        if block.prev is None or block.next is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        block.prev.next = block.next
        block.next.prev = block.prev
        block.prev = block.next = None
        self.num_free -= 1

    def popleft(self) -> Block:
        first = self._head.next
        if first is None or first is self._tail:
            raise IndexError("no free blocks")
        self.remove(first)
        return first

    def contains(self, block: Block) -> bool:
        return block.prev is not None

    def __iter__(self) -> Iterator[Block]:
        node = self._head.next
        while node is not None and node is not self._tail:
            yield node
            node = node.next


class BlockPool:
    """All KV blocks of one device, with prefix-cache bookkeeping.

    Block 0 is reserved as the null block (padding target in block tables) and never handed out.
    """

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool = True,
        pins: dict[bytes, int] | None = None,
    ) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.ref_cnt = 1
        self.free_queue = FreeBlockQueue(self.blocks[1:])
        self.cached: dict[bytes, Block] = {}
        self.num_evictions = 0
        self.num_flushed = 0
        self.evictions_by_scope: dict[str, int] = {}
        self.cached_blocks_by_scope: dict[str, int] = {}
        # Free, cached, unpinned blocks of each scope, oldest first (block id -> block).
        self._scope_free: dict[str, OrderedDict[int, Block]] = {}
        # Hashes pinned by shared prefixes (how many pins each), whether cached yet or not: the
        # only pin count (weir.engine.kv.shared_prefixes reads it for its budget).
        # A lower tier (the host pool) shares this dict: one pin count for both tiers.
        self._pins: dict[bytes, int] = pins if pins is not None else {}
        self.num_pinned_blocks = 0  # cached blocks whose hash is pinned
        # Tiers below this one (the host pool): pins and unpins mark their blocks too.
        self.pin_followers: list[BlockPool] = []
        # Called with a cached block about to lose its hash to an eviction (the host tier demotes it).
        self.on_evict: Callable[[Block], None] | None = None

    def follower(self, num_blocks: int) -> BlockPool:
        """A pool for a lower tier (the host pool) that shares this pool's pin counts: a hash pinned
        here is pinned there too, so its block is never evicted from either tier."""
        pool = BlockPool(num_blocks, self.enable_caching, pins=self._pins)
        self.pin_followers.append(pool)
        return pool

    def owns(self, block: Block) -> bool:
        """Whether `block` is one of this pool's blocks (O(1))."""
        return 0 <= block.block_id < self.num_blocks and self.blocks[block.block_id] is block

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free

    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    # -- references ---------------------------------------------------------------------------

    def allocate(self, num: int) -> list[Block]:
        """Take `num` blocks from the head of the free queue, evicting cached hashes there."""
        if num > self.free_queue.num_free:
            raise ValueError(f"cannot allocate {num} blocks, only {self.free_queue.num_free} free")
        out = []
        for _ in range(num):
            block = self.free_queue.popleft()
            if block.block_hash is not None:
                if self.on_evict is not None:
                    self.on_evict(block)
                self._count_eviction(block)
                self._uncache(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on blocks found in the prefix cache (reviving free ones)."""
        for block in blocks:
            if block.ref_cnt == 0 and self.free_queue.contains(block):
                self.free_queue.remove(block)
                self._unlist_scope_free(block)
            block.ref_cnt += 1

    def free(self, blocks: Iterable[Block]) -> None:
        """Drop one reference per block. Pass blocks tail-first so tails are evicted first."""
        for block in blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"double free of block {block.block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._release(block)

    def _release(self, block: Block) -> None:
        """Place an unreferenced block: nothing cached -> head; cached -> tail; pinned -> held."""
        if block.block_hash is None or not self.enable_caching:
            self._uncache(block)
            self.free_queue.appendleft(block)
        elif not block.pinned:
            self.free_queue.append(block)
            scope = block.cache_scope or ""
            self._scope_free.setdefault(scope, OrderedDict())[block.block_id] = block

    # -- the cache map ------------------------------------------------------------------------

    def lookup(self, block_hash: bytes) -> Block | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def cache(self, block: Block, block_hash: bytes, scope: str) -> bool:
        """Register a referenced full block under its chained hash; False if not cached.

        A hash already cached keeps its block (the new one stays a private copy).
        """
        if not self.enable_caching or block.block_hash is not None or block_hash in self.cached:
            return False
        if block.ref_cnt <= 0:
            raise ValueError(f"block {block.block_id} is not referenced; only computed blocks are cached")
        block.block_hash = block_hash
        block.cache_scope = scope
        self.cached[block_hash] = block
        self.cached_blocks_by_scope[scope] = self.cached_blocks_by_scope.get(scope, 0) + 1
        if block_hash in self._pins:
            block.pinned = True
            self.num_pinned_blocks += 1
        return True

    def num_cached_blocks(self, scope: str) -> int:
        """Blocks cached under `scope`, in use or free."""
        return self.cached_blocks_by_scope.get(scope, 0)

    def num_free_cached_blocks(self, scope: str) -> int:
        """Free (evictable) cached blocks of `scope`."""
        od = self._scope_free.get(scope)
        return len(od) if od else 0

    def room_in_scope(self, scope: str, cap: int) -> bool:
        """Whether one more block may be cached under `scope` with at most `cap` cached blocks per
        scope (the shared scope, admin-registered prefixes only, has no cap). At the cap the scope
        gives up its own least recently freed block (O(1)); False if it has none free."""
        if scope == SHARED_SCOPE or self.num_cached_blocks(scope) < cap:
            return True
        return self.evict_lru_of_scope(scope)

    def evict_lru_of_scope(self, scope: str) -> bool:
        """Evict the least recently freed cached block of `scope` in O(1); False if it has none.

        The block moves to the head of the free queue, so it is reused before any other scope's
        cached block is evicted.
        """
        od = self._scope_free.get(scope)
        if not od:
            return False
        _, block = od.popitem(last=False)
        if self.on_evict is not None:
            self.on_evict(block)
        self._count_eviction(block)
        self._uncache(block)
        self.free_queue.remove(block)
        self.free_queue.appendleft(block)
        return True

    def _count_eviction(self, block: Block) -> None:
        scope = block.cache_scope or ""
        self.num_evictions += 1
        self.evictions_by_scope[scope] = self.evictions_by_scope.get(scope, 0) + 1

    def _unlist_scope_free(self, block: Block) -> None:
        if block.block_hash is not None:
            od = self._scope_free.get(block.cache_scope or "")
            if od is not None:
                od.pop(block.block_id, None)

    def _uncache(self, block: Block) -> None:
        """Forget a block's hash (its place in the free queue is the caller's business)."""
        if block.block_hash is None:
            return
        self._unlist_scope_free(block)
        if self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
            self.cached_blocks_by_scope[block.cache_scope or ""] -= 1
        if block.pinned:
            self.num_pinned_blocks -= 1
        block.block_hash = None
        block.cache_scope = None
        block.pinned = False

    # -- pins and flushes ---------------------------------------------------------------------

    def pin(self, block_hash: bytes) -> None:
        """Never evict the block cached (now or later) under `block_hash`; pins are counted."""
        self._pins[block_hash] = self._pins.get(block_hash, 0) + 1
        for pool in (self, *self.pin_followers):
            pool._mark_pinned(block_hash)

    def _mark_pinned(self, block_hash: bytes) -> None:
        block = self.cached.get(block_hash)
        if block is not None and not block.pinned:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
                self._unlist_scope_free(block)
            block.pinned = True
            self.num_pinned_blocks += 1

    def unpin(self, block_hash: bytes) -> None:
        """Drop one pin; at the last one the block becomes an ordinary (evictable) cached block."""
        count = self._pins.get(block_hash, 0)
        if count <= 0:
            raise ValueError("unpin of a hash that is not pinned")
        if count > 1:
            self._pins[block_hash] = count - 1
            return
        del self._pins[block_hash]
        for pool in (self, *self.pin_followers):
            pool._mark_unpinned(block_hash)

    def _mark_unpinned(self, block_hash: bytes) -> None:
        block = self.cached.get(block_hash)
        if block is not None and block.pinned:
            block.pinned = False
            self.num_pinned_blocks -= 1
            if block.ref_cnt == 0:
                self._release(block)

    def is_pinned(self, block_hash: bytes) -> bool:
        return block_hash in self._pins

    @property
    def num_pinned_hashes(self) -> int:
        """Distinct hashes pinned, whether their blocks are cached yet or not (the pin budget)."""
        return len(self._pins)

    def flush(self, match: Callable[[Block], bool] | None = None, include_pinned: bool = False) -> int:
        """Forget the hashes of cached blocks (all, or those `match` accepts); O(cached blocks).

        Blocks in use stay with their requests, uncached. Pinned blocks are kept unless
        `include_pinned`; their pins remain, so recomputing them pins them again.
        """
        n = 0
        for block in list(self.cached.values()):
            if (block.pinned and not include_pinned) or (match is not None and not match(block)):
                continue
            was_held = block.pinned and block.ref_cnt == 0
            self._uncache(block)
            if block.ref_cnt == 0:
                if not was_held:
                    self.free_queue.remove(block)
                self.free_queue.appendleft(block)
            n += 1
        self.num_flushed += n
        return n
