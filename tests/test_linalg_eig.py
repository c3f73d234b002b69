"""tinyllm.linalg.eig / eigvals against torch.linalg's: complex results (complex64 of float32, complex128 of
float64), values, A V = V diag(L), gradients on every runtime (float32), gradcheck and a second order in float64 on
the NumPy runtime, return type, errors.

Inputs: random real matrices (n 1..4, zero or one batch axis) kept only when their eigenvalues are at least 0.3
apart (a complex pair: 2 |Im λ| >= 0.3) and their eigenvector matrix has condition number <= 30, so 1 / (λ_j − λ_i)
and V⁻¹ in the backward stay moderate. Eigenvalues are compared as sets (each matched to its nearest in torch's:
LAPACK builds may order them differently); eigenvectors only through what does not depend on their phase
(|V|, A V − V diag(L)), since a column is unique up to e^{iφ} (and LAPACK builds pick different signs).
Losses are phase-invariant: Σ (Re λ · w₁ + Im λ · w₂) + Σ |V| ∘ W, the weights carried along the matching so that
the same eigenpair gets the same weight in both libraries.
Tolerances (float32, rtol / atol): values 1e-4 / 1e-5, A V − V diag(L) 1e-4 times max|A|, gradients 1e-3 / 1e-4
times max|grad| (float32 LAPACK against torch's, then a backward of products and a 2n x 2n solve rounding in another
order; 300 drawn cases came within 1e-5 of max|grad|); gradcheck in float64 with its defaults (eps 1e-6, atol 1e-5,
rtol 1e-3)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from tinyllm.gradcheck import gradcheck
from helpers import SEEDS

pytestmark = pytest.mark.usefixtures("each_runtime")
FEW = settings(max_examples=6, deadline=None)
BATCH = st.lists(st.integers(1, 3), min_size=0, max_size=1).map(tuple)
SIDE = st.integers(1, 4)


def _good(a):
    w, v = np.linalg.eig(a.astype(np.float64))
    n = a.shape[-1]
    gaps = np.abs(w[..., :, None] - w[..., None, :]) + np.eye(n) * 1e9
    return gaps.min(initial=1e9) >= 0.3 and np.linalg.cond(v).max(initial=1.0) <= 30


def general(rng, batch, n, dtype=np.float32):
    """A random real matrix with well-separated eigenvalues and well-conditioned eigenvectors (module docstring)."""
    for _ in range(1000):
        a = rng.standard_normal(batch + (n, n))
        if _good(a):
            return a.astype(dtype)
    raise AssertionError("no well-separated matrix drawn")


def _match(got, want):
    """For each of got's eigenvalues (..., n) the index of the nearest of want's, checked to be a permutation."""
    idx = np.abs(got[..., :, None] - want[..., None, :]).argmin(-1)
    assert (np.sort(idx, -1) == np.arange(got.shape[-1])).all(), f"eigenvalues do not match: {got} vs {want}"
    return idx


def _take(x, idx, axis):
    """x's entries along `axis` (-1 for vectors of eigenvalues, columns of a matrix) picked by idx (..., n)."""
    if axis == -1:
        return np.take_along_axis(x, idx, -1)
    return np.take_along_axis(x, np.broadcast_to(idx[..., None, :], x.shape), -1)


def _leaves(batch, n, seed):
    """rng, the drawn matrix, and a tinyllm and a torch leaf of it."""
    rng = np.random.default_rng(seed)
    a = general(rng, batch, n)
    return rng, a, tl.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


def _weights(rng, idx, shape, axis):
    """Random float32 weights for torch's eigenpairs, and the same weights carried to tinyllm's through idx."""
    w = rng.standard_normal(shape)
    return torch.tensor(w.astype(np.float32)), tl.tensor(_take(w, idx, axis).astype(np.float32))


def _same_grad(x, t):
    want = t.grad.numpy()
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-3, atol=1e-4 * max(1.0, np.abs(want).max()))


