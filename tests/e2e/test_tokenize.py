"""`POST /tokenize` and `POST /detokenize` end to end: SmolLM2-135M-Instruct behind a real server.

The ids are the model tokenizer's own, and those of a chat are the ids the chat route feeds the
engine (its usage's prompt tokens); the text of the ids comes back; hostile bodies get a 400
naming the field; a tenant key is required where keys are on (the tenancy server).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.real_engine_server import RealServer, serve_engine
from tests.e2e.tenancy_server import FullServer, serve_everything
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig

MODEL = "smollm2"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour. Ünïcödé and emoji 🌈 too."},
]


@pytest.fixture(scope="module")
def real(default_model_dir: Path) -> Iterator[RealServer]:
    config = EngineConfig(
        model_path=str(default_model_dir),
        cache=CacheConfig(num_blocks=256, block_size=16),
        scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8, max_model_len=2048),
    )
    with serve_engine(config, MODEL) as served:
        yield served


@pytest.fixture
def http(real: RealServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=real.url, timeout=120) as c:
        yield c


@pytest.mark.slow
def test_prompt_round_trip_is_the_tokenizers(real: RealServer, http: httpx.Client) -> None:
    text = "The quick brown fox, 🦊, jumps."
    r = http.post("/tokenize", json={"model": MODEL, "prompt": text})
    assert r.status_code == 200, r.text
    body = r.json()
    expected = real.engine.tokenizer.encode(text, add_special_tokens=True)
    assert body["tokens"] == expected and body["count"] == len(expected)
    assert body["max_model_len"] == 2048
    back = http.post("/detokenize", json={"model": MODEL, "tokens": body["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": text}
    # model left out: the served one
    assert http.post("/tokenize", json={"prompt": text}).json()["tokens"] == expected


@pytest.mark.slow
def test_messages_are_the_chat_routes_ids(real: RealServer, http: httpx.Client) -> None:
    r = http.post("/tokenize", json={"model": MODEL, "messages": MESSAGES})
    assert r.status_code == 200, r.text
    ids = r.json()["tokens"]
    rendered = real.engine.tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert ids == real.engine.tokenizer.encode(rendered, add_special_tokens=False)
    chat = http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 1, "temperature": 0}
    )
    assert chat.status_code == 200 and chat.json()["usage"]["prompt_tokens"] == len(ids)
    no_turn = http.post(
        "/tokenize", json={"model": MODEL, "messages": MESSAGES, "add_generation_prompt": False}
    ).json()["tokens"]
    assert len(no_turn) < len(ids) and ids[: len(no_turn)] == no_turn
    text = http.post("/detokenize", json={"tokens": ids}).json()["prompt"]
    assert text == rendered


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"model": MODEL}, "prompt"),
        ("/tokenize", {"model": MODEL, "prompt": "a", "messages": MESSAGES}, "prompt"),
        ("/tokenize", {"prompt": 7}, "prompt"),
        ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
        ("/tokenize", {"messages": [{"role": "user", "content": "x"}] * 100_000}, "messages"),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ("/tokenize", {"prompt": "x" * 2_000_000}, "prompt"),
        ("/tokenize", {"model": "nope", "prompt": "a"}, "model"),
        ("/detokenize", {"tokens": [-1]}, "tokens[0]"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/detokenize", {"tokens": [1] * 70_000}, "tokens"),
        ("/detokenize", {}, "tokens"),
    ],
)
def test_hostile_bodies_name_the_field(
    http: httpx.Client, path: str, body: dict[str, object], param: str
) -> None:
    r = http.post(path, json=body)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["param"] == param


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FullServer]:
    with serve_everything(tmp_path_factory.mktemp("tokenize")) as served:
        yield served


def test_tokenize_needs_the_tenants_key(full: FullServer) -> None:
    with httpx.Client(base_url=full.url, timeout=30) as c:
        assert c.post("/tokenize", json={"prompt": "hello"}).status_code == 401
        r = c.post("/tokenize", json={"prompt": "hello"}, headers=full.tenant)
        assert r.status_code == 200 and r.json()["count"] == len(r.json()["tokens"]) > 0
        back = c.post("/detokenize", json={"tokens": r.json()["tokens"]}, headers=full.tenant)
        assert back.status_code == 200 and "hello" in back.json()["prompt"]
