"""The tokenizer pool: bounded workers, a share per tenant, turns between tenants."""

from __future__ import annotations

import threading

import anyio
import pytest

from weir.gateway.prompts.tokenizer_pool import TokenizerPool

# A hang guard only: every wait below ends by an event, never by the clock.
HANG_S = 30


def _blocking(release: threading.Event, started: threading.Event, label: str) -> str:
    started.set()
    release.wait(HANG_S)
    return label


async def _wait_for(predicate: object) -> None:
    with anyio.fail_after(HANG_S):
        while not predicate():  # type: ignore[operator]
            await anyio.sleep(0.001)


def test_one_tenants_jobs_queue_behind_each_other_not_in_front_of_others() -> None:
    pool = TokenizerPool(num_workers=2, tenant_share=0.5)
    assert pool.max_per_tenant == 1
    release = threading.Event()
    results: list[str] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for i in range(3):  # the heavy tenant's huge prompts
                started = threading.Event()

                async def heavy(i: int = i, started: threading.Event = started) -> None:
                    results.append(await pool.run("heavy", _blocking, release, started, f"heavy-{i}"))

                tg.start_soon(heavy)
            await _wait_for(lambda: pool.num_busy == 1 and pool.num_waiting("heavy") == 2)
            # The other tenant is served at once, by the worker the heavy one may not take.
            assert await pool.run("light", lambda: "light") == "light"
            assert results == []  # every heavy job is still running or waiting
            release.set()
        assert sorted(results) == ["heavy-0", "heavy-1", "heavy-2"]
        assert pool.num_busy == 0 and pool.num_waiting() == 0

    anyio.run(main)


def test_a_freed_worker_goes_to_the_tenants_in_turn() -> None:
    pool = TokenizerPool(num_workers=1, tenant_share=1.0)
    gates = {label: threading.Event() for label in ("a1", "a2", "a3", "b1")}
    order: list[str] = []

    def job(label: str) -> None:
        order.append(label)
        gates[label].wait(HANG_S)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pool.run, "a", job, "a1")
            await _wait_for(lambda: order == ["a1"])
            tg.start_soon(pool.run, "a", job, "a2")
            await _wait_for(lambda: pool.num_waiting("a") == 1)
            tg.start_soon(pool.run, "a", job, "a3")
            await _wait_for(lambda: pool.num_waiting("a") == 2)
            tg.start_soon(pool.run, "b", job, "b1")
            await _wait_for(lambda: pool.num_waiting("b") == 1)
            for label in ("a1", "a2", "b1", "a3"):
                gates[label].set()
        # a2 was first in line; then a goes to the back of the turn order, behind b.
        assert order == ["a1", "a2", "b1", "a3"]

    anyio.run(main)


def test_a_cancelled_waiter_leaves_nothing_behind() -> None:
    pool = TokenizerPool(num_workers=1, tenant_share=1.0)
    release, started = threading.Event(), threading.Event()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pool.run, "a", _blocking, release, started, "a")
            await _wait_for(started.is_set)
            waiting = anyio.CancelScope()
            async with anyio.create_task_group() as inner:

                async def waiter() -> None:
                    with waiting:
                        await pool.run("b", lambda: "b")

                inner.start_soon(waiter)
                await _wait_for(lambda: pool.num_waiting("b") == 1)
                waiting.cancel()
            assert pool.num_waiting() == 0
            release.set()
        assert pool.num_busy == 0
        assert await pool.run("b", lambda: "b") == "b"  # the worker was given back

    anyio.run(main)


@pytest.mark.parametrize(
    ("workers", "share", "inline"), [(0, 0.5, 0), (2, 0.0, 0), (2, 1.5, 0), (2, 0.5, -1)]
)
def test_bad_sizes_are_refused(workers: int, share: float, inline: int) -> None:
    with pytest.raises(ValueError):
        TokenizerPool(workers, share, inline)


def test_a_job_cancelled_while_its_thread_runs_holds_the_worker_until_the_thread_ends() -> None:
    pool = TokenizerPool(num_workers=1, tenant_share=1.0)
    release, started = threading.Event(), threading.Event()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            running = anyio.CancelScope()

            async def job() -> None:
                with running:
                    await pool.run("a", _blocking, release, started, "a")

            tg.start_soon(job)
            await _wait_for(started.is_set)
            running.cancel()
            await anyio.sleep(0.01)
            assert pool.num_busy == 1  # the thread still runs: its worker is not lent again
            release.set()
            await _wait_for(lambda: pool.num_busy == 0)
        assert await pool.run("b", lambda: "b") == "b"

    anyio.run(main)
