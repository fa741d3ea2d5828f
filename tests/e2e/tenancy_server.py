"""The whole HTTP surface on a real uvicorn (127.0.0.1, ephemeral port): OpenAI routes over the
fake engine, tenancy (SQLite, keys, admin API) as `weir serve` wires it, and the prefix-cache admin
API over a fake engine control. Used by the hostile-input tests and the schema fuzzer."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.gateway.fake_engine import FakeEngine, FakePrefixCache
from tests.gateway.harness import MAX_MODEL_LEN, MODEL, make_app, serve_in_thread, tokenizer
from weir.gateway.fleet.model_fleet import single_engine_fleet
from weir.gateway.fleet.model_rollout import ModelRollout
from weir.gateway.http.error_tarpit import TarpitLimits
from weir.gateway.routes.models_admin import models_admin_routes
from weir.gateway.routes.prefix_cache import prefix_cache_routes
from weir.gateway.server.bootstrap import build_tenancy
from weir.gateway.settings.settings import AuthMode, Settings

ADMIN_TOKEN = "admin-secret-for-tests"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
TENANT = "fuzz-tenant"


@dataclass
class FullServer:
    url: str
    engine: FakeEngine
    control: FakePrefixCache
    tenant_key: str

    @property
    def tenant(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.tenant_key}"}


@contextlib.contextmanager
def serve_everything(data_dir: Path, **settings_fields: Any) -> Iterator[FullServer]:
    """Serve the app with every route mounted (stored responses in the tenancy database, as
    `weir serve` keeps them); yields once a tenant and its key exist. `settings_fields` override
    the settings."""
    settings = Settings(data_dir=data_dir, admin_token=ADMIN_TOKEN, auth=AuthMode.KEYS, **settings_fields)
    tenancy = build_tenancy(settings)
    assert tenancy.admin_auth is not None
    # Room for the largest valid request (128 prompts x n=16 x the whole context): the fake
    # engine fails what does not fit, the real one refuses it up front.
    engine = FakeEngine(num_total_blocks=1 << 18)
    control = FakePrefixCache()
    # The model-version routes over a fleet of the fake engine (one that cannot load others: a
    # load answers 422 with the reason, like a failed one).
    fleet = single_engine_fleet(
        MODEL, engine, tokenizer(), max_model_len=MAX_MODEL_LEN, vocab_size=None, fingerprint="fp_test"
    )
    assert tenancy.model_versions is not None
    rollout = ModelRollout(fleet, tenancy.model_versions)
    routes = [
        *prefix_cache_routes(control, tenancy.admin_auth, tokenizer()),
        *models_admin_routes(rollout, tenancy.admin_auth),
        *tenancy.routes,
    ]
    app = make_app(
        engine,
        settings,
        fleet=fleet,
        authenticate=tenancy.authenticate,
        usage_sink=tenancy.usage_sink,
        extra_routes=routes,
        on_startup=[tenancy.start] if tenancy.start else [],
        on_shutdown=[tenancy.close] if tenancy.close else [],
        # The fuzzer sends hundreds of 4xx from one key and one address on purpose: the tarpit
        # stays in the path, with a bar it never reaches.
        error_tarpit=TarpitLimits(max_errors=1_000_000),
        response_store=tenancy.response_store,
    )
    with serve_in_thread(app) as url, httpx.Client(base_url=url, headers=ADMIN, timeout=30) as admin:
        assert admin.post("/admin/v1/tenants", json={"name": TENANT}).status_code == 201
        key = admin.post(f"/admin/v1/tenants/{TENANT}/keys", json={}).json()["key"]
        yield FullServer(url, engine, control, key)
