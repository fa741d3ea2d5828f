"""weir.engine.latency_targets: the shipped class defaults per device, and a tenant's override over them."""

from __future__ import annotations

import pytest

from weir.engine.latency_targets import (
    CPU_CLASS_TARGETS,
    GPU_CLASS_TARGETS,
    LatencyTargets,
    class_targets_for,
)
from weir.engine.request import Priority


def test_the_documented_defaults() -> None:
    # CPU: the interactive ITL is half the noisy-neighbour objective of 300 ms (see the module)
    assert CPU_CLASS_TARGETS.of(Priority.INTERACTIVE) == LatencyTargets(ttft_s=2.0, itl_s=0.1)
    assert CPU_CLASS_TARGETS.of(Priority.STANDARD) == LatencyTargets(ttft_s=10.0, itl_s=0.8)
    assert CPU_CLASS_TARGETS.of(Priority.BATCH) == LatencyTargets()
    assert GPU_CLASS_TARGETS.of(Priority.INTERACTIVE) == LatencyTargets(ttft_s=0.5, itl_s=0.05)
    assert GPU_CLASS_TARGETS.of(Priority.STANDARD) == LatencyTargets(ttft_s=2.0, itl_s=0.1)
    assert class_targets_for("cpu") is CPU_CLASS_TARGETS
    assert class_targets_for("cuda:0") is GPU_CLASS_TARGETS


def test_a_tenant_override_replaces_only_what_it_sets() -> None:
    override = LatencyTargets.from_slo_ms(ttft_slo_ms=None, tpot_slo_ms=400)
    assert CPU_CLASS_TARGETS.resolve(Priority.INTERACTIVE, override) == LatencyTargets(2.0, 0.4)
    assert LatencyTargets.from_slo_ms(0, -5) == LatencyTargets()  # not > 0: the class's


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_targets_must_be_finite_and_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="finite number > 0"):
        LatencyTargets(ttft_s=bad)
