"""Chained, collision-resistant hashes of full KV blocks: the prefix-cache key.

hash(block i) = blake2b(hash(block i-1) || token ids of block i || extra keys of block i).
The root's extra keys pin everything that changes what a cached K/V means: model version,
tokenizer, RoPE configuration, KV dtype and the cache scope (tenant, or a shared scope).
A block computed under any other value of these can never be found.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CacheKeyRoot:
    """What, besides the tokens, a cached block depends on."""

    model_version: str
    tokenizer_fingerprint: str
    rope_fingerprint: str
    kv_dtype: str
    cache_scope: str

    def digest(self) -> bytes:
        h = hashlib.blake2b(digest_size=32, person=b"weir-root")
        for part in (
            self.model_version,
            self.tokenizer_fingerprint,
            self.rope_fingerprint,
            self.kv_dtype,
            self.cache_scope,
        ):
            data = part.encode()
            h.update(struct.pack("<I", len(data)))
            h.update(data)
        return h.digest()


def hash_block(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """Hash of one full block chained onto its parent's hash (or the root digest)."""
    h = hashlib.blake2b(parent, digest_size=32, person=b"weir-block")
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.digest()


def hash_blocks(
    root: bytes, token_ids: Sequence[int], block_size: int, start: int = 0, parent: bytes | None = None
) -> list[bytes]:
    """Hashes of every full block of `token_ids` from block index `start` on."""
    out: list[bytes] = []
    prev = root if parent is None else parent
    num_full = len(token_ids) // block_size
    for i in range(start, num_full):
        prev = hash_block(prev, token_ids[i * block_size : (i + 1) * block_size])
        out.append(prev)
    return out
