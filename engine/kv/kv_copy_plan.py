"""The copies the KV cache manager decides between steps, handed to the next step's runner.

Two kinds of copy are planned here while the scheduler plans a step, and taken once it is
planned (`SchedulerOutput.blocks_to_copy` and `SchedulerOutput.swaps`, `weir.engine.kv.kv_swap`):

- copy-on-write pairs (src, dst): a request about to write into a block that is shared or cached
  writes into a fresh copy instead;
- store fills (dst, payload): blocks fetched from the shared store tier, written into fresh
  device blocks; the requests they fill are remembered, since those cannot be swapped out in
  the same step (the store's bytes land after the swap-out would read them).

The host tier's own copies (swap-out, swap-in, promotions) are planned by
`weir.engine.kv.host_kv_tier.HostKVTier`; `take_transfers` joins them with the store's. A block
given back before the step runs drops the copies into it (`drop_into`), so a copy never lands on
the block's next owner. Plain Python, no torch.
"""

from __future__ import annotations

from dataclasses import replace

from weir.engine.kv.block_pool import BlockPool
from weir.engine.kv.host_kv_tier import HostKVTier
from weir.engine.kv.kv_swap import KVTransfers
from weir.engine.kv.store.tier import KVStoreTier


class KVCopyPlan:
    """The copy-on-write pairs and store fills decided since the last step."""

    def __init__(self, pool: BlockPool, host: HostKVTier | None, store: KVStoreTier | None) -> None:
        self.pool = pool
        self.host = host
        self.store = store
        self._copies: list[tuple[int, int]] = []  # copy-on-write pairs for the next step
        self._store_in: list[tuple[int, bytes]] = []  # (device block, payload) for the next step
        self._store_filled: dict[str, None] = {}  # requests whose blocks the next step's store_in fills

    def plan_copy(self, src: int, dst: int) -> None:
        """Plan `dst` to hold what `src` will hold when this step's forward runs.

        The runner copies device blocks before this step's host and store fills
        (engine/kv/kv_swap.py), and all copy-on-write pairs at once: a source that one of those
        fills in this same step (a prefix block just promoted, a store hit, a block copied
        earlier in the step) is read before it holds anything. Then `dst` is filled from where
        `src`'s contents come from instead.
        """
        if self.host is not None and self.host.fill_also(src, dst):
            return
        for block_id, payload in self._store_in:
            if block_id == src:
                self._store_in.append((dst, payload))
                return
        for copy_src, copy_dst in self._copies:
            if copy_dst == src:
                src = copy_src
                break
        self._copies.append((src, dst))

    def plan_store_fill(self, dst: int, payload: bytes) -> None:
        """Plan the store's `payload` to be written into device block `dst` in the next step."""
        self._store_in.append((dst, payload))

    def filled_from_store(self, request_id: str) -> None:
        """The next step's store fills write into this request's blocks."""
        self._store_filled[request_id] = None

    def is_filled_from_store(self, request_id: str) -> bool:
        return request_id in self._store_filled

    def copy_sources(self) -> dict[int, int]:
        """dst -> src of the copy-on-write pairs planned so far (they have not run yet)."""
        return {dst: src for src, dst in self._copies}

    def drop_copies_into(self, block_ids: set[int]) -> None:
        """Blocks given back before the step runs: no copy-on-write lands on them."""
        if self._copies:
            self._copies = [c for c in self._copies if c[1] not in block_ids]

    def drop_into(self, block_ids: set[int]) -> None:
        """Blocks given back before the step runs: no copy of either kind lands on them.

        Store hits cached at admission whose fill will not run now (the request was preempted
        in the step that admitted it) lose their hashes, or the next request with this prefix
        would read blocks never filled.
        """
        self.drop_copies_into(block_ids)
        unfilled = {dst for dst, _ in self._store_in if dst in block_ids}
        if unfilled:
            self._store_in = [c for c in self._store_in if c[0] not in unfilled]
            self.pool.flush(lambda b: b.block_id in unfilled, include_pinned=True)

    def has_pending(self) -> bool:
        return bool(self._copies or self._store_in)

    def take_copies(self) -> tuple[tuple[int, int], ...]:
        """The copy-on-write pairs decided since the last call, for this step's runner."""
        copies = tuple(self._copies)
        self._copies.clear()
        return copies

    def has_pending_transfers(self) -> bool:
        """Whether store transfers wait for a step (the host tier's wait only while requests run)."""
        return bool(self._store_in) or (self.store is not None and self.store.has_saves)

    def take_transfers(self) -> KVTransfers:
        """The copies between the tiers decided since the last call, for this step's runner."""
        transfers = self.host.take() if self.host is not None else KVTransfers()
        if self.store is None:
            return transfers
        saves = self.store.take_saves()
        if not saves and not self._store_in:
            self._store_filled.clear()
            return transfers
        store_in, self._store_in = tuple(self._store_in), []
        filled, self._store_filled = tuple(self._store_filled), {}
        ids = transfers.swapped_in_ids + tuple(r for r in filled if r not in transfers.swapped_in_ids)
        return replace(transfers, store_out=saves, store_in=store_in, swapped_in_ids=ids)

    def forget_transfers(self, transfers: KVTransfers) -> None:
        """A step failed with these copies: the blocks they were to fill, in either tier, lose
        their hashes (their contents are not trusted). O(cached blocks); failures only."""
        if self.host is not None:
            self.host.forget_copied(transfers)
        filled = {dst for _, dst in transfers.swap_in} | {dst for dst, _ in transfers.store_in}
        if filled:
            self.pool.flush(lambda b: b.block_id in filled, include_pinned=True)
