"""engine/structured/worker_priority.py: grammar workers run at nice 19, the rest of the process does not."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from weir.engine.structured.worker_priority import LOWEST_NICE, lower_thread_priority, thread_nice

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")


def test_a_worker_lowers_its_own_priority_only() -> None:
    before = thread_nice()
    with ThreadPoolExecutor(1, initializer=lower_thread_priority) as pool:
        assert pool.submit(thread_nice).result() == LOWEST_NICE
    assert thread_nice() == before  # the calling thread keeps its priority


def test_the_mask_and_compile_workers_run_at_the_lowest_priority() -> None:
    from weir.engine.runner.mask_prefetch import MaskPrefetcher
    from weir.gateway.prompts.grammar import GrammarService

    masks = MaskPrefetcher()
    service = GrammarService()
    try:
        assert masks._workers().submit("acme", "r1", thread_nice).result() == LOWEST_NICE
        assert service._pool.submit(thread_nice).result() == LOWEST_NICE
    finally:
        masks.close()
        service.close()
