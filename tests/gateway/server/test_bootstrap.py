"""`weir serve` assembly: engine config from settings, auth mode, tenancy wiring, usage records."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from pathlib import Path

import pytest

from weir.engine.request import FinishReason
from weir.gateway.admission.accounting import Outcome, Usage, UsageRecord
from weir.gateway.api.protocol import Endpoint
from weir.gateway.server.bootstrap import (
    KernelChoiceError,
    build_tenancy,
    engine_config,
    resolve_auth,
    resolve_model_path,
    set_engine_threads,
    to_usage_record_in,
)
from weir.gateway.settings.settings import AuthMode, Settings


def test_engine_config_from_settings() -> None:
    s = Settings(kv_cache_tokens=1000, max_num_seqs=8, max_num_batched_tokens=512, max_model_len=1024)
    config = engine_config(s, Path("/models/x"), "cpu")
    assert config.model_path == "/models/x" and config.device == "cpu" and config.dtype == "float32"
    assert config.cache.kv_dtype == "float32"
    # ceil(1000 / 16) = 63 blocks of tokens, plus the engine's reserved block
    assert config.cache.num_blocks == 64
    assert (config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens) == (8, 512)
    assert config.scheduler.max_model_len == 1024
    assert engine_config(Settings(max_model_len=64), Path("/m"), "cuda").dtype == "bfloat16"
    held = engine_config(Settings(max_model_len=64, admission_hold_ms=750.0), Path("/m"), "cpu")
    assert held.scheduler.admission_hold_s == 0.75 and config.scheduler.admission_hold_s == 0.0
    assert engine_config(Settings(max_model_len=64), Path("/m"), "cpu").cache.num_blocks is None
    assert config.cache.host_num_blocks == 0  # no host tier by default
    host = engine_config(Settings(max_model_len=64, host_kv_cache_tokens=1000), Path("/m"), "cpu")
    assert host.cache.host_num_blocks == 63  # ceil(1000 / 16): the host pool has no reserved block

    from weir.gateway.server.cpu_cores import usable_cores

    cores = usable_cores()
    assert config.cpu_wide_step_threads == (cores if cores > 1 else None)  # prefill on every core
    off = engine_config(Settings(max_model_len=64, cpu_wide_step_threads=0), Path("/m"), "cpu")
    assert off.cpu_wide_step_threads is None
    assert engine_config(Settings(max_model_len=64), Path("/m"), "cuda").cpu_wide_step_threads is None
    assert config.cpu_kernel_pool  # the C kernels' own helper threads in decode steps, unless off
    no_pool = Settings(max_model_len=64, cpu_kernel_pool=False)
    assert not engine_config(no_pool, Path("/m"), "cpu").cpu_kernel_pool
    assert config.cpu_decode_layers  # a decode step's layers in one C call, unless off
    layer_by_layer = Settings(max_model_len=64, cpu_decode_layers=False)
    assert not engine_config(layer_by_layer, Path("/m"), "cpu").cpu_decode_layers


def test_explicit_model_path_is_used_as_is() -> None:
    assert resolve_model_path(Settings(model_path=Path("/m/a"))) == Path("/m/a")


def test_auth_becomes_keys_once_tenants_exist() -> None:
    assert resolve_auth(Settings(), num_tenants=0) is AuthMode.NONE
    assert resolve_auth(Settings(), num_tenants=1) is AuthMode.KEYS
    assert resolve_auth(Settings(auth=AuthMode.NONE), num_tenants=3) is AuthMode.NONE
    assert resolve_auth(Settings(host="0.0.0.0"), num_tenants=0) is AuthMode.KEYS


def record(outcome: Outcome, reasons: tuple[str, ...], ttft_s: float | None) -> UsageRecord:
    return UsageRecord(
        request_id="chatcmpl-1", tenant_id="acme", key_id="k1", model="m", endpoint=Endpoint.CHAT,
        usage=Usage(10, 5, 4), outcome=outcome, finish_reasons=reasons, created_at=1_700_000_000.0,
        duration_s=0.5, ttft_s=ttft_s,
    )  # fmt: skip


def test_usage_record_conversion() -> None:
    from weir.tenancy.store.enums import UsageStatus

    r = to_usage_record_in(record(Outcome.COMPLETED, ("length", "stop"), 0.1))
    assert (r.request_id, r.tenant_id, r.key_id, r.model) == ("chatcmpl-1", "acme", "k1", "m")
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (10, 5, 4)
    assert r.status is UsageStatus.COMPLETED and r.finish_reason is FinishReason.LENGTH
    assert r.ttft_ms == pytest.approx(100) and r.e2e_ms == pytest.approx(500)
    assert r.created_at == dt.datetime.fromtimestamp(1_700_000_000, tz=dt.UTC)
    cut = to_usage_record_in(record(Outcome.CLIENT_DISCONNECTED, ("abort",), None))
    assert (
        cut.status is UsageStatus.CANCELLED
        and cut.finish_reason is FinishReason.ABORT
        and cut.ttft_ms is None
    )
    assert to_usage_record_in(record(Outcome.FAILED, (), None)).status is UsageStatus.FAILED
    assert r.model_version is None  # no version known: the column stays NULL
    served = dataclasses.replace(record(Outcome.COMPLETED, ("stop",), 0.1), model_version="m@v2")
    assert to_usage_record_in(served).model_version == "m@v2"
    assert r.endpoint == "chat.completion"  # the API it came through (Endpoint's value)
    anthropic = dataclasses.replace(record(Outcome.COMPLETED, ("stop",), 0.1), endpoint=Endpoint.MESSAGES)
    assert to_usage_record_in(anthropic).endpoint == "message"


def test_tenancy_wiring_on_a_fresh_sqlite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wiring = build_tenancy(Settings(data_dir=tmp_path))
    assert (tmp_path / "weir.db").exists()
    assert "Generated an admin token" in capsys.readouterr().out
    assert wiring.num_tenants == 0 and wiring.authenticate is not None and wiring.usage_sink is not None
    paths = {getattr(r, "path", None) for r in wiring.routes}
    assert "/admin/v1" in paths and "/v1/usage" in paths
    assert wiring.start is not None and wiring.close is not None
    asyncio.run(wiring.start())
    asyncio.run(wiring.close())
    # Second start: migrated already, the token is not shown again.
    build_tenancy(Settings(data_dir=tmp_path))
    assert "Generated an admin token" not in capsys.readouterr().out


def test_serve_refuses_an_unmigrated_database_and_names_the_command(tmp_path: Path) -> None:
    from sqlalchemy import create_engine, text

    from weir.tenancy.errors import MigrationRequiredError

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:  # a database from before Weir's schema, or one left behind
        conn.execute(text("CREATE TABLE something_else (id INTEGER PRIMARY KEY)"))
    engine.dispose()
    with pytest.raises(MigrationRequiredError, match="weir db upgrade"):
        build_tenancy(Settings(data_dir=tmp_path, database_url=url))


def test_prefix_caching_settings_reach_the_engine() -> None:
    on = engine_config(Settings(max_model_len=64, tenant_cache_share=0.25), Path("/m"), "cpu")
    assert on.cache.enable_prefix_caching and on.cache.tenant_cache_share == 0.25
    off = engine_config(Settings(max_model_len=64, prefix_caching=False), Path("/m"), "cpu")
    assert not off.cache.enable_prefix_caching
    with pytest.raises(ValueError, match="tenant_cache_share"):
        Settings(tenant_cache_share=0.0)
    env = Settings.from_sources({}, {"WEIR_PREFIX_CACHING": "off", "WEIR_TENANT_CACHE_SHARE": "0.5"})
    assert env.prefix_caching is False and env.tenant_cache_share == 0.5


def test_kernel_settings_reach_the_engine_and_cpu_refuses_cuda_only_choices() -> None:
    from weir.gateway.settings.settings import AttentionBackend, CudaGraphsMode

    auto = engine_config(Settings(max_model_len=64), Path("/m"), "cpu")
    assert (auto.use_triton, auto.use_cuda_graphs) == (None, None)  # the engine's auto: on CUDA only
    env = Settings.from_sources(
        {}, {"WEIR_ATTENTION_BACKEND": "torch", "WEIR_CUDA_GRAPHS": "off", "WEIR_MAX_MODEL_LEN": "64"}
    )
    fallback = engine_config(env, Path("/m"), "cuda")
    assert (fallback.use_triton, fallback.use_cuda_graphs) == (False, False)
    forced = Settings(
        max_model_len=64, attention_backend=AttentionBackend.TRITON, cuda_graphs=CudaGraphsMode.ON
    )
    assert (
        engine_config(forced, Path("/m"), "cuda:0").use_triton,
        engine_config(forced, Path("/m"), "cuda").use_cuda_graphs,
    ) == (True, True)
    with pytest.raises(KernelChoiceError, match="--attention-backend triton needs a CUDA device"):
        engine_config(
            Settings(max_model_len=64, attention_backend=AttentionBackend.TRITON), Path("/m"), "cpu"
        )
    with pytest.raises(ValueError, match="--cuda-graphs on needs a CUDA device"):
        engine_config(Settings(max_model_len=64, cuda_graphs=CudaGraphsMode.ON), Path("/m"), "cpu")
    torch_graphs = Settings(
        max_model_len=64, attention_backend=AttentionBackend.TORCH, cuda_graphs=CudaGraphsMode.ON
    )
    with pytest.raises(ValueError, match="--cuda-graphs on needs the Triton"):
        engine_config(torch_graphs, Path("/m"), "cuda")


def test_target_step_ms_reaches_the_scheduler_in_seconds() -> None:
    # default: a target on CPU, the fixed budget on an accelerator; 0 turns it off anywhere
    assert engine_config(Settings(max_model_len=64), Path("/m"), "cpu").scheduler.target_step_s == 0.8
    assert engine_config(Settings(max_model_len=64), Path("/m"), "cuda").scheduler.target_step_s is None
    off = Settings(max_model_len=64, target_step_ms=0)
    assert engine_config(off, Path("/m"), "cpu").scheduler.target_step_s is None
    config = engine_config(Settings(max_model_len=64, target_step_ms=200), Path("/m"), "cpu")
    assert config.scheduler.target_step_s == pytest.approx(0.2)


def test_cpu_row_weights_reach_the_engine_and_on_needs_cpu_float32() -> None:
    from weir.gateway.settings.settings import CpuRowWeightsMode

    assert engine_config(Settings(max_model_len=64), Path("/m"), "cpu").cpu_row_weights is None  # auto
    off = Settings(max_model_len=64, cpu_row_weights=CpuRowWeightsMode.OFF)
    assert engine_config(off, Path("/m"), "cpu").cpu_row_weights is False
    on = Settings(max_model_len=64, cpu_row_weights=CpuRowWeightsMode.ON)
    assert engine_config(on, Path("/m"), "cpu").cpu_row_weights is True
    with pytest.raises(ValueError, match="cpu_row_weights"):
        engine_config(on, Path("/m"), "cuda")


def test_the_engine_threads_leave_a_core_to_the_front_end_on_cpu_only() -> None:

    import torch

    from weir.gateway.server.cpu_cores import usable_cores

    before = torch.get_num_threads()
    cores = usable_cores()
    try:
        assert set_engine_threads(Settings(), "cpu") == max(1, cores - 1)
        assert torch.get_num_threads() == max(1, cores - 1)
        assert set_engine_threads(Settings(cpu_reserved_cores=0), "cpu") == cores
        assert torch.get_num_threads() == cores
        torch.set_num_threads(1)
        assert set_engine_threads(Settings(), "cuda") is None
        assert torch.get_num_threads() == 1  # untouched on a GPU
    finally:
        torch.set_num_threads(before)


def test_grammar_mask_settings_reach_the_engine() -> None:
    default = engine_config(Settings(max_model_len=64), Path("/m"), "cpu").masks
    assert (default.num_workers, default.max_workers, default.timeout_s, default.queue_timeout_s) == (
        2,
        8,
        5.0,
        30.0,
    )
    s = Settings(
        max_model_len=64, grammar_mask_workers=3, grammar_mask_extra_workers=9, grammar_mask_timeout_s=2.0
    )
    masks = engine_config(s, Path("/m"), "cpu").masks
    assert (masks.num_workers, masks.max_workers, masks.timeout_s, masks.queue_timeout_s) == (
        3,
        12,
        2.0,
        12.0,
    )
