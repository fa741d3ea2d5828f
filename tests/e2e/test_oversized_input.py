"""One tenant's oversized request does not freeze the gateway for the others (issue 21, item 1).

A chat of 250,000 empty messages, a 7 MiB prompt or millions of token ids used to be refused only
after seconds of parsing, template rendering and tokenizing on the event loop, while every other
tenant's stream stood still. Here another tenant streams while such requests are refused, and its
chunks keep arriving while each of them is being read and refused: the event loop is never held
for a whole refusal. (Behaviour, not a timing bound: a loaded CI machine stretches every gap; the
bodies are kept to a few MiB so the test stays quick on two cores.)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.tenancy_server import ADMIN, FullServer, serve_everything
from tests.gateway.harness import MODEL


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FullServer]:
    with serve_everything(tmp_path_factory.mktemp("oversized")) as server:
        yield server


def _victim_key(server: FullServer) -> str:
    with httpx.Client(base_url=server.url, headers=ADMIN, timeout=30) as admin:
        assert admin.post("/admin/v1/tenants", json={"name": "victim"}).status_code == 201
        return str(admin.post("/admin/v1/tenants/victim/keys", json={}).json()["key"])


def _oversized_bodies() -> list[tuple[str, bytes]]:
    empty = b'{"role": "user", "content": ""}'
    return [
        # ~3.3 MB: 100,000 empty messages (no content for a length bound to see).
        (
            "/v1/chat/completions",
            b'{"model": "' + MODEL.encode() + b'", "messages": [' + b", ".join([empty] * 100_000) + b"]}",
        ),
        # ~3 MB of text in one prompt.
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": "hello " * 500_000}).encode()),
        # ~3 MB: a million token ids.
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": [5] * 1_000_000}).encode()),
    ]


def test_another_tenants_stream_keeps_flowing_while_oversized_requests_are_refused(
    full: FullServer,
) -> None:
    victim = {"authorization": f"Bearer {_victim_key(full)}"}
    bodies = _oversized_bodies()
    full.engine.token_delay_s = 0.02
    chunk_times: list[float] = []
    first_chunk, attacks_done = threading.Event(), threading.Event()

    def stream() -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "tell me a story"}],
            "max_tokens": 200,
            "ignore_eos": True,
            "logprobs": True,  # token names for logprobs took the tokenizer lock on the event loop
            "stream": True,
        }
        with httpx.stream(
            "POST", f"{full.url}/v1/chat/completions", json=body, headers=victim, timeout=60
        ) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    chunk_times.append(time.monotonic())
                    first_chunk.set()
                if attacks_done.is_set():
                    return

    reader = threading.Thread(target=stream)
    reader.start()
    try:
        assert first_chunk.wait(30)
        statuses = []
        windows: list[tuple[float, float]] = []
        for path, raw in bodies:
            sent = time.monotonic()
            r = httpx.post(
                full.url + path,
                content=raw,
                headers={**full.tenant, "content-type": "application/json"},
                timeout=60,
            )
            statuses.append((r.status_code, r.json()["error"]["param"]))
            windows.append((sent, time.monotonic()))
        health = httpx.get(full.url + "/health", timeout=30)
    finally:
        attacks_done.set()
        reader.join(60)
    assert statuses == [(400, "messages"), (400, "prompt"), (400, "prompt")]
    assert health.status_code == 200
    # The stream flowed through the attack: victim chunks arrived while the oversized bodies were
    # being uploaded, parsed and refused, not only before and after.
    during = [t for t in chunk_times if any(a <= t <= b for a, b in windows)]
    assert len(during) >= len(windows), (len(during), [round(b - a, 2) for a, b in windows])
