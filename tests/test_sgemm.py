"""tinyllm._kernels (runtime_c/sgemm.c) against numpy float64 matmul.

The extension is built in place (python runtime_c/build.py) when it is missing or older than its
sources; the tests skip only when it is missing and no C compiler exists to build it.

Every product runs on both code paths (AVX2+FMA where the CPU has it, and the portable C one) and on
1 and 2 threads. The tolerance is the classic bound for a K-term dot product in float32,
|C - C_ref| <= K * eps * (|op(A)| |op(B)|), plus one rounding for the beta * C term.
"""
import glob
import importlib.machinery
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "runtime_c", "build.py")
SOURCES = glob.glob(os.path.join(ROOT, "runtime_c", "*.[ch]")) + [BUILD]
EPS = np.finfo(np.float32).eps


def _built_extension():
    """The file `import tinyllm._kernels` would load (the first suffix in Python's order), or None."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(ROOT, "tinyllm", "_kernels" + suffix)
        if os.path.exists(path):
            return path
    return None


def _load_extension():
    built = _built_extension()
    if built is None or os.path.getmtime(built) < max(map(os.path.getmtime, SOURCES)):
        compiler = os.environ.get("CC", "cc")
        if shutil.which(compiler) is None and shutil.which("gcc") is None:
            if built is None:
                pytest.skip(f"no C compiler ({compiler!r} or 'gcc') on PATH to build tinyllm._kernels from runtime_c/",
                            allow_module_level=True)
        else:
            subprocess.run([sys.executable, BUILD], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    from tinyllm import _kernels
    return _kernels


sgemm = _load_extension()
ffi, lib = sgemm.ffi, sgemm.lib
HAS_AVX2 = bool(lib.tl_cpu_has_avx2_fma())
PATHS = ["avx2", "portable"]
ODD = [1, 2, 3, 5, 7, 16, 17, 33, 65, 127, 129, 257]


@pytest.fixture(params=[(p, t) for p in PATHS for t in (1, 2)], ids=lambda pt: f"{pt[0]}-{pt[1]}t")
def config(request):
    """Runs the test on one code path with one thread count, then restores the defaults."""
    path, threads = request.param
    if path == "avx2" and not HAS_AVX2:
        pytest.skip("this CPU has no AVX2+FMA")
    lib.tl_force_portable(path == "portable")
    lib.tl_set_num_threads(threads)
    assert lib.tl_sgemm_uses_avx2() == (path == "avx2")
    yield path, threads
    lib.tl_force_portable(0)
    lib.tl_set_num_threads(0)


def ptr(x):
    return ffi.cast("float *", x.ctypes.data)


def padded(rng, rows, cols, pad):
    """A rows x cols float32 matrix whose rows are `cols + pad` apart in memory (a view), and that stride."""
    base = rng.standard_normal((rows, cols + pad)).astype(np.float32)
    return base[:, :cols], cols + pad


def reference(ta, tb, a, b, beta, c0):
    """float64 result and the error bound for float32 accumulation over K terms."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    a64, b64 = (a64.T if ta else a64), (b64.T if tb else b64)
    k = a64.shape[1]
    ref = a64 @ b64 + beta * c0.astype(np.float64)
    tol = k * EPS * (np.abs(a64) @ np.abs(b64)) + 2 * EPS * np.abs(ref) + 2 * EPS * np.abs(beta * c0) + 1e-30
    return ref, tol


def run_sgemm(rng, ta, tb, m, n, k, beta, pad=(0, 0, 0)):
    a, lda = padded(rng, k if ta else m, m if ta else k, pad[0])
    b, ldb = padded(rng, n if tb else k, k if tb else n, pad[1])
    c, ldc = padded(rng, m, n, pad[2])
    c0 = c.copy()
    if beta == 0:
        c[...] = np.nan  # beta == 0 must not read C
    lib.tl_sgemm(ta, tb, m, n, k, ptr(a), lda, ptr(b), ldb, beta, ptr(c), ldc)
    ref, tol = reference(ta, tb, a, b, beta, c0)
    return c, ref, tol


def assert_close(c, ref, tol):
    err = np.abs(c.astype(np.float64) - ref)
    bad = ~(err <= tol)  # also catches NaN
    assert not bad.any(), f"{bad.sum()} of {bad.size} wrong, worst error/tol {np.nanmax(err / tol):.3g}"


dims = st.one_of(st.sampled_from(ODD), st.integers(1, 300))
# `config` only selects the path and thread count, which every example shares on purpose.
shared_config = settings(suppress_health_check=[*settings.default.suppress_health_check,
                                                HealthCheck.function_scoped_fixture])


