"""The host KV tier end to end: uvicorn on 127.0.0.1 over the real engine (a tiny random Llama)
with a device pool too small for the concurrent requests and a host tier. Greedy answers through
the official openai client equal those of a server with a pool that holds everything, and
`/metrics` shows the swaps (weir_preemptions_by_mode, blocks swapped, weir_num_requests_swapped)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.real_engine_server import serve_engine
from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import ADMIN_HEADERS
from weir.engine.config import CacheConfig, EngineConfig, PreemptionMode, SchedulerConfig

MODEL = "tiny-llama"
PROMPTS = [f"The scheduler runs decode tokens first, request {i}, then chunked prefill." for i in range(6)]


@contextmanager
def _serve(path: Path, num_blocks: int, host_num_blocks: int) -> Iterator[str]:
    config = EngineConfig(
        model_path=str(path),
        cache=CacheConfig(
            num_blocks=num_blocks,
            block_size=16,
            host_num_blocks=host_num_blocks,
            preemption_mode=PreemptionMode.SWAP,
        ),
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16, max_model_len=512),
    )
    with serve_engine(config, MODEL) as served:
        yield served.url


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("tiny-host-kv"), num_kv_heads=2, max_position_embeddings=512
    )


def _answers(url: str) -> list[str]:
    def one(prompt: str) -> str:
        with openai.OpenAI(base_url=url + "/v1", api_key="local", max_retries=0, timeout=120) as client:
            done = client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=48, temperature=0, extra_body={"ignore_eos": True}
            )
        return done.choices[0].text

    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # all at once: the small pool must preempt
        return list(pool.map(one, PROMPTS))


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics", headers=ADMIN_HEADERS, timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_answers_equal_an_unconstrained_servers_and_the_swaps_show_on_metrics(tiny: Path) -> None:
    with _serve(tiny, num_blocks=256, host_num_blocks=0) as url:
        reference = _answers(url)
    with _serve(tiny, num_blocks=13, host_num_blocks=128) as url:  # 12 blocks: about two requests at a time
        assert _answers(url) == reference
        got = _metrics(url)
    assert got[("weir_preemptions_by_mode_total", (("mode", "swap"),))] > 0
    assert got[("weir_kv_blocks_swapped_out_total", ())] > 0
    assert got[("weir_kv_blocks_swapped_in_total", ())] > 0
    assert got[("weir_num_requests_swapped", ())] == 0  # all done: nothing left on the host
    assert got[("weir_host_kv_cache_total_blocks", ())] == 128