@FEW
@given(batch=BATCH, n=SIDE, seed=SEEDS)
def test_eig_values_vectors_and_gradients(batch, n, seed):
    rng, a, x, t = _leaves(batch, n, seed)
    L, V = tl.linalg.eig(x)
    tL, tV = torch.linalg.eig(t)
    assert L.dtype is tl.complex64 and V.dtype is tl.complex64
    assert tuple(L.shape) == batch + (n,) and tuple(V.shape) == batch + (n, n)
    ln, vn, tln, tvn = L.numpy(), V.numpy(), tL.detach().numpy(), tV.detach().numpy()
    assert ln.dtype == np.complex64 and vn.dtype == np.complex64
    idx = _match(ln, tln)
    np.testing.assert_allclose(ln, _take(tln, idx, -1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.abs(vn), np.abs(_take(tvn, idx, -2)), rtol=1e-4, atol=1e-5)
    scale = max(1.0, np.abs(a).max())
    np.testing.assert_allclose(a @ vn, vn * ln[..., None, :], atol=1e-4 * scale)  # A V = V diag(L)
    np.testing.assert_allclose(np.linalg.norm(vn, axis=-2), 1, atol=1e-5)  # unit-norm columns
    assert np.array_equal(tl.linalg.eigvals(tl.tensor(a)).numpy(), ln)
    # (A V − V diag(L)) through tinyllm's own complex ops: zero up to rounding
    res = (tl.tensor(a) @ V - V * L.unsqueeze(-2)).abs().numpy()
    assert res.max(initial=0) <= 1e-4 * scale

    (tw1, lw1), (tw2, lw2) = (_weights(rng, idx, batch + (n,), -1) for _ in range(2))
    tW, lW = _weights(rng, idx, batch + (n, n), -2)
    ((tL.real * tw1).sum() + (tL.imag * tw2).sum() + (tV.abs() * tW).sum()).backward()
    ((L.real * lw1).sum() + (L.imag * lw2).sum() + (V.abs() * lW).sum()).backward()
    _same_grad(x, t)


@FEW
@given(batch=BATCH, n=SIDE, seed=SEEDS)
def test_eigvals_gradient(batch, n, seed):
    """The eigenvalues alone (eigvals): a loss of their real and imaginary parts, and a symmetric one, Σ |λ|²."""
    rng, a, x, t = _leaves(batch, n, seed)
    L, tL = tl.linalg.eigvals(x), torch.linalg.eigvals(t)
    assert L.dtype is tl.complex64 and tuple(L.shape) == batch + (n,)
    idx = _match(L.numpy(), tL.detach().numpy())
    (tw1, lw1), (tw2, lw2) = (_weights(rng, idx, batch + (n,), -1) for _ in range(2))
    ((tL.real * tw1).sum() + (tL.imag * tw2).sum() + (tL.abs() ** 2).sum()).backward()
    ((L.real * lw1).sum() + (L.imag * lw2).sum() + (L.abs() * L.abs()).sum()).backward()
    _same_grad(x, t)


def test_eig_of_a_rotation_and_a_diagonal():
    """Known spectra: a 2 x 2 rotation by θ has e^{±iθ}; a diagonal matrix its diagonal, V = I up to signs."""
    th = 0.7
    r = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]], np.float32)
    L = tl.linalg.eigvals(tl.tensor(r)).numpy()
    np.testing.assert_allclose(np.sort_complex(L), np.sort_complex(np.exp([1j * th, -1j * th])), atol=1e-6)
    L, V = tl.linalg.eig(tl.tensor(np.diag([3.0, -1.0, 2.0]).astype(np.float32)))
    np.testing.assert_allclose(L.numpy(), [3, -1, 2], atol=1e-6)
    np.testing.assert_allclose(np.abs(V.numpy()), np.eye(3), atol=1e-6)


def test_float64_and_empty(each_runtime):
    if each_runtime != "wgsl":  # (WebGPU has no float64)
        a = general(np.random.default_rng(1), (2,), 3, np.float64)
        L, V = tl.linalg.eig(tl.tensor(a))
        assert L.dtype is tl.complex128 and V.dtype is tl.complex128
        np.testing.assert_allclose(a @ V.numpy(), V.numpy() * L.numpy()[..., None, :], atol=1e-12)
    L, V = tl.linalg.eig(tl.zeros(2, 0, 0))
    assert tuple(L.shape) == (2, 0) and tuple(V.shape) == (2, 0, 0) and L.dtype is tl.complex64
    assert tuple(tl.linalg.eigvals(tl.zeros(0, 3, 3)).shape) == (0, 3)


