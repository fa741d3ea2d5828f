"""uvicorn settings for `weir serve` and the drain on the first signal."""

from __future__ import annotations

import signal
import sys

import pytest
from starlette.testclient import TestClient

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import MODEL, make_app
from weir.gateway.server.uvicorn_runner import DrainingServer, gil_switch_interval, run_server, uvicorn_config
from weir.gateway.settings.settings import LogLevel, Settings


def test_uvicorn_config() -> None:
    app = make_app(FakeEngine())
    config = uvicorn_config(app, Settings(host="0.0.0.0", port=1234, shutdown_grace_s=2.5))
    assert (config.host, config.port, config.timeout_graceful_shutdown) == ("0.0.0.0", 1234, 3)
    assert config.access_log is False
    assert config.loop == "asyncio"  # never uvloop, even where it is installed
    assert uvicorn_config(app, Settings(log_level=LogLevel.DEBUG)).access_log is True
    # A grace of 0 cancels at once; None would mean waiting forever.
    assert uvicorn_config(app, Settings(shutdown_grace_s=0)).timeout_graceful_shutdown == 0


def test_a_signal_drains_the_app_it_serves() -> None:
    app = make_app(FakeEngine())
    client = TestClient(app)
    assert client.get("/ready").status_code == 200
    server = DrainingServer(uvicorn_config(app, Settings()), app.state.gateway)
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit
    ready = client.get("/ready")
    assert ready.status_code == 503 and ready.json() == {"status": "draining"}
    refused = client.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"


def test_forwarded_headers_are_trusted_only_from_configured_proxies() -> None:
    """uvicorn's own default trusts X-Forwarded-For from loopback: any local client could choose
    the address it is throttled as (issue 10, defect 3)."""
    app = make_app(FakeEngine())
    assert uvicorn_config(app, Settings()).proxy_headers is False
    config = uvicorn_config(app, Settings(forwarded_allow_ips=("10.0.0.0/8", "192.168.1.7")))
    assert config.proxy_headers is True and config.forwarded_allow_ips == ["10.0.0.0/8", "192.168.1.7"]


def test_the_gil_switch_interval_is_set_while_serving_and_restored_after() -> None:
    before = sys.getswitchinterval()
    with gil_switch_interval(0.0007):
        assert sys.getswitchinterval() == 0.0007
    assert sys.getswitchinterval() == before
    with pytest.raises(RuntimeError), gil_switch_interval(0.0003):
        raise RuntimeError("a server that fails still restores it")
    assert sys.getswitchinterval() == before


def test_run_server_serves_under_the_configured_switch_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []
    monkeypatch.setattr(
        DrainingServer, "run", lambda self, sockets=None: seen.append(sys.getswitchinterval())
    )
    before = sys.getswitchinterval()
    run_server(make_app(FakeEngine()), Settings(gil_switch_interval_ms=0.25))
    assert seen == [0.00025] and sys.getswitchinterval() == before
