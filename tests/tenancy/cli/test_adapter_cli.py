"""`weir admin adapters ...` against a real server (build_server_app on 127.0.0.1 with a tiny
Llama and a PEFT adapter made here): register, load, grant, revoke, unload, retire, list, and
one-line errors for refusals, including a hostile adapter folder and a missing --server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.engine.lora_adapters import make_adapter
from tests.engine.tiny_models import make_tiny_model
from tests.gateway.harness import serve_in_thread
from weir.gateway.server.bootstrap import build_server_app
from weir.gateway.settings.settings import AuthMode, Settings
from weir.migrations import cli  # the `db` and `admin` commands together

pytestmark = pytest.mark.slow

TOKEN = "weir-adapter-cli-test-token-0123456789"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("adapter-cli")
    base = make_tiny_model(root / "base", arch="llama", num_kv_heads=2)
    make_adapter(base, root / "adapters" / "style", rank=4, seed=3)
    make_adapter(base, root / "adapters" / "too-wide", rank=32, seed=4)
    settings = Settings(
        data_dir=root / "data",
        admin_token=TOKEN,
        auth=AuthMode.KEYS,
        model_path=base,
        served_model_name="tiny",
        device="cpu",
        kv_cache_tokens=1024,
        metrics_port=0,
        adapter_dir=root / "adapters",
    )
    with serve_in_thread(build_server_app(settings)) as url:
        yield url


def test_the_adapter_commands_over_a_server(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    where = ["--server", server, "--admin-token", TOKEN]

    def adapters(*argv: str, ok: bool = True) -> Any:
        code, out, err = run(capsys, "admin", "adapters", *argv, *where)
        if not ok:
            assert code != 0 and out == "", out
            return err
        assert code == 0, err
        return json.loads(out)

    assert run(capsys, "admin", "tenants", "create", "acme", *where)[0] == 0
    assert run(capsys, "admin", "tenants", "create", "beta", *where)[0] == 0
    made = adapters("register", "acme/style", "tiny@default", "style", "--owner", "acme")
    assert made["state"] == "registered" and made["owner_tenant"] == "acme"
    loaded = adapters("load", "acme/style")
    assert loaded["state"] == "loaded" and loaded["serving"] is True and loaded["runtime"]["rank"] == 4
    assert adapters("grant", "acme/style", "beta")["allowed_tenants"] == ["beta"]
    assert adapters("revoke", "acme/style", "beta")["allowed_tenants"] == []
    assert [a["name"] for a in adapters("list", "--model-version", "tiny@default")["data"]] == ["acme/style"]
    assert adapters("list", "--model-version", "other@v1")["data"] == []
    assert adapters("get", "acme/style")["name"] == "acme/style"
    assert adapters("unload", "acme/style")["state"] == "unloaded"
    assert adapters("retire", "acme/style")["state"] == "retired"

    # Refusals: one line on stderr, a non-zero status, nothing on stdout.
    adapters("register", "wide", "tiny@default", "too-wide")
    err = adapters("load", "wide", ok=False)
    assert "rank 32 is over the configured maximum 16" in err and err.count("\n") == 1
    assert adapters("get", "wide")["state"] == "failed"
    assert "does not exist" in adapters("load", "nope", ok=False)
    assert "cannot become loaded" in adapters("load", "acme/style", ok=False)  # retired
    assert "already registered" in adapters("register", "wide", "tiny@default", "x", ok=False)
    assert "name@version" in adapters("register", "y", "no-version", "x", ok=False)


def test_the_adapter_commands_need_a_server(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "admin", "adapters", "list", "--data-dir", str(tmp_path))
    assert code == 2 and out == "" and "needs --server" in err
