"""Issue 21 item 3 end to end: a group that can never fit the KV pool is refused with a 400.

A real engine over a tiny random Llama with a 1,024-token pool behind uvicorn on 127.0.0.1, and
the official openai client: a 960-token prompt with `n: 16` or `beam_width: 16` (each sequence
fits, the group does not) is answered 400 naming `n` / `beam_width`, and nothing of it is queued.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.real_engine_server import RealServer, serve_engine
from tests.engine.tiny_models import make_tiny_model
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig

MODEL = "tiny-llama"
PROMPT = [5] * 960  # 60 full blocks of 16


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    path = make_tiny_model(
        tmp_path_factory.mktemp("tiny-groups"), arch="llama", num_kv_heads=2, max_position_embeddings=2048
    )
    config = EngineConfig(
        model_path=str(path),
        cache=CacheConfig(num_blocks=65, block_size=16),  # 64 usable blocks: 1,024 tokens
        scheduler=SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=16, max_model_len=1024),
    )
    with serve_engine(config, MODEL) as served:
        yield served


@pytest.fixture
def client(real: RealServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=real.url + "/v1", api_key="local", max_retries=0) as c:
        yield c


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 16}, "n"),
        ({"n": 1, "extra_body": {"use_beam_search": True, "beam_width": 16}}, "beam_width"),
        ({"n": 16, "extra_body": {"use_beam_search": True}}, "beam_width"),  # beam_width defaults to n
    ],
)
def test_a_group_larger_than_the_pool_is_refused_with_400(
    client: openai.OpenAI, real: RealServer, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0.0, **extra)
    error = exc.value.body
    assert isinstance(error, dict), error
    assert error["param"] == param and error["code"] == "context_length_exceeded", error
    assert "76 blocks" in error["message"] and "64 blocks" in error["message"], error
    stats = real.engine.stats()
    assert stats.num_waiting == 0 and stats.num_running == 0
    assert stats.num_free_blocks == stats.num_total_blocks
    # The server goes on answering: the same prompt with a group that fits, and a short request.
    fits = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=16,
        n=4,
        temperature=1.0,
        seed=3,
        extra_body={"ignore_eos": True},
    )
    assert len(fits.choices) == 4 and fits.usage is not None and fits.usage.completion_tokens == 4 * 16
    small = client.completions.create(model=MODEL, prompt=[7, 8, 9, 10], max_tokens=2)
    assert small.choices[0].finish_reason in ("length", "stop")
