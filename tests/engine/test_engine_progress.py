"""Issue 29 at scale on the real engine: 500 requests at once on a 1,024-token pool all finish.

A tiny random Llama (so it runs in seconds on a CPU), the fair queue of the gateway's default,
three tenants of every priority class, prompts of every size that fits, n > 1 choices and beam
groups, with and without the host tier and speculative decoding, and a fixed or a small target
step budget. Every request must end (no abort, no error), the watchdog must never have had to act,
and every block must come back.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from tests.engine.tiny_models import make_tiny_model
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, QueuePolicy, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.request import FinishReason, Priority, SamplingParams
from weir.engine.speculative_config import SpeculativeConfig, SpeculativeMethod

NUM_REQUESTS = 500
POOL_TOKENS = 1024
BLOCK_SIZE = 16
MAX_STEPS = 100_000


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("progress"), arch="llama", max_position_embeddings=512)


def _request(i: int, rng: random.Random, vocab: int) -> EngineRequest:
    kind = rng.random()
    max_tokens = rng.randint(1, 12)
    if kind < 0.08:  # a beam group: every beam's blocks must fit the pool with the prompt's
        prompt_len = rng.randint(1, 120)
        params = SamplingParams(max_tokens=max_tokens, use_beam_search=True, beam_width=rng.randint(2, 3))
    elif kind < 0.2:  # n > 1 choices sharing the prompt
        prompt_len = rng.randint(1, 200)
        params = SamplingParams(max_tokens=max_tokens, n=rng.randint(2, 3), temperature=0.8, seed=i)
    else:  # prompts of every size up to most of the pool
        prompt_len = rng.randint(1, rng.choice([40, 200, 480]))
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return EngineRequest(
        f"r{i}",
        tuple(rng.randrange(3, vocab) for _ in range(prompt_len)),
        params,
        tenant_id=rng.choice("abc"),
        cache_scope="shared-test",
        priority=rng.choice(list(Priority)),
    )


class _ModeledClock:
    """The engine's clock, advanced only by each step's modeled cost (`_model_the_machine`): the
    step budget fits a machine that is the same however loaded the test's own machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _model_the_machine(engine: Any, clock: _ModeledClock) -> None:
    """Each forward takes 5 ms + 0.1 ms a token + 0.2 ms a decode row on the modeled clock, so
    a 20 ms target plans ~100-token steps and a running cap above the 32 seats."""
    execute = engine.runner.execute

    def modeled(out: Any, *args: Any) -> Any:
        result = execute(out, *args)
        clock.now += 0.005 + 0.0001 * out.num_tokens + 0.0002 * out.num_decodes
        return result

    engine.runner.execute = modeled


@pytest.mark.timeout(300)  # a livelock inside one step (the old scheduler's) fails, not hangs
@pytest.mark.parametrize(
    ("host_tokens", "speculate", "target_step_s"),
    [(0, False, None), (4096, False, None), (0, True, 0.02), (4096, True, 0.02)],
    ids=["recompute", "host-tier", "spec-small-budget", "host-spec-small-budget"],
)
def test_500_requests_at_once_on_a_1024_token_pool_all_finish(
    tiny: Path, host_tokens: int, speculate: bool, target_step_s: float | None
) -> None:
    clock = _ModeledClock()
    engine = build_engine(
        EngineConfig(
            model_path=str(tiny),
            cache=CacheConfig(
                block_size=BLOCK_SIZE,
                num_blocks=POOL_TOKENS // BLOCK_SIZE + 1,
                host_num_blocks=host_tokens // BLOCK_SIZE,
            ),
            scheduler=SchedulerConfig(
                max_num_batched_tokens=256,
                max_num_seqs=32,
                max_model_len=512,
                queue_policy=QueuePolicy.FAIR,
                target_step_s=target_step_s,
            ),
            speculative=SpeculativeConfig(SpeculativeMethod.NGRAM, 3) if speculate else SpeculativeConfig(),
        ),
        clock=clock,
    )
    _model_the_machine(engine, clock)
    rng = random.Random(29)
    vocab = engine.model_config.vocab_size
    for i in range(NUM_REQUESTS):
        engine.add_request(_request(i, rng, vocab))
    finished: dict[str, FinishReason] = {}
    for _ in range(MAX_STEPS):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            if out.finished:
                assert out.error is None, (out.request_id, out.error)
                finished[out.request_id] = out.finish_reason
    assert not engine.has_unfinished(), engine.scheduler.describe()
    assert len(finished) == NUM_REQUESTS
    assert FinishReason.ABORT not in finished.values()
    assert engine.watchdog.num_stalls == 0
    assert engine.scheduler.num_preemptions > 0  # the pool was overfilled indeed
    assert engine.kv.num_free_blocks == engine.kv.num_total_blocks
