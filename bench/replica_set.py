"""Several real `weir serve` processes on one PostgreSQL database, as replicas behind a load
balancer would be: the same database URL and key pepper, budgets shared through leases, each its
own engine, auth cache and admin token. For the replica experiment and end-to-end tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from weir_bench.weir_process import WeirProcess, run_weir


@contextlib.contextmanager
def run_replicas(
    model: Path,
    database_url: str,
    key_pepper: str,
    work_dir: Path,
    *,
    num_replicas: int = 2,
    flags: Sequence[str] = (),
    start_timeout_s: float = 180.0,
) -> Iterator[list[WeirProcess]]:
    """Start `num_replicas` `weir serve` on `database_url` (already migrated: `weir serve` never
    migrates PostgreSQL); stop them all (SIGTERM: each drains and returns its leases) on exit."""
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    env = {"WEIR_KEY_PEPPER": key_pepper}
    with contextlib.ExitStack() as stack:
        replicas = [
            stack.enter_context(
                run_weir(
                    model,
                    work_dir / f"replica-{i}",
                    ["--database-url", database_url, *flags],
                    env=env,
                    start_timeout_s=start_timeout_s,
                )
            )
            for i in range(num_replicas)
        ]
        yield replicas


def revoke_key(replica: WeirProcess, key_id: str) -> None:
    """Revoke an API key through one replica's admin API (that replica forgets it at once)."""
    response = httpx.delete(
        f"{replica.url}/admin/v1/keys/{key_id}", headers=replica.admin_headers(), timeout=30
    )
    response.raise_for_status()
