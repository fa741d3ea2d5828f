"""API key and admin token format, generation and hashing.

A tenant key is `sk-weir-<public id>-<secret>`:

- the public id (16 base32 characters, 80 random bits) is the database primary key, safe to log
  and to show in listings;
- the secret (52 base32 characters, 256 random bits from `secrets`) is shown once, at creation.

Only `HMAC-SHA256(pepper, whole key)` is stored. The pepper is a server-side secret kept outside
the database (settings), so a stolen database alone does not allow offline checks of candidate
keys. Changing the pepper invalidates every stored key and the stored admin token.
Keys carry 256 bits of entropy, so a fast hash is enough: there is nothing to brute-force.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field

KEY_PREFIX = "sk-weir-"
ADMIN_TOKEN_PREFIX = "weir-admin-"
PUBLIC_ID_BYTES = 10  # 80 bits: 16 base32 characters; unique ids, not a secret
SECRET_BYTES = 32  # 256 bits: 52 base32 characters

_PUBLIC_ID_CHARS = 16
_SECRET_CHARS = 52
_KEY_RE = re.compile(rf"sk-weir-([a-z2-7]{{{_PUBLIC_ID_CHARS}}})-([a-z2-7]{{{_SECRET_CHARS}}})")
PUBLIC_ID_RE = re.compile(rf"[a-z2-7]{{{_PUBLIC_ID_CHARS}}}")
_MAX_KEY_LEN = len(KEY_PREFIX) + _PUBLIC_ID_CHARS + 1 + _SECRET_CHARS


def _random_base32(num_bytes: int) -> str:
    return base64.b32encode(secrets.token_bytes(num_bytes)).decode("ascii").rstrip("=").lower()


@dataclass(frozen=True)
class ParsedKey:
    """A syntactically valid tenant key split into its public id and the whole key."""

    key_id: str
    key: str = field(repr=False)  # the whole key, hashed as one string


def parse_key(key: str) -> ParsedKey | None:
    """Split a presented key; None when it is not of the tenant-key format at all."""
    if len(key) != _MAX_KEY_LEN:
        return None
    match = _KEY_RE.fullmatch(key)
    if match is None:
        return None
    return ParsedKey(key_id=match.group(1), key=key)


def is_public_id(text: str) -> bool:
    """Whether `text` has the shape of a key's public id (used to validate path parameters)."""
    return PUBLIC_ID_RE.fullmatch(text) is not None


def key_prefix(key_id: str) -> str:
    """The displayable, non-secret start of a key: `sk-weir-<public id>-`."""
    return f"{KEY_PREFIX}{key_id}-"


def generate_key() -> ParsedKey:
    """A fresh tenant key with a random public id and a 256-bit secret."""
    key_id = _random_base32(PUBLIC_ID_BYTES)
    key = f"{KEY_PREFIX}{key_id}-{_random_base32(SECRET_BYTES)}"
    return ParsedKey(key_id=key_id, key=key)


def generate_admin_token() -> str:
    """A fresh admin token. Its format never parses as a tenant key, so it cannot be used as one."""
    return ADMIN_TOKEN_PREFIX + _random_base32(SECRET_BYTES)


class KeyHasher:
    """Hashes keys and tokens with HMAC-SHA256 under a server pepper; verifies in constant time."""

    def __init__(self, pepper: bytes = b"") -> None:
        # An empty pepper degrades to a keyed hash with a public key, i.e. plain SHA-256 strength.
        self._pepper = pepper

    @classmethod
    def from_pepper(cls, pepper: str | bytes | None) -> KeyHasher:
        """A hasher from the configured pepper (settings give a string; None means none)."""
        if pepper is None:
            return cls()
        return cls(pepper.encode("utf-8") if isinstance(pepper, str) else pepper)

    def __repr__(self) -> str:
        return "KeyHasher(pepper=<hidden>)"

    def hash(self, secret: str) -> str:
        """The stored form of a key or token: 64 lower-case hex characters."""
        return hmac.new(self._pepper, secret.encode("utf-8"), hashlib.sha256).hexdigest()

    def verify(self, secret: str, stored_hash: str) -> bool:
        """Whether `secret` hashes to `stored_hash`, compared in constant time."""
        return hmac.compare_digest(self.hash(secret).encode("ascii"), stored_hash.encode("ascii"))
