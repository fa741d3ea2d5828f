"""weir.gateway.server.cpu_cores: the affinity narrowed by a cgroup v2 or v1 CPU quota (a Kubernetes limit)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from weir.gateway.server.cpu_cores import cgroup_cpu_limit, usable_cores


def _affinity() -> int:
    return len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("200000 100000", 2.0),
        ("150000 100000", 1.5),
        ("max 100000", None),
        ("garbage", None),
        ("0 100000", None),
    ],
)
def test_cgroup_v2_cpu_max(tmp_path: Path, content: str, expected: float | None) -> None:
    (tmp_path / "cpu.max").write_text(content + "\n")
    assert cgroup_cpu_limit(tmp_path) == expected


@pytest.mark.parametrize(
    "layout", ["cpu", ""]
)  # v1: under cpu/ (a host's view) or at the root (a container's)
def test_cgroup_v1_cfs_quota(tmp_path: Path, layout: str) -> None:
    folder = tmp_path / layout
    folder.mkdir(exist_ok=True)
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    (folder / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_limit(tmp_path) is None  # -1: no quota
    (folder / "cpu.cfs_quota_us").write_text("250000\n")
    assert cgroup_cpu_limit(tmp_path) == 2.5


def test_no_cgroup_files_is_no_quota(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path) is None
    assert usable_cores(tmp_path) == _affinity()


def test_a_quota_narrows_the_affinity_rounded_up(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a core: still one thread
    assert usable_cores(tmp_path) == 1
    (tmp_path / "cpu.max").write_text(f"{(_affinity() + 8) * 100000} 100000\n")  # above the affinity
    assert usable_cores(tmp_path) == _affinity()
    if _affinity() >= 2:
        (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 cores: two threads
        assert usable_cores(tmp_path) == 2