@shared_config
@given(m=dims, n=dims, k=dims, ta=st.booleans(), tb=st.booleans(), beta=st.sampled_from([0.0, 1.0, -0.5]),
       pad=st.tuples(*[st.sampled_from([0, 0, 1, 5])] * 3), seed=st.integers(0, 2**32 - 1))
def test_sgemm_random_shapes(config, m, n, k, ta, tb, beta, pad, seed):
    c, ref, tol = run_sgemm(np.random.default_rng(seed), int(ta), int(tb), m, n, k, beta, pad)
    assert_close(c, ref, tol)


# Shapes that cross every blocking boundary (MR 6, NR 16, KC 256, MC 144, NC 4096) and the thread
# splits: many rows (threads split M), one row (threads split N), panels wider than NC.
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (6, 16, 256), (7, 17, 257), (145, 33, 513), (289, 300, 100),
                                   (1, 5000, 70), (3, 4113, 40), (600, 1, 300), (128, 128, 128), (129, 127, 65),
                                   (128, 300, 1024), (5, 290, 41)])  # these two: computed as C^T, then transposed
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("beta", [0.0, 1.0, -0.5])
def test_sgemm_block_edges(config, m, n, k, ta, tb, beta):
    c, ref, tol = run_sgemm(np.random.default_rng(m * n * k), ta, tb, m, n, k, beta, pad=(3, 1, 2))
    assert_close(c, ref, tol)


# Several (jc, pc) rounds with the threads in a row (split M), in a column (split N) or a 2 x 2
# grid, and more threads than cores (the waits then yield): repeated, to give a race a chance.
@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("m,n,k", [(300, 200, 1100), (12, 4200, 600), (100, 4150, 300)])
def test_sgemm_threads_many_rounds(threads, m, n, k):
    rng = np.random.default_rng(threads * m)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ref, tol = reference(0, 0, a, b, 0.0, np.zeros((m, n), np.float32))
    lib.tl_set_num_threads(threads)
    try:
        for _ in range(5):
            c = np.full((m, n), np.nan, np.float32)
            lib.tl_sgemm(0, 0, m, n, k, ptr(a), k, ptr(b), n, 0.0, ptr(c), n)
            assert_close(c, ref, tol)
    finally:
        lib.tl_set_num_threads(0)


# A weight gradient (A^T B, both storing the long K as rows) sums the two halves of K apart, each on the thread
# that holds its rows, and adds them: in two halves on any number of threads, so the bits do not change with it.
@pytest.mark.parametrize("m,n,k", [(128, 384, 1024), (145, 33, 513), (512, 128, 1024)])
def test_sgemm_split_k_same_bits_on_any_thread_count(m, n, k):
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((k, m)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    ref, tol = reference(1, 0, a, b, 0.5, c0)
    results = []
    try:
        for threads in (1, 2, 3, 4):
            lib.tl_set_num_threads(threads)
            c = c0.copy()
            lib.tl_sgemm(1, 0, m, n, k, ptr(a), m, ptr(b), n, 0.5, ptr(c), n)
            assert_close(c, ref, tol)
            results.append(c)
    finally:
        lib.tl_set_num_threads(0)
    for c in results[1:]:
        np.testing.assert_array_equal(c, results[0])


def test_sgemm_empty_dims(config):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 4)).astype(np.float32)
    c = rng.standard_normal((5, 3)).astype(np.float32)
    c0 = c.copy()
    lib.tl_sgemm(0, 0, 5, 3, 0, ptr(a), 4, ptr(a), 3, 0.5, ptr(c), 3)  # K == 0: C = beta C
    np.testing.assert_array_equal(c, np.float32(0.5) * c0)
    lib.tl_sgemm(0, 0, 5, 3, 0, ptr(a), 4, ptr(a), 3, 0.0, ptr(c), 3)
    np.testing.assert_array_equal(c, 0)
    c[...] = 7
    lib.tl_sgemm(0, 0, 0, 3, 4, ptr(a), 4, ptr(a), 3, 0.0, ptr(c), 3)  # M == 0, N == 0: nothing
    lib.tl_sgemm(0, 0, 5, 0, 4, ptr(a), 4, ptr(a), 3, 0.0, ptr(c), 3)
    np.testing.assert_array_equal(c, 7)


