"""Keys and sealed values of the shared KV store tier (plain Python, no torch, no I/O).

A block is stored under `<namespace>:kv:<chained block hash, hex>`. The chained hash already
carries the model version, tokenizer, RoPE config, KV dtype, adapter and cache scope
(`weir.engine.kv.block_hash`), so a key names exactly one block's meaning; the namespace keeps
deployments sharing one store apart.

The value is the block's KV bytes (every layer, as `weir.engine.kv.store.tensors` packs
them) followed by an HMAC-SHA256 under the server's secret over the length-prefixed key and the
bytes. A value of the wrong length, altered, moved to another key or written by anyone without
the secret fails `unseal` and is never loaded.

Each (model version, cache scope) has an index, a sorted set of its keys by write time, under
`<namespace>:idx:<version hex>:<scope hex>`: it counts and caps the scope's bytes, evicts the
scope's oldest entries first and lets a flush find a tenant's or a version's keys. Hex keeps
the glob characters of a SCAN pattern out of the names.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from dataclasses import dataclass

MAC_BYTES = 32


class UnsealError(enum.Enum):
    """Why a stored value was refused."""

    WRONG_LENGTH = "wrong_length"
    BAD_MAC = "bad_mac"


@dataclass(frozen=True)
class StoreWrite:
    """One block to write: its key, and the index (version and scope) that accounts for it."""

    key: bytes
    index_key: bytes
    scope: str


@dataclass(frozen=True)
class FetchResult:
    """What one fetch found: the verified payloads of the chain's leading blocks, in order."""

    ticket: int
    payloads: tuple[bytes, ...]
    num_asked: int
    failed: bool  # the store could not be asked (breaker open, error, timeout)


def block_key(namespace: str, block_hash: bytes) -> bytes:
    return f"{namespace}:kv:{block_hash.hex()}".encode()


def index_key(namespace: str, model_version: str, scope: str) -> bytes:
    return f"{namespace}:idx:{model_version.encode().hex()}:{scope.encode().hex()}".encode()


def index_pattern(namespace: str, model_version: str | None, scope: str | None) -> bytes:
    """A SCAN pattern for the indexes of a version and/or a scope (None: any)."""
    version = "*" if model_version is None else model_version.encode().hex()
    part = "*" if scope is None else scope.encode().hex()
    return f"{namespace}:idx:{version}:{part}".encode()


def _mac(secret: bytes, key: bytes, payload: bytes) -> bytes:
    m = hmac.new(secret, struct.pack("<I", len(key)), hashlib.sha256)
    m.update(key)
    m.update(payload)
    return m.digest()


def seal(secret: bytes, key: bytes, payload: bytes) -> bytes:
    """The stored value of `payload` under `key`: the bytes, then their MAC."""
    return payload + _mac(secret, key, payload)


def unseal(secret: bytes, key: bytes, value: bytes, payload_bytes: int) -> bytes | UnsealError:
    """The payload of a stored value, or why it is refused (never trust a value that fails)."""
    if len(value) != payload_bytes + MAC_BYTES:
        return UnsealError.WRONG_LENGTH
    payload, tag = value[:payload_bytes], value[payload_bytes:]
    if not hmac.compare_digest(tag, _mac(secret, key, payload)):
        return UnsealError.BAD_MAC
    return payload
