"""The console's model-version page and its actions: register, load, drain, retire, traffic split,
pins and rollback. Every action but register needs its confirmation box ticked (422 otherwise);
each calls the rollout in-process, as `/admin/v1/models` does, and its refusal shows in place."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from weir.gateway.console.base import (
    CONSOLE_ERRORS,
    ConsoleBase,
)
from weir.gateway.console.forms import optional_int
from weir.gateway.console.sessions import ConsoleSession
from weir.gateway.fleet.model_rollout import ModelRollout
from weir.gateway.http.errors import NotFoundError, UnprocessableError, to_http_error
from weir.tenancy.admin_bodies.model_versions import parse_spec
from weir.tenancy.catalog.model_version_records import (
    TrafficPlan,
    validate_model_name,
    validate_version_label,
)
from weir.tenancy.errors import FieldError
from weir.tenancy.store.field_rules import validate_tenant_name

VERSION_OPS = ("load", "drain", "retire")
# The refusal (422) when a change comes without its confirmation box ticked.
_CONFIRM = {
    "traffic": "Tick the box to confirm the traffic change.",
    "version": "Tick the box to confirm the version change.",
    "pins": "Tick the box to confirm the pin.",
    "rollback": "Tick the box to confirm the rollback.",
}
Change = Callable[[ModelRollout, str, dict[str, str], str], Awaitable[str]]


class ModelPages(ConsoleBase):
    """The model-versions page and its actions."""

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

    async def _change(self, request: Request, session: ConsoleSession, kind: str, change: Change) -> Response:
        """Run one confirmed change of model `{name}`; its notice, or its refusal, on the page."""
        form: dict[str, str] = request.state.form
        rollout = self.deps.rollout
        if rollout is None:
            raise NotFoundError("model versions are not managed here")
        if kind in _CONFIRM and form.get("confirm") != "yes":
            return await self.models(request, session, _CONFIRM[kind], 422)
        try:
            name = validate_model_name(request.path_params.get("name", form.get("name", "")))
            notice = await change(rollout, name, form, self._actor(request))
        except CONSOLE_ERRORS as exc:
            error = to_http_error(exc)
            return await self.models(request, session, error.message, error.status_code)
        return await self.models(request, session, notice=notice)

    async def register(self, request: Request, session: ConsoleSession) -> Response:
        async def change(rollout: ModelRollout, name: str, form: dict[str, str], actor: str) -> str:
            body: dict[str, Any] = {"name": name, "version": form.get("version", "").strip()}
            body["path"] = form.get("path", "").strip()
            for field in ("dtype", "tokenizer"):
                if form.get(field, "").strip():
                    body[field] = form[field].strip()
            kv_tokens = optional_int(form, "kv_cache_tokens")
            if kv_tokens is not None:
                body["kv_cache_tokens"] = kv_tokens
            status = await rollout.register(parse_spec(body), actor)
            return f"Registered {status.record.id}; load it to serve it."

        return await self._change(request, session, "register", change)

    async def version_op(self, request: Request, session: ConsoleSession) -> Response:
        async def change(rollout: ModelRollout, name: str, form: dict[str, str], actor: str) -> str:
            version = validate_version_label(form.get("version", ""))
            op = form.get("op", "")
            if op == "load":
                status = await rollout.load(name, version, actor)
                if status.failure_reason is not None or status.state.value != "ready":
                    raise UnprocessableError(
                        f"loading model version {status.record.id} failed: {status.failure_reason}",
                        param="path",
                        code="model_load_failed",
                    )
            elif op == "drain":
                status = await rollout.drain(name, version, actor)
            elif op == "retire":
                status = await rollout.retire(name, version, actor)
            else:
                raise FieldError("op", f"must be one of {', '.join(VERSION_OPS)}")
            return f"{status.record.id} is {status.state.value}."

        return await self._change(request, session, "version", change)

    async def set_traffic(self, request: Request, session: ConsoleSession) -> Response:
        async def change(rollout: ModelRollout, name: str, form: dict[str, str], actor: str) -> str:
            split = {}
            for key, value in form.items():
                if key.startswith("split.") and value.strip():
                    percent = optional_int(form, key)
                    if percent:
                        split[key.removeprefix("split.")] = percent
            current = await rollout.traffic(name)
            await rollout.set_traffic(TrafficPlan(name, split, dict(current.pins)), actor)
            return f"Traffic for {name} saved."

        return await self._change(request, session, "traffic", change)

    async def set_pin(self, request: Request, session: ConsoleSession) -> Response:
        async def change(rollout: ModelRollout, name: str, form: dict[str, str], actor: str) -> str:
            tenant = validate_tenant_name(form.get("tenant", "").strip(), "tenant")
            version = form.get("version", "").strip()
            current = await rollout.traffic(name)
            pins = dict(current.pins)
            if version:
                pins[tenant] = validate_version_label(version)
            else:
                pins.pop(tenant, None)
            await rollout.set_traffic(TrafficPlan(name, dict(current.split), pins), actor)
            return f"{tenant} pinned to {name}@{version}." if version else f"{tenant} unpinned from {name}."

        return await self._change(request, session, "pins", change)

    async def rollback(self, request: Request, session: ConsoleSession) -> Response:
        async def change(rollout: ModelRollout, name: str, form: dict[str, str], actor: str) -> str:
            to = validate_version_label(form.get("to", ""), "to")
            await rollout.rollback(name, to, actor)
            return f"Rolled {name} back to {to}; the other versions drain."

        return await self._change(request, session, "rollback", change)
