"""The int8 and int4 GEMV on AVX512_VNNI (runtime_c/qmatmul_fixed.c): weight-only QMATMUL with x turned into fixed
point per group, x_t ≈ X_t 2^(e_G − B) with X_t = rint(x_t 2^(B − e_G)) and max_G |x| < 2^e_G (B = 22 for int4, 21 for
int8), and the products exact on vpdpbusd.

Two checks, on hypothesis-drawn shapes (groups of 32 to 128, partial last groups and blocks, 1 to 4 rows of x) and on
activations far below their group's largest (2^0 to 2^-30 of it):
  - the definition: torch computing x̃ · dequant(W)ᵀ in float64 from the bytes, x̃ the fixed point above; the kernel
    within 1e-5 of Σ|x̃·w| (float32 sums in another order: weight-only's own tolerance, tests/test_quantization.py).
    That pins the digits, the lanes, the offsets and the scales: a kernel that used x itself fails it where x̃ ≠ x;
  - the accuracy the module promises against x itself: within Σ_G 2^-B max_G|x| Σ_{t∈G}|w_t| beyond that.
Without the instructions (tl_cpu_set_dot(0)), or with inf or NaN in x, the float kernel (qmatmul.c) runs: the same
results as it gives, bit for bit. The dynamic path's int8 activations run on the same kernel with one digit: checked
here for the order of its sums and against their definition over many groups (tests/test_quantization_dynamic.py
checks that definition on every kernel).
"""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from tinyllm import quantization as Q
from tinyllm._kernels import lib
from tinyllm.graph import build
from test_quantization import torch_dequant
from test_quantization_dynamic import torch_dynamic

BITS = {"int4": 22, "int8": 21}  # B per format (QFIX_BITS)
formats = pytest.mark.parametrize("fmt", list(BITS))
pytestmark = pytest.mark.skipif(not lib.tl_cpu_int8_dot(), reason="the fixed-point GEMV needs AVX512_VNNI (and the "
                                "dot-product instructions on, a path >= avx2: runtime_c/cpu.h)")


def fixed_point(x, g, bits):
    """x̃ (float64) as the kernel sees it: each group of g columns (the last zero-padded) rounded to multiples of
    2^(e − bits), max |x| < 2^e over the group (e >= -100)."""
    m, k = x.shape
    kp = -(-k // g) * g
    xg = np.pad(x.astype(np.float64), ((0, 0), (0, kp - k))).reshape(m, kp // g, g)
    e = np.maximum(np.frexp(np.abs(xg).max(-1))[1], -100)[..., None]
    return (np.rint(np.ldexp(xg, bits - e)) * np.ldexp(1.0, e - bits)).reshape(m, kp)[:, :k]


def run(x, q, s, g, k, fmt, dynamic=False):
    """QMATMUL on the C runtime; dynamic: x quantized to int8 at run time (the one-digit kernel)."""
    X = tl.tensor(x, device="c")
    arg = (fmt, g, k, "int8") if dynamic else (fmt, g) if k % g == 0 else (fmt, g, k)
    return X._make(build("QMATMUL", X.node, tl.Tensor(q, device="c").node, tl.Tensor(s, device="c").node,
                         arg=arg)).numpy()


@formats
@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 4), n=st.integers(1, 9), groups=st.integers(1, 12), g=st.sampled_from([32, 64, 96, 128]),
       short=st.integers(0, 127), below=st.integers(0, 30), seed=st.integers(0, 2**32 - 1))
