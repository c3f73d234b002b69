"""The C runtime's matrix kernels for 16-bit floats and quantized weights (runtime_c/sgemm_formats.c, qmatmul.c), on
every CPU path this machine has (compiler.set_path, as tests/test_cpu_paths.py does).

float16 / bfloat16 MATMUL (both operands and the result of one dtype, as torch): the sgemm widens while packing,
sums in float32 and rounds each result once to nearest even. Against the NumPy runtime, which computes the same
float32 product and rounds it the same way, the sums differ by their order only: |C - C_np| <= eps(dtype) |C_np|
(one rounding step either way) + 2 K eps32 (|A| |B|) (the classic bound for two K-term float32 sums). Against
torch (CPU, same dtypes) the bound is looser where torch rounds its own way: 2 eps(dtype) (|A| |B|) + that.
Gradients (of sum(C * W), W fixed) go through the same kernel and get the same bound against torch's.

QMATMUL (int8, int4) against an independent NumPy dequantization in float64: the kernels sum a group on the
whole-number weights and scale it once, so they differ from x dequant(W)^T by summation order only:
|y - y_ref| <= 1e-5 (|x| |W'|^T). A K that is not a multiple of the group has its storage padded to whole groups;
the kernels must read the first K columns only, so there the padding holds random values, which would show."""
import numpy as np
import pytest
import torch

import tinyllm as tl
from tinyllm import dtype as dt
from tinyllm.graph import build
from tinyllm.runtime import get
from tinyllm.runtime.c.runtime import CRuntime

LOW = {"float16": (tl.float16, torch.float16, 2.0 ** -10), "bfloat16": (tl.bfloat16, torch.bfloat16, 2.0 ** -7)}
EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture
def c_calls(monkeypatch):
    """The ops whose C handler ran (returned an array rather than leaving the op to its NumPy forward)."""
    ran = []
    for op in ("MATMUL", "QMATMUL"):
        def spy(runtime, node, ins, _handler=CRuntime.kernels[op], _op=op):
            out = _handler(runtime, node, ins)
            if out is not None:
                ran.append(_op)
            return out
        monkeypatch.setitem(CRuntime.kernels, op, spy)
    return ran


def _low(rng, shape, name):
    """float32 values that the dtype holds exactly."""
    x = rng.standard_normal(shape).astype(np.float32)
    return torch.from_numpy(x).to(LOW[name][1]).float().numpy()


# (a's stored shape, b's stored shape, a transposed, b transposed): op(a) @ op(b), rows M = 1..4 (the GEMV's
# range), odd sizes, transposed views and batches (one side broadcast, and both batched)
CASES = [((1, 8), (8, 5), 0, 0), ((2, 17), (17, 33), 0, 0), ((3, 64), (40, 64), 0, 1), ((4, 33), (33, 70), 0, 0),
         ((9, 5), (9, 19), 1, 0), ((37, 130), (130, 23), 0, 0), ((70, 31), (45, 70), 1, 1),
         ((20, 300), (65, 300), 0, 1), ((2, 3, 7, 24), (24, 13), 0, 0), ((3, 21, 5), (3, 21, 6), 1, 0),
         ((2, 1100), (1100, 33), 0, 0), ((1, 1100), (37, 1100), 0, 1),  # the GEMV widens W in several chunks
         ((1, 384), (400, 384), 0, 1), ((2, 384), (384, 400), 0, 0)]  # GEMVs big enough for two threads


def _view(t, trans):
    return t.transpose(-1, -2) if trans else t


