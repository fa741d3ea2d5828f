"""ModelRunner: a SchedulerOutput becomes tensors, a forward and one sampled token per finished chunk.

The model here is a stand-in whose logits make token `t + 1` the greedy choice after token `t`,
so what the runner fed (tokens, positions) and which rows it sampled can be read off the result.
"""

from __future__ import annotations

import pytest
import torch

from weir.engine.models.attention import AttentionMetadata
from weir.engine.output import ScheduledRequest, SchedulerOutput
from weir.engine.request import Request, SamplingParams
from weir.engine.runner.runner import ModelRunner
from weir.engine.runner.step_threads import StepThreads, row_bucket
from weir.engine.sampling.draft_verifier import Draft

VOCAB = 64
BLOCK_SIZE = 4
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


class NextTokenModel(torch.nn.Module):
    """Logits that pick `input + 1` greedily; records what each forward was given."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[list[int], list[int], AttentionMetadata]] = []

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        kv_caches: list[torch.Tensor],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        self.calls.append((input_ids.tolist(), positions.tolist(), metadata))
        return torch.nn.functional.one_hot((input_ids + 1) % VOCAB, VOCAB).float()  # [num_tokens, vocab]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden * 10.0  # [num_sampling, vocab]


def _runner(num_blocks: int = 8) -> tuple[ModelRunner, NextTokenModel]:
    model = NextTokenModel()
    kv = [torch.zeros(2, num_blocks, BLOCK_SIZE, 1, 2) for _ in range(2)]  # two layers
    return ModelRunner(model, kv, BLOCK_SIZE, torch.device("cpu")), model


def _request(rid: str, prompt: list[int], output: list[int] | None = None) -> Request:
    req = Request(rid, prompt, GREEDY)
    req.output_token_ids = list(output or [])
    return req


def test_a_prefill_chunk_and_a_decode_become_one_flat_batch() -> None:
    runner, model = _runner()
    long = _request("long", list(range(10, 20)))  # 10 prompt tokens, fed 4..9 now
    short = _request("short", [30, 31, 32], output=[40])  # decoding its second output token
    out = SchedulerOutput(
        scheduled=(
            ScheduledRequest("short", 1, 3, (5,), samples=True),
            ScheduledRequest("long", 6, 4, (1, 2, 3), samples=True),
        )
    )
    result = runner.execute(out, {"long": long, "short": short})
    ((ids, positions, metadata),) = model.calls
    assert ids == [40] + list(range(14, 20))
    assert positions == [3] + list(range(4, 10))
    assert metadata.query_start_loc_cpu == (0, 1, 7)
    assert metadata.seq_lens_cpu == (4, 10)
    # Slot = block * block_size + offset: position 3 of block 5; positions 4..9 over blocks 2 and 3.
    assert metadata.slot_mapping.tolist() == [23] + [8, 9, 10, 11, 12, 13]
    assert metadata.block_tables.tolist() == [[5, 0, 0], [1, 2, 3]]
    assert {rid: r.token_id for rid, r in result.sampled.items()} == {"short": 41, "long": 20}
    assert result.failed == {}


def test_only_chunks_that_reach_the_end_of_the_known_tokens_sample() -> None:
    runner, model = _runner()
    req = _request("r", list(range(1, 11)))
    result = runner.execute(SchedulerOutput((ScheduledRequest("r", 4, 0, (1,), samples=False),)), {"r": req})
    assert result.sampled == {} and result.failed == {}
    assert model.calls[0][0] == [1, 2, 3, 4]


def test_a_draft_beyond_the_requests_slots_is_neither_fed_nor_verified() -> None:
    runner, model = _runner()
    req = _request("r", list(range(10, 20)))  # a prompt chunk: no draft slots
    out = SchedulerOutput((ScheduledRequest("r", 6, 4, (1, 2, 3), samples=True),))
    result = runner.execute(out, {"r": req}, {"r": Draft((99,))})
    assert model.calls[0][0] == list(range(14, 20))
    assert result.verified == {} and result.sampled["r"].token_id == 20


def test_a_request_with_broken_inputs_fails_alone() -> None:
    runner, _ = _runner()
    good = _request("good", [1, 2, 3])
    broken = _request("broken", [4, 5])  # the step claims 3 tokens from position 0: it has 2
    out = SchedulerOutput(
        (
            ScheduledRequest("broken", 3, 0, (1,), samples=True),
            ScheduledRequest("good", 3, 0, (2,), samples=True),
        )
    )
    result = runner.execute(out, {"good": good, "broken": broken})
    assert result.sampled["good"].token_id == 4
    assert "RuntimeError" in result.failed["broken"] and "broken" not in result.sampled


def test_a_failing_forward_raises_to_the_caller() -> None:
    runner, model = _runner()

    def boom(*args: object) -> torch.Tensor:
        raise RuntimeError("forward failed")

    model.forward = boom  # type: ignore[method-assign,assignment]
    req = _request("r", [1, 2])
    with pytest.raises(RuntimeError, match="forward failed"):
        runner.execute(SchedulerOutput((ScheduledRequest("r", 2, 0, (1,), samples=True),)), {"r": req})


def test_the_step_threads_time_the_steps_that_ran_and_not_one_that_raised() -> None:
    runner, model = _runner(num_blocks=16)
    before = torch.get_num_threads()
    runner.threads = StepThreads(decode_threads=before, wide_threads=before + 1, min_rows=4)
    req = _request("r", list(range(1, 9)))
    out = SchedulerOutput((ScheduledRequest("r", 8, 0, (1, 2), samples=True),))  # 8 rows: wide
    try:
        runner.execute(out, {"r": req})
        assert runner.threads.stats().num_wide_steps == 1
        assert runner.threads.preferred(8) == before + 1  # measured once on the wide count, not yet chosen
        timed = [len(t) for t in runner.threads._buckets[row_bucket(8)].times.values()]
        assert timed == [1, 0]

        def boom(*args: object) -> torch.Tensor:
            raise RuntimeError("forward failed")

        model.forward = boom  # type: ignore[method-assign,assignment]
        with pytest.raises(RuntimeError, match="forward failed"):
            runner.execute(out, {"r": req})
        assert [len(t) for t in runner.threads._buckets[row_bucket(8)].times.values()] == [1, 0]
    finally:
        torch.set_num_threads(before)


def test_copy_on_write_copies_every_layer_before_the_step() -> None:
    runner, _ = _runner()
    for layer, cache in enumerate(runner.kv_caches):
        cache[:, 3] = float(layer + 1)
    runner.execute(SchedulerOutput((), blocks_to_copy=((3, 6),)), {})
    for layer, cache in enumerate(runner.kv_caches):
        assert torch.equal(cache[:, 6], torch.full_like(cache[:, 6], float(layer + 1)))
        assert not cache[:, 5].any()


def test_seeded_generators_live_until_the_request_finishes() -> None:
    runner, _ = _runner()
    runner.add_request("a", seed=5)
    runner.add_request("b", seed=None)
    assert isinstance(runner._generators["a"], torch.Generator) and runner._generators["b"] is None
    runner.execute(SchedulerOutput((), finished_ids=("a",)), {})
    assert "a" not in runner._generators and "b" in runner._generators
    runner.forget_all()
    assert runner._generators == {}
