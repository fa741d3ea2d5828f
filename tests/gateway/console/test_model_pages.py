"""The console's model-version page and actions (gateway/console/model_pages.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.gateway.console.console_harness import (
    HOSTILE,
    Console,
)
from weir.tenancy.catalog.model_version_records import ModelVersionSpec
from weir.tenancy.repository.records import TenantSpec


def test_traffic_needs_confirmation_and_shows_refusals_in_place(console: Console) -> None:
    asyncio.run(console.rollout.register(ModelVersionSpec(name="m", version="v1", path="ok"), "test"))
    csrf = console.login()
    unconfirmed = console.post("/models/m/traffic", csrf, **{"split.v1": "100"})
    assert unconfirmed.status_code == 422  # type: ignore[attr-defined]
    not_ready = console.post("/models/m/traffic", csrf, confirm="yes", **{"split.v1": "100"})
    assert not_ready.status_code == 409 and "only ready versions take traffic" in not_ready.text  # type: ignore[attr-defined]


def test_model_version_actions_register_load_pin_drain_rollback_retire(console: Console) -> None:
    console.repo.create_tenant(TenantSpec("acme"), actor="test")
    csrf = console.login()

    def post(path: str, /, **fields: str) -> Any:
        answer: Any = console.post(path, csrf, **fields)
        return answer

    for version in ("v1", "v2"):
        registered = post("/models", name="m", version=version, path="ok", kv_cache_tokens="64")
        assert registered.status_code == 200 and f"Registered m@{version}" in registered.text
    assert post("/models/m/versions", version="v1", op="load").status_code == 422  # not confirmed
    for version in ("v1", "v2"):
        loaded = post("/models/m/versions", version=version, op="load", confirm="yes")
        assert loaded.status_code == 200 and f"m@{version} is ready" in loaded.text, loaded.text
    split = post("/models/m/traffic", confirm="yes", **{"split.v1": "50", "split.v2": "50"})
    assert split.status_code == 200 and "<td>50%</td>" in split.text
    pinned = post("/models/m/pins", tenant="acme", version="v2", confirm="yes")
    assert pinned.status_code == 200 and "acme pinned to m@v2" in pinned.text
    assert asyncio.run(console.rollout.traffic("m")).pins == {"acme": "v2"}
    unknown = post("/models/m/pins", tenant="nobody", version="v2", confirm="yes")
    assert unknown.status_code == 404 and "nobody" in unknown.text
    rolled = post("/models/m/rollback", to="v1", confirm="yes")
    assert rolled.status_code == 200 and "Rolled m back to v1" in rolled.text
    plan = asyncio.run(console.rollout.traffic("m"))
    assert plan.split == {"v1": 100}
    drained = post("/models/m/versions", version="v2", op="drain", confirm="yes")
    assert drained.status_code in (200, 409), drained.text  # the rollback may have drained it already
    retired = post("/models/m/versions", version="v2", op="retire", confirm="yes")
    assert retired.status_code == 200 and "m@v2 is retired" in retired.text, retired.text
    unpinned = post("/models/m/pins", tenant="acme", version="", confirm="yes")
    assert unpinned.status_code in (200, 409), unpinned.text
    bad_op = post("/models/m/versions", version="v1", op="explode", confirm="yes")
    assert bad_op.status_code == 422 and "op" in bad_op.text
    actions = {e.action.value for e in console.repo.list_audit()}
    assert any("model" in a for a in actions), actions


def test_a_failed_load_and_hostile_model_fields_are_shown_in_place(console: Console) -> None:
    csrf = console.login()
    registered: Any = console.post("/models", csrf, name="m", version="bad", path="bad-warmup")
    assert registered.status_code == 200
    failed: Any = console.post("/models/m/versions", csrf, version="bad", op="load", confirm="yes")
    assert failed.status_code == 422 and "loading model version m@bad failed" in failed.text
    hostile: Any = console.post("/models", csrf, name=HOSTILE, version=HOSTILE, path=HOSTILE)
    assert hostile.status_code == 422 and HOSTILE not in hostile.text
    path: Any = console.post("/models", csrf, name="m", version="v9", path=HOSTILE)
    assert HOSTILE not in path.text  # registered or refused, the path shows only as text
