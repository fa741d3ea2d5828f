"""weir.engine.runner.cuda_graphs: buckets, padding of replayed decode steps, and greedy equivalence.

The graph mechanics that need CUDA (capture, replay) run in weir_bench.gpu_check and in the GPU
test below; here `EagerCapture` replays by re-running the forward over the same static
buffers, which exercises the bucketing, padding and copying exactly as a graph would see them.
"""

from __future__ import annotations

from tests.kernels.interpret import kernel_device

DEVICE = kernel_device()  # before kernels.* is imported: TRITON_INTERPRET=1 without CUDA

import dataclasses  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.engine.tiny_models import build_metadata, make_tiny_model  # noqa: E402
from weir.engine.client import EngineRequest  # noqa: E402
from weir.engine.config import CacheConfig, EngineConfig, SchedulerConfig  # noqa: E402
from weir.engine.engine_builder import build_engine  # noqa: E402
from weir.engine.llm_engine import LLMEngine  # noqa: E402
from weir.engine.models.attention import AttentionMetadata  # noqa: E402
from weir.engine.request import SamplingParams  # noqa: E402
from weir.engine.runner.cuda_graphs import (  # noqa: E402
    CudaGraphCapture,
    DecodeGraphs,
    EagerCapture,
    GraphCapture,
    build_decode_graphs,
    decode_buckets,
)

BLOCK_SIZE = 16


