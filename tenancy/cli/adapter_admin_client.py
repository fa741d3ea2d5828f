"""The LoRA adapter operations behind `weir admin adapters ...`, through a running server.

Adapters are loaded into a server's engines, so every command goes to its
`/admin/v1/adapters` routes (`weir.gateway.routes.adapters_admin`); the answers are that API's
JSON objects (`weir.gateway.api.adapter_admin_bodies.AdapterOut`), checked for their shape before they
are printed, so a server speaking another shape is reported, not echoed.
"""

from __future__ import annotations

from weir.tenancy.catalog.adapter_records import AdapterSpec
from weir.tenancy.cli.admin_client import AdminApiError, HttpAdmin, JsonObject, path_segment

# A load reads and checks the adapter's weights before it answers; an unload waits for the
# requests through the adapter to finish.
LOAD_TIMEOUT_S = 300.0
UNLOAD_TIMEOUT_S = 900.0
_ADAPTER_FIELDS = ("name", "model_version", "path", "state", "allowed_tenants")


def _adapter(answer: JsonObject) -> JsonObject:
    if answer.get("object") != "adapter" or any(f not in answer for f in _ADAPTER_FIELDS):
        raise AdminApiError(200, "the server did not answer with an adapter object")
    return answer


class HttpAdapterAdmin:
    """LoRA adapters through a running server's admin API."""

    def __init__(self, server: HttpAdmin) -> None:
        self.server = server

    def _action(
        self, name: str, action: str, body: JsonObject | None = None, timeout_s: float | None = None
    ) -> JsonObject:
        path = f"/adapters/{path_segment(name)}/{action}"
        return _adapter(self.server.call("POST", path, json=body, timeout_s=timeout_s))

    def list_adapters(self, model_version: str | None) -> JsonObject:
        params = {"model_version": model_version} if model_version is not None else None
        answer = self.server.call("GET", "/adapters", params=params)
        data = answer.get("data")
        if not isinstance(data, list):
            raise AdminApiError(200, "the server did not answer with a list of adapters")
        for item in data:
            _adapter(item)
        return answer

    def get(self, name: str) -> JsonObject:
        return _adapter(self.server.call("GET", f"/adapters/{path_segment(name)}"))

    def register(self, spec: AdapterSpec) -> JsonObject:
        body = {
            "name": spec.name,
            "model_version": spec.model_version,
            "path": spec.path,
            "owner_tenant": spec.owner_tenant,
        }
        return _adapter(self.server.call("POST", "/adapters", json=body))

    def load(self, name: str) -> JsonObject:
        return self._action(name, "load", timeout_s=LOAD_TIMEOUT_S)

    def unload(self, name: str) -> JsonObject:
        return self._action(name, "unload", timeout_s=UNLOAD_TIMEOUT_S)

    def retire(self, name: str) -> JsonObject:
        return self._action(name, "retire", timeout_s=UNLOAD_TIMEOUT_S)

    def grant(self, name: str, tenant: str) -> JsonObject:
        return self._action(name, "grant", {"tenant": tenant})

    def revoke(self, name: str, tenant: str) -> JsonObject:
        return self._action(name, "revoke", {"tenant": tenant})
