"""Money as integers: amounts in micro-units of a currency, prices per million tokens, spend.

No floats anywhere on a money path: an amount is an `int` of micro-units (1 USD = 1_000_000),
decimal text is parsed with `decimal.Decimal` and refused if it is finer than a micro-unit, and the
spend of a request is one integer division of an exact integer product, rounded half up (one
rounding per usage record; a report's totals are sums of those integers, so they equal the sum of
the records exactly).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from weir.tenancy.errors import FieldError

MICROS_PER_UNIT = 1_000_000  # micro-units in one unit of the currency
TOKENS_PER_PRICE = 1_000_000  # prices are per million tokens
# A price of at most a million currency units per million tokens: products stay far below 2**63.
MAX_PRICE_MICROS = 10**12
MAX_AMOUNT_MICROS = 2**62  # money budgets and spends
_CURRENCY = re.compile(r"[A-Z]{3}")
_AMOUNT_TEXT = re.compile(r"\d{1,19}(\.\d{1,6})?")


def validate_currency(value: object, field: str = "currency") -> str:
    """An ISO 4217-style code: three capital letters (`USD`, `EUR`)."""
    if not isinstance(value, str) or not _CURRENCY.fullmatch(value):
        raise FieldError(field, "must be a currency code of three capital letters, such as USD")
    return value


def parse_amount(text: str, field: str, *, maximum: int = MAX_AMOUNT_MICROS) -> int:
    """Decimal text in currency units (`0.15`, `12`) as micro-units; at most six decimals."""
    text = text.strip()
    if not _AMOUNT_TEXT.fullmatch(text):
        raise FieldError(field, f"must be a non-negative amount with at most 6 decimals, got {text[:40]!r}")
    try:
        micros = Decimal(text) * MICROS_PER_UNIT
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid decimals
        raise FieldError(field, f"is not a number: {text[:40]!r}") from None
    if micros != micros.to_integral_value() or micros > maximum:
        raise FieldError(field, f"must be at most {format_micros(maximum)}")
    return int(micros)


def format_micros(micros: int) -> str:
    """Micro-units as decimal text in currency units: 150000 -> `0.150000`."""
    sign = "-" if micros < 0 else ""
    units, frac = divmod(abs(micros), MICROS_PER_UNIT)
    return f"{sign}{units}.{frac:06d}"


def validate_micros(value: object, field: str, *, maximum: int = MAX_AMOUNT_MICROS) -> int:
    """An integer amount of micro-units in [0, maximum] (a bool is not an integer here)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise FieldError(field, f"must be an integer of micro-units in [0, {maximum}]")
    return value


@dataclass(frozen=True)
class TokenPrices:
    """Micro-units per million tokens: uncached input, cached input, output."""

    input: int
    cached_input: int
    output: int

    def __post_init__(self) -> None:
        for name in ("input", "cached_input", "output"):
            validate_micros(getattr(self, name), name, maximum=MAX_PRICE_MICROS)

    def spend(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> int:
        """The spend of one request in micro-units, rounded half up.

        Cached tokens are the part of the prompt served from the prefix cache (clamped to the
        prompt); the rest of the prompt is billed as input.
        """
        return _round_half_up(self._product(prompt_tokens, cached_tokens, completion_tokens))

    def most(self, prompt_tokens: int, completion_tokens: int) -> int:
        """The most a request can spend (every prompt token at the dearer of the two input
        prices, every output token), rounded up: what a money budget reserves before it runs."""
        product = (
            max(0, prompt_tokens) * max(self.input, self.cached_input)
            + max(0, completion_tokens) * self.output
        )
        return -(-product // TOKENS_PER_PRICE)

    def _product(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> int:
        prompt = max(0, prompt_tokens)
        cached = min(max(0, cached_tokens), prompt)
        return (
            (prompt - cached) * self.input
            + cached * self.cached_input
            + max(0, completion_tokens) * self.output
        )


def _round_half_up(product: int) -> int:
    return (product + TOKENS_PER_PRICE // 2) // TOKENS_PER_PRICE