def test_decode_buckets() -> None:
    assert decode_buckets(1) == (1,)
    assert decode_buckets(6) == (1, 2, 4, 6)
    assert decode_buckets(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert decode_buckets(20) == (1, 2, 4, 8, 16, 20)
    assert decode_buckets(1000)[-1] == 256
    with pytest.raises(ValueError, match="max_num_seqs"):
        decode_buckets(0)


class _RecordingForward:
    """A fake model: each row's output echoes its inputs; remembers the bucket-wide metadata."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, AttentionMetadata]] = []

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        md: AttentionMetadata,
    ) -> torch.Tensor:
        self.calls.append((input_ids.shape[0], dataclasses.replace(md, slot_mapping=md.slot_mapping.clone())))
        cols = [input_ids, positions, md.slot_mapping, md.seq_lens, md.block_tables.sum(1)]
        return torch.stack([c.to(torch.float32) for c in cols], dim=1)  # [bucket, 5]


def _graphs(forward: _RecordingForward, capture: GraphCapture | None = None) -> DecodeGraphs:
    return DecodeGraphs(
        forward,
        [],
        BLOCK_SIZE,
        max_model_len=100,
        buckets=(1, 2, 4, 8),
        device=DEVICE,
        capture=capture or EagerCapture(),
    )


def test_captures_each_bucket_largest_first_with_fixed_shapes() -> None:
    forward = _RecordingForward()
    graphs = _graphs(forward)
    assert [size for size, _ in forward.calls] == [8, 4, 2, 1]
    for size, md in forward.calls:
        assert md.is_decode_only and md.num_seqs == size
        assert md.block_tables.shape == (size, 7)  # ceil(100 / 16): any decode step fits
    assert graphs.max_blocks == 7


def test_run_pads_the_bucket_and_returns_only_real_rows() -> None:
    forward = _RecordingForward()
    graphs = _graphs(forward)
    md, positions = build_metadata([[3, 9], [5], [4, 6, 2]], [20, 7, 40], [1, 1, 1], BLOCK_SIZE, DEVICE)
    input_ids = torch.tensor([11, 12, 13], device=DEVICE)
    bucket = graphs.bucket_for(md, 3)
    assert bucket == 4
    out = graphs.run(input_ids, positions, md, bucket)
    expected = torch.tensor(
        [[11, 20, 9 * 16 + 4, 21, 12], [12, 7, 5 * 16 + 7, 8, 5], [13, 40, 2 * 16 + 8, 41, 12]],
        dtype=torch.float32,
    )
    torch.testing.assert_close(out.cpu(), expected)
    size, seen = forward.calls[-1]
    assert size == 4  # ran the bucket, not the step's size
    assert seen.slot_mapping[3].item() == -1 and seen.seq_lens[3].item() == 0  # padding: no write, no read
    # a smaller step afterwards: stale rows of the previous step are padded again
    md2, positions2 = build_metadata([[8]], [3], [1], BLOCK_SIZE, DEVICE)
    out2 = graphs.run(torch.tensor([99], device=DEVICE), positions2, md2, 1)
    assert out2.shape == (1, 5) and out2[0, 0].item() == 99
    md3, positions3 = build_metadata([[8], [1]], [3, 4], [1, 1], BLOCK_SIZE, DEVICE)
    graphs.run(torch.tensor([1, 2], device=DEVICE), positions3, md3, 2)
    assert forward.calls[-1][1].seq_lens.tolist() == [4, 5]


def test_steps_that_do_not_fit_run_eagerly() -> None:
    graphs = _graphs(_RecordingForward())
    prefill, _ = build_metadata([[1]], [0], [3], BLOCK_SIZE, DEVICE)
    assert graphs.bucket_for(prefill, 3) is None
    many, _ = build_metadata([[i + 1] for i in range(9)], [1] * 9, [1] * 9, BLOCK_SIZE, DEVICE)
    assert graphs.bucket_for(many, 9) is None
    wide, _ = build_metadata([list(range(1, 9))], [120], [1], BLOCK_SIZE, DEVICE)
    assert graphs.bucket_for(wide, 1) is None
    other_page, _ = build_metadata([[1]], [3], [1], 32, DEVICE)
    assert graphs.bucket_for(other_page, 1) is None


def test_build_decode_graphs_only_on_cuda_with_the_triton_path(caplog: pytest.LogCaptureFixture) -> None:
    model = torch.nn.Linear(1, 1)
    model.fused_kernels = True  # type: ignore[assignment]
    cpu = torch.device("cpu")
    for flag in (None, False):
        config = EngineConfig(model_path="m", use_cuda_graphs=flag)
        assert build_decode_graphs(config, model, [], 64, cpu) is None
    config = EngineConfig(model_path="m", use_cuda_graphs=True)
    assert build_decode_graphs(config, model, [], 64, cpu) is None
    assert "use_cuda_graphs=True ignored" in caplog.text


def _greedy(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> dict[str, list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(f"r{i}", tuple(p), params))
    out: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id].extend(o.new_token_ids)
    return out


class _CountingCapture:
    """EagerCapture that counts replays, to prove decode steps went through the graphs."""

    def __init__(self) -> None:
        self.replays = 0

    def capture(self, fn):  # type: ignore[no-untyped-def]
        def replay() -> torch.Tensor:
            self.replays += 1
            return fn()

        return replay


def test_engine_greedy_output_is_the_same_through_decode_graphs(tmp_path: Path) -> None:
    """Fused Triton path + decode graphs (interpreted on CPU) vs the plain torch engine."""
    path = make_tiny_model(tmp_path, "llama", num_kv_heads=2)

    def config(**kw: object) -> EngineConfig:
        return EngineConfig(
            model_path=str(path),
            device=DEVICE.type,
            cache=CacheConfig(block_size=BLOCK_SIZE, num_blocks=40),
            scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=128),
            **kw,  # type: ignore[arg-type]
        )

    prompts = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]]
    reference = _greedy(build_engine(config(use_triton=False, use_cuda_graphs=False)), prompts, 6)

    engine = build_engine(config(use_triton=True))
    model = engine.runner.model
    model.fused_kernels = True  # the CUDA default, forced on under the interpreter
    capture = _CountingCapture() if DEVICE.type == "cpu" else CudaGraphCapture()
    engine.runner.graphs = DecodeGraphs(
        model, engine.runner.kv_caches, BLOCK_SIZE, 128, decode_buckets(4), DEVICE, capture
    )
    assert _greedy(engine, prompts, 6) == reference
    if isinstance(capture, _CountingCapture):
        assert capture.replays >= 4  # the decode steps replayed (3 then 2 sequences padded to 4)


@pytest.mark.gpu
def test_cuda_graph_replay_matches_eager_forward(tmp_path: Path) -> None:
    """On CUDA: a replayed decode step gives the eager forward's hidden states."""
    from weir.engine.kv.kv_tensors import allocate_kv_caches
    from weir.engine.models.attention_triton import TritonAttentionBackend
    from weir.engine.runner.loader import load_model

    cuda = torch.device("cuda")
    path = make_tiny_model(tmp_path, "qwen3", num_kv_heads=1)
    model, config = load_model(path, torch.float32, cuda, TritonAttentionBackend())
    assert model.fused_kernels  # type: ignore[union-attr]
    caches = allocate_kv_caches(config, 20, BLOCK_SIZE, torch.float32, cuda)
    graphs = DecodeGraphs(model, caches, BLOCK_SIZE, 128, (1, 4), cuda, CudaGraphCapture())
    md, positions = build_metadata([[3, 9], [5], [4]], [20, 7, 11], [1, 1, 1], BLOCK_SIZE, cuda)
    ids = torch.tensor([7, 8, 9], device=cuda)
    with torch.inference_mode():
        replayed = graphs.run(ids, positions, md, 4).clone()
        eager = model(ids, positions, caches, md)
    torch.testing.assert_close(replayed, eager, atol=1e-5, rtol=1e-5)
