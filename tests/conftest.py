"""Test setup: hypothesis profiles and the import path for tests/helpers.py.

Profiles (pick with HYPOTHESIS_PROFILE=ci):
  default  few examples, random each run: quick local feedback
  ci       20 examples, derandomized so a CI failure reproduces exactly. The count is what fits CI's 15 minutes on
           2 cores: on the C and WGSL runtimes nearly every drawn shape compiles new kernels (shapes are
           compile-time constants), which is most of the suite's time on a machine whose kernel cache is empty
"""
import os
import sys

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))
# OpenMP workers that spin between parallel regions (libgomp's default) take the core the main thread needs on a
# busy machine (CI: 2 cores, shared): then each of the suite's many tiny parallel regions waits a scheduler tick
# (speculative decoding's 25,000 small batched matmuls: 30 s instead of 2). Waiting asleep changes no value. Set
# before any OpenMP runtime loads (tinyllm._kernels, torch), which read it once.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")
os.environ.setdefault("TINYLLM_TUNE", "0")  # no autotuning of the C products in tests (tests/test_tune.py tunes)

settings.register_profile("default", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# CI draws fewer: on its 2 shared cores the suite must stay under 15 minutes, and on the compiled runtimes nearly
# every drawn shape builds kernels (850-904 s with 25)
settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

import tinyllm.runtime  # noqa: E402  (after OMP_WAIT_POLICY is set)


# every runtime tinyllm.runtime finds (one package each), the NumPy reference first
RUNTIMES = sorted(tinyllm.runtime.available(), key=lambda name: name != "numpy")


def wgsl_skip_reason():
    """Why the WGSL runtime cannot run here (None when it can). In CI it must run: see runtimes_really_built."""
    try:
        import tinyllm.runtime
        tinyllm.runtime.get("wgsl")
    except Exception as e:  # no wgpu, no adapter: the message says what to install
        return f"WGSL runtime unavailable: {e}"
    return None


def pytest_collection_modifyitems(items):
    """Marks `wgsl` every test that runs on the WGSL runtime: the test_wgsl_*.py modules, and every test with a
    parameter "wgsl" (each_runtime's, a `device` or `runtime` parametrization); a test that picks the runtime in
    its body carries @pytest.mark.wgsl itself, and wgsl_marks_complete fails one that does not. `pytest -m wgsl`
    then runs the WGSL part of the suite (CI does, on wgpu's OpenGL backend).
    On the WGSL runtime float64 cases are skipped: WebGPU has no portable f64, and the runtime refuses it with
    an error (tests/test_wgsl_runtime.py checks that error)."""
    import numpy as np
    f64 = pytest.mark.skip(reason="WGSL runtime: no float64 in WebGPU (the runtime refuses it clearly)")
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.path.name.startswith("test_wgsl_") or any(isinstance(v, str) and v == "wgsl" for v in params.values()):
            item.add_marker(pytest.mark.wgsl)
        if params.get("each_runtime") == "wgsl" and params.get("dtype") is np.float64:
            item.add_marker(f64)


@pytest.fixture(autouse=True)
def wgsl_marks_complete(request):
    """A test that submits work to the WGSL runtime must be marked `wgsl`, or `pytest -m wgsl` (CI's run on
    OpenGL) would leave it out unnoticed. Counted by the device's submits, so only a runtime already made is
    looked at."""
    import tinyllm.runtime
    marked = request.node.get_closest_marker("wgsl") is not None

    def submits():
        rt = tinyllm.runtime._live.get("wgsl")
        return rt.gpu.submits if rt is not None else 0
    before = None if marked else submits()
    yield
    if not marked and submits() != before:
        pytest.fail(f"{request.node.nodeid} ran kernels on the WGSL runtime but is not marked wgsl: add "
                    "@pytest.mark.wgsl (tests/conftest.py marks parametrizations on \"wgsl\" by itself)",
                    pytrace=False)


_each_runtime_set = []  # (the runtime each_runtime set, the TINYLLM_RUNTIME before it) while one is alive


@pytest.fixture(autouse=True)
def no_leaked_runtime(request):
    """A test that does not ask for each_runtime runs where it would without it, even after a module's each_runtime
    tests: that module-scoped fixture's TINYLLM_RUNTIME lives until the module ends, and would otherwise put the
    rest of the module on its last runtime (WGSL: 30 s for a 2 s sampling test). Other settings of the variable (a
    module's reference_runtime, the session's own) are left as they are."""
    leaked = _each_runtime_set and os.environ.get("TINYLLM_RUNTIME") == _each_runtime_set[-1][0]
    if "each_runtime" in request.fixturenames or not leaked:
        yield
        return
    before = _each_runtime_set[-1][1]
    with pytest.MonkeyPatch.context() as mp:
        if before is None:
            mp.delenv("TINYLLM_RUNTIME")
        else:
            mp.setenv("TINYLLM_RUNTIME", before)
        yield


@pytest.fixture(scope="module", params=RUNTIMES)
def each_runtime(request):
    """Runs a whole test module once per runtime: `pytestmark = pytest.mark.usefixtures("each_runtime")`.
    Module scope keeps it compatible with hypothesis, and lets each runtime reuse its compiled kernels.
    Without a WebGPU adapter the wgsl runs are skipped, except in CI, where that is a failure."""
    if request.param == "wgsl" and not os.environ.get("CI"):
        reason = wgsl_skip_reason()
        if reason:
            pytest.skip(reason)
    _each_runtime_set.append((request.param, os.environ.get("TINYLLM_RUNTIME")))
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TINYLLM_RUNTIME", request.param)
            yield request.param
    finally:
        _each_runtime_set.pop()


def _cpu_paths():
    from tinyllm.runtime.c import compiler
    return compiler.PATHS


@pytest.fixture(params=_cpu_paths())
def cpu_path(request):
    """Every C kernel, prebuilt and generated, on this CPU path (portable, avx2, avx512) for the test."""
    from helpers import usable_path
    from tinyllm.runtime.c import compiler
    from tinyllm.runtime import get
    if get("c").lib is None or not compiler.available():
        pytest.skip("no prebuilt C module or no C compiler")
    if not usable_path(request.param):
        pytest.skip(f"this CPU has no {request.param} path")
    assert compiler.set_path(request.param) == request.param
    try:
        yield request.param
    finally:
        compiler.set_path(None)


@pytest.fixture(scope="module")
def one_torch_thread():
    """The torch side of a test that runs tiny ops: one thread avoids oversubscribing the CPU (restored after)."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session", autouse=True)
def runtimes_really_built():
    """In CI a runtime that could not be built is a failure, not a quiet fallback to NumPy."""
    if os.environ.get("CI"):
        import importlib.util
        from tinyllm.runtime.c import compiler
        assert importlib.util.find_spec("tinyllm._kernels") is not None, \
            "tinyllm._kernels was not built: `pip install -e .` needs a C compiler (apt-get install gcc)"
        assert compiler.compiler() is not None, "no C compiler for generated kernels (apt-get install gcc)"
        reason = wgsl_skip_reason()
        assert reason is None, f"{reason} (CI installs mesa-vulkan-drivers libvulkan1 for a software adapter)"
    yield


@pytest.fixture
def c_schedules(monkeypatch):
    """Every Schedule the C runtime executes in the test, in order."""
    from tinyllm.runtime.c.runtime import CRuntime
    seen = []
    original = CRuntime.execute

    def spy(self, schedule, feeds=()):
        seen.append(schedule)
        return original(self, schedule, feeds)
    monkeypatch.setattr(CRuntime, "execute", spy)
    return seen
