"""c_math.h's tl_erff, the erf of generated float32 kernels, and tl_erff_given, the erf of a kernel that computes
e^(-x^2) too (GELU's backward), compiled as the kernels are (compiler.FLAGS and each CPU path's compiler.ISA):
within 1.5 ulp and 1.2e-7 of the float64 erf over a sweep of every 509th float, a dense grid over [-6, 6] and the
edges of its two pieces; odd, exactly; +-1 at +-inf, NaN for NaN, signed zeros and subnormals kept; and the
vectorised loop (what a kernel runs) equal bit for bit to the scalar code. And the renderer hands GELU's backward
its e^(-x^2)."""
import ctypes
import math
import os
import subprocess

import numpy as np
import pytest

from tinyllm.runtime.c import compiler
from tinyllm.runtime.c import render as render_c

SOURCE = f"""#include <math.h>
#include <stdint.h>
#include "{render_c.HEADER}"
void erf_n(const float *restrict x, float *restrict y, long n) {{
    for (long i = 0; i < n; i++) y[i] = ERF;
}}
"""
ERFS = {"tl_erff": "tl_erff(x[i])", "tl_erff_given": "tl_erff_given(x[i], tl_expf(-(x[i] * x[i])))"}


def _build(tmp_path, path, vectorise, which="tl_erff"):
    src = tmp_path / f"{which}.c"
    src.write_text(SOURCE.replace("ERF;", ERFS[which] + ";"))
    lib = tmp_path / f"{which}_{path}_{int(vectorise)}.so"
    extra = [] if vectorise else ["-fno-tree-vectorize", "-fno-tree-slp-vectorize"]
    subprocess.run([compiler.compiler(), *compiler.FLAGS, *compiler.ISA[path], *extra, str(src), "-o", str(lib), "-lm"],
                   check=True, capture_output=True)
    fn = ctypes.CDLL(str(lib)).erf_n
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]

    def erf(x):
        x = np.ascontiguousarray(x, np.float32)
        y = np.empty_like(x)
        fn(x.ctypes.data, y.ctypes.data, x.size)
        return y
    return erf


def _reference(x):
    """erf in float64, of float32 inputs."""
    try:
        from scipy.special import erf
        return erf(x.astype(np.float64))
    except ImportError:
        return np.frompyfunc(math.erf, 1, 1)(x.astype(np.float64)).astype(np.float64)


def _sweep():
    every = np.arange(0, 0x7F800000, 509, dtype=np.uint32).view(np.float32)  # +0 up to the largest finite floats
    grid = np.linspace(-6.0, 6.0, 1 << 20, dtype=np.float32)
    edges = np.array([0.927734375, 4.0, 3.9, 3.92, 1.0, 0.5, 2.0], np.float32)
    around = np.concatenate([np.nextafter(edges, np.float32(0)), edges, np.nextafter(edges, np.float32(np.inf))])
    tiny = np.array([1e-45, 1e-40, 1.1754942e-38, 1.1754944e-38, 1e-30, 1e-10, 1e-4], np.float32)
    x = np.concatenate([every, grid, around, tiny, np.float32([3.4028235e38])])
    return np.concatenate([x, -x])


@pytest.fixture(scope="module", params=[(path, which) for path in compiler.PATHS for which in ERFS])
def erf_pair(request, tmp_path_factory):
    """(vectorised, scalar) builds of tl_erff or tl_erff_given for one CPU path."""
    path, which = request.param
    if not compiler.available():
        pytest.skip("no C compiler")
    if compiler.X86 and not compiler.supports(path):
        pytest.skip(f"this CPU has no {path} path")
    tmp = tmp_path_factory.mktemp(f"{which}_{path}")
    return _build(tmp, path, True, which), _build(tmp, path, False, which)


@pytest.fixture(scope="module")
def sweep():
    x = _sweep()
    return x, _reference(x)


def test_erf_is_within_1_5_ulp_and_1_2e_7(erf_pair, sweep):
    erf, _ = erf_pair
    x, want = sweep
    got = erf(x).astype(np.float64)
    err = np.abs(got - want)
    assert err.max() <= 1.2e-7, f"max abs error {err.max():.3g} at x = {x[err.argmax()]!r}"
    # ulp of the float32 nearest the true value (the subnormal spacing below the normal range)
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    ulps = err / ulp
    assert ulps.max() <= 1.5, f"max error {ulps.max():.3f} ulp at x = {x[ulps.argmax()]!r}"


def test_erf_is_odd_and_exact_at_the_limits(erf_pair, sweep):
    erf, _ = erf_pair
    x = sweep[0][: sweep[0].size // 2]
    assert np.array_equal(erf(-x).view(np.uint32), (-erf(x)).view(np.uint32))
    special = np.array([np.inf, -np.inf, 0.0, -0.0, np.nan, 4.0, -4.0, 10.0, -1e30, 1e-45, -1e-45], np.float32)
    got = erf(special)
    assert got[0] == 1.0 and got[1] == -1.0
    assert got[2] == 0.0 and not np.signbit(got[2]) and got[3] == 0.0 and np.signbit(got[3])
    assert np.isnan(got[4])
    assert list(got[5:9]) == [1.0, -1.0, 1.0, -1.0]
    assert got[9] == np.float32(1e-45) and got[10] == np.float32(-1e-45)  # 2/sqrt(pi) x rounds to x there
    assert np.all(np.abs(erf(sweep[0])[~np.isnan(sweep[0])]) <= 1.0)


def test_vectorised_erf_equals_the_scalar_code(erf_pair, sweep):
    vector, scalar = erf_pair
    x = np.concatenate([sweep[0], np.float32([np.nan, np.inf, -np.inf])])
    assert np.array_equal(vector(x).view(np.uint32), scalar(x).view(np.uint32))


def test_gelus_backward_hands_its_exponential_to_erf():
    """The kernel of GELU's backward computes e^(-x^2) for the derivative, and its erf reads it (tl_erff_given)
    instead of taking an exponential of its own; a kernel with erf alone (the forward) keeps tl_erff. The values
    against NumPy's: within float32's error of a few operations."""
    import tinyllm as tl
    import tinyllm.runtime as runtime
    if runtime.get("c").lib is None or not compiler.available():
        pytest.skip("no C compiler")
    x = np.linspace(-5, 5, 4099, dtype=np.float32).reshape(1, -1) + np.zeros((40, 1), np.float32)
    t = tl.tensor(x, device="c", requires_grad=True)
    y = tl.nn.functional.gelu(t)
    y.backward(tl.tensor(np.ones_like(x), device="c"))
    want = 0.5 * (1 + np.vectorize(math.erf)(x / np.sqrt(2))) + x * np.exp(-x.astype(np.float64) ** 2 / 2) / np.sqrt(
        2 * np.pi)
    np.testing.assert_allclose(t.grad.numpy(), want, rtol=2e-6, atol=2e-7)
    tl.nn.functional.gelu(tl.tensor(x[:3], device="c")).numpy()  # (a forward alone: erf and no e^(-x^2))
    erf_kernels = [key[0] for _, key in runtime.get("c").built if any(i[0] == "ERF" for i in key[0].code)]
    given = [any(i[:2] == ("ERF", "given") for i in render_c._erf_given_exp(k).code) for k in erf_kernels]
    assert True in given and False in given             # (the backward's, and the forward's)
