"""gateway/http/auth_settings.py: the bearer header's parse and the settings' bounds."""

from __future__ import annotations

import pytest

from weir.gateway.http.auth_settings import AuthSettings, bearer_token


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("BEARER abc") == "abc"
    for bad in (None, "", "Bearer", "Bearer ", "Token abc", "Bearer a b"):
        assert bearer_token(bad) is None


def test_auth_settings_validation() -> None:
    with pytest.raises(ValueError, match="cache_ttl_s"):
        AuthSettings(cache_ttl_s=0)
    with pytest.raises(ValueError, match="max_failures"):
        AuthSettings(max_failures=0)
    with pytest.raises(ValueError, match="max_address_failures"):
        AuthSettings(max_address_failures=0)
    with pytest.raises(ValueError, match="lookup_timeout_s"):
        AuthSettings(lookup_timeout_s=float("nan"))
