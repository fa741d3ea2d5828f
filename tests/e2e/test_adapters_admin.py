"""LoRA adapters administered end to end: `weir serve`'s app (build_server_app) on a real uvicorn on
127.0.0.1 with `--adapter-dir`, a tiny random Llama, PEFT adapters made here, the admin API over
httpx and the official openai client as the tenants.

Register (private to one tenant), load, call by name, grant and revoke access, hostile folders
refused at load with a 400 naming the problem (and recorded failed), unload, retire, the audit
log, and a restart that loads the adapters recorded as loaded again. The tests run in file order
on one server (its state is the point).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.engine.lora_adapters import make_adapter
from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import serve_in_thread
from weir.engine.lora.lora_adapter import CONFIG_FILE, WEIGHTS_FILE
from weir.gateway.server.bootstrap import build_server_app
from weir.gateway.settings.settings import AuthMode, Settings

pytestmark = pytest.mark.slow

MODEL = "tiny"
VERSION = f"{MODEL}@v1"
ADMIN_TOKEN = "adapters-admin-token"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
PROMPT = [17, 42, 99, 7, 250, 31, 64, 12]
MAX_TOKENS = 10


@dataclass
class Server:
    settings: Settings
    url: str = ""
    keys: dict[str, str] = field(default_factory=dict)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def start(self) -> None:
        self.url = self.stack.enter_context(serve_in_thread(build_server_app(self.settings)))

    def stop(self) -> None:
        self.stack.close()
        self.stack = contextlib.ExitStack()

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=ADMIN, timeout=120)

    def client(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.keys[tenant], max_retries=0, timeout=120)


def _edit_weights(folder: Path, key_part: str, edit) -> None:  # type: ignore[no-untyped-def]
    tensors = load_file(str(folder / WEIGHTS_FILE))
    key = sorted(k for k in tensors if key_part in k)[0]
    tensors[key] = edit(tensors[key].clone())
    save_file(tensors, str(folder / WEIGHTS_FILE))


def _hostile_adapters(base: Path, root: Path, good: Path, scratch: Path) -> None:
    """Folders the server must refuse at load, each for one reason."""
    make_adapter(base, root / "rank32", rank=32, seed=3)  # over --lora-max-rank 16
    shutil.copytree(good, root / "nan")
    _edit_weights(
        root / "nan", "down_proj.lora_B", lambda t: t.index_fill_(0, torch.tensor([0]), float("nan"))
    )
    shutil.copytree(good, root / "inf")
    _edit_weights(root / "inf", "q_proj.lora_A", lambda t: t.index_fill_(0, torch.tensor([1]), float("inf")))
    shutil.copytree(good, root / "shape")
    _edit_weights(root / "shape", "q_proj.lora_A", lambda t: torch.zeros(t.shape[0], t.shape[1] + 1))
    shutil.copytree(good, root / "other-base")
    config = json.loads((root / "other-base" / CONFIG_FILE).read_text())
    config["base_model_name_or_path"] = "meta-llama/Llama-3.1-8B"
    (root / "other-base" / CONFIG_FILE).write_text(json.dumps(config))
    shutil.copytree(good, scratch / "outside")  # a real adapter, but not under --adapter-dir


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("adapters-e2e")
    base = make_tiny_model(root / "base", arch="llama", num_kv_heads=2, max_position_embeddings=512)
    adapters = root / "adapters"
    good = make_adapter(base, adapters / "style", rank=8, seed=5, b_std=0.2)
    make_adapter(base, adapters / "team" / "tone", rank=4, seed=6, b_std=0.2)
    _hostile_adapters(base, adapters, good, root)
    settings = Settings(
        data_dir=root / "data",
        admin_token=ADMIN_TOKEN,
        auth=AuthMode.KEYS,
        model_path=base,
        served_model_name=MODEL,
        model_version="v1",
        device="cpu",
        kv_cache_tokens=2048,
        metrics_port=0,
        adapter_dir=adapters,
        lora_slots=2,
        lora_max_rank=16,
    )
    srv = Server(settings)
    srv.start()
    with srv.admin() as admin:
        for tenant in ("acme", "globex", "gamma"):
            assert admin.post("/admin/v1/tenants", json={"name": tenant}).status_code == 201
            srv.keys[tenant] = admin.post(f"/admin/v1/tenants/{tenant}/keys", json={}).json()["key"]
    try:
        yield srv
    finally:
        srv.stop()


def _complete(client: openai.OpenAI, model: str) -> str:
    r = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, extra_body={"ignore_eos": True}
    )
    return r.choices[0].text


def _register(admin: httpx.Client, name: str, path: str, owner: str | None = None) -> httpx.Response:
    return admin.post(
        "/admin/v1/adapters",
        json={"name": name, "model_version": VERSION, "path": path, "owner_tenant": owner},
    )


def test_register_load_and_call_a_private_adapter(server: Server) -> None:
    with server.admin() as admin:
        r = _register(admin, "acme-style", "style", "acme")
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["state"] == "registered" and body["owner_tenant"] == "acme" and not body["public"]
        assert body["serving"] is False and body["runtime"] is None
        assert _register(admin, "acme-style", "style").json()["error"]["code"] == "adapter_exists"
        with server.client("acme") as acme, pytest.raises(openai.NotFoundError):
            _complete(acme, "acme-style")  # registered is not loaded
        r = admin.post("/admin/v1/adapters/acme-style/load")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["state"] == "loaded" and body["serving"] is True
        assert body["runtime"]["rank"] == 8 and body["runtime"]["num_bytes"] > 0
        again = admin.post("/admin/v1/adapters/acme-style/load")
        assert again.status_code == 409 and again.json()["error"]["code"] == "invalid_adapter_transition"
    with server.client("acme") as acme:
        assert _complete(acme, "acme-style") != _complete(acme, MODEL)
        assert [m.id for m in acme.models.list()] == [MODEL, "acme-style"]
    with server.client("globex") as globex:
        with pytest.raises(openai.NotFoundError) as private:
            _complete(globex, "acme-style")
        with pytest.raises(openai.NotFoundError) as unknown:
            _complete(globex, "no-such-adapter")
        assert private.value.code == unknown.value.code == "model_not_found"
        assert [m.id for m in globex.models.list()] == [MODEL]


def test_grant_and_revoke_open_and_close_an_adapter_to_a_tenant(server: Server) -> None:
    with server.admin() as admin:
        r = admin.post("/admin/v1/adapters/acme-style/grant", json={"tenant": "globex"})
        assert r.status_code == 200 and r.json()["allowed_tenants"] == ["globex"], r.text
        with server.client("globex") as globex, server.client("acme") as acme:
            assert _complete(globex, "acme-style") == _complete(acme, "acme-style")
        with server.client("gamma") as gamma, pytest.raises(openai.NotFoundError):
            _complete(gamma, "acme-style")
        assert (
            admin.post("/admin/v1/adapters/acme-style/revoke", json={"tenant": "globex"}).status_code == 200
        )
        with server.client("globex") as globex, pytest.raises(openai.NotFoundError):
            _complete(globex, "acme-style")
        for bad in (
            {"tenant": "nobody"},
            {"tenant": "Not A Name"},
            {"tenant": 7},
            {},
            {"tenant": "a", "x": 1},
        ):
            r = admin.post("/admin/v1/adapters/acme-style/grant", json=bad)
            assert r.status_code in (404, 422), (bad, r.text)
        assert admin.post("/admin/v1/adapters/nope/grant", json={"tenant": "acme"}).status_code == 404


HOSTILE = {
    "rank32": "rank 32 is over the configured maximum 16",
    "nan": "NaN or Inf",
    "inf": "NaN or Inf",
    "shape": "q_proj: lora_A",
    "other-base": "trained for base model 'meta-llama/Llama-3.1-8B'",
    "../outside": "outside the adapter directory",
    "/etc": "outside the adapter directory",
    "missing": "not a folder",
}


@pytest.mark.parametrize("path", sorted(HOSTILE))
def test_a_hostile_adapter_is_refused_at_load_with_a_400(server: Server, path: str) -> None:
    name = "hostile-" + path.strip("./").replace("/", "-")
    with server.admin() as admin:
        assert _register(admin, name, path).status_code == 201
        r = admin.post(f"/admin/v1/adapters/{name}/load")
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "invalid_adapter" and error["param"] == "path"
        assert HOSTILE[path] in error["message"]
        record = admin.get(f"/admin/v1/adapters/{name}").json()
        assert record["state"] == "failed" and HOSTILE[path] in record["failure_reason"]
        assert record["serving"] is False
        again = admin.post(f"/admin/v1/adapters/{name}/load")  # failed -> loaded is allowed; it fails again
        assert again.status_code == 400


def test_one_name_names_one_thing(server: Server) -> None:
    """Issue 54 finding 7: an adapter under a served model's name could never be reached (the
    model wins) and `/v1/models` listed the id twice; a model named like an adapter likewise."""
    with server.admin() as admin:
        shadowed = _register(admin, MODEL, "style")
        assert shadowed.status_code == 409, shadowed.text
        error = shadowed.json()["error"]
        assert (error["code"], error["param"]) == ("name_in_use", "name") and f"'{MODEL}'" in error["message"]
        assert admin.get(f"/admin/v1/adapters/{MODEL}").status_code == 404  # nothing was recorded
        # The other way: a model version registered under an adapter's name ("acme-style", loaded).
        clash = admin.post("/admin/v1/models", json={"name": "acme-style", "version": "v1", "path": "x"})
        assert clash.status_code == 409, clash.text
        assert (
            clash.json()["error"]["code"] == "name_in_use"
            and "'acme-style'" in clash.json()["error"]["message"]
        )
        assert not [v for v in admin.get("/admin/v1/models").json()["data"] if v["name"] == "acme-style"]
    with server.client("acme") as client:
        ids = [m.id for m in client.models.list().data]
        assert len(ids) == len(set(ids)) and MODEL in ids and "acme-style" in ids


def test_an_empty_model_version_filter_is_a_declared_refusal(server: Server) -> None:
    """Issue 54 finding 9: `?model_version=` was refused though the document allowed it."""
    with server.admin() as admin:
        op = admin.get("/openapi.json").json()["paths"]["/admin/v1/adapters"]["get"]
        (param,) = [p for p in op["parameters"] if p["name"] == "model_version"]
        assert param["schema"]["minLength"] == 1  # the empty value is outside the schema
        empty = admin.get("/admin/v1/adapters", params={"model_version": ""})
        assert str(empty.status_code) in op["responses"] and empty.status_code == 422
        assert empty.json()["error"]["param"] == "model_version"
        assert admin.get("/admin/v1/adapters", params={"model_version": VERSION}).status_code == 200


def test_bad_admin_bodies_are_refused_not_500(server: Server) -> None:
    bad_bodies = [
        {"name": "x", "model_version": VERSION},
        {"name": 7, "model_version": VERSION, "path": "style"},
        {"name": "x", "model_version": VERSION, "path": "style", "extra": 1},
        {"name": "@bad", "model_version": VERSION, "path": "style"},
        {"name": "x" * 500, "model_version": VERSION, "path": "style"},
        {"name": "x", "model_version": "no-at-sign", "path": "style"},
        {"name": "x", "model_version": VERSION, "path": "style\x00"},
        {"name": "x", "model_version": VERSION, "path": "style", "owner_tenant": ""},
    ]
    with server.admin() as admin:
        for body in bad_bodies:
            r = admin.post("/admin/v1/adapters", json=body)
            assert r.status_code == 422, (body, r.text)
        assert admin.post("/admin/v1/adapters", content=b"[1]").status_code == 400
        assert admin.post("/admin/v1/adapters", content=b"{").status_code == 400
        r = _register(admin, "x", "style", owner="nobody")
        assert r.status_code == 404
        r = admin.post("/admin/v1/adapters", json={"name": "y", "model_version": "tiny@v9", "path": "style"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_version_not_found"
        assert admin.get("/admin/v1/adapters/does-not-exist").status_code == 404
        assert httpx.get(server.url + "/admin/v1/adapters").status_code == 401


def test_unload_stops_routing_and_retire_is_final(server: Server) -> None:
    with server.admin() as admin:
        assert _register(admin, "public-tone", "team/tone").status_code == 201
        assert admin.post("/admin/v1/adapters/public-tone/load").status_code == 200
        with server.client("gamma") as gamma:
            reference = _complete(gamma, "public-tone")  # public: every tenant
        r = admin.post("/admin/v1/adapters/public-tone/unload")
        assert r.status_code == 200 and r.json()["state"] == "unloaded" and r.json()["serving"] is False
        with server.client("gamma") as gamma, pytest.raises(openai.NotFoundError):
            _complete(gamma, "public-tone")
        assert admin.post("/admin/v1/adapters/public-tone/load").status_code == 200
        with server.client("gamma") as gamma:
            assert _complete(gamma, "public-tone") == reference
        r = admin.post("/admin/v1/adapters/public-tone/retire")
        assert r.status_code == 200 and r.json()["state"] == "retired", r.text
        assert admin.post("/admin/v1/adapters/public-tone/load").status_code == 409
        listed = {a["name"]: a for a in admin.get("/admin/v1/adapters").json()["data"]}
        assert listed["public-tone"]["state"] == "retired" and listed["acme-style"]["state"] == "loaded"
        events = admin.get("/admin/v1/audit", params={"limit": 200}).json()["data"]
        actions = {(e["action"], e["target"]) for e in events}
        assert ("adapter.register", "public-tone") in actions
        assert ("adapter.state", "public-tone") in actions
        assert ("adapter.access", "acme-style") in actions


def test_a_restart_loads_the_adapters_recorded_as_loaded(server: Server) -> None:
    with server.client("acme") as acme:
        before = _complete(acme, "acme-style")
    server.stop()
    server.start()
    with server.admin() as admin:
        listed = {a["name"]: a for a in admin.get("/admin/v1/adapters").json()["data"]}
        assert listed["acme-style"]["state"] == "loaded" and listed["acme-style"]["serving"] is True
        assert listed["public-tone"]["state"] == "retired" and listed["public-tone"]["serving"] is False
        assert listed["hostile-nan"]["state"] == "failed"
    with server.client("acme") as acme:
        assert _complete(acme, "acme-style") == before
    with server.client("globex") as globex, pytest.raises(openai.NotFoundError):
        _complete(globex, "acme-style")
