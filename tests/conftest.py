"""Test setup: hypothesis profiles and the import path for tests/helpers.py.

Profiles (pick with HYPOTHESIS_PROFILE=ci):
  default  few examples, random each run: quick local feedback
  ci       more examples, derandomized so a CI failure reproduces exactly
"""
import os
import sys

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile("default", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=50, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


RUNTIMES = ["numpy", "c"]


@pytest.fixture(scope="module", params=RUNTIMES)
def each_runtime(request):
    """Runs a whole test module once per runtime: `pytestmark = pytest.mark.usefixtures("each_runtime")`.
    Module scope keeps it compatible with hypothesis, and lets each runtime reuse its compiled kernels."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TINYLLM_RUNTIME", request.param)
        yield request.param


@pytest.fixture(scope="session", autouse=True)
def runtimes_really_built():
    """In CI a runtime that could not be built is a failure, not a quiet fallback to NumPy."""
    if os.environ.get("CI"):
        import importlib.util
        from tinyllm.runtime import compiler
        assert importlib.util.find_spec("tinyllm._kernels") is not None, \
            "tinyllm._kernels was not built: `pip install -e .` needs a C compiler (apt-get install gcc)"
        assert compiler.compiler() is not None, "no C compiler for generated kernels (apt-get install gcc)"
    yield


@pytest.fixture
def c_schedules(monkeypatch):
    """Every Schedule the C runtime executes in the test, in order."""
    from tinyllm.runtime.c_runtime import CRuntime
    seen = []
    original = CRuntime.execute

    def spy(self, schedule, feeds=()):
        seen.append(schedule)
        return original(self, schedule, feeds)
    monkeypatch.setattr(CRuntime, "execute", spy)
    return seen
