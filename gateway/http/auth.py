"""Who is calling: tenant API keys -> TenantContext, and the separate admin bearer token.

Lookups go through a TTL cache, so the database is hit once per key per `cache_ttl_s` on each
replica, not on every request. Revoking a key or changing a tenant through this replica's admin
API invalidates its cache at once; other replicas (and changes made with `weir admin
--database-url`) take effect within `cache_ttl_s`.

Every refusal of a key (missing, malformed, unknown, revoked, expired, wrong secret) is the same
401 with the same message, so a caller learns nothing about which it was. A suspended tenant
gets 403 (the key itself was fine).

The failure throttle never refuses a valid key: the key is checked first, and only a failed
attempt is counted and, past a limit, answered 429 (Retry-After) instead of 401. Failures are
counted per presented key id (a wrong secret for a real id counts against that id) and, with a
far higher bar, per client address. So a client without its key, or one guessing, cannot lock
out the other tenants behind the same address (an ingress, a NAT, a load tool on the machine).

Unknown key ids are paid for by their sender (issue 21): an id looked up and not found is
remembered (a negative TTL cache), and once one client address has had `max_unknown_lookups`
such lookups in the failure window, or all addresses together `max_total_unknown_lookups`, a
further uncached id is first checked against the set of every stored key id (one query, held
for `known_ids_refresh_s` and re-read at most that often), so a flood of random ids costs at most
one query per `known_ids_refresh_s`, not one each. A valid key is still never refused: its id is
in the set (a key issued on another replica less than `known_ids_refresh_s` ago may be refused
once).

A database that is locked or down never authenticates anyone it has not already: an uncached
key gets 503 `database_unavailable` within `lookup_timeout_s`; cached keys keep being served.

Revocation race: a lookup that started before a key or tenant change (revoke, rotate, suspend,
update) must not put what it read into the cache after the change invalidated it. Every
invalidation bumps a generation; a lookup caches its result only if the generation it read
before querying is still current.

`authenticate` is synchronous and may query the database on a cache miss; async code calls
`authenticate_async`, which answers cache hits inline and runs only misses in the thread pool,
one lookup per key id at a time (`weir.gateway.http.single_flight`): concurrent misses of one key
share it, each request still checking its own secret against what was read.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cachetools import TTLCache
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from weir.gateway.http.auth_settings import INVALID_KEY_MESSAGE, SUSPENDED_MESSAGE, AuthSettings, bearer_token
from weir.gateway.http.errors import (
    AuthenticationError,
    PermissionDeniedError,
    from_database_error,
)
from weir.gateway.http.failure_throttle import FailureThrottle, refuse
from weir.gateway.http.single_flight import SingleFlight
from weir.tenancy.context import TenantContext
from weir.tenancy.keys.keys import KeyHasher, ParsedKey, parse_key
from weir.tenancy.repository.records import KeyRecord
from weir.tenancy.store.enums import KeyScope, KeyState, TenantStatus

log = logging.getLogger(__name__)


class KeyStore(Protocol):
    """What the authenticator needs from the tenancy repository."""

    hasher: KeyHasher

    def now(self) -> dt.datetime: ...

    def lookup_key(self, key_id: str, *, timeout_s: float | None = None) -> KeyRecord | None: ...

    def key_ids(self, *, timeout_s: float | None = None) -> frozenset[str]: ...

    def touch_key(self, key_id: str, when: dt.datetime, *, timeout_s: float | None = None) -> None: ...


@dataclass(frozen=True)
class _Entry:
    record: KeyRecord
    context: TenantContext


class Authenticator:
    """Tenant API key -> TenantContext, with a TTL cache and a failure throttle.

    `throttle` counts failures per key id, `address_throttle` per client address; both only
    ever answer attempts that failed.
    """

    def __init__(
        self,
        store: KeyStore,
        settings: AuthSettings | None = None,
        *,
        throttle: FailureThrottle | None = None,
        address_throttle: FailureThrottle | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self.settings = settings or AuthSettings()
        self.throttle = throttle or FailureThrottle.from_settings(self.settings, timer=timer)
        self.address_throttle = address_throttle or FailureThrottle.for_addresses(self.settings, timer=timer)
        self._cache: TTLCache[str, _Entry] = TTLCache(
            self.settings.cache_max_keys, ttl=self.settings.cache_ttl_s, timer=timer
        )
        # Ids looked up and not found: a retried unknown id costs no second query within the TTL.
        self._unknown: TTLCache[str, bool] = TTLCache(
            self.settings.cache_max_keys, ttl=self.settings.cache_ttl_s, timer=timer
        )
        # Lookups that found nothing, per client address and in total (see the module docstring).
        settings = self.settings
        self._unknown_lookups = FailureThrottle(
            settings.max_unknown_lookups, settings.failure_window_s, settings.max_tracked, timer=timer
        )
        self._total_unknown_lookups = FailureThrottle(
            settings.max_total_unknown_lookups, settings.failure_window_s, 1, timer=timer
        )
        self._known_ids: TTLCache[str, frozenset[str]] = TTLCache(
            1, ttl=settings.known_ids_refresh_s, timer=timer
        )
        self._known_ids_lock = threading.Lock()  # one reader of the set at a time, the rest wait
        self.num_unknown_lookups = 0  # ids looked up and not found (a flood shows here)
        self._generation = 0  # bumped by every invalidation (see the module docstring)
        self._lock = threading.Lock()
        # A burst of requests with an uncached key sends one lookup (and one touch), not one each.
        self._lookups: SingleFlight[str, _Entry | None] = SingleFlight()

    def authenticate(
        self, authorization: str | None, client_addr: str, *, scope: KeyScope | None = None
    ) -> TenantContext:
        """The caller's context, or raise 401 / 403 / 429 / 503. May query the database on a miss."""
        parsed = self._parse(authorization)
        found = self._cached(parsed.key_id) if parsed is not None else _MISS
        if parsed is not None and found is _MISS:
            found = self._load_or_unavailable(parsed, client_addr)
        return self._finish(parsed, found, client_addr, scope)

    async def authenticate_async(
        self, authorization: str | None, client_addr: str, *, scope: KeyScope | None = None
    ) -> TenantContext:
        """`authenticate` for async code: cache hits inline, misses in the thread pool."""
        parsed = self._parse(authorization)
        found = self._cached(parsed.key_id) if parsed is not None else _MISS
        if parsed is not None and found is _MISS:
            key = parsed  # bound for the closure (mypy keeps the narrowing)
            with self._lock:
                generation = self._generation
            found = await self._lookups.run(
                key.key_id, generation, lambda: run_in_threadpool(self._load_or_unavailable, key, client_addr)
            )
        return self._finish(parsed, found, client_addr, scope)

    def invalidate(self, key_id: str) -> None:
        """Forget a cached key (after revocation or rotation) so the next request re-reads it."""
        with self._lock:
            self._generation += 1
            self._cache.pop(key_id, None)

    def invalidate_tenant(self, tenant: str) -> None:
        """Forget every cached key of a tenant (after a suspension, quota or priority change)."""
        with self._lock:
            self._generation += 1
            for key_id in [k for k, e in self._cache.items() if e.record.tenant.name == tenant]:
                self._cache.pop(key_id, None)

    def clear(self) -> None:
        """Forget every cached key."""
        with self._lock:
            self._generation += 1
            self._cache.clear()
            self._unknown.clear()

    @staticmethod
    def _parse(authorization: str | None) -> ParsedKey | None:
        token = bearer_token(authorization)
        return parse_key(token) if token is not None else None

    def _cached(self, key_id: str) -> _Entry | None | _Miss:
        with self._lock:
            entry = self._cache.get(key_id)
            if entry is not None:
                return entry
            return None if key_id in self._unknown else _MISS

    def _load_or_unavailable(self, parsed: ParsedKey, client_addr: str) -> _Entry | None:
        try:
            if self._flooded(client_addr) and parsed.key_id not in self._stored_key_ids():
                return None  # unknown, answered from the set of stored ids: no query of its own
            entry = self._load(parsed)
            if entry is None:
                with self._lock:
                    self.num_unknown_lookups += 1
                self._unknown_lookups.record_failure(client_addr)
                self._total_unknown_lookups.record_failure("")
            return entry
        except SQLAlchemyError as exc:
            # Fail closed: nobody the cache does not already know is let in without the database.
            log.warning("auth lookup of API key %s failed: %s", parsed.key_id, exc)
            raise from_database_error(exc) from exc

    def _flooded(self, client_addr: str) -> bool:
        """Whether this address, or everyone, has used up the lookups of unknown ids."""
        return (
            self._unknown_lookups.blocked(client_addr) is not None
            or self._total_unknown_lookups.blocked("") is not None
        )

    def _stored_key_ids(self) -> frozenset[str]:
        """Every stored key id, re-read at most once per `known_ids_refresh_s`."""
        with self._known_ids_lock:
            ids = self._known_ids.get("ids")
            if ids is None:
                ids = self._store.key_ids(timeout_s=self.settings.lookup_timeout_s)
                self._known_ids["ids"] = ids
            return ids

    def _load(self, parsed: ParsedKey) -> _Entry | None:
        with self._lock:
            generation = self._generation
        record = self._store.lookup_key(parsed.key_id, timeout_s=self.settings.lookup_timeout_s)
        if record is None:
            with self._lock:
                if self._generation == generation:
                    self._unknown[parsed.key_id] = True
            return None
        entry = _Entry(
            record,
            record.tenant.context(
                record.view.id, tuple(s.value for s in record.view.scopes), record.view.limits
            ),
        )
        with self._lock:
            # An invalidation since the lookup began may have made what was read stale: use it
            # for this request only (it started before the change), never cache it.
            if self._generation == generation:
                self._cache[parsed.key_id] = entry
        now = self._store.now()
        if (
            self._store.hasher.verify(parsed.key, record.secret_hash)
            and record.view.state(now) is KeyState.ACTIVE
        ):
            # Written on cache misses only, so last_used_at is accurate to cache_ttl_s.
            try:
                self._store.touch_key(parsed.key_id, now, timeout_s=self.settings.touch_timeout_s)
            except SQLAlchemyError as exc:  # expected while the database is busy: one line, no trace
                log.warning("could not record the last use of API key %s: %s", parsed.key_id, exc)
        return entry

    def _finish(
        self,
        parsed: ParsedKey | None,
        found: _Entry | None | _Miss,
        client_addr: str,
        scope: KeyScope | None,
    ) -> TenantContext:
        now = self._store.now()
        entry = found if isinstance(found, _Entry) else None
        if (
            parsed is None
            or entry is None
            or not self._store.hasher.verify(parsed.key, entry.record.secret_hash)
            or entry.record.view.state(now) is not KeyState.ACTIVE
        ):
            subjects = [(self.address_throttle, client_addr)]
            if parsed is not None:
                subjects.insert(0, (self.throttle, parsed.key_id))
            raise refuse(AuthenticationError(INVALID_KEY_MESSAGE), subjects)
        if entry.record.tenant.status is TenantStatus.SUSPENDED:
            raise PermissionDeniedError(SUSPENDED_MESSAGE, code="tenant_suspended")
        if scope is not None and scope not in entry.record.view.scopes:
            raise PermissionDeniedError(
                f"This API key does not have the '{scope.value}' scope.", code="missing_scope"
            )
        return entry.context


class _Miss:
    """Sentinel type: the key id is in neither cache, so the database must be asked."""


_MISS = _Miss()
