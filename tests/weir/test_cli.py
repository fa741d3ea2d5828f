"""The `weir` command line: subcommands present, settings errors in one line, delegation."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from weir import cli


def test_subcommands() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    names = set(sub.choices)  # type: ignore[arg-type]
    assert {"serve", "model"} <= names
    # Present in this checkout: the engine's generate, tenancy's db/admin, bench.
    assert {"generate", "db", "admin", "bench"} <= names


def test_serve_flags_parse() -> None:
    args = cli.build_parser().parse_args(
        ["serve", "--host", "0.0.0.0", "--port", "9000", "--data-dir", "/d", "--model", "/m", "--dtype", "float32",
         "--kv-cache-tokens", "2048", "--otel-exporter", "console", "--auth", "keys"]
    )  # fmt: skip
    assert (args.host, args.port, args.data_dir, args.model_path, args.kv_cache_tokens) == (
        "0.0.0.0", 9000, Path("/d"), Path("/m"), 2048,
    )  # fmt: skip


def test_invalid_settings_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", "--port", "70000"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("weir: ") and "port" in err and "Traceback" not in err


def test_model_prepare_uses_the_cache_dir(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import weir.engine.runner.model_prepare

    seen = {}

    def fake_ensure(cache_dir: Path, progress: bool = True) -> Path:
        seen["cache_dir"], seen["progress"] = cache_dir, progress
        return cache_dir / "models" / "x"

    monkeypatch.setattr(weir.engine.runner.model_prepare, "ensure_default_model", fake_ensure)
    assert cli.main(["model", "prepare", "--cache-dir", "/c", "--quiet"]) == 0
    assert seen == {"cache_dir": Path("/c"), "progress": False}
    assert capsys.readouterr().out.strip() == "/c/models/x"


def test_generate_gets_the_resolved_model_path(monkeypatch: pytest.MonkeyPatch) -> None:
    import weir.generate_cli

    calls = []
    monkeypatch.setattr(weir.generate_cli, "run", lambda args, model_path: calls.append(model_path) or 0)
    assert cli.main(["generate", "--prompt", "hi", "--model", "/models/tiny"]) == 0
    assert calls == ["/models/tiny"]


def test_every_package_adds_its_subcommands() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"serve", "model", "generate", "bench", "db", "admin"} <= set(sub.choices)
    bench = next(a for a in sub.choices["bench"]._actions if isinstance(a, argparse._SubParsersAction))
    assert {"serve", "offline", "overhead", "compare", "gen"} <= set(bench.choices)


def test_the_cli_imports_bench_only_for_a_bench_command() -> None:
    # bench/ is its own distribution (weir-bench); `weir serve` must start without it or matplotlib.
    code = (
        "import sys, weir.cli as c; c.build_parser(with_bench=False);"
        "print(sorted({'bench', 'matplotlib'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_non_bench_command_parses_without_bench() -> None:
    parser = cli.build_parser(with_bench=False)
    args = parser.parse_args(["model", "prepare", "--quiet"])
    assert args.command == "model" and args.quiet


def test_sigterm_handlers_are_restored_after_serving() -> None:
    from weir.gateway.server.uvicorn_runner import _signals_end_quietly

    before = signal.getsignal(signal.SIGTERM)
    with _signals_end_quietly():
        signal.raise_signal(signal.SIGTERM)  # absorbed, as uvicorn's re-raise would be
    assert signal.getsignal(signal.SIGTERM) is before
