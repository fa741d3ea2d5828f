"""One gateway replica over the fake engine, wired to a shared database as `weir serve` wires it:
API keys from the database, admission with budget leases (PostgreSQL). For the two-replica test.

Prints `PORT <n>` once listening. Run:
WEIR_KEY_PEPPER=... python -m tests.e2e.replica_server --database-url URL --lease-tokens 200
"""

from __future__ import annotations

import argparse
import socket
import sys

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import make_app
from weir.gateway.admission.controller import build_admission
from weir.gateway.metrics.admission_metrics import AdmissionMetrics
from weir.gateway.metrics.registry import GatewayMetrics
from weir.gateway.server.bootstrap import build_tenancy
from weir.gateway.server.uvicorn_runner import run_server
from weir.gateway.settings.settings import AuthMode, LogLevel, Settings


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--lease-tokens", type=int, default=200)
    parser.add_argument("--token-delay-s", type=float, default=0.01)
    args = parser.parse_args()

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # The key pepper comes from WEIR_KEY_PEPPER, like `weir serve`.
    settings = Settings.from_environment(
        {
            "port": port,
            "database_url": args.database_url,
            "auth": AuthMode.KEYS,
            "lease_tokens": args.lease_tokens,
            "log_level": LogLevel.WARNING,
            "shutdown_grace_s": 5.0,
        }
    )
    engine = FakeEngine(token_delay_s=args.token_delay_s)
    tenancy = build_tenancy(settings)
    metrics = GatewayMetrics(engine.stats)
    admission = build_admission(settings, engine.stats, AdmissionMetrics(metrics.registry))
    app = make_app(
        engine,
        settings,
        authenticate=tenancy.authenticate,
        usage_sink=tenancy.usage_sink,
        admission=admission,
        metrics=metrics,
        extra_routes=tenancy.routes,
        on_startup=[h for h in (tenancy.start, admission.start) if h is not None],
        on_shutdown=[h for h in (admission.close, tenancy.close) if h is not None],
    )
    print(f"PORT {port}", flush=True)
    return run_server(app, settings, sock)


if __name__ == "__main__":
    sys.exit(main())
