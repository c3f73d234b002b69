"""bfloat16 products on AVX512_BF16's vdpbf16ps (runtime_c/sgemm_kernels.c's sgemm_kernel_bf16 and k-pair packing;
cpu.h's tl_cpu_bf16_dot), against torch's bfloat16 matmul and against the widening fallback (tl_cpu_set_dot(0)).

Both of this library's paths multiply bfloat16 values exactly in float32, sum in float32 and round each result
once to bfloat16 (to nearest even); torch on such CPUs does the same through oneDNN's vdpbf16ps, the order of the
sums aside. So for C = op(A) op(B) with M = |op(A)| |op(B)| (float64) and eps = 2^-7, one bfloat16 step:

    against the fallback: |C - C_fallback| <= eps |C_fallback| + 2 K eps32 M   (one rounding step either way, plus
                                                                               two K-term float32 sums' bound)
    against torch:        |C - C_torch|    <= eps |C_torch|    + 2 K eps32 M   (the same, torch's order instead)
    against float64:      |C - C_64|       <= eps / 2 |C_64|    + K eps32 M     (the result's own rounding)

i.e. within bfloat16's own error of torch. Shapes are drawn by hypothesis, with K odd (the zero-padded last
pair), M and N off the 14 x 32 tile (N down to 1), each operand plain or transposed and with padded rows, on 1
and 2 threads, and with the bf16 plan's cache blocks shrunk so that products cross several K blocks (an odd KC
among them) and B panels. Skipped where the CPU has no AVX512_BF16, or where the runtime's path is forced below avx2
(TINYLLM_CPU=portable: no dot-product instructions then); the fallback alone is tests/test_c_lowp_matmul.py's."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from tinyllm.runtime import get

rt = get("c")
lib = rt.lib
pytestmark = pytest.mark.skipif(lib is None or not lib.tl_cpu_has_bf16_dot() or lib.tl_cpu_path() < 1,
                                reason="no AVX512_BF16 here, or the path forced below avx2 (TINYLLM_CPU)")

EPS, EPS32 = 2.0 ** -7, float(np.finfo(np.float32).eps)
BF16_PLAN = 3  # sgemm.h's tl_sgemm_plan: the plan of bfloat16 products on vdpbf16ps


@pytest.fixture(params=[1, 2], ids=lambda t: f"{t}t")
def threads(request):
    lib.tl_set_num_threads(request.param)
    yield request.param
    lib.tl_set_num_threads(0)
    lib.tl_cpu_set_dot(-1)


def _bits(t):
    """The uint16 storage of a bfloat16 tensor, as a NumPy array of the same shape and strides."""
    return t.view(torch.int16).numpy().view(np.uint16)


def _gemm_bf16(ta, tb, m, n, k, a, b, dot):
    """C = op(a) op(b) on the C runtime (bfloat16 storage in, bfloat16 out) as float32, with vdpbf16ps or not."""
    lib.tl_cpu_set_dot(int(dot))
    assert lib.tl_cpu_bf16_dot() == int(dot)
    c = np.full((m, n), 0x7FC0, np.uint16)  # NaN: every element must be written
    rt.call(lib.tl_gemm_bf16_batched2, 1, 1, ta, tb, m, n, k, a, a.strides[0] // 2, 0, 0, b, b.strides[0] // 2, 0, 0,
            c, n, 0, 0)
    return torch.from_numpy(c.view(np.int16)).view(torch.bfloat16).float().numpy().astype(np.float64)


def _check(ta, tb, m, n, k, pad, seed):
    rng = np.random.default_rng(seed)
    ashape, bshape = ((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))
    # rows `pad` values apart beyond their length: lda, ldb > their rows (and odd lda: pairs at 2-byte addresses)
    a_t = torch.from_numpy(rng.standard_normal((ashape[0], ashape[1] + pad[0])).astype(np.float32)).bfloat16()
    b_t = torch.from_numpy(rng.standard_normal((bshape[0], bshape[1] + pad[1])).astype(np.float32)).bfloat16()
    a_t, b_t = a_t[:, :ashape[1]], b_t[:, :bshape[1]]
    a, b = _bits(a_t), _bits(b_t)
    got = _gemm_bf16(ta, tb, m, n, k, a, b, True)
    fallback = _gemm_bf16(ta, tb, m, n, k, a, b, False)
    op_a, op_b = (a_t.T if ta else a_t), (b_t.T if tb else b_t)
    want = (op_a @ op_b).float().numpy().astype(np.float64)
    exact = op_a.double() @ op_b.double()
    mag = (op_a.double().abs() @ op_b.double().abs()).numpy()
    exact = exact.numpy()
    order = 2 * k * EPS32 * mag + 1e-30
    for other, bound in ((fallback, EPS * np.abs(fallback) + order), (want, EPS * np.abs(want) + order),
                         (exact, EPS / 2 * np.abs(exact) + order / 2)):
        err = np.abs(got - other)
        bad = ~(err <= bound)  # NaN too
        assert not bad.any(), f"{bad.sum()} of {bad.size} off, worst err/bound {np.nanmax(err / bound):.3g}"


dims = st.one_of(st.sampled_from([5, 13, 14, 15, 31, 32, 33, 63, 127, 129]), st.integers(5, 200))
kdims = st.one_of(st.sampled_from([1, 2, 3, 7, 31, 32, 33, 255, 257, 513]), st.integers(1, 600))
shared = settings(suppress_health_check=[*settings.default.suppress_health_check, HealthCheck.function_scoped_fixture])


@shared
@given(m=dims, n=dims, k=kdims, ta=st.booleans(), tb=st.booleans(), pad=st.tuples(*[st.sampled_from([0, 1, 6])] * 2),
       seed=st.integers(0, 2 ** 32 - 1))
def test_bf16_dot_random_shapes(threads, m, n, k, ta, tb, pad, seed):
    _check(int(ta), int(tb), m, n, k, pad, seed)


@shared
@given(m=dims, n=st.integers(1, 4), k=kdims, ta=st.booleans(), tb=st.booleans(), seed=st.integers(0, 2 ** 32 - 1))
def test_bf16_dot_few_columns(threads, m, n, k, ta, tb, seed):
    """N <= 4 (float32 would take the GEMV): one ragged strip of B."""
    _check(int(ta), int(tb), m, n, k, (0, 0), seed)


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_bf16_dot_across_blocks(threads, ta, tb):
    """KC = 25 (odd: each K block ends in a padded pair), MC two strips, NC three: several blocks each way."""
    mr, nr = 14, 32
    try:
        lib.tl_sgemm_set_blocking(BF16_PLAN, 25, 2 * mr, 3 * nr)
        _check(ta, tb, 5 * mr + 3, 7 * nr + 5, 101, (1, 0), 7)
    finally:
        lib.tl_sgemm_set_blocking(BF16_PLAN, 0, 0, 0)


def test_bf16_dot_follows_the_switch_and_path():
    """On only where turned on and the path is avx2 or avx512: the portable path keeps the widening fallback."""
    try:
        lib.tl_cpu_set_path(0)
        assert lib.tl_cpu_bf16_dot() == 0
        lib.tl_cpu_set_path(1)
        assert lib.tl_cpu_bf16_dot() == 1
        lib.tl_cpu_set_dot(0)
        assert lib.tl_cpu_bf16_dot() == 0
    finally:
        lib.tl_cpu_set_path(-1)
        lib.tl_cpu_set_dot(-1)
