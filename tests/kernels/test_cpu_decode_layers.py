"""weir.kernels.cpu_decode_layers: every layer of a decode step in one C call gives the same bits as the
kernels called one by one (the layer-by-layer path), on any shape within its reach, and refuses,
with nothing written, what the kernels would misread."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.kernels import cpu_decode_attention, cpu_decode_layers, cpu_work_pool
from weir.kernels.cpu_decode_layers import DecodeLayers, LayerWeights, ModelShape
from weir.kernels.cpu_rms_norm import add_rms_norm
from weir.kernels.cpu_rope_kv import rope_kv_write
from weir.kernels.cpu_silu_mul import silu_mul
from weir.kernels.cpu_small_gemm import MAX_ROWS, SmallGemm

pytestmark = pytest.mark.skipif(
    not cpu_decode_layers.available(), reason="no C compiler: the C decode layers are not built"
)

HIDDEN, NUM_HEADS = 48, 4
EPS = 1e-6


@dataclass
class Case:
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    shape: ModelShape
    intermediate: int
    num_blocks: int
    block_size: int


def _gemm(gen: torch.Generator, out_features: int, in_features: int, bias: bool) -> SmallGemm:
    weight = torch.randn(out_features, in_features, generator=gen) / in_features**0.5
    return SmallGemm(weight, torch.randn(out_features, generator=gen) if bias else None)


def _norm(gen: torch.Generator) -> torch.Tensor:
    return 0.5 + torch.rand(HIDDEN, generator=gen)


def _case(seed: int, num_layers: int, kv_heads: int, head_dim: int, bias: bool, block_size: int) -> Case:
    gen = torch.Generator().manual_seed(seed)
    q_size, kv_size, intermediate = NUM_HEADS * head_dim, kv_heads * head_dim, 40
    layers = [
        LayerWeights(
            _norm(gen),
            _gemm(gen, q_size + 2 * kv_size, HIDDEN, bias),
            _gemm(gen, HIDDEN, q_size, bias),
            _norm(gen),
            _gemm(gen, 2 * intermediate, HIDDEN, bias),
            _gemm(gen, HIDDEN, intermediate, bias),
        )
        for _ in range(num_layers)
    ]
    shape = ModelShape(NUM_HEADS, kv_heads, head_dim, EPS, 2 * EPS, head_dim**-0.5)
    return Case(layers, _norm(gen), shape, intermediate, 8, block_size)


@dataclass
class Step:
    embeddings: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor
    plan: cpu_decode_attention.NativePlan
    caches: list[torch.Tensor]


def _step(case: Case, rows: int, seed: int) -> Step:
    """`rows` decode rows, each over a context of a few blocks of its own."""
    gen = torch.Generator().manual_seed(seed)
    s, bs = case.shape, case.block_size
    lens = torch.randint(1, 2 * bs + 1, (rows,), generator=gen).tolist()
    tables = torch.randperm(case.num_blocks * rows, generator=gen)[: rows * 2].view(rows, 2).to(torch.int32)
    num_blocks = case.num_blocks * rows
    caches = [torch.randn(2, num_blocks, bs, s.kv_heads, s.head_dim, generator=gen) for _ in case.layers]
    slots = torch.tensor(
        [int(tables[r, (n - 1) // bs]) * bs + (n - 1) % bs for r, n in enumerate(lens)], dtype=torch.int64
    )
    half = s.head_dim // 2
    return Step(
        torch.randn(rows, HIDDEN, generator=gen),
        torch.rand(rows, half, generator=gen),
        torch.rand(rows, half, generator=gen),
        slots,
        cpu_decode_attention.plan(tables, lens, bs),
        caches,
    )


def _layer_by_layer(case: Case, step: Step) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The kernels called one by one, as engine/models/llama_layers.py's `forward_native_norms`
    does: (the final norm's output, the residual stream, the caches)."""
    caches = [c.clone() for c in step.caches]
    hidden, residual = step.embeddings.clone(), None
    for layer, cache in zip(case.layers, caches, strict=True):
        normed, residual = add_rms_norm(hidden, residual, layer.input_norm, EPS)
        q = rope_kv_write(layer.qkv(normed), step.cos, step.sin, step.slots, cache, NUM_HEADS)
        attn = cpu_decode_attention.decode_attention(q, cache, step.plan, case.shape.scale)
        normed, residual = add_rms_norm(
            layer.o(attn.reshape(attn.shape[0], -1)), residual, layer.post_norm, EPS
        )
        hidden = layer.down(silu_mul(layer.gate_up(normed)))
    assert residual is not None
    out, residual = add_rms_norm(hidden, residual, case.final_norm, 2 * EPS)
    return out, residual, caches


