"""Key format, parsing and hashing."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from weir.tenancy.keys.keys import (
    ADMIN_TOKEN_PREFIX,
    KEY_PREFIX,
    KeyHasher,
    generate_admin_token,
    generate_key,
    is_public_id,
    key_prefix,
    parse_key,
)

BASE32 = "abcdefghijklmnopqrstuvwxyz234567"


def test_generated_key_has_the_documented_format_and_256_bit_secret() -> None:
    parsed = generate_key()
    assert parsed.key.startswith(KEY_PREFIX + parsed.key_id + "-")
    secret = parsed.key.removeprefix(key_prefix(parsed.key_id))
    assert len(secret) * 5 >= 256  # base32: 5 bits per character
    assert set(secret) <= set(BASE32)
    assert is_public_id(parsed.key_id)
    assert parse_key(parsed.key) == parsed


def test_generated_keys_and_ids_are_unique() -> None:
    keys = [generate_key() for _ in range(200)]
    assert len({k.key for k in keys}) == 200
    assert len({k.key_id for k in keys}) == 200


def test_parsed_key_repr_hides_the_secret() -> None:
    parsed = generate_key()
    assert parsed.key not in repr(parsed)
    assert parsed.key_id in repr(parsed)


def test_admin_token_never_parses_as_a_tenant_key() -> None:
    token = generate_admin_token()
    assert token.startswith(ADMIN_TOKEN_PREFIX)
    assert parse_key(token) is None


@given(st.text(max_size=120))
def test_parse_key_accepts_only_the_exact_format(text: str) -> None:
    parsed = parse_key(text)
    if parsed is not None:
        assert parsed.key == text
        assert text == f"{KEY_PREFIX}{parsed.key_id}-{text.rsplit('-', 1)[1]}"


@given(st.data())
def test_any_single_character_change_outside_base32_is_refused(data: st.DataObject) -> None:
    key = generate_key().key
    position = data.draw(st.integers(len(KEY_PREFIX), len(key) - 1))
    if key[position] == "-":
        return
    bad = data.draw(st.sampled_from(string.ascii_uppercase + "018_=+/ "))
    assert parse_key(key[:position] + bad + key[position + 1 :]) is None
    assert parse_key(key[:position]) is None  # truncated
    assert parse_key(key + "a") is None  # extended


def test_hasher_is_keyed_by_the_pepper_and_verifies() -> None:
    key = generate_key().key
    a, b = KeyHasher(b"pepper-a"), KeyHasher(b"pepper-b")
    digest = a.hash(key)
    assert len(digest) == 64 and set(digest) <= set("0123456789abcdef")
    assert digest == a.hash(key)
    assert digest != b.hash(key)
    assert a.verify(key, digest)
    assert not b.verify(key, digest)
    assert not a.verify(key + "x", digest)
    assert "pepper-a" not in repr(a)


def test_hasher_from_settings_pepper() -> None:
    key = generate_key().key
    assert KeyHasher.from_pepper("p").hash(key) == KeyHasher(b"p").hash(key)
    assert KeyHasher.from_pepper(None).hash(key) == KeyHasher().hash(key)
