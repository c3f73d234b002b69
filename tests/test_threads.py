"""The C runtime's automatic thread count (runtime_c/threads.c): the cores the process may use (affinity, cgroup
quota) less those other processes keep busy, so that a busy machine does not leave a worker thread sharing a core
with someone else's loop. Results do not depend on the count: tests/test_c_runtime.py runs the same kernels on 1
and 2 threads and compares bits."""
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
lib = pytest.importorskip("tinyllm._kernels", reason="the prebuilt C module is not built").lib


@pytest.mark.parametrize("limit, others, expected", [
    (2, 0.0, 2), (2, 0.25, 2), (2, 0.35, 1), (2, 1.0, 1), (2, 2.0, 1), (2, 5.0, 1),
    (1, 0.0, 1), (16, 3.0, 13), (16, 3.4, 12), (16, -1.0, 16),  # -1: not measured yet
])
def test_choose_leaves_the_busy_cores(limit, others, expected):
    assert lib.tl_threads_choose(limit, others) == expected


@pytest.mark.parametrize("files, cpus", [
    ({"cpu.max": "max 100000\n"}, 0),
    ({"cpu.max": "150000 100000\n"}, 2),
    ({"cpu.max": "100000 100000\n"}, 1),
    ({"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"}, 0),
    ({"cpu.cfs_quota_us": "250000\n", "cpu.cfs_period_us": "100000\n"}, 3),
    ({}, 0),
])
def test_cgroup_quota(tmp_path, files, cpus):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert lib.tl_threads_cgroup_cpus(str(tmp_path).encode()) == cpus


CHILD = """
import subprocess, sys, time
from tinyllm._kernels import lib
limit = lib.tl_threads_limit()
loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(1, limit - 1))]
try:
    end = time.monotonic() + 1.5
    while time.monotonic() < end:  # several measurements: the count follows the last one
        n = lib.tl_get_num_threads()
        time.sleep(0.02)
    print(limit, n, lib.tl_threads_others_busy(), lib.tl_threads_automatic())
finally:
    for p in loops:
        p.kill()
"""


def run(code, **env):
    environ = {k: v for k, v in os.environ.items() if k != "TINYLLM_THREADS"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                          env={**environ, "PYTHONPATH": ROOT, **env}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="the measurement reads Linux's /proc/stat")
def test_busy_cores_are_left_alone():
    """All but one core busy with loops of other processes: the automatic count drops to one thread."""
    limit, n, others, automatic = run(CHILD)
    assert automatic == "1"
    if int(limit) > 1:
        assert int(n) == 1, f"{limit} cores, {float(others):.2f} of them busy elsewhere, yet {n} threads"
        assert float(others) >= int(limit) - 1 - 0.3, f"{int(limit) - 1} busy loops measured as {others} cores"


def test_pinned_threads_count_every_core_of_the_process():
    """OMP_PROC_BIND=true: libgomp binds the main thread to one core when it loads; the limit is still every core
    the process may run on (OpenMP's places), so the automatic count uses them."""
    cores = len(os.sched_getaffinity(0))
    code = "from tinyllm._kernels import lib; print(lib.tl_threads_limit(), lib.tl_get_num_threads())"
    limit, n = run(code, OMP_PROC_BIND="true")
    assert int(limit) == min(cores, int(run(code)[0])), f"{cores} cores, pinned threads counted {limit}"


def test_a_fixed_count_stays():
    limit, n, others, automatic = run(CHILD, TINYLLM_THREADS="3")
    assert (n, automatic) == ("3", "0")
