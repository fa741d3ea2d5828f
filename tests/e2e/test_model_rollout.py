"""Hot model-version rollouts end to end: `weir serve`'s app (build_server_app) on a real uvicorn
on 127.0.0.1, two tiny random Llamas (different seeds, so their greedy answers differ) as versions
v1 and v2 of one model, the official openai client streaming, the admin API over httpx.

The tests run in file order on one server (its state is the point): the rollout under load, a
failed load, pins, cache isolation, then a restart of the server on the same database.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import select

from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import serve_in_thread, wait_until
from weir.gateway.server.bootstrap import build_server_app
from weir.gateway.settings.settings import AuthMode, Settings
from weir.tenancy.store.db import Database
from weir.tenancy.store.models import UsageRecord

pytestmark = pytest.mark.slow

MODEL = "tiny"
ADMIN_TOKEN = "rollout-admin-token"
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
PROMPTS = ("The quick brown fox", "Hello, world! How are", "Paged attention stores", "0 1 2 3 4 5")
MAX_TOKENS = 12
MAX_LOAD_REQUESTS = 400  # the load loop is bounded in count and in time
LOAD_DEADLINE_S = 240.0


@dataclass
class Rollout:
    """The server under test, its admin client and the tenants' keys."""

    settings: Settings
    paths: dict[str, Path]
    url: str = ""
    keys: dict[str, str] = field(default_factory=dict)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def start(self) -> None:
        self.url = self.stack.enter_context(serve_in_thread(build_server_app(self.settings)))

    def stop(self) -> None:
        self.stack.close()
        self.stack = contextlib.ExitStack()

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=ADMIN, timeout=300)

    def client(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.keys[tenant], max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rollout]:
    root = tmp_path_factory.mktemp("rollout")
    paths = {
        v: make_tiny_model(root / v, arch="llama", num_kv_heads=2, seed=seed)
        for v, seed in (("v1", 0), ("v2", 1))
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
    server = Rollout(settings, paths)
    server.start()
    with server.admin() as admin:
        for tenant in ("acme", "other"):
            assert admin.post("/admin/v1/tenants", json={"name": tenant}).status_code == 201
            server.keys[tenant] = admin.post(f"/admin/v1/tenants/{tenant}/keys", json={}).json()["key"]
    try:
        yield server
    finally:
        server.stop()


@dataclass(frozen=True)
class Answer:
    version: str
    text: str
    finish_reason: str | None


def stream_once(client: openai.OpenAI, prompt: str) -> Answer:
    """One streamed greedy completion: the version header and the whole text."""
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    version = raw.headers["x-weir-model-version"]
    pieces, reason = [], None
    for chunk in raw.parse():
        for choice in chunk.choices:
            pieces.append(choice.text)
            reason = choice.finish_reason or reason
    return Answer(version, "".join(pieces), reason)


def versions(admin: httpx.Client) -> dict[str, dict[str, object]]:
    body = admin.get("/admin/v1/models").json()
    return {v["version"]: v for v in body["data"] if v["name"] == MODEL}


def _references(server: Rollout, admin: httpx.Client) -> dict[str, dict[str, str]]:
    """Each version's own greedy answer to every prompt (tenant `acme` pinned to each in turn)."""
    refs: dict[str, dict[str, str]] = {}
    with server.client("acme") as client:
        for version in ("v1", "v2"):
            put = admin.put(
                f"/admin/v1/models/{MODEL}/traffic", json={"split": {"v1": 100}, "pins": {"acme": version}}
            )
            assert put.status_code == 200, put.text
            answers = [stream_once(client, p) for p in PROMPTS]
            assert {a.version for a in answers} == {version}
            refs[version] = {p: a.text for p, a in zip(PROMPTS, answers, strict=True)}
    assert admin.put(f"/admin/v1/models/{MODEL}/traffic", json={"split": {"v1": 100}}).status_code == 200
    return refs


def test_rollout_under_load_drops_nothing_and_tags_every_answer(rollout: Rollout) -> None:
    with rollout.admin() as admin:
        assert versions(admin)["v1"]["state"] == "ready"
        register = {"name": MODEL, "version": "v2", "path": str(rollout.paths["v2"]), "kv_cache_tokens": 2048}
        assert admin.post("/admin/v1/models", json=register).status_code == 201
        loaded = admin.post(f"/admin/v1/models/{MODEL}/versions/v2/load")
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["state"] == "ready"
        refs = _references(rollout, admin)
        assert refs["v1"] != refs["v2"]  # different weights: the version check below means something

        answers: list[Answer] = []
        failures: list[BaseException] = []
        stop = threading.Event()
        deadline = time.monotonic() + LOAD_DEADLINE_S

        def worker(index: int) -> None:
            with rollout.client("other") as client:
                n = 0
                while not stop.is_set() and len(answers) < MAX_LOAD_REQUESTS and time.monotonic() < deadline:
                    try:
                        answers.append(stream_once(client, PROMPTS[(index + n) % len(PROMPTS)]))
                    except BaseException as exc:  # every failure is a test failure
                        failures.append(exc)
                    n += 1

        def seen(version: str, at_least: int = 1) -> bool:
            return sum(a.version == version for a in list(answers)) >= at_least or bool(failures)

        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(worker, i) for i in range(3)]
            try:
                for split in ({"v1": 90, "v2": 10}, {"v1": 50, "v2": 50}, {"v2": 100}):
                    put = admin.put(f"/admin/v1/models/{MODEL}/traffic", json={"split": split})
                    assert put.status_code == 200 and put.json()["split"] == split
                    before = len(answers)
                    assert wait_until(lambda before=before: len(answers) >= before + 6 or failures, 120)
                assert seen("v2", 3)
                drained = admin.post(f"/admin/v1/models/{MODEL}/versions/v1/drain")
                assert drained.status_code == 200 and drained.json()["state"] == "draining"
                retired = admin.post(f"/admin/v1/models/{MODEL}/versions/v1/retire")
                assert retired.status_code == 200 and retired.json()["state"] == "retired"
                assert int(retired.headers["x-weir-memory-released-bytes"]) > 0
                after = len(answers)
                assert wait_until(lambda: len(answers) >= after + 3 or failures, 120)
            finally:
                stop.set()
                for f in futures:
                    f.result()
        assert not failures, failures[:3]
        assert seen("v1") and seen("v2")
        for answer in answers:
            assert answer.finish_reason is not None  # not truncated
            assert answer.text in refs[answer.version].values()  # every token from the tagged version
        listed = versions(admin)
        assert listed["v1"]["state"] == "retired" and listed["v1"]["kv_usage"] is None
        assert listed["v2"]["traffic_percent"] == 100 and listed["v2"]["in_flight"] == 0
        metrics = admin.get("/metrics").text
        assert f'weir_kv_cache_total_blocks{{model_version="{MODEL}@v2"}}' in metrics
        assert f'weir_kv_cache_total_blocks{{model_version="{MODEL}@v1"}}' not in metrics  # unloaded


