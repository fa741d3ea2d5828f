"""`python -m weir_bench.gpu_check --out DIR`: the one prepared check of the CUDA path, for a lent GPU.

Three sections, each recorded even if another fails:

1. kernels: every Triton kernel compiled for real and compared with its torch oracle
   (`weir_bench.kernel_check`), fp32/fp16/bf16, real model head shapes, page sizes 16 and 32;
2. engine: greedy output of the default model through the Triton path with and without decode
   CUDA graphs must be token-identical (and how far it agrees with the torch path, for info);
3. decode: tokens/s of decode steps at a few batch sizes, forward-only (eager and graph
   replay) and through the whole engine, against the HBM roofline (`weir_bench.roofline`).

Writes DIR/gpu_check.json and DIR/gpu_check.md and prints the Markdown. Exit status: 0 all
passed, 1 a check failed or raised, 2 it could not start (no CUDA, no model). A time budget
(`--budget-s`) skips what is left rather than overrunning the machine's lease.

A CPU dry run of the script itself (tiny model, `--quick`) runs under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch

from weir_bench.decode_bench import greedy_outputs, measure_engine_decode, measure_forward_decode
from weir_bench.kernel_check import run_kernel_checks
from weir_bench.metadata import git_commit, machine_info, now_utc

PASS, FAIL, ERROR, SKIPPED = "pass", "fail", "error", "skipped"


def _kernels_interpreted() -> bool:
    from weir.kernels import rms_norm

    return type(rms_norm._rms_norm_kernel).__name__ == "InterpretedFunction"


def _model_path(args: argparse.Namespace) -> Path:
    if args.model is not None:
        return Path(args.model)
    from weir.engine.runner.model_prepare import ensure_default_model

    return ensure_default_model(Path(args.cache_dir), progress=False)


class Runner:
    """Runs sections within a deadline; records status, seconds, details or the traceback."""

    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s
        self.sections: list[dict[str, Any]] = []

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, fn: Callable[[], tuple[str, dict[str, Any]]]) -> None:
        if self.time_left() <= 0:
            self.sections.append({"name": name, "status": SKIPPED, "seconds": 0.0, "reason": "time budget"})
            return
        t0 = time.monotonic()
        try:
            status, details = fn()
            entry: dict[str, Any] = {"name": name, "status": status, **details}
        except Exception as exc:  # a broken section must not hide the others' results
            entry = {"name": name, "status": ERROR, "error": f"{type(exc).__name__}: {exc}"}
            entry["traceback"] = traceback.format_exc()
        entry["seconds"] = round(time.monotonic() - t0, 2)
        self.sections.append(entry)
        print(f"gpu_check: {name}: {entry['status']} ({entry['seconds']} s)", file=sys.stderr, flush=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def kernels_section(device: torch.device, quick: bool) -> tuple[str, dict[str, Any]]:
    rows = run_kernel_checks(device, quick)
    failed = [r for r in rows if not r.passed]
    return (FAIL if failed else PASS), {
        "num_cases": len(rows),
        "num_failed": len(failed),
        "cases": [asdict(r) | {"passed": r.passed} for r in rows],
    }


def engine_section(model: Path, device: torch.device, dtype: str, quick: bool) -> tuple[str, dict[str, Any]]:
    eager = greedy_outputs(model, device, dtype, triton=True, graphs=False, quick=quick)
    graphs = greedy_outputs(model, device, dtype, triton=True, graphs=True, quick=quick)
    torch_path = greedy_outputs(model, device, dtype, triton=False, graphs=False, quick=quick)
    differing = [rid for rid in eager.tokens if eager.tokens[rid] != graphs.tokens[rid]]
    agree_torch = sum(eager.tokens[rid] == torch_path.tokens[rid] for rid in eager.tokens)
    ok = not differing and graphs.num_graph_steps > 0
    return (PASS if ok else FAIL), {
        "dtype": dtype,
        "num_requests": len(eager.tokens),
        "num_tokens_each": len(next(iter(eager.tokens.values()))),
        "graph_vs_eager_differing_requests": differing,
        "decode_steps_replayed": graphs.num_graph_steps,
        "steps_total": graphs.num_steps,
        "triton_vs_torch_identical_requests": agree_torch,
        "first_divergence_vs_torch": eager.first_divergence(torch_path),
        "sample_text": eager.sample_text,
    }


def decode_section(
    model: Path, device: torch.device, dtype: str, args: argparse.Namespace, runner: Runner
) -> tuple[str, dict[str, Any]]:
    batches = [int(b) for b in args.batch_sizes.split(",")]
    forward = measure_forward_decode(
        model, device, dtype, batches, args.context_len, args.hbm_tb_s * 1e12, runner.time_left
    )
    engine = measure_engine_decode(
        model,
        device,
        dtype,
        batches,
        args.context_len,
        args.decode_steps,
        runner.time_left,
        args.hbm_tb_s * 1e12,
    )
    return PASS, {"dtype": dtype, "context_len": args.context_len, "forward": forward, "engine": engine}


def to_markdown(report: dict[str, Any]) -> str:
    """The human summary: statuses, failing kernel cases, engine agreement, decode tables."""
    lines = [f"# GPU check ({report['started']}, commit {report['commit']})", ""]
    lines += [f"Device: {report['device']}; torch {report['torch']}, triton {report['triton']}.", ""]
    lines += ["| section | status | seconds |", "|---|---|---|"]
    lines += [f"| {s['name']} | {s['status']} | {s['seconds']} |" for s in report["sections"]]
    for s in report["sections"]:
        lines += ["", f"## {s['name']}: {s['status']}", ""]
        if "error" in s:
            lines += ["```", s.get("traceback", s["error"]).strip(), "```"]
        if "cases" in s:
            bad = [c for c in s["cases"] if not c["passed"]]
            lines.append(f"{s['num_cases']} cases, {len(bad)} failed.")
            if bad:
                lines += ["", "| kernel | case | dtype | max error | tolerance |", "|---|---|---|---|---|"]
                lines += [
                    f"| {c['kernel']} | {c['case']} | {c['dtype']} | {c['max_error']:.3g} | {c['tolerance']:.3g} |"
                    for c in bad
                ]
        if "graph_vs_eager_differing_requests" in s:
            lines.append(
                f"{s['num_requests']} requests x {s['num_tokens_each']} tokens ({s['dtype']}): graphs vs eager "
                f"differ on {len(s['graph_vs_eager_differing_requests'])}; {s['decode_steps_replayed']} of "
                f"{s['steps_total']} steps replayed a graph; Triton vs torch path identical on "
                f"{s['triton_vs_torch_identical_requests']} (first divergence: {s['first_divergence_vs_torch']})."
            )
        if "forward" in s:
            lines += ["", "| batch | mode | tok/s | roofline tok/s | of roofline |", "|---|---|---|---|---|"]
            for row in s["forward"] + s["engine"]:
                roof = row.get("roofline_tok_s")
                share = f"{row['tok_s'] / roof:.1%}" if roof else "-"
                roof_text = f"{roof:,.0f}" if roof else "-"
                lines.append(
                    f"| {row['batch']} | {row['mode']} | {row['tok_s']:,.0f} | {roof_text} | {share} |"
                )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m weir_bench.gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    p.add_argument(
        "--model", default=None, help="prepared HF model folder (default: the weir cache's SmolLM2)"
    )
    p.add_argument(
        "--cache-dir", default=str(Path.home() / ".cache" / "weir"), help="weir cache (default model)"
    )
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run under TRITON_INTERPRET=1")
    p.add_argument("--dtypes", default="float32,bfloat16", help="model and KV dtypes to run the engine in")
    p.add_argument("--batch-sizes", default="1,8,32,64,128", help="decode batch sizes to measure")
    p.add_argument("--context-len", type=int, default=1024, help="context of each sequence while decoding")
    p.add_argument("--decode-steps", type=int, default=48, help="timed engine decode steps per batch size")
    p.add_argument("--hbm-tb-s", type=float, default=4.8, help="HBM bandwidth for the roofline (H200: 4.8)")
    p.add_argument("--budget-s", type=float, default=450.0, help="skip what is left after this many seconds")
    p.add_argument("--quick", action="store_true", help="tiny sizes (the CPU dry run)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    import triton

    report: dict[str, Any] = {
        "started": now_utc(),
        "commit": git_commit(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda" and torch.cuda.is_available()
        else "cpu",
        "machine": machine_info(),
        "args": vars(args),
    }
    problem = None
    if device.type == "cuda" and not torch.cuda.is_available():
        problem = "no CUDA device: torch.cuda.is_available() is False (a CPU build of torch?)"
    elif device.type == "cpu" and not _kernels_interpreted():
        problem = "on CPU the kernels only run interpreted: set TRITON_INTERPRET=1 for a dry run"
    model: Path | None = None
    if problem is None:
        try:
            model = _model_path(args)
        except Exception as exc:
            problem = f"no model ({exc}); pass --model DIR (a prepared HF folder) or run `weir model prepare`"
    runner = Runner(args.budget_s)
    if problem is not None or model is None:
        report["sections"] = [{"name": "setup", "status": ERROR, "seconds": 0.0, "error": problem}]
        _write(out_dir, report)
        print(f"gpu_check: cannot start: {problem}", file=sys.stderr)
        return 2
    report["model"] = str(model)
    runner.run("kernels", lambda: kernels_section(device, args.quick))
    dtypes = args.dtypes.split(",")
    for dtype in dtypes:
        runner.run(f"engine {dtype}", partial(engine_section, model, device, dtype, args.quick))
    for dtype in dtypes:
        runner.run(f"decode {dtype}", partial(decode_section, model, device, dtype, args, runner))
    report["sections"] = runner.sections
    markdown = _write(out_dir, report)
    print(markdown)
    ok = all(s["status"] == PASS for s in runner.sections)
    print(f"gpu_check: {'all passed' if ok else 'FAILED'}; report in {out_dir}", file=sys.stderr)
    return 0 if ok else 1


def _write(out_dir: Path, report: dict[str, Any]) -> str:
    (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    markdown = to_markdown(report)
    (out_dir / "gpu_check.md").write_text(markdown)
    return markdown


if __name__ == "__main__":
    sys.exit(main())
