"""weir_bench.experiments.gc_pauses: a full collection timed with the model loaded, thawed and frozen."""

from __future__ import annotations

import gc
from pathlib import Path

from tests.engine.tiny_models import make_tiny_model
from weir_bench.experiments import gc_pauses


def test_one_run_times_a_full_collection_thawed_and_frozen(tmp_path: Path) -> None:
    report = gc_pauses.run(make_tiny_model(tmp_path, num_kv_heads=2), reps=2)
    assert report["objects"] > 0 and report["frozen_objects"] > 0 and report["reps"] == 2
    assert report["thawed_full_collection_ms"] > 0 and report["frozen_full_collection_ms"] >= 0
    assert gc.get_freeze_count() == 0  # the process's heap is left as it was found
