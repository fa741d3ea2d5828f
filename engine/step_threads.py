"""Intra-op threads per step on the CPU: every core for wide steps, the process's count else.

A step's rows are the tokens it feeds: one per decoding sequence, one per prompt token of a
chunk. A narrow step (one or two rows) is a string of matrix-vector products bound by memory: a
second thread gains nothing there (SmolLM2 fp32 at batch 1: 20.3 ms on one thread, 21.4 ms on
two), and two threads on a 2-core machine wait at each of its ~600 small ops' barriers whenever
the event loop, a tokenizer thread or the client takes a core (docs/benchmarks.md: the flood
experiment's ITL p99 53.7 ms on two threads against 30.5 ms on one). From a few rows on, the
linears reuse each weight they read across the rows, the multiply-adds take over and a second
core pays (engine alone, this 2-core host: 4 decode rows 30.2 → 22.7 ms, 8 rows 31.6 → 24.3 ms,
16 rows 48.6 → 29.7 ms; a 128-token prompt 164 → 103-108 ms).

So the runner sets torch's intra-op threads before each step: `wide_threads` when the step feeds
at least `min_rows` rows, else `decode_threads` (what `weir serve` set for the process). Setting
the count is a store (0.1 µs); nothing else changes between steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.output import SchedulerOutput


@dataclass
class StepThreads:
    """Chooses each step's intra-op thread count by how many rows it feeds."""

    decode_threads: int
    wide_threads: int
    min_rows: int = 4
    current: int = field(init=False, default=0)
    num_wide_steps: int = field(init=False, default=0)  # steps run on `wide_threads`

    def __post_init__(self) -> None:
        if self.decode_threads < 1 or self.wide_threads < 1:
            raise ValueError(f"thread counts must be >= 1, got {self.decode_threads}, {self.wide_threads}")
        if self.min_rows < 1:
            raise ValueError(f"min_rows must be >= 1, got {self.min_rows}")
        self.current = torch.get_num_threads()

    def threads_for(self, out: SchedulerOutput) -> int:
        """The intra-op threads the step `out` runs with."""
        return self.wide_threads if out.num_tokens >= self.min_rows else self.decode_threads

    def apply(self, out: SchedulerOutput) -> None:
        """Set torch's intra-op threads for the step `out` (only when the count changes)."""
        want = self.threads_for(out)
        self.num_wide_steps += want != self.decode_threads
        if want != self.current:
            torch.set_num_threads(want)
            self.current = want