def run_batched(rng, batch, ta, tb, m, n, k, beta, gap):
    """Batched product on matrices `gap` floats apart (beyond their own padded size)."""
    def stack(rows, cols, pad):
        ld = cols + pad
        stride = rows * ld + gap
        base = rng.standard_normal(batch * stride).astype(np.float32)
        views = [base[i * stride:i * stride + rows * ld].reshape(rows, ld)[:, :cols] for i in range(batch)]
        return base, views, ld, stride

    abase, a, lda, sa = stack(k if ta else m, m if ta else k, 1)
    bbase, b, ldb, sb = stack(n if tb else k, k if tb else n, 2)
    cbase, c, ldc, sc = stack(m, n, 3)
    c0 = [x.copy() for x in c]
    lib.tl_sgemm_batched(batch, ta, tb, m, n, k, ptr(abase), lda, sa, ptr(bbase), ldb, sb, beta, ptr(cbase), ldc, sc)
    for i in range(batch):
        ref, tol = reference(ta, tb, a[i], b[i], beta, c0[i])
        assert_close(c[i], ref, tol)


@shared_config
@given(batch=st.integers(1, 6), m=dims, n=dims, k=dims, ta=st.booleans(), tb=st.booleans(),
       beta=st.sampled_from([0.0, 1.0]), gap=st.sampled_from([0, 7]), seed=st.integers(0, 2**32 - 1))
def test_sgemm_batched_random(config, batch, m, n, k, ta, tb, beta, gap, seed):
    run_batched(np.random.default_rng(seed), batch, int(ta), int(tb), min(m, 100), min(n, 100), min(k, 100), beta, gap)


# Small matrices go one per thread; big ones in an odd batch go one after the other, each threaded.
@pytest.mark.parametrize("batch,m,n,k", [(4, 16, 16, 16), (3, 5, 7, 9), (3, 130, 140, 150), (2, 200, 64, 96)])
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_sgemm_batched_policies(config, batch, m, n, k, ta, tb):
    run_batched(np.random.default_rng(batch * m), batch, ta, tb, m, n, k, 1.0, gap=5)


@shared_config
@given(b0=st.integers(1, 3), b1=st.integers(1, 4), m=dims, n=dims, k=dims, ta=st.booleans(), tb=st.booleans(),
       broadcast=st.sampled_from(["", "a0", "b1"]), seed=st.integers(0, 2**32 - 1))
def test_sgemm_batched2_random(config, b0, b1, m, n, k, ta, tb, broadcast, seed):
    """Two batch axes with strides of their own: operands stored [b1, b0, ...] and read as [b0, b1, ...] (the
    layout of attention's per-head views), or broadcast along one axis (stride 0)."""
    m, n, k = min(m, 60), min(n, 60), min(k, 60)
    rng = np.random.default_rng(seed)
    a_shape, b_shape = ((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))
    a_store = rng.standard_normal((b1, b0) + a_shape).astype(np.float32)
    b_store = rng.standard_normal((b1, b0) + b_shape).astype(np.float32)
    a_view, b_view = a_store.transpose(1, 0, 2, 3), b_store.transpose(1, 0, 2, 3)
    sa0, sa1 = a_store.strides[1] // 4, a_store.strides[0] // 4
    sb0, sb1 = b_store.strides[1] // 4, b_store.strides[0] // 4
    if broadcast == "a0":
        a_view, sa0 = np.broadcast_to(a_view[:1], a_view.shape), 0
    if broadcast == "b1":
        b_view, sb1 = np.broadcast_to(b_view[:, :1], b_view.shape), 0
    c = np.full((b0, b1, m, n), np.nan, np.float32)
    lib.tl_sgemm_batched2(b0, b1, int(ta), int(tb), m, n, k, ptr(a_store), a_shape[1], sa0, sa1,
                          ptr(b_store), b_shape[1], sb0, sb1, 0.0, ptr(c), n, b1 * m * n, m * n)
    for i in range(b0):
        for j in range(b1):
            ref, tol = reference(int(ta), int(tb), a_view[i, j], b_view[i, j], 0.0, c[i, j])
            assert_close(c[i, j], ref, tol)


def test_threads_setting():
    lib.tl_set_num_threads(3)
    assert lib.tl_get_num_threads() == 3
    lib.tl_set_num_threads(0)
    assert lib.tl_get_num_threads() >= 1


def _in_subprocess(env, code):
    env = {**os.environ, **env, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", "from tinyllm._kernels import lib; " + code],
                         env=env, check=True, capture_output=True, text=True, cwd=ROOT)
    return out.stdout.strip()


def test_environment_settings():
    assert _in_subprocess({"TINYLLM_THREADS": "3"}, "print(lib.tl_get_num_threads())") == "3"
    assert _in_subprocess({"TINYLLM_NO_AVX2": "1"}, "print(lib.tl_sgemm_uses_avx2())") == "0"
    assert _in_subprocess({"TINYLLM_NO_AVX2": ""}, "print(lib.tl_sgemm_uses_avx2())") == str(int(HAS_AVX2))