def test_failed_loads_change_nothing_and_say_why(rollout: Rollout) -> None:
    with rollout.admin() as admin:
        before = versions(admin)
        bad = {"name": MODEL, "version": "v3", "path": str(rollout.paths["v2"].parent / "missing")}
        huge = {
            "name": MODEL,
            "version": "v4",
            "path": str(rollout.paths["v2"]),
            "kv_cache_tokens": 2**31 - 1,
        }
        for body, words in ((bad, "does not exist"), (huge, "does not fit the memory budget")):
            assert admin.post("/admin/v1/models", json=body).status_code == 201
            answer = admin.post(f"/admin/v1/models/{MODEL}/versions/{body['version']}/load")
            assert answer.status_code == 422 and words in answer.json()["error"]["message"]
            failed = versions(admin)[str(body["version"])]
            assert failed["state"] == "failed" and words in str(failed["failure_reason"])
        assert "needs" in str(versions(admin)["v4"]["failure_reason"])  # needed vs free, in bytes
        after = versions(admin)
        for label in ("v1", "v2"):
            assert {k: after[label][k] for k in ("state", "traffic_percent")} == {
                k: before[label][k] for k in ("state", "traffic_percent")
            }
    with rollout.client("other") as client:
        assert stream_once(client, PROMPTS[0]).version == "v2"


