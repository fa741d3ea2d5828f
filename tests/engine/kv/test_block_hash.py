"""Block hashes: every root key matters, chains depend on every earlier token, extra keys count."""

from __future__ import annotations

import dataclasses

from weir.engine.kv.block_hash import SHARED_SCOPE, CacheKeyRoot, hash_block, hash_blocks

ROOT = CacheKeyRoot("v1", "tok", "rope", "float32", "tenant-a")


def test_every_root_field_changes_the_digest() -> None:
    digests = {ROOT.digest()}
    for f in dataclasses.fields(CacheKeyRoot):
        digests.add(dataclasses.replace(ROOT, **{f.name: getattr(ROOT, f.name) + "x"}).digest())
    digests.add(dataclasses.replace(ROOT, cache_scope=SHARED_SCOPE).digest())
    assert len(digests) == len(dataclasses.fields(CacheKeyRoot)) + 2


def test_fields_are_length_prefixed() -> None:
    a = CacheKeyRoot("ab", "c", "r", "f", "s").digest()
    b = CacheKeyRoot("a", "bc", "r", "f", "s").digest()
    assert a != b


def test_chain_depends_on_every_earlier_block() -> None:
    root = ROOT.digest()
    one = hash_blocks(root, [1, 2, 3, 4, 5, 6], 2)
    two = hash_blocks(root, [9, 2, 3, 4, 5, 6], 2)
    assert len(one) == 3 and all(x != y for x, y in zip(one, two, strict=True))
    assert hash_blocks(root, [1, 2, 3, 4, 5, 6, 7], 2) == one  # partial blocks are not hashed
    assert hash_blocks(root, [1, 2, 3, 4, 5, 6], 2, start=1, parent=one[0]) == one[1:]


def test_extra_keys_change_the_block_and_everything_after() -> None:
    root = ROOT.digest()
    plain = hash_blocks(root, [1, 2, 3, 4], 2, start=1, parent=b"p")
    mixed = hash_blocks(root, [1, 2, 3, 4], 2, start=1, parent=b"p", first_extra=b"tenant")
    assert plain[0] != mixed[0]
    assert hash_block(b"p", [3, 4], b"tenant") == mixed[0]
