"""engine/step_threads.py: every core for wide steps, the process's count else."""

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


def test_the_count_follows_the_rows_a_step_feeds(restore_threads: int) -> None:
    threads = StepThreads(decode_threads=1, wide_threads=2, min_rows=4)
    assert threads.threads_for(_step(1)) == 1  # one decode row
    assert threads.threads_for(_step(1, 1, 1)) == 1  # three decode rows
    assert threads.threads_for(_step(1, 1, 1, 1)) == 2  # four
    assert threads.threads_for(_step(3)) == 1  # a three-token chunk
    assert threads.threads_for(_step(1, 3)) == 2  # the chunk beside a decode
    assert threads.threads_for(_step(128)) == 2


def test_the_default_is_wide_from_four_rows(restore_threads: int) -> None:
    threads = StepThreads(decode_threads=1, wide_threads=2)
    assert threads.min_rows == 4
    assert [threads.threads_for(_step(*[1] * n)) for n in (1, 2, 3, 4, 8)] == [1, 1, 1, 2, 2]


def test_apply_sets_torch_threads_only_when_the_count_changes(restore_threads: int) -> None:
    torch.set_num_threads(1)
    threads = StepThreads(decode_threads=1, wide_threads=2)
    threads.apply(_step(1, 1))
    assert torch.get_num_threads() == 1
    threads.apply(_step(128))
    assert torch.get_num_threads() == 2 and threads.num_wide_steps == 1
    threads.apply(_step(1))
    assert torch.get_num_threads() == 1 and threads.num_wide_steps == 1


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="thread counts"):
        StepThreads(decode_threads=0, wide_threads=2)
    with pytest.raises(ValueError, match="min_rows"):
        StepThreads(decode_threads=1, wide_threads=2, min_rows=0)
