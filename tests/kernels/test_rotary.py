"""weir.kernels.rotary against weir.engine.models.rope.RotaryEmbedding.apply (the CPU path)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.interpret import bf16_slack
from weir.engine.config import RopeConfig, RopeScalingType
from weir.engine.models.rope import RotaryEmbedding
from weir.kernels.rotary import apply_rotary_

TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def _qk(
    num_tokens: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k as strided views into a fused qkv output, like the model's."""
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size, generator=torch.Generator().manual_seed(5))
    q, k, _ = qkv.to(device=device, dtype=dtype).split([q_size, kv_size, kv_size], dim=-1)
    return q.view(num_tokens, num_heads, head_dim), k.view(num_tokens, num_kv_heads, head_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(9, 3, 64), (4, 1, 24), (2, 2, 8)], ids=["gqa3", "mqa", "mha"]
)
def test_matches_torch_rotation_in_place(
    device: torch.device, dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    rope = RopeConfig(
        theta=10000.0, scaling_type=RopeScalingType.LLAMA3, factor=8.0, max_position_embeddings=64
    )
    rotary = RotaryEmbedding(rope, head_dim, 200, dtype=dtype, device=device)
    q, k = _qk(23, num_heads, num_kv_heads, head_dim, dtype, device)
    positions = torch.randint(0, 200, (23,), generator=torch.Generator().manual_seed(2)).to(device)
    expected_q, expected_k = rotary.apply(q, k, positions)
    apply_rotary_(q, k, rotary.cos, rotary.sin, positions)
    atol, rtol = TOL[dtype]
    rtol += bf16_slack(dtype)
    torch.testing.assert_close(q, expected_q, atol=atol, rtol=rtol)
    torch.testing.assert_close(k, expected_k, atol=atol, rtol=rtol)


def test_leaves_the_value_columns_alone(device: torch.device) -> None:
    qkv = torch.randn(5, 3 * 32, device=device)
    before = qkv.clone()
    q, k, _ = qkv.split(32, dim=-1)
    rotary = RotaryEmbedding(RopeConfig(), 16, 8, dtype=torch.float32, device=device)
    apply_rotary_(q.view(5, 2, 16), k.view(5, 2, 16), rotary.cos, rotary.sin, torch.arange(5, device=device))
    assert torch.equal(qkv[:, 64:], before[:, 64:])
    assert torch.equal(qkv[0], before[0])  # position 0: the identity rotation


@pytest.mark.parametrize(
    ("name", "bad", "message"),
    [
        ("query", lambda a: a["query"][..., :6], "query head_dim must be even|cos has size"),
        ("key", lambda a: a["key"][:2], "key has size 2 in dimension 0"),
        ("key", lambda a: a["key"].half(), "key must have dtype"),
        ("cos", lambda a: a["cos"][:, :4].contiguous(), "cos has size 4 in dimension 1"),
        ("sin", lambda a: a["sin"][:4], "sin has shape"),
        ("positions", lambda a: a["positions"].float(), "positions must have dtype"),
        ("positions", lambda a: a["positions"][:1], "positions has size 1"),
    ],
)
def test_rejects_bad_arguments_naming_them(device: torch.device, name: str, bad, message: str) -> None:  # type: ignore[no-untyped-def]
    rotary = RotaryEmbedding(RopeConfig(), 16, 8, dtype=torch.float32, device=device)
    args = dict(
        query=torch.randn(3, 2, 16, device=device),
        key=torch.randn(3, 1, 16, device=device),
        cos=rotary.cos,
        sin=rotary.sin,
        positions=torch.arange(3, device=device),
    )
    args[name] = bad(args)
    with pytest.raises(ValueError, match=message):
        apply_rotary_(**args)