@pytest.mark.parametrize("name", list(LOW))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}t{c[2]}{c[3]}")
def test_low_matmul(cpu_path, c_calls, name, case):
    (ashape, bshape, ta, tb), (dtype, tdtype, eps) = case, LOW[name]
    rng = np.random.default_rng(sum(ashape) * 7 + sum(bshape))
    a, b = _low(rng, ashape, name), _low(rng, bshape, name)
    out = {}
    for device in ("c", "numpy"):
        x, y = (tl.tensor(v, device=device).to(dtype).requires_grad_() for v in (a, b))
        c = _view(x, ta) @ _view(y, tb)
        assert c.dtype is dtype
        w = tl.tensor(np.linspace(-1, 1, c.numel(), dtype=np.float32).reshape(c.shape), device=device)
        (c.float() * w).sum().backward()
        out[device] = [t.float().numpy() for t in (c, x.grad, y.grad)]
    assert "MATMUL" in c_calls  # the C kernel ran, not the NumPy fallback
    ta_, tb_ = (torch.from_numpy(v).to(tdtype).requires_grad_() for v in (a, b))
    tc = _view(ta_, ta) @ _view(tb_, tb)
    (tc.float() * torch.from_numpy(w.numpy())).sum().backward()
    want = [t.detach().float().numpy() for t in (tc, ta_.grad, tb_.grad)]
    # |A| |B| and its gradients |W| |B|^T, |A|^T |W| (summed over a broadcast batch), elementwise, in float64
    ma, mb = (torch.from_numpy(np.abs(v).astype(np.float64)).requires_grad_() for v in (a, b))
    mc = _view(ma, ta) @ _view(mb, tb)
    (mc * torch.from_numpy(np.abs(w.numpy()).astype(np.float64))).sum().backward()
    mags = [t.detach().numpy() for t in (mc, ma.grad, mb.grad)]
    n_terms = max(a.shape[-2:]) * max(b.shape[-2:]) * c.numel() // (c.shape[-1] * c.shape[-2])  # a bound for each
    for got, np_val, torch_val, mag in zip(out["c"], out["numpy"], want, mags):
        order = 2 * n_terms * EPS32 * mag
        np.testing.assert_array_less(np.abs(got - np_val), eps * np.abs(np_val) + order + 1e-30)
        np.testing.assert_array_less(np.abs(got - torch_val), 2 * eps * mag + order + 1e-30)


@pytest.mark.parametrize("name", list(LOW))
def test_low_matmul_rounds_once_to_nearest_even(cpu_path, name):
    """K = 1: each result is one float32 product, exact (the operands have at most 11 significant bits), so the C
    result must be that product rounded to nearest even: halfway cases, subnormals, overflow to inf, NaN. (A
    zero compares equal to either sign: a sum of products starting from +0 may give +0 for -0.)"""
    dtype = LOW[name][0]
    rng = np.random.default_rng(3)
    a = np.concatenate([_low(rng, 60, name) * 2.0 ** rng.integers(-20, 20, 60),
                        [3e2, 1e-4, 2.0 ** -12, np.inf, np.nan, 1.0 + 2 ** -10, 0.0, -0.0]]).astype(np.float32)
    b = np.concatenate([_low(rng, 40, name) * 2.0 ** rng.integers(-20, 20, 40),
                        [3e2, 1e-4, 2.0 ** -12, 1.0 + 2 ** -10, 3.0, -1.0]]).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        a, b = (np.asarray(dt.decode(dt.encode(v, dtype), dtype), np.float32) for v in (a, b))
        want = np.asarray(dt.decode(dt.encode(a[:, None] * b[None, :], dtype), dtype), np.float32)
    got = (tl.tensor(a[:, None], device="c").to(dtype) @ tl.tensor(b[None, :], device="c").to(dtype)).float().numpy()
    np.testing.assert_array_equal(got, want)  # NaN where want has NaN


# -- QMATMUL ----------------------------------------------------------------------------------------------------

