"""Intra-op threads per step on the CPU: every core for the steps that are mostly prefill.

A decode step streams the weights once for a few rows: it is bound by memory, a second thread
gains little, and two threads on a 2-core machine wait at each of its ~600 small ops' barriers
whenever the event loop, a tokenizer thread or the client takes a core (docs/benchmarks.md:
the flood experiment's ITL p99 53.7 ms on two threads against 30.5 ms on one). A prefill chunk
is matrix-matrix work bound by multiply-adds, made of few large ops: a second core nearly halves
it (SmolLM2 fp32, engine alone, this 2-core host: a 128-token prompt 164 ms on one thread, 103-108
ms on two; 32 tokens 55 against 36 ms).

So the runner sets torch's intra-op threads before each step: `prefill_threads` when the step
feeds at least `min_prefill_tokens` prompt tokens, else `decode_threads` (what `weir serve` set
for the process). Setting the count is a store (0.1 µs); nothing else changes between steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.output import SchedulerOutput


@dataclass
class StepThreads:
    """Chooses each step's intra-op thread count by how much prefill it feeds."""

    decode_threads: int
    prefill_threads: int
    min_prefill_tokens: int = 32
    current: int = field(init=False, default=0)
    num_prefill_steps: int = field(init=False, default=0)  # steps run on more threads than decodes

    def __post_init__(self) -> None:
        if self.decode_threads < 1 or self.prefill_threads < 1:
            raise ValueError(f"thread counts must be >= 1, got {self.decode_threads}, {self.prefill_threads}")
        if self.min_prefill_tokens < 1:
            raise ValueError(f"min_prefill_tokens must be >= 1, got {self.min_prefill_tokens}")
        self.current = torch.get_num_threads()

    def threads_for(self, out: SchedulerOutput) -> int:
        """The intra-op threads the step `out` runs with."""
        prefill = out.num_tokens - out.num_decodes
        return self.prefill_threads if prefill >= self.min_prefill_tokens else self.decode_threads

    def apply(self, out: SchedulerOutput) -> None:
        """Set torch's intra-op threads for the step `out` (only when the count changes)."""
        want = self.threads_for(out)
        self.num_prefill_steps += want != self.decode_threads
        if want != self.current:
            torch.set_num_threads(want)
            self.current = want
