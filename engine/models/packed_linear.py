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

Few-row calls (a decode step of up to 16 sequences, the LM head of a few) are bound by reading
the weight from memory. oneDNN's blocked weight streams at 1.1-1.6x the time of a plain `sum` over
the same bytes at one row and 1.3-2.3x at eight, depending on the host and shape. With
`row_inputs=n` a layer also keeps its weight packed in column panels for the C kernel
`weir.kernels.cpu_small_gemm` and multiplies inputs of at most n rows with it (one read of the weight
per call: 0.96-1.08x the `sum`'s time on SmolLM2's linears at one row, 1.1-1.5x at eight).
Where no C compiler builds that kernel, the copy is the weight transposed (`[in_features,
out_features]`, contiguous), which MKL's GEMV walks row after row, for one-row inputs only (the
sum's speed on one host, 1.74x it on another). Either copy is a second weight beside the packed
one (for a tied LM head, beside the embedding table), which is why it is a setting
(`EngineConfig.cpu_row_weights`); its `auto` measures on this host at start-up whether it pays and
up to how many rows (engine/models/row_weight_probe.py).
"""

from __future__ import annotations

import torch
from torch import nn

from weir.kernels import cpu_small_gemm

_PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def row_copy_native() -> bool:
    """Whether few-row inputs take the C kernel on the plain weight (else MKL on a transposed copy)."""
    return cpu_small_gemm.available()


# What oneDNN needs to pack bfloat16 on x86 (its avx512_core level, which AMX CPUs also have); an
# AVX2-only CPU (e.g. an AMD EPYC before Zen 4) packs float32 only.
BFLOAT16_PACKING_ISA = "AVX-512 (AVX512F, BW, VL and DQ) or AMX"


def cpu_packs_bfloat16() -> bool:
    """The probe of this CPU's bfloat16 packing (oneDNN's own check of the instruction set): the
    engine's choice and every test that depends on the CPU's features ask it, nothing else."""
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def packing_unsupported_reason(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why this torch build on this machine cannot pack weights of `dtype` on `device`, naming what is
    missing (the device, the dtype, oneDNN, or the CPU's instruction set); None where it can."""
    if torch.device(device).type != "cpu":
        return f"pre-packed linear weights need a CPU, not {device}"
    if dtype not in _PACKABLE_DTYPES:
        return f"pre-packed linear weights need float32 or bfloat16, not {dtype}"
    if not torch.backends.mkldnn.is_available():
        return "pre-packed linear weights need oneDNN, which this torch build lacks"
    if dtype == torch.bfloat16 and not cpu_packs_bfloat16():
        return (
            f"bfloat16 packing needs {BFLOAT16_PACKING_ISA}, which this CPU lacks (torch sees "
            f"{torch.backends.cpu.get_cpu_capability()}); use float32 or turn the packed path off"
        )
    return None


def packing_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether this torch build can pack weights of `dtype` on `device` (oneDNN on CPU, fp32/bf16)."""
    return packing_unsupported_reason(dtype, device) is None


class PackedLinear(nn.Module):
    """y = x W^T (+ b) with W pre-packed for oneDNN. Built from a loaded weight; CPU only.

    The packed weight is an opaque oneDNN tensor held as a plain attribute (not a parameter:
    it cannot be copied into or saved); the bias, if any, stays an ordinary parameter.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, row_inputs: int = 0):
        super().__init__()
        reason = packing_unsupported_reason(weight.dtype, weight.device)
        if reason is not None:
            raise ValueError(f"cannot pack a {weight.dtype} weight on {weight.device}: {reason}")
        if row_inputs < 0:
            raise ValueError(f"row_inputs must be >= 0, got {row_inputs}")
        if row_inputs and weight.dtype != torch.float32:
            raise ValueError(f"row copies need a float32 weight, got {weight.dtype}")
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        # The copy few-row inputs multiply against (see above): the weight in panels for the C
        # kernel (inputs of at most `row_inputs` rows), else the transposed weight for MKL (one row).
        self.row_gemm: cpu_small_gemm.SmallGemm | None = None
        self.row_weight: torch.Tensor | None = None  # [in_features, out_features], without the C kernel
        self.row_inputs = 0
        with torch.no_grad():
            # [out_features, in_features] in oneDNN's blocked layout
            self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())
            if row_inputs and row_copy_native():
                self.row_gemm = cpu_small_gemm.SmallGemm(
                    weight.detach(), None if self.bias is None else self.bias.data
                )
                self.row_inputs = min(row_inputs, cpu_small_gemm.MAX_ROWS)
            elif row_inputs:
                self.row_weight = weight.detach().t().contiguous()
                self.row_inputs = 1

    @property
    def row_weight_bytes(self) -> int:
        """Bytes of the copy for few-row inputs (0 without one)."""
        if self.row_gemm is not None:
            return self.row_gemm.nbytes
        w = self.row_weight
        return 0 if w is None else w.numel() * w.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in_features] -> [..., out_features]
        rows = x.reshape(-1, self.in_features)
        if self.row_gemm is not None and 0 < rows.shape[0] <= self.row_inputs and rows.dtype == torch.float32:
            return self.row_gemm(rows).view(*x.shape[:-1], self.out_features)
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
            f"row_inputs={self.row_inputs}{', C kernel' if self.row_gemm is not None else ''}"
        )


def pack_linear_layers(model: nn.Module, linear_type: type[nn.Module], row_inputs: int = 0) -> int:
    """Replace every `linear_type` submodule (with `weight` and `bias`) by a PackedLinear
    (`row_inputs` > 0: each with its copy for inputs of at most that many rows).

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
        setattr(parent, name, PackedLinear(weight, bias, row_inputs))
    return len(targets)
