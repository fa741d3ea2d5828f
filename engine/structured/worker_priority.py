"""Grammar work runs at the lowest CPU priority, so a tenant's costly grammar takes only spare CPU.

Compiling a grammar and filling its token masks run on worker threads (xgrammar releases the GIL),
never on the engine thread or the event loop. That keeps one tenant's grammar from holding the
step, but not from taking a core: on a 2-core host four attackers' nested regexes made a victim's
TTFT p99 10x worse (`python -m weir_bench.experiments.attacker --flood regex`) by competing for
the cores the forward runs on. On Linux each thread has its own nice value, so the workers lower
theirs to 19 when they start: the kernel then gives them only the CPU the engine and the server
leave idle, and a slow grammar makes its own request late (engine/runner/mask_prefetch.py),
not the others'. Elsewhere, or where the call is refused, the workers keep the process's priority.
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger("weir.engine")

LOWEST_NICE = 19


def lower_thread_priority() -> bool:
    """Give the calling thread the lowest CPU priority (nice 19); True if it took effect."""
    setpriority = getattr(os, "setpriority", None)
    if setpriority is None:  # pragma: no cover - not on Linux
        return False
    try:
        # PRIO_PROCESS with a thread id sets that thread's own nice value on Linux.
        setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_NICE)
    except OSError as exc:  # pragma: no cover - a sandbox that refuses it
        logger.warning("grammar workers keep the process's CPU priority: %s", exc)
        return False
    return True


def thread_nice() -> int:
    """The calling thread's nice value."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
