"""Integer money: decimal text to micro-units and back, spend rounded once per record."""

from __future__ import annotations

from fractions import Fraction

import hypothesis.strategies as st
import pytest
from hypothesis import given

from weir.tenancy.budgets.money import (
    MAX_PRICE_MICROS,
    TokenPrices,
    format_micros,
    parse_amount,
    validate_currency,
    validate_micros,
)
from weir.tenancy.errors import FieldError

prices = st.builds(
    TokenPrices,
    input=st.integers(0, MAX_PRICE_MICROS),
    cached_input=st.integers(0, MAX_PRICE_MICROS),
    output=st.integers(0, MAX_PRICE_MICROS),
)
tokens = st.integers(0, 10**9)


@given(micros=st.integers(0, 2**62))
def test_format_and_parse_are_inverse(micros: int) -> None:
    assert parse_amount(format_micros(micros), "x") == micros


@pytest.mark.parametrize(("text", "micros"), [("0.15", 150_000), ("12", 12_000_000), ("0.000001", 1)])
def test_parse_amount(text: str, micros: int) -> None:
    assert parse_amount(text, "x") == micros


@pytest.mark.parametrize(
    "text", ["-1", "0.0000001", "1e3", "NaN", "inf", "", " ", "1.", ".5", "1,5", "0x10", "9" * 30]
)
def test_bad_amounts_name_the_field(text: str) -> None:
    with pytest.raises(FieldError) as caught:
        parse_amount(text, "input")
    assert caught.value.field == "input"


@given(p=prices, prompt=tokens, cached=tokens, completion=tokens)
def test_spend_is_the_exact_amount_rounded_half_up(
    p: TokenPrices, prompt: int, cached: int, completion: int
) -> None:
    cached = min(cached, prompt)
    exact = Fraction((prompt - cached) * p.input + cached * p.cached_input + completion * p.output, 10**6)
    spend = p.spend(prompt, cached, completion)
    assert isinstance(spend, int)
    assert spend - Fraction(1, 2) <= exact < spend + Fraction(1, 2)
    # The reservation bound covers any real spend of the same request.
    assert p.most(prompt, completion) >= spend >= 0


def test_cached_tokens_are_clamped_to_the_prompt() -> None:
    p = TokenPrices(1_000_000, 0, 0)
    assert p.spend(10, 50, 0) == 0
    assert p.spend(10, -3, 0) == 10


@pytest.mark.parametrize("bad", [-1, True, 1.5, "5", MAX_PRICE_MICROS + 1])
def test_prices_are_integers_in_range(bad: object) -> None:
    with pytest.raises(FieldError):
        TokenPrices(bad, 0, 0)  # type: ignore[arg-type]
    with pytest.raises(FieldError):
        validate_micros(bad, "x", maximum=MAX_PRICE_MICROS)


@pytest.mark.parametrize("bad", ["usd", "US", "USDT", "", 3, None, "U$D"])
def test_currency_codes(bad: object) -> None:
    assert validate_currency("EUR") == "EUR"
    with pytest.raises(FieldError):
        validate_currency(bad)
