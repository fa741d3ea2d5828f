"""Intra-op threads per step on the CPU: more threads for wide steps while they are measured faster.

A step's rows are the tokens it feeds: one per decoding sequence, one per prompt token of a
chunk. A narrow step (fewer than `min_rows`) is a string of matrix-vector products bound by
memory: a second thread gains nothing there (SmolLM2 fp32 at batch 1: 20.3 ms on one thread,
21.4 ms on two), and two threads on a 2-core machine wait at each of its ~600 small ops' barriers
whenever the event loop, a tokenizer thread or the client takes a core (docs/benchmarks.md: the
flood experiment's ITL p99 53.7 ms on two threads against 30.5 ms on one). Narrow steps always
run on `decode_threads`, what `weir serve` set for the process.

From a few rows on, the linears reuse each weight they read across the rows and a second core
usually pays (engine alone, a 2-core host: 4 decode rows 30.2 → 22.7 ms, 8 rows 31.6 → 24.3 ms,
16 rows 48.6 → 29.7 ms; a 128-token prompt 164 → 103-108 ms). Usually: on a host whose cores are
shared with other machines, or beside a busy front end, the same steps were measured slower on
two threads than on one (docs/benchmarks.md). So a wide step's count is measured, not assumed:
per bucket of rows (4-7, 8-15, 16-31, ...), the last `window` step times on each count; the
count with the lower median runs, and one wide step in `explore_every` of the bucket runs on the
other, so that a change of the host's load is seen within seconds. An explored step that beats the
chosen count's median by `switch_margin` is followed by another on the same count (a probe), until
one is not or the choice flips: without it, a choice made on stale times (a server's first
seconds, page faults and all) took ~130 steps to undo, 7 s of 8-row steps at 41 ms instead of 33
in one guidellm run. A bucket of fewer than `wide_first_rows` rows first runs each count `window // 2` times,
alternating, wide first, so that a slow start weighs on both. A bucket of more (prompt chunks)
runs wide for its first `window // 2` steps and measures the other count on the explore clock
only: there a step on one thread costs hundreds of milliseconds more (a 128-token chunk 164
against 103-108 ms), and a server's first such steps are the opening burst of prompts whose
first tokens are due within the interactive class's 2 s, where alternating put half of the
burst's chunks on one thread (issue 58). An explored step that wins is probed as above, so a
host where one thread is faster still turns to it within a few of those steps. The median keeps one stalled step from flipping the choice,
and the other count must be `switch_margin` faster to take over, so that two counts within noise
of each other (seen in serving: 8-row steps 35.5 against 36.2 ms) do not flip it step after step.

The runner calls `apply` before each step and `observe` after it with the step's time (a step
that raised is not timed). Setting the count is a store (0.1 µs).
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from dataclasses import dataclass, field

import torch

from weir.engine.config import WIDE_STEP_ROWS
from weir.engine.engine_stats import StepThreadsStats
from weir.engine.output import SchedulerOutput
from weir.kernels import cpu_work_pool

logger = logging.getLogger(__name__)

MAX_BUCKET = 12  # rows >= 2**11 share one bucket


def row_bucket(rows: int) -> int:
    """The bucket of a step of `rows` rows: 4-7 -> 3, 8-15 -> 4, ... (powers of two)."""
    return min(rows.bit_length(), MAX_BUCKET)


@dataclass
class _Bucket:
    """The recent step times of one bucket of rows, on each thread count, and its explore clock."""

    min_rows: int  # the least rows of a step in this bucket (4, 8, 16, ...)
    times: dict[int, deque[float]]
    num_steps: int = 0
    choice: int = 0  # the count chosen once both were measured (0: not yet)
    probing: bool = False  # the last explored step beat the choice: the next one explores too


@dataclass
class StepThreads:
    """Chooses each step's intra-op thread count: the process's for narrow steps, the measured
    faster of it and `wide_threads` for wide ones."""

    decode_threads: int
    wide_threads: int
    min_rows: int = WIDE_STEP_ROWS
    window: int = 8  # step times kept per bucket and count
    explore_every: int = 16  # one wide step in this many (per bucket) runs on the count not chosen
    switch_margin: float = 0.05  # the other count must be this much faster (median) to take over
    # Buckets of at least this many rows run wide first and explore the other count on the clock
    # only, instead of alternating at the start (prompt chunks: costly to run on the slower count).
    wide_first_rows: int = 64
    # Steps of at most this many rows have all their parallel work in the C kernels (the row
    # weights' reach; 0: none): run on more than `decode_threads`, torch stays on `decode_threads`
    # and the kernels take the count on their work pool (kernels/cpu_work_pool.py), so that no
    # OpenMP team waits at a barrier for a thread that lost its core, or spins on the front end's.
    kernel_rows: int = 0
    current: int = field(init=False, default=0)  # torch's intra-op count set
    step_count: int = field(init=False, default=0)  # the count the step applied last runs on
    num_wide_steps: int = field(init=False, default=0)  # steps run on `wide_threads`
    _buckets: dict[int, _Bucket] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.decode_threads < 1 or self.wide_threads < 1:
            raise ValueError(f"thread counts must be >= 1, got {self.decode_threads}, {self.wide_threads}")
        if self.min_rows < 1:
            raise ValueError(f"min_rows must be >= 1, got {self.min_rows}")
        if self.kernel_rows < 0:
            raise ValueError(f"kernel_rows must be >= 0, got {self.kernel_rows}")
        if not 0 <= self.switch_margin < 1:
            raise ValueError(f"switch_margin must be in [0, 1), got {self.switch_margin}")
        if self.wide_first_rows < 1:
            raise ValueError(f"wide_first_rows must be >= 1, got {self.wide_first_rows}")
        if self.window < 2 or self.explore_every < 2:
            raise ValueError(
                f"window and explore_every must be >= 2, got {self.window}, {self.explore_every}"
            )
        self.current = self.step_count = torch.get_num_threads()

    def _bucket(self, rows: int) -> _Bucket:
        key = row_bucket(rows)
        bucket = self._buckets.get(key)
        if bucket is None:
            counts = (self.wide_threads, self.decode_threads)
            times = {c: deque[float](maxlen=self.window) for c in counts}
            bucket = self._buckets[key] = _Bucket(1 << (key - 1), times)
        return bucket

    def preferred(self, rows: int) -> int:
        """The count a wide step of `rows` rows runs on when it does not explore: the one chosen,
        wide until both were measured."""
        return self._chosen(self._bucket(rows))

    def _chosen(self, bucket: _Bucket) -> int:
        return bucket.choice or self.wide_threads

    def _choose(self, bucket: _Bucket) -> int:
        """The count with the lower median time; the one chosen so far unless the other is
        `switch_margin` faster (noise between two close counts does not flip it each step)."""
        medians = {count: statistics.median(times) for count, times in bucket.times.items()}
        current = self._chosen(bucket)
        other = self._other(current)
        return other if medians[other] < medians[current] * (1 - self.switch_margin) else current

    def threads_for(self, out: SchedulerOutput) -> int:
        """The intra-op threads the step `out` runs with (given what was measured so far)."""
        rows = out.num_tokens
        if rows < self.min_rows:
            return self.decode_threads
        bucket = self._bucket(rows)
        wide, narrow = (len(bucket.times[c]) for c in (self.wide_threads, self.decode_threads))
        half = self.window // 2
        if self._wide_first(bucket):
            if wide < half:
                return self.wide_threads  # measured wide first; the other count on the clock
        elif min(wide, narrow) < half:  # each count measured a few times, alternating
            return self.wide_threads if wide <= narrow else self.decode_threads
        best = self._chosen(bucket)
        if bucket.probing or bucket.num_steps % self.explore_every == self.explore_every - 1:
            return self._other(best)
        return best

    def _wide_first(self, bucket: _Bucket) -> bool:
        return bucket.min_rows >= self.wide_first_rows and self.wide_threads != self.decode_threads

    def _other(self, count: int) -> int:
        return self.decode_threads if count == self.wide_threads else self.wide_threads

    def apply(self, out: SchedulerOutput) -> None:
        """Set the threads of the step `out`: torch's intra-op count, and the C kernels' pool count
        for a step within `kernel_rows` run on more than `decode_threads` (each only when it
        changes)."""
        want = self.threads_for(out)
        if out.num_tokens >= self.min_rows:
            self._bucket(out.num_tokens).num_steps += 1
        self.num_wide_steps += want == self.wide_threads
        self.step_count = want
        torch_threads, pool = want, 0
        if want > self.decode_threads and out.num_tokens <= self.kernel_rows:
            torch_threads, pool = self.decode_threads, want
        if torch_threads != self.current:
            torch.set_num_threads(torch_threads)
            self.current = torch_threads
        if pool != cpu_work_pool.pool_threads():  # per thread: the stepping thread's own
            cpu_work_pool.set_pool_threads(pool)

    def stats(self) -> StepThreadsStats:
        """The counts, the steps run wide, and the choice of every bucket measured on both."""
        choices = tuple(sorted((b.min_rows, b.choice) for b in self._buckets.values() if b.choice))
        return StepThreadsStats(self.decode_threads, self.wide_threads, self.num_wide_steps, choices)

    def observe(self, out: SchedulerOutput, seconds: float) -> None:
        """Record that the step `out`, run on the count applied last, took `seconds`."""
        rows = out.num_tokens
        if rows < self.min_rows:
            return
        bucket = self._bucket(rows)
        current = self._chosen(bucket)  # wide until a choice: a wide-first bucket explores against it
        chosen = bucket.times[current] if bucket.choice or self._wide_first(bucket) else None
        if chosen and self.step_count != current:  # an explored step: is it worth another?
            bucket.probing = seconds < statistics.median(chosen) * (1 - self.switch_margin)
        bucket.times[self.step_count].append(seconds)
        if all(len(t) >= self.window // 2 for t in bucket.times.values()):
            best = self._choose(bucket)
            if best != bucket.choice:
                bucket.choice = best
                bucket.probing = False
                logger.info(
                    "steps of %d+ rows now run on %d intra-op threads (median %s ms on %d, %s ms on %d)",
                    bucket.min_rows,
                    best,
                    _median_ms(bucket.times[self.wide_threads]),
                    self.wide_threads,
                    _median_ms(bucket.times[self.decode_threads]),
                    self.decode_threads,
                )


def _median_ms(times: deque[float]) -> str:
    return f"{statistics.median(times) * 1e3:.1f}"
