"""End to end over the real engine: uvicorn on 127.0.0.1, the official openai client and httpx.

The engine runs a tiny random Llama (built in a fixture) so these tests are quick on a CPU; the
gateway, tokenizer, chat template, detokenizer and scheduler are all the real ones.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.real_engine_server import RealServer, serve_engine
from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import ADMIN_HEADERS, wait_until
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir_bench.server_metrics import check_agreement, parse_server_metrics

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    path = make_tiny_model(
        tmp_path_factory.mktemp("tiny-e2e"), arch="llama", num_kv_heads=2, max_position_embeddings=512
    )
    config = EngineConfig(
        model_path=str(path),
        cache=CacheConfig(num_blocks=256, block_size=16),
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16, max_model_len=512),
    )
    with serve_engine(config, MODEL) as served:
        yield served


@pytest.fixture
def client(real: RealServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=real.url + "/v1", api_key="local", max_retries=0) as c:
        yield c


MESSAGES = [{"role": "user", "content": "Hello, world! How are you today?"}]


def test_streamed_chat_equals_the_non_streamed_answer(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage, reasons = [], None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    assert "".join(pieces) == whole.choices[0].message.content
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens > 0
    assert reasons == [whole.choices[0].finish_reason]


def test_completion_seed_reproduces_and_n_gives_distinct_choices(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL, prompt="The quick brown fox", max_tokens=12, temperature=1.0, seed=42)
    a = client.completions.create(**kwargs)
    b = client.completions.create(**kwargs)
    assert a.choices[0].text == b.choices[0].text
    many = client.completions.create(n=3, **{**kwargs, "seed": 7})
    assert sorted(c.index for c in many.choices) == [0, 1, 2]
    assert len({c.text for c in many.choices}) > 1  # each choice follows its own seed


def test_stop_string_cuts_the_answer(client: openai.OpenAI) -> None:
    full = client.completions.create(model=MODEL, prompt="Paged attention", max_tokens=20, temperature=0)
    text = full.choices[0].text
    if len(text) < 6:
        pytest.skip("the random model produced too little text to cut")
    stop = text[3:6]
    cut = client.completions.create(
        model=MODEL, prompt="Paged attention", max_tokens=20, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]


def test_logprobs_are_returned(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert item.top_logprobs[0].logprob >= item.logprob - 1e-6  # greedy picks the best


def test_logit_bias_forces_and_bans_tokens(client: openai.OpenAI, real: RealServer) -> None:
    tokenizer = real.engine.tokenizer
    river = tokenizer.encode(" river", add_special_tokens=False)[0]
    lake = tokenizer.encode(" lake", add_special_tokens=False)[0]
    kwargs = dict(model=MODEL, prompt="Paged attention", max_tokens=3, temperature=0)
    forced = client.completions.create(logit_bias={str(river): 100, str(lake): 99}, **kwargs)
    assert forced.choices[0].text == tokenizer.decode([river] * 3)
    banned = client.completions.create(logit_bias={str(river): -100, str(lake): 99}, **kwargs)
    assert banned.choices[0].text == tokenizer.decode([lake] * 3)


def test_bad_requests_are_refused_with_openai_errors(client: openai.OpenAI, real: RealServer) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10_000)
    assert "context" in str(exc.value).lower()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=4)
    r = httpx.post(
        real.url + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_client_disconnect_frees_every_kv_block(real: RealServer) -> None:
    stats = real.engine.stats
    assert wait_until(lambda: stats().num_free_blocks == stats().num_total_blocks)
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 400,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    with (
        httpx.Client(base_url=real.url, timeout=30) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        chunks = 0
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks += 1
            if chunks >= 3:
                break
        assert stats().num_free_blocks < stats().num_total_blocks  # the request holds blocks mid-stream
    # the connection is closed: the gateway aborts the request and every block comes back
    assert wait_until(
        lambda: stats().num_free_blocks == stats().num_total_blocks and stats().num_running == 0
    )


def test_bench_report_agrees_with_the_server_metrics(real: RealServer, tmp_path: Path) -> None:
    from weir_bench.serve import ServeConfig, run_serve

    trace = tmp_path / "trace.jsonl"
    rows = [
        {
            "id": f"r{i}",
            "t": i * 0.05,
            "tenant": "default",
            "priority": "standard",
            "kind": "chat",
            "messages": [{"role": "user", "content": "Tell me about the scheduler " * (i + 1)}],
            "max_tokens": 6 + i,
            "ignore_eos": True,
        }
        for i in range(6)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = parse_server_metrics(httpx.get(real.url + "/metrics", headers=ADMIN_HEADERS).text)
    result = asyncio.run(
        run_serve(ServeConfig(url=real.url, workload=trace, out_dir=tmp_path / "out", api_key="local"))
    )
    after = parse_server_metrics(httpx.get(real.url + "/metrics", headers=ADMIN_HEADERS).text)
    overall = result.report["overall"]
    assert overall["ok"] == 6 and overall["output_tokens"] == sum(6 + i for i in range(6))
    agreement = check_agreement(overall, after.minus(before))
    assert agreement.ok, agreement.problems
