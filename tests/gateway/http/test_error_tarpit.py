"""The error tarpit: 4xx answers of a client over the error bar wait, nothing else does.

The middleware gets an injected clock and sleep, so the delays are asserted exactly and nothing
sleeps for real.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
from starlette.types import Receive, Scope, Send

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, serve_in_thread, tokenizer
from weir.gateway.http.error_tarpit import (
    DEFAULT_LIMITS,
    NUM_SLOTS,
    ErrorCounts,
    ErrorTarpitMiddleware,
    TarpitLimits,
    error_subject,
)
from weir.gateway.server.app import create_app
from weir.gateway.settings.settings import Settings

KEY_A = "sk-weir-" + "a" * 16 + "-" + "b" * 52
KEY_B = "sk-weir-" + "c" * 16 + "-" + "d" * 52
LIMITS = TarpitLimits(max_errors=5, window_s=10.0, delay_step_s=0.1, max_delay_s=0.5, max_tracked=8)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Sleeps:
    """Records the delays asked for; sleeps not at all."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay_s: float) -> None:
        self.delays.append(delay_s)


async def _status_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers the status named by the path: /status/400 -> 400."""
    status = int(scope["path"].rsplit("/", 1)[1])
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def tarpit(clock: Clock, sleeps: Sleeps) -> ErrorTarpitMiddleware:
    return ErrorTarpitMiddleware(_status_app, LIMITS, timer=clock, sleep=sleeps)


async def _get(
    app: ErrorTarpitMiddleware, status: int, key: str | None = None, addr: str = "10.0.0.1"
) -> int:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    transport = httpx.ASGITransport(app=app, client=(addr, 1234))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.get(f"/status/{status}", headers=headers)
    return response.status_code


def _call(app: ErrorTarpitMiddleware, status: int, key: str | None = None, addr: str = "10.0.0.1") -> int:
    return asyncio.run(_get(app, status, key, addr))


def _errors(app: ErrorTarpitMiddleware, num: int, key: str | None = None, addr: str = "10.0.0.1") -> None:
    for _ in range(num):
        assert _call(app, 400, key, addr) == 400


def test_limits_compute_the_delay() -> None:
    assert [LIMITS.delay_s(n) for n in (0, 5, 6, 7, 9, 10, 11, 100)] == pytest.approx(
        [0, 0, 0.1, 0.2, 0.4, 0.5, 0.5, 0.5]
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_errors", 0),
        ("window_s", 0.0),
        ("delay_step_s", float("nan")),
        ("max_delay_s", -1.0),
        ("max_tracked", 0),
    ],
)
def test_limits_are_validated(field: str, value: float) -> None:
    fields: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=field):
        TarpitLimits(**fields)


def test_below_the_bar_nothing_waits(tarpit: ErrorTarpitMiddleware, sleeps: Sleeps) -> None:
    _errors(tarpit, LIMITS.max_errors, KEY_A)
    assert sleeps.delays == []


def test_errors_over_the_bar_wait_more_each_up_to_the_cap(
    tarpit: ErrorTarpitMiddleware, sleeps: Sleeps
) -> None:
    _errors(tarpit, LIMITS.max_errors + 7, KEY_A)
    assert sleeps.delays == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.5, 0.5])


def test_successes_of_a_tarpitted_key_never_wait(tarpit: ErrorTarpitMiddleware, sleeps: Sleeps) -> None:
    _errors(tarpit, LIMITS.max_errors + 3, KEY_A)
    sleeps.delays.clear()
    for status in (200, 201, 204, 302, 500, 503):
        assert _call(tarpit, status, KEY_A) == status
    assert sleeps.delays == []
    assert _call(tarpit, 429, KEY_A) == 429  # any 4xx is an error answer
    assert sleeps.delays == pytest.approx([0.4])


def test_another_key_never_waits_for_one_keys_errors(tarpit: ErrorTarpitMiddleware, sleeps: Sleeps) -> None:
    _errors(tarpit, LIMITS.max_errors + 3, KEY_A)  # same address for both keys
    sleeps.delays.clear()
    assert _call(tarpit, 200, KEY_B) == 200
    _errors(tarpit, LIMITS.max_errors, KEY_B)
    assert sleeps.delays == []


def test_keyless_requests_count_per_address(tarpit: ErrorTarpitMiddleware, sleeps: Sleeps) -> None:
    _errors(tarpit, LIMITS.max_errors + 1, None, "10.0.0.1")
    assert sleeps.delays == pytest.approx([0.1])
    _errors(tarpit, 1, "not-a-weir-key", "10.0.0.1")  # an unparseable key is no key
    _errors(tarpit, LIMITS.max_errors, None, "10.0.0.2")  # another address has its own count
    assert sleeps.delays == pytest.approx([0.1, 0.2])
    _errors(tarpit, 1, KEY_A, "10.0.0.1")  # a key behind the address is not slowed by it
    assert _call(tarpit, 200, None, "10.0.0.1") == 200
    assert sleeps.delays == pytest.approx([0.1, 0.2])


def test_a_refused_key_counts_against_its_address_not_its_id(
    tarpit: ErrorTarpitMiddleware, sleeps: Sleeps
) -> None:
    for _ in range(LIMITS.max_errors + 1):  # someone presenting KEY_A's id with a wrong secret
        assert _call(tarpit, 401, KEY_A, "10.0.0.9") == 401
    assert sleeps.delays == pytest.approx([0.1])
    _errors(tarpit, LIMITS.max_errors, KEY_A, "10.0.0.1")  # the real owner is not slowed
    assert sleeps.delays == pytest.approx([0.1])


def test_the_window_forgets(tarpit: ErrorTarpitMiddleware, sleeps: Sleeps, clock: Clock) -> None:
    _errors(tarpit, LIMITS.max_errors + 2, KEY_A)
    assert sleeps.delays == pytest.approx([0.1, 0.2])
    clock.now += LIMITS.window_s / 2  # half a window later every error is still in it
    _errors(tarpit, 1, KEY_A)
    assert sleeps.delays == pytest.approx([0.1, 0.2, 0.3])
    clock.now += LIMITS.window_s * (NUM_SLOTS - 4) / NUM_SLOTS  # the first burst has left
    sleeps.delays.clear()
    _errors(tarpit, LIMITS.max_errors - 1, KEY_A)  # 1 left in the window + these: at the bar
    assert sleeps.delays == []
    assert len(tarpit.errors) == 1
    clock.now += LIMITS.window_s + 1  # a quiet window: forgotten altogether
    assert len(tarpit.errors) == 0
    _errors(tarpit, LIMITS.max_errors, KEY_A)
    assert sleeps.delays == []


def test_memory_is_bounded(clock: Clock) -> None:
    counts = ErrorCounts(LIMITS, timer=clock)
    for i in range(10 * LIMITS.max_tracked):
        counts.record(f"addr:10.1.{i // 256}.{i % 256}")
    assert len(counts) == LIMITS.max_tracked


def test_the_subject_is_parsed_without_a_lookup() -> None:
    def scope(authorization: str | None, client: tuple[str, int] | None = ("10.0.0.1", 1)) -> Scope:
        headers = [] if authorization is None else [(b"authorization", authorization.encode())]
        return {"type": "http", "headers": headers, "client": client}

    assert error_subject(scope(f"Bearer {KEY_A}"), 400) == "key:" + "a" * 16
    assert error_subject(scope(f"bearer  {KEY_A} "), 429) == "key:" + "a" * 16
    assert error_subject(scope(f"Bearer {KEY_A}"), 401) == "addr:10.0.0.1"
    assert error_subject(scope("Bearer sk-weir-bogus0000"), 400) == "addr:10.0.0.1"
    assert error_subject(scope(f"Basic {KEY_A}"), 400) == "addr:10.0.0.1"
    assert error_subject(scope(None, None), 400) == "addr:"


def test_the_app_has_the_tarpit_on_by_default_and_can_turn_it_off() -> None:
    def tarpits(**kwargs: object) -> list[object]:
        app = create_app(Settings(), FakeEngine(), tokenizer(), max_model_len=64, **kwargs)  # type: ignore[arg-type]
        return [
            m.kwargs.get("limits", m.args[0] if m.args else None)
            for m in app.user_middleware
            if m.cls is ErrorTarpitMiddleware
        ]

    assert tarpits() == [DEFAULT_LIMITS]
    assert tarpits(error_tarpit=None) == []
    assert tarpits(error_tarpit=LIMITS) == [LIMITS]


# -- through the real HTTP server (uvicorn on 127.0.0.1, the official openai client) --------------


def test_a_flooding_key_is_slowed_and_another_key_is_not_over_http(clock: Clock, sleeps: Sleeps) -> None:
    inner = make_app(FakeEngine(), error_tarpit=None)
    app = ErrorTarpitMiddleware(inner, LIMITS, timer=clock, sleep=sleeps)
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    with serve_in_thread(app) as url:  # type: ignore[arg-type]
        attacker = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY_A, max_retries=0)
        victim = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY_B, max_retries=0)
        for _ in range(LIMITS.max_errors + 2):
            with pytest.raises(openai.BadRequestError):
                attacker.chat.completions.create(model=MODEL, messages=messages, seed=2**64, max_tokens=2)
        assert sleeps.delays == pytest.approx([0.1, 0.2])
        assert attacker.chat.completions.create(model=MODEL, messages=messages, max_tokens=2).choices
        assert victim.chat.completions.create(model=MODEL, messages=messages, max_tokens=2).choices
        with pytest.raises(openai.BadRequestError):
            victim.chat.completions.create(model=MODEL, messages=messages, seed=2**64, max_tokens=2)
        assert sleeps.delays == pytest.approx([0.1, 0.2])


def test_errors_that_never_proved_a_key_do_not_count_against_it(clock: Clock, sleeps: Sleeps) -> None:
    """Issue 21: unknown paths sent with the victim's (public) key id slowed the victim's own errors."""
    configured = create_app(Settings(), FakeEngine(), tokenizer(), max_model_len=64, error_tarpit=LIMITS)
    (tarpit,) = [m for m in configured.user_middleware if m.cls is ErrorTarpitMiddleware]
    # The app's own tarpit configuration, with the test's clock and sleep.
    app = ErrorTarpitMiddleware(
        make_app(FakeEngine(), error_tarpit=None),
        *tarpit.args,
        **{**tarpit.kwargs, "timer": clock, "sleep": sleeps},
    )
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    with serve_in_thread(app) as url:  # type: ignore[arg-type]
        with httpx.Client(base_url=url, headers={"authorization": f"Bearer {KEY_B}"}) as attacker:
            for _ in range(LIMITS.max_errors + 2):  # one connection, the victim's key id
                assert attacker.get("/v1/no-such-path").status_code == 404
        assert sleeps.delays == pytest.approx([0.1, 0.2])  # the sender's connection pays
        victim = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY_B, max_retries=0)
        with pytest.raises(openai.BadRequestError):
            victim.chat.completions.create(model=MODEL, messages=messages, seed=2**64, max_tokens=2)
        assert sleeps.delays == pytest.approx([0.1, 0.2])  # the victim's own error did not wait


def test_a_connection_is_slowed_before_its_address(tarpit: ErrorTarpitMiddleware, sleeps: Sleeps) -> None:
    bar = LIMITS.address_bar
    assert bar > LIMITS.max_errors
    for port in range(bar):  # a new connection each time: each under its own bar
        transport = httpx.ASGITransport(app=tarpit, client=("10.0.0.5", 2000 + port))

        async def get(transport: httpx.ASGITransport = transport) -> int:
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                return (await client.get("/status/404")).status_code

        assert asyncio.run(get()) == 404
    assert sleeps.delays == []
    assert _call(tarpit, 404, None, "10.0.0.5") == 404  # the address's bar is passed
    assert sleeps.delays == pytest.approx([0.1])
    # Past it, the address's waits grow beyond a key's cap (many connections, one sender).
    _errors(tarpit, 9, None, "10.0.0.5")
    assert sleeps.delays[-1] == pytest.approx(1.0) and sleeps.delays[-1] > LIMITS.max_delay_s
    assert LIMITS.address_max_delay_s == 10.0
