"""The host-memory KV tier: a second block pool for swapped requests and demoted prefix blocks.

The host pool is a `BlockPool` of its own (same block layout as the device pool; its block 0 is
unused like the device's null block) that shares the device pool's pin counts. It holds:

- **Swapped requests.** `preempt` copies a preempted request's computed blocks to host blocks
  and keeps them, one reference each, in a `SwappedKV` record until `swap_in` copies them back
  (or the request ends: `drop`). A block the host tier already caches under the same hash is
  referenced, not copied again; a cached block copied now is cached on the host as well. The
  blocks allocated for a scope's swapped requests stay within its share of the host pool (the
  `tenant_cache_share` that caps cached blocks), so one tenant cannot fill it: past that, its
  victims recompute.
- **Demoted prefix blocks.** A cached device block about to be evicted (`BlockPool.on_evict`) is
  copied to a host block cached under the same hash and scope (free, in the host LRU), if the
  scope is under its host cap (the same share of the host pool as on the device) and a block can
  be had. A later prefix hit promotes it: the KV cache manager copies it into a device block,
  cached there again; the host copy stays (so demoting it again costs nothing).

Hashes chain from the tenant's cache scope, so a lookup finds only the caller's scope's blocks
(and the shared prefixes), in either tier. Pinned hashes are pinned in both tiers.

Every copy is planned here and taken once per step (`take`) as a `KVTransfers`. Host blocks read
by this step's host -> device copies keep a reference until then, so a device -> host copy of
the same step (which runs first) never overwrites them. Plain Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from weir.engine.config import PreemptionMode
from weir.engine.kv.block_pool import Block, BlockPool
from weir.engine.kv.kv_swap import KVTransfers
from weir.engine.kv.swap_policy import PreemptionCosts, SwapPolicy


@dataclass
class SwappedKV:
    """A swapped-out request's KV: one host block per computed block (each holding a reference)."""

    host_blocks: list[Block]
    num_computed_tokens: int
    num_cached: int  # leading blocks that were registered in the prefix cache
    scope: str  # the request's cache scope
    num_charged: int  # host blocks allocated for it (the others were there): its scope's charge


@dataclass(frozen=True)
class HostKVStats:
    """The host tier at one moment, and its counters since start-up."""

    num_total_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    num_swapped_requests: int  # requests whose KV is on the host now
    num_blocks_swapped_out: int
    num_blocks_swapped_in: int
    num_swap_preemptions: int
    num_demotions: int  # cached blocks copied to the host on eviction from the device
    num_promotions: int  # host blocks copied back to the device on a prefix hit
    copy_bytes_per_s: float  # measured at start-up; 0: not measured

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_total_blocks if self.num_total_blocks else 0.0


@dataclass
class _StepPlan:
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    filled_ids: dict[str, None] = field(default_factory=dict)  # insertion-ordered set
    held: list[Block] = field(default_factory=list)  # host blocks read this step, released at `take`
    cow_fills: set[int] = field(default_factory=set)  # device blocks `fill_also` added to swap_in