def _in_one_call(
    layers: DecodeLayers, step: Step, caches: Sequence[torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    caches = [c.clone() for c in step.caches] if caches is None else list(caches)
    residual = step.embeddings.clone()
    out = layers(residual, step.cos, step.sin, step.slots, step.plan, caches)
    return out, residual, caches


@settings(max_examples=25, deadline=None)
@given(
    num_layers=st.integers(1, 3),
    kv_heads=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([8, 16]),
    bias=st.booleans(),
    block_size=st.sampled_from([4, 16]),
    rows=st.integers(1, MAX_ROWS),
    pool_threads=st.sampled_from([0, 1, 2]),
    seed=st.integers(0, 2**16),
)
def test_one_call_gives_the_same_bits_as_the_kernels_one_by_one(
    num_layers: int,
    kv_heads: int,
    head_dim: int,
    bias: bool,
    block_size: int,
    rows: int,
    pool_threads: int,
    seed: int,
) -> None:
    case = _case(seed, num_layers, kv_heads, head_dim, bias, block_size)
    step = _step(case, rows, seed + 1)
    expected = _layer_by_layer(case, step)
    cpu_work_pool.set_pool_threads(pool_threads)  # 0: OpenMP; 2: the pool's helpers
    try:
        got = _in_one_call(DecodeLayers(case.layers, case.final_norm, case.shape), step)
    finally:
        cpu_work_pool.set_pool_threads(0)
    assert torch.equal(got[0], expected[0])  # the final norm's output
    assert torch.equal(got[1], expected[1])  # the residual stream, updated in place
    for a, b in zip(got[2], expected[2], strict=True):
        assert torch.equal(a, b)  # every layer's K/V stored, nothing else touched


def test_the_caches_may_change_between_steps() -> None:
    """A second step on other caches (a reallocated pool) reads and writes those."""
    case = _case(1, 2, 2, 8, False, 4)
    layers = DecodeLayers(case.layers, case.final_norm, case.shape)
    for seed in (2, 3):
        step = _step(case, 3, seed)
        got, expected = _in_one_call(layers, step), _layer_by_layer(case, step)
        assert torch.equal(got[0], expected[0])
        assert all(torch.equal(a, b) for a, b in zip(got[2], expected[2], strict=True))


def _refused(layers: DecodeLayers, step: Step, caches: list[torch.Tensor], match: str) -> None:
    before = [c.clone() for c in caches]
    residual = step.embeddings.clone()
    with pytest.raises(ValueError, match=match):
        layers(residual, step.cos, step.sin, step.slots, step.plan, caches)
    assert torch.equal(residual, step.embeddings)  # nothing written
    assert all(torch.equal(a, b) for a, b in zip(caches, before, strict=False))


def test_misread_steps_are_refused_with_nothing_written() -> None:
    case = _case(4, 2, 2, 8, True, 4)
    layers = DecodeLayers(case.layers, case.final_norm, case.shape)
    step = _step(case, 2, 5)
    caches = [c.clone() for c in step.caches]
    outside = dict(vars(step), slots=torch.tensor([0, caches[0].shape[1] * case.block_size]))
    _refused(layers, Step(**outside), caches, "refused this step")
    _refused(layers, step, caches[:1], "caches for 2 layers")
    _refused(layers, step, [c.to(torch.float64) for c in caches], "contiguous float32")
    _refused(layers, step, [c.transpose(1, 2) for c in caches], "contiguous float32")
    too_many = _step(case, MAX_ROWS, 6)
    wide = dict(vars(too_many), embeddings=torch.randn(MAX_ROWS + 1, HIDDEN))
    _refused(layers, Step(**wide), caches, "embeddings")
    _refused(layers, Step(**dict(vars(step), slots=step.slots.to(torch.int32))), caches, "slot_mapping")
    _refused(layers, Step(**dict(vars(step), cos=step.cos[:1])), caches, "cos")
    small = [c[:, :1].contiguous() for c in caches]  # the plan reads blocks these caches lack
    _refused(layers, step, small, "reading block")


def test_weights_of_the_wrong_shapes_are_refused() -> None:
    case = _case(7, 2, 2, 8, False, 4)
    with pytest.raises(ValueError, match="at least one layer"):
        DecodeLayers([], case.final_norm, case.shape)
    swapped = [LayerWeights(**dict(vars(case.layers[0]), o=case.layers[0].down)), case.layers[1]]
    with pytest.raises(ValueError, match="layer 0 o"):
        DecodeLayers(swapped, case.final_norm, case.shape)
    with pytest.raises(ValueError, match="final_norm"):
        DecodeLayers(case.layers, case.final_norm[:-1], case.shape)
    for kv_heads in (3, 0):
        with pytest.raises(ValueError, match="KV heads"):
            DecodeLayers(case.layers, case.final_norm, ModelShape(NUM_HEADS, kv_heads, 8, EPS, EPS, 1.0))
