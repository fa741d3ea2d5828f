"""Swap or recompute: the cost model that decides how a preempted request gives back its blocks.

When the device pool runs out, the scheduler preempts a victim (lowest priority class, latest
arrival). Its KV can be copied to the host pool now and back later (swap), or dropped and
computed again (recompute). Per victim, the cheaper one wins:

    swap_s      = (blocks to copy out + blocks to copy back in) * block_bytes / copy_bytes_per_s
    recompute_s = tokens to recompute / prefill_tokens_per_s

Blocks the prefix cache still holds cost neither: a block already in the host tier is not copied
out again, a block cached on the device is not copied back in (it is looked up again at
swap-in), and a recompute starts after the leading blocks the device cache holds (prefix hits).
Blocks that later leave the device cache under pressure are demoted to the host tier in both
modes alike, so the model leaves them out of both sides.
`copy_bytes_per_s` is measured at start-up by copying a few blocks each way
(`weir.engine.kv.host_kv_tensors.measure_copy_bandwidth`); the prefill rate is the engine's moving
average (`weir.engine.measured_rates`). Until both are measured, swapping is assumed cheaper: a
copy is a memcpy, a recompute is a forward pass. Plain Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from weir.engine.config import PreemptionMode


@dataclass(frozen=True)
class PreemptionCosts:
    """What preempting one victim would move or recompute, counted by `KVCacheManager`."""

    num_blocks_out: int  # blocks to copy to the host now (not already there)
    num_blocks_in: int  # blocks to copy back to the device at swap-in (not cached on the device)
    num_recompute_tokens: int  # computed tokens after the leading blocks the device cache holds

    def __post_init__(self) -> None:
        for name in ("num_blocks_out", "num_blocks_in", "num_recompute_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class PreemptionChoice:
    """The mode picked for one victim, and the estimates it was picked on (seconds; None: unknown)."""

    mode: PreemptionMode  # SWAP or RECOMPUTE, never AUTO
    swap_s: float | None
    recompute_s: float | None


class SwapPolicy:
    """Chooses swap or recompute per victim; `mode` other than AUTO forces the choice."""

    def __init__(
        self,
        block_bytes: int,
        copy_bytes_per_s: float = 0.0,
        prefill_tokens_per_s: Callable[[], float] = lambda: 0.0,
        mode: PreemptionMode = PreemptionMode.AUTO,
    ) -> None:
        if block_bytes < 1:
            raise ValueError(f"block_bytes must be >= 1, got {block_bytes}")
        if copy_bytes_per_s < 0:
            raise ValueError(f"copy_bytes_per_s must be >= 0, got {copy_bytes_per_s}")
        self.block_bytes = block_bytes
        self.copy_bytes_per_s = copy_bytes_per_s  # 0: not measured
        self.prefill_tokens_per_s = prefill_tokens_per_s  # 0: not measured yet
        self.mode = mode

    def copy_s(self, num_blocks: int) -> float | None:
        """Seconds to copy `num_blocks` blocks one way at the measured bandwidth; None if unmeasured."""
        if self.copy_bytes_per_s <= 0:
            return None
        return num_blocks * self.block_bytes / self.copy_bytes_per_s

    def estimate(self, costs: PreemptionCosts) -> tuple[float | None, float | None]:
        """(swap seconds, recompute seconds) for one victim; None where a rate is not measured."""
        swap_s = self.copy_s(costs.num_blocks_out + costs.num_blocks_in)
        rate = self.prefill_tokens_per_s()
        recompute_s = costs.num_recompute_tokens / rate if rate > 0 else None
        return swap_s, recompute_s

    def choose(self, costs: PreemptionCosts, host_has_room: bool) -> PreemptionChoice:
        """SWAP if the host pool has room and swapping is not dearer (or is forced); else RECOMPUTE."""
        swap_s, recompute_s = self.estimate(costs)
        if not host_has_room or self.mode is PreemptionMode.RECOMPUTE:
            return PreemptionChoice(PreemptionMode.RECOMPUTE, swap_s, recompute_s)
        if self.mode is PreemptionMode.SWAP or swap_s is None or recompute_s is None:
            return PreemptionChoice(PreemptionMode.SWAP, swap_s, recompute_s)
        mode = PreemptionMode.SWAP if swap_s <= recompute_s else PreemptionMode.RECOMPUTE
        return PreemptionChoice(mode, swap_s, recompute_s)
