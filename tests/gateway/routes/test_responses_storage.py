"""How `/v1/responses` stores: the write off the answer's path (a read of the id on this replica
waits for it), a failed write served anyway and counted, a stalled store answered 503 with
Retry-After, and each tenant's own storage quota and retention over the server's defaults."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app, serve_in_thread, wait_until
from weir.engine.request import Priority
from weir.gateway.routes.response_writes import PendingWrites
from weir.gateway.settings.settings import Settings
from weir.tenancy.context import QuotaLimits, TenantContext
from weir.tenancy.responses.memory_responses import MemoryResponseStore
from weir.tenancy.responses.response_records import StoredResponse

QUOTAS = {
    "plain": QuotaLimits(),
    "none-stored": QuotaLimits(response_storage_bytes=0),
    "short-lived": QuotaLimits(response_retention_s=60),
}


async def _authenticate(authorization: str | None, client_addr: str) -> TenantContext:
    name = (authorization or "").removeprefix("Bearer ")
    return TenantContext(name, f"key-{name}", Priority.STANDARD, 1.0, name, QUOTAS[name])


class GatedStore(MemoryResponseStore):
    """A blocking store (as the database is: called on worker threads) whose calls can be held."""

    inline = False

    def __init__(self) -> None:
        super().__init__()
        self.put_gate, self.get_gate = threading.Event(), threading.Event()
        self.get_gate.set()
        self.fail_puts = False
        self.calls: list[str] = []

    def put(self, tenant: str, record: StoredResponse) -> None:
        self.put_gate.wait(30)
        if self.fail_puts:
            raise OSError("the database is gone")
        super().put(tenant, record)
        self.calls.append("put")

    def get(self, tenant: str, response_id: str, now: dt.datetime) -> StoredResponse | None:
        self.get_gate.wait(30)
        self.calls.append("get")
        return super().get(tenant, response_id, now)


class Served:
    def __init__(self, url: str, store: GatedStore, app: Any) -> None:
        self.url, self.store, self.app = url, store, app

    def request(self, method: str, path: str, tenant: str = "plain", **kwargs: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {tenant}"}
        return httpx.request(method, self.url + path, headers=headers, timeout=30, **kwargs)

    def create(self, tenant: str = "plain", **body: Any) -> httpx.Response:
        body = {"model": MODEL, "input": "hello", "max_output_tokens": 2, **body}
        return self.request("POST", "/v1/responses", tenant, json=body)


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    store = GatedStore()
    timeout_s = getattr(request, "param", 30.0)  # the stalled-store test: 0.05
    app = make_app(
        FakeEngine(),
        Settings(response_store_timeout_s=timeout_s),
        authenticate=_authenticate,
        response_store=store,
    )
    with serve_in_thread(app) as url:
        try:
            yield Served(url, store, app)
        finally:  # before the server stops: it waits for its worker threads
            store.put_gate.set()
            store.get_gate.set()


@pytest.mark.parametrize("stream", [False, True])
def test_the_answer_does_not_wait_for_the_write_and_a_read_waits_for_it(
    served: Served, stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    waiting: list[str] = []
    original = PendingWrites.wait

    async def wait(self: PendingWrites, tenant: str, response_id: str) -> None:
        if (tenant, response_id) in self._pending:
            waiting.append(response_id)
        await original(self, tenant, response_id)

    monkeypatch.setattr(PendingWrites, "wait", wait)
    answer = served.create(stream=stream)  # the write is held: the answer comes anyway
    assert answer.status_code == 200 and served.store.calls == []
    if stream:
        response_id = answer.text.split('"id":"', 1)[1].split('"', 1)[0]
    else:
        response_id = answer.json()["id"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        read = pool.submit(served.request, "GET", f"/v1/responses/{response_id}")
        assert wait_until(lambda: waiting == [response_id])  # the read waits on the write...
        served.store.put_gate.set()  # ...until it is done
        got = read.result()
    assert got.status_code == 200 and got.json()["id"] == response_id
    assert served.store.calls[0] == "put"  # written before read, as the read waited for it


def test_a_failed_write_leaves_the_answer_served_and_is_counted(served: Served) -> None:
    served.store.fail_puts = True
    served.store.put_gate.set()
    answer = served.create()
    assert answer.status_code == 200 and answer.json()["output"]
    registry = served.app.state.metrics.registry
    metric = "weir_stored_response_write_failures_total"
    assert wait_until(lambda: registry.get_sample_value(metric) == 1)
    assert served.request("GET", f"/v1/responses/{answer.json()['id']}").status_code == 404


@pytest.mark.parametrize("served", [0.05], indirect=True)
def test_a_stalled_store_answers_503_with_retry_after(served: Served) -> None:
    served.store.put_gate.set()
    served.store.get_gate.clear()  # every read hangs: its wait is bounded by the setting
    for method, path in (("GET", "/v1/responses/resp_x"), ("GET", "/v1/responses/resp_x/input_items")):
        r = served.request(method, path)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "database_unavailable" and r.headers["retry-after"]
    r = served.create(previous_response_id="resp_x")
    assert r.status_code == 503 and r.headers["retry-after"]


def test_each_tenant_has_its_own_storage_quota_and_retention(served: Served) -> None:
    served.store.put_gate.set()
    refused = served.create("none-stored")
    assert refused.status_code == 400
    assert (refused.json()["error"]["param"], refused.json()["error"]["code"]) == (
        "store",
        "storage_quota_exceeded",
    )
    assert served.create("none-stored", store=False).status_code == 200
    kept = served.create("short-lived").json()["id"]
    default = served.create("plain").json()["id"]
    assert wait_until(lambda: served.store.calls.count("put") == 2)
    short = served.store.get("short-lived", kept, dt.datetime.now(dt.UTC))
    plain = served.store.get("plain", default, dt.datetime.now(dt.UTC))
    assert short is not None and plain is not None
    assert short.expires_at - short.created_at == dt.timedelta(seconds=60)
    assert plain.expires_at - plain.created_at == dt.timedelta(seconds=Settings().response_retention_s)