def test_the_fixed_point_gemv_is_its_definition_and_keeps_its_bound(fmt, m, n, groups, g, short, below, seed):
    rng = np.random.default_rng(seed)
    k = groups * g - short % g
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[rng.random((n, k)) < 0.1] = 0.0
    x = rng.standard_normal((m, k)).astype(np.float32)
    x *= np.ldexp(1.0, -below * (rng.random((m, k)) < 0.7)).astype(np.float32)  # most far below their group's top
    x[rng.random((m, k)) < 0.05] = 0.0
    q, s = Q.quantize(w, fmt, g)
    W = torch_dequant(q, s, fmt, g, k).double().numpy()
    xt = fixed_point(x, g, BITS[fmt])
    y = run(x, q, s, g, k, fmt)

    want = torch.from_numpy(xt) @ torch.from_numpy(W).T
    assert np.all(np.abs(y - want.numpy()) <= 1e-5 * (np.abs(xt) @ np.abs(W).T) + 1e-30)

    exact = x.astype(np.float64) @ W.T
    kp = -(-k // g) * g
    top = np.abs(np.pad(x, ((0, 0), (0, kp - k)))).reshape(m, -1, g).max(-1)  # (m, groups)
    wsum = np.abs(np.pad(W, ((0, 0), (0, kp - k)))).reshape(n, -1, g).sum(-1)  # (n, groups)
    bound = np.ldexp(top, -BITS[fmt]) @ wsum.T + 1e-5 * (np.abs(x) @ np.abs(W).T) + 1e-30
    assert np.all(np.abs(y - exact) <= bound)


@formats
def test_an_activation_far_below_its_group_top_keeps_the_fixed_points_bits(fmt):
    """The case the definition check discriminates: one activation of 1.0 whose weight is 0, the others 2^-20 of it,
    so x̃ keeps 1 (int8) or 2 (int4) of their bits and the result is theirs alone: the kernel gives x̃'s result
    (within float32's rounding), which is not x's, nor the float kernel's (tl_cpu_set_dot(0)): the check tells the
    kernels apart."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    w[:, 0] = 0.0
    x = (rng.standard_normal((1, 32)) * 2.0**-20).astype(np.float32)
    x[0, 0] = 1.0
    q, s = Q.quantize(w, fmt, 32)
    W = torch_dequant(q, s, fmt, 32).double().numpy()
    xt = fixed_point(x, 32, BITS[fmt])
    fixed, exact = xt @ W.T, x.astype(np.float64) @ W.T
    tol = 1e-5 * (np.abs(xt) @ np.abs(W).T)
    assert np.all(np.abs(fixed - exact) > 100 * tol)  # the two definitions are far apart here
    assert np.all(np.abs(run(x, q, s, 32, 32, fmt) - fixed) <= tol)
    lib.tl_cpu_set_dot(0)
    try:
        assert np.all(np.abs(run(x, q, s, 32, 32, fmt) - fixed) > 100 * tol)
    finally:
        lib.tl_cpu_set_dot(-1)


def test_int8_sums_stay_exact_at_the_extremes():
    """The int8 lanes' bound (the module's 4 x 128 x 2^21 = 2^30): every weight -128 or 127 (stored bytes, -128 too,
    though quantize never writes it) against activations at their group's top, of either sign and of alternating
    signs, so each lane's sum w X is as large as it gets: the kernel is its definition still."""
    n, k = 8, 256
    x = np.full((3, k), 1.9999999, np.float32)  # X = 2^21 (rounded up to the group's 2^e)
    x[1, 1::2] *= -1
    x[2] *= -1
    q = np.where(np.arange(n * k).reshape(n, k) % 3 == 0, 127, -128).astype(np.int8)
    q[1] = -128
    q[2, ::2], q[2, 1::2] = -128, 127
    s = np.full((n, k // 32), 0.5, np.float16)
    W = torch_dequant(q, s, "int8", 32).double().numpy()
    want = fixed_point(x, 32, BITS["int8"]) @ W.T
    np.testing.assert_allclose(run(x, q, s, 32, k, "int8"), want, rtol=1e-6)


@formats
def test_inf_or_nan_in_x_runs_the_float_kernel(fmt):
    rng = np.random.default_rng(1)
    q, s = Q.quantize(rng.standard_normal((6, 256)).astype(np.float32), fmt, 32)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    x[0, 5], x[1, 200] = np.inf, np.nan
    got = run(x, q, s, 32, 256, fmt)
    lib.tl_cpu_set_dot(0)
    try:
        want = run(x, q, s, 32, 256, fmt)
    finally:
        lib.tl_cpu_set_dot(-1)
    np.testing.assert_array_equal(got, want)  # (NaN where NaN)
    assert np.isnan(got[1]).all() and np.isfinite(got[2]).all()


@formats
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_a_row_of_y_is_the_same_bits_however_the_rows_of_w_are_taken(fmt, m, dynamic):
    """The kernel takes rows of W several at a time (QFIX_ROWS_FOR(M)), the rest one by one, and threads split the
    rows anywhere: each output is summed in one order all the same, so y is the same bits from the whole W on one
    thread, on two, and from each row of W alone. With int8 activations (dynamic: x's one digit) y is also the
    dynamic path's definition (tests/test_quantization_dynamic.py's, in torch) over these 128 groups."""
    rng = np.random.default_rng(m)
    n, k = 37, 4096  # 37 rows: whole steps and a rest; n k / 2^16 > 2, so two threads split them
    q, s = Q.quantize(rng.standard_normal((n, k)).astype(np.float32), fmt, 32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    alone = np.concatenate([run(x, q[j:j + 1], s[j:j + 1], 32, k, fmt, dynamic) for j in range(n)], axis=1)
    for threads in (1, 2):
        lib.tl_set_num_threads(threads)
        try:
            np.testing.assert_array_equal(run(x, q, s, 32, k, fmt, dynamic), alone)
        finally:
            lib.tl_set_num_threads(0)
    if dynamic:
        want, scale = torch_dynamic(x, q, s, fmt, 32, k)
        assert np.all(np.abs(alone - want) <= 1e-5 * scale)
