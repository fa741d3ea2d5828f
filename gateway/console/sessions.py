"""Console sessions: a random id in a cookie -> a server-side record with its CSRF token.

Sessions live in this replica's memory: logout and expiry take effect at once, nothing secret
is derived from the admin token, and a restart logs everyone out (docs/decisions.md).
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import TTLCache

DEFAULT_SESSION_TTL_S = 8 * 3600.0
DEFAULT_MAX_SESSIONS = 1000


@dataclass(frozen=True)
class ConsoleSession:
    """One logged-in browser: its id (the cookie's value) and the token its forms must carry."""

    session_id: str = ""
    csrf_token: str = ""
    expires_at_s: float = 0.0

    def __repr__(self) -> str:  # the id and token are credentials: never in logs
        return "ConsoleSession(<redacted>)"

    def csrf_ok(self, token: str | None) -> bool:
        """Whether a submitted form's token is this session's (constant-time)."""
        return token is not None and hmac.compare_digest(token.encode(), self.csrf_token.encode())


class SessionStore:
    """Bounded, expiring console sessions; thread-safe.

    At most `max_sessions` are kept; past that the oldest are forgotten (their browsers log in
    again), so a flood of logins cannot grow memory.
    """

    def __init__(
        self,
        ttl_s: float = DEFAULT_SESSION_TTL_S,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        *,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        self.ttl_s = ttl_s
        self._timer = timer
        self._sessions: TTLCache[str, ConsoleSession] = TTLCache(max_sessions, ttl=ttl_s, timer=timer)
        self._lock = threading.Lock()

    def create(self) -> ConsoleSession:
        """A new session with fresh random id and CSRF token."""
        session = ConsoleSession(
            session_id=secrets.token_urlsafe(32),
            csrf_token=secrets.token_urlsafe(32),
            expires_at_s=self._timer() + self.ttl_s,
        )
        with self._lock:
            self._sessions[session.session_id] = session
        return session

    def get(self, session_id: str | None) -> ConsoleSession | None:
        """The live session with this id; None if unknown, expired or logged out."""
        if not session_id or len(session_id) > 128:
            return None
        with self._lock:
            return self._sessions.get(session_id)

    def end(self, session_id: str) -> None:
        """Log out: the id is refused from now on."""
        with self._lock:
            self._sessions.pop(session_id, None)

    @property
    def num_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)
