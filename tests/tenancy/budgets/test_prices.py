"""The price table: effective times, audit, one currency, spend on records never rewritten."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select

from tests.tenancy.clock import FakeClock
from weir.engine.request import Priority
from weir.tenancy.budgets.money import TokenPrices
from weir.tenancy.budgets.prices import PriceBook, PriceRepo, PriceSpec
from weir.tenancy.errors import FieldError
from weir.tenancy.repository.records import TenantSpec
from weir.tenancy.repository.repo import TenancyRepo
from weir.tenancy.store.enums import AuditAction, UsageStatus
from weir.tenancy.store.models import UsageRecord
from weir.tenancy.usage.usage_records import UsageRecordIn

P1 = TokenPrices(input=150_000, cached_input=75_000, output=600_000)
P2 = TokenPrices(input=300_000, cached_input=100_000, output=1_200_000)


@pytest.fixture
def prices(repo: TenancyRepo, clock: FakeClock) -> PriceRepo:
    repo.create_tenant(TenantSpec("acme", Priority.STANDARD, 1.0), actor="test")
    return PriceRepo(repo.db, clock=clock)


def _usage(
    rid: str, when: dt.datetime, *, version: str | None = "smol@v1", completion: int = 1000
) -> UsageRecordIn:
    return UsageRecordIn(
        request_id=rid, tenant_id="acme", key_id=None, model="smol", model_version=version,
        status=UsageStatus.COMPLETED, prompt_tokens=2000, completion_tokens=completion, cached_tokens=500,
        created_at=when,
    )  # fmt: skip


def _spends(repo: TenancyRepo) -> dict[str, tuple[int | None, str | None]]:
    with repo.db.transaction() as session:
        rows = session.execute(select(UsageRecord.request_id, UsageRecord.spend_micros, UsageRecord.currency))
        return {rid: (spend, cur) for rid, spend, cur in rows}


def test_spend_follows_the_price_in_effect_and_is_never_rewritten(
    repo: TenancyRepo, prices: PriceRepo, clock: FakeClock
) -> None:
    t0 = clock.now
    repo.record_usages([_usage("before-any-price", t0)])
    first = prices.set_price(PriceSpec("smol@v1", "USD", P1), actor="admin")
    assert first.effective_from == t0
    change = t0 + dt.timedelta(hours=1)
    prices.set_price(PriceSpec("smol@v1", "USD", P2, change), actor="admin")
    repo.record_usages([_usage("r1", t0 + dt.timedelta(minutes=5))])
    clock.advance(hours=2)
    repo.record_usages([_usage("r2", change), _usage("late", t0 + dt.timedelta(minutes=59))])
    # (1500 * 0.15 + 500 * 0.075 + 1000 * 0.6) USD / 1e6 tokens, in micro-units: 862.5 -> 863.
    expected = {
        "before-any-price": (None, None),
        "r1": (863, "USD"),
        "late": (863, "USD"),
        "r2": (1500 * 300_000 // 10**6 + 500 * 100_000 // 10**6 + 1000 * 1_200_000 // 10**6, "USD"),
    }
    assert _spends(repo) == expected
    # A later price, and a later (final) record of r1: r1 is priced at its own time, not now.
    clock.advance(hours=1)
    prices.set_price(PriceSpec("smol@v1", "USD", TokenPrices(9, 9, 9)), actor="admin")
    repo.record_usages([_usage("r1", t0 + dt.timedelta(minutes=5), completion=2000)])
    assert _spends(repo)["r1"] == (1463, "USD")  # 225 + 37.5 + 1200 = 1462.5 -> 1463
    assert _spends(repo)["r2"] == expected["r2"]


def test_a_price_in_the_past_is_refused(prices: PriceRepo, clock: FakeClock) -> None:
    with pytest.raises(FieldError) as caught:
        prices.set_price(PriceSpec("smol", "USD", P1, clock.now - dt.timedelta(seconds=1)), actor="a")
    assert caught.value.field == "effective_from"


def test_one_currency_and_one_price_per_model_and_time(prices: PriceRepo, clock: FakeClock) -> None:
    prices.set_price(PriceSpec("smol", "USD", P1), actor="a")
    with pytest.raises(FieldError) as caught:
        prices.set_price(PriceSpec("other", "EUR", P1), actor="a")
    assert caught.value.field == "currency"
    with pytest.raises(FieldError) as caught:
        prices.set_price(PriceSpec("smol", "USD", P2, clock.now), actor="a")
    assert caught.value.field == "effective_from"
    assert [p.prices for p in prices.list_prices()] == [P1]


def test_price_changes_are_audited(repo: TenancyRepo, prices: PriceRepo) -> None:
    prices.set_price(PriceSpec("smol@v1", "USD", P1), actor="admin-api 127.0.0.1")
    event = repo.list_audit(limit=1)[0]
    assert event.action == AuditAction.PRICE_SET and event.target == "smol@v1"
    assert event.details["input_per_million"] == "0.150000"
    assert event.details["output_per_million"] == "0.600000"


@pytest.mark.parametrize("model", ["", "a b", "x" * 200, "a@b@c", "tab\t"])
def test_bad_model_names(model: str) -> None:
    with pytest.raises(FieldError):
        PriceSpec(model, "USD", P1)


def test_price_book_prefers_the_version_and_knows_the_dearest() -> None:
    from weir.tenancy.budgets.prices import Price

    t = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    book = PriceBook(
        [
            Price(1, "smol", "USD", P1, t, t, "a"),
            Price(2, "smol@v2", "USD", P2, t + dt.timedelta(hours=1), t, "a"),
        ]
    )
    assert book.price_at("smol@v2", "smol", t) == Price(1, "smol", "USD", P1, t, t, "a")  # v2's not yet
    later = t + dt.timedelta(hours=2)
    price = book.price_at("smol@v2", "smol", later)
    assert price is not None and price.id == 2
    assert book.dearest(t) == P1
    assert book.dearest(later) == P2
    assert PriceBook([]).dearest(later) is None
    assert book.price_at(None, "smol", t - dt.timedelta(seconds=1)) is None
