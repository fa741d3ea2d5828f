"""Every decoder layer of a decode step of a few rows, and the final norm, in one C call (CPU, float32).

Layer by layer, a decode step calls nine C kernels a layer from Python (kernels/cpu_rms_norm.py,
cpu_small_gemm.py, cpu_rope_kv.py, cpu_decode_attention.py, cpu_silu_mul.py), each with its
checks, its output allocation and the GIL taken back after it: ~270 ctypes calls and ~7,000
Python calls a step for a 30-layer model. `DecodeLayers` checks a step's tensors once and hands
the whole run to `native/decode_layers.c`, which calls the same kernels in the same order on the
same arguments: the same bits as the layer-by-layer path (tested), with the GIL released for the
whole step.

Its reach is the kernels': float32, at most `cpu_small_gemm.MAX_ROWS` rows, every linear packed
in panels (`SmallGemm`), one token a row (a decode step), no per-head q/k norm and no LoRA (the
caller, engine/models/native_decode.py, decides which steps it takes). `available()` is False
where any of the kernels cannot be built; callers keep the layer-by-layer path.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from weir.kernels import cpu_decode_attention, cpu_small_gemm, cpu_work_pool
from weir.kernels.cpu_decode_attention import NativePlan
from weir.kernels.cpu_rope_kv import check_step_tables
from weir.kernels.cpu_small_gemm import SmallGemm
from weir.kernels.native import build

_P = ctypes.c_void_p
_I64 = ctypes.c_int64

# (library, symbol) of each kernel the driver calls, in `_Kernels`' field order.
_KERNELS = (
    ("gemm", "small_gemm", "weir_small_gemm"),
    ("add_rms_norm", "rms_norm", "weir_add_rms_norm"),
    ("rope_kv", "rope_kv", "weir_rope_kv_write"),
    ("attention", "decode_attention", "weir_decode_attention"),
    ("silu_mul", "silu_mul", "weir_silu_mul"),
)


class _Kernels(ctypes.Structure):
    _fields_ = [(field, _P) for field, _, _ in _KERNELS]


class _Layer(ctypes.Structure):
    _fields_ = [
        (name, _P)
        for name in (
            "input_norm",
            "qkv",
            "qkv_bias",
            "o",
            "o_bias",
            "post_norm",
            "gate_up",
            "gate_up_bias",
            "down",
            "down_bias",
            "kv_cache",
        )
    ]


class _Shape(ctypes.Structure):
    _fields_ = [
        *[
            (name, _I64)
            for name in (
                "num_layers",
                "hidden",
                "num_heads",
                "kv_heads",
                "head_dim",
                "intermediate",
                "num_blocks",
                "block_size",
            )
        ],
        ("eps", ctypes.c_float),
        ("final_eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("final_norm", _P),
    ]


class _Step(ctypes.Structure):
    _fields_ = [
        ("rows", _I64),
        ("max_blocks", _I64),
        *[(name, _P) for name in ("cos", "sin", "slots", "block_tables", "seq_lens")],
        *[(name, _P) for name in ("residual", "scratch", "out")],
        ("threads", ctypes.c_int),
        ("pool", ctypes.c_int),
    ]


@functools.cache
def _driver() -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr, _Kernels] | None:  # type: ignore[name-defined]
    """(weir_decode_layers, weir_decode_layers_scratch, the kernels' entry points), or None."""
    # The GEMM and the attention connect to the work pool when they load.
    if not (cpu_small_gemm.available() and cpu_decode_attention.available()):
        return None
    run = build.function("decode_layers", "weir_decode_layers", [_P] * 4)
    scratch = build.function("decode_layers", "weir_decode_layers_scratch", [_P, _I64])
    if run is None or scratch is None:
        return None
    scratch.restype = _I64
    addresses = [build.address(library, symbol) for _, library, symbol in _KERNELS]
    if any(a is None for a in addresses):
        return None
    return run, scratch, _Kernels(*addresses)


def available() -> bool:
    """Whether the driver and every kernel it calls are built (or can be: the first call compiles them)."""
    return _driver() is not None


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer as the kernels read it."""

    input_norm: torch.Tensor  # [hidden] float32, contiguous
    qkv: SmallGemm  # [hidden] -> [(num_heads + 2 kv_heads) head_dim]: q, then k, then v
    o: SmallGemm  # [num_heads head_dim] -> [hidden]
    post_norm: torch.Tensor  # [hidden]
    gate_up: SmallGemm  # [hidden] -> [2 intermediate]: gate, then up
    down: SmallGemm  # [intermediate] -> [hidden]


@dataclass(frozen=True)
class ModelShape:
    """The sizes and constants every layer shares."""

    num_heads: int
    kv_heads: int
    head_dim: int
    eps: float  # every layer's RMSNorm
    final_eps: float
    scale: float  # attention's, usually head_dim ** -0.5


def _vector(name: str, t: torch.Tensor, dim: int) -> torch.Tensor:
    if (
        t.dtype != torch.float32
        or t.device.type != "cpu"
        or tuple(t.shape) != (dim,)
        or not t.is_contiguous()
    ):
        raise ValueError(f"{name} must be a contiguous float32 CPU [{dim}], got {t.dtype} {tuple(t.shape)}")
    return t


def _gemm(name: str, g: SmallGemm, in_features: int, out_features: int) -> SmallGemm:
    if (g.in_features, g.out_features) != (in_features, out_features):
        raise ValueError(
            f"{name} is {g.in_features} -> {g.out_features}, expected {in_features} -> {out_features}"
        )
    return g


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class DecodeLayers:
    """A model's decoder layers and final norm, checked and laid out for the C driver once.

    The weights' tensors are referenced, not copied: they must outlive this object (the model
    owns both)."""

    def __init__(self, layers: Sequence[LayerWeights], final_norm: torch.Tensor, shape: ModelShape):
        driver = _driver()
        if driver is None:
            raise RuntimeError("the C decode-layers driver or one of its kernels is not available")
        if not layers:
            raise ValueError("a model needs at least one layer")
        if (
            shape.kv_heads < 1
            or shape.num_heads % shape.kv_heads
            or shape.num_heads > cpu_decode_attention.MAX_HEADS
        ):
            raise ValueError(
                f"{shape.num_heads} heads over {shape.kv_heads} KV heads: outside the attention kernel"
            )
        if shape.head_dim < 2 or shape.head_dim % 2:
            raise ValueError(f"head_dim must be even, got {shape.head_dim}")
        self._run, self._scratch_fn, self._kernels = driver
        hidden = layers[0].qkv.in_features
        q_size, kv_size = shape.num_heads * shape.head_dim, shape.kv_heads * shape.head_dim
        intermediate = layers[0].down.in_features
        self.hidden, self.num_layers = hidden, len(layers)
        self._kv_heads, self._head_dim = shape.kv_heads, shape.head_dim
        self._layers = (_Layer * len(layers))()
        for i, w in enumerate(layers):
            gemms = (
                _gemm(f"layer {i} qkv", w.qkv, hidden, q_size + 2 * kv_size),
                _gemm(f"layer {i} o", w.o, q_size, hidden),
                _gemm(f"layer {i} gate_up", w.gate_up, hidden, 2 * intermediate),
                _gemm(f"layer {i} down", w.down, intermediate, hidden),
            )
            qkv, o, gate_up, down = ((g.panels.data_ptr(), _ptr(g.bias)) for g in gemms)
            self._layers[i] = _Layer(
                _vector(f"layer {i} input_norm", w.input_norm, hidden).data_ptr(),
                *qkv,
                *o,
                _vector(f"layer {i} post_norm", w.post_norm, hidden).data_ptr(),
                *gate_up,
                *down,
                None,
            )
        self._keep = (tuple(layers), final_norm)  # the tensors the structures point into
        self._shape = _Shape(
            len(layers),
            hidden,
            shape.num_heads,
            shape.kv_heads,
            shape.head_dim,
            intermediate,
            0,
            0,
            shape.eps,
            shape.final_eps,
            shape.scale,
            _vector("final_norm", final_norm, hidden).data_ptr(),
        )
        self._kv_caches: tuple[
            torch.Tensor, ...
        ] = ()  # the caches the layers point at (checked when they change)

    def _bind_caches(self, kv_caches: Sequence[torch.Tensor]) -> None:
        """Point each layer at its cache; ValueError on caches the kernels would misread."""
        bound = self._kv_caches
        if len(kv_caches) == len(bound) and all(a is b for a, b in zip(kv_caches, bound, strict=True)):
            return  # the same tensor objects (held here, so no other can take their place)
        if len(kv_caches) != self.num_layers:
            raise ValueError(f"{len(kv_caches)} caches for {self.num_layers} layers")
        first = tuple(kv_caches[0].shape)
        for t in kv_caches:
            if (
                t.dtype != torch.float32
                or t.device.type != "cpu"
                or not t.is_contiguous()
                or tuple(t.shape) != first
                or len(first) != 5
                or first[0] != 2
                or first[3:] != (self._kv_heads, self._head_dim)
                or first[2] > cpu_decode_attention.MAX_BLOCK
            ):
                raise ValueError(
                    f"every cache must be a contiguous float32 CPU [2, blocks, block_size <= "
                    f"{cpu_decode_attention.MAX_BLOCK}, {self._kv_heads}, {self._head_dim}] of one shape, got "
                    f"{t.dtype} {tuple(t.shape)}"
                )
        for layer, cache in zip(self._layers, kv_caches, strict=True):
            layer.kv_cache = cache.data_ptr()
        self._shape.num_blocks, self._shape.block_size = first[1], first[2]
        self._kv_caches = tuple(kv_caches)

    def __call__(
        self,
        embeddings: torch.Tensor,  # [rows, hidden] float32, contiguous: the residual stream, updated in place
        cos: torch.Tensor,  # [rows, head_dim // 2] (or [rows, 1, head_dim // 2]) float32, contiguous
        sin: torch.Tensor,  # as cos
        slot_mapping: torch.Tensor,  # [rows] int64: each row's K/V slot
        plan: NativePlan,  # the rows' block tables and context lengths (cpu_decode_attention.plan)
        kv_caches: Sequence[torch.Tensor],  # per layer [2, num_blocks, block_size, kv_heads, head_dim]
    ) -> torch.Tensor:  # [rows, hidden]: the final norm's output
        """Run every layer on a decode step's rows (one token each), storing each layer's K/V.
        ValueError, with nothing written, on tensors the kernels would misread."""
        rows = embeddings.shape[0] if embeddings.dim() == 2 else 0
        if (
            embeddings.dtype != torch.float32
            or embeddings.device.type != "cpu"
            or not 1 <= rows <= cpu_small_gemm.MAX_ROWS
            or embeddings.shape[1] != self.hidden
            or not embeddings.is_contiguous()
        ):
            raise ValueError(
                f"embeddings must be a contiguous float32 CPU [1..{cpu_small_gemm.MAX_ROWS}, {self.hidden}], got "
                f"{embeddings.dtype} {tuple(embeddings.shape)}"
            )
        check_step_tables(cos, sin, slot_mapping, rows, self._head_dim // 2)
        self._bind_caches(kv_caches)
        if plan.seq_lens.shape[0] != rows or plan.max_block_id >= self._shape.num_blocks:
            raise ValueError(
                f"a plan of {plan.seq_lens.shape[0]} rows reading block {plan.max_block_id} for {rows} rows "
                f"and caches of {self._shape.num_blocks} blocks"
            )
        scratch = torch.empty(int(self._scratch_fn(ctypes.byref(self._shape), rows)), dtype=torch.float32)
        out = torch.empty_like(embeddings)
        threads, pool = cpu_work_pool.kernel_threads()
        step = _Step(
            rows,
            plan.block_tables.shape[1],
            cos.data_ptr(),
            sin.data_ptr(),
            slot_mapping.data_ptr(),
            plan.block_tables.data_ptr(),
            plan.seq_lens.data_ptr(),
            embeddings.data_ptr(),
            scratch.data_ptr(),
            out.data_ptr(),
            threads,
            int(pool),
        )
        status = self._run(
            ctypes.byref(self._kernels), ctypes.byref(self._shape), self._layers, ctypes.byref(step)
        )
        if status != 0:  # only a slot outside the caches gets past the checks above: refused before any write
            raise ValueError(
                f"the C decode layers refused this step (status {status}): a slot outside the caches?"
            )
        return out
