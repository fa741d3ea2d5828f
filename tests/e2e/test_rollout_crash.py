"""Issue 21 item 5 end to end: a rollout through a crash, on a real `weir serve` (a child process,
two tiny random Llamas as versions v1 and v2 of one model, keys on) killed with SIGKILL mid-drain
and started again on the same database.

Before the fix, after the restart the load of v2 (retired in the database, known as draining by
the fleet) answered 500 and left its record in `loading`; a load without a stored plan sent every
request to the new version; `/v1/models` showed every tenant the card of the version ready last;
pins to tenants that do not exist were stored; a completion at the context length named
`param: "messages"`.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.engine.tiny_models import make_tiny_model
from weir_bench.weir_process import WeirProcess, run_weir

pytestmark = pytest.mark.slow

MODEL = "tiny"
FLAGS = [
    "--served-model-name",
    MODEL,
    "--model-version",
    "v1",
    "--device",
    "cpu",
    "--kv-cache-tokens",
    "2048",
]


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rollout-crash")
    return {  # different context lengths: their /v1/models cards differ
        "v1": make_tiny_model(root / "v1", arch="llama", num_kv_heads=2, seed=0, max_position_embeddings=256),
        "v2": make_tiny_model(root / "v2", arch="llama", num_kv_heads=2, seed=1, max_position_embeddings=128),
    }


def _admin(server: WeirProcess) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers=server.admin_headers(), timeout=300)


def _states(admin: httpx.Client) -> dict[str, str]:
    return {v["version"]: v["state"] for v in admin.get("/admin/v1/models").json()["data"]}


def _served_by(server: WeirProcess, key: str, num: int = 6) -> set[str]:
    """The versions that answered `num` completions of the tenant holding `key`."""
    headers = {"authorization": f"Bearer {key}"}
    seen = set()
    for i in range(num):
        body = {"model": MODEL, "prompt": f"request {i}", "max_tokens": 2}
        r = httpx.post(server.url + "/v1/completions", json=body, headers=headers, timeout=120)
        assert r.status_code == 200, r.text
        seen.add(r.headers["x-weir-model-version"])
    return seen


def _card(server: WeirProcess, key: str) -> dict[str, object]:
    r = httpx.get(server.url + "/v1/models", headers={"authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 200, r.text
    (card,) = r.json()["data"]
    assert isinstance(card, dict)
    return card


@pytest.fixture(scope="module")
def crashed(
    weights: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, dict[str, str]]]:
    """v1 served, v2 loaded, given the traffic, then rolled back (draining) when the server is
    killed with SIGKILL. Yields the data dir and the tenants' keys."""
    data = tmp_path_factory.mktemp("rollout-crash-data")
    keys: dict[str, str] = {}
    with run_weir(weights["v1"], data, FLAGS) as first, _admin(first) as admin:
        for tenant in ("acme", "other"):
            assert admin.post("/admin/v1/tenants", json={"name": tenant}).status_code == 201
            keys[tenant] = admin.post(f"/admin/v1/tenants/{tenant}/keys", json={}).json()["key"]
        body = {"name": MODEL, "version": "v2", "path": str(weights["v2"])}
        assert admin.post("/admin/v1/models", json=body).status_code == 201
        loaded = admin.post(f"/admin/v1/models/{MODEL}/versions/v2/load")
        assert loaded.status_code == 200 and loaded.json()["state"] == "ready", loaded.text
        # No plan was stored: the load holds the traffic where it was instead of cutting it over.
        assert admin.get("/admin/v1/models").json()["traffic"][MODEL] == {"split": {"v1": 100}, "pins": {}}
        assert _served_by(first, keys["other"]) == {"v1"}
        plan = {"split": {"v2": 100}, "pins": {"acme": "v1"}}
        assert admin.put(f"/admin/v1/models/{MODEL}/traffic", json=plan).status_code == 200
        assert _served_by(first, keys["other"]) == {"v2"}
        assert admin.post(f"/admin/v1/models/{MODEL}/rollback", json={"to": "v1"}).status_code == 200
        assert _states(admin) == {"v1": "ready", "v2": "draining"}
        first.proc.send_signal(signal.SIGKILL)
        assert first.proc.wait(timeout=30) == -signal.SIGKILL
    yield data, keys


def test_after_kill_9_mid_drain_every_admin_transition_works_or_is_a_409(
    weights: dict[str, Path], crashed: tuple[Path, dict[str, str]]
) -> None:
    data, keys = crashed
    with run_weir(weights["v1"], data, FLAGS) as server, _admin(server) as admin:
        assert _states(admin) == {"v1": "ready", "v2": "retired"}  # reconciled before serving
        loaded = admin.post(f"/admin/v1/models/{MODEL}/versions/v2/load")
        assert loaded.status_code == 200 and loaded.json()["state"] == "ready", loaded.text
        assert _states(admin) == {"v1": "ready", "v2": "ready"}
        assert _served_by(server, keys["other"]) == {"v1"}  # the rollback's plan still holds
        # Each tenant's /v1/models card is that of the version serving it.
        plan = {"split": {"v1": 100}, "pins": {"other": "v2"}}
        assert admin.put(f"/admin/v1/models/{MODEL}/traffic", json=plan).status_code == 200
        assert _served_by(server, keys["other"], 2) == {"v2"} and _served_by(server, keys["acme"], 2) == {
            "v1"
        }
        assert _card(server, keys["other"])["max_model_len"] == 128
        assert _card(server, keys["acme"])["max_model_len"] == 256
        # A pin to a tenant that does not exist: 404 naming it, nothing stored.
        ghost = {"split": {"v1": 100}, "pins": {"ghost": "v2"}}
        refused = admin.put(f"/admin/v1/models/{MODEL}/traffic", json=ghost)
        assert refused.status_code == 404 and refused.json()["error"]["param"] == "pins.ghost", refused.text
        assert admin.get("/admin/v1/models").json()["traffic"][MODEL] == plan
        # The rest of the life cycle: drain, retire, and 409s naming the state.
        assert admin.post(f"/admin/v1/models/{MODEL}/versions/v2/drain").status_code == 200
        retired = admin.post(f"/admin/v1/models/{MODEL}/versions/v2/retire")
        assert retired.status_code == 200 and retired.json()["state"] == "retired", retired.text
        for path, body in (
            ("versions/v2/retire", None),
            ("versions/v2/drain", None),
            ("versions/v1/load", None),
            ("rollback", {"to": "v2"}),
        ):
            r = admin.post(f"/admin/v1/models/{MODEL}/{path}", json=body)
            assert r.status_code == 409, (path, r.text)
        assert _states(admin) == {"v1": "ready", "v2": "retired"}
        # A completion at the context length names its own field.
        body = {"model": MODEL, "prompt": [5] * 256, "max_tokens": 1}
        headers = {"authorization": f"Bearer {keys['acme']}"}
        r = httpx.post(server.url + "/v1/completions", json=body, headers=headers, timeout=30)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == "prompt", error
