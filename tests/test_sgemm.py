"""tinyllm._kernels (runtime_c/sgemm.c, runtime_c/cpu.c) against numpy float64 matmul.

The extension is built in place (python runtime_c/build.py) when it is missing or older than its
sources; the tests skip only when it is missing and no C compiler exists to build it.

Every product runs on each code path this CPU supports (portable C, AVX2+FMA, AVX-512F: cpu.h's paths,
forced with tl_cpu_set_path; one the CPU lacks is skipped, but in CI, with CI set, AVX2 must be there)
and on 1 and 2 threads. The tolerance is the classic bound for a K-term dot product in float32,
|C - C_ref| <= K * eps * (|op(A)| |op(B)|), plus one rounding for the beta * C term: it holds for any
order of summation, so it covers the sgemm's blocked sums and the GEMV's alike.
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
PATHS = {"portable": 0, "avx2": 1, "avx512": 2}  # cpu.h
ODD = [1, 2, 3, 5, 7, 16, 17, 33, 65, 127, 129, 257]


def plan(path):
    """(MR, NR, KC, MC, NC) of a path's sgemm."""
    out = ffi.new("int[5]")
    lib.tl_sgemm_plan(path, out)
    return tuple(out)


@pytest.fixture(params=[(p, t) for p in PATHS for t in (1, 2)], ids=lambda pt: f"{pt[0]}-{pt[1]}t")
def config(request):
    """Runs the test on one code path with one thread count, then restores the defaults."""
    name, threads = request.param
    path = PATHS[name]
    if not lib.tl_cpu_supports(path):
        pytest.skip(f"this CPU has no {name}")
    lib.tl_cpu_set_path(path)
    lib.tl_set_num_threads(threads)
    assert lib.tl_cpu_path() == path
    yield name, threads
    lib.tl_cpu_set_path(-1)
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


# Shapes that cross the micro-tiles' edges and the thread splits: many rows (threads split M), few rows (the
# GEMV, threads split N), few columns (its mirror). The cache blocks come from the CPU's caches:
# test_sgemm_small_blocks crosses them with blocks set small.
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (6, 16, 256), (7, 17, 257), (145, 33, 513), (289, 300, 100),
                                   (1, 5000, 70), (3, 4113, 40), (600, 1, 300), (128, 128, 128), (129, 127, 65),
                                   (128, 300, 1024), (5, 290, 41)])  # these two: computed as C^T, then transposed
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("beta", [0.0, 1.0, -0.5])
def test_sgemm_block_edges(config, m, n, k, ta, tb, beta):
    c, ref, tol = run_sgemm(np.random.default_rng(m * n * k), ta, tb, m, n, k, beta, pad=(3, 1, 2))
    assert_close(c, ref, tol)


# Several (jc, pc) rounds with the threads in a row (split M), in a column (split N) or a 2 x 2
# grid, and more threads than cores (the waits then yield): repeated, to give a race a chance. Split N over three
# rounds or more (the threads' own strips in buffers taken in turns, whose places move with each round's kc) and C's
# columns forced (tl_sgemm_set_split) too.
@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("m,n,k,split", [(300, 200, 1100, 0), (12, 4200, 600, 0), (100, 4150, 300, 0),
                                         (12, 2000, 1300, 0), (300, 65, 1300, 1), (97, 200, 1100, 1)])
def test_sgemm_threads_many_rounds(threads, m, n, k, split):
    rng = np.random.default_rng(threads * m)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ref, tol = reference(0, 0, a, b, 0.0, np.zeros((m, n), np.float32))
    lib.tl_set_num_threads(threads)
    lib.tl_sgemm_set_split(split)
    try:
        for _ in range(5 if split == 0 and k < 1200 else 20):
            c = np.full((m, n), np.nan, np.float32)
            lib.tl_sgemm(0, 0, m, n, k, ptr(a), k, ptr(b), n, 0.0, ptr(c), n)
            assert_close(c, ref, tol)
    finally:
        lib.tl_sgemm_set_split(0)
        lib.tl_set_num_threads(0)


def seeded_operands(m, n, k, ta):
    """A (stored k x m when `ta`), B (k x n) and C (m x n) of one shape, drawn from a generator seeded by it."""
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    return a, rng.standard_normal((k, n)).astype(np.float32), rng.standard_normal((m, n)).astype(np.float32)


