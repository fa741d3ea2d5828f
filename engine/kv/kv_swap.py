"""The copy plan between the device KV pool and the host pool, carried in the step contract.

The scheduler decides a step's copies; `SchedulerOutput.swaps` carries them and the runner
performs them (`weir.engine.kv.host_kv_tensors.HostKVCopier`) before the forward, in this order:

1. `swap_out`, device -> host: swapped-out requests and prefix blocks demoted on eviction;
2. the copy-on-write pairs (`SchedulerOutput.blocks_to_copy`), device -> device;
3. `swap_in`, host -> device: swapped-in requests and promoted prefix blocks.

The shared store tier (`weir.engine.kv.store.tier`) adds two more: `store_out`, device
blocks whose bytes go to the store's write queue, read before anything above (a block freed by a
finished request may be handed out again in this step); and `store_in`, payloads fetched from the
store written into fresh device blocks, after everything above.

Every copy of a step reads what the previous step left, because of what the plan guarantees:
a device block freed this step (a swap-out's source, a copy-on-write source) may be handed out
again in the same step, so it is read before anything writes it (1 before 2 and 3); a host block
read by `swap_in` is not handed out again until the step's plan is taken (so 1 never overwrites
it); a request whose blocks `swap_in` fills this step is not swapped out in the same step.
Plain Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from weir.engine.kv.store.codec import StoreWrite


@dataclass(frozen=True)
class KVTransfers:
    """One step's copies between the tiers, in execution order (see the module docstring)."""

    swap_out: tuple[tuple[int, int], ...] = ()  # (device block, host block)
    swap_in: tuple[tuple[int, int], ...] = ()  # (host block, device block)
    swapped_in_ids: tuple[str, ...] = ()  # requests whose blocks `swap_in` or `store_in` fill
    store_out: tuple[tuple[int, StoreWrite], ...] = ()  # (device block, where its bytes go)
    store_in: tuple[tuple[int, bytes], ...] = ()  # (device block, its verified KV bytes)

    @property
    def has_swaps(self) -> bool:
        """Copies between the device and the host tier."""
        return bool(self.swap_out or self.swap_in)

    @property
    def is_empty(self) -> bool:
        return not self.swap_out and not self.swap_in and not self.store_out and not self.store_in


NO_TRANSFERS = KVTransfers()
