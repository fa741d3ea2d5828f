"""An engine snapshot for the /metrics tests: a small pool, one running sequence, and the fields a
test is about."""

from __future__ import annotations

from typing import Any

from weir.engine.engine_stats import EngineStats


def engine_stats(**fields: Any) -> EngineStats:
    """An `EngineStats` of one running sequence in a 10-block pool (5 free), with `fields` set."""
    base: dict[str, Any] = {
        "num_running": 1,
        "num_waiting": 0,
        "num_total_blocks": 10,
        "num_free_blocks": 5,
        "block_size": 16,
    }
    return EngineStats(**{**base, **fields})
