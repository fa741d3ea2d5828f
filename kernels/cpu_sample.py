"""Drawing one token per row from softmax(logits / temperature) in C (the CPU sampler's sampled rows).

`sample_rows(logits, temperature, uniform)` is what `Sampler.draw(softmax(logits / t))` does with
torch for float32 CPU logits: each row's token is the first whose cumulative probability exceeds
the row's uniform number; masked (-inf) tokens are never drawn; where rounding leaves the
target past the last cumulative sum, the row's argmax. torch spends four passes over each row on
it (divide, softmax, cumsum, and the fallback's argmax: ~2 ms a step at 8 rows of SmolLM2's
49,152 logits, measured); the C kernel (`native/sample_rows.c`) makes two, sixteen lanes at a
time. Its sums round differently from torch's, so a draw can differ from torch's only where the
uniform number falls within a few ulp of a boundary between two tokens.

`available()` is False where the kernel cannot be built (no C compiler): callers keep torch's.
Tested against the torch draw and against the softmax distribution.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from kernels.native import build

_I64 = ctypes.c_int64
BLOCK = 64  # native/sample_rows.c: the weights summed as one block


@functools.cache
def _function() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    return build.function("sample_rows", "weir_sample_rows", [ctypes.c_void_p] * 5 + [_I64] * 3)


def available() -> bool:
    """Whether the C kernel is built (or can be: the first call compiles it)."""
    return _function() is not None


def sample_rows(
    logits: torch.Tensor,  # [rows, vocab] float32 CPU
    temperature: torch.Tensor,  # [rows] float32, > 0
    uniform: torch.Tensor,  # [rows] float32 in [0, 1)
) -> torch.Tensor:  # [rows] int64
    """One token per row (see the module docstring). ValueError on tensors the kernel would
    misread (another dtype or device, mismatched rows, no columns); rows that are not laid out in
    place are copied first."""
    fn = _function()
    if fn is None:
        raise RuntimeError("the C sampling kernel is not available (kernels.native.build)")
    shape = logits.shape
    if len(shape) != 2 or logits.dtype != torch.float32 or not logits.is_cpu or shape[1] == 0:
        raise ValueError(
            f"logits must be a float32 CPU matrix with columns, got {logits.dtype} {tuple(shape)}"
        )
    rows, cols = shape
    for name, t in (("temperature", temperature), ("uniform", uniform)):
        if t.shape != (rows,) or t.dtype != torch.float32 or not t.is_cpu:
            raise ValueError(f"{name} must be [{rows}] float32 on the CPU, got {t.dtype} {tuple(t.shape)}")
    if logits.stride(1) != 1 or logits.stride(0) < cols:
        logits = logits.contiguous()
    temperature, uniform = temperature.contiguous(), uniform.contiguous()
    out = torch.empty(rows, dtype=torch.int64)
    scratch = torch.empty(cols + (cols + BLOCK - 1) // BLOCK, dtype=torch.float32)
    status = fn(
        logits.data_ptr(),
        temperature.data_ptr(),
        uniform.data_ptr(),
        out.data_ptr(),
        scratch.data_ptr(),
        rows,
        cols,
        logits.stride(0),
    )
    if rows and status != 0:
        raise ValueError("the C kernel refused these sizes")
    return out
