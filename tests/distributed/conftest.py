"""Tests that need several ranks: collected only inside an MPI job, which tests/test_distributed.py starts with
`mpirun -n 2 python -m pytest tests/distributed/<file>`. A plain `pytest` run collects nothing here.

By hand:  TINYLLM_THREADS=1 OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -n 2 \\
              python -m pytest -q -p no:cacheprovider --capture=sys tests/distributed/test_collectives.py

Every rank runs the same tests in the same order and must call the collectives in the same order, so:
  * hypothesis draws the same examples on every rank: the active profile, derandomized and without its example
    database (a failure one rank saved would be replayed there alone, and the ranks' collectives would no longer
    pair up). The ranks shrink a failure alike only if it fails on every rank: gather the verdict to every rank
    and assert there (test_collectives.py's `agree`);
  * a test that hangs (one rank waiting in a collective the other never calls) dumps every thread's stack to the
    process's stderr (--capture=sys keeps it there) and ends its process after TINYLLM_MPI_TEST_TIMEOUT seconds
    (120); mpirun then ends the job.
"""
import faulthandler
import os
import sys

import pytest

_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
UNDER_MPI = any(v in os.environ for v in _LAUNCHER_VARS)

if not UNDER_MPI:
    collect_ignore_glob = ["*"]
else:
    # both ranks share the machine's cores; read by the C runtime when it starts (first use, after this import)
    os.environ.setdefault("TINYLLM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

TEST_TIMEOUT = float(os.environ.get("TINYLLM_MPI_TEST_TIMEOUT", "120"))


@pytest.hookimpl(trylast=True)  # after hypothesis' plugin has loaded the profile named by --hypothesis-profile
def pytest_configure(config):
    if not UNDER_MPI:
        return
    from hypothesis import Phase, settings
    name = settings._current_profile or "default"
    # no shrinking: the ranks would shrink a failure along different paths into different collectives, and hang
    settings.register_profile(f"{name}-mpi", parent=settings.get_profile(name), derandomize=True, database=None,
                              deadline=None, print_blob=False, phases=(Phase.explicit, Phase.generate))
    settings.load_profile(f"{name}-mpi")


@pytest.fixture(scope="session")
def dist():
    """tinyllm.distributed with the process group initialized (once for the whole session, on every rank)."""
    import tinyllm.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("mpi")
    return dist


@pytest.fixture(autouse=True)
def hang_guard(request):
    """Ends this rank (with every thread's stack on stderr) if one test runs past TEST_TIMEOUT seconds."""
    if not UNDER_MPI:
        yield
        return
    # sys.__stderr__: the process's own stderr (with --capture=sys, as the harness runs, pytest leaves it as it is)
    faulthandler.dump_traceback_later(TEST_TIMEOUT, exit=True, file=sys.__stderr__)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
