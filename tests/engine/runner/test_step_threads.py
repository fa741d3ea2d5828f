"""engine/runner/step_threads.py: the process's count for narrow steps; for wide ones, the count measured
faster per bucket of rows, the other explored now and then."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.tiny_models import make_tiny_model
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.output import ScheduledRequest, SchedulerOutput
from weir.engine.runner.step_threads import StepThreads, row_bucket


def _step(*num_tokens: int) -> SchedulerOutput:
    return SchedulerOutput(
        tuple(ScheduledRequest(f"r{i}", n, 0, (1,), samples=True) for i, n in enumerate(num_tokens))
    )


@pytest.fixture
def restore_threads() -> Iterator[int]:
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def _run(threads: StepThreads, out: SchedulerOutput, seconds_on: dict[int, float]) -> int:
    """One step: apply, then observe the time the step takes on the count it ran with."""
    threads.apply(out)
    ran = threads.step_count
    threads.observe(out, seconds_on[ran])
    return ran


def test_buckets_are_powers_of_two_of_rows() -> None:
    assert [row_bucket(n) for n in (4, 7, 8, 15, 16, 128, 10**6)] == [3, 3, 4, 4, 5, 8, 12]


def test_narrow_steps_keep_the_process_count(restore_threads: int) -> None:
    threads = StepThreads(decode_threads=1, wide_threads=2, min_rows=4)
    for rows in ((1,), (1, 1, 1), (3,)):
        assert threads.threads_for(_step(*rows)) == 1
    assert threads.threads_for(_step(1, 1, 1, 1)) == 2  # four rows: wide, wide first
    assert threads.threads_for(_step(1, 3)) == 2  # a chunk beside a decode
    assert StepThreads(decode_threads=1, wide_threads=2).min_rows == 4


def test_a_bucket_measures_both_counts_then_runs_the_faster(restore_threads: int) -> None:
    threads = StepThreads(decode_threads=1, wide_threads=2, window=8, explore_every=16)
    ran = [_run(threads, _step(*[1] * 8), {1: 0.030, 2: 0.020}) for _ in range(64)]
    assert ran[:8] == [2, 1] * 4  # four on each, alternating, wide first
    # then wide (faster), but one step in sixteen of the bucket (the 16th, 32nd, ...) on one thread
    assert [i for i in range(8, 64) if ran[i] == 1] == [15, 31, 47, 63] and threads.preferred(8) == 2
    assert threads.num_wide_steps == ran.count(2)


def test_a_busy_host_where_two_threads_lose_turns_wide_steps_to_one(restore_threads: int) -> None:
    threads = StepThreads(decode_threads=1, wide_threads=2, window=8, explore_every=16)
    for _ in range(40):
        _run(threads, _step(*[1] * 8), {1: 0.030, 2: 0.020})
    assert threads.preferred(8) == 2
    for _ in range(16 * 8):  # the host slows two-thread steps down: explored steps see it
        _run(threads, _step(*[1] * 8), {1: 0.030, 2: 0.045})
    assert threads.preferred(8) == 1
    ran = [_run(threads, _step(*[1] * 8), {1: 0.030, 2: 0.045}) for _ in range(32)]
    assert ran.count(2) == 2  # explored only
    for _ in range(16 * 8):  # and back when the host is quiet again
        _run(threads, _step(*[1] * 8), {1: 0.030, 2: 0.020})
    assert threads.preferred(8) == 2


def test_a_choice_made_on_a_slow_start_is_undone_by_a_probe_within_a_few_steps(restore_threads: int) -> None:
    """A server's first steps are slow (page faults, a cold cache): if they chose one thread and
    two are faster now, the first explored step that shows it is followed by more, not by 15
    steps on the slower count each time."""
    threads = StepThreads(decode_threads=1, wide_threads=2, window=8, explore_every=16)
    for _ in range(8):  # the start: two threads look slow
        _run(threads, _step(*[1] * 8), {1: 0.041, 2: 0.065})
    assert threads.preferred(8) == 1
    ran = [_run(threads, _step(*[1] * 8), {1: 0.041, 2: 0.033}) for _ in range(32)]
    first = ran.index(2)  # the explore clock's first wide step
    assert ran[first : first + 5] == [2] * 5  # probed until the median flipped
    assert threads.preferred(8) == 2 and ran[first + 5 :].count(1) <= 1  # one explore at most since


def test_prompt_chunks_run_wide_from_the_first_and_explore_one_thread_on_the_clock(
    restore_threads: int,
) -> None:
    """Issue 58: a server's first 64+-row steps are the opening burst's prompt chunks, due within
    2 s; alternating put every second one on one thread (a 128-token chunk 164 ms there against
    103-108 ms on two). They run wide; one thread is measured on the explore clock, and a host
    where it is faster turns to it at the first explored step that shows it."""
    threads = StepThreads(decode_threads=1, wide_threads=2, window=8, explore_every=16)
    ran = [_run(threads, _step(128), {1: 0.164, 2: 0.105}) for _ in range(32)]
    assert [i for i, count in enumerate(ran) if count == 1] == [15, 31]  # the clock only
    assert threads.preferred(128) == 2
    busy = StepThreads(decode_threads=1, wide_threads=2, window=8, explore_every=16)
    ran = [_run(busy, _step(256), {1: 0.200, 2: 0.300}) for _ in range(24)]
    assert ran[:15] == [2] * 15 and ran[15:19] == [1] * 4  # explored at 15, probed until chosen
    assert busy.preferred(256) == 1 and ran[19:] == [1] * 5
    # decode-sized buckets still alternate at the start
    assert [_run(busy, _step(*[1] * 8), {1: 0.03, 2: 0.02}) for _ in range(4)] == [2, 1, 2, 1]


def test_an_explored_step_no_faster_than_the_choice_is_not_probed_again(restore_threads: int) -> None:
    threads = StepThreads(decode_threads=1, wide_threads=2, window=8, explore_every=16)
    ran = [_run(threads, _step(*[1] * 8), {1: 0.030, 2: 0.020}) for _ in range(64)]
    assert [i for i in range(8, 64) if ran[i] == 1] == [15, 31, 47, 63]  # the clock's steps only
    for _ in range(16):  # one thread now within the margin of two: explored, not probed
        ran.append(_run(threads, _step(*[1] * 8), {1: 0.0195, 2: 0.020}))
    assert ran[64:].count(1) == 1 and threads.preferred(8) == 2


def test_one_stalled_step_does_not_flip_the_choice(restore_threads: int) -> None:
    threads = StepThreads(decode_threads=1, wide_threads=2, window=8, explore_every=16)
    for _ in range(40):
        _run(threads, _step(*[1] * 8), {1: 0.030, 2: 0.020})
    _run(threads, _step(*[1] * 8), {1: 0.030, 2: 0.500})  # a 500 ms stall on two threads
    assert threads.preferred(8) == 2


def test_buckets_are_measured_apart(restore_threads: int) -> None:
    threads = StepThreads(decode_threads=1, wide_threads=2, window=4)
    for _ in range(20):
        _run(threads, _step(*[1] * 4), {1: 0.020, 2: 0.025})  # 4 rows: one thread faster
        _run(threads, _step(128), {1: 0.160, 2: 0.100})  # a 128-token chunk: two faster
    assert threads.preferred(4) == 1 and threads.preferred(128) == 2


@settings(max_examples=50, deadline=None)
@given(
    rows=st.lists(st.integers(1, 600), min_size=1, max_size=200),
    one=st.floats(0.001, 1.0),
    two=st.floats(0.001, 1.0),
)
def test_any_step_sequence_runs_each_wide_bucket_mostly_on_its_faster_count(
    rows: list[int], one: float, two: float
) -> None:
    """Whatever rows the steps have: narrow steps on the process count; in each wide bucket, past
    its first `window` steps, the slower count (wide within the switch margin) runs only on the
    explore clock; a bucket of prompt chunks (64+ rows) starts wide, without alternating."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        threads = StepThreads(decode_threads=1, wide_threads=2, window=4, explore_every=8)
        seen: dict[int, list[int]] = {}
        for n in rows:
            ran = _run(threads, _step(n), {1: one, 2: two})
            assert torch.get_num_threads() == ran
            if n < 4:
                assert ran == 1
            else:
                seen.setdefault(row_bucket(n), []).append(ran)
        faster = 1 if one < two * 0.95 else 2  # wide unless one thread is 5% faster
        for bucket, ran_in_bucket in seen.items():
            if bucket >= row_bucket(threads.wide_first_rows):
                # prompt chunks: wide first, the other count on the clock (the 8th step of the
                # bucket); a win there is probed once more, which measures it enough to choose it
                clock = [i % 8 == 7 for i in range(len(ran_in_bucket))]
                if faster == 2:
                    expected = [1 if on_clock else 2 for on_clock in clock]
                else:
                    expected = [
                        2 if i < 7 else 1 if i <= 8 else 2 if on_clock else 1
                        for i, on_clock in enumerate(clock)
                    ]
                assert ran_in_bucket == expected
                continue
            warm = ran_in_bucket[:4]
            assert warm == [2, 1, 2, 1][: len(warm)]
            later = ran_in_bucket[4:]
            assert later.count(3 - faster) == sum(1 for i in range(4, len(ran_in_bucket)) if i % 8 == 7)
    finally:
        torch.set_num_threads(before)


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
    with pytest.raises(ValueError, match="window and explore_every"):
        StepThreads(decode_threads=1, wide_threads=2, window=1)
    with pytest.raises(ValueError, match="switch_margin"):
        StepThreads(decode_threads=1, wide_threads=2, switch_margin=1.0)


