"""The model's fused Triton path (fused_kernels=True) against its plain-torch path.

On CPU the kernels run under the Triton interpreter, so these are tiny models and few steps:
a prompt in chunks, decode steps, and a mixed step, each compared logit for logit (fp32).
"""

from __future__ import annotations

from tests.kernels.interpret import kernel_device

DEVICE = kernel_device()  # before kernels.* is imported: TRITON_INTERPRET=1 without CUDA

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.engine.tiny_models import build_metadata, make_tiny_model  # noqa: E402
from weir.engine.kv.kv_tensors import allocate_kv_caches  # noqa: E402
from weir.engine.models.attention import TorchAttentionBackend  # noqa: E402
from weir.engine.models.attention_triton import TritonAttentionBackend  # noqa: E402
from weir.engine.models.llama import LlamaForCausalLM  # noqa: E402
from weir.engine.runner.loader import load_model  # noqa: E402

BLOCK_SIZE = 16
CASES = {
    "llama-gqa": dict(arch="llama", num_kv_heads=2),
    "qwen2-bias-mha": dict(arch="qwen2"),
    "qwen3-qknorm-mqa-tied": dict(arch="qwen3", num_kv_heads=1, tie=True),
}


class _Pair:
    """The same weights twice: torch path over one cache, fused Triton path over another."""

    def __init__(self, path: Path):
        self.torch_model, config = load_model(path, torch.float32, DEVICE, TorchAttentionBackend())
        self.fused_model, _ = load_model(path, torch.float32, DEVICE, TritonAttentionBackend())
        assert isinstance(self.fused_model, LlamaForCausalLM)
        assert self.fused_model.fused_kernels == (DEVICE.type == "cuda")  # default: on CUDA only
        self.fused_model.fused_kernels = True
        self.config = config
        self.caches = [allocate_kv_caches(config, 24, BLOCK_SIZE, torch.float32, DEVICE) for _ in range(2)]

    def step(self, token_ids: list[list[int]], tables: list[list[int]], done: list[int]) -> None:
        metadata, positions = build_metadata(tables, done, [len(t) for t in token_ids], BLOCK_SIZE, DEVICE)
        ids = torch.tensor([t for seq in token_ids for t in seq], device=DEVICE)
        with torch.inference_mode():
            expected = self.torch_model.compute_logits(
                self.torch_model(ids, positions, self.caches[0], metadata)
            )
            got = self.fused_model.compute_logits(self.fused_model(ids, positions, self.caches[1], metadata))
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        for a, b in zip(*self.caches, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_path_matches_torch_path(tmp_path: Path, case: str) -> None:
    pair = _Pair(make_tiny_model(tmp_path, **CASES[case]))
    gen = torch.Generator().manual_seed(0)
    vocab = pair.config.vocab_size
    a, b = (
        torch.randint(0, vocab, (40,), generator=gen).tolist(),
        torch.randint(0, vocab, (9,), generator=gen).tolist(),
    )
    table_a, table_b = [5, 2, 9], [7]
    pair.step([a[:20]], [table_a], [0])  # prefill chunk
    pair.step([a[20:33], b[:6]], [table_a, table_b], [20, 0])  # chunk with context + a new prompt
    pair.step([a[33:34], b[6:9]], [table_a, table_b], [33, 6])  # decode row + last chunk (mixed)
    pair.step([a[34:35], b[:1]], [table_a, table_b], [34, 9])  # decode only
