"""Argument checks shared by the kernel wrappers.

A Triton kernel reads raw pointers: a wrong shape, a missing unit stride or a tensor on the
wrong device does not fail, it reads garbage or writes out of bounds. Every wrapper therefore
checks its arguments first and raises ValueError naming the offending argument.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_tensor(
    name: str,
    tensor: object,
    *,
    ndim: int,
    dtypes: Sequence[torch.dtype],
    device: torch.device | None = None,
    unit_last_stride: bool = True,
) -> torch.Tensor:
    """Validate rank, dtype, device and (optionally) a unit stride in the last dimension."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(tensor.shape)}")
    if tensor.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name} must have dtype in ({allowed}), got {tensor.dtype}")
    if device is not None and tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device}, expected {device}")
    if unit_last_stride and tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        raise ValueError(f"{name} must have stride 1 in its last dimension, got strides {tensor.stride()}")
    return tensor


def check_dim(name: str, tensor: torch.Tensor, dim: int, expected: int, what: str) -> None:
    """Require `tensor.shape[dim] == expected`; `what` says where the expected size comes from."""
    if tensor.shape[dim] != expected:
        raise ValueError(
            f"{name} has size {tensor.shape[dim]} in dimension {dim}, expected {expected} ({what}); "
            f"shape {tuple(tensor.shape)}"
        )


def check_contiguous(name: str, tensor: torch.Tensor) -> None:
    """Require a contiguous tensor (index tensors read with a flat offset)."""
    if not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {tensor.stride()}")


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (tl.arange needs power-of-two extents)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
