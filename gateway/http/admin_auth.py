"""The admin bearer token: checked apart from tenant keys, against the configured token or the stored hash."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from cachetools import TTLCache
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from weir.gateway.http.auth_settings import INVALID_ADMIN_MESSAGE, AuthSettings, bearer_token
from weir.gateway.http.errors import AuthenticationError, from_database_error
from weir.gateway.http.failure_throttle import FailureThrottle, refuse
from weir.tenancy.keys.keys import KeyHasher

log = logging.getLogger(__name__)


class AdminTokenStore(Protocol):
    """What the admin authenticator needs from the tenancy repository."""

    hasher: KeyHasher

    def admin_token_hash(self) -> str | None: ...


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
        """Return if the header carries the admin token; raise 401 (429 past the limit) otherwise."""
        expected = self._expected_hash()
        if expected is _UNKNOWN:
            expected = self._load_or_unavailable()
        self._finish(authorization, expected, client_addr)

    async def authenticate_async(self, authorization: str | None, client_addr: str) -> None:
        """`authenticate` for async code: the stored hash is loaded in the thread pool when stale."""
        expected = self._expected_hash()
        if expected is _UNKNOWN:
            expected = await run_in_threadpool(self._load_or_unavailable)
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

    def _load_or_unavailable(self) -> str | None:
        try:
            return self._load()
        except SQLAlchemyError as exc:
            log.warning("reading the stored admin token hash failed: %s", exc)
            raise from_database_error(exc) from exc

    def _load(self) -> str | None:
        stored = self._store.admin_token_hash()
        with self._lock:
            self._stored["hash"] = stored
        return stored

    def _finish(self, authorization: str | None, expected: str | None, client_addr: str) -> None:
        token = bearer_token(authorization)
        if token is None or expected is None or not self._store.hasher.verify(token, expected):
            error = AuthenticationError(INVALID_ADMIN_MESSAGE, code="invalid_admin_token")
            raise refuse(error, [(self.throttle, client_addr)])


_UNKNOWN = "\0unknown"  # sentinel: the stored hash has not been read (None means none is stored)