# A thread done with its rows of the last (jc, pc) round takes over units of another's: with more threads than
# cores the waits yield and the threads fall behind one another, so units change hands. Each unit is computed once,
# by the same kernels in the same order whoever takes it: the bits of one thread, in one round or several.
@pytest.mark.parametrize("m,n,k", [(1024, 512, 128), (300, 200, 1100), (97, 64, 700)])
def test_sgemm_stolen_rows_same_bits_as_one_thread(m, n, k):
    a, b, c0 = seeded_operands(m, n, k, ta=False)
    ref, tol = reference(0, 0, a, b, 1.0, c0)
    try:
        lib.tl_set_num_threads(1)
        one = c0.copy()
        lib.tl_sgemm(0, 0, m, n, k, ptr(a), k, ptr(b), n, 1.0, ptr(one), n)
        assert_close(one, ref, tol)
        for threads in (2, 3, 4):
            lib.tl_set_num_threads(threads)
            for _ in range(5):
                c = c0.copy()
                lib.tl_sgemm(0, 0, m, n, k, ptr(a), k, ptr(b), n, 1.0, ptr(c), n)
                np.testing.assert_array_equal(c, one)
    finally:
        lib.tl_set_num_threads(0)


# A weight gradient (A^T B, both storing the long K as rows) sums the two halves of K apart, each on the thread
# that holds its rows, and adds them: in two halves on any number of threads, so the bits do not change with it.
@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
@pytest.mark.parametrize("m,n,k", [(128, 384, 1024), (145, 33, 513), (512, 128, 1024)])
def test_sgemm_split_k_same_bits_on_any_thread_count(m, n, k, beta):
    a, b, c0 = seeded_operands(m, n, k, ta=True)
    ref, tol = reference(1, 0, a, b, beta, c0)
    results = []
    try:
        for threads in (1, 2, 3, 4):
            lib.tl_set_num_threads(threads)
            c = c0.copy()
            lib.tl_sgemm(1, 0, m, n, k, ptr(a), m, ptr(b), n, beta, ptr(c), n)
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


def _in_subprocess(env, code, stderr=False):
    env = {**os.environ, "TINYLLM_CPU": "", "TINYLLM_NO_AVX2": "", **env,
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", "from tinyllm._kernels import ffi, lib; " + code],
                         env=env, check=True, capture_output=True, text=True, cwd=ROOT)
    return (out.stdout.strip(), out.stderr) if stderr else out.stdout.strip()


def test_environment_settings():
    assert _in_subprocess({"TINYLLM_THREADS": "3"}, "print(lib.tl_get_num_threads())") == "3"
    assert _in_subprocess({"TINYLLM_NO_AVX2": "1"}, "print(lib.tl_sgemm_uses_avx2())") == "0"
    assert _in_subprocess({"TINYLLM_NO_AVX2": ""}, "print(lib.tl_sgemm_uses_avx2())") == str(int(HAS_AVX2))


# ---------------------------------------------------------------------------------------------------------------
# Run-time dispatch (runtime_c/cpu.c), the per-path cache blocks and the GEMV.

def best_path():
    """The path cpu.c picks by itself: AVX-512 only where its FMAs are full width (not a double-pumped unit)."""
    if lib.tl_cpu_supports(2) and lib.tl_cpu_avx512_full_width():
        return 2
    return 1 if lib.tl_cpu_supports(1) else 0


def test_ci_machine_has_avx2():
    """CI runs the SIMD paths for real: a runner without AVX2 would test the portable path alone, unnoticed."""
    if not os.environ.get("CI"):
        pytest.skip("not in CI")
    assert lib.tl_cpu_supports(1), "CI runner without AVX2+FMA: the SIMD paths go untested"


def test_cpu_paths():
    assert lib.tl_cpu_supports(0)
    assert not lib.tl_cpu_supports(3) and not lib.tl_cpu_supports(-1)
    assert [ffi.string(lib.tl_cpu_path_name(p)).decode() for p in (0, 1, 2, 7)] == ["portable", "avx2", "avx512", "?"]
    assert lib.tl_cpu_supports(2) <= lib.tl_cpu_supports(1)  # avx512 implies the avx2 kernels run
    try:
        for path in range(4):  # a path the CPU lacks falls back to the best one below it
            lib.tl_cpu_set_path(path)
            want = max(p for p in range(min(path, 2) + 1) if lib.tl_cpu_supports(p))
            assert lib.tl_cpu_path() == want
            assert lib.tl_sgemm_uses_avx2() == (want >= 1)  # the interface attention.c uses
        lib.tl_force_portable(1)
        assert lib.tl_cpu_path() == 0
    finally:
        lib.tl_cpu_set_path(-1)


@pytest.mark.parametrize("name", ["portable", "avx2", "avx512"])
def test_cpu_environment_forces_a_path(name):
    """TINYLLM_CPU picks the path at load; one this CPU lacks falls back to the best below it, and says so."""
    path = PATHS[name]
    want = max(p for p in range(path + 1) if lib.tl_cpu_supports(p))
    out, err = _in_subprocess({"TINYLLM_CPU": name}, "print(lib.tl_cpu_path(), lib.tl_cpu_requested_path())",
                              stderr=True)
    assert out == f"{want} {path}"
    assert ("not supported by this CPU" in err) == (want != path)


