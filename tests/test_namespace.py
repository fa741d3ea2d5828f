"""One import namespace: Weir claims `weir` and `weir_bench` and no generic top-level name, so
Hugging Face's `kernels` (which transformers imports whenever it is installed) is not shadowed."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OLD_NAMES = {"engine", "gateway", "kernels", "tenancy", "migrations", "bench"}
FOLDERS = ("weir", "engine", "gateway", "kernels", "tenancy", "migrations", "bench", "tests")


def test_no_module_imports_an_old_top_level_name() -> None:
    offenders = []
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                else:
                    continue
                offenders += [
                    f"{path.relative_to(ROOT)}:{node.lineno} {n}"
                    for n in names
                    if n.split(".")[0] in OLD_NAMES
                ]
    assert offenders == []


def test_weir_packages_import_from_their_folders() -> None:
    import weir.engine.request
    import weir.gateway.http.errors
    import weir.kernels.reference
    import weir.tenancy.errors

    assert Path(weir.engine.request.__file__).resolve() == ROOT / "engine" / "request.py"
    assert Path(weir.gateway.http.errors.__file__).resolve() == ROOT / "gateway" / "http" / "errors.py"
    assert Path(weir.kernels.reference.__file__).resolve() == ROOT / "kernels" / "reference.py"
    assert Path(weir.tenancy.errors.__file__).resolve() == ROOT / "tenancy" / "errors.py"


def test_a_top_level_kernels_package_beside_weir_is_not_shadowed(tmp_path: Path) -> None:
    # A stand-in for Hugging Face's `kernels` (the real one pulls a hub client and CUDA wheels):
    # a top-level package of that name, imported in the same interpreter as Weir's kernels.
    fake = tmp_path / "site" / "kernels"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("HUB = 'not-weir'\n")
    script = textwrap.dedent(
        """
        import kernels
        import weir.kernels.reference

        print("FOUND", kernels.HUB, kernels.__file__, weir.kernels.reference.__name__)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,  # not the checkout: the repository's folders are not on sys.path
        env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    found = [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("FOUND ")]
    assert len(found) == 1, out.stdout
    hub, where, weir_kernels = found[0]
    assert hub == "not-weir"
    assert Path(where).parent == fake
    assert weir_kernels == "weir.kernels.reference"


def test_hugging_face_kernels_and_transformers_import_beside_weir(tmp_path: Path) -> None:
    # transformers >= 5.25 requires Hugging Face's `kernels` and imports it; Weir's kernels/ once
    # shadowed it (the old `transformers<5.25` pin). Skipped where that package is not installed.
    try:
        version("kernels")
    except PackageNotFoundError:
        pytest.skip("Hugging Face's kernels is not installed (transformers < 5.25)")
    script = textwrap.dedent(
        """
        import kernels
        import transformers
        from transformers import AutoConfig, LlamaConfig
        import weir.kernels.reference

        print("FOUND", kernels.__file__, weir.kernels.reference.__file__, AutoConfig.__name__)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    found = [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("FOUND ")]
    assert len(found) == 1, out.stdout
    hub, ours, _ = found[0]
    # the installed package (the venv may live inside the checkout, as `make` puts it)
    assert Path(hub).resolve().parent != ROOT / "kernels" and "site-packages" in Path(hub).parts
    assert Path(ours).resolve() == ROOT / "kernels" / "reference.py"


def test_the_tests_keep_the_repository_root_last_on_sys_path() -> None:
    # pytest puts the root on sys.path; tests/__init__.py moves it behind the installed packages
    root_entries = [i for i, p in enumerate(sys.path) if Path(p or ".").resolve() == ROOT]
    installed = [i for i, p in enumerate(sys.path) if "site-packages" in Path(p or ".").parts]
    assert len(root_entries) == 1 and installed  # (tests may append their own folders after it)
    assert root_entries[0] > max(installed)
