"""One tenant's grammar never holds another tenant's stream (issue 54), on the real model.

SmolLM2-135M-Instruct behind a real server on 127.0.0.1, the official openai client. While a
victim streams, an attacker sends the regex that once held every tenant's step for minutes
(refused with 400 before anything compiles: four repetitions nested in one another, 256^4 copies) and
then a regex of nested counted repetitions within the bound, which is served and follows its pattern. The
victim's stream runs to its end with every token. Behaviour only: no timing thresholds here
(`python -m weir_bench.experiments.attacker --flood regex` measures the gaps).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.real_engine_server import RealServer, serve_engine
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig

pytestmark = pytest.mark.slow

MODEL = "smollm2"
ATTACK = "(((([a-z]{0,256}){0,256}){0,256}){0,256})"
SERVED = "([a-z]{1,8} ){1,8}"


@pytest.fixture(scope="module")
def real(default_model_dir: Path) -> Iterator[RealServer]:
    config = EngineConfig(
        model_path=str(default_model_dir),
        cache=CacheConfig(num_blocks=256, block_size=16),
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=1024),
    )
    with serve_engine(config, MODEL) as served:
        yield served


def _client(real: RealServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=real.url + "/v1", api_key=key, max_retries=0, timeout=300)


def test_a_costly_regex_never_holds_another_tenants_stream(real: RealServer) -> None:
    chunks: list[str] = []
    finish: list[str] = []
    usage: list[int] = []
    started = threading.Event()

    def victim() -> None:
        with _client(real, "victim") as client:
            stream = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Tell me about rivers."}],
                max_tokens=48,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            for chunk in stream:
                started.set()
                if chunk.usage is not None:
                    usage.append(chunk.usage.completion_tokens)
                for choice in chunk.choices:
                    if choice.delta.content:
                        chunks.append(choice.delta.content)
                    if choice.finish_reason:
                        finish.append(choice.finish_reason)

    thread = threading.Thread(target=victim)
    thread.start()
    try:
        started.wait(timeout=300)
        with _client(real, "attacker") as attacker:
            with pytest.raises(openai.BadRequestError) as info:
                attacker.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "letters"}],
                    max_tokens=16,
                    extra_body={"structured_outputs": {"regex": ATTACK}},
                )
            body = info.value.body
            assert isinstance(body, dict)
            assert body["param"] == "structured_outputs.regex" and body["code"] == "grammar_too_complex"
            assert "nested" in body["message"]
            answer = attacker.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "letters"}],
                max_tokens=24,
                temperature=1.0,
                seed=5,
                extra_body={"structured_outputs": {"regex": SERVED}},
            )
        choice = answer.choices[0]
        text = choice.message.content or ""
        if choice.finish_reason == "stop":
            assert re.fullmatch(SERVED, text)
        else:  # cut by max_tokens: a prefix the pattern still admits
            assert choice.finish_reason == "length" and re.fullmatch("([a-z]{1,8} ){0,8}[a-z]{0,8}", text)
    finally:
        thread.join(timeout=600)
    assert not thread.is_alive()
    assert finish == ["length"] and usage == [48] and chunks  # every token of the victim's stream came
