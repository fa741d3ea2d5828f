"""How many cores this process may use: its CPU affinity, narrowed by a cgroup CPU quota.

A Kubernetes CPU limit does not narrow the affinity: a pod limited to 2 CPUs on a 64-core node
sees 64 cores in `os.sched_getaffinity` and would run 63 intra-op threads, each throttled by
the quota (the CFS bandwidth control), every op's barrier waiting on the slowest. The quota is in
the cgroup's files: `cpu.max` ("QUOTA PERIOD", or "max PERIOD" for none) under cgroup v2,
`cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1: none) under v1. The limit in cores is
QUOTA / PERIOD, rounded up (a 1.5-CPU limit can keep two threads busy three quarters of the time).

Read from the process's own cgroup as mounted at /sys/fs/cgroup (a container's view); a file
that is missing or unreadable means no quota. No environment variable is read.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> float | None:
    """The cgroup's CPU quota in cores (v2 `cpu.max`, else v1 CFS files), None without one."""
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        fields = v2.split()
        if len(fields) == 2 and fields[0] != "max":
            return _ratio(fields[0], fields[1])
        return None
    quota, period = _read(root / "cpu" / "cpu.cfs_quota_us"), _read(root / "cpu" / "cpu.cfs_period_us")
    if quota is None or period is None:
        quota, period = _read(root / "cpu.cfs_quota_us"), _read(root / "cpu.cfs_period_us")
    if quota is None or period is None:
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def usable_cores(root: Path = CGROUP_ROOT) -> int:
    """The cores this process may run on (its affinity), at most its cgroup's quota rounded up;
    at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    limit = cgroup_cpu_limit(root)
    if limit is not None:
        cores = min(cores, math.ceil(limit))
    return max(1, cores)
