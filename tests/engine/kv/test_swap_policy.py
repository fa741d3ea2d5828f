"""The swap-or-recompute cost model: estimates, forced modes, unmeasured rates, bad input."""

from __future__ import annotations

import pytest

from weir.engine.config import PreemptionMode
from weir.engine.kv.swap_policy import PreemptionCosts, SwapPolicy


def _policy(bandwidth: float, prefill: float, mode: PreemptionMode = PreemptionMode.AUTO) -> SwapPolicy:
    return SwapPolicy(
        block_bytes=1000, copy_bytes_per_s=bandwidth, prefill_tokens_per_s=lambda: prefill, mode=mode
    )


def test_the_cheaper_mode_wins() -> None:
    costs = PreemptionCosts(num_blocks_out=4, num_blocks_in=4, num_recompute_tokens=64)
    # 8 blocks of 1000 bytes at 1 MB/s = 8 ms; 64 tokens at 1000 tokens/s = 64 ms: swap.
    choice = _policy(1e6, 1000).choose(costs, host_has_room=True)
    assert choice.mode is PreemptionMode.SWAP
    assert choice.swap_s == pytest.approx(0.008) and choice.recompute_s == pytest.approx(0.064)
    # The same victim on a machine that prefills 100x faster: recompute.
    assert _policy(1e6, 100_000).choose(costs, host_has_room=True).mode is PreemptionMode.RECOMPUTE


def test_blocks_the_prefix_cache_holds_cost_nothing_to_recompute() -> None:
    costs = PreemptionCosts(num_blocks_out=1, num_blocks_in=1, num_recompute_tokens=0)
    assert _policy(1e6, 1000).choose(costs, host_has_room=True).mode is PreemptionMode.RECOMPUTE


def test_no_room_on_the_host_means_recompute_even_when_forced_to_swap() -> None:
    costs = PreemptionCosts(num_blocks_out=4, num_blocks_in=4, num_recompute_tokens=64)
    choice = _policy(1e6, 1000, PreemptionMode.SWAP).choose(costs, host_has_room=False)
    assert choice.mode is PreemptionMode.RECOMPUTE


def test_forced_modes_override_the_estimates() -> None:
    cheap_recompute = PreemptionCosts(num_blocks_out=100, num_blocks_in=100, num_recompute_tokens=1)
    assert _policy(1e6, 1e6, PreemptionMode.SWAP).choose(cheap_recompute, True).mode is PreemptionMode.SWAP
    cheap_swap = PreemptionCosts(num_blocks_out=1, num_blocks_in=1, num_recompute_tokens=10_000)
    choice = _policy(1e9, 1, PreemptionMode.RECOMPUTE).choose(cheap_swap, True)
    assert choice.mode is PreemptionMode.RECOMPUTE


def test_until_both_rates_are_measured_swapping_is_assumed_cheaper() -> None:
    costs = PreemptionCosts(num_blocks_out=100, num_blocks_in=100, num_recompute_tokens=1)
    assert _policy(1e6, 0.0).choose(costs, True).mode is PreemptionMode.SWAP  # no prefill measured yet
    assert _policy(0.0, 1e6).choose(costs, True).mode is PreemptionMode.SWAP  # no bandwidth measured
    assert _policy(0.0, 0.0).estimate(costs) == (None, None)


def test_bad_figures_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="block_bytes"):
        SwapPolicy(block_bytes=0)
    with pytest.raises(ValueError, match="copy_bytes_per_s"):
        SwapPolicy(block_bytes=1, copy_bytes_per_s=-1.0)
    with pytest.raises(ValueError, match="num_recompute_tokens"):
        PreemptionCosts(num_blocks_out=0, num_blocks_in=0, num_recompute_tokens=-1)
