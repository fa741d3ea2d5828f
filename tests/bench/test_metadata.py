"""weir_bench.metadata: machine description, secret redaction, server settings."""

from __future__ import annotations

from weir_bench.metadata import machine_info, now_utc, redacted_command, server_settings


def test_machine_info() -> None:
    info = machine_info()
    assert info["cores"] >= 1 and info["cpu"] and info["platform"] and isinstance(info["gpus"], list)
    assert now_utc().endswith("+00:00")


def test_secrets_are_redacted() -> None:
    argv = ["weir", "bench", "serve", "--api-key", "sk-1", "--admin-token=tok", "--url", "http://x"]
    assert (
        redacted_command(argv) == "weir bench serve --api-key REDACTED --admin-token=REDACTED --url http://x"
    )


def test_server_settings_label_wins_then_entry_then_nested() -> None:
    entry = {"id": "m", "dtype": "float32", "weir": {"batch_policy": "continuous", "kv_dtype": "fp8"}}
    found = server_settings(entry, {"dtype": "bfloat16"})
    assert (found["dtype"], found["batch_policy"], found["kv_dtype"], found["version"]) == (
        "bfloat16",
        "continuous",
        "fp8",
        None,
    )
    assert server_settings(None, {})["batch_policy"] is None
