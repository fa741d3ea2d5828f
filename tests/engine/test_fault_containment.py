"""Issue 10, engine side: one bad request, or one engine fault, fails only what it touched.

Regression tests over a tiny random Llama: out-of-range and overflowing seeds, a request that
can never fit the KV pool, the queue deadline of a request that already started, and faults
injected (test-only `FaultInjector`) into the model forward, the sampler and output processing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.engine.tiny_models import make_tiny_model
from weir.engine.client import EngineRequest
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from weir.engine.engine_builder import build_engine
from weir.engine.errors import ENGINE_RETRYABLE, ContextLengthError, InvalidRequestError, KVCapacityError
from weir.engine.faults import FaultInjector
from weir.engine.llm_engine import LLMEngine
from weir.engine.output import RequestOutput
from weir.engine.request import SEED_MAX, FinishReason, Request, RequestStatus, SamplingParams, child_seed
from weir.engine.sampling.sampler import Sampler, SampleResult, SamplingContext

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("faults"), arch="llama", num_kv_heads=2, max_position_embeddings=512
    )


@pytest.fixture(scope="module")
def long_context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("faults-long"), arch="llama", num_kv_heads=2, max_position_embeddings=8192
    )


def _engine(
    path: Path,
    num_blocks: int = 200,
    block_size: int = 16,
    max_model_len: int = 512,
    faults: FaultInjector | None = None,
    clock=None,  # type: ignore[no-untyped-def]
) -> LLMEngine:
    config = EngineConfig(
        model_path=str(path),
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks),
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8, max_model_len=max_model_len),
    )
    if clock is None:
        return build_engine(config, faults=faults)
    return build_engine(config, clock=clock, faults=faults)


def _drain(engine: LLMEngine, max_steps: int = 500) -> dict[tuple[str, int], list[RequestOutput]]:
    outs: dict[tuple[str, int], list[RequestOutput]] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            outs.setdefault((o.request_id, o.index), []).append(o)
    assert not engine.has_unfinished()
    return outs


def _tokens(outs: Sequence[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def _solo(path: Path, prompt: tuple[int, ...], params: SamplingParams = GREEDY) -> list[int]:
    engine = _engine(path)
    engine.add_request(EngineRequest("solo", prompt, params))
    return _tokens(_drain(engine)[("solo", 0)])


def _assert_idle(engine: LLMEngine) -> None:
    assert not engine.has_unfinished()
    assert engine.kv.num_free_blocks == engine.kv.num_total_blocks


# -- seeds ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [2**64, -(2**64), 2**63 * 4, -(2**63) - 1])
def test_out_of_range_seeds_are_invalid_requests(tiny: Path, seed: int) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(seed=seed)
    assert info.value.param == "seed"
    engine = _engine(tiny)
    params = SamplingParams(max_tokens=2)
    object.__setattr__(params, "seed", seed)  # past the dataclass check: validate is the second line
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request(EngineRequest("bad", (5, 6, 7), params))
    assert info.value.param == "seed"
    _assert_idle(engine)


def test_child_seeds_wrap_into_64_bits() -> None:
    assert child_seed(None, 3) is None
    assert child_seed(7, 0) == 7 and child_seed(7, 2) == 9
    assert child_seed(SEED_MAX, 0) == SEED_MAX and child_seed(SEED_MAX, 1) == 0
    assert child_seed(-(2**63), 1) == 2**63 + 1


def test_n2_with_the_largest_seed_runs_next_to_another_request(tiny: Path) -> None:
    """Defect 1: the second choice's seed (2**64) overflowed inside the step and failed the step."""
    engine = _engine(tiny)
    sampled = SamplingParams(max_tokens=5, temperature=1.0, ignore_eos=True)
    engine.add_request(EngineRequest("edge", (5, 6, 7, 8), replace(sampled, n=2, seed=SEED_MAX)))
    engine.add_request(EngineRequest("other", (9, 10, 11), GREEDY))
    outs = _drain(engine)
    for key in (("edge", 0), ("edge", 1), ("other", 0)):
        assert outs[key][-1].finished and outs[key][-1].error is None, key
        assert outs[key][-1].finish_reason is FinishReason.LENGTH
    assert _tokens(outs[("other", 0)]) == _solo(tiny, (9, 10, 11))
    assert _tokens(outs[("edge", 1)]) == _solo(tiny, (5, 6, 7, 8), replace(sampled, seed=0))
    _assert_idle(engine)


