"""Physical KV blocks: ref counts, an O(1) LRU free queue, and the hash -> block map.

A block whose ref count drops to zero goes to the tail of the free queue but keeps its hash,
so a later request with the same prefix can revive it (a prefix-cache hit). Allocation takes
from the head, evicting the least recently freed cached block. Plain Python, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


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
    """Doubly linked list of free blocks: O(1) append, pop-front and remove-from-middle."""

    def __init__(self, blocks: Iterable[Block]) -> None:
        self._head = Block(-1)
        self._tail = Block(-1)
        self._head.next = self._tail
        self._tail.prev = self._head
        self.num_free = 0
        for b in blocks:
            self.append(b)

    def append(self, block: Block) -> None:
        last = self._tail.prev
        assert last is not None
        last.next = block
        block.prev = last
        block.next = self._tail
        self._tail.prev = block
        self.num_free += 1

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

    def __iter__(self):  # type: ignore[no-untyped-def]
        node = self._head.next
        while node is not None and node is not self._tail:
            yield node
            node = node.next


class BlockPool:
    """All KV blocks of one device, with prefix-cache bookkeeping.

    Block 0 is reserved as the null block (padding target in block tables) and never handed out.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
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
        self.evictions_by_scope: dict[str, int] = {}
        self.cached_blocks_by_scope: dict[str, int] = {}

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free

    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def allocate(self, num: int) -> list[Block]:
        """Take `num` blocks from the LRU end, evicting their cached hashes."""
        if num > self.free_queue.num_free:
            raise ValueError(f"cannot allocate {num} blocks, only {self.free_queue.num_free} free")
        out = []
        for _ in range(num):
            block = self.free_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on blocks found in the prefix cache (reviving free ones)."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free(self, blocks: Iterable[Block]) -> None:
        """Drop one reference per block. Pass blocks tail-first so tails are evicted first."""
        for block in blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"double free of block {block.block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None or not self.enable_caching:
                    self._evict(block)
                if not block.pinned:
                    self.free_queue.append(block)

    def lookup(self, block_hash: bytes) -> Block | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def cache(self, block: Block, block_hash: bytes, scope: str) -> None:
        """Register a full block under its chained hash. A hash already cached keeps its block."""
        if not self.enable_caching or block.block_hash is not None or block_hash in self.cached:
            return
        block.block_hash = block_hash
        block.cache_scope = scope
        self.cached[block_hash] = block
        self.cached_blocks_by_scope[scope] = self.cached_blocks_by_scope.get(scope, 0) + 1

    def _evict(self, block: Block) -> None:
        if block.block_hash is None:
            return
        if self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
            scope = block.cache_scope or ""
            self.cached_blocks_by_scope[scope] -= 1
            self.num_evictions += 1
            self.evictions_by_scope[scope] = self.evictions_by_scope.get(scope, 0) + 1
        block.block_hash = None
        block.cache_scope = None

    def evict_scope_lru(self, scope: str, max_blocks: int) -> int:
        """Evict free cached blocks of `scope`, oldest first, until it holds at most `max_blocks`."""
        evicted = 0
        if self.cached_blocks_by_scope.get(scope, 0) <= max_blocks:
            return 0
        for block in list(self.free_queue):
            if self.cached_blocks_by_scope.get(scope, 0) <= max_blocks:
                break
            if block.cache_scope == scope and not block.pinned:
                self._evict(block)
                evicted += 1
        return evicted

    def reset_cache(self, predicate=None) -> int:  # type: ignore[no-untyped-def]
        """Forget cached hashes of free blocks (all, or those matching `predicate(block)`)."""
        n = 0
        for block in list(self.free_queue):
            if block.block_hash is not None and (predicate is None or predicate(block)):
                self._evict(block)
                n += 1
        return n