def test_a_pinned_tenant_stays_on_v1_at_a_full_split_to_v2(rollout: Rollout) -> None:
    with rollout.admin() as admin:
        assert (
            admin.post(f"/admin/v1/models/{MODEL}/versions/v1/load").status_code == 200
        )  # back from retired
        put = admin.put(
            f"/admin/v1/models/{MODEL}/traffic", json={"split": {"v2": 100}, "pins": {"acme": "v1"}}
        )
        assert put.status_code == 200, put.text
        assert versions(admin)["v1"]["pinned_tenants"] == ["acme"]
    with rollout.client("acme") as acme, rollout.client("other") as other:
        assert {stream_once(acme, p).version for p in PROMPTS} == {"v1"}
        assert {stream_once(other, p).version for p in PROMPTS} == {"v2"}
        chat = acme.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert chat.headers["x-weir-model-version"] == "v1" and chat.parse().model == MODEL


def test_identical_prompts_on_v1_and_v2_never_share_a_cached_block(rollout: Rollout) -> None:
    prompt = "user assistant system: what is the capital of France? Paris is the capital of France. " * 3

    def cached(version: str) -> int:
        with rollout.admin() as admin:
            plan = {"split": {"v2": 100}, "pins": {"acme": version}}
            assert admin.put(f"/admin/v1/models/{MODEL}/traffic", json=plan).status_code == 200
        with rollout.client("acme") as acme:
            raw = acme.completions.with_raw_response.create(
                model=MODEL, prompt=prompt, max_tokens=2, temperature=0
            )
            assert raw.headers["x-weir-model-version"] == version
            usage = raw.parse().usage
            assert usage is not None and usage.prompt_tokens_details is not None
            return usage.prompt_tokens_details.cached_tokens or 0

    assert cached("v1") == 0
    assert cached("v1") > 0  # the same tenant's prompt is cached on v1 ...
    assert cached("v2") == 0  # ... and none of it is reused on v2
    with rollout.admin() as admin:
        for version in ("v1", "v2"):
            stats = admin.get(f"/admin/v1/prefix-cache/stats?model={MODEL}&version={version}").json()
            assert stats["model_version"] == f"{MODEL}@{version}"


def test_versions_split_and_pins_survive_a_restart(rollout: Rollout) -> None:
    with rollout.admin() as admin:
        plan = {"split": {"v1": 20, "v2": 80}, "pins": {"acme": "v1"}}
        assert admin.put(f"/admin/v1/models/{MODEL}/traffic", json=plan).status_code == 200
        before = admin.get("/admin/v1/models").json()
    rollout.stop()
    db = Database(rollout.settings.resolved_database_url)
    try:
        with db.transaction() as session:
            billed = set(session.scalars(select(UsageRecord.model_version)))
    finally:
        db.dispose()
    assert {f"{MODEL}@v1", f"{MODEL}@v2"} <= billed  # usage records carry the version
    rollout.start()
    with rollout.admin() as admin:
        after = admin.get("/admin/v1/models").json()
        assert after["traffic"][MODEL] == before["traffic"][MODEL] == plan
        states = {v["version"]: v["state"] for v in after["data"]}
        assert states == {"v1": "ready", "v2": "ready", "v3": "failed", "v4": "failed"}
        names = [
            m["id"]
            for m in httpx.get(
                rollout.url + "/v1/models", headers={"authorization": f"Bearer {rollout.keys['acme']}"}
            ).json()["data"]
        ]
        assert names == [MODEL]
    with rollout.client("acme") as acme:
        assert stream_once(acme, PROMPTS[1]).version == "v1"
