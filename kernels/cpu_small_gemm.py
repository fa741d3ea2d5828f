"""y = x W^T (+ b) for a few rows of x in C, streaming a float32 weight packed in panels once (CPU).

A decode step's linears multiply one to a few activation rows by each weight: bound by reading
the weight from memory. The C kernel (`native/small_gemm.c`) takes the weight repacked once, at
construction, into panels of output columns (`panel_width()` columns side by side for each input
column) and reads them once per call, using each weight vector for every row from registers.
Measured on SmolLM2's linears against a plain `sum` over the same bytes (docs/benchmarks.md,
tenth stop): 0.96-1.08x at one row and 1.3-1.5x at eight on one thread (1.1-1.3x on two), where
oneDNN's blocked weight takes 1.2-1.6x and 1.5-2.3x, and the previous kernel over the plain
row-major weight 1.0-1.3x and 2.1-3.8x. Which row counts it takes is measured per host
(engine/models/row_weight_probe.py).

The panels are a copy: the weight passed in is not kept (a tied LM head's panels are memory
beside its embedding table). Results differ from `F.linear` by rounding only (another summation
order).

`available()` is False where the kernel cannot be built (no C compiler, a failed build): callers
keep their torch path. The torch reference it is tested against is `torch.nn.functional.linear`.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from weir.kernels import cpu_work_pool
from weir.kernels.checks import check_tensor
from weir.kernels.native import build

# native/small_gemm.c's MAX_ROWS: its loops are specialised for 1..8 input rows, and take 9..16 in
# groups of 8 over each panel in turn (the panel from cache for the second group).
MAX_ROWS = 16

_I64 = ctypes.c_int64


@functools.cache
def _function() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    fn = build.function(
        "small_gemm", "weir_small_gemm", [ctypes.c_void_p] * 4 + [_I64] * 3 + [ctypes.c_int] * 2
    )
    max_rows = build.function("small_gemm", "weir_small_gemm_max_rows", [])
    if max_rows is not None and max_rows() != MAX_ROWS:
        raise RuntimeError("native/small_gemm.c and kernels/cpu_small_gemm.py disagree on MAX_ROWS")
    if fn is not None:
        cpu_work_pool.connect("small_gemm")
    return fn


def available() -> bool:
    """Whether the C kernel is built (or can be: the first call compiles it)."""
    return _function() is not None


@functools.cache
def panel_width() -> int:
    """Output columns per panel of the packed weight (the build's vector width times its unroll)."""
    width = build.function("small_gemm", "weir_small_gemm_panel_width", [])
    if width is None:
        raise RuntimeError("the C small-GEMM kernel is not available (weir.kernels.native.build)")
    return int(width())


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [out, in] as the kernel's panels [ceil(out / P), in, P] (P = `panel_width()`):
    panel p, row k holds W[p * P + j][k] for j < P, zeros past `out`."""
    width = panel_width()
    out_features, in_features = weight.shape
    panels = -(-out_features // width)
    padded = torch.zeros(panels * width, in_features, dtype=weight.dtype)
    padded[:out_features] = weight
    return padded.view(panels, width, in_features).transpose(1, 2).contiguous()


class SmallGemm:
    """One weight (and bias), checked and packed into panels once, multiplied against few-row
    inputs with the C kernel.

    A decode step calls ~120 linears: the per-call work is kept to the checks of `x` that guard
    the kernel's reads (dtype, rank, width, row count, contiguity)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        fn = _function()
        if fn is None:
            raise RuntimeError("the C small-GEMM kernel is not available (weir.kernels.native.build)")
        # Any strides: the weight is copied into panels.
        check_tensor(
            "weight",
            weight,
            ndim=2,
            dtypes=(torch.float32,),
            device=torch.device("cpu"),
            unit_last_stride=False,
        )
        if weight.numel() == 0:
            raise ValueError(f"weight must not be empty, got shape {tuple(weight.shape)}")
        self.out_features, self.in_features = weight.shape
        if bias is not None:
            bias = check_tensor("bias", bias, ndim=1, dtypes=(torch.float32,), device=weight.device)
            if bias.shape[0] != self.out_features:
                raise ValueError(f"bias of {bias.shape[0]} for {self.out_features} output features")
            bias = bias.contiguous()
        self._fn = fn
        self.panels = pack_panels(weight.detach())
        self.bias = bias
        self._bias_ptr = None if bias is None else bias.data_ptr()

    @property
    def nbytes(self) -> int:
        """Bytes of the packed weight (the padding of the last panel included)."""
        return self.panels.numel() * self.panels.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [rows, in_features] -> [rows, out_features]
        """x W^T (+ bias). ValueError on an input the kernel would misread."""
        if (
            not isinstance(x, torch.Tensor)
            or x.dtype != torch.float32
            or x.device.type != "cpu"
            or x.dim() != 2
            or x.shape[1] != self.in_features
            or not 1 <= x.shape[0] <= MAX_ROWS
        ):
            raise ValueError(
                f"x must be a float32 CPU matrix of 1..{MAX_ROWS} rows of {self.in_features}, got "
                f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}"
            )
        if not x.is_contiguous():
            x = x.contiguous()
        rows = x.shape[0]
        y = torch.empty(rows, self.out_features, dtype=torch.float32)
        threads, pool = cpu_work_pool.kernel_threads()
        status = self._fn(
            x.data_ptr(),
            self.panels.data_ptr(),
            self._bias_ptr,
            y.data_ptr(),
            rows,
            self.in_features,
            self.out_features,
            threads,
            pool,
        )
        if status != 0:
            raise ValueError("the C kernel refused these sizes")
        return y


def small_gemm(
    x: torch.Tensor,  # [rows, in_features] float32, 1 <= rows <= MAX_ROWS
    weight: torch.Tensor,  # [out_features, in_features] float32
    bias: torch.Tensor | None = None,  # [out_features] float32
) -> torch.Tensor:  # [rows, out_features]
    """x W^T (+ bias), checking everything on each call. ValueError on shapes, dtypes or row
    counts the kernel would misread."""
    return SmallGemm(weight, bias)(x)
