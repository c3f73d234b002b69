"""tinyllm.distributed: each tests/distributed/test_*.py file run on 2 ranks under mpirun (one test per file, which
fails with both ranks' output), and the single-process behaviour: importing tinyllm without mpi4py, and the errors
of init_process_group and of the collectives outside a process group.

Without mpirun or mpi4py the 2-rank tests are skipped with the reason; in CI (env CI set, not 0/false) that is a
failure: .ci/run installs both (openmpi-bin libopenmpi-dev, pip install -e '.[mpi]')."""
import glob
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import tinyllm as tl
from helpers import in_ci, mpi_missing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "tests", "distributed", "test_*.py")))
RANKS = 2
TIMEOUT = 240  # seconds for one file on both ranks; each test also ends its rank after 120 s (distributed/conftest.py)
LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE")

# Each rank's output goes to its own file (mpirun would interleave the two ranks' lines): this runs on every rank,
# points stdout and stderr at <dir>/rank<N>.log and becomes the command that follows.
RANK_LOG = textwrap.dedent("""
    import os, sys
    rank = next((os.environ[v] for v in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK") if v in os.environ), "x")
    fd = os.open(os.path.join(sys.argv[1], "rank%s.log" % rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.execv(sys.executable, [sys.executable] + sys.argv[2:])
""")


def hypothesis_profile(config):
    """The profile this session runs with (--hypothesis-profile or HYPOTHESIS_PROFILE), for the ranks."""
    from hypothesis import settings
    return config.getoption("hypothesis_profile", None) or getattr(settings, "_current_profile", None) or "default"


