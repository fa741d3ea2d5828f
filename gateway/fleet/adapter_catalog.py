"""The LoRA adapters this server serves now, and which tenant may call which.

The records (`weir.tenancy.catalog.adapters.AdapterRepo`) say what should be loaded and survive restarts; the
catalog holds the adapters actually loaded on a base version's engine in this process, so the
OpenAI routes resolve `model` without a database round trip on every request. An adapter private
to another tenant resolves exactly like an unknown name (None): the routes then answer the same
404 as for an unknown model, never revealing that it exists.
"""

from __future__ import annotations

from weir.tenancy.catalog.adapter_records import AdapterView


class AdapterCatalog:
    """Loaded adapters by name (the admin side puts and removes them as engines load them)."""

    def __init__(self) -> None:
        self._loaded: dict[str, AdapterView] = {}

    def put(self, view: AdapterView) -> None:
        """`view` is loaded on its base version's engine and may take requests."""
        self._loaded[view.name] = view

    def remove(self, name: str) -> None:
        self._loaded.pop(name, None)

    def remove_version(self, model_version: str) -> list[str]:
        """Drop every adapter of base version `model_version` (it was retired); their names."""
        names = sorted(n for n, v in self._loaded.items() if v.model_version == model_version)
        for name in names:
            del self._loaded[name]
        return names

    def resolve(self, name: str, tenant_id: str) -> AdapterView | None:
        """The adapter `name` as `tenant_id` may call it; None when unknown, not loaded, or
        private to another tenant (the same answer for all three)."""
        view = self._loaded.get(name)
        if view is None or not view.visible_to(tenant_id):
            return None
        return view

    def visible_to(self, tenant_id: str) -> list[AdapterView]:
        """The loaded adapters `tenant_id` may call, by name."""
        return sorted((v for v in self._loaded.values() if v.visible_to(tenant_id)), key=lambda v: v.name)

    def has(self, name: str) -> bool:
        return name in self._loaded

    def names(self) -> list[str]:
        return sorted(self._loaded)
