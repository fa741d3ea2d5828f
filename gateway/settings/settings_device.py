"""The settings of how the engine runs on its device: the attention and CUDA-graph paths, and on a
CPU the cores, the thread counts and the C row kernels."""

from __future__ import annotations

from pydantic.dataclasses import dataclass

from weir.engine.config import WIDE_STEP_ROWS
from weir.gateway.settings.setting_field import setting
from weir.gateway.settings.settings_enums import AttentionBackend, CpuRowWeightsMode, CudaGraphsMode


@dataclass(frozen=True)
class DeviceFields:
    """The device: kernel paths on an accelerator, threads and C kernels on a CPU"""

    attention_backend: AttentionBackend = setting(
        AttentionBackend.AUTO,
        "attention kernels: auto = triton on CUDA, torch elsewhere; triton needs CUDA",
        doc="`auto`: Triton kernels on CUDA, torch elsewhere; `torch` is the fallback; `triton` without "
        "CUDA stops start-up",
    )
    cuda_graphs: CudaGraphsMode = setting(
        CudaGraphsMode.AUTO,
        "replay decode steps as CUDA graphs: auto = on CUDA with triton; on needs both",
        doc="replay decode steps as CUDA graphs: `auto` on CUDA with Triton; `off` is the fallback; `on` "
        "without CUDA, or with `torch`, stops start-up",
    )
    cpu_row_weights: CpuRowWeightsMode = setting(
        CpuRowWeightsMode.AUTO,
        "a second copy of every linear weight for decode steps of few rows (twice the linear weights' "
        "memory): auto = on CPU in float32 where a start-up measurement finds it faster; on (one-row "
        "steps) needs that",
        doc="a second copy of every linear weight (the LM head's included) for decode steps of up to 16 "
        "rows: the weight packed in column panels, multiplied by a C kernel built at start-up with the "
        "machine's `cc` (the transposed weight for MKL, one-row steps only, where no compiler is found); "
        "faster than the packed weight on some CPUs and not on others (docs/benchmarks-history.md); twice "
        "the linear weights' memory, counted in the memory budget. `auto`: on CPU in float32 where "
        "products over synthetic weights of the model's layer shapes (256 MiB, ~1.5-2 s at start-up; 1, "
        "2, 4, 8 and 16 rows) take at most 0.9x the packed time at one row, then for every row count up "
        "to the last that is not slower; `off` saves the memory; `on` (one-row steps, not measured) "
        "elsewhere stops start-up",
    )
    # Like vLLM's VLLM_CPU_NUM_OF_RESERVED_CPU. Not used on a GPU.
    cpu_reserved_cores: int = setting(
        1,
        "on a CPU device, cores left to the HTTP loop, tokenizers and the OS; the engine's intra-op "
        "threads are the rest, at least one; 0: every core",
        doc="on a CPU device, cores left to the HTTP loop, the tokenizer threads and the OS: the engine's "
        "intra-op threads are the cores the process may run on (its CPU affinity, e.g. `taskset`, at most "
        "its cgroup CPU quota rounded up: a Kubernetes CPU limit counts) minus these, at least one; `0`: "
        "every core. Replaces `OMP_NUM_THREADS` for the engine "
        "([benchmarks](benchmarks-history.md#threads-in-serving-one-core-left-to-the-front-end))",
        metavar="N",
        ge=0,
    )
    # The engine runs each size of wide step on whichever count it measures faster
    # (engine/runner/step_threads.py).
    cpu_wide_step_threads: int | None = setting(
        None,
        "on a CPU device, the engine's intra-op threads for wide steps (see --cpu-wide-step-rows); "
        "0: the engine's own count",
        doc="on a CPU device, the engine's intra-op threads for wide steps, those that feed "
        "`--cpu-wide-step-rows` or more rows (matrix-matrix work a second core shortens by a quarter to a "
        "half on a quiet host: SmolLM2 on two cores, 8 decode rows 31.6 → 24.3 ms, a 128-token prompt 164 "
        "→ 103-108 ms). The engine measures each size of wide step (4-7 rows, 8-15, ...) on both counts "
        "and runs the faster, one step in 16 on the other: on a host whose cores are shared, or beside a "
        "busy front end, two threads can lose; a change of choice is logged at info. Narrower steps keep "
        "the count above, where a second thread gains nothing and waits at every small op for the core "
        "the HTTP loop holds; `0`: the engine's count for every step ([benchmarks](benchmarks-history.md))",
        default_text="every core",
        metavar="N",
        ge=0,
    )
    cpu_wide_step_rows: int = setting(
        WIDE_STEP_ROWS,
        "a step is wide when it feeds N or more rows, decode rows plus prompt tokens",
        doc="a step is wide when it feeds this many rows or more: one per decoding sequence plus one per "
        "prompt token",
        metavar="N",
        ge=1,
    )
    cpu_kernel_pool: bool = setting(
        True,
        "on a CPU device, wide decode steps of at most 16 rows run their C kernels on the kernels' own "
        "helper threads, torch on one thread, so that no thread waits for one that lost its core to the "
        "HTTP loop; off: on torch's OpenMP threads",
        doc="a wide step of at most 16 rows whose linears and attention are all C kernels (float32 with "
        "the row weights) runs them on the kernels' own helper threads (kernels/cpu_work_pool.py) with "
        "torch on one thread: a helper that lost its core to the HTTP loop is not waited for, and no "
        "OpenMP thread spins on the loop's core; `off`: on torch's OpenMP threads, as before "
        "([benchmarks](benchmarks-history.md))",
    )
    cpu_decode_layers: bool = setting(
        True,
        "on a CPU device in float32, decode steps of at most 16 rows run every layer in one C call, the "
        "GIL released for the step; off: each layer's C kernels called one by one from Python",
        doc="on a CPU device in float32, a decode step of at most 16 rows (the row kernels' reach, as "
        "`--cpu-row-weights` chose) without LoRA runs every layer in one C call "
        "(engine/models/native_decode.py): the same kernels, the same bits, without ~270 Python round "
        "trips a step and with the GIL released for the whole step; `off`: each layer's C kernels called "
        "one by one from Python, as before ([benchmarks](benchmarks-history.md))",
    )
