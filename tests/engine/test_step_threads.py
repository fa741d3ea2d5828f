"""engine/step_threads.py: every core for the steps that are mostly prefill, the process's count else."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from engine.output import ScheduledRequest, SchedulerOutput
from engine.step_threads import StepThreads


def _step(*num_tokens: int) -> SchedulerOutput:
    return SchedulerOutput(
        tuple(ScheduledRequest(f"r{i}", n, 0, (1,), samples=True) for i, n in enumerate(num_tokens))
    )


@pytest.fixture
def restore_threads() -> Iterator[int]:
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_the_count_follows_the_prefill_tokens_a_step_feeds(restore_threads: int) -> None:
    threads = StepThreads(decode_threads=1, prefill_threads=2, min_prefill_tokens=32)
    assert threads.threads_for(_step(1, 1, 1)) == 1  # decodes only
    assert threads.threads_for(_step(1, 31)) == 1  # a short chunk beside a decode
    assert threads.threads_for(_step(1, 32)) == 2
    assert threads.threads_for(_step(16, 16, 1)) == 2  # two chunks together


def test_apply_sets_torch_threads_only_when_the_count_changes(restore_threads: int) -> None:
    torch.set_num_threads(1)
    threads = StepThreads(decode_threads=1, prefill_threads=2)
    threads.apply(_step(1, 1))
    assert torch.get_num_threads() == 1
    threads.apply(_step(128))
    assert torch.get_num_threads() == 2 and threads.num_prefill_steps == 1
    threads.apply(_step(1))
    assert torch.get_num_threads() == 1 and threads.num_prefill_steps == 1


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="thread counts"):
        StepThreads(decode_threads=0, prefill_threads=2)
    with pytest.raises(ValueError, match="min_prefill_tokens"):
        StepThreads(decode_threads=1, prefill_threads=2, min_prefill_tokens=0)
