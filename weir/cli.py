"""The `weir` console script: serve, model prepare, generate, db, admin, bench.

The composition root of the command line: each package adds its own subcommands
(weir.generate_cli, weir.migrations.cli with weir.tenancy.cli.cli, weir_bench.cli). The benchmarks are a separate distribution
(`weir-bench`, bench/pyproject.toml) that the server's wheel does not carry, so `bench` is imported
only when a `weir bench ...` command runs; every other command starts without it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from weir import generate_cli
from weir.gateway.server.serve_flags import add_serve_arguments
from weir.gateway.settings.settings import Settings
from weir.migrations.cli import add_subcommands as add_db_and_admin_commands


def _settings(cli: argparse.Namespace | dict[str, object]) -> Settings:
    try:
        return Settings.from_environment(cli)
    except ValueError as exc:
        # Settings validation names the field; a traceback would only hide it.
        print(f"weir: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _serve(args: argparse.Namespace) -> int:
    from weir.gateway.fleet.model_rollout import StartupLoadError
    from weir.gateway.server.bootstrap import KernelChoiceError, serve
    from weir.gateway.server.fleet_setup import StartupModelError

    settings = _settings(args)
    try:
        return serve(settings)
    except (KernelChoiceError, StartupModelError) as exc:  # names the flag or the clash
        print(f"weir: {exc}", file=sys.stderr)
        return 2
    except StartupLoadError as exc:  # the --model version did not load: the reason, not a traceback
        print(f"weir: {exc}", file=sys.stderr)
        return 1


def _model_prepare(args: argparse.Namespace) -> int:
    from weir.engine.runner.model_prepare import ensure_default_model

    cli = {"cache_dir": args.cache_dir}
    path = ensure_default_model(_settings(cli).cache_dir, progress=not args.quiet)
    print(path)
    return 0


def _generate(args: argparse.Namespace) -> int:
    from weir.gateway.server.bootstrap import resolve_model_path

    settings = _settings({"model_path": args.model, "cache_dir": args.cache_dir})
    return int(args.generate_func(args, str(resolve_model_path(settings))))


def _bench_offline(args: argparse.Namespace) -> int:
    from weir.engine.runner.model_prepare import ensure_default_model
    from weir_bench.offline import offline_command

    model = args.model or str(ensure_default_model(_settings({"cache_dir": args.cache_dir}).cache_dir))
    return offline_command(args, model)


def build_parser(with_bench: bool = True) -> argparse.ArgumentParser:
    """The whole `weir` command line; `bench`'s actions only `with_bench` (importing bench)."""
    parser = argparse.ArgumentParser(prog="weir", description="Weir: a multi-tenant LLM inference gateway.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the OpenAI-compatible server with the engine in-process")
    add_serve_arguments(serve)
    serve.set_defaults(func=_serve)

    model = sub.add_parser("model", help="manage models")
    model_sub = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    prepare = model_sub.add_parser("prepare", help="convert the default SmolLM2 model into the cache")
    prepare.add_argument(
        "--cache-dir", dest="cache_dir", help="default $XDG_CACHE_HOME/weir or ~/.cache/weir"
    )
    prepare.add_argument("--quiet", action="store_true", help="no progress bar")
    prepare.set_defaults(func=_model_prepare)

    generate_cli.add_subcommand(sub)
    gen_parser = sub.choices["generate"]
    gen_parser.add_argument("--cache-dir", dest="cache_dir", help="where the default model is prepared")
    # The engine's handler takes (args, model_path); the model is resolved here.
    gen_parser.set_defaults(generate_func=gen_parser.get_default("func"), func=_generate)

    add_db_and_admin_commands(sub, lambda args: Settings.from_environment())

    bench = sub.add_parser("bench", help="serving benchmarks (the weir-bench distribution)")
    if with_bench:
        _add_bench_commands(bench)
    else:
        bench.add_argument("rest", nargs=argparse.REMAINDER, help="ACTION and its arguments")
    return parser


def _add_bench_commands(bench: argparse.ArgumentParser) -> None:
    try:
        from weir_bench import cli as bench_cli
        from weir_bench.offline import add_arguments as add_offline_arguments
    except ImportError as exc:
        print(f"weir: the benchmarks are not installed ({exc}); pip install -e ./bench", file=sys.stderr)
        raise SystemExit(2) from None
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="ACTION")
    bench_cli.add_subcommands(bench_sub)
    offline = bench_sub.add_parser("offline", help="the engine alone vs Hugging Face, in one run")
    add_offline_arguments(offline)
    offline.add_argument("--cache-dir", dest="cache_dir", help="where the default model is prepared")
    offline.set_defaults(func=_bench_offline)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `weir` script."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    with_bench = bool(args_list) and args_list[0] == "bench"
    args = build_parser(with_bench).parse_args(args_list)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
