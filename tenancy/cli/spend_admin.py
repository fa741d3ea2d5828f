"""Price and window-budget operations behind the admin API and `weir admin prices|budgets ...`.

`SpendAdmin` acts on the database and answers with the admin API's JSON (`weir.tenancy.admin_bodies.spend_api`);
the server's routes call it, and so does the CLI without `--server`. `HttpSpendAdmin` sends the
same bodies to a running server, so the CLI prints the same thing either way.
"""

from __future__ import annotations

from typing import Protocol

from weir.tenancy.admin_bodies.spend_api import (
    JsonObject,
    budget_json,
    list_json,
    parse_budget,
    parse_price,
    price_json,
)
from weir.tenancy.budgets.prices import PriceRepo
from weir.tenancy.budgets.window_budgets import WindowBudgetStore
from weir.tenancy.cli.admin_client import CLI_ACTOR, HttpAdmin
from weir.tenancy.store.db import Database


class SpendAdminBackend(Protocol):
    def set_price(self, body: JsonObject) -> JsonObject: ...
    def list_prices(self, model: str | None) -> JsonObject: ...
    def set_budget(self, body: JsonObject) -> JsonObject: ...
    def list_budgets(self, tenant: str | None) -> JsonObject: ...
    def delete_budget(self, budget_id: int) -> JsonObject: ...


class SpendAdmin:
    """Prices and budgets on the database, every change audited as `actor`."""

    def __init__(self, db: Database, actor: str = CLI_ACTOR) -> None:
        self.prices = PriceRepo(db)
        self.budgets = WindowBudgetStore(db)
        self.actor = actor

    def set_price(self, body: JsonObject, actor: str | None = None) -> JsonObject:
        return price_json(self.prices.set_price(parse_price(body), actor=actor or self.actor))

    def list_prices(self, model: str | None) -> JsonObject:
        return list_json([price_json(p) for p in self.prices.list_prices(model)])

    def set_budget(self, body: JsonObject, actor: str | None = None) -> JsonObject:
        budget = self.budgets.set_budget(parse_budget(body), actor=actor or self.actor)
        now = self.budgets.clock()
        return budget_json(budget, self.budgets.used(budget, now), budget.window.reset_at(now))

    def list_budgets(self, tenant: str | None) -> JsonObject:
        now = self.budgets.clock()
        return list_json(
            [
                budget_json(b, self.budgets.used(b, now), b.window.reset_at(now))
                for b in self.budgets.list_budgets(tenant)
            ]
        )

    def delete_budget(self, budget_id: int, actor: str | None = None) -> JsonObject:
        return budget_json(self.budgets.delete_budget(budget_id, actor=actor or self.actor))


class HttpSpendAdmin:
    """The same operations through a running server's admin API."""

    def __init__(self, server: HttpAdmin) -> None:
        self.server = server

    def set_price(self, body: JsonObject) -> JsonObject:
        return self.server.call("POST", "/prices", json=body)

    def list_prices(self, model: str | None) -> JsonObject:
        return self.server.call("GET", "/prices", params={"model": model} if model else None)

    def set_budget(self, body: JsonObject) -> JsonObject:
        return self.server.call("PUT", "/budgets", json=body)

    def list_budgets(self, tenant: str | None) -> JsonObject:
        return self.server.call("GET", "/budgets", params={"tenant": tenant} if tenant else None)

    def delete_budget(self, budget_id: int) -> JsonObject:
        return self.server.call("DELETE", f"/budgets/{budget_id}")
