"""Where the Triton kernel tests run: CUDA if present (compiled), else the CPU under Triton's
interpreter.

Triton decides between compiling and interpreting when a `@triton.jit` function is defined,
i.e. when a kernel module is first imported, by reading TRITON_INTERPRET. The root
tests/conftest.py sets it, without CUDA, before any test module is imported, so the collection
order never matters. Product code never sets this variable.
"""

from __future__ import annotations

import os

import torch


def kernel_device() -> torch.device:
    """The device the kernel tests run on: CUDA if present (compiled), else CPU (interpreted)."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "TRITON_INTERPRET is not 1 without CUDA: tests/conftest.py sets it, was it bypassed?"
        )
    return torch.device("cpu")


def interpreted() -> bool:
    """Whether kernels run under the interpreter (no bfloat16 tl.dot there)."""
    return not torch.cuda.is_available()


def bf16_slack(dtype: torch.dtype) -> float:
    """Relative error a bfloat16 result may carry beyond the GPU's: the interpreter truncates
    float32 -> bfloat16 where the GPU rounds to nearest even, one ulp (2^-7) per rounding."""
    return 2.0**-6 if interpreted() and dtype == torch.bfloat16 else 0.0