def test_counts_within_the_margin_keep_the_choice(restore_threads: int) -> None:
    threads = StepThreads(decode_threads=1, wide_threads=2, window=4, explore_every=4)
    for _ in range(40):  # one thread 3% faster: within the 5% margin, wide stays
        _run(threads, _step(*[1] * 8), {1: 0.0350, 2: 0.0361})
    assert threads.preferred(8) == 2
    for _ in range(40):  # 10% faster: it takes over, and stays while two threads are within 5% of it
        _run(threads, _step(*[1] * 8), {1: 0.0325, 2: 0.0361})
    assert threads.preferred(8) == 1
    for _ in range(40):
        _run(threads, _step(*[1] * 8), {1: 0.0350, 2: 0.0340})
    assert threads.preferred(8) == 1


def test_a_change_of_choice_is_logged(restore_threads: int, caplog: pytest.LogCaptureFixture) -> None:
    threads = StepThreads(decode_threads=1, wide_threads=2, window=4, explore_every=4)
    with caplog.at_level("INFO", logger="weir.engine.runner.step_threads"):
        for _ in range(8):
            _run(threads, _step(*[1] * 8), {1: 0.030, 2: 0.020})
        for _ in range(16):
            _run(threads, _step(*[1] * 8), {1: 0.030, 2: 0.050})
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "steps of 8+ rows now run on 2 intra-op threads (median 20.0 ms on 2, 30.0 ms on 1)",
        "steps of 8+ rows now run on 1 intra-op threads (median 35.0 ms on 2, 30.0 ms on 1)",
    ]


