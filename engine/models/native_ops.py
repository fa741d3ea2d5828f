"""Which of a layer's small ops run as C kernels on the CPU float32 path, and the switch for each.

Between the linears a decode layer runs a handful of small ops; on a decode row each torch op is
a dispatch of a few microseconds, so their count, not their arithmetic, is what they cost. Three
have C kernels (kernels/native/, one ctypes call each, built with the machine's `cc`):

- the residual add and the RMSNorm after it, twice a layer (`norms`, kernels/cpu_rms_norm.py;
  rounding differs from the torch form);
- RoPE on q and k and the step's K/V stored in the paged cache (`rope_kv`, kernels/cpu_rope_kv.py;
  the same bits as the torch form): a slice, four multiplies, a subtract, an add, a `cat`, a
  split, a copy of v and two `index_copy_` in torch;
- silu(gate) * up (`silu_mul`, kernels/cpu_silu_mul.py; rounding differs): a split, a silu on a
  strided half and a multiply in torch.

A fourth switch, `decode_layers`, runs a whole decode step's layers, these ops and the linears'
and attention's C kernels, in one C call (engine/models/native_decode.py): on only once the linears
are packed with their C kernels (`LlamaForCausalLM.pack_linear_weights`), and used only while the
other three are on.

`NativeOps` is one object shared by the model and every layer, so one assignment switches an op
for the whole model (the A/B in bench/experiments/decode_roofline.py; the model keeps what was
built, `native_ops_built`, to switch back to). Each switch starts on where its kernel builds on
a float32 CPU model, and stays off elsewhere (CUDA, other dtypes, no compiler): a missing
compiler costs speed, never a request. docs/decisions.md has the numbers
each op was chosen by.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class NativeOps:
    """The C small ops in use (each False: the torch form)."""

    norms: bool = False
    rope_kv: bool = False
    silu_mul: bool = False
    decode_layers: bool = False  # set where the model builds it (engine/models/native_decode.py)

    @classmethod
    def for_model(cls, device: torch.device, dtype: torch.dtype) -> NativeOps:
        """Every op whose kernel builds, on a float32 CPU model; none elsewhere."""
        if device.type != "cpu" or dtype != torch.float32:
            return cls()
        from weir.kernels import cpu_rms_norm, cpu_rope_kv, cpu_silu_mul

        return cls(
            norms=cpu_rms_norm.available(),
            rope_kv=cpu_rope_kv.available(),
            silu_mul=cpu_silu_mul.available(),
        )
