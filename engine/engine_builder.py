"""Building an engine from its config: load the model and tokenizer, size the KV pool, build the
tiers, CUDA graphs, LoRA slots, intra-op threads and drafter around them, and hand all of it to
`LLMEngine` (weir.engine.llm_engine). Also the CPU fast-path choices made at load: packed linears
and their row copies."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from weir.engine.config import EngineConfig
from weir.engine.faults import FaultInjector
from weir.engine.kv.host_kv_tensors import build_host_kv
from weir.engine.llm_engine import LLMEngine
from weir.engine.lora.lora_manager import LoraManager
from weir.engine.runner.runner import ModelRunner
from weir.engine.runner.step_threads import StepThreads

logger = logging.getLogger("weir.engine")


def build_engine(
    config: EngineConfig,
    clock: Callable[[], float] = time.monotonic,
    faults: FaultInjector | None = None,
) -> LLMEngine:
    """Load the model and tokenizer, size the KV pool, and assemble an engine.

    `faults` is for tests only (see `weir.engine.faults`); nothing in production passes one.
    """
    from transformers import AutoTokenizer

    from weir.engine.kv.kv_tensors import allocate_kv_caches, kv_block_bytes, num_blocks_for
    from weir.engine.runner.loader import load_model

    dtype = getattr(torch, config.dtype)
    device = torch.device(config.device)
    attn = _attention_backend(config, device)
    row_inputs = row_weight_inputs(config)
    model, model_config = load_model(
        config.model_path,
        dtype=dtype,
        device=device,
        attn_backend=attn,
        pack_linear=_pack_linear(config),
        row_inputs=row_inputs,
    )
    native_ops = getattr(model, "native_ops", None)
    if native_ops is not None and not config.cpu_decode_layers:
        native_ops.decode_layers = False  # each layer's C kernels one by one (engine/models/native_decode.py)
    tokenizer = AutoTokenizer.from_pretrained(
        config.tokenizer_path or config.model_path, local_files_only=True
    )
    kv_dtype = getattr(torch, config.cache.kv_dtype)
    num_blocks = num_blocks_for(config.cache, model_config, kv_dtype, device)
    kv_caches = allocate_kv_caches(model_config, num_blocks, config.cache.block_size, kv_dtype, device)
    host_kv = build_host_kv(config, model_config, kv_caches, kv_dtype, device)  # None: no host tier
    store_client = None
    store_io = None
    if config.kv_store is not None:
        from weir.engine.kv.store.client import KVStoreClient
        from weir.engine.kv.store.tensors import StoreBlockIO

        block_bytes = kv_block_bytes(model_config, config.cache.block_size, kv_dtype)
        store_client = KVStoreClient(config.kv_store, block_bytes)
        store_client.set_scope_share(config.cache.tenant_cache_share)
        store_io = StoreBlockIO(kv_caches, device, store_client.write)
        logger.info(
            "KV store tier: %s namespace %r, %.1f KiB per block, %d blocks per scope at most",
            config.kv_store.url,
            config.kv_store.namespace,
            store_client.value_bytes / 1024,
            store_client.max_entries_in_scope,
        )
    capacity = (num_blocks - 1) * config.cache.block_size
    per_token = model_config.kv_bytes_per_token(kv_dtype.itemsize)
    logger.info(
        "KV cache: %d blocks of %d tokens = %d tokens capacity (%d bytes per token, %.1f MiB)",
        num_blocks - 1,
        config.cache.block_size,
        capacity,
        per_token,
        capacity * per_token / 2**20,
    )
    from weir.engine.runner.cuda_graphs import build_decode_graphs

    max_len = min(config.scheduler.max_model_len, model_config.max_model_len)
    graphs = build_decode_graphs(config, model, kv_caches, max_len, device)  # None on CPU
    lora = None
    if config.lora.enabled:
        from pathlib import Path

        names = frozenset({str(config.model_path), Path(config.model_path).name, config.model_version})
        lora = LoraManager(config.lora, model, model_config, dtype, device, base_models=names)
        logger.info(
            "LoRA: %d slots of rank <= %d (%.1f MiB)",
            config.lora.num_slots,
            config.lora.max_rank,
            lora.slot_bytes / 2**20,
        )
    threads = None
    if device.type == "cpu" and config.cpu_wide_step_threads is not None:
        # Steps within the C row kernels' reach run their linears (and attention) on the kernels'
        # work pool rather than torch's OpenMP team (engine/runner/step_threads.py).
        head = getattr(model, "packed_head", None)
        kernel_rows = head.row_inputs if head is not None and head.row_gemm is not None else 0
        if not config.cpu_kernel_pool:
            kernel_rows = 0
        threads = StepThreads(
            torch.get_num_threads(),
            config.cpu_wide_step_threads,
            config.cpu_wide_step_rows,
            kernel_rows=kernel_rows,
        )
        logger.info(
            "CPU intra-op threads: %d for steps of fewer than %d rows, %d for the others (on the C "
            "kernels' work pool up to %d rows)",
            threads.decode_threads,
            threads.min_rows,
            threads.wide_threads,
            threads.kernel_rows,
        )
    runner = ModelRunner(
        model,
        kv_caches,
        config.cache.block_size,
        device,
        graphs=graphs,
        host_kv=host_kv,
        lora=lora,
        threads=threads,
    )
    runner.store_io = store_io
    from weir.engine.spec_decode.factory import build_drafter

    drafter = build_drafter(config, model_config, tokenizer, runner, num_blocks, attn, _pack_linear(config))
    return LLMEngine(
        config,
        model_config,
        tokenizer,
        runner,
        num_blocks,
        clock=clock,
        faults=faults,
        drafter=drafter,
        cpu_row_inputs=row_inputs,
        store_io=store_client,
    )


def _pack_linear(config: EngineConfig) -> bool:
    """The CPU fast path (pre-packed linear weights): as configured, else wherever it is supported."""
    if config.cpu_packed_linear is not None:
        return config.cpu_packed_linear
    from weir.engine.models.packed_linear import packing_supported

    return packing_supported(getattr(torch, config.dtype), torch.device(config.device))


def row_weight_inputs(config: EngineConfig) -> int:
    """Up to how many input rows the linears take their CPU row copies (engine/models/packed_linear.py),
    0 for none: off or on (one row: batch-1 steps) as configured, else, where the packed path is on
    in float32, as measured on this machine (engine/models/row_weight_probe.py)."""
    if config.cpu_row_weights is not None:
        return 1 if config.cpu_row_weights else 0
    if config.dtype != "float32" or not _pack_linear(config):
        return 0
    from weir.engine.models.row_weight_probe import measured_row_inputs
    from weir.engine.runner.loader import load_model_config

    return measured_row_inputs(load_model_config(config.model_path).layer_linear_shapes())


def uses_row_weights(config: EngineConfig) -> bool:
    """Whether the linears keep their CPU row copies (a second copy of each weight)."""
    return row_weight_inputs(config) > 0


def _attention_backend(config: EngineConfig, device: torch.device):  # type: ignore[no-untyped-def]
    use_triton = config.use_triton if config.use_triton is not None else device.type == "cuda"
    if use_triton:
        from weir.engine.models.attention_triton import TritonAttentionBackend

        return TritonAttentionBackend()
    from weir.engine.models.attention import TorchAttentionBackend

    return TorchAttentionBackend()
