"""uvicorn settings for `weir serve` and the drain on the first signal."""

from __future__ import annotations

import signal

from gateway.server import DrainingServer, uvicorn_config
from gateway.settings import LogLevel, Settings
from gateway.state import GatewayState
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import make_app


def test_uvicorn_config() -> None:
    app = make_app(FakeEngine())
    config = uvicorn_config(app, Settings(host="0.0.0.0", port=1234, shutdown_grace_s=2.5))
    assert (config.host, config.port, config.timeout_graceful_shutdown) == ("0.0.0.0", 1234, 3)
    assert config.access_log is False
    assert uvicorn_config(app, Settings(log_level=LogLevel.DEBUG)).access_log is True
    # A grace of 0 cancels at once; None would mean waiting forever.
    assert uvicorn_config(app, Settings(shutdown_grace_s=0)).timeout_graceful_shutdown == 0


def test_signal_starts_the_drain() -> None:
    app = make_app(FakeEngine())
    state = app.state.gateway
    assert isinstance(state, GatewayState)
    server = DrainingServer(uvicorn_config(app, Settings()), state)
    server.handle_exit(signal.SIGTERM, None)
    assert state.draining and server.should_exit


def test_forwarded_headers_are_trusted_only_from_configured_proxies() -> None:
    """uvicorn's own default trusts X-Forwarded-For from loopback: any local client could choose
    the address it is throttled as (issue 10, defect 3)."""
    app = make_app(FakeEngine())
    assert uvicorn_config(app, Settings()).proxy_headers is False
    config = uvicorn_config(app, Settings(forwarded_allow_ips=("10.0.0.0/8", "192.168.1.7")))
    assert config.proxy_headers is True and config.forwarded_allow_ips == ["10.0.0.0/8", "192.168.1.7"]
