"""`python -m weir_bench.experiments.gc_pauses`: what one full garbage collection costs a process that
holds a loaded model, with the heap frozen (gateway/fleet/gc_pauses.py) and without.

The real engine is loaded (the CPU fast path, as `weir serve` builds it) beside the gateway's
modules; then the median of `--reps` explicit `gc.collect()` calls, `thawed` (the heap as CPython
leaves it) and `frozen` (after `refreeze_heap`). A full collection holds the GIL throughout: the
engine thread and the event loop both stand still. How often a served run starts one by itself
is on the server's `/metrics` (`weir_gc_pause_seconds`; `weir_bench.experiments.serve_vs_peer`
reports it after each run).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from weir.gateway.fleet.gc_pauses import refreeze_heap


def full_collection_ms(reps: int) -> float:
    """Median milliseconds of one `gc.collect()`."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e3, 2)


def run(model: Path, reps: int) -> dict[str, Any]:
    import weir.gateway.server.bootstrap  # noqa: F401  (the gateway's modules, as in `weir serve`)
    from weir.engine.engine_builder import build_engine
    from weir_bench.experiments.cpu_fast_path import cpu_engine_config

    engine = build_engine(cpu_engine_config(model, "float32", True, 8, 512))
    gc.unfreeze()
    result: dict[str, Any] = {"objects": len(gc.get_objects()), "reps": reps}
    result["thawed_full_collection_ms"] = full_collection_ms(reps)
    result["frozen_objects"] = refreeze_heap("the experiment")
    result["frozen_full_collection_ms"] = full_collection_ms(reps)
    gc.unfreeze()
    del engine
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m weir_bench.experiments.gc_pauses", description=__doc__.splitlines()[0]
    )
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    print(json.dumps(run(args.model, args.reps), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
