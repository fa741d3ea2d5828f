"""engine/lora/lora_deltas.py through the gathered Triton kernels (the CUDA path) equals its masked
torch form; on CPU the kernels run under the Triton interpreter."""

from __future__ import annotations

from tests.kernels.interpret import kernel_device

DEVICE = kernel_device()  # before kernels.* is imported: TRITON_INTERPRET=1 without CUDA

import pytest  # noqa: E402
import torch  # noqa: E402

from weir.engine.lora.lora_deltas import LoraStep, ProjectionLora  # noqa: E402

IN, RANK, SLOTS = 40, 4, 3


@pytest.mark.parametrize("outs", [(24,), (16, 8, 8)])
def test_the_kernel_path_matches_the_masked_torch_path(outs: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(5)
    targets = ("q_proj", "k_proj", "v_proj")[: len(outs)]
    proj = ProjectionLora(targets, IN, outs, SLOTS, RANK, torch.float32, DEVICE)
    for slot, rank in enumerate((RANK, 2, RANK)):
        chosen = targets if slot != 2 else targets[-1:]
        factors = {
            t: (
                torch.randn(rank, IN, generator=gen),
                torch.randn(outs[targets.index(t)], rank, generator=gen),
            )
            for t in chosen
        }
        proj.set_slot(slot, {t: (a.to(DEVICE), b.to(DEVICE)) for t, (a, b) in factors.items()}, 0.5)
    slots = torch.tensor([0, -1, 2, 1, 1, -1, 0, 2], device=DEVICE)
    x = torch.randn(len(slots), IN, generator=gen).to(DEVICE)
    y = torch.randn(len(slots), sum(outs), generator=gen).to(DEVICE)
    masked = LoraStep(slots, SLOTS, torch.float32).apply(y.clone(), x, proj)
    gathered = LoraStep(slots, SLOTS, torch.float32, kernels=True).apply(y.clone(), x, proj)
    torch.testing.assert_close(gathered, masked, atol=1e-5, rtol=1e-5)
    base = slots < 0
    assert torch.equal(gathered[base], y[base])
