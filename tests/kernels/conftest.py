"""Kernel tests: compiled on CUDA, interpreted on CPU (TRITON_INTERPRET=1 set before any import)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.interpret import kernel_device

DEVICE = kernel_device()  # at import: before the test modules import kernels.*


@pytest.fixture
def device() -> torch.device:
    return DEVICE