def _quantize(rng, n, k, fmt, g):
    """(qweight, scales, W') of a random weight, with W' (n, k) dequantized in float64 by the layout's definition
    (tinyllm/ops/qmatmul.py), written out independently of the library's own code. The storage holds kp columns,
    k rounded up to whole groups; the padding is random (not the zeros quantize writes): no kernel may read it."""
    kp = -(-k // g) * g
    q = rng.integers(-127, 128, (n, kp)) if fmt == "int8" else rng.integers(-8, 8, (n, kp))
    scales = (rng.random((n, kp // g)) * 0.02 + 1e-3).astype(np.float16)
    w = (q * np.repeat(scales.astype(np.float64), g, axis=1))[:, :k]
    if fmt == "int8":
        return q.astype(np.int8), scales, w
    nib = (q + 8).astype(np.uint8).reshape(n, kp // g, g)
    packed = nib[..., : g // 2] | (nib[..., g // 2:] << 4)
    return packed.reshape(n, kp // 2), scales, w


def _qmatmul_c(fmt, x, q, s, g):
    rt = get("c")
    out = np.full((x.shape[0], q.shape[0]), np.nan, np.float32)
    fn = rt.lib.tl_qmatmul_q8 if fmt == "int8" else rt.lib.tl_qmatmul_q4
    rt.call(fn, x.shape[0], q.shape[0], x.shape[1], g, x, x.strides[0] // 4, q, s, out, out.shape[1])
    return out


# (M, N, K, group): M = 1..4 on the GEMV (520 x 256: big enough for two threads), more on the sgemm; groups 8
# and 24 (not multiples of 16) on the portable kernels of every path, 48 on the vector ones with an odd step. The
# second line's K are not multiples of the group: a partial last group (on the vector GEMV, its portable tail)
QCASES = [(1, 7, 64, 32), (2, 33, 96, 32), (3, 17, 256, 128), (4, 50, 384, 32), (1, 520, 256, 32), (1, 24, 48, 48),
          (3, 9, 24, 8), (2, 5, 72, 24), (5, 40, 64, 32), (13, 70, 384, 32), (37, 130, 256, 128), (9, 10, 24, 8),
          (1, 7, 37, 32), (2, 33, 100, 32), (4, 9, 75, 16), (3, 6, 5, 8), (1, 520, 250, 32), (1, 12, 301, 128),
          (2, 5, 70, 24), (5, 40, 70, 32), (13, 70, 390, 32), (37, 130, 200, 128), (9, 10, 21, 8)]


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("case", QCASES, ids=lambda c: "M{}N{}K{}g{}".format(*c))
def test_qmatmul_kernel(cpu_path, fmt, case):
    M, N, K, g = case
    rng = np.random.default_rng(M * 1000 + N + K + g)
    q, s, w = _quantize(rng, N, K, fmt, g)
    x = rng.standard_normal((M, K + 3)).astype(np.float32)[:, :K]  # rows K + 3 apart: ldx > K (not read)
    got = _qmatmul_c(fmt, x, q, s, g)
    want = x.astype(np.float64) @ w.T
    np.testing.assert_array_less(np.abs(got - want), 1e-5 * (np.abs(x) @ np.abs(w).T) + 1e-30)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("M", [1, 4, 6])
def test_qmatmul_op_on_c(cpu_path, c_calls, fmt, M):
    """The QMATMUL op runs runtime_c/qmatmul.c on the C runtime and agrees with the NumPy runtime's forward; its
    input gradient too."""
    N, K, g = 24, 64, 32
    rng = np.random.default_rng(M)
    q, s, w = _quantize(rng, N, K, fmt, g)
    x = rng.standard_normal((M, K)).astype(np.float32)
    res = {}
    for device in ("c", "numpy"):
        xt = tl.tensor(x, device=device, requires_grad=True)
        qt, st = tl.tensor(q, device=device), tl.tensor(s, device=device)
        y = xt._make(build("QMATMUL", xt.node, qt.node, st.node, arg=(fmt, g)))
        (y * y).sum().backward()
        res[device] = (y.numpy(), xt.grad.numpy())
    assert "QMATMUL" in c_calls
    bound = np.abs(x) @ np.abs(w).T
    np.testing.assert_array_less(np.abs(res["c"][0] - res["numpy"][0]), 1e-5 * bound + 1e-30)
    np.testing.assert_allclose(res["c"][1], res["numpy"][1], rtol=1e-4, atol=1e-4 * np.abs(res["numpy"][1]).max())
