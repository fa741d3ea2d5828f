"""weir.gateway.fleet.fleet_setup: the fleet `weir serve` builds."""

from __future__ import annotations

import dataclasses
import functools

from weir.gateway.fleet.fleet_setup import build_fleet
from weir.gateway.prompts.tokenization import DEFAULT_POOL_WORKERS
from weir.gateway.server.bootstrap import engine_config
from weir.gateway.settings.settings import Settings


def test_the_fleet_makes_one_tokenizer_copy_per_pool_worker_at_load() -> None:
    """The routes' pool's workers and the prompt builder's default pool's (prefix-cache routes)."""
    settings = dataclasses.replace(Settings(), tokenizer_workers=3)
    fleet = build_fleet(settings, "cpu", functools.partial(engine_config, settings, device="cpu"))
    assert DEFAULT_POOL_WORKERS == 2 and fleet.tokenizer_copies == 3 + 2
