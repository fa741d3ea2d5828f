"""Issue 28 end to end: a tenant's private LoRA adapter called by name through the real engine.

A tiny random Llama is served behind uvicorn on 127.0.0.1 with a PEFT adapter made here (random
non-zero B) loaded on its engine and registered private to tenant `acme`. Through the official
`openai` client: `acme`'s greedy completion through the adapter differs from the base model's and
equals the engine's own output through that adapter; tenant `globex` gets the same 404 as for a
model that does not exist, and does not see the adapter in `/v1/models`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from tests.engine.lora_adapters import make_adapter
from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import serve_in_thread, wait_until
from weir.engine.async_engine import AsyncEngine
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, LoraConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.request import Priority, SamplingParams
from weir.gateway.admission.accounting import UsageRecord
from weir.gateway.fleet.adapter_catalog import AdapterCatalog
from weir.gateway.http.errors import AuthenticationError
from weir.gateway.server.app import create_app
from weir.gateway.settings.settings import Settings
from weir.tenancy.catalog.adapter_records import AdapterView
from weir.tenancy.context import QuotaLimits, TenantContext
from weir.tenancy.store.enums import AdapterState

MODEL = "tiny-llama"
ADAPTER = "acme-style"
PROMPT = [17, 42, 99, 7, 250, 31, 64, 12]
MAX_TOKENS = 12
TENANTS = {
    "acme-key": TenantContext("acme", "k-acme", Priority.STANDARD, 1.0, "acme", QuotaLimits()),
    "globex-key": TenantContext("globex", "k-globex", Priority.STANDARD, 1.0, "globex", QuotaLimits()),
}


def _config(base: Path, adapter_dir: Path) -> EngineConfig:
    return EngineConfig(
        model_path=str(base),
        cache=CacheConfig(block_size=16, num_blocks=128),
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=512),
        lora=LoraConfig(num_slots=2, max_rank=16, adapter_dir=str(adapter_dir)),
    )


@dataclass
class Served:
    url: str
    direct_adapter: list[int]  # the engine's own greedy tokens through the adapter
    direct_base: list[int]
    decode: object
    records: list[UsageRecord]


def _direct(config: EngineConfig) -> tuple[list[int], list[int]]:
    core = build_engine(config)
    core.adapter_admin.load_adapter(ADAPTER, "style")
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    core.add_request(EngineRequest("a", tuple(PROMPT), params, adapter_name=ADAPTER))
    core.add_request(EngineRequest("b", tuple(PROMPT), params))
    out: dict[str, list[int]] = {"a": [], "b": []}
    while core.has_unfinished():
        for o in core.step():
            assert o.error is None, o.error
            out[o.request_id].extend(o.new_token_ids)
    return out["a"], out["b"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = make_tiny_model(
        tmp_path_factory.mktemp("lora-base"), arch="llama", num_kv_heads=2, max_position_embeddings=512
    )
    adapter_dir = tmp_path_factory.mktemp("lora-adapters")
    make_adapter(base, adapter_dir / "style", rank=8, seed=5, b_std=0.2)
    config = _config(base, adapter_dir)
    direct_adapter, direct_base = _direct(config)

    engine = AsyncEngine(config)
    catalog = AdapterCatalog()
    now = dt.datetime.now(dt.UTC)
    catalog.put(
        AdapterView(ADAPTER, f"{MODEL}@default", "style", "acme", AdapterState.LOADED, None, now, now, "test")
    )
    records: list[UsageRecord] = []

    async def authenticate(authorization: str | None, client: str) -> TenantContext:
        key = (authorization or "").removeprefix("Bearer ")
        if key not in TENANTS:
            raise AuthenticationError("bad key")
        return TENANTS[key]

    async def load_adapter() -> None:
        await engine.load_adapter(ADAPTER, "style")

    app = create_app(
        Settings(),
        engine,
        engine.tokenizer,
        max_model_len=engine.max_model_len,
        model_name=MODEL,
        vocab_size=engine.model_config.vocab_size,
        authenticate=authenticate,
        usage_sink=records.append,
        adapters=catalog,
        on_startup=[engine.start, load_adapter],
        on_shutdown=[engine.shutdown],
    )
    with serve_in_thread(app) as url:
        yield Served(url, direct_adapter, direct_base, engine.tokenizer.decode, records)


def _client(served: Served, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key=key, max_retries=0)


def _complete(client: openai.OpenAI, model: str) -> str:
    r = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, extra_body={"ignore_eos": True}
    )
    return r.choices[0].text


def test_the_adapters_greedy_answer_is_the_engines_and_differs_from_the_base(served: Served) -> None:
    assert served.direct_adapter != served.direct_base  # the adapter changes the tokens
    acme = _client(served, "acme-key")
    through_adapter = _complete(acme, ADAPTER)
    through_base = _complete(acme, MODEL)
    decode = served.decode
    assert through_adapter == decode(served.direct_adapter)  # type: ignore[operator]
    assert through_base == decode(served.direct_base)  # type: ignore[operator]
    assert through_adapter != through_base
    # The usage record is settled after the answer went out: wait for it, as the billing tests do.
    assert wait_until(lambda: {ADAPTER, MODEL} <= {r.model for r in served.records})
    by_model = {r.model: r for r in served.records}
    assert by_model[ADAPTER].adapter == ADAPTER and by_model[ADAPTER].model_version == f"{MODEL}@default"
    assert by_model[MODEL].adapter is None


def test_another_tenant_gets_the_unknown_model_404(served: Served) -> None:
    globex = _client(served, "globex-key")
    with pytest.raises(openai.NotFoundError) as private:
        _complete(globex, ADAPTER)
    with pytest.raises(openai.NotFoundError) as unknown:
        _complete(globex, "no-such-model")
    assert private.value.code == unknown.value.code == "model_not_found"
    assert private.value.body["message"].replace(ADAPTER, "X") == unknown.value.body["message"].replace(  # type: ignore[index]
        "no-such-model", "X"
    )
    assert [m.id for m in globex.models.list()] == [MODEL]
    assert [m.id for m in _client(served, "acme-key").models.list()] == [MODEL, ADAPTER]
