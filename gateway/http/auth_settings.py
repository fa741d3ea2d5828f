"""What both authenticators share: their settings, the refusal messages and the bearer header's parse."""

from __future__ import annotations

import math
from dataclasses import dataclass

INVALID_KEY_MESSAGE = "Invalid API key. Send a valid key as 'Authorization: Bearer <key>'."
INVALID_ADMIN_MESSAGE = "Invalid admin token. Send it as 'Authorization: Bearer <admin token>'."
SUSPENDED_MESSAGE = "This tenant is suspended. Contact the service administrator."
MAX_AUTH_HEADER_LEN = 1024


@dataclass(frozen=True)
class AuthSettings:
    """Auth cache, failure-throttle and database-timeout knobs."""

    cache_ttl_s: float = 30.0  # how long another replica's revocation can take to apply here
    cache_max_keys: int = 10_000
    # Failed attempts per window before 429: per presented key id (and per address for the
    # admin token, which has no id), and per address for tenant keys, a far higher bar since
    # every tenant behind one ingress or NAT shares it. A valid credential is never refused.
    max_failures: int = 20
    max_address_failures: int = 1000
    failure_window_s: float = 60.0
    max_tracked: int = 100_000  # key ids and addresses each; the oldest are forgotten past it
    # Lookups of ids that were not found, per window, before uncached ids are checked against the
    # set of stored ids instead of one query each: per client address, and for all together.
    max_unknown_lookups: int = 20
    max_total_unknown_lookups: int = 200
    known_ids_refresh_s: float = 1.0  # the set of stored ids is re-read at most this often
    lookup_timeout_s: float = 1.0  # an uncached key waits at most this on a locked database
    touch_timeout_s: float = 0.2  # writing last_used_at is best effort: it never holds a request

    def __post_init__(self) -> None:
        for name in (
            "cache_ttl_s",
            "failure_window_s",
            "lookup_timeout_s",
            "touch_timeout_s",
            "known_ids_refresh_s",
        ):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        for name in (
            "cache_max_keys",
            "max_failures",
            "max_address_failures",
            "max_tracked",
            "max_unknown_lookups",
            "max_total_unknown_lookups",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None if absent or not of that form."""
    if authorization is None or len(authorization) > MAX_AUTH_HEADER_LEN:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
        return None
    return token
