"""Who is calling: tenant API keys -> TenantContext, and the separate admin bearer token.

Lookups go through a TTL cache, so the database is hit once per key per `cache_ttl_s` on each
replica, not on every request. Revoking a key or changing a tenant through this replica's admin
API invalidates its cache at once; other replicas (and changes made with `weir admin
--database-url`) take effect within `cache_ttl_s`.

Every refusal of a key (missing, malformed, unknown, revoked, expired, wrong secret) is the same
401 with the same message, so a caller learns nothing about which it was. A suspended tenant
gets 403 (the key itself was fine). An address that keeps failing is answered 429 with
Retry-After for the rest of the window, before any lookup is made.

`authenticate` is synchronous and may query the database on a cache miss; async code calls
`authenticate_async`, which answers cache hits inline and runs only misses in the thread pool.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cachetools import TTLCache
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from gateway.errors import AuthenticationError, PermissionDeniedError, RateLimitError
from tenancy.context import TenantContext
from tenancy.enums import KeyScope, KeyState, TenantStatus
from tenancy.keys import KeyHasher, ParsedKey, parse_key
from tenancy.schemas import KeyRecord

log = logging.getLogger(__name__)

INVALID_KEY_MESSAGE = "Invalid API key. Send a valid key as 'Authorization: Bearer <key>'."
INVALID_ADMIN_MESSAGE = "Invalid admin token. Send it as 'Authorization: Bearer <admin token>'."
SUSPENDED_MESSAGE = "This tenant is suspended. Contact the service administrator."
_MAX_HEADER_LEN = 1024


@dataclass(frozen=True)
class AuthSettings:
    """Auth cache and failure-throttle knobs."""

    cache_ttl_s: float = 30.0  # how long another replica's revocation can take to apply here
    cache_max_keys: int = 10_000
    max_failures: int = 20  # failed attempts per address per window before 429
    failure_window_s: float = 60.0
    max_tracked_addresses: int = 100_000

    def __post_init__(self) -> None:
        for name in ("cache_ttl_s", "failure_window_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        for name in ("cache_max_keys", "max_failures", "max_tracked_addresses"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class KeyStore(Protocol):
    """What the authenticator needs from the tenancy repository."""

    hasher: KeyHasher

    def now(self) -> dt.datetime: ...

    def lookup_key(self, key_id: str) -> KeyRecord | None: ...

    def touch_key(self, key_id: str, when: dt.datetime) -> None: ...


class AdminTokenStore(Protocol):
    """What the admin authenticator needs from the tenancy repository."""

    hasher: KeyHasher

    def admin_token_hash(self) -> str | None: ...


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None if absent or not of that form."""
    if authorization is None or len(authorization) > _MAX_HEADER_LEN:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
        return None
    return token


