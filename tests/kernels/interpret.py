"""Run the Triton kernels under the CPU interpreter when there is no CUDA device.

Triton decides between compiling and interpreting when a `@triton.jit` function is defined,
i.e. when a `kernels.*` module is first imported, by reading TRITON_INTERPRET. So every test
module that imports a kernel calls `kernel_device()` first (tests/kernels does it in its
conftest). Product code never sets this variable.
"""

from __future__ import annotations

import os
import sys

import torch

_KERNEL_MODULES = (
    "weir.kernels.lora_bgmv",
    "weir.kernels.paged_attention",
    "weir.kernels.reshape_and_cache",
    "weir.kernels.rms_norm",
    "weir.kernels.rotary",
    "weir.kernels.silu_mul",
)


def kernel_device() -> torch.device:
    """The device the kernel tests run on: CUDA if present (compiled), else CPU (interpreted)."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") != "1":
        loaded = [name for name in _KERNEL_MODULES if name in sys.modules]
        if loaded:
            raise RuntimeError(
                f"{loaded} were imported before TRITON_INTERPRET=1 was set: call kernel_device() first"
            )
        os.environ["TRITON_INTERPRET"] = "1"
    return torch.device("cpu")


def interpreted() -> bool:
    """Whether kernels run under the interpreter (no bfloat16 tl.dot there)."""
    return not torch.cuda.is_available()


def bf16_slack(dtype: torch.dtype) -> float:
    """Relative error a bfloat16 result may carry beyond the GPU's: the interpreter truncates
    float32 -> bfloat16 where the GPU rounds to nearest even, one ulp (2^-7) per rounding."""
    return 2.0**-6 if interpreted() and dtype == torch.bfloat16 else 0.0
