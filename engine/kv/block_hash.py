"""Chained, collision-resistant hashes of full KV blocks: the prefix-cache key.

hash(block i) = blake2b(hash(block i-1) || token ids of block i || extra keys of block i).
The root's extra keys pin everything that changes what a cached K/V means: model version,
tokenizer, RoPE configuration, KV dtype, the cache scope (tenant, or the shared scope) and the
LoRA adapter (its name and weights digest; empty for the base model).
A block computed under any other value of these can never be found.

A request whose prompt begins with a registered shared prefix chains its first blocks from the
shared root; the first block after the shared part carries the tenant's root digest as its
extra key, so everything after a shared prefix is tenant-private again.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

# The scope of admin-registered shared prefixes. '<' and '>' are outside the characters a
# tenant's cache scope may use (weir.tenancy.repository.records.validate_cache_scope), and the engine refuses
# requests that name it, so no tenant can chain into the shared root by choosing a scope.
SHARED_SCOPE = "<shared>"


@dataclass(frozen=True)
class CacheKeyRoot:
    """What, besides the tokens, a cached block depends on."""

    model_version: str
    tokenizer_fingerprint: str
    rope_fingerprint: str
    kv_dtype: str
    cache_scope: str
    adapter: str = ""  # AdapterRef.cache_key; "" for the base model

    def digest(self) -> bytes:
        """The root of every hash chain under these keys (32 bytes)."""
        h = hashlib.blake2b(digest_size=32, person=b"weir-root")
        for part in (
            self.model_version,
            self.tokenizer_fingerprint,
            self.rope_fingerprint,
            self.kv_dtype,
            self.cache_scope,
            self.adapter,
        ):
            data = part.encode()
            # Length-prefixed, so ("ab", "c") and ("a", "bc") never collide.
            h.update(struct.pack("<I", len(data)))
            h.update(data)
        return h.digest()


def hash_block(parent: bytes, token_ids: Sequence[int], extra: bytes = b"") -> bytes:
    """Hash of one full block chained onto its parent's hash (or the root digest).

    `extra` holds the block's extra keys (a root digest where the chain changes scope).
    """
    h = hashlib.blake2b(parent, digest_size=32, person=b"weir-block")
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    if extra:
        h.update(b"\x00extra")
        h.update(extra)
    return h.digest()


def hash_blocks(
    root: bytes,
    token_ids: Sequence[int],
    block_size: int,
    start: int = 0,
    parent: bytes | None = None,
    first_extra: bytes = b"",
) -> list[bytes]:
    """Hashes of every full block of `token_ids` from block index `start` on.

    `parent` is the hash of block `start - 1` (the root when None); `first_extra` is mixed into
    the first hashed block only.
    """
    out: list[bytes] = []
    prev = root if parent is None else parent
    extra = first_extra
    num_full = len(token_ids) // block_size
    for i in range(start, num_full):
        prev = hash_block(prev, token_ids[i * block_size : (i + 1) * block_size], extra)
        extra = b""
        out.append(prev)
    return out