def test_the_generator_is_built_when_the_request_is_added(tiny: Path) -> None:
    engine = _engine(tiny)
    engine.add_request(EngineRequest("seeded", (5, 6), SamplingParams(max_tokens=2, seed=3, n=2)))
    assert isinstance(engine.runner._generators["seeded#1"], torch.Generator)  # before any step
    with pytest.raises(InvalidRequestError) as info:
        engine.runner.add_request("x", 2**70)
    assert info.value.param == "seed"


# -- a request that can never fit the KV pool ------------------------------------------------------


def test_a_pool_smaller_than_the_context_caps_max_model_len(long_context: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    """Defect 2 as reproduced: a 512-token pool, a 480-token prompt and max_tokens 200."""
    with caplog.at_level(logging.WARNING, logger="weir.engine"):
        engine = _engine(long_context, num_blocks=33, max_model_len=8192)  # 32 usable blocks of 16
    assert engine.max_model_len == 512 and engine.scheduler.config.max_model_len == 512
    assert "512" in caplog.text and "8192" in caplog.text
    with pytest.raises(ContextLengthError) as info:
        engine.add_request(EngineRequest("huge", tuple([5] * 480), SamplingParams(max_tokens=200)))
    assert "512" in info.value.message and "680" in info.value.message
    _assert_idle(engine)


def test_validate_refuses_what_can_never_fit_the_pool(tiny: Path) -> None:
    engine = _engine(tiny, num_blocks=33)
    engine.max_model_len = 4096  # as if the context were not capped: the KV check still holds
    with pytest.raises(KVCapacityError) as info:
        engine.add_request(EngineRequest("huge", tuple([5] * 480), SamplingParams(max_tokens=200, n=2)))
    message = info.value.message
    assert all(str(n) in message for n in (480, 200, 43, 32, 512)), message
    assert isinstance(info.value, InvalidRequestError) and info.value.param == "max_tokens"
    _assert_idle(engine)


def _pool_of_1024_tokens(path: Path) -> LLMEngine:
    """Issue 21 item 3's pool: 1,024 tokens (64 usable blocks of 16), no watermark."""
    engine = _engine(path, num_blocks=65, max_model_len=1024)
    assert engine.num_blocks_per_request == 64 and engine.max_model_len == 1024
    return engine


@pytest.mark.parametrize(
    ("group", "param"),
    [({"n": 16}, "n"), ({"n": 2, "use_beam_search": True, "beam_width": 16}, "beam_width")],
)
def test_a_group_that_can_never_fit_the_pool_is_refused_naming_its_width(
    long_context: Path, group: dict, param: str
) -> None:
    """Issue 21 item 3: each of 16 sequences of a 960-token prompt fits the pool (61 blocks), the
    group does not (60 shared prompt blocks + 16 own = 76 > 64); it was admitted and preempted
    without end."""
    engine = _pool_of_1024_tokens(long_context)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, **group)
    with pytest.raises(KVCapacityError) as info:
        engine.add_request(EngineRequest("wide", tuple([5] * 960), params))
    assert info.value.param == param
    assert info.value.num_sequences == 16 and info.value.num_blocks_needed == 76
    assert all(str(x) in info.value.message for x in (960, 16, 76, 64)), info.value.message
    _assert_idle(engine)


def test_a_group_that_fills_the_pool_exactly_is_admitted_and_finishes(long_context: Path) -> None:
    """The bound counts the prompt's full blocks once: 60 shared + 4 x 1 own = 64 blocks fits."""
    engine = _pool_of_1024_tokens(long_context)
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=1, ignore_eos=True, n=4)
    engine.add_request(EngineRequest("fits", tuple([5] * 960), params))
    outs = _drain(engine, max_steps=200)
    for i in range(4):
        assert outs[("fits", i)][-1].finish_reason is FinishReason.LENGTH
        assert len(_tokens(outs[("fits", i)])) == 16
    _assert_idle(engine)


