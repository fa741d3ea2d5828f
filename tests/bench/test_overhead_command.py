"""weir_bench.overhead_command: the report names the loop and HTTP protocol `weir serve` really runs."""

from __future__ import annotations

from weir_bench.overhead_command import _uvicorn_impl


def test_the_report_names_the_servers_own_loop_and_parser() -> None:
    # uvicorn's "auto" would pick uvloop where installed; weir serve pins asyncio and httptools.
    assert _uvicorn_impl() == ("asyncio", "httptools")
