"""weir_bench.experiments.process_cpu: the CPU a process tree used, sampled from /proc."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from weir_bench.experiments.process_cpu import TreeCPU, tree_cpu_s

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads Linux's /proc")


def test_a_tree_sums_its_descendants_and_nothing_else() -> None:
    stats = {1: (0, 5.0), 10: (1, 1.0), 11: (10, 2.0), 12: (11, 0.5), 20: (1, 7.0)}
    assert tree_cpu_s(10, stats) == pytest.approx(3.5)
    assert tree_cpu_s(20, stats) == pytest.approx(7.0)
    assert tree_cpu_s(99, stats) == 0.0


def test_a_busy_child_is_counted_and_an_idle_one_is_not() -> None:
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(30)"
    busy = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}])"]
    )
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        cpu = TreeCPU({"busy": busy.pid, "idle": idle.pid}, interval_s=0.05).start()
        t0 = time.time()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # until the grandchild has spun its 0.6 s
            time.sleep(0.1)
            used = cpu.used_s("busy", t0 - 1, time.time())
            if used is not None and used >= 0.6:
                break
        cpu.stop()
        busy_s = cpu.used_s("busy", t0 - 1, time.time() + 1)
        idle_s = cpu.used_s("idle", t0 - 1, time.time() + 1)
        assert busy_s is not None and idle_s is not None
        assert busy_s >= 0.5  # the grandchild's spin, through the tree
        assert idle_s < 0.3  # an interpreter's start-up at most
        assert cpu.used_s("busy", t0 + 1000, t0 + 1001) is None  # no samples there
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()
