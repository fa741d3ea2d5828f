"""The model-server protocol of the Gateway API Inference Extension, read from a real `weir serve`.

The endpoint picker the chart deploys (helm/weir/templates/epp-config.yaml) reads queued
requests, running requests, KV-cache utilization, block size and block count from Weir's
/metrics under the names in its "weir" engine config. Here those names are taken from the
rendered chart (the inference-gateway profile) and looked up on the metrics port of a real
`weir serve` (a tiny random Llama, 127.0.0.1), as the picker scrapes it: each is one unlabelled
gauge for the pod, and the values say what the picker needs them to say, idle and under load.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import wait_until
from tests.helm.rendering import picker_config, picker_metric_names, render_profile
from weir_bench.weir_process import WeirProcess, run_weir

MODEL = "tiny"
KV_CACHE_TOKENS = 2048


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeirProcess]:
    work = tmp_path_factory.mktemp("igw")
    model = make_tiny_model(work / "model", arch="llama", num_kv_heads=2, max_position_embeddings=1024)
    # One sequence at a time, so a second request has to wait in the queue.
    flags = ["--auth", "none", "--served-model-name", MODEL, "--max-num-seqs", "1"]
    flags += ["--kv-cache-tokens", str(KV_CACHE_TOKENS), "--max-model-len", "1024"]
    with run_weir(model, work / "data", flags) as process:
        yield process


def _names() -> dict[str, str]:
    return picker_metric_names(picker_config(render_profile("inference-gateway")))


def _scrape(server: WeirProcess) -> list[tuple[str, dict[str, str], float]]:
    """Every gauge sample of one scrape of the metrics port (name, labels, value)."""
    text = httpx.get(server.metrics_url, timeout=10).raise_for_status().text
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        if family.type == "gauge"
        for sample in family.samples
    ]


def _gauges(server: WeirProcess) -> dict[str, float]:
    """The unlabelled gauges of one scrape; a name with several series is an error here."""
    samples = _scrape(server)
    names = [name for name, _, _ in samples]
    return {name: value for name, labels, value in samples if not labels and names.count(name) == 1}


def test_the_picker_reads_every_protocol_metric_as_one_gauge_per_pod(server: WeirProcess) -> None:
    names = _names()
    assert set(names) == {
        "queuedRequestsSpec",
        "runningRequestsSpec",
        "kvUsageSpec",
        "cacheBlockSizeSpec",
        "cacheNumBlocksSpec",
    }
    gauges = _gauges(server)
    missing = {spec: name for spec, name in names.items() if name not in gauges}
    assert missing == {}
    # Idle: nothing queued or running, the pool's shape as configured, utilization a fraction.
    assert gauges[names["queuedRequestsSpec"]] == 0
    assert gauges[names["runningRequestsSpec"]] == 0
    assert 0 <= gauges[names["kvUsageSpec"]] <= 1
    # The pool's shape: the same as the one loaded version's own (labelled) gauges say.
    per_version = {name: value for name, labels, value in _scrape(server) if "model_version" in labels}
    assert gauges[names["cacheBlockSizeSpec"]] == per_version["weir_kv_cache_block_size"] > 0
    assert gauges[names["cacheNumBlocksSpec"]] == per_version["weir_kv_cache_total_blocks"] > 0
    blocks = gauges[names["cacheNumBlocksSpec"]] * gauges[names["cacheBlockSizeSpec"]]
    assert KV_CACHE_TOKENS - gauges[names["cacheBlockSizeSpec"]] <= blocks <= KV_CACHE_TOKENS


def test_the_protocol_metrics_follow_the_load(server: WeirProcess) -> None:
    names = _names()
    long_body = {
        "model": MODEL,
        "prompt": "hello " * 10,
        "max_tokens": 800,
        "ignore_eos": True,
        "stream": True,
    }
    short_body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    with httpx.Client(base_url=server.url, timeout=120) as client:
        with client.stream("POST", "/v1/completions", json=long_body) as stream:
            assert stream.status_code == 200, stream.read()
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))  # it is running
            running = _gauges(server)
            assert running[names["runningRequestsSpec"]] == 1
            assert 0 < running[names["kvUsageSpec"]] <= 1  # its blocks are in use
            # A second request waits behind it (max_num_seqs=1): the queue shows it.
            second: list[httpx.Response] = []
            waiter = threading.Thread(
                target=lambda: second.append(client.post("/v1/completions", json=short_body))
            )
            waiter.start()
            assert wait_until(lambda: _gauges(server)[names["queuedRequestsSpec"]] == 1, 60)
            assert _gauges(server)["weir_server_waiting_tokens"] > 0  # the autoscaler's signal
        # Leaving the stream aborts it; the waiting request then runs and finishes.
        waiter.join(timeout=120)
    assert second and second[0].status_code == 200
    assert wait_until(lambda: _gauges(server)[names["runningRequestsSpec"]] == 0, 30)
    idle = _gauges(server)
    assert idle[names["queuedRequestsSpec"]] == 0 and idle["weir_server_waiting_tokens"] == 0