def end(proc):
    """Stop mpirun and its ranks: SIGTERM lets mpirun end the job it started, SIGKILL the group if it does not."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _runs_on_wgsl(name):
    """Whether a file's tests run on the WGSL runtime too (each_runtime's parametrizations, or a wgsl mark)."""
    with open(os.path.join(ROOT, "tests", "distributed", name), encoding="utf-8") as f:
        text = f.read()
    return "each_runtime" in text or "mark.wgsl" in text


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.wgsl) if _runs_on_wgsl(n) else n for n in FILES])
def test_on_two_ranks(name, tmp_path, request):
    """Runs one file on 2 ranks; a -m expression of this session selects the tests inside as well (`-m wgsl`: the
    file's WGSL parametrizations)."""
    reason = mpi_missing()
    if reason:
        if in_ci():
            pytest.fail(f"CI: the distributed tests must run: {reason}")
        pytest.skip(reason)
    profile = hypothesis_profile(request.config)
    env = dict(os.environ, TINYLLM_THREADS="1", OMP_NUM_THREADS="1", HYPOTHESIS_PROFILE=profile,
               PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    for v in LAUNCHER_VARS:  # an outer MPI job's variables would confuse the inner one
        env.pop(v, None)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", str(RANKS),
           sys.executable, "-c", RANK_LOG, str(tmp_path),
           "-m", "pytest", "-q", "-p", "no:cacheprovider", "--capture=sys", f"--hypothesis-profile={profile}",
           os.path.join("tests", "distributed", name)]
    # always a -m, replacing pytest.ini's "not slow" inside (the files' own tests carry no slow mark); a selection
    # by that mark alone is this test's, not theirs
    markexpr = request.config.getoption("markexpr")
    cmd[-1:-1] = ["-m", "" if markexpr in ("slow", "not slow") else markexpr]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        launcher, _ = proc.communicate(timeout=TIMEOUT)
        outcome = f"exit code {proc.returncode}"
    except subprocess.TimeoutExpired:
        end(proc)
        launcher, _ = proc.communicate()
        outcome = f"no exit within {TIMEOUT} s (a hang? a test that timed out printed its stacks below)"
    if outcome != "exit code 0":
        logs = []
        for r in range(RANKS):
            path = tmp_path / f"rank{r}.log"
            text = path.read_text(errors="replace") if path.exists() else "(no output)"
            logs.append(f"----- rank {r} -----\n{text}")
        pytest.fail(f"mpirun -n {RANKS} pytest tests/distributed/{name}: {outcome}\n"
                    f"{' '.join(cmd[:6])} ... {' '.join(cmd[-6:])}\n" + "\n".join(logs) +
                    f"\n----- mpirun -----\n{launcher}", pytrace=False)


def run_python(code, **env):
    """Run `code` in a fresh interpreter outside any MPI job; the CompletedProcess."""
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
                    **env)
    for v in LAUNCHER_VARS:
        full_env.pop(v, None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_import_without_mpi4py():
    """tinyllm imports without mpi4py; init_process_group then names the package and the extra to install."""
    result = run_python("""
        import sys
        sys.modules["mpi4py"] = None  # what an environment without the package gives: ImportError on import
        import tinyllm, tinyllm.distributed as dist
        x = tinyllm.ones(3) * 2
        assert x.numpy().tolist() == [2.0, 2.0, 2.0]
        assert not dist.is_available() and not dist.is_initialized()
        try:
            dist.init_process_group("mpi")
        except ImportError as e:
            print(e)
        else:
            raise SystemExit("init_process_group ran without mpi4py")
    """)
    assert result.returncode == 0, result.stderr
    message = result.stdout
    assert "mpi4py" in message and "pip install -e '.[mpi]'" in message and "mpirun" in message, message


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py not installed: pip install -e '.[mpi]'")
def test_init_outside_mpirun():
    """Outside an MPI launcher init_process_group says to start the script with mpirun."""
    result = run_python("""
        import tinyllm.distributed as dist
        try:
            dist.init_process_group("mpi")
        except RuntimeError as e:
            print(e)
        else:
            raise SystemExit("init_process_group ran outside mpirun")
        assert not dist.is_initialized()
    """)
    assert result.returncode == 0, result.stderr
    assert "mpirun -n" in result.stdout, result.stdout


def test_collectives_before_init():
    """Every collective, in place or functional, and the rank queries refuse to run before init_process_group."""
    import tinyllm.distributed as dist
    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    x = tl.ones(4)
    calls = {
        "all_reduce": lambda: dist.all_reduce(x),
        "all_reduce async": lambda: dist.all_reduce(x, async_op=True),
        "broadcast": lambda: dist.broadcast(x, 0),
        "all_gather": lambda: dist.all_gather([tl.zeros(4), tl.zeros(4)], x),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(tl.zeros(8), x),
        "reduce_scatter": lambda: dist.reduce_scatter(tl.zeros(4), [x, x]),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(tl.zeros(2), x),
        "functional.all_reduce": lambda: dist.functional.all_reduce(x),
        "functional.replicate": lambda: dist.functional.replicate(x),
        "functional.broadcast": lambda: dist.functional.broadcast(x, 0),
        "functional.all_gather": lambda: dist.functional.all_gather(x),
        "functional.reduce_scatter": lambda: dist.functional.reduce_scatter(x),
        "get_rank": dist.get_rank,
        "get_world_size": dist.get_world_size,
        "barrier": dist.barrier,
        "destroy_process_group": dist.destroy_process_group,
    }
    for what, call in calls.items():
        with pytest.raises(RuntimeError, match="not initialized") as info:
            call()
        if what != "destroy_process_group":
            assert "init_process_group" in str(info.value), (what, str(info.value))
    assert x.numpy().tolist() == [1.0] * 4


@pytest.mark.parametrize("backend", ["nccl", "gloo", None])
def test_init_refuses_other_backends(backend):
    import tinyllm.distributed as dist
    with pytest.raises(ValueError, match="backend='mpi'"):
        dist.init_process_group(backend=backend)
    assert not dist.is_initialized()


def test_init_refuses_rank_and_world_size():
    """With MPI the launcher says the rank and the world size: torch's arguments for them are refused."""
    import tinyllm.distributed as dist
    with pytest.raises(TypeError, match="mpirun -n"):
        dist.init_process_group("mpi", rank=0, world_size=2)
    assert not dist.is_initialized()