class FailureThrottle:
    """Counts authentication failures per client address in fixed windows; 429 past the limit.

    Memory is bounded: at most `max_tracked` addresses, each forgotten a window after its last
    failure. Thread-safe.
    """

    def __init__(
        self,
        max_failures: int,
        window_s: float,
        max_tracked: int = 100_000,
        *,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_failures = max_failures
        self._window_s = window_s
        self._timer = timer
        self._windows: TTLCache[str, tuple[float, int]] = TTLCache(max_tracked, ttl=window_s, timer=timer)
        self._lock = threading.Lock()

    @classmethod
    def from_settings(
        cls, settings: AuthSettings, *, timer: Callable[[], float] = time.monotonic
    ) -> FailureThrottle:
        return cls(
            settings.max_failures, settings.failure_window_s, settings.max_tracked_addresses, timer=timer
        )

    def check(self, client_addr: str) -> None:
        """Raise RateLimitError (429, Retry-After) if this address used up its failures."""
        now = self._timer()
        with self._lock:
            window = self._windows.get(client_addr)
        if window is None:
            return
        start, count = window
        remaining_s = start + self._window_s - now
        if count >= self._max_failures and remaining_s > 0:
            raise RateLimitError(
                "Too many failed authentication attempts from this address; retry later.",
                code="too_many_auth_failures",
                # The epsilon keeps float noise (10.000000000000002) from announcing 11 s.
                headers={"Retry-After": str(max(1, math.ceil(remaining_s - 1e-6)))},
            )

    def record_failure(self, client_addr: str) -> None:
        """Count one failed attempt from this address."""
        now = self._timer()
        with self._lock:
            window = self._windows.get(client_addr)
            if window is None or now >= window[0] + self._window_s:
                self._windows[client_addr] = (now, 1)
            else:
                self._windows[client_addr] = (window[0], window[1] + 1)


@dataclass(frozen=True)
class _Entry:
    record: KeyRecord
    context: TenantContext


class Authenticator:
    """Tenant API key -> TenantContext, with a TTL cache and a per-address failure throttle."""

    def __init__(
        self,
        store: KeyStore,
        settings: AuthSettings | None = None,
        *,
        throttle: FailureThrottle | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self.settings = settings or AuthSettings()
        self.throttle = throttle or FailureThrottle.from_settings(self.settings, timer=timer)
        self._cache: TTLCache[str, _Entry] = TTLCache(
            self.settings.cache_max_keys, ttl=self.settings.cache_ttl_s, timer=timer
        )
        self._lock = threading.Lock()

    def authenticate(
        self, authorization: str | None, client_addr: str, *, scope: KeyScope | None = None
    ) -> TenantContext:
        """The caller's context, or raise 401 / 403 / 429. May query the database on a cache miss."""
        parsed = self._precheck(authorization, client_addr)
        entry = self._cached(parsed.key_id) if parsed is not None else None
        if parsed is not None and entry is None:
            entry = self._load(parsed)
        return self._finish(parsed, entry, client_addr, scope)

    async def authenticate_async(
        self, authorization: str | None, client_addr: str, *, scope: KeyScope | None = None
    ) -> TenantContext:
        """`authenticate` for async code: cache hits inline, misses in the thread pool."""
        parsed = self._precheck(authorization, client_addr)
        entry = self._cached(parsed.key_id) if parsed is not None else None
        if parsed is not None and entry is None:
            entry = await run_in_threadpool(self._load, parsed)
        return self._finish(parsed, entry, client_addr, scope)

    def invalidate(self, key_id: str) -> None:
        """Forget a cached key (after revocation or rotation) so the next request re-reads it."""
        with self._lock:
            self._cache.pop(key_id, None)

    def invalidate_tenant(self, tenant: str) -> None:
        """Forget every cached key of a tenant (after a suspension, quota or priority change)."""
        with self._lock:
            for key_id in [k for k, e in self._cache.items() if e.record.tenant.name == tenant]:
                self._cache.pop(key_id, None)

    def clear(self) -> None:
        """Forget every cached key."""
        with self._lock:
            self._cache.clear()

    def _precheck(self, authorization: str | None, client_addr: str) -> ParsedKey | None:
        self.throttle.check(client_addr)
        token = bearer_token(authorization)
        return parse_key(token) if token is not None else None

    def _cached(self, key_id: str) -> _Entry | None:
        with self._lock:
            return self._cache.get(key_id)

    def _load(self, parsed: ParsedKey) -> _Entry | None:
        record = self._store.lookup_key(parsed.key_id)
        if record is None:
            return None  # unknown ids are not cached; the throttle bounds how often they are tried
        entry = _Entry(
            record, record.tenant.context(record.view.id, tuple(s.value for s in record.view.scopes))
        )
        with self._lock:
            self._cache[parsed.key_id] = entry
        now = self._store.now()
        if (
            self._store.hasher.verify(parsed.key, record.secret_hash)
            and record.view.state(now) is KeyState.ACTIVE
        ):
            # Written on cache misses only, so last_used_at is accurate to cache_ttl_s.
            try:
                self._store.touch_key(parsed.key_id, now)
            except SQLAlchemyError:
                log.warning("could not record the last use of API key %s", parsed.key_id, exc_info=True)
        return entry

    def _finish(
        self, parsed: ParsedKey | None, entry: _Entry | None, client_addr: str, scope: KeyScope | None
    ) -> TenantContext:
        now = self._store.now()
        if (
            parsed is None
            or entry is None
            or not self._store.hasher.verify(parsed.key, entry.record.secret_hash)
            or entry.record.view.state(now) is not KeyState.ACTIVE
        ):
            self.throttle.record_failure(client_addr)
            raise AuthenticationError(INVALID_KEY_MESSAGE)
        if entry.record.tenant.status is TenantStatus.SUSPENDED:
            raise PermissionDeniedError(SUSPENDED_MESSAGE, code="tenant_suspended")
        if scope is not None and scope not in entry.record.view.scopes:
            raise PermissionDeniedError(
                f"This API key does not have the '{scope.value}' scope.", code="missing_scope"
            )
        return entry.context


class AdminAuthenticator:
    """Checks the admin bearer token, separate from tenant keys.

    A configured token (WEIR_ADMIN_TOKEN) is the only one accepted when set; otherwise the
    token whose hash is stored (generated at first start) is. With neither, every admin request
    is refused. The stored hash is cached for `cache_ttl_s`, so `weir admin token reset`
    reaches running servers within that time.
    """

    def __init__(
        self,
        store: AdminTokenStore,
        configured_token: str | None,
        *,
        throttle: FailureThrottle | None = None,
        cache_ttl_s: float = 30.0,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._configured_hash = store.hasher.hash(configured_token) if configured_token else None
        self.throttle = throttle or FailureThrottle.from_settings(AuthSettings(), timer=timer)
        self._stored: TTLCache[str, str | None] = TTLCache(1, ttl=cache_ttl_s, timer=timer)
        self._lock = threading.Lock()

    def authenticate(self, authorization: str | None, client_addr: str) -> None:
        """Return if the header carries the admin token; raise 401 (or 429) otherwise."""
        self.throttle.check(client_addr)
        expected = self._expected_hash()
        if expected is _UNKNOWN:
            expected = self._load()
        self._finish(authorization, expected, client_addr)

    async def authenticate_async(self, authorization: str | None, client_addr: str) -> None:
        """`authenticate` for async code: the stored hash is loaded in the thread pool when stale."""
        self.throttle.check(client_addr)
        expected = self._expected_hash()
        if expected is _UNKNOWN:
            expected = await run_in_threadpool(self._load)
        self._finish(authorization, expected, client_addr)

    def invalidate(self) -> None:
        """Re-read the stored hash on the next request."""
        with self._lock:
            self._stored.clear()

    def _expected_hash(self) -> str | None:
        if self._configured_hash is not None:
            return self._configured_hash
        with self._lock:
            return self._stored.get("hash", _UNKNOWN)

    def _load(self) -> str | None:
        stored = self._store.admin_token_hash()
        with self._lock:
            self._stored["hash"] = stored
        return stored

    def _finish(self, authorization: str | None, expected: str | None, client_addr: str) -> None:
        token = bearer_token(authorization)
        if token is None or expected is None or not self._store.hasher.verify(token, expected):
            self.throttle.record_failure(client_addr)
            raise AuthenticationError(INVALID_ADMIN_MESSAGE, code="invalid_admin_token")


_UNKNOWN = "\0unknown"  # sentinel: the stored hash has not been read (None means none is stored)
