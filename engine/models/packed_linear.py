"""The CPU fast path for linear layers: weights reordered once into oneDNN's blocked layout.

`F.linear` on CPU passes the weight to the GEMM in its plain row-major layout on every call.
oneDNN can instead take a weight reordered once, at load, into its own blocked layout
(`torch.ops.mkldnn._reorder_linear_weight`) and multiply against it directly
(`torch.ops.mkldnn._linear_pointwise`). Measured on SmolLM2-135M's shapes (docs/benchmarks.md,
"CPU fast path"): 1.1-3.3x faster per GEMM at 8-128 rows, 1.1-1.3x at 512; at 1 row about even
for the small matrices (o_proj 0.8x) and 1.7-2x for gate/up and the LM head. A whole decode step
is faster at every batch size, so it is used at every row count and the plain weight is dropped
(no extra memory, except for a tied LM head, whose matrix is also the embedding table).

Results differ from `F.linear` by rounding only (another summation order): ~1e-6 in fp32.

Single-row calls (a decode step at batch 1, the LM head of one sequence) are a matrix-vector
product, bound by reading the weight from memory. oneDNN's blocked weight streams at ~1.4-1.5x the
time of a plain `sum` over the same bytes there, while `x @ W_t` with a second copy of the weight
stored transposed (`[in_features, out_features]`, contiguous: MKL's GEMV walks it row after row)
streams at the `sum`'s own speed (docs/benchmarks.md, "The decode step against the weight read"). With
`row_weight=True` a layer keeps that copy too and uses it for one-row inputs only; at 8 rows
the blocked weight is ~1.4x faster than the transposed copy, so both are kept: twice the memory
of the linear weights, which is why it is a setting (`EngineConfig.cpu_row_weights`). Which layout
streams faster depends on the host (another measured the reverse: packed 1.25x the `sum`, the copy
1.74x), so the setting's `auto` measures once at start-up (engine/models/row_weight_probe.py).
"""

from __future__ import annotations

import torch
from torch import nn

_PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def packing_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether this torch build can pack weights of `dtype` on `device` (oneDNN on CPU, fp32/bf16)."""
    if torch.device(device).type != "cpu" or dtype not in _PACKABLE_DTYPES:
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype != torch.bfloat16 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """y = x W^T (+ b) with W pre-packed for oneDNN. Built from a loaded weight; CPU only.

    The packed weight is an opaque oneDNN tensor held as a plain attribute (not a parameter:
    it cannot be copied into or saved); the bias, if any, stays an ordinary parameter.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, row_weight: bool = False):
        super().__init__()
        if not packing_supported(weight.dtype, weight.device):
            raise ValueError(f"cannot pack a {weight.dtype} weight on {weight.device}")
        self.out_features, self.in_features = weight.shape
        with torch.no_grad():
            # [out_features, in_features] in oneDNN's blocked layout
            self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())
            # [in_features, out_features]: the copy one-row inputs multiply against (see above)
            self.row_weight = weight.detach().t().contiguous() if row_weight else None
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @property
    def row_weight_bytes(self) -> int:
        """Bytes of the transposed copy for one-row inputs (0 without one)."""
        w = self.row_weight
        return 0 if w is None else w.numel() * w.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in_features] -> [..., out_features]
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] == 1 and self.row_weight is not None:
            out = (
                rows @ self.row_weight if self.bias is None else torch.addmm(self.bias, rows, self.row_weight)
            )
            return out.view(*x.shape[:-1], self.out_features)
        if not rows.is_contiguous():
            rows = rows.contiguous()
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, "none", [], "")
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"row_weight={self.row_weight is not None}"
        )


def pack_linear_layers(model: nn.Module, linear_type: type[nn.Module], row_weights: bool = False) -> int:
    """Replace every `linear_type` submodule (with `weight` and `bias`) by a PackedLinear
    (`row_weights`: each with its copy for one-row inputs).

    Call after the weights are loaded: the packed copy is taken once and the plain weight is
    released. Returns how many layers were packed.
    """
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, linear_type)
    ]
    for parent, name, child in targets:
        weight, bias = child.weight, child.bias
        if not isinstance(weight, torch.Tensor) or not (bias is None or isinstance(bias, torch.Tensor)):
            raise TypeError(f"{type(child).__name__} {name!r} has no weight/bias tensors to pack")
        setattr(parent, name, PackedLinear(weight, bias, row_weights))
    return len(targets)