def test_an_unschedulable_request_makes_the_step_idle_not_busy(tiny: Path) -> None:
    """A waiting request that cannot be admitted (forced in, past validation) leaves the step idle:
    the engine may sleep until a command arrives instead of stepping again at once."""
    engine = _engine(tiny, num_blocks=33)
    stuck = Request("stuck", [5] * 100, SamplingParams(max_tokens=8))
    stuck.output_token_ids = [6] * 450  # 550 tokens: more than the 512 the pool holds
    engine.scheduler.add_request(stuck)
    assert engine.step() == [] and engine.last_step_idle
    assert engine.idle_timeout_s(0.5) == 0.5  # no deadline, no batch window: sleep the default
    engine.scheduler.finish_request("stuck", RequestStatus.FINISHED_ABORTED)
    engine.add_request(EngineRequest("small", (7, 8), SamplingParams(max_tokens=2, temperature=0.0)))
    engine.step()
    assert not engine.last_step_idle


# -- queue deadlines --------------------------------------------------------------------------------


def test_a_started_request_is_never_expired_as_queued(tiny: Path) -> None:
    now = [0.0]
    engine = _engine(tiny, clock=lambda: now[0])
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine.add_request(EngineRequest("r", (5, 6, 7), params, arrival_s=0.0, deadline_s=1.0))
    first = engine.step()
    assert first and first[0].new_token_ids
    engine.scheduler.preemption.requeue(engine.scheduler.requests["r"])  # preempted: back in the queue
    now[0] = 5.0  # past the queue deadline
    outs = first + [o for o in _drain(engine)[("r", 0)]]
    assert outs[-1].finish_reason is FinishReason.LENGTH and outs[-1].error is None
    assert _tokens(outs) == _solo(tiny, (5, 6, 7), params)


def test_the_idle_timeout_ends_at_the_next_queue_deadline(tiny: Path) -> None:
    now = [0.0]
    engine = _engine(tiny, num_blocks=33, clock=lambda: now[0])
    stuck = Request("stuck", [5] * 100, SamplingParams(max_tokens=8), arrival_s=0.0, deadline_s=0.2)
    stuck.output_token_ids = [6] * 450
    engine.scheduler.add_request(stuck)
    engine.step()
    assert engine.last_step_idle and engine.idle_timeout_s(0.5) == pytest.approx(0.2)


# -- injected faults --------------------------------------------------------------------------------


class _Faults(FaultInjector):
    def __init__(self) -> None:
        self.forward_steps: set[int] = set()
        self.bad_samples: set[str] = set()
        self.bad_outputs: set[str] = set()

    def before_forward(self, step: int) -> None:
        if step in self.forward_steps:
            raise RuntimeError(f"injected forward fault at step {step}")

    def before_sample(self, request_id: str) -> None:
        if request_id in self.bad_samples:
            raise RuntimeError("injected sampler fault")

    def before_output(self, request_id: str) -> None:
        if request_id in self.bad_outputs:
            raise RuntimeError("injected output fault")


def test_a_forward_fault_retries_unstreamed_requests_and_fails_the_others_retryably(tiny: Path) -> None:
    faults = _Faults()
    engine = _engine(tiny, faults=faults)
    engine.add_request(EngineRequest("streaming", (5, 6, 7, 8), GREEDY))
    first = engine.step()  # runner step 1: "streaming" computes its prompt and streams a token
    assert first[0].new_token_ids
    engine.add_request(EngineRequest("fresh", tuple(range(20, 40)), GREEDY))
    faults.forward_steps = {2}  # its decode and "fresh"'s prefill share step 2, which fails
    outs = _drain(engine)
    failed = outs[("streaming", 0)][-1]
    assert failed.finished and failed.finish_reason is FinishReason.ERROR and failed.error == ENGINE_RETRYABLE
    fresh = outs[("fresh", 0)]
    assert fresh[-1].finish_reason is FinishReason.LENGTH and fresh[-1].error is None
    assert _tokens(fresh) == _solo(tiny, tuple(range(20, 40)))
    _assert_idle(engine)
    engine.add_request(EngineRequest("later", (9, 10), GREEDY))  # the engine keeps serving
    assert _drain(engine)[("later", 0)][-1].finish_reason is FinishReason.LENGTH


def test_a_request_is_retried_once_only(tiny: Path) -> None:
    faults = _Faults()
    faults.forward_steps = {1, 2}
    engine = _engine(tiny, faults=faults)
    engine.add_request(EngineRequest("unlucky", (5, 6, 7), GREEDY))
    outs = _drain(engine)[("unlucky", 0)]
    assert outs[-1].finish_reason is FinishReason.ERROR and outs[-1].error == ENGINE_RETRYABLE
    assert engine.scheduler.num_preemptions == 1
    _assert_idle(engine)


