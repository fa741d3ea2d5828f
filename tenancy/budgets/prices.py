"""The price table: prices of model versions per million tokens, each effective from a time.

A price names a model version (`name@version`) or a model (`name`: every version without a price
of its own). The price of a usage record is the one of its model version, else of its model,
whose `effective_from` is the latest at or before the record's `created_at`. Rows are only added:
a price change is a new row from its effective time, which may not be in the past, so the spend
of a record already written (`apply_spend`, in the same transaction as the record) is never
rewritten. One currency per deployment: the first price fixes it (spend totals add up).
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from weir.tenancy.budgets.money import TokenPrices, format_micros, validate_currency
from weir.tenancy.errors import FieldError
from weir.tenancy.store.audit import AuditTrail
from weir.tenancy.store.db import Database
from weir.tenancy.store.enums import AuditAction
from weir.tenancy.store.models import MODEL_VERSION_ID_LEN, ModelPrice


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def validate_price_model(value: object) -> str:
    """A model name or `name@version`: 1-193 printable characters without spaces."""
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= MODEL_VERSION_ID_LEN
        or not value.isprintable()
        or any(c.isspace() for c in value)
        or value.count("@") > 1
    ):
        raise FieldError(
            "model", f"must be a model name or name@version of 1-{MODEL_VERSION_ID_LEN} characters"
        )
    return value


@dataclass(frozen=True)
class PriceSpec:
    """A new price: per million tokens, in micro-units of `currency`; None: effective now."""

    model: str
    currency: str
    prices: TokenPrices
    effective_from: dt.datetime | None = None

    def __post_init__(self) -> None:
        validate_price_model(self.model)
        validate_currency(self.currency)
        if self.effective_from is not None and self.effective_from.tzinfo is None:
            raise FieldError("effective_from", "must carry a time zone")


@dataclass(frozen=True)
class Price:
    """A stored price."""

    id: int
    model: str
    currency: str
    prices: TokenPrices
    effective_from: dt.datetime
    created_at: dt.datetime
    created_by: str


def _price(row: ModelPrice) -> Price:
    return Price(
        id=row.id,
        model=row.model,
        currency=row.currency,
        prices=TokenPrices(row.input_micros, row.cached_input_micros, row.output_micros),
        effective_from=row.effective_from,
        created_at=row.created_at,
        created_by=row.created_by,
    )


class PriceBook:
    """Prices by model, each model's sorted by effective time: which price applied when."""

    def __init__(self, prices: Iterable[Price]) -> None:
        by_model: dict[str, list[Price]] = {}
        for price in prices:
            by_model.setdefault(price.model, []).append(price)
        self._by_model = {m: sorted(ps, key=lambda p: p.effective_from) for m, ps in by_model.items()}
        self._starts = {m: [p.effective_from for p in ps] for m, ps in self._by_model.items()}

    def __bool__(self) -> bool:
        return bool(self._by_model)

    def _at(self, model: str, when: dt.datetime) -> Price | None:
        starts = self._starts.get(model)
        if not starts:
            return None
        i = bisect.bisect_right(starts, when)
        return self._by_model[model][i - 1] if i else None

    def price_at(self, model_version: str | None, model: str, when: dt.datetime) -> Price | None:
        """The price of a record: its version's, else its model's (the name before `@`)."""
        if model_version is not None:
            found = self._at(model_version, when) or self._at(model_version.partition("@")[0], when)
            if found is not None:
                return found
        return self._at(model, when)

    def dearest(self, when: dt.datetime) -> TokenPrices | None:
        """The dearest price in effect at `when` of any model, per part (None: no price yet)."""
        found = [p.prices for name in self._by_model if (p := self._at(name, when)) is not None]
        if not found:
            return None
        return TokenPrices(
            max(p.input for p in found), max(p.cached_input for p in found), max(p.output for p in found)
        )


def load_price_book(session: Session, models: Iterable[str] | None = None) -> PriceBook:
    """The prices of `models` (names and name@version; their base names too), or all of them."""
    query = select(ModelPrice)
    if models is not None:
        names = set(models)
        names |= {m.partition("@")[0] for m in names}
        query = query.where(ModelPrice.model.in_(sorted(names)))
    return PriceBook(_price(r) for r in session.scalars(query))


def apply_spend(session: Session, rows: Sequence[dict[str, object]]) -> None:
    """Set `spend_micros`, `currency` and `price_id` of usage rows (`weir.tenancy.usage.usage.usage_row`)
    from the price in effect at each row's `created_at`, in the transaction that writes them."""
    models = {str(r["model"]) for r in rows} | {str(r["model_version"]) for r in rows if r["model_version"]}
    book = load_price_book(session, models)
    for row in rows:
        created_at = row["created_at"]
        assert isinstance(created_at, dt.datetime)
        version = row["model_version"]
        price = book.price_at(version if isinstance(version, str) else None, str(row["model"]), created_at)
        if price is None:
            row.update(spend_micros=None, currency=None, price_id=None)
            continue
        row.update(
            spend_micros=price.prices.spend(
                _int(row["prompt_tokens"]), _int(row["cached_tokens"]), _int(row["completion_tokens"])
            ),
            currency=price.currency,
            price_id=price.id,
        )


def _int(value: object) -> int:
    assert isinstance(value, int)
    return value


class PriceRepo:
    """Prices over one `Database`; every change is audited in its transaction."""

    def __init__(self, db: Database, *, clock: Callable[[], dt.datetime] = utc_now) -> None:
        self.db = db
        self._clock = clock

    def set_price(self, spec: PriceSpec, *, actor: str) -> Price:
        """Add a price from `spec.effective_from` (now if None; never in the past)."""
        now = self._clock()
        effective = spec.effective_from.astimezone(dt.UTC) if spec.effective_from is not None else now
        if effective < now:
            raise FieldError("effective_from", "must not be in the past: recorded spend is never rewritten")
        try:
            with self.db.transaction() as session:
                other = session.scalars(
                    select(ModelPrice.currency).where(ModelPrice.currency != spec.currency).limit(1)
                ).first()
                if other is not None:
                    raise FieldError(
                        "currency",
                        f"prices are in {other}; one currency per deployment (spend totals add up)",
                    )
                row = ModelPrice(
                    model=spec.model,
                    currency=spec.currency,
                    input_micros=spec.prices.input,
                    cached_input_micros=spec.prices.cached_input,
                    output_micros=spec.prices.output,
                    effective_from=effective,
                    created_at=now,
                    created_by=actor[:128],
                )
                session.add(row)
                session.flush()
                AuditTrail(session, now, actor).record(
                    AuditAction.PRICE_SET,
                    target=spec.model[:128],
                    details={
                        "price_id": row.id,
                        "currency": spec.currency,
                        "input_per_million": format_micros(spec.prices.input),
                        "cached_input_per_million": format_micros(spec.prices.cached_input),
                        "output_per_million": format_micros(spec.prices.output),
                        "effective_from": effective.isoformat(),
                    },
                )
                return _price(row)
        except IntegrityError:
            raise FieldError(
                "effective_from", f"{spec.model} already has a price from {effective.isoformat()}"
            ) from None

    def list_prices(self, model: str | None = None) -> list[Price]:
        """Every price (of `model`, if given), by model then effective time."""
        with self.db.transaction() as session:
            query = select(ModelPrice).order_by(ModelPrice.model, ModelPrice.effective_from)
            if model is not None:
                query = query.where(ModelPrice.model == model)
            return [_price(r) for r in session.scalars(query)]

    def price_book(self) -> PriceBook:
        with self.db.transaction() as session:
            return load_price_book(session)
