"""The project's import graph: no cycles between its modules, kernels/ a leaf, torch kept out of
the plain-Python layers. Read statically with `ast`, so nothing is imported to check it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> the package it imports as (setup.py's package_dir; bench is its own distribution)
PACKAGES = {
    "weir": "weir",
    "engine": "weir.engine",
    "gateway": "weir.gateway",
    "kernels": "weir.kernels",
    "tenancy": "weir.tenancy",
    "bench": "weir_bench",
}
# Modules that must stay plain Python (the architecture's contract): no torch, no triton.
TORCH_FREE = (
    "weir.engine.kv.block_pool",
    "weir.engine.kv.block_hash",
    "weir.engine.kv.kv_cache_manager",
    "weir.engine.scheduling.scheduler",
    "weir.engine.scheduling.request_queue",
    "weir.engine.request",
    "weir.engine.output",
    "weir.engine.errors",
    "weir.engine.client",
    "weir.engine.speculative_config",
    "weir.engine.scheduling.speculation_policy",
    "weir.engine.speculation_tally",
)


def _module_name(path: Path) -> str:
    folder, *parts = path.relative_to(ROOT).with_suffix("").parts
    parts = [*PACKAGES[folder].split("."), *parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module: str, known: set[str]) -> set[str]:
    """Project modules imported by `path` (at any depth in the file: lazy imports count too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    known = set(files)
    return {m: _imports(p, m, known) for m, p in files.items()}


def _third_party(module: str) -> set[str]:
    # the longest package that holds the module: weir.engine.x is in engine/, weir.cli in weir/
    owners = [f for f, pkg in PACKAGES.items() if module == pkg or module.startswith(pkg + ".")]
    folder = max(owners, key=lambda f: len(PACKAGES[f]))
    relative = module.removeprefix(PACKAGES[folder]).lstrip(".").replace(".", "/")
    path = ROOT / folder / (relative + ".py")
    if not path.exists():  # a package (e.g. weir.tenancy.admin_bodies): its __init__
        path = ROOT / folder / relative / "__init__.py"
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def _is_package_init(graph: dict[str, set[str]], name: str) -> bool:
    return any(m.startswith(name + ".") for m in graph)


def test_no_import_cycles() -> None:
    graph = _graph()
    # A package's __init__ importing its own submodules is not a cycle between concepts.
    pruned = {
        m: {d for d in deps if not (_is_package_init(graph, m) and d.startswith(m + "."))}
        for m, deps in graph.items()
    }
    assert _find_cycle(pruned) is None, f"import cycle: {' -> '.join(_find_cycle(pruned) or [])}"


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_kernels_import_nothing_from_the_rest_of_the_project() -> None:
    graph = _graph()
    leaks = {m: sorted(d for d in deps if not d.startswith("weir.kernels")) for m, deps in graph.items()}
    leaks = {m: d for m, d in leaks.items() if m.startswith("weir.kernels") and d}
    assert leaks == {}


def test_plain_python_layers_never_import_torch() -> None:
    offenders = {m: sorted(_third_party(m) & {"torch", "triton"}) for m in TORCH_FREE}
    assert {m: d for m, d in offenders.items() if d} == {}
    tenancy = {m for m in _graph() if m.startswith("weir.tenancy")}
    assert {m for m in tenancy if "." in m and _third_party(m) & {"torch", "triton"}} == set()


def test_only_the_cli_reaches_bench_and_nothing_reaches_the_cli() -> None:
    # The server (gateway), the engine and tenancy never import the benchmarks (a separate
    # distribution the server's wheel lacks); the `weir` command (weir.cli) is the one root above them.
    graph = _graph()
    server_side = ("weir.gateway", "weir.engine", "weir.kernels", "weir.tenancy")
    to_bench = {m: sorted(d for d in deps if d.startswith("weir_bench")) for m, deps in graph.items()}
    assert {m: d for m, d in to_bench.items() if d and m.startswith(server_side)} == {}
    to_cli = {m: sorted(d for d in deps if d.startswith("weir.cli")) for m, deps in graph.items()}
    assert {m: d for m, d in to_cli.items() if d and m != "weir.cli"} == {}
