"""LoRA deltas for a mixed step: every token adds the delta of its own adapter's slot (or none).

Each (fused) projection of each layer holds the factors of every slot: `a` `[num_slots * width,
in]`, where `width` is `len(sub-projections) * max_rank` (qkv has three sub-projections, gate_up
two) and slot s owns rows `s * width : (s + 1) * width`, a sub-projection j of rank r rows
`j * max_rank : j * max_rank + r` of them; and one `b[j]` `[num_slots * max_rank, out_j]` per
sub-projection, slot s owning rows `s * max_rank : (s + 1) * max_rank`. Unused rows are zero,
the scaling is folded into `b`.

One step computes, for the whole flat token batch and every projection (n: the slots in use),

    t = (x a[:n * width]^T) * mask                  one shrink for q, k and v together
    y[:, cols_j] += t[:, j] b[j][:n * max_rank]     one expand per sub-projection an adapter of
                                                    the step targets

with mask[t, s] = 1 iff token t uses slot s. Dense matmuls whatever the mix of adapters, no
gather and no per-adapter loop: on CPU, where a decode step is bound by reading the weights,
this reads each active slot's factors exactly once and no zeros between them (a single
block-diagonal B for a fused projection read 2-3x the bytes of the expand; docs/benchmarks.md,
"LoRA"). A base-model token (slot -1, an all-zero mask row) gets an exact zero, so its output is
bit-identical to a step without LoRA. A projection no adapter of the step targets is skipped; a
step with no adapter token skips all of it (`LoraStep` is None).

On the model's Triton path (CUDA) the same delta goes through the gathered kernels of
kernels/lora_bgmv.py instead: each token reads only its own slot's factors (`LoraStep.kernels`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from weir.engine.config import ModelConfig

# The fused projections of weir.engine.models.llama_layers and the PEFT targets each one holds, in order.
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
        self.width = len(targets) * max_rank  # rows of `a` per slot
        self.out_sizes = tuple(out_sizes)
        self.out_offsets = tuple(sum(out_sizes[:j]) for j in range(len(out_sizes)))
        self.a = torch.zeros(
            num_slots * self.width, in_features, dtype=dtype, device=device
        )  # [S * width, in]
        self.b = tuple(
            torch.zeros(num_slots * max_rank, out, dtype=dtype, device=device) for out in out_sizes
        )  # each [S * max_rank, out_j]
        # Bit s of target_slots[j]: slot s holds factors for sub-projection j.
        self.target_slots = [0] * len(targets)

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.a, *self.b))

    def set_slot(
        self, slot: int, factors: Mapping[str, tuple[torch.Tensor, torch.Tensor]], scaling: float
    ) -> None:
        """Write one adapter's factors (target -> (A [r, in], B [out, r])) into `slot`; absent
        targets are zero."""
        self.clear_slot(slot)
        base, r_max = slot * self.width, self.max_rank
        with torch.no_grad():
            for j, target in enumerate(self.targets):
                pair = factors.get(target)
                if pair is None:
                    continue
                a, b = pair
                rank = a.shape[0]
                row = base + j * r_max
                self.a[row : row + rank].copy_(a)
                # [r, out_j]: B^T with the scaling folded in, computed in float32 then cast
                self.b[j][slot * r_max : slot * r_max + rank].copy_(b.t() * scaling)
                self.target_slots[j] |= 1 << slot

    def clear_slot(self, slot: int) -> None:
        base, r_max = slot * self.width, self.max_rank
        with torch.no_grad():
            self.a[base : base + self.width].zero_()
            for j, b in enumerate(self.b):
                b[slot * r_max : (slot + 1) * r_max].zero_()
                self.target_slots[j] &= ~(1 << slot)


class LoraStep:
    """Which slot each token of one step uses (-1: the base model), and the slot mask.

    Built by the runner for a step that has at least one adapter token; the model's forward
    takes it as an argument and hands it to every projection.
    """

    def __init__(
        self,
        token_slots: torch.Tensor,
        num_active_slots: int,
        dtype: torch.dtype,
        slot_bits: int | None = None,
        kernels: bool = False,
    ) -> None:
        self.token_slots = token_slots  # [num_tokens] int64, -1 for base-model tokens
        # The gathered Triton kernels (kernels/lora_bgmv.py) instead of the masked dense form:
        # the model's Triton path on CUDA (tests: under the interpreter).
        self.kernels = kernels
        self.num_active_slots = num_active_slots  # slots 0 .. num_active_slots - 1 may be used
        self.dtype = dtype
        # Bit s: some token uses slot s (None: every slot below num_active_slots may be).
        self.slot_bits = (1 << num_active_slots) - 1 if slot_bits is None else slot_bits
        self._mask: torch.Tensor | None = None

    @property
    def mask(self) -> torch.Tensor:  # [num_tokens, num_active_slots]: 1 where the token uses the slot
        if self._mask is None:
            slots = torch.arange(self.num_active_slots, device=self.token_slots.device)
            self._mask = (self.token_slots[:, None] == slots[None, :]).to(self.dtype)
        return self._mask

    def apply(self, y: torch.Tensor, x: torch.Tensor, proj: ProjectionLora) -> torch.Tensor:
        """y += this step's LoRA delta of `proj` for input x; y `[num_tokens, out]`, in place."""
        used = [j for j, bits in enumerate(proj.target_slots) if bits & self.slot_bits]
        if not used:
            return y
        if self.kernels:
            return self._apply_gathered(y, x, proj, used)
        n, r, subs = self.num_active_slots, proj.max_rank, len(proj.targets)
        num_tokens = x.shape[0]
        t = F.linear(x, proj.a[: n * proj.width])  # [num_tokens, n * width], slot-major
        if subs == 1:
            t.view(num_tokens, n, r).mul_(self.mask.view(num_tokens, n, 1))
            return y.addmm_(t, proj.b[0][: n * r])
        # Masked and regrouped sub-projection-major: each sub-projection's columns side by side.
        grouped = torch.empty(num_tokens, subs, n, r, dtype=t.dtype, device=t.device)
        torch.mul(
            t.view(num_tokens, n, subs, r).transpose(1, 2),
            self.mask.view(num_tokens, 1, n, 1),
            out=grouped,
        )
        for j in used:
            cols = slice(proj.out_offsets[j], proj.out_offsets[j] + proj.out_sizes[j])
            y[:, cols].addmm_(grouped[:, j].reshape(num_tokens, n * r), proj.b[j][: n * r])
        return y

    def _apply_gathered(
        self, y: torch.Tensor, x: torch.Tensor, proj: ProjectionLora, used: list[int]
    ) -> torch.Tensor:
        """`apply` through the gathered kernels: each token reads only its own slot's factors."""
        from weir.kernels.lora_bgmv import bgmv_expand_, bgmv_shrink

        r = proj.max_rank
        t = bgmv_shrink(x.contiguous(), proj.a, self.token_slots, proj.width)  # [num_tokens, width]
        for j in used:
            cols = slice(proj.out_offsets[j], proj.out_offsets[j] + proj.out_sizes[j])
            bgmv_expand_(y[:, cols], t[:, j * r : (j + 1) * r], proj.b[j], self.token_slots)
        return y


def build_projection_loras(
    config: ModelConfig, num_slots: int, max_rank: int, dtype: torch.dtype, device: torch.device
) -> dict[str, ProjectionLora]:
    """One layer's ProjectionLora per fused projection, all slots zero."""
    from weir.engine.lora.lora_adapter import projection_shape

    out: dict[str, ProjectionLora] = {}
    for fused, targets in FUSED_TARGETS.items():
        in_features = projection_shape(config, targets[0])[0]
        out_sizes = [projection_shape(config, t)[1] for t in targets]
        out[fused] = ProjectionLora(targets, in_features, out_sizes, num_slots, max_rank, dtype, device)
    return out
