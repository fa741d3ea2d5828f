"""The CPU a process tree uses over a run, sampled from Linux's /proc: how much of the machine the
load generator took while the server served it.

On a two-core host the load generator shares the cores with the server it measures. guidellm's
opening burst (issue 58: eight requests at t = 0, every one of them past the 2 s TTFT target,
llama-server's as well as Weir's) may be the server's doing or the client's own start-up work;
`TreeCPU` tells them apart by the CPU seconds each side used in that window.

A sampler thread reads every process's `stat` every `interval_s` and sums the user and system
time of the root and its descendants (threads are counted in their process). A descendant that
exits between two samples takes its last slice with it: the figures are a lower bound, exact for
long-lived processes (guidellm's workers, a server). Linux only; elsewhere nothing is sampled.
"""

from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stats() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds used: user + system) of every process readable now."""
    out: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        # the name (field 2) may hold spaces and parentheses: split after its closing one
        fields = text[text.rindex(")") + 2 :].split()
        out[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS)
    return out


def tree_cpu_s(root: int, stats: Mapping[int, tuple[int, float]]) -> float:
    """CPU seconds of `root` and every descendant in `stats` (as `_stats` reads them)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0.0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        total += stats[pid][1]
        todo += children.get(pid, [])
    return total


@dataclass
class TreeCPU:
    """Samples of the CPU seconds used by named process trees, against the wall clock
    (`time.time()`, the clock guidellm stamps its requests with)."""

    roots: dict[str, int]
    interval_s: float = 0.25
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> TreeCPU:
        if Path("/proc/self/stat").exists():
            self._thread = threading.Thread(target=self._run, name="tree-cpu", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        if not Path("/proc/self/stat").exists():
            return
        stats = _stats()
        self.samples.append((time.time(), {name: tree_cpu_s(pid, stats) for name, pid in self.roots.items()}))

    def used_s(self, name: str, t0: float, t1: float) -> float | None:
        """CPU seconds tree `name` used between wall times `t0` and `t1` (the samples nearest
        inside them); None without two samples there."""
        times = [t for t, _ in self.samples]
        i, j = bisect_left(times, t0), bisect_left(times, t1) - 1
        if j <= i:
            return None
        return max(0.0, self.samples[j][1][name] - self.samples[i][1][name])
