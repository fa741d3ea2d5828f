"""The class targets the SLO scenario tests were written for.

The CPU defaults, with the interactive ITL at 300 ms: the noisy-neighbour objective, which the
scenarios' step costs and assertions are sized around. The shipped interactive target is half
of it (engine/latency_targets.py; tests/engine/test_latency_targets.py checks the table).
"""

from __future__ import annotations

import dataclasses

from weir.engine.latency_targets import CPU_CLASS_TARGETS, LatencyTargets

SCENARIO_CLASS_TARGETS = dataclasses.replace(
    CPU_CLASS_TARGETS, interactive=LatencyTargets(ttft_s=2.0, itl_s=0.3)
)
