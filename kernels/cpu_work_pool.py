"""The threads the CPU C kernels run on: OpenMP, following torch, or the helper threads of
`native/work_pool.c`, on a count set for the calling thread.

By default a kernel splits its work over `torch.get_num_threads()` threads of an OpenMP team, as
torch's own ops do. An OpenMP region ends in a barrier every thread of the team must reach, and
its threads spin for milliseconds after it: on a small host where the event loop, the tokenizer
workers or a client share the cores, a decode step (~150 regions) waits for whichever thread lost
its core, and the spinning takes the core the front end needs. `set_pool_threads(n)` moves this
thread's kernel calls onto the work pool: the caller and up to n - 1 helpers take chunks as each
comes free, the caller never waits for a helper that has not started, and idle helpers yield
their core, then sleep. `engine/runner/step_threads.py` sets it for decode steps whose linears are all
C kernels, with torch itself on one thread, so that no OpenMP team runs in those steps at all.

The pool is one shared library for the process; each kernel library is handed its entry point
(`weir_<kernel>_set_pool`) when it loads (`connect`). Where the pool cannot be built, `available()`
is False and the kernels stay on OpenMP.
"""

from __future__ import annotations

import ctypes
import functools
import threading

import torch

from weir.kernels.native import build

_local = threading.local()


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The pool's library, loaded once: every kernel is handed this one (and its helpers)."""
    return build.load("work_pool")


def available() -> bool:
    """Whether the pool is built (or can be: the first call compiles it)."""
    return _library() is not None


def connect(kernel: str) -> None:
    """Hand the pool's entry point to the compiled `<kernel>.c` through its
    `weir_<kernel>_set_pool`; nothing where the pool or that library is unavailable."""
    lib = _library()
    set_pool = build.function(kernel, f"weir_{kernel}_set_pool", [ctypes.c_void_p])
    if lib is not None and set_pool is not None:
        set_pool(ctypes.cast(lib.weir_pool_run, ctypes.c_void_p).value)


def set_pool_threads(threads: int) -> None:
    """On the calling thread: the C kernels run on `threads` threads of the pool (the caller and
    threads - 1 helpers; 1: the caller alone), or with 0 on torch's OpenMP threads again. A count
    > 1 without a pool falls back to OpenMP on that many threads."""
    if threads < 0:
        raise ValueError(f"threads must be >= 0, got {threads}")
    _local.threads = threads


def pool_threads() -> int:
    """The calling thread's pool count (0: the kernels follow torch on OpenMP)."""
    return getattr(_local, "threads", 0)


def kernel_threads() -> tuple[int, bool]:
    """(threads, whether on the pool) for a kernel call on the calling thread."""
    threads = getattr(_local, "threads", 0)
    if threads:
        return threads, True
    return torch.get_num_threads(), False


def num_helpers() -> int:
    """Helper threads the pool has started in this process (0 without a pool)."""
    lib = _library()
    if lib is None:
        return 0
    count = lib.weir_pool_num_helpers
    count.restype = ctypes.c_int
    return int(count())
