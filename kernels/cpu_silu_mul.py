"""silu(gate) * up of the SwiGLU MLP in C (CPU, float32).

`silu_mul(gate_up)` takes the fused gate_up projection's output `[rows, 2 * width]` (gate in the
first half of each row, up in the second) and returns `silu(gate) * up`, `[rows, width]`: the
CPU counterpart of the Triton `weir.kernels.silu_mul`. In torch it is a split, `F.silu` on a strided
half (torch's slow path: ~20 us a call at 8 rows of SmolLM2's 1,536) and a multiply, once a
layer; the C kernel (`native/silu_mul.c`) is one ctypes call. Results differ from the torch form
by rounding only (another polynomial for exp).

`available()` is False where the kernel cannot be built (no C compiler): callers keep the torch
form. Tested against `F.silu(gate) * up`.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from weir.kernels.native import build

_I64 = ctypes.c_int64


@functools.cache
def _function() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    return build.function("silu_mul", "weir_silu_mul", [ctypes.c_void_p] * 2 + [_I64] * 3)


def available() -> bool:
    """Whether the C kernel is built (or can be: the first call compiles it)."""
    return _function() is not None


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [rows, 2 * width] float32 -> [rows, width]
    """silu(gate_up[:, :width]) * gate_up[:, width:]. ValueError on a tensor the kernel would
    misread: another dtype or device, not a matrix, an odd width, or rows that are not contiguous
    (a row stride of its own is fine: the fused output's rows may be a view)."""
    fn = _function()
    if fn is None:
        raise RuntimeError("the C silu_mul kernel is not available (weir.kernels.native.build)")
    if (
        gate_up.dtype != torch.float32
        or gate_up.device.type != "cpu"
        or gate_up.dim() != 2
        or gate_up.shape[1] % 2
        or gate_up.shape[1] == 0
    ):
        raise ValueError(
            f"gate_up must be a float32 CPU matrix of an even, non-zero width, got "
            f"{gate_up.dtype} {gate_up.device.type} {tuple(gate_up.shape)}"
        )
    if gate_up.stride(1) != 1 or gate_up.stride(0) < gate_up.shape[1]:
        gate_up = gate_up.contiguous()
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, width, dtype=torch.float32)
    if rows == 0:
        return out
    if fn(gate_up.data_ptr(), out.data_ptr(), rows, width, gate_up.stride(0)) != 0:
        raise ValueError("the C kernel refused these sizes")
    return out
