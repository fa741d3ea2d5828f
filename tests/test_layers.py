"""The wings of a package import one another without loops (issue 55, item 3).

A wing is a sub-package (gateway/api/, gateway/routes/, ...) or a flat module of the package
(engine/request.py). The imports are read from the source (`ast`, every `import` and
`from ... import`, those under `if TYPE_CHECKING:` included), so the check sees what a reader
sees. Without a loop, every wing stands on a floor above all that it imports: no import runs back
up a floor.

The engine's floors, lowest first (a wing imports only wings on floors below its own):

    0  errors, faults, latency_targets, sampling_bounds, speculative_config, speculation_tally,
       engine_tokenizer
    1  config
    2  lora
    3  structured (compiled grammars and their matchers)
    4  request
    5  text, kv
    6  output (what the scheduler hands the runner, what callers are streamed)
    7  sampling (the sampler, its filters, draft verification)
    8  scheduling, models
    9  engine_stats (the engine's counters, the scheduler's among them), measured_rates
    10 runner
    11 client, spec_decode
    12 prefix_cache_admin, adapter_admin, kv_tiers, sequence_groups
    13 llm_engine, then async_engine (`weir generate` is weir/generate_cli.py, above engine/)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES_WITHOUT_LOOPS = ["engine", "gateway", "tenancy"]


def _wing(module: str, package: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["weir", package] or len(parts) < 3:
        return None
    return parts[2]


def _imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def wing_imports(package: str) -> dict[str, dict[str, set[str]]]:
    """wing -> wing it imports -> the files (relative to the checkout) that do."""
    edges: dict[str, dict[str, set[str]]] = {}
    base = ROOT / package
    for path in base.rglob("*.py"):
        rel = path.relative_to(base)
        source = rel.parts[0].removesuffix(".py")
        for module in _imports(path):
            target = _wing(module, package)
            if target is None or target == source:
                continue
            if (base / target).is_dir() or (base / f"{target}.py").is_file():
                edges.setdefault(source, {}).setdefault(target, set()).add(str(path.relative_to(ROOT)))
    return edges


def loops(edges: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The strongly connected groups of more than one wing (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in edges.get(node, {}):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("package", PACKAGES_WITHOUT_LOOPS)
def test_no_wing_imports_another_in_a_loop(package: str) -> None:
    edges = wing_imports(package)
    described = [
        {f"{a} -> {b}": sorted(edges[a][b]) for a in group for b in edges.get(a, {}) if b in group}
        for group in loops(edges)
    ]
    assert described == []


def test_the_loop_finder_finds_a_loop_and_a_clean_chain() -> None:
    chain = {"routes": {"api": {"r.py"}}, "api": {"http": {"a.py"}}}
    assert loops(chain) == []
    looped = {**chain, "http": {"routes": {"h.py"}}}
    assert loops(looped) == [["api", "http", "routes"]]


def test_the_gateway_has_wings_to_check() -> None:
    edges = wing_imports("gateway")
    assert "routes" in edges and "api" in edges["routes"]  # the check reads real imports


def _importers_of(package: str, prefix: str) -> list[str]:
    """The files of `package` (relative to the checkout) that import `prefix` or a module below it."""
    return sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / package).rglob("*.py")
        if any(m == prefix or m.startswith(prefix + ".") for m in _imports(path))
    )


def test_migrations_stand_above_tenancy() -> None:
    # One direction only: migrations read tenancy's tables (env.py) and run its schema check for the
    # CLI; tenancy never imports weir.migrations (the check reaches it as a callable).
    assert _importers_of("tenancy", "weir.migrations") == []
    assert "migrations/env.py" in _importers_of("migrations", "weir.tenancy")


def test_tenancy_has_wings_to_check() -> None:
    edges = wing_imports("tenancy")
    assert "repository" in edges and "store" in edges["repository"]  # the check reads real imports
