"""The admin API's bodies for prices and window budgets, declared once as pydantic v2 models.

    POST   /admin/v1/prices          PriceBody -> PriceOut (201)
    GET    /admin/v1/prices          ?model= -> {"object": "list", "data": [PriceOut, ...]}
    PUT    /admin/v1/budgets         BudgetBody -> BudgetOut (create, or change that window's limits)
    GET    /admin/v1/budgets         ?tenant= -> {"object": "list", "data": [BudgetOut, ...]}
    DELETE /admin/v1/budgets/{id}    -> BudgetOut

Money in JSON is never a JSON number (a float to most parsers): prices are decimal text in
currency units per million tokens (`"0.15"`), answered with the exact micro-units beside them.
Budget limits are integers in the budget's unit: tokens, or micro-units of the currency.
Validation, the OpenAPI schemas and the conversions to `tenancy` records derive from these models.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from weir.tenancy.budgets.budget_windows import MAX_ROLLING_S, MAX_TIME_ZONE_LEN, WindowKind
from weir.tenancy.budgets.money import (
    MAX_AMOUNT_MICROS,
    MAX_PRICE_MICROS,
    TokenPrices,
    format_micros,
    parse_amount,
)
from weir.tenancy.budgets.prices import Price, PriceSpec
from weir.tenancy.budgets.window_budget_records import Budget, BudgetSpec, BudgetUnit, window_spec
from weir.tenancy.errors import FieldError
from weir.tenancy.parsing import parse_model
from weir.tenancy.store.models import MODEL_VERSION_ID_LEN

JsonObject = dict[str, Any]
Amount = Annotated[str, Field(min_length=1, max_length=32, examples=["0.15"])]
Limit = Annotated[int | None, Field(default=None, ge=1, le=MAX_AMOUNT_MICROS, strict=True)]


class PriceBody(BaseModel):
    """A new price of a model version (`name@version`) or of a model's versions (`name`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Annotated[str, Field(min_length=1, max_length=MODEL_VERSION_ID_LEN)]
    currency: Annotated[str, Field(pattern=r"^[A-Z]{3}$")] = "USD"
    input_per_million: Amount
    cached_input_per_million: Amount | None = None  # None: the input price
    output_per_million: Amount
    effective_from: dt.datetime | None = None  # None: now; never in the past

    def spec(self) -> PriceSpec:
        def micros(text: str, field: str) -> int:
            return parse_amount(text, field, maximum=MAX_PRICE_MICROS)

        input_ = micros(self.input_per_million, "input_per_million")
        cached = self.cached_input_per_million
        prices = TokenPrices(
            input=input_,
            cached_input=input_ if cached is None else micros(cached, "cached_input_per_million"),
            output=micros(self.output_per_million, "output_per_million"),
        )
        if self.effective_from is not None and self.effective_from.tzinfo is None:
            raise FieldError("effective_from", "must carry a time zone, e.g. 2030-01-01T00:00:00Z")
        return PriceSpec(self.model, self.currency, prices, self.effective_from)


class PriceOut(BaseModel):
    object: Literal["price"] = "price"
    id: int
    model: str
    currency: str
    input_per_million: str
    cached_input_per_million: str
    output_per_million: str
    input_micros_per_million: int
    cached_input_micros_per_million: int
    output_micros_per_million: int
    effective_from: str
    created_at: str
    created_by: str


class BudgetBody(BaseModel):
    """A budget of a tenant (no `key_id`) or of one of its keys over a window."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: Annotated[str, Field(min_length=1, max_length=64)]
    key_id: Annotated[str | None, Field(default=None, min_length=1, max_length=32)] = None
    unit: BudgetUnit
    window: WindowKind
    time_zone: Annotated[str, Field(min_length=1, max_length=MAX_TIME_ZONE_LEN)] = "UTC"
    rolling_s: Annotated[int | None, Field(default=None, ge=1, le=MAX_ROLLING_S, strict=True)] = None
    soft_limit: Limit = None
    hard_limit: Limit = None

    def spec(self) -> BudgetSpec:
        return BudgetSpec(
            self.tenant,
            self.key_id,
            self.unit,
            window_spec(self.window.value, self.time_zone, self.rolling_s),
            self.soft_limit,
            self.hard_limit,
        )


class BudgetOut(BaseModel):
    object: Literal["budget"] = "budget"
    id: int
    tenant: str
    key_id: str | None
    unit: BudgetUnit
    window: WindowKind
    time_zone: str
    rolling_s: int | None
    soft_limit: int | None
    hard_limit: int | None
    used: int | None = None  # in the current window, when asked for
    resets_at: str | None = None  # when the current window is over (rolling: what is counted now)


class PriceList(BaseModel):
    object: Literal["list"] = "list"
    data: list[PriceOut]


class BudgetList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BudgetOut]


def parse_price(body: object) -> PriceSpec:
    """A `PriceBody` from decoded JSON; the first problem as a `FieldError` (a 4xx)."""
    return parse_model(PriceBody, body).spec()


def parse_budget(body: object) -> BudgetSpec:
    return parse_model(BudgetBody, body).spec()


def _time(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def price_json(price: Price) -> JsonObject:
    p = price.prices
    return PriceOut(
        id=price.id,
        model=price.model,
        currency=price.currency,
        input_per_million=format_micros(p.input),
        cached_input_per_million=format_micros(p.cached_input),
        output_per_million=format_micros(p.output),
        input_micros_per_million=p.input,
        cached_input_micros_per_million=p.cached_input,
        output_micros_per_million=p.output,
        effective_from=_time(price.effective_from),
        created_at=_time(price.created_at),
        created_by=price.created_by,
    ).model_dump(mode="json")


def budget_json(budget: Budget, used: int | None = None, resets_at: float | None = None) -> JsonObject:
    w = budget.window
    return BudgetOut(
        id=budget.id,
        tenant=budget.tenant,
        key_id=budget.key_id,
        unit=budget.unit,
        window=w.kind,
        time_zone=w.time_zone,
        rolling_s=w.rolling_s,
        soft_limit=budget.soft_limit,
        hard_limit=budget.hard_limit,
        used=used,
        resets_at=None if resets_at is None else _time(dt.datetime.fromtimestamp(resets_at, dt.UTC)),
    ).model_dump(mode="json")


def list_json(items: list[JsonObject]) -> JsonObject:
    return {"object": "list", "data": items}
