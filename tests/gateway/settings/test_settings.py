"""Settings: CLI over env over defaults, validation naming the field, auth mode resolution."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from weir.gateway.server.serve_flags import add_serve_arguments
from weir.gateway.settings.settings import CPU_TARGET_STEP_MS, AuthMode, LogLevel, OtelExporter, Settings


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_without_env_or_flags() -> None:
    s = Settings.from_sources(parse([]), {"HOME": "/home/u"})
    assert (s.host, s.port) == ("127.0.0.1", 8000)
    assert s.model_path is None
    assert s.otel_exporter is OtelExporter.NONE
    assert s.log_level is LogLevel.INFO
    assert s.resolved_database_url == f"sqlite:///{s.data_dir / 'weir.db'}"
    assert s.data_dir.name == "weir" and s.cache_dir.name == "weir"


def test_xdg_directories_are_honoured() -> None:
    s = Settings.from_sources({}, {"XDG_DATA_HOME": "/xdg/data", "XDG_CACHE_HOME": "/xdg/cache"})
    assert s.data_dir == Path("/xdg/data/weir")
    assert s.cache_dir == Path("/xdg/cache/weir")


def test_env_values_are_parsed() -> None:
    env = {
        "WEIR_PORT": "9001",
        "WEIR_DATA_DIR": "/srv/weir",
        "WEIR_MODEL": "/models/x",
        "WEIR_KV_CACHE_TOKENS": "4096",
        "WEIR_OTEL_EXPORTER": "console",
        "WEIR_SHUTDOWN_GRACE_S": "2.5",
        "WEIR_ADMIN_TOKEN": "secret",
        "WEIR_LOG_LEVEL": "debug",
        "WEIR_AUTH": "keys",
    }
    s = Settings.from_sources({}, env)
    assert s.port == 9001
    assert s.data_dir == Path("/srv/weir")
    assert s.model_path == Path("/models/x")
    assert s.kv_cache_tokens == 4096
    assert s.otel_exporter is OtelExporter.CONSOLE
    assert s.shutdown_grace_s == 2.5
    assert s.admin_token == "secret"
    assert s.log_level is LogLevel.DEBUG
    assert s.auth is AuthMode.KEYS
    assert s.resolved_database_url == "sqlite:////srv/weir/weir.db"


def test_cli_wins_over_env() -> None:
    args = parse(["--port", "7000", "--data-dir", "/cli", "--dtype", "bfloat16", "--kv-cache-tokens", "64"])
    s = Settings.from_sources(args, {"WEIR_PORT": "9001", "WEIR_DATA_DIR": "/env", "WEIR_DTYPE": "float16"})
    assert (s.port, s.data_dir, s.dtype, s.kv_cache_tokens) == (7000, Path("/cli"), "bfloat16", 64)


def test_empty_env_value_means_unset() -> None:
    assert Settings.from_sources({}, {"WEIR_PORT": ""}).port == 8000


def test_secrets_are_not_command_line_flags_and_not_in_repr() -> None:
    s = Settings.from_sources(
        {"admin_token": "from-cli"}, {"WEIR_ADMIN_TOKEN": "from-env", "WEIR_KEY_PEPPER": "p"}
    )
    assert s.admin_token == "from-env"
    assert "from-env" not in repr(s) and "'p'" not in repr(s)


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"WEIR_PORT": "eighty"}, "WEIR_PORT"),
        ({"WEIR_PORT": "70000"}, "port"),
        ({"WEIR_DTYPE": "int8"}, "dtype"),
        ({"WEIR_MAX_NUM_SEQS": "0"}, "max_num_seqs"),
        ({"WEIR_KV_CACHE_TOKENS": "-1"}, "kv_cache_tokens"),
        ({"WEIR_SHUTDOWN_GRACE_S": "-1"}, "shutdown_grace_s"),
        ({"WEIR_OTEL_EXPORTER": "jaeger"}, "WEIR_OTEL_EXPORTER"),
        ({"WEIR_MAX_REQUEST_BODY_BYTES": "10"}, "max_request_body_bytes"),
        ({"WEIR_ATTENTION_BACKEND": "cuda"}, "WEIR_ATTENTION_BACKEND"),
        ({"WEIR_CUDA_GRAPHS": "yes"}, "WEIR_CUDA_GRAPHS"),
    ],
)
def test_invalid_values_name_the_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Settings.from_sources({}, env)


@pytest.mark.parametrize(
    "var", ["WEIR_MAX_QUEUE_TIME_S", "WEIR_LEASE_TTL_S", "WEIR_SHUTDOWN_GRACE_S", "WEIR_TARGET_STEP_MS"]
)
def test_nan_is_refused_not_taken_for_no_limit(var: str) -> None:
    with pytest.raises(ValueError, match=var.removeprefix("WEIR_").lower()):
        Settings.from_sources({}, {var: "nan"})


def test_auth_mode_defaults() -> None:
    assert Settings().auth_mode is AuthMode.NONE  # fresh local install
    assert Settings(host="0.0.0.0").auth_mode is AuthMode.KEYS
    assert Settings(admin_token="t").auth_mode is AuthMode.KEYS
    assert Settings(host="::1").auth_mode is AuthMode.NONE
    assert Settings(host="0.0.0.0", auth=AuthMode.NONE).auth_mode is AuthMode.NONE


def test_model_name_and_dtype_resolution() -> None:
    assert Settings().model_name() == "SmolLM2-135M-Instruct"
    assert Settings(model_path=Path("/m/my-model")).model_name() == "my-model"
    assert Settings(served_model_name="alias").model_name(Path("/m/x")) == "alias"
    assert Settings().resolved_dtype("cpu") == "float32"
    assert Settings().resolved_dtype("cuda") == "bfloat16"
    assert Settings(dtype="float16").resolved_dtype("cpu") == "float16"


def test_forwarded_allow_ips() -> None:
    assert Settings.from_sources({}, {}).forwarded_allow_ips == ()
    assert Settings.from_sources({}, {"WEIR_FORWARDED_ALLOW_IPS": ""}).forwarded_allow_ips == ()
    env = {"WEIR_FORWARDED_ALLOW_IPS": " 10.0.0.0/8, 192.168.1.7 ,"}
    assert Settings.from_sources({}, env).forwarded_allow_ips == ("10.0.0.0/8", "192.168.1.7")
    cli = {"forwarded_allow_ips": "*"}
    assert Settings.from_sources(cli, env).forwarded_allow_ips == ("*",)
    with pytest.raises(ValueError, match="forwarded_allow_ips"):
        Settings.from_sources({"forwarded_allow_ips": "proxy.local"}, {})
    with pytest.raises(ValueError, match="forwarded_allow_ips"):
        Settings(forwarded_allow_ips=("not-an-ip",))


def test_kernel_fallback_flags_and_env() -> None:
    from weir.gateway.settings.settings import AttentionBackend, CudaGraphsMode

    assert (Settings().attention_backend, Settings().cuda_graphs) == (
        AttentionBackend.AUTO,
        CudaGraphsMode.AUTO,
    )
    args = parse(["--attention-backend", "torch", "--cuda-graphs", "off"])
    s = Settings.from_sources(args, {"WEIR_ATTENTION_BACKEND": "triton", "WEIR_CUDA_GRAPHS": "on"})
    assert (s.attention_backend, s.cuda_graphs) == (
        AttentionBackend.TORCH,
        CudaGraphsMode.OFF,
    )  # the flag wins
    env = Settings.from_sources({}, {"WEIR_ATTENTION_BACKEND": "triton", "WEIR_CUDA_GRAPHS": "on"})
    assert (env.attention_backend, env.cuda_graphs) == (AttentionBackend.TRITON, CudaGraphsMode.ON)
    with pytest.raises(SystemExit):
        parse(["--attention-backend", "cuda"])


def test_target_step_ms_flag_and_env() -> None:
    default = Settings()
    assert default.target_step_ms is None  # the device's default
    assert default.resolved_target_step_s("cpu") == CPU_TARGET_STEP_MS / 1000
    assert default.resolved_target_step_s("cuda") is None  # a GPU keeps the fixed budget
    assert Settings.from_sources(parse(["--target-step-ms", "200"]), {}).target_step_ms == 200.0
    assert (
        Settings.from_sources({}, {"WEIR_TARGET_STEP_MS": "150.5"}).resolved_target_step_s("cuda") == 0.1505
    )
    off = Settings.from_sources({}, {"WEIR_TARGET_STEP_MS": "0"})  # 0: none, the fixed budget
    assert off.resolved_target_step_s("cpu") is None and off.resolved_target_step_s("cuda") is None
    with pytest.raises(ValueError, match="target_step_ms"):
        Settings.from_sources({}, {"WEIR_TARGET_STEP_MS": "-5"})
    with pytest.raises(ValueError, match="WEIR_TARGET_STEP_MS"):
        Settings.from_sources({}, {"WEIR_TARGET_STEP_MS": "fast"})


def test_admission_hold_ms_flag_and_env() -> None:
    assert Settings().admission_hold_ms == 0.0  # admitted at once unless asked for
    assert Settings.from_sources(parse(["--admission-hold-ms", "1000"]), {}).admission_hold_ms == 1000.0
    assert Settings.from_sources({}, {"WEIR_ADMISSION_HOLD_MS": "250.5"}).admission_hold_ms == 250.5
    for bad in ("-1", "inf"):
        with pytest.raises(ValueError, match="admission_hold_ms"):
            Settings.from_sources({}, {"WEIR_ADMISSION_HOLD_MS": bad})


def test_host_kv_cache_tokens_flag_and_env() -> None:
    assert Settings().host_kv_cache_tokens == 0  # no host tier unless asked for
    assert Settings.from_sources(parse(["--host-kv-cache-tokens", "32768"]), {}).host_kv_cache_tokens == 32768
    assert Settings.from_sources({}, {"WEIR_HOST_KV_CACHE_TOKENS": "4096"}).host_kv_cache_tokens == 4096
    with pytest.raises(ValueError, match="host_kv_cache_tokens"):
        Settings.from_sources({}, {"WEIR_HOST_KV_CACHE_TOKENS": "-1"})
    with pytest.raises(ValueError, match="WEIR_HOST_KV_CACHE_TOKENS"):
        Settings.from_sources({}, {"WEIR_HOST_KV_CACHE_TOKENS": "lots"})


def test_model_version_and_memory_budget_flags_and_env() -> None:
    assert (Settings().model_version, Settings().memory_budget_mib) == ("default", None)
    s = Settings.from_sources(parse(["--model-version", "v2", "--memory-budget-mib", "4096"]), {})
    assert (s.model_version, s.memory_budget_mib) == ("v2", 4096)
    env = Settings.from_sources({}, {"WEIR_MODEL_VERSION": "2024-06.1", "WEIR_MEMORY_BUDGET_MIB": "512"})
    assert (env.model_version, env.memory_budget_mib) == ("2024-06.1", 512)
    with pytest.raises(ValueError, match="model_version"):
        Settings(model_version="v 2")
    with pytest.raises(ValueError, match="memory_budget_mib"):
        Settings(memory_budget_mib=0)


def test_speculative_decoding_settings() -> None:
    assert (Settings().speculative, Settings().num_speculative_tokens) == ("off", 4)
    env = Settings.from_sources({}, {"WEIR_SPECULATIVE": "ngram", "WEIR_NUM_SPECULATIVE_TOKENS": "6"})
    assert (env.speculative, env.num_speculative_tokens) == ("ngram", 6)
    args = parse(["--speculative", "draft:/models/small", "--num-speculative-tokens", "3"])
    cli = Settings.from_sources(args, {"WEIR_SPECULATIVE": "ngram"})
    assert (cli.speculative, cli.num_speculative_tokens) == ("draft:/models/small", 3)
    with pytest.raises(ValueError, match="speculative must be off, ngram or draft:<path>"):
        Settings(speculative="medusa")
    with pytest.raises(ValueError, match="draft:<path> needs the draft model's path"):
        Settings(speculative="draft:")
    with pytest.raises(ValueError, match="num_speculative_tokens must be in"):
        Settings(speculative="ngram", num_speculative_tokens=0)


def test_cpu_row_weights_flag_and_env() -> None:
    from weir.gateway.settings.settings import CpuRowWeightsMode

    assert Settings().cpu_row_weights is CpuRowWeightsMode.AUTO
    args = parse(["--cpu-row-weights", "off"])
    assert (
        Settings.from_sources(args, {"WEIR_CPU_ROW_WEIGHTS": "on"}).cpu_row_weights is CpuRowWeightsMode.OFF
    )
    env = Settings.from_sources({}, {"WEIR_CPU_ROW_WEIGHTS": "on"})
    assert env.cpu_row_weights is CpuRowWeightsMode.ON
    with pytest.raises(ValueError, match="WEIR_CPU_ROW_WEIGHTS"):
        Settings.from_sources({}, {"WEIR_CPU_ROW_WEIGHTS": "yes"})
    with pytest.raises(SystemExit):
        parse(["--cpu-row-weights", "maybe"])


def test_tokenizer_inline_bytes_flag_and_env() -> None:
    assert Settings.from_sources(parse([]), {}).tokenizer_inline_bytes == 512
    assert Settings.from_sources({}, {"WEIR_TOKENIZER_INLINE_BYTES": "0"}).tokenizer_inline_bytes == 0
    assert (
        Settings.from_sources(parse(["--tokenizer-inline-bytes", "2048"]), {}).tokenizer_inline_bytes == 2048
    )
    with pytest.raises(ValueError, match="tokenizer_inline_bytes"):
        Settings.from_sources({}, {"WEIR_TOKENIZER_INLINE_BYTES": "-1"})


def test_gil_switch_interval_flag_and_env() -> None:
    assert Settings().gil_switch_interval_ms == 0.5
    args = parse(["--gil-switch-interval-ms", "2"])
    assert Settings.from_sources(args, {"WEIR_GIL_SWITCH_INTERVAL_MS": "1"}).gil_switch_interval_ms == 2.0
    assert Settings.from_sources({}, {"WEIR_GIL_SWITCH_INTERVAL_MS": "5"}).gil_switch_interval_ms == 5.0
    for bad in ("0", "-1", "2000", "nan"):
        with pytest.raises(ValueError, match="gil_switch_interval_ms"):
            Settings.from_sources({}, {"WEIR_GIL_SWITCH_INTERVAL_MS": bad})


def test_prefill_steps_get_every_core_unless_told_otherwise() -> None:
    assert Settings().cpu_wide_step_threads is None
    assert Settings().wide_step_threads("cpu", 2) == 2  # decode steps keep 1 of the 2 cores
    assert Settings().wide_step_threads("cpu", 16) == 16
    assert Settings().wide_step_threads("cpu", 1) is None  # the engine's own count: nothing to switch
    assert Settings(cpu_reserved_cores=0).wide_step_threads("cpu", 2) is None
    assert Settings(cpu_wide_step_threads=0).wide_step_threads("cpu", 2) is None  # off
    assert Settings(cpu_wide_step_threads=3).wide_step_threads("cpu", 8) == 3
    assert Settings().wide_step_threads("cuda", 16) is None
    args = parse(["--cpu-wide-step-threads", "0"])
    assert Settings.from_sources(args, {"WEIR_CPU_WIDE_STEP_THREADS": "3"}).cpu_wide_step_threads == 0
    assert Settings.from_sources({}, {"WEIR_CPU_WIDE_STEP_THREADS": "3"}).cpu_wide_step_threads == 3
    with pytest.raises(ValueError, match="cpu_wide_step_threads"):
        Settings.from_sources({}, {"WEIR_CPU_WIDE_STEP_THREADS": "-1"})


def test_cpu_reserved_cores_leave_the_engine_the_rest() -> None:
    assert Settings().cpu_reserved_cores == 1
    assert Settings().engine_threads("cpu", 2) == 1
    assert Settings().engine_threads("cpu", 16) == 15
    assert Settings().engine_threads("cpu", 1) == 1  # at least one
    assert Settings(cpu_reserved_cores=0).engine_threads("cpu", 2) == 2
    assert Settings().engine_threads("cuda", 16) is None  # torch's default on a GPU
    args = parse(["--cpu-reserved-cores", "0"])
    assert Settings.from_sources(args, {"WEIR_CPU_RESERVED_CORES": "3"}).cpu_reserved_cores == 0
    assert Settings.from_sources({}, {"WEIR_CPU_RESERVED_CORES": "3"}).cpu_reserved_cores == 3
    with pytest.raises(ValueError, match="cpu_reserved_cores"):
        Settings.from_sources({}, {"WEIR_CPU_RESERVED_CORES": "-1"})


def test_the_c_kernels_pool_is_on_unless_turned_off() -> None:
    assert Settings().cpu_kernel_pool is True
    assert Settings.from_sources({}, {"WEIR_CPU_KERNEL_POOL": "off"}).cpu_kernel_pool is False
    args = parse(["--cpu-kernel-pool", "on"])
    assert Settings.from_sources(args, {"WEIR_CPU_KERNEL_POOL": "off"}).cpu_kernel_pool is True
    with pytest.raises(ValueError, match="cpu_kernel_pool|WEIR_CPU_KERNEL_POOL"):
        Settings.from_sources({}, {"WEIR_CPU_KERNEL_POOL": "maybe"})


def test_the_decode_layers_in_one_c_call_are_on_unless_turned_off() -> None:
    assert Settings().cpu_decode_layers is True
    env = {"WEIR_CPU_DECODE_LAYERS": "off"}
    assert Settings.from_sources({}, env).cpu_decode_layers is False
    assert Settings.from_sources(parse(["--cpu-decode-layers", "on"]), env).cpu_decode_layers is True
    with pytest.raises(ValueError, match="cpu_decode_layers|WEIR_CPU_DECODE_LAYERS"):
        Settings.from_sources({}, {"WEIR_CPU_DECODE_LAYERS": "sometimes"})


def test_the_kv_store_is_off_by_default_and_its_secrets_come_from_the_environment_only() -> None:
    assert Settings().kv_store_config() is None
    secret = "0123456789abcdef-mac"
    s = Settings.from_sources(
        parse(
            ["--kv-store", "redis://valkey:6379/2", "--kv-store-namespace", "prod", "--kv-store-ttl-s", "60"]
        ),
        {"WEIR_KV_STORE_SECRET": secret, "WEIR_KV_STORE_PASSWORD": "hunter22", "WEIR_KV_STORE_MAX_MIB": "8"},
    )
    config = s.kv_store_config()
    assert config is not None and config.url == "redis://valkey:6379/2" and config.namespace == "prod"
    assert config.secret == secret.encode() and config.password == "hunter22"
    assert (config.ttl_s, config.max_bytes, config.timeout_s) == (60, 8 << 20, 0.5)
    assert secret not in repr(s) and "hunter22" not in repr(s) and secret not in repr(config)
    with pytest.raises(SystemExit):  # no flag for either secret
        parse(["--kv-store-secret", "x"])
    with pytest.raises(SystemExit):
        parse(["--kv-store-password", "x"])
    with pytest.raises(ValueError, match="WEIR_KV_STORE_SECRET"):
        Settings.from_sources(parse(["--kv-store", "redis://valkey:6379/0"]), {})
    with pytest.raises(ValueError, match="password"):
        Settings.from_sources({"kv_store_url": "redis://:pw@valkey:6379/0"}, {"WEIR_KV_STORE_SECRET": secret})
    with pytest.raises(ValueError, match="namespace"):
        Settings.from_sources(
            {"kv_store_url": "redis://valkey:6379/0", "kv_store_namespace": "a*b"},
            {"WEIR_KV_STORE_SECRET": secret},
        )
    with pytest.raises(ValueError, match="url"):
        Settings.from_sources({"kv_store_url": "http://valkey:6379"}, {"WEIR_KV_STORE_SECRET": secret})


def test_response_storage_flags_and_env() -> None:
    defaults = Settings.from_sources(parse([]), {})
    assert defaults.response_storage_limits.quota_bytes == 64 * 1024 * 1024
    assert defaults.response_storage_limits.retention_s == 30 * 24 * 3600
    args = parse(["--response-storage-bytes", "1000", "--response-retention-s", "60"])
    s = Settings.from_sources(args, {"WEIR_RESPONSE_SWEEP_INTERVAL_S": "5"})
    assert (s.response_storage_bytes, s.response_retention_s, s.response_sweep_interval_s) == (
        1000,
        60.0,
        5.0,
    )
    for name, bad in (
        ("WEIR_RESPONSE_STORAGE_BYTES", "-1"),
        ("WEIR_RESPONSE_RETENTION_S", "0"),
        ("WEIR_RESPONSE_SWEEP_INTERVAL_S", "inf"),
    ):
        with pytest.raises(ValueError, match=name.removeprefix("WEIR_").lower()):
            Settings.from_sources({}, {name: bad})
