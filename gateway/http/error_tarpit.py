"""ASGI middleware that slows down the error answers of a client caught in a tight error loop.

Every refused request (a 4xx) still costs the server its parse, authentication and validation,
on the same cores the engine runs on. A client looping refused inputs from a few connections
reaches hundreds of requests per second and slows every other tenant (docs/benchmarks.md,
Attacker). Refusing faster does not help; answering its errors later does: once a client has
had more than `max_errors` 4xx answers within `window_s`, each further error answer waits
`delay_step_s` per error over the bar, up to `max_delay_s`, before its response starts. The
wait is an `asyncio.sleep`: it costs no CPU, and a closed-loop client sends its next request
only after it has its answer, so its request rate falls to about one per `max_delay_s` per
connection.

What is delayed, and whose count it is:

- Only error answers (4xx). A success is never delayed, whatever the client's count.
- Errors are counted per presented API key id, parsed from `Authorization: Bearer
  sk-weir-<id>-<secret>` without a database lookup, so one tenant's errors never slow another
  key's answers, errors included. With `proof_required` (the gateway's setting), only a request
  that proved the key's secret counts against its id (the route marks it, `mark_key_proved`): a
  key id is public (it is in every log line and usage record), so requests to unknown paths, or
  refused before authentication, with a victim's id count against their sender's address and
  connection, never against the victim (issue 21).
- A request without a parseable or proved key (none, the admin token, garbage), and any 401
  (the presented credential was refused, so its key id proves nothing and might be someone
  else's, or a fresh random one each time), is counted per client connection (address and
  port, bar `max_errors`) and per client address (bar `max_address_errors`, higher: an ingress
  or a NAT puts many clients behind one address; its waits grow up to `max_address_delay_s`, so
  a flood over many connections from one address is slowed as a whole); the longer wait applies. Only such
  requests' errors are slowed by these counts: a valid key behind the same address is never
  delayed by them.
- The count is a sliding window of `NUM_SLOTS` slots of `window_s / NUM_SLOTS` each: a client
  that stops erring is back to no delay once its errors have left the window.

Memory is bounded: at most `max_tracked` subjects (key ids, addresses and connections), each a
handful of integers, forgotten `window_s` after its last error and least-recently-used first past the
bound. Everything runs on the event loop, so no lock is needed.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from weir.gateway.http.auth_settings import bearer_token
from weir.tenancy.keys.keys import parse_key

# A client may get this many 4xx answers within the window before its errors are slowed down:
# far above what a careless client or an SDK retrying a 429 (it honours Retry-After) produces.
MAX_ERRORS = 20
# Per client address, for errors without a proved key: many clients may share one address.
MAX_ADDRESS_ERRORS = 10 * MAX_ERRORS
# ... and their wait may grow past MAX_DELAY_S: a 1 s cap lets 200 connections from one address
# still send 200 requests/s; with 10 s they settle near 30/s (issue 21).
MAX_ADDRESS_DELAY_S = 10.0
WINDOW_S = 10.0
# Each error over the bar waits this much more, up to MAX_DELAY_S: 20 errors over it wait 1 s.
DELAY_STEP_S = 0.05
MAX_DELAY_S = 1.0
MAX_TRACKED = 10_000
NUM_SLOTS = 10

Sleep = Callable[[float], Awaitable[None]]
# The request-state entry a route sets once the presented key's secret is verified.
KEY_PROVED_STATE = "weir_key_proved"


@dataclass(frozen=True)
class TarpitLimits:
    """When error answers start to be delayed, and by how much."""

    max_errors: int = MAX_ERRORS
    window_s: float = WINDOW_S
    delay_step_s: float = DELAY_STEP_S
    max_delay_s: float = MAX_DELAY_S
    max_tracked: int = MAX_TRACKED
    max_address_errors: int | None = None  # None: MAX_ADDRESS_ERRORS, and never below max_errors
    max_address_delay_s: float | None = None  # None: MAX_ADDRESS_DELAY_S, and never below max_delay_s

    def __post_init__(self) -> None:
        for name in ("window_s", "delay_step_s", "max_delay_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        for name in ("max_errors", "max_tracked"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_address_errors is not None and self.max_address_errors < 1:
            raise ValueError(f"max_address_errors must be >= 1, got {self.max_address_errors}")
        value = self.max_address_delay_s
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise ValueError(f"max_address_delay_s must be a positive number of seconds, got {value}")

    @property
    def address_bar(self) -> int:
        """Errors one client address may have in the window before its unproved errors wait."""
        bar = self.max_address_errors if self.max_address_errors is not None else MAX_ADDRESS_ERRORS
        return max(bar, self.max_errors)

    @property
    def address_max_delay_s(self) -> float:
        """The longest wait of an error answer counted per address."""
        cap = self.max_address_delay_s if self.max_address_delay_s is not None else MAX_ADDRESS_DELAY_S
        return max(cap, self.max_delay_s)

    def delay_s(self, num_errors: int, bar: int | None = None, max_delay_s: float | None = None) -> float:
        """The wait before an error answer, given the client's errors in the window (this one
        included), its bar (`max_errors` unless given) and cap (`max_delay_s` unless given)."""
        excess = num_errors - (self.max_errors if bar is None else bar)
        cap = self.max_delay_s if max_delay_s is None else max_delay_s
        return 0.0 if excess <= 0 else min(cap, excess * self.delay_step_s)


DEFAULT_LIMITS = TarpitLimits()


class _SlidingCount:
    """Errors of one subject in the last `NUM_SLOTS` slots (a ring of per-slot counts)."""

    __slots__ = ("counts", "last_slot")

    def __init__(self, slot: int) -> None:
        self.counts = [0] * NUM_SLOTS
        self.last_slot = slot

    def add(self, slot: int) -> int:
        """Count one error in `slot` (absolute slot number); the errors in the window after it."""
        gap = slot - self.last_slot
        if gap >= NUM_SLOTS:
            self.counts = [0] * NUM_SLOTS
        else:
            for s in range(self.last_slot + 1, slot + 1):  # slots the window moved past
                self.counts[s % NUM_SLOTS] = 0
        self.last_slot = max(slot, self.last_slot)
        self.counts[slot % NUM_SLOTS] += 1
        return sum(self.counts)


class ErrorCounts:
    """Error counts per subject (key id or address) over a sliding window; bounded memory."""

    def __init__(self, limits: TarpitLimits, *, timer: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._timer = timer
        self._slot_s = limits.window_s / NUM_SLOTS
        self._counts: TTLCache[str, _SlidingCount] = TTLCache(
            limits.max_tracked, ttl=limits.window_s, timer=timer
        )

    def __len__(self) -> int:
        return len(self._counts)

    def record(self, subject: str, bar: int | None = None, max_delay_s: float | None = None) -> float:
        """Count one error for `subject`; the delay its answer gets (see `TarpitLimits.delay_s`)."""
        slot = math.floor(self._timer() / self._slot_s)
        count = self._counts.get(subject)
        if count is None:
            count = _SlidingCount(slot)
        num_errors = count.add(slot)
        self._counts[subject] = count  # (re)set: forgotten a window after its last error
        return self.limits.delay_s(num_errors, bar, max_delay_s)


def mark_key_proved(state: Any) -> None:
    """Note on a request's state (Starlette's `request.state`) that its key's secret was verified."""
    setattr(state, KEY_PROVED_STATE, True)


