"""Random mixed steps for the kernel tests: the same builder weir_bench.gpu_check uses on a GPU."""

from __future__ import annotations

from weir_bench.kernel_check import Step, random_step

__all__ = ["Step", "random_step"]
