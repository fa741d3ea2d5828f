"""Store keys and sealed values: a value loads only under its own key, whole and unaltered."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given

from weir.engine.kv.store.codec import (
    MAC_BYTES,
    UnsealError,
    block_key,
    index_key,
    index_pattern,
    seal,
    unseal,
)

SECRET = b"k" * 32


@given(payload=st.binary(min_size=1, max_size=256))
def test_a_sealed_value_unseals_to_its_payload(payload: bytes) -> None:
    key = block_key("ns", b"\x01" * 32)
    assert unseal(SECRET, key, seal(SECRET, key, payload), len(payload)) == payload


@given(payload=st.binary(min_size=1, max_size=64), data=st.data())
def test_any_altered_byte_fails_the_mac(payload: bytes, data: st.DataObject) -> None:
    key = block_key("ns", b"\x02" * 32)
    value = bytearray(seal(SECRET, key, payload))
    i = data.draw(st.integers(0, len(value) - 1))
    value[i] ^= data.draw(st.integers(1, 255))
    assert unseal(SECRET, key, bytes(value), len(payload)) is UnsealError.BAD_MAC


def test_a_value_moved_to_another_key_or_sealed_under_another_secret_is_refused() -> None:
    a, b = block_key("ns", b"\x03" * 32), block_key("ns", b"\x04" * 32)
    value = seal(SECRET, a, b"kv bytes")
    assert unseal(SECRET, b, value, 8) is UnsealError.BAD_MAC
    assert unseal(b"o" * 32, a, value, 8) is UnsealError.BAD_MAC


def test_a_value_of_the_wrong_length_is_refused_before_its_mac() -> None:
    key = block_key("ns", b"\x05" * 32)
    value = seal(SECRET, key, b"12345678")
    assert unseal(SECRET, key, value, 9) is UnsealError.WRONG_LENGTH
    assert unseal(SECRET, key, value[:-1], 8) is UnsealError.WRONG_LENGTH
    assert unseal(SECRET, key, b"", 0) is UnsealError.WRONG_LENGTH
    assert len(value) == 8 + MAC_BYTES


def test_index_names_hex_encode_versions_and_scopes_so_patterns_cannot_glob() -> None:
    idx = index_key("ns", "v*1", "tenant[a]")
    assert b"*" not in idx and b"[" not in idx
    assert index_pattern("ns", "v*1", None) == b"ns:idx:" + b"v*1".hex().encode() + b":*"
    assert index_pattern("ns", None, "tenant[a]").endswith(b"tenant[a]".hex().encode())
