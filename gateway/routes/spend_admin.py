"""The price and window-budget admin API under /admin/v1 (admin bearer token).

    POST   /admin/v1/prices          add a price (effective now or later): 201
    GET    /admin/v1/prices          every price, ?model= for one model's
    PUT    /admin/v1/budgets         set a tenant's or key's budget over a window
    GET    /admin/v1/budgets         every budget with its current window's count, ?tenant=
    DELETE /admin/v1/budgets/{id}    remove a budget

Bodies and answers are `weir.tenancy.admin_bodies.spend_api`'s. Every change is audited by the repository. This
replica applies a change before it answers (`on_change`: the admission's window-budget gate reads
budgets and prices again), so a request sent after the answer is admitted under it; other
replicas apply it within the auth cache TTL (`weir.gateway.admission.window_budget_gate`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from weir.gateway.http.admin_auth import AdminAuthenticator
from weir.gateway.http.errors import NotFoundError
from weir.gateway.routes.admin_http import AdminHandler, AdminRoutes, bounded_query, json_answer
from weir.tenancy.budgets.window_budget_records import BudgetNotFoundError
from weir.tenancy.cli.spend_admin import SpendAdmin
from weir.tenancy.store.db import Database

OnChange = Callable[[], Awaitable[None]]  # after a committed change: apply it on this replica


class SpendAdminRoutes(AdminRoutes):
    """The endpoints over the database's prices and budgets (`SpendAdmin`), behind the admin token."""

    max_body_bytes = 64 * 1024

    def __init__(
        self, db: Database, admin_auth: AdminAuthenticator, on_change: OnChange | None = None
    ) -> None:
        super().__init__(admin_auth)
        self.admin_api = SpendAdmin(db)
        self.on_change = on_change

    async def _changed(self) -> None:
        if self.on_change is not None:
            await self.on_change()

    def endpoints(self) -> list[tuple[str, str, AdminHandler]]:
        return [
            ("POST", "/admin/v1/prices", self.set_price),
            ("GET", "/admin/v1/prices", self.list_prices),
            ("PUT", "/admin/v1/budgets", self.set_budget),
            ("GET", "/admin/v1/budgets", self.list_budgets),
            ("DELETE", "/admin/v1/budgets/{budget_id}", self.delete_budget),
        ]

    async def set_price(self, request: Request, actor: str) -> Response:
        body = await self.body(request)
        answer = await run_in_threadpool(self.admin_api.set_price, body, actor)
        await self._changed()
        return json_answer(answer, 201)

    async def list_prices(self, request: Request, actor: str) -> Response:
        model = bounded_query(request, "model")
        return json_answer(await run_in_threadpool(self.admin_api.list_prices, model))

    async def set_budget(self, request: Request, actor: str) -> Response:
        body = await self.body(request)
        answer = await run_in_threadpool(self.admin_api.set_budget, body, actor)
        await self._changed()
        return json_answer(answer)

    async def list_budgets(self, request: Request, actor: str) -> Response:
        tenant = bounded_query(request, "tenant")
        return json_answer(await run_in_threadpool(self.admin_api.list_budgets, tenant))

    async def delete_budget(self, request: Request, actor: str) -> Response:
        text = request.path_params["budget_id"]
        if not text.isascii() or not text.isdigit() or len(text) > 18:
            raise NotFoundError(f"window budget {text[:32]!r} not found")
        try:
            answer = await run_in_threadpool(self.admin_api.delete_budget, int(text), actor)
        except BudgetNotFoundError as exc:
            raise NotFoundError(exc.message) from None
        await self._changed()
        return json_answer(answer)


def spend_admin_routes(
    db: Database, admin_auth: AdminAuthenticator, on_change: OnChange | None = None
) -> list[BaseRoute]:
    """The routes, to mount before the /admin/v1 catch-all; `on_change` is awaited after every
    committed change (`WindowBudgetGate.refresh_now` where admission is on)."""
    return SpendAdminRoutes(db, admin_auth, on_change).routes()