def test_a_sampler_fault_fails_only_its_request(tiny: Path) -> None:
    faults = _Faults()
    faults.bad_samples = {"bad"}
    engine = _engine(tiny, faults=faults)
    engine.add_request(EngineRequest("bad", (5, 6, 7), GREEDY))
    engine.add_request(EngineRequest("good", (8, 9, 10), GREEDY))
    outs = _drain(engine)
    bad = outs[("bad", 0)][-1]
    assert bad.finish_reason is FinishReason.ERROR and "injected sampler fault" in (bad.error or "")
    assert _tokens(outs[("good", 0)]) == _solo(tiny, (8, 9, 10))
    _assert_idle(engine)


class _FlakySampler(Sampler):
    """Raises for any batch holding a row seeded 13, as a bug in one row's sampling would."""

    def __call__(self, logits: torch.Tensor, contexts: Sequence[SamplingContext]) -> list[SampleResult]:
        if any(c.params.seed == 13 for c in contexts):
            raise RuntimeError("injected batched sampler fault")
        return super().__call__(logits, contexts)


def test_a_batched_sampler_fault_is_retried_row_by_row(tiny: Path) -> None:
    engine = _engine(tiny)
    engine.runner.sampler = _FlakySampler()
    sampled = SamplingParams(max_tokens=5, temperature=1.0, ignore_eos=True)
    engine.add_request(EngineRequest("bad", (5, 6, 7), replace(sampled, seed=13)))
    engine.add_request(EngineRequest("good", (8, 9, 10), replace(sampled, seed=14)))
    outs = _drain(engine)
    assert outs[("bad", 0)][-1].finish_reason is FinishReason.ERROR
    assert _tokens(outs[("good", 0)]) == _solo(tiny, (8, 9, 10), replace(sampled, seed=14))
    _assert_idle(engine)


def test_an_output_processing_fault_fails_only_its_request(tiny: Path) -> None:
    faults = _Faults()
    faults.bad_outputs = {"bad#1"}  # one choice of an n=2 request, and a beam search next to it
    engine = _engine(tiny, faults=faults)
    engine.add_request(EngineRequest("bad", (5, 6, 7), replace(GREEDY, n=2)))
    beams = SamplingParams(max_tokens=4, use_beam_search=True, beam_width=2, ignore_eos=True)
    engine.add_request(EngineRequest("beams", (8, 9, 10), beams))
    engine.add_request(EngineRequest("good", (11, 12), GREEDY))
    outs = _drain(engine)
    assert outs[("bad", 1)][-1].finish_reason is FinishReason.ERROR
    assert outs[("bad", 0)][-1].finish_reason is FinishReason.LENGTH
    assert outs[("beams", 0)][-1].finish_reason is FinishReason.LENGTH
    assert _tokens(outs[("good", 0)]) == _solo(tiny, (11, 12))
    _assert_idle(engine)


def test_a_beam_fault_fails_only_its_group(tiny: Path) -> None:
    faults = _Faults()
    faults.bad_outputs = {"beams#b0"}
    engine = _engine(tiny, faults=faults)
    beams = SamplingParams(max_tokens=4, use_beam_search=True, beam_width=3, n=2, ignore_eos=True)
    engine.add_request(EngineRequest("beams", (8, 9, 10), beams))
    engine.add_request(EngineRequest("good", (11, 12), GREEDY))
    outs = _drain(engine)
    assert [outs[("beams", i)][-1].finish_reason for i in range(2)] == [FinishReason.ERROR] * 2
    assert _tokens(outs[("good", 0)]) == _solo(tiny, (11, 12))
    _assert_idle(engine)


def test_reset_forgets_every_request_and_keeps_counters(tiny: Path) -> None:
    engine = _engine(tiny)
    engine.add_request(EngineRequest("a", (5, 6, 7), GREEDY))
    engine.step()
    queried = engine.kv.lookup.totals.queried_tokens
    engine.reset()
    assert not engine.has_unfinished() and not engine.is_active("a")
    assert engine.kv.lookup.totals.queried_tokens == queried and engine.stats().num_restarts == 1
    _assert_idle(engine)
    engine.add_request(EngineRequest("a", (5, 6, 7), GREEDY))
    assert _tokens(_drain(engine)[("a", 0)]) == _solo(tiny, (5, 6, 7))