def _key_proved(scope: Scope) -> bool:
    state = scope.get("state")
    return isinstance(state, dict) and state.get(KEY_PROVED_STATE) is True


def presented_key_id(scope: Scope) -> str | None:
    """The key id of the request's `Authorization: Bearer` key, parsed without a lookup."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            token = bearer_token(value.decode("latin-1"))
            parsed = parse_key(token) if token is not None else None
            return parsed.key_id if parsed is not None else None
    return None


def _counted_key_id(scope: Scope, status: int, proof_required: bool) -> str | None:
    """The key id an error answer counts against; None: its address and connection."""
    if status == 401 or (proof_required and not _key_proved(scope)):
        return None
    return presented_key_id(scope)


def error_subject(scope: Scope, status: int, *, proof_required: bool = False) -> str:
    """Whose count an error answer goes to: the presented key id, or the client address.

    With `proof_required`, a key id only when the request proved the key's secret.
    """
    key_id = _counted_key_id(scope, status, proof_required)
    return f"key:{key_id}" if key_id is not None else address_subject(scope)


def address_subject(scope: Scope) -> str:
    """The client address of a request."""
    client = scope.get("client")
    return f"addr:{client[0] if client else ''}"


def connection_subject(scope: Scope) -> str:
    """The client connection (address and port) of a request."""
    client = scope.get("client")
    return f"conn:{client[0]}:{client[1]}" if client else "conn:"


class ErrorTarpitMiddleware:
    """Wraps an ASGI app; delays the 4xx answers of a client over the error bar (see the module)."""

    def __init__(
        self,
        app: ASGIApp,
        limits: TarpitLimits | None = None,
        *,
        timer: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        proof_required: bool = False,
    ) -> None:
        self.app = app
        self.errors = ErrorCounts(limits or TarpitLimits(), timer=timer)
        self._sleep = sleep
        self.proof_required = proof_required  # see the module docstring

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tarpit_send(message: Message) -> None:
            if message["type"] == "http.response.start" and 400 <= message["status"] < 500:
                delay_s = self._record(scope, message["status"])
                if delay_s > 0:
                    await self._sleep(delay_s)
            await send(message)

        await self.app(scope, receive, tarpit_send)

    def _record(self, scope: Scope, status: int) -> float:
        """Count an error answer for its subjects; the delay it gets."""
        key_id = _counted_key_id(scope, status, self.proof_required)
        if key_id is not None:
            return self.errors.record(f"key:{key_id}")
        # Not proved: the connection's bar, and the address's higher one; the longer wait.
        limits = self.errors.limits
        return max(
            self.errors.record(connection_subject(scope)),
            self.errors.record(address_subject(scope), limits.address_bar, limits.address_max_delay_s),
        )
