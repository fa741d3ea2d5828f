"""`weir serve` over the fake engine, as a subprocess for the SIGTERM tests.

Prints `PORT <n>` once listening (port 0 is bound here, so the test can read it), and at
shutdown `ABORTED <ids>` and `FREE <free>/<total>` so the test can see what the drain did.
Run: python -m tests.e2e.fake_server --token-delay-s 0.05 --grace-s 10
"""

from __future__ import annotations

import argparse
import socket
import sys

from tests.gateway.fake_engine import FakeEngine
from tests.gateway.harness import make_app
from weir.gateway.server.uvicorn_runner import run_server
from weir.gateway.settings.settings import LogLevel, Settings


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--token-delay-s", type=float, default=0.05)
    parser.add_argument("--grace-s", type=float, default=10.0)
    args = parser.parse_args()

    engine = FakeEngine(token_delay_s=args.token_delay_s)

    async def report() -> None:
        print(f"ABORTED {','.join(engine.aborted) or '-'}", flush=True)
        print(f"FREE {engine.num_free_blocks}/{engine.num_total_blocks}", flush=True)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings = Settings(port=port, shutdown_grace_s=args.grace_s, log_level=LogLevel.WARNING)
    app = make_app(engine, settings, on_shutdown=[report])
    print(f"PORT {port}", flush=True)
    return run_server(app, settings, sock)


if __name__ == "__main__":
    sys.exit(main())
