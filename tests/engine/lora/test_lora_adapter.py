"""Hostile adapters are refused at load with a clear error: a path outside the adapter directory
(also through a symlink), wrong shapes, another base model, a rank over the maximum, NaN or Inf
weights, tensors that are not LoRA factors of the seven projections, unsupported PEFT options.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.engine.lora_adapters import make_adapter
from tests.engine.tiny_models import make_tiny_model
from weir.engine.config import ModelConfig
from weir.engine.lora.lora_adapter import CONFIG_FILE, WEIGHTS_FILE, load_adapter
from weir.engine.lora.lora_types import AdapterLoadError
from weir.engine.runner.loader import load_model_config


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("base"), arch="llama", num_kv_heads=2)


@pytest.fixture(scope="module")
def good(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(base, tmp_path_factory.mktemp("good") / "adapter", rank=8)


@pytest.fixture()
def adapter_dir(tmp_path: Path, good: Path) -> Path:
    root = tmp_path / "adapters"
    shutil.copytree(good, root / "x")
    return root


def _config(base: Path) -> ModelConfig:
    return load_model_config(base)


def _load(adapter_dir: Path, base: Path, path: str = "x", max_rank: int = 16) -> object:
    return load_adapter("x", path, adapter_dir, _config(base), max_rank, frozenset({str(base), base.name}))


def _edit_weights(folder: Path, edit) -> None:  # type: ignore[no-untyped-def]
    tensors = load_file(str(folder / WEIGHTS_FILE))
    edit(tensors)
    save_file(tensors, str(folder / WEIGHTS_FILE))


def _edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / CONFIG_FILE).read_text())
    config.update(changes)
    (folder / CONFIG_FILE).write_text(json.dumps(config))


def _first(tensors: dict[str, torch.Tensor], part: str) -> str:
    return sorted(k for k in tensors if part in k)[0]


def test_a_good_adapter_loads(adapter_dir: Path, base: Path) -> None:
    adapter = load_adapter("x", "x", adapter_dir, _config(base), 16, frozenset({base.name}))
    assert adapter.rank == 8 and adapter.scaling == 2.0
    assert len(adapter.target_modules) == 7 and len(adapter.weights) == 2 * 7
    assert len(adapter.fingerprint) == 32


def test_paths_outside_the_adapter_directory_are_refused(adapter_dir: Path, base: Path, good: Path) -> None:
    with pytest.raises(AdapterLoadError, match="outside the adapter directory"):
        _load(adapter_dir, base, str(good))
    with pytest.raises(AdapterLoadError, match="outside the adapter directory"):
        _load(adapter_dir, base, "../../" + str(good))
    (adapter_dir / "link").symlink_to(good, target_is_directory=True)
    with pytest.raises(AdapterLoadError, match="outside the adapter directory"):
        _load(adapter_dir, base, "link")
    inner = adapter_dir / "half"
    inner.mkdir()
    shutil.copy(good / CONFIG_FILE, inner / CONFIG_FILE)
    (inner / WEIGHTS_FILE).symlink_to(good / WEIGHTS_FILE)
    with pytest.raises(AdapterLoadError, match="links outside"):
        _load(adapter_dir, base, "half")
    with pytest.raises(AdapterLoadError, match="no adapter directory"):
        load_adapter("x", "x", None, _config(base), 16)
    with pytest.raises(AdapterLoadError, match="not a folder"):
        _load(adapter_dir, base, "missing")


def test_a_rank_over_the_maximum_is_refused(adapter_dir: Path, base: Path) -> None:
    with pytest.raises(AdapterLoadError, match="rank 8 is over the configured maximum 4"):
        _load(adapter_dir, base, max_rank=4)


def test_wrong_shapes_are_refused(adapter_dir: Path, base: Path) -> None:
    def widen(t: dict[str, torch.Tensor]) -> None:
        key = _first(t, "q_proj.lora_A")
        t[key] = torch.zeros(t[key].shape[0], t[key].shape[1] + 1)

    _edit_weights(adapter_dir / "x", widen)
    with pytest.raises(AdapterLoadError, match=r"layer 0 q_proj: lora_A \(8, 65\)"):
        _load(adapter_dir, base)


def test_another_base_model_is_refused(adapter_dir: Path, base: Path, tmp_path: Path) -> None:
    _edit_config(adapter_dir / "x", base_model_name_or_path="meta-llama/Llama-3.1-8B")
    with pytest.raises(AdapterLoadError, match="trained for base model 'meta-llama/Llama-3.1-8B'"):
        _load(adapter_dir, base)
    # One with the same name but other shapes (a wider model) fails on its shapes.
    wide = make_tiny_model(tmp_path / "wide", arch="llama", hidden_size=96, num_heads=4)
    shutil.copytree(make_adapter(wide, tmp_path / "wide-adapter"), adapter_dir / "wide")
    _edit_config(adapter_dir / "wide", base_model_name_or_path=str(base))
    with pytest.raises(AdapterLoadError, match="the base model and rank"):
        _load(adapter_dir, base, "wide")
    # And one for a model with more layers names a layer this base lacks.
    deep = make_tiny_model(tmp_path / "deep", arch="llama", num_kv_heads=2, num_layers=3)
    shutil.copytree(make_adapter(deep, tmp_path / "deep-adapter"), adapter_dir / "deep")
    _edit_config(adapter_dir / "deep", base_model_name_or_path=str(base))
    with pytest.raises(AdapterLoadError, match="base model has 2 layers"):
        _load(adapter_dir, base, "deep")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_refused(adapter_dir: Path, base: Path, bad: float) -> None:
    def poison(t: dict[str, torch.Tensor]) -> None:
        key = _first(t, "down_proj.lora_B")
        t[key] = t[key].clone()
        t[key][3, 1] = bad

    _edit_weights(adapter_dir / "x", poison)
    with pytest.raises(AdapterLoadError, match="down_proj: LoRA weights contain NaN or Inf"):
        _load(adapter_dir, base)


def test_tensors_that_are_not_lora_factors_are_refused(adapter_dir: Path, base: Path) -> None:
    _edit_weights(
        adapter_dir / "x", lambda t: t.update({"base_model.model.lm_head.weight": torch.zeros(2, 2)})
    )
    with pytest.raises(AdapterLoadError, match="unexpected tensor 'base_model.model.lm_head.weight'"):
        _load(adapter_dir, base)


def test_a_factor_without_its_pair_is_refused(adapter_dir: Path, base: Path) -> None:
    _edit_weights(adapter_dir / "x", lambda t: t.pop(_first(t, "o_proj.lora_B")))
    with pytest.raises(AdapterLoadError, match="o_proj has lora_A without its pair"):
        _load(adapter_dir, base)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(use_dora=True), "DoRA"),
        (dict(rank_pattern={"q_proj": 4}), "rank_pattern"),
        (dict(modules_to_save=["lm_head"]), "modules_to_save"),
        (dict(bias="all"), "bias"),
        (dict(r=0), "rank r must be an integer"),
        (dict(r="8"), "rank r must be an integer"),
        (dict(lora_alpha=float("nan")), "lora_alpha"),
        (dict(peft_type="IA3"), "not LORA"),
        (dict(target_modules=["q_proj", "embed_tokens"]), "embed_tokens"),
    ],
)
def test_unsupported_configs_are_refused(
    adapter_dir: Path, base: Path, changes: dict[str, object], message: str
) -> None:
    _edit_config(adapter_dir / "x", **changes)
    with pytest.raises(AdapterLoadError, match=message):
        _load(adapter_dir, base)


def test_garbage_files_are_refused(adapter_dir: Path, base: Path) -> None:
    (adapter_dir / "x" / WEIGHTS_FILE).write_bytes(b"\x00" * 64)
    with pytest.raises(AdapterLoadError, match="not a valid safetensors file"):
        _load(adapter_dir, base)
    (adapter_dir / "x" / CONFIG_FILE).write_text("{not json")
    with pytest.raises(AdapterLoadError, match="not valid JSON"):
        _load(adapter_dir, base)
