"""Rollout guards end to end (issue 54, finding 6): `weir serve`'s app on a real uvicorn on
127.0.0.1, two tiny Llamas as versions v1 and v2 of one model, the admin API over httpx and the
official openai client.

The model must keep a ready version: draining or retiring its last one is refused with 409 naming
the model unless forced; a forced one leaves the model answered 503 `model_unavailable` with
Retry-After (not 404 `model_not_found`, which SDKs read as "no such model"). A split never points
at a version that is not ready, and a retired version leaves the stored split.

The tests run in file order on one server (its state is the point).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import serve_in_thread
from weir.gateway.server.bootstrap import build_server_app
from weir.gateway.settings.settings import AuthMode, Settings

pytestmark = pytest.mark.slow

MODEL = "tiny"
ADMIN_TOKEN = "guards-admin-token"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
BASE = f"/admin/v1/models/{MODEL}"


class Server:
    def __init__(self, url: str, key: str, paths: dict[str, Path]) -> None:
        self.url, self.key, self.paths = url, key, paths

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=ADMIN, timeout=300)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("guards")
    paths = {
        v: make_tiny_model(root / v, arch="llama", num_kv_heads=2, seed=s) for v, s in (("v1", 0), ("v2", 1))
    }
    settings = Settings(
        data_dir=root / "data",
        admin_token=ADMIN_TOKEN,
        auth=AuthMode.KEYS,
        model_path=paths["v1"],
        served_model_name=MODEL,
        model_version="v1",
        device="cpu",
        kv_cache_tokens=2048,
        metrics_port=0,
    )
    with (
        serve_in_thread(build_server_app(settings)) as url,
        httpx.Client(base_url=url, headers=ADMIN) as admin,
    ):
        assert admin.post("/admin/v1/tenants", json={"name": "acme"}).status_code == 201
        key = admin.post("/admin/v1/tenants/acme/keys", json={}).json()["key"]
        yield Server(url, key, paths)


def _complete(server: Server) -> str:
    with server.client() as client:
        raw = client.completions.with_raw_response.create(model=MODEL, prompt="Hello", max_tokens=2)
        return raw.headers["x-weir-model-version"]


def _states(admin: httpx.Client) -> dict[str, str]:
    return {
        v["version"]: v["state"] for v in admin.get("/admin/v1/models").json()["data"] if v["name"] == MODEL
    }


def _stored_split(admin: httpx.Client) -> dict[str, int]:
    plan = admin.get("/admin/v1/models").json()["traffic"].get(MODEL, {"split": {}})
    return dict(plan["split"])


def test_the_last_ready_version_is_neither_drained_nor_retired(server: Server) -> None:
    with server.admin() as admin:
        refused = admin.post(f"{BASE}/versions/v1/drain")
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "last_serving_version" and f"'{MODEL}'" in error["message"]
        assert "force" in error["message"]
        unforced = admin.post(f"{BASE}/versions/v1/drain", json={"force": False})
        assert unforced.status_code == 409
        assert _states(admin)["v1"] == "ready"
    assert _complete(server) == "v1"  # still served


def test_a_split_never_points_at_a_version_that_is_not_ready(server: Server) -> None:
    with server.admin() as admin:
        body = {"name": MODEL, "version": "v2", "path": str(server.paths["v2"])}
        assert admin.post("/admin/v1/models", json=body).status_code == 201
        refused = admin.put(f"{BASE}/traffic", json={"split": {"v2": 100}})
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "model_version_not_ready" and "'v2'" in error["message"]
        pinned = admin.put(f"{BASE}/traffic", json={"split": {"v1": 100}, "pins": {"acme": "v2"}})
        assert pinned.status_code == 409 and "'v2'" in pinned.json()["error"]["message"]
        assert _stored_split(admin) != {"v2": 100}


def test_retiring_a_version_takes_it_out_of_the_stored_split(server: Server) -> None:
    with server.admin() as admin:
        assert admin.post(f"{BASE}/versions/v2/load").status_code == 200
        put = admin.put(f"{BASE}/traffic", json={"split": {"v1": 60, "v2": 40}, "pins": {"acme": "v2"}})
        assert put.status_code == 200, put.text
        # v1 is ready: draining v2 leaves the model served.
        assert admin.post(f"{BASE}/versions/v2/drain").status_code == 200
        retired = admin.post(f"{BASE}/versions/v2/retire")
        assert retired.status_code == 200, retired.text
        assert retired.json()["traffic_percent"] == 0 and retired.json()["pinned_tenants"] == []
        listed = admin.get("/admin/v1/models").json()["traffic"][MODEL]
        assert listed == {"split": {"v1": 100}, "pins": {}}
    assert _complete(server) == "v1"


def test_force_leaves_the_model_unavailable_not_unknown(server: Server) -> None:
    with server.admin() as admin:
        forced = admin.post(f"{BASE}/versions/v1/drain", json={"force": True})
        assert forced.status_code == 200, forced.text
        assert forced.json()["state"] == "draining"
    for attempt in ("drained", "retired"):
        with server.client() as client, pytest.raises(openai.APIStatusError) as info:
            client.completions.create(model=MODEL, prompt="Hello", max_tokens=2)
        assert info.value.status_code == 503, attempt
        assert info.value.code == "model_unavailable"
        assert int(info.value.response.headers["retry-after"]) > 0
        with server.client() as client, pytest.raises(openai.APIStatusError) as card:
            client.models.retrieve(MODEL)
        assert card.value.status_code == 503
        if attempt == "drained":
            with server.admin() as admin:
                # Retiring the last version (no other is ready): 409 again unless forced.
                again = admin.post(f"{BASE}/versions/v1/retire")
                assert again.status_code == 409 and again.json()["error"]["code"] == "last_serving_version"
                assert admin.post(f"{BASE}/versions/v1/retire?force=true").status_code == 200
                assert _states(admin)["v1"] == "retired"
                assert _stored_split(admin) == {}  # no plan names a retired version
    with server.client() as client:
        assert MODEL not in [m.id for m in client.models.list().data]
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="no-such-model", prompt="Hello", max_tokens=2)
