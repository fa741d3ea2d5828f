"""Drawing one token per row from softmax(logits / temperature) in C (the CPU sampler's sampled rows).

`sample_rows(logits, temperature, uniform)` is what `Sampler.draw(softmax(logits / t))` does with
torch for float32 CPU logits: each row's token is the first whose cumulative probability exceeds
the row's uniform number; masked (-inf) tokens are never drawn; where rounding leaves the
target past the last cumulative sum, the row's argmax. torch spends four passes over each row on
it (divide, softmax, cumsum, and the fallback's argmax: ~2 ms a step at 8 rows of SmolLM2's
49,152 logits, measured); the C kernel (`native/sample_rows.c`) makes two, sixteen lanes at a
time. Its sums round differently from torch's, so a draw can differ from torch's only where the
uniform number falls within a few ulp of a boundary between two tokens.

`logsumexp_rows` is top-p's normaliser over what a top-k keeps, in the same kernel file.
`available()` is False where the kernels cannot be built (no C compiler): callers keep torch's.
Tested against the torch draw and against the softmax distribution.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from weir.kernels.native import build

_I64 = ctypes.c_int64
BLOCK = 64  # native/sample_rows.c: the weights summed as one block


@functools.cache
def _function() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    return build.function("sample_rows", "weir_sample_rows", [ctypes.c_void_p] * 6 + [_I64] * 3)


@functools.cache
def _logsumexp_function() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    return build.function("sample_rows", "weir_logsumexp_rows", [ctypes.c_void_p] * 4 + [_I64] * 3)


def available() -> bool:
    """Whether the C kernel is built (or can be: the first call compiles it)."""
    return _function() is not None and _logsumexp_function() is not None


def _check_rows(logits: torch.Tensor, **vectors: torch.Tensor) -> torch.Tensor:
    """`logits` laid out for the kernels (rows in place, copied otherwise); ValueError on tensors
    they would misread."""
    shape = logits.shape
    if len(shape) != 2 or logits.dtype != torch.float32 or not logits.is_cpu or shape[1] == 0:
        raise ValueError(
            f"logits must be a float32 CPU matrix with columns, got {logits.dtype} {tuple(shape)}"
        )
    for name, t in vectors.items():
        if t.shape != (shape[0],) or t.dtype != torch.float32 or not t.is_cpu or not t.is_contiguous():
            raise ValueError(
                f"{name} must be [{shape[0]}] float32 on the CPU, got {t.dtype} {tuple(t.shape)}"
            )
    if logits.stride(1) != 1 or logits.stride(0) < shape[1]:
        logits = logits.contiguous()
    return logits


def sample_rows(
    logits: torch.Tensor,  # [rows, vocab] float32 CPU
    temperature: torch.Tensor,  # [rows] float32, > 0
    uniform: torch.Tensor,  # [rows] float32 in [0, 1)
    floor: torch.Tensor | None = None,  # [rows] float32: logits below it have no chance
) -> torch.Tensor:  # [rows] int64
    """One token per row (see the module docstring); `floor` is each row's smallest kept logit
    (engine/sampling/sampling_filters.py `filter_floors`, on logits already divided by the temperature).
    ValueError on tensors the kernel would misread; rows not laid out in place are copied first."""
    fn = _function()
    if fn is None:
        raise RuntimeError("the C sampling kernel is not available (weir.kernels.native.build)")
    vectors = {"temperature": temperature.contiguous(), "uniform": uniform.contiguous()}
    if floor is not None:
        vectors["floor"] = floor.contiguous()
    logits = _check_rows(logits, **vectors)
    rows, cols = logits.shape
    out = torch.empty(rows, dtype=torch.int64)
    scratch = torch.empty(cols + (cols + BLOCK - 1) // BLOCK, dtype=torch.float32)
    status = fn(
        logits.data_ptr(),
        vectors["temperature"].data_ptr(),
        vectors["uniform"].data_ptr(),
        vectors["floor"].data_ptr() if floor is not None else None,
        out.data_ptr(),
        scratch.data_ptr(),
        rows,
        cols,
        logits.stride(0),
    )
    if rows and status != 0:
        raise ValueError("the C kernel refused these sizes")
    return out


def logsumexp_rows(logits: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:  # [rows] float32
    """log(sum(exp(x))) of each row over its values at or above `floor` ([rows]; -inf: the whole
    row), -inf where none is: `logits.masked_fill(logits < floor[:, None], -inf).logsumexp(-1)`
    up to rounding, in one pass over the row instead of torch's five."""
    fn = _logsumexp_function()
    if fn is None:
        raise RuntimeError("the C sampling kernel is not available (weir.kernels.native.build)")
    floor = floor.contiguous()
    logits = _check_rows(logits, floor=floor)
    rows, cols = logits.shape
    out = torch.empty(rows, dtype=torch.float32)
    scratch = torch.empty(BLOCK, dtype=torch.float32)
    status = fn(
        logits.data_ptr(), floor.data_ptr(), out.data_ptr(), scratch.data_ptr(), rows, cols, logits.stride(0)
    )
    if rows and status != 0:
        raise ValueError("the C kernel refused these sizes")
    return out
