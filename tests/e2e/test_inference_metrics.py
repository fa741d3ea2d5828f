"""The model-server protocol of the Gateway API Inference Extension, read from a real server.

The endpoint picker the chart deploys (helm/weir/templates/epp-config.yaml) reads queued
requests, running requests, KV-cache utilization, block size and block count from Weir's
/metrics under the names in its "weir" engine config. Here those names are taken from the
rendered chart (the inference-gateway profile) and looked up in a real server's /metrics (real
engine, tiny random Llama, uvicorn on 127.0.0.1): each is an unlabelled gauge, and the values say
what the picker needs them to say, idle and under load.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.async_engine import AsyncEngine
from engine.config import CacheConfig, EngineConfig, SchedulerConfig
from gateway.app import create_app
from gateway.settings import Settings
from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import ADMIN_HEADERS, check_admin_token, serve_in_thread, wait_until
from tests.helm.rendering import picker_config, picker_metric_names, render_profile

MODEL = "tiny-llama"
NUM_BLOCKS, BLOCK_SIZE = 128, 16


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = make_tiny_model(
        tmp_path_factory.mktemp("tiny-igw"), arch="llama", num_kv_heads=2, max_position_embeddings=1024
    )
    # One sequence at a time, so a second request has to wait in the queue.
    engine = AsyncEngine(
        EngineConfig(
            model_path=str(path),
            cache=CacheConfig(num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE),
            scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=1, max_model_len=1024),
        )
    )
    app = create_app(
        Settings(),
        engine,
        engine.tokenizer,
        max_model_len=engine.max_model_len,
        model_name=MODEL,
        vocab_size=engine.model_config.vocab_size,
        on_startup=[engine.start],
        on_shutdown=[engine.shutdown],
        metrics_auth=check_admin_token,
    )
    with serve_in_thread(app) as server_url:
        yield server_url


def _names() -> dict[str, str]:
    return picker_metric_names(picker_config(render_profile("inference-gateway")))


def _gauges(url: str) -> dict[str, float]:
    """Every unlabelled gauge sample of one scrape."""
    text = httpx.get(url + "/metrics", headers=ADMIN_HEADERS, timeout=10).raise_for_status().text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        if family.type == "gauge"
        for sample in family.samples
        if not sample.labels
    }


def test_the_picker_reads_every_protocol_metric_as_a_gauge(url: str) -> None:
    names = _names()
    assert set(names) == {
        "queuedRequestsSpec",
        "runningRequestsSpec",
        "kvUsageSpec",
        "cacheBlockSizeSpec",
        "cacheNumBlocksSpec",
    }
    gauges = _gauges(url)
    missing = {spec: name for spec, name in names.items() if name not in gauges}
    assert missing == {}
    # Idle: nothing queued or running, the pool's shape as configured, utilization a fraction.
    assert gauges[names["queuedRequestsSpec"]] == 0
    assert gauges[names["runningRequestsSpec"]] == 0
    assert gauges[names["cacheBlockSizeSpec"]] == BLOCK_SIZE
    assert gauges[names["cacheNumBlocksSpec"]] == NUM_BLOCKS - 1  # block 0 is the null block, never used
    assert 0 <= gauges[names["kvUsageSpec"]] <= 1


def test_the_protocol_metrics_follow_the_load(url: str) -> None:
    names = _names()
    long_body = {
        "model": MODEL,
        "prompt": "hello " * 10,
        "max_tokens": 800,
        "ignore_eos": True,
        "stream": True,
    }
    short_body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    with httpx.Client(base_url=url, timeout=120) as client:
        with client.stream("POST", "/v1/completions", json=long_body) as stream:
            assert stream.status_code == 200, stream.read()
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))  # it is running
            running = _gauges(url)
            assert running[names["runningRequestsSpec"]] == 1
            assert 0 < running[names["kvUsageSpec"]] <= 1  # its blocks are in use
            # A second request waits behind it (max_num_seqs=1): the queue shows it.
            second: list[httpx.Response] = []
            waiter = threading.Thread(
                target=lambda: second.append(client.post("/v1/completions", json=short_body))
            )
            waiter.start()
            assert wait_until(lambda: _gauges(url)[names["queuedRequestsSpec"]] == 1, 60)
            assert _gauges(url)["weir_num_waiting_tokens"] > 0  # the autoscaler's signal
        # Leaving the stream aborts it; the waiting request then runs and finishes.
        waiter.join(timeout=120)
    assert second and second[0].status_code == 200
    assert wait_until(lambda: _gauges(url)[names["runningRequestsSpec"]] == 0, 30)
    idle = _gauges(url)
    assert idle[names["queuedRequestsSpec"]] == 0 and idle["weir_num_waiting_tokens"] == 0