class HostKVTier:
    """The host pool, the swapped requests' records and the copies planned for the next step."""

    def __init__(
        self,
        num_blocks: int,
        device: BlockPool,
        block_size: int,
        swap_policy: SwapPolicy,
        tenant_cache_share: float = 1.0,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"host num_blocks must be >= 1, got {num_blocks}")
        self.device = device
        self.block_size = block_size
        self.swap_policy = swap_policy
        self.pool = device.follower(num_blocks + 1)  # + the unused block 0
        device.on_evict = self.demote
        self.max_cached_blocks_per_scope = max(1, int(tenant_cache_share * self.pool.num_usable_blocks))
        self.records: dict[str, SwappedKV] = {}
        # Host blocks allocated for each scope's swapped requests: at most its share of the pool.
        self.swapped_blocks_by_scope: dict[str, int] = {}
        self.copy_bytes_per_s = 0.0
        self.num_blocks_swapped_out = 0
        self.num_blocks_swapped_in = 0
        self.num_swap_preemptions = 0
        self.num_demotions = 0
        self.num_promotions = 0
        self._plan = _StepPlan()

    # -- lookups ----------------------------------------------------------------------------------

    def lookup(self, block_hash: bytes) -> Block | None:
        return self.pool.lookup(block_hash)

    def owns(self, block: Block) -> bool:
        return self.pool.owns(block)

    def filled_this_step(self, request_id: str) -> bool:
        """Whether this step's host -> device copies write blocks of `request_id`."""
        return request_id in self._plan.filled_ids

    # -- demotion and promotion -------------------------------------------------------------------

    def demote(self, block: Block) -> None:
        """Copy a cached device block about to be evicted to the host, cached under its hash."""
        h = block.block_hash
        if h is None or h in self.pool.cached:
            return  # nothing to keep, or the host has it already (demoted or promoted earlier)
        hb = self._new_cached_block(h, block.cache_scope or "")
        if hb is None:
            return
        self.pool.free([hb])  # free and cached: the host LRU may evict it later
        self._plan.swap_out.append((block.block_id, hb.block_id))
        self.num_demotions += 1

    def promote(self, host_block: Block, device_block: Block, request_id: str) -> None:
        """Plan the copy of a held host prefix block into `device_block` for `request_id`."""
        self._plan.swap_in.append((host_block.block_id, device_block.block_id))
        self._plan.filled_ids[request_id] = None
        self.num_promotions += 1

    def fill_also(self, device_block_id: int, dst_block_id: int) -> bool:
        """If this step copies a host block into `device_block_id`, copy it into `dst_block_id` too.

        For a copy-on-write of a block whose contents arrive in this same step: the host block
        stays held until the plan is taken, so both copies read it. False if no copy fills it.
        """
        for host_id, dev_id in self._plan.swap_in:
            if dev_id == device_block_id:
                self._plan.swap_in.append((host_id, dst_block_id))
                self._plan.cow_fills.add(dst_block_id)
                return True
        return False

    def unfill(self, blocks: list[Block]) -> None:
        """Drop `fill_also` copies into device blocks given back in this step (they may be handed out again)."""
        if not self._plan.cow_fills:
            return
        gone = self._plan.cow_fills & {b.block_id for b in blocks}
        if gone:
            self._plan.swap_in = [c for c in self._plan.swap_in if c[1] not in gone]
            self._plan.cow_fills -= gone

    def hold(self, blocks: list[Block]) -> None:
        """Reference host blocks until this step's plan is taken (promotion sources)."""
        self.pool.touch(blocks)
        self._plan.held.extend(blocks)

    def _new_cached_block(self, block_hash: bytes, scope: str) -> Block | None:
        """A referenced host block cached under `block_hash` (None if the scope's cap or the pool forbids)."""
        pool = self.pool
        if not pool.room_in_scope(scope, self.max_cached_blocks_per_scope) or pool.num_free_blocks == 0:
            return None
        (hb,) = pool.allocate(1)
        pool.cache(hb, block_hash, scope)
        return hb

    # -- swapping ---------------------------------------------------------------------------------

    def preempt(
        self,
        request_id: str,
        blocks: list[Block],
        source_ids: list[int],
        num_computed_tokens: int,
        num_cached: int,
        scope: str,
    ) -> PreemptionMode:
        """Swap a victim's computed `blocks` out (see `_swap_out`) if the cost model prefers it and
        the host has room within its `scope`'s share; the caller frees the device blocks either
        way. Never for a request whose blocks this step's host -> device copies fill: those
        copies run after the swap-out's."""
        # The host block already caching each block's hash (referenced, not copied again), or None.
        reused = [self.pool.lookup(b.block_hash) if b.block_hash is not None else None for b in blocks]
        num_out = sum(1 for hb in reused if hb is None)
        num_revived = sum(1 for hb in reused if hb is not None and hb.ref_cnt == 0 and not hb.pinned)
        num_leading = next((i for i, b in enumerate(blocks) if b.block_hash is None), len(blocks))
        costs = PreemptionCosts(
            num_blocks_out=num_out,
            num_blocks_in=sum(1 for b in blocks if b.block_hash is None),
            num_recompute_tokens=max(0, num_computed_tokens - num_leading * self.block_size),
        )
        # The host pool must have room, and a scope's swapped requests at most its share of it (so
        # one tenant cannot fill it); never for a request this step's swap-ins fill (see above).
        may_swap = (
            not self.filled_this_step(request_id)
            and num_out + num_revived <= self.pool.num_free_blocks
            and self.swapped_blocks_by_scope.get(scope, 0) + num_out <= self.max_cached_blocks_per_scope
        )
        mode = self.swap_policy.choose(costs, may_swap).mode
        if mode is PreemptionMode.SWAP:
            record = SwappedKV([], num_computed_tokens, num_cached, scope, num_out)
            self._swap_out(request_id, blocks, reused, source_ids, record)
        return mode

    def _swap_out(
        self,
        request_id: str,
        blocks: list[Block],
        reused: list[Block | None],
        source_ids: list[int],
        record: SwappedKV,
    ) -> None:
        """Keep `blocks` (a request's computed blocks; `source_ids[i]`: the device block holding
        `blocks[i]`'s content now; `reused[i]`: the host block caching its hash, if any) on the
        host in `record`; `preempt` checked the room, and the caller frees the device blocks."""
        if request_id in self.records:
            raise ValueError(f"request {request_id!r} is already swapped out")
        self.pool.touch([hb for hb in reused if hb is not None])
        host_blocks = record.host_blocks
        for block, src, hb in zip(blocks, source_ids, reused, strict=True):
            if hb is None:
                if block.block_hash is not None:
                    hb = self._new_cached_block(block.block_hash, block.cache_scope or "")
                if hb is None:
                    (hb,) = self.pool.allocate(1)
                self._plan.swap_out.append((src, hb.block_id))
                self.num_blocks_swapped_out += 1
            host_blocks.append(hb)
        self.records[request_id] = record
        if record.num_charged:
            by_scope = self.swapped_blocks_by_scope
            by_scope[record.scope] = by_scope.get(record.scope, 0) + record.num_charged
        self.num_swap_preemptions += 1

    def swap_in(
        self,
        request_id: str,
        num_blocks: int,
        reserve: int,
        cache_block: Callable[[Block, bytes, str], None],
    ) -> tuple[list[Block], SwappedKV] | None:
        """A device block table of `num_blocks` for a swapped-out request, its computed blocks
        copied back (a block the device still caches is referenced instead), and its record,
        now consumed; None (nothing changed) if the device pool has fewer than `reserve` blocks
        to spare. `cache_block` registers a copied cached block on the device again."""
        record = self.records.get(request_id)
        if record is None:
            raise ValueError(f"request {request_id!r} is not swapped out")
        device = self.device
        found = [
            device.lookup(hb.block_hash) if hb.block_hash is not None else None for hb in record.host_blocks
        ]
        need = sum(1 for d in found if d is None) + max(0, num_blocks - len(found))
        need += sum(1 for d in found if d is not None and d.ref_cnt == 0 and not d.pinned)
        if need > device.num_free_blocks - reserve:
            return None
        device.touch([d for d in found if d is not None])
        table: list[Block] = []
        for hb, d in zip(record.host_blocks, found, strict=True):
            if d is None:
                (d,) = device.allocate(1)
                self._plan.swap_in.append((hb.block_id, d.block_id))
                self.num_blocks_swapped_in += 1
                if hb.block_hash is not None:
                    cache_block(d, hb.block_hash, hb.cache_scope or "")
            table.append(d)
        if num_blocks > len(table):
            table.extend(device.allocate(num_blocks - len(table)))
        self._forget_record(request_id)
        self._plan.held.extend(record.host_blocks)  # their references, released once the copies are taken
        self._plan.filled_ids[request_id] = None
        return table, record

    def drop(self, request_id: str) -> None:
        """Forget a swapped request's record (it ended while swapped); its host blocks are freed."""
        record = self._forget_record(request_id)
        if record is not None:
            self.pool.free(reversed(record.host_blocks))

    def _forget_record(self, request_id: str) -> SwappedKV | None:
        """Remove a swapped request's record and its scope's charge (its host blocks stay held)."""
        record = self.records.pop(request_id, None)
        if record is not None and record.num_charged:
            left = self.swapped_blocks_by_scope.pop(record.scope) - record.num_charged
            if left:
                self.swapped_blocks_by_scope[record.scope] = left
        return record

    # -- the step plan ----------------------------------------------------------------------------

    def take(self) -> KVTransfers:
        """This step's copies; host blocks held for them are released now."""
        plan, self._plan = self._plan, _StepPlan()
        if plan.held:
            self.pool.free(reversed(plan.held))
        if not plan.swap_out and not plan.swap_in:
            return KVTransfers()
        return KVTransfers(tuple(plan.swap_out), tuple(plan.swap_in), tuple(plan.filled_ids))

    def forget_copied(self, transfers: KVTransfers) -> None:
        """The step that carried `transfers` failed: host blocks it was to fill hold nothing, so
        their hashes are forgotten (records using them are the scheduler's to drop)."""
        written = {host for _, host in transfers.swap_out}
        if written:
            self.pool.flush(lambda b: b.block_id in written, include_pinned=True)

    def carry_counters(self, old: HostKVTier) -> None:
        """Keep the counters of the tier this one replaces (engine reset): metrics are monotonic."""
        self.copy_bytes_per_s = old.copy_bytes_per_s
        self.num_blocks_swapped_out = old.num_blocks_swapped_out
        self.num_blocks_swapped_in = old.num_blocks_swapped_in
        self.num_swap_preemptions = old.num_swap_preemptions
        self.num_demotions = old.num_demotions
        self.num_promotions = old.num_promotions

    def stats(self) -> HostKVStats:
        pool = self.pool
        return HostKVStats(
            num_total_blocks=pool.num_usable_blocks,
            num_free_blocks=pool.num_free_blocks,
            num_cached_blocks=len(pool.cached),
            num_swapped_requests=len(self.records),
            num_blocks_swapped_out=self.num_blocks_swapped_out,
            num_blocks_swapped_in=self.num_blocks_swapped_in,
            num_swap_preemptions=self.num_swap_preemptions,
            num_demotions=self.num_demotions,
            num_promotions=self.num_promotions,
            copy_bytes_per_s=self.copy_bytes_per_s,
        )
