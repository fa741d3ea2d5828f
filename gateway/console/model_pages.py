"""The console's model-version page and its actions."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.console.base import (
    CONSOLE_ERRORS,
    ConsoleBase,
)
from gateway.console.forms import optional_int
from gateway.console.sessions import ConsoleSession
from gateway.errors import NotFoundError, to_http_error
from tenancy.model_version_records import TrafficPlan


class ModelPages(ConsoleBase):
    # -- model versions ---------------------------------------------------------------------------

    async def models(
        self, request: Request, session: ConsoleSession, error: str | None = None, status_code: int = 200,
        notice: str | None = None,
    ) -> Response:  # fmt: skip
        if self.deps.rollout is None:
            return self.render("models.html", status_code, session, nav="models", groups=[], error=error,
                               notice="Model versions are managed by `weir serve`.")  # fmt: skip
        statuses, plans = await self.deps.rollout.list()
        groups: dict[str, list[Any]] = {}
        for status in statuses:
            groups.setdefault(status.record.name, []).append(status)
        return self.render(
            "models.html",
            status_code,
            session,
            nav="models",
            groups=sorted(groups.items()),
            plans=plans,
            error=error,
            notice=notice,
        )

    async def set_traffic(self, request: Request, session: ConsoleSession) -> Response:
        form: dict[str, str] = request.state.form
        name = request.path_params["name"]
        if self.deps.rollout is None:
            raise NotFoundError("model versions are not managed here")
        if form.get("confirm") != "yes":
            return await self.models(request, session, "Tick the box to confirm the traffic change.", 422)
        try:
            split = {}
            for key, value in form.items():
                if key.startswith("split.") and value.strip():
                    percent = optional_int(form, key)
                    if percent:
                        split[key.removeprefix("split.")] = percent
            current = await self.deps.rollout.traffic(name)
            plan = TrafficPlan(name, split, dict(current.pins))
            await self.deps.rollout.set_traffic(plan, self._actor(request))
        except CONSOLE_ERRORS as exc:
            error = to_http_error(exc)
            return await self.models(request, session, error.message, error.status_code)
        return await self.models(request, session, notice=f"Traffic for {name} saved.")
