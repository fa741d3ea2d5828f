"""weir.gateway.http.single_flight: one call in flight per key, shared by concurrent callers."""

from __future__ import annotations

import asyncio

import pytest

from weir.gateway.http.single_flight import SingleFlight


class Gate:
    """A call that counts its runs and returns (or raises) once the test opens it."""

    def __init__(self, result: object = "row", error: Exception | None = None) -> None:
        self.runs = 0
        self.opened = asyncio.Event()
        self.result, self.error = result, error

    async def __call__(self) -> object:
        self.runs += 1
        await self.opened.wait()
        if self.error is not None:
            raise self.error
        return self.result


async def _settle() -> None:
    for _ in range(5):  # let every task reach its await
        await asyncio.sleep(0)


def test_concurrent_callers_of_one_key_share_one_call() -> None:
    async def main() -> None:
        flight: SingleFlight[str, object] = SingleFlight()
        gate = Gate()
        tasks = [asyncio.create_task(flight.run("k", 0, gate)) for _ in range(20)]
        await _settle()
        assert len(flight) == 1
        gate.opened.set()
        assert await asyncio.gather(*tasks) == ["row"] * 20
        assert gate.runs == 1 and flight.num_shared == 19 and len(flight) == 0
        # Done: the next caller runs the call again (the cache, not this, keeps results).
        assert await flight.run("k", 0, gate) == "row" and gate.runs == 2

    asyncio.run(main())


def test_other_keys_and_other_generations_get_calls_of_their_own() -> None:
    async def main() -> None:
        flight: SingleFlight[str, object] = SingleFlight()
        gate = Gate()
        tasks = [
            asyncio.create_task(flight.run(key, generation, gate))
            for key, generation in [("a", 0), ("b", 0), ("a", 1), ("a", 1)]
        ]
        await _settle()
        gate.opened.set()
        await asyncio.gather(*tasks)
        # ("a", 1) started after ("a", 0) under a newer generation: its own call, shared by the
        # second ("a", 1) only.
        assert gate.runs == 3 and flight.num_shared == 1

    asyncio.run(main())


def test_an_error_reaches_every_caller() -> None:
    async def main() -> None:
        flight: SingleFlight[str, object] = SingleFlight()
        gate = Gate(error=LookupError("database is locked"))
        tasks = [asyncio.create_task(flight.run("k", 0, gate)) for _ in range(3)]
        await _settle()
        gate.opened.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, LookupError) for r in results) and gate.runs == 1

    asyncio.run(main())


def test_a_caller_that_goes_away_does_not_cancel_the_call_for_the_others() -> None:
    async def main() -> None:
        flight: SingleFlight[str, object] = SingleFlight()
        gate = Gate()
        first = asyncio.create_task(flight.run("k", 0, gate))
        second = asyncio.create_task(flight.run("k", 0, gate))
        await _settle()
        first.cancel()  # the client that started the lookup disconnected
        await _settle()
        gate.opened.set()
        assert await second == "row"
        with pytest.raises(asyncio.CancelledError):
            await first
        assert gate.runs == 1

    asyncio.run(main())