def test_stats_report_only_buckets_measured_on_both_counts(restore_threads: int) -> None:
    threads = StepThreads(decode_threads=1, wide_threads=2, window=2)
    for _ in range(4):  # 8 rows: one step on each count measures it; two threads faster
        _run(threads, _step(*[1] * 8), {1: 0.03, 2: 0.02})
    _run(threads, _step(*[1] * 4), {1: 0.03, 2: 0.02})  # 4 rows: one step on two threads, not yet on one
    stats = threads.stats()
    assert (stats.decode_threads, stats.wide_threads, stats.choices) == (1, 2, ((8, 2),))
    assert stats.num_wide_steps == threads.num_wide_steps >= 3


def test_steps_within_the_kernels_reach_run_wide_on_the_kernel_pool(restore_threads: int) -> None:
    """Within `kernel_rows` a wide step keeps torch on the decode count and gives the C kernels
    the wide count on their work pool; past it, or narrow, the kernels follow torch again."""
    from weir.kernels import cpu_work_pool

    threads = StepThreads(decode_threads=1, wide_threads=2, min_rows=4, kernel_rows=8)
    try:
        seen = []
        for rows in ((1, 1, 1, 1), (1,) * 8, (1, 1), (1, 15), (1,) * 8):
            out = _step(*rows)
            want = threads.threads_for(out)
            threads.apply(out)
            seen.append((want, torch.get_num_threads(), cpu_work_pool.pool_threads(), threads.step_count))
        assert seen == [
            (2, 1, 2, 2),  # 4 rows, wide: torch on 1, the kernels on 2 of the pool
            (2, 1, 2, 2),  # 8 rows: the kernels' reach
            (1, 1, 0, 1),  # narrow: one thread, the kernels follow torch
            (2, 2, 0, 2),  # 16 rows: past the kernels (oneDNN's linears): torch on 2
            (2, 1, 2, 2),  # 8 rows again: back on the pool
        ]
    finally:
        cpu_work_pool.set_pool_threads(0)
    with pytest.raises(ValueError, match="kernel_rows"):
        StepThreads(decode_threads=1, wide_threads=2, kernel_rows=-1)


@pytest.mark.parametrize("pool", [True, False])
def test_an_engine_gives_its_step_threads_the_row_kernels_reach(
    tmp_path: Path, pool: bool, restore_threads: int
) -> None:
    from weir.kernels import cpu_small_gemm

    if not cpu_small_gemm.available():
        pytest.skip("no C compiler here")
    path = make_tiny_model(tmp_path / "model", "llama", num_kv_heads=2)
    config = EngineConfig(
        model_path=str(path),
        dtype="float32",
        device="cpu",
        cache=CacheConfig(block_size=16, num_blocks=16, enable_prefix_caching=False),
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=128),
        cpu_packed_linear=True,
        cpu_row_weights=True,
        cpu_wide_step_threads=2,
        cpu_kernel_pool=pool,
    )
    engine = build_engine(config)
    assert engine.runner.threads is not None
    expected = engine.runner.model.packed_head.row_inputs if pool else 0
    assert engine.runner.threads.kernel_rows == expected and (expected > 0) == pool