# The best path as the subprocess itself calibrated it: whether the AVX-512 unit is full width is timed at start,
# and under a loaded CI run one process can time it otherwise than another (this one, say).
BEST_THERE = ("print(lib.tl_cpu_path(), lib.tl_cpu_requested_path(), 2 if lib.tl_cpu_supports(2) and "
              "lib.tl_cpu_avx512_full_width() else int(lib.tl_cpu_supports(1)))")


def test_cpu_environment_default_and_bad_values():
    path, requested, best = _in_subprocess({}, BEST_THERE).split()
    assert path == best and requested == "-1"
    assert _in_subprocess({"TINYLLM_NO_AVX2": "1"}, "print(lib.tl_cpu_path())") == "0"  # the older alias
    out, err = _in_subprocess({"TINYLLM_CPU": "sse9"}, BEST_THERE, stderr=True)
    path, requested, best = out.split()
    assert path == best and requested == "-2" and "TINYLLM_CPU=sse9 is not one of" in err


def test_cache_blocks_follow_the_caches():
    """KC, MC, NC per path, from the cache sizes the OS reports (sgemm.c, plan_blocking)."""
    l1, l2, l3 = (lib.tl_cpu_cache_size(level) or default for level, default in ((1, 32 << 10), (2, 512 << 10),
                                                                                 (3, 8 << 20)))
    for path in PATHS.values():
        mr, nr, kc, mc, nc = plan(path)
        assert mc % mr == 0 and nc % nr == 0 and kc % 16 == 0
        assert kc == max(64, min(1024, l1 // (4 * nr) // 16 * 16))  # the B strip fills L1
        assert mc == max(mr, min(4096, l2 // 2 // (4 * kc) // mr * mr))  # the A block half of L2
        assert nc == max(16 * nr, min(16384, l3 // 4 // (4 * kc) // nr * nr))  # the B panel a quarter of L3
    if lib.tl_cpu_supports(2):
        assert plan(2)[:2] == (14, 32)


@pytest.fixture
def small_blocks():
    """Cache blocks a few micro-tiles big on every path, so small products cross each block many times."""
    for path in PATHS.values():
        mr, nr = plan(path)[:2]
        lib.tl_sgemm_set_blocking(path, 24, 2 * mr, 3 * nr)
    yield
    for path in PATHS.values():
        lib.tl_sgemm_set_blocking(path, 0, 0, 0)


@pytest.mark.parametrize("m,n,k", [(31, 101, 53), (5, 200, 49), (64, 7, 100), (1, 1, 1)])
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_sgemm_small_blocks(config, small_blocks, m, n, k, ta, tb, beta):
    mr, nr, kc, mc, nc = plan(PATHS[config[0]])
    assert (kc, mc, nc) == (24, 2 * mr, 3 * nr)
    c, ref, tol = run_sgemm(np.random.default_rng(m + n + k), ta, tb, m, n, k, beta, pad=(2, 3, 1))
    assert_close(c, ref, tol)


gemv_dims = st.one_of(st.sampled_from([1, 15, 16, 17, 31, 33, 1000, 1025]), st.integers(1, 1100))


@shared_config
@given(few=st.integers(1, 4), many=gemv_dims, k=gemv_dims, mirror=st.booleans(), ta=st.booleans(),
       tb=st.booleans(), beta=st.sampled_from([0.0, 1.0, -0.5]), pad=st.tuples(*[st.sampled_from([0, 3])] * 3),
       seed=st.integers(0, 2**32 - 1))
def test_gemv_random_shapes(config, few, many, k, mirror, ta, tb, beta, pad, seed):
    """M <= 4 rows (the GEMV, threaded over N), or N <= 4 columns (its mirror, threaded over M)."""
    m, n = (many, few) if mirror else (few, many)
    c, ref, tol = run_sgemm(np.random.default_rng(seed), int(ta), int(tb), m, n, k, beta, pad)
    assert_close(c, ref, tol)


# Sums longer than the GEMV's x buffer in L1 (3072 floats, at any M) take its kernels that read 8 or 4 rows of W
# at a time; every count of rows left over (n mod 8: by 4, 2 and 1), with a ragged end of k.
@pytest.mark.parametrize("few", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8, 9, 15, 23])
@pytest.mark.parametrize("tb,mirror", [(1, False), (0, False), (0, True)])
def test_gemv_long_sums_every_leftover_row(config, few, n, tb, mirror):
    m, n2 = (n, few) if mirror else (few, n)
    c, ref, tol = run_sgemm(np.random.default_rng(few * 100 + n), 0, tb, m, n2, 3083, 0.5, (0, 0, 0))
    assert_close(c, ref, tol)


# Rows of W a 4 KiB page long or more (1024 floats) take the kernels that read several rows at a time even where
# x (x W^T) or the sums (x W) fit in L1 (gemv.c, gemv_one_stream): every count of rows left over, at the threshold.
@pytest.mark.parametrize("few", [1, 2])
@pytest.mark.parametrize("rows", [1, 3, 7, 9])
@pytest.mark.parametrize("length", [1023, 1024, 1111])
@pytest.mark.parametrize("tb", [0, 1])
def test_gemv_rows_a_page_long(config, few, rows, length, tb):
    n, k = (rows, length) if tb else (length, rows * 3)  # x W^T: rows of k floats; x W: rows of n floats
    c, ref, tol = run_sgemm(np.random.default_rng(length + rows), 0, tb, few, n, k, 0.5, (0, 0, 0))
    assert_close(c, ref, tol)


# W's rows (N x K, K a multiple of 16) starting anywhere in a cache line: the x W^T kernels that read several rows
# at a time take each row's floats before its first line boundary on their own first (gemv.c, gemv_head).
@pytest.mark.parametrize("few", [1, 2, 4])
@pytest.mark.parametrize("offset", [0, 1, 4, 7, 8, 12, 15])
def test_gemv_weight_rows_at_every_offset_in_a_line(config, few, offset):
    rng = np.random.default_rng(offset * 10 + few)
    n, k = 9, 3200
    store = np.empty(n * k + 32, np.float32)
    start = (-store.ctypes.data // 4) % 16 + offset  # `offset` floats past a 64-byte boundary
    w = store[start:start + n * k].reshape(n, k)
    w[...] = rng.standard_normal((n, k))
    x = rng.standard_normal((few, k)).astype(np.float32)
    c = np.empty((few, n), np.float32)
    lib.tl_sgemm(0, 1, few, n, k, ptr(x), k, ptr(w), k, 0.0, ptr(c), n)
    ref, tol = reference(0, 1, x, w, 0.0, np.zeros((few, n), np.float32))
    assert_close(c, ref, tol)


# A stride of 0: every row of op(A) (or every column of op(B)) is the same stored one, as a broadcast operand.
@pytest.mark.parametrize("m,n,k", [(1, 1000, 300), (4, 77, 1030), (3, 5, 2), (300, 2, 129), (40, 300, 70)])
@pytest.mark.parametrize("which", ["a", "b"])
@pytest.mark.parametrize("t", [0, 1])
def test_sgemm_stride_zero(config, m, n, k, which, t):
    rng = np.random.default_rng(m * n + k)
    # A stored row with lda 0 (transA 0): op(A) rows all alike. B with ldb 0 (transB 1): op(B) columns alike.
    ta, tb = (0, t) if which == "a" else (t, 1)
    a_rows, a_cols = (k, m) if ta else (m, k)
    b_rows, b_cols = (n, k) if tb else (k, n)
    a = rng.standard_normal((a_rows, a_cols)).astype(np.float32)
    b = rng.standard_normal((b_rows, b_cols)).astype(np.float32)
    if which == "a":
        a[1:] = a[0]
    else:
        b[1:] = b[0]
    lda, ldb = (0 if which == "a" else a_cols), (0 if which == "b" else b_cols)
    c = np.full((m, n), np.nan, np.float32)
    lib.tl_sgemm(ta, tb, m, n, k, ptr(a), lda, ptr(b), ldb, 0.0, ptr(c), n)
    ref, tol = reference(ta, tb, a, b, 0.0, np.zeros((m, n), np.float32))
    assert_close(c, ref, tol)


# Decoding: a batch of single rows against per-matrix or shared (stride 0) weights.
@pytest.mark.parametrize("batch,m,n,k", [(3, 1, 300, 70), (4, 2, 129, 33), (2, 200, 3, 64), (5, 4, 1, 9)])
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemv_batched(config, batch, m, n, k, ta, tb):
    run_batched(np.random.default_rng(batch * m + n), batch, ta, tb, m, n, k, 1.0, gap=5)


@pytest.mark.parametrize("tb", [0, 1])
def test_gemv_shared_weight_across_a_batch(config, tb):
    rng = np.random.default_rng(tb)
    batch, m, n, k = 3, 1, 700, 400
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    w = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    c = np.full((batch, m, n), np.nan, np.float32)
    lib.tl_sgemm_batched(batch, 0, tb, m, n, k, ptr(a), k, m * k, ptr(w), w.shape[1], 0, 0.0, ptr(c), n, m * n)
    for i in range(batch):
        ref, tol = reference(0, tb, a[i], w, 0.0, c[i])
        assert_close(c[i], ref, tol)
