"""Every `EngineClient` the gateway may be given matches the Protocol, signature by signature.

`isinstance` against a runtime-checkable Protocol only checks that the method names exist, so a
fake whose `abort` is not awaitable, or whose `generate` takes other arguments, would pass it and
the gateway tests would then exercise a contract the real engine does not have. This compares
each method's parameters and whether it is awaited, iterated asynchronously or called plainly.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from tests.gateway.fake_engine import FakeEngine
from weir.engine.async_engine import AsyncEngine
from weir.engine.client import EngineClient
from weir_bench.null_engine import NullEngine


def _protocol_methods(protocol: type) -> dict[str, Callable[..., object]]:
    return {
        name: member
        for name, member in vars(protocol).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }


def _call_kind(function: Callable[..., object]) -> str:
    """How a caller uses the result: awaited, iterated with `async for`, or used as returned."""
    if inspect.iscoroutinefunction(function):
        return "awaited"
    if inspect.isasyncgenfunction(function):
        return "async-iterated"
    return "plain"


def _parameters(function: Callable[..., object]) -> list[tuple[str, object]]:
    """The parameters a caller must or may pass (without `self`, and without optional extras)."""
    params = list(inspect.signature(function).parameters.values())[1:]
    return [(p.name, p.kind) for p in params if p.default is inspect.Parameter.empty]


def protocol_mismatches(implementation: type, protocol: type) -> list[str]:
    """What in `implementation` a caller of `protocol` could not use as declared; [] if nothing."""
    problems = []
    for name, declared in _protocol_methods(protocol).items():
        actual = getattr(implementation, name, None)
        if not inspect.isfunction(actual):
            problems.append(f"{name}: missing")
            continue
        if _parameters(actual) != _parameters(declared):
            problems.append(f"{name}: parameters {_parameters(actual)} != {_parameters(declared)}")
        declared_kind, actual_kind = _call_kind(declared), _call_kind(actual)
        # A plain method declared to return an async iterator may be written as an async generator.
        returns_async_iterator = "AsyncIterator" in str(inspect.signature(declared).return_annotation)
        if declared_kind != actual_kind and not (
            declared_kind == "plain" and actual_kind == "async-iterated" and returns_async_iterator
        ):
            problems.append(f"{name}: {actual_kind}, declared {declared_kind}")
    return problems


@pytest.mark.parametrize("implementation", [AsyncEngine, FakeEngine, NullEngine], ids=lambda c: c.__name__)
def test_implements_the_engine_client_protocol(implementation: type) -> None:
    assert protocol_mismatches(implementation, EngineClient) == []


def test_the_check_catches_a_drifted_double() -> None:
    class Drifted:
        def generate(self, request: object, extra: int) -> object:  # an extra required argument
            return iter(())

        def abort(self, request_id: str) -> None:  # not awaitable
            pass

        def stats(self) -> object:
            return None

        def health(self) -> object:
            return None

    problems = protocol_mismatches(Drifted, EngineClient)
    assert [p.split(":")[0] for p in problems] == ["generate", "abort"]
    assert "extra" in problems[0] and problems[1] == "abort: plain, declared awaited"
    assert protocol_mismatches(object, EngineClient) == [
        "generate: missing",
        "abort: missing",
        "stats: missing",
        "health: missing",
    ]
