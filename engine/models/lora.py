"""LoRA deltas for a mixed step: every token adds the delta of its own adapter's slot (or none).

Each (fused) projection of each layer holds the factors of every slot side by side:
`a` `[num_slots * width, in]` and `b` `[num_slots * width, out]`, where `width` is
`len(sub-projections) * max_rank` (qkv has three sub-projections, gate_up two). Slot s owns rows
`s * width : (s + 1) * width`; a sub-projection j of rank r owns `j * max_rank : j * max_rank + r`
of them, and in `b` only its own output columns, so a fused projection is one block-diagonal
matrix per slot. Unused rows are zero, the scaling is folded into `b`.

One step computes, for the whole flat token batch and every projection,

    y += ((x a[:n]^T) * mask) b[:n]        with mask[t, c] = 1 iff column c belongs to token t's slot

(`n`: the rows of the slots in use). Two dense matmuls whatever the mix of adapters, no gather
and no per-adapter loop: on CPU this is the cheapest form, and a base-model token (slot -1, an
all-zero mask row) gets an exact zero, so its output is bit-identical to a step without LoRA.
A step with no adapter token skips all of it (`LoraStep` is None).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from engine.config import ModelConfig

# The fused projections of engine.models.llama and the PEFT targets each one holds, in order.
FUSED_TARGETS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}


class ProjectionLora:
    """The LoRA factors of one (fused) projection of one layer, for every slot."""

    def __init__(
        self,
        targets: tuple[str, ...],
        in_features: int,
        out_sizes: Sequence[int],
        num_slots: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.targets = targets
        self.max_rank = max_rank
        self.width = len(targets) * max_rank  # rows per slot
        self.out_sizes = tuple(out_sizes)
        self.out_offsets = tuple(sum(out_sizes[:j]) for j in range(len(out_sizes)))
        self.a = torch.zeros(
            num_slots * self.width, in_features, dtype=dtype, device=device
        )  # [S * width, in]
        self.b = torch.zeros(
            num_slots * self.width, sum(out_sizes), dtype=dtype, device=device
        )  # [S * width, out]

    @property
    def num_bytes(self) -> int:
        return self.a.numel() * self.a.element_size() + self.b.numel() * self.b.element_size()

    def set_slot(
        self, slot: int, factors: Mapping[str, tuple[torch.Tensor, torch.Tensor]], scaling: float
    ) -> None:
        """Write one adapter's factors (target -> (A [r, in], B [out, r])) into `slot`; absent
        targets are zero."""
        base = slot * self.width
        with torch.no_grad():
            self.a[base : base + self.width].zero_()
            self.b[base : base + self.width].zero_()
            for j, target in enumerate(self.targets):
                pair = factors.get(target)
                if pair is None:
                    continue
                a, b = pair
                rank = a.shape[0]
                row, col = base + j * self.max_rank, self.out_offsets[j]
                self.a[row : row + rank].copy_(a)
                # [r, out_j]: B^T with the scaling folded in, computed in float32 then cast
                self.b[row : row + rank, col : col + self.out_sizes[j]].copy_(b.t() * scaling)

    def clear_slot(self, slot: int) -> None:
        base = slot * self.width
        with torch.no_grad():
            self.a[base : base + self.width].zero_()
            self.b[base : base + self.width].zero_()


class LoraStep:
    """Which slot each token of one step uses (-1: the base model), and the column masks.

    Built by the runner for a step that has at least one adapter token; the model's forward
    takes it as an argument and hands it to every projection.
    """

    def __init__(self, token_slots: torch.Tensor, num_active_slots: int, dtype: torch.dtype) -> None:
        self.token_slots = token_slots  # [num_tokens] int64, -1 for base-model tokens
        self.num_active_slots = num_active_slots  # slots 0 .. num_active_slots - 1 may be used
        self.dtype = dtype
        self._masks: dict[int, torch.Tensor] = {}

    def mask(self, width: int) -> torch.Tensor:  # [num_tokens, num_active_slots * width]
        m = self._masks.get(width)
        if m is None:
            cols = torch.arange(self.num_active_slots, device=self.token_slots.device).repeat_interleave(
                width
            )
            m = self._masks[width] = (self.token_slots[:, None] == cols[None, :]).to(self.dtype)
        return m

    def apply(self, y: torch.Tensor, x: torch.Tensor, proj: ProjectionLora) -> torch.Tensor:
        """y += this step's LoRA delta of `proj` for input x; y `[num_tokens, out]`, in place."""
        rows = self.num_active_slots * proj.width
        t = F.linear(x, proj.a[:rows])  # [num_tokens, rows]
        t.mul_(self.mask(proj.width))
        return y.addmm_(t, proj.b[:rows])  # [num_tokens, out]


def build_projection_loras(
    config: ModelConfig, num_slots: int, max_rank: int, dtype: torch.dtype, device: torch.device
) -> dict[str, ProjectionLora]:
    """One layer's ProjectionLora per fused projection, all slots zero."""
    from engine.lora_adapter import projection_shape

    out: dict[str, ProjectionLora] = {}
    for fused, targets in FUSED_TARGETS.items():
        in_features = projection_shape(config, targets[0])[0]
        out_sizes = [projection_shape(config, t)[1] for t in targets]
        out[fused] = ProjectionLora(targets, in_features, out_sizes, num_slots, max_rank, dtype, device)
    return out