def test_return_type():
    got = tl.linalg.eig(tl.eye(3))
    assert type(got).__name__ == type(torch.linalg.eig(torch.eye(3))).__name__ == "linalg_eig"
    assert got._fields == ("eigenvalues", "eigenvectors")


def test_errors():
    for name in ("eig", "eigvals"):
        fn = getattr(tl.linalg, name)
        with pytest.raises(RuntimeError, match=f"linalg.{name}: A must be batches of square matrices, but they are "
                                               "2 by 3 matrices"):
            fn(tl.zeros(2, 3))
        with pytest.raises(RuntimeError, match=f"linalg.{name}: The input tensor A must have at least 2 dimensions"):
            fn(tl.zeros(3))
        for dtype, torch_name in ((tl.float16, "Half"), (tl.bfloat16, "BFloat16")):
            with pytest.raises(RuntimeError, match=f"linalg.{name}: Low precision dtypes not supported. Got "
                                                   f"{torch_name}"):
                fn(tl.eye(3, dtype=dtype))
        with pytest.raises(RuntimeError, match="floating point"):
            fn(tl.zeros(3, 3, dtype=tl.int64))
        with pytest.raises(NotImplementedError, match=f"linalg.{name}: complex input"):
            fn(tl.zeros(3, 3, dtype=tl.complex64))
    nan = np.array([[np.nan, 1], [0, 1]], np.float32)
    with pytest.raises(tl.linalg.LinAlgError, match="linalg.eig: input tensor should not contain infs or NaNs"):
        tl.linalg.eigvals(tl.tensor(nan)).numpy()


def test_gradcheck_float64(each_runtime):
    if each_runtime != "numpy":
        pytest.skip("gradcheck runs on the NumPy reference runtime")
    rng = np.random.default_rng(3)
    a = general(rng, (2,), 3, np.float64)
    w1, w2, W = rng.standard_normal((2, 3)), rng.standard_normal((2, 3)), rng.standard_normal((2, 3, 3))

    def loss(x):
        L, V = tl.linalg.eig(x)
        return (L.real * tl.tensor(w1)).sum() + (L.imag * tl.tensor(w2)).sum() + (V.abs() * tl.tensor(W)).sum()
    assert gradcheck(loss, [tl.tensor(a, requires_grad=True)])
    assert gradcheck(lambda x: (tl.linalg.eigvals(x).abs() ** 1).sum(), [tl.tensor(a, requires_grad=True)])


def test_second_order(each_runtime):
    """The backward is graph math (EIG, SOLVE, products), so it differentiates again: a Hessian-vector product of
    Σ Re(λ)³ + Σ |V| ∘ W against torch's create_graph=True (float64)."""
    if each_runtime != "numpy":
        pytest.skip("float64 second order on the NumPy reference runtime")
    from tinyllm.autograd import gradients
    from tinyllm.graph import const
    rng = np.random.default_rng(0)
    a = general(rng, (), 3, np.float64)
    v, W = rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    x = tl.tensor(a, requires_grad=True)
    t = torch.tensor(a, requires_grad=True)
    L, V = tl.linalg.eig(x)
    tL, tV = torch.linalg.eig(t)
    idx = _match(L.numpy(), tL.detach().numpy())
    y = (L.real ** 3).sum() + (V.abs() * tl.tensor(_take(W, idx, -2))).sum()
    grad = x._make(gradients(y._node, const(1.0, (), y._node.dtype), [x._node])[x._node])
    (grad * tl.tensor(v)).sum().backward()
    ty = (tL.real ** 3).sum() + (tV.abs() * torch.tensor(W)).sum()
    (tg,) = torch.autograd.grad(ty, t, create_graph=True)
    (tg * torch.tensor(v)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), atol=1e-8, rtol=1e-6)

