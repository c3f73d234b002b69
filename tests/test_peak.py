"""The benches' limit measurements (runtime_c/peak.h): the FMA loop runs on every path this CPU has and nowhere
else, counts its FLOPs so that a rate comes out in a plausible range, and the read-only stream reads every element
once, whatever the thread count and however the shares fall."""
import numpy as np
import pytest

kernels = pytest.importorskip("tinyllm._kernels")
ffi, lib = kernels.ffi, kernels.lib


@pytest.mark.parametrize("path", [0, 1, 2])
def test_fma_peak_runs_on_supported_paths_only(path):
    rate = lib.tl_peak_fma_gflops(path, 1, 20000)
    if not lib.tl_cpu_supports(path):
        assert rate == 0.0
        return
    # 20000 steps of 12 chains: a few hundred thousand FLOPs a lane; any CPU that runs the tests does 0.1 to
    # 1000 GFLOP/s a core (a loop that the compiler folded, or a FLOP count off by the lanes, falls outside)
    assert 0.1 < rate < 1000


def test_fma_peak_rejects_nothing_to_do():
    assert lib.tl_peak_fma_gflops(0, 1, 0) == 0.0
    assert lib.tl_peak_fma_gflops(7, 1, 1000) == 0.0  # no such path


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000, 4099])
def test_read_sums_every_element_once(threads, n):
    x = np.arange(1, n + 1, dtype=np.float32) % 16  # small integers: every partial sum exact in float32
    got = lib.tl_peak_read(ffi.cast("float *", x.ctypes.data), n, threads)
    assert got == float(x.astype(np.float64).sum())
