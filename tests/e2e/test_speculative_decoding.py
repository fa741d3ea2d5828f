"""Speculative decoding end to end: uvicorn on 127.0.0.1 over the real engine (a tiny random Llama)
with the n-gram drafter, the official openai client and httpx. The answer equals the
non-speculative one, the usage reports the prediction counts, `/metrics` has the speculation
families, and the per-request `speculative` field opts out or is refused with beam search."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.real_engine_server import serve_engine
from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import ADMIN_HEADERS
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.speculative_config import SpeculativeConfig, SpeculativeMethod

MODEL = "tiny-llama"
# A prompt that repeats itself, so the n-gram drafter finds something to propose.
PROMPT = "0 1 2 3 4 5 6 7 8 9 10 11 0 1 2 3 4 5 6 7 8 9 10 11 0 1 2 3 4 5 6 7 8 9"


@dataclass
class Served:
    url: str


def _serve(path: Path, spec: SpeculativeConfig) -> Iterator[Served]:
    config = EngineConfig(
        model_path=str(path),
        cache=CacheConfig(num_blocks=256, block_size=16),
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16, max_model_len=512),
        speculative=spec,
    )
    with serve_engine(config, MODEL) as served:
        yield Served(served.url)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-spec"), num_kv_heads=2, max_position_embeddings=512)


@pytest.fixture(scope="module")
def speculating(tiny: Path) -> Iterator[Served]:
    yield from _serve(tiny, SpeculativeConfig(SpeculativeMethod.NGRAM, 4))


@pytest.fixture(scope="module")
def plain(tiny: Path) -> Iterator[Served]:
    yield from _serve(tiny, SpeculativeConfig())


def _complete(served: Served, **extra: object) -> openai.types.Completion:
    with openai.OpenAI(base_url=served.url + "/v1", api_key="local", max_retries=0) as client:
        return client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=32, temperature=0, extra_body=extra or None
        )


def test_same_answer_and_prediction_counts_in_usage(speculating: Served, plain: Served) -> None:
    spec = _complete(speculating, ignore_eos=True)
    base = _complete(plain, ignore_eos=True)
    assert spec.choices[0].text == base.choices[0].text
    details = spec.usage.completion_tokens_details if spec.usage else None
    assert details is not None
    accepted, rejected = details.accepted_prediction_tokens, details.rejected_prediction_tokens
    assert accepted is not None and rejected is not None and accepted + rejected > 0
    assert base.usage is not None and base.usage.completion_tokens_details is None


def test_metrics_report_speculation(speculating: Served) -> None:
    _complete(speculating, ignore_eos=True)
    text = httpx.get(speculating.url + "/metrics", headers=ADMIN_HEADERS, timeout=30).text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("weir_spec_decode_")
    }
    assert values["weir_spec_decode_draft_tokens_total"] > 0
    assert (
        0 <= values["weir_spec_decode_accepted_tokens_total"] <= values["weir_spec_decode_draft_tokens_total"]
    )
    assert values["weir_spec_decode_emitted_tokens_total"] >= values["weir_spec_decode_accepted_tokens_total"]
    assert 0 <= values["weir_spec_decode_acceptance_rate"] <= 1


def test_a_request_can_opt_out(speculating: Served) -> None:
    out = _complete(speculating, ignore_eos=True, speculative=False)
    assert out.usage is not None and out.usage.completion_tokens_details is None


def test_speculation_with_beam_search_is_refused(speculating: Served) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "use_beam_search": True, "speculative": True}
    response = httpx.post(speculating.url + "/v1/completions", json=body, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "speculative" and "beam search" in error["message"]
    body["speculative"] = "yes"
    response = httpx.post(speculating.url + "/v1/completions", json=body, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "speculative"
    del body["speculative"]  # left out: beam search runs, without speculation
    assert httpx.post(speculating.url + "/v1/completions", json=body, timeout=60).status_code == 200
