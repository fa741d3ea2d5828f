"""engine/lora/lora_deltas.py: the masked, grouped LoRA delta against a per-token reference."""

from __future__ import annotations

import pytest
import torch

from weir.engine.lora.lora_deltas import LoraStep, ProjectionLora

IN, OUTS, RANK, SLOTS = 24, (16, 8, 8), 4, 3
TARGETS = ("q_proj", "k_proj", "v_proj")


def _factors(
    gen: torch.Generator, rank: int, targets: tuple[str, ...]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    out = {}
    for t in targets:
        j = TARGETS.index(t)
        out[t] = (torch.randn(rank, IN, generator=gen), torch.randn(OUTS[j], rank, generator=gen))
    return out


def _reference(
    y: torch.Tensor,
    x: torch.Tensor,
    token_adapters: list[dict[str, tuple[torch.Tensor, torch.Tensor]] | None],
    scalings: list[float],
) -> torch.Tensor:
    out = y.clone()
    offsets = [0, OUTS[0], OUTS[0] + OUTS[1]]
    for i, factors in enumerate(token_adapters):
        if factors is None:
            continue
        for t, (a, b) in factors.items():
            j = TARGETS.index(t)
            out[i, offsets[j] : offsets[j] + OUTS[j]] += (x[i] @ a.t() @ b.t()) * scalings[i]
    return out


@pytest.mark.parametrize("num_subs", [1, 3])
def test_each_token_gets_its_own_slots_delta_and_base_tokens_none(num_subs: int) -> None:
    gen = torch.Generator().manual_seed(0)
    targets = TARGETS[:num_subs]
    outs = OUTS[:num_subs]
    proj = ProjectionLora(targets, IN, outs, SLOTS, RANK, torch.float64, torch.device("cpu"))
    # slot 0: every target at full rank; slot 1: a lower rank; slot 2: the last target only
    adapters = [
        _factors(gen, RANK, targets),
        _factors(gen, 2, targets),
        _factors(gen, RANK, targets[-1:]),
    ]
    scalings = [0.5, 2.0, 1.0]
    for slot, (factors, scaling) in enumerate(zip(adapters, scalings, strict=True)):
        proj.set_slot(slot, factors, scaling)
    slots = [0, -1, 2, 1, 1, -1, 0, 2]
    x = torch.randn(len(slots), IN, generator=gen, dtype=torch.float64)
    y = torch.randn(len(slots), sum(outs), generator=gen, dtype=torch.float64)
    expected = _reference(
        y[:, : sum(outs)],
        x,
        [
            None if s < 0 else {k: (a.double(), b.double()) for k, (a, b) in adapters[s].items()}
            for s in slots
        ],
        [0.0 if s < 0 else scalings[s] for s in slots],
    )
    step = LoraStep(torch.tensor(slots), SLOTS, torch.float64)
    got = step.apply(y.clone(), x, proj)
    torch.testing.assert_close(got, expected)
    base_rows = [i for i, s in enumerate(slots) if s < 0]
    assert torch.equal(got[base_rows], y[base_rows])  # bit-identical, not merely close


def test_a_projection_no_adapter_of_the_step_targets_is_left_untouched() -> None:
    gen = torch.Generator().manual_seed(1)
    proj = ProjectionLora(TARGETS, IN, OUTS, SLOTS, RANK, torch.float32, torch.device("cpu"))
    proj.set_slot(1, _factors(gen, RANK, ("q_proj",)), 1.0)
    assert proj.target_slots == [0b010, 0, 0]
    x, y = torch.randn(3, IN, generator=gen), torch.randn(3, sum(OUTS), generator=gen)
    step = LoraStep(torch.tensor([0, 0, -1]), 1, torch.float32, slot_bits=0b001)  # slot 0 is empty
    assert torch.equal(step.apply(y.clone(), x, proj), y)
    step = LoraStep(torch.tensor([1, 0, -1]), 2, torch.float32, slot_bits=0b011)
    got = step.apply(y.clone(), x, proj)
    assert not torch.equal(got[0, : OUTS[0]], y[0, : OUTS[0]])
    assert torch.equal(got[0, OUTS[0] :], y[0, OUTS[0] :])  # k and v: slot 1 has no factors
    assert torch.equal(got[1:], y[1:])


def test_clearing_a_slot_zeroes_it_and_forgets_its_targets() -> None:
    gen = torch.Generator().manual_seed(2)
    proj = ProjectionLora(TARGETS, IN, OUTS, SLOTS, RANK, torch.float32, torch.device("cpu"))
    proj.set_slot(2, _factors(gen, RANK, TARGETS), 1.0)
    proj.set_slot(0, _factors(gen, RANK, ("v_proj",)), 1.0)
    proj.set_slot(2, _factors(gen, RANK, ("k_proj",)), 1.0)  # replaced: q and v are gone
    assert proj.target_slots == [0, 0b100, 0b001]
    proj.clear_slot(2)
    assert proj.target_slots == [0, 0, 0b001]
    assert not proj.a[2 * proj.width :].any()
    assert not any(b[2 * RANK :].any() for b in proj.b)
    assert proj.num_bytes == 4 * (proj.a.numel() + sum(b.numel() for b in proj.b))
