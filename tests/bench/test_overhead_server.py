"""weir_bench.overhead_server: the null engine's fleet is ready as `weir serve` makes a version it loads."""

from __future__ import annotations

from weir.gateway.settings.settings import Settings
from weir_bench.null_engine import NullEngine
from weir_bench.overhead_server import served_fleet


class _Tokenizer:
    """Enough of a tokenizer for the fleet: a vocabulary size, and copyable."""

    eos_token_id = 0

    def __len__(self) -> int:
        return 100


def test_the_tokenizer_workers_copies_are_made_before_serving() -> None:
    fleet = served_fleet(NullEngine(), _Tokenizer(), Settings(tokenizer_workers=3))
    (version,) = fleet.versions()
    assert version.prompts is not None
    assert version.prompts.num_copies == 3  # none left for a worker to make on its first busy moment
