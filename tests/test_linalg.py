"""tinyllm.linalg's decompositions (svd, svdvals, eigh, eigvalsh, qr, cholesky, solve, inv, det, slogdet, lstsq,
pinv, matrix_rank) against torch.linalg: values and every input's gradient on every runtime (float32, shapes and
batch axes from hypothesis), gradcheck in float64 on the NumPy runtime, return types, errors.

Inputs are well-conditioned: symmetric ones Q diag(s) Qᵀ with s in [1, 3] spaced at least 0.4 apart (so the
eigenvector gradients' 1 / (λ_j − λ_i) stay small), SVD inputs U diag(s) Vᵀ the same way, A Aᵀ + n I for cholesky,
and a random matrix plus 3 I for solve / inv / det. Singular / eigenvectors have a sign LAPACK picks, so their
tests compare what does not depend on it: U diag(S) Vh, U Vh, |U|, V diag(L) Vᵀ, |V|.
Tolerances (float32, rtol / atol): values 1e-4 / 1e-5, gradients 1e-3 / 1e-4 (LAPACK in float32 against torch's
float32 LAPACK, the backward's products and solves rounding in another order); gradcheck in float64 with its
defaults (eps 1e-6, atol 1e-5, rtol 1e-3)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from tinyllm.gradcheck import gradcheck
from helpers import SEEDS, helper_test_op

pytestmark = pytest.mark.usefixtures("each_runtime")
TOL = {"forward": (1e-4, 1e-5), "grad": (1e-3, 1e-4)}
FEW = settings(max_examples=6, deadline=None)
BATCH = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)
SIDE = st.integers(1, 5)


def _orth(rng, batch, n):
    q, _ = np.linalg.qr(rng.standard_normal(batch + (n, n)))
    return q


def _spread(rng, batch, n):
    """n values in [1, 3], at least 0.4 apart, shuffled."""
    return rng.permuted(1.0 + 0.4 * np.arange(n) + rng.uniform(0, 0.1, batch + (n,)), axis=-1)


def sym(rng, batch, n, dtype=np.float32):
    q, s = _orth(rng, batch, n), _spread(rng, batch, n)
    a = q @ (s[..., None] * np.swapaxes(q, -1, -2))
    return ((a + np.swapaxes(a, -1, -2)) / 2).astype(dtype)


def spd(rng, batch, n, dtype=np.float32):
    x = rng.standard_normal(batch + (n, n))
    return (x @ np.swapaxes(x, -1, -2) + n * np.eye(n)).astype(dtype)


def svd_input(rng, batch, m, n, dtype=np.float32):
    k = min(m, n)
    u, v = _orth(rng, batch, m)[..., :k], _orth(rng, batch, n)[..., :k]
    return (u @ (_spread(rng, batch, k)[..., None] * np.swapaxes(v, -1, -2))).astype(dtype)


def general(rng, batch, n, dtype=np.float32):
    return (rng.standard_normal(batch + (n, n)) + 3 * np.eye(n)).astype(dtype)


def run(arrays, fn, tol=TOL):
    """fn(lib) -> the function of the inputs, run with torch and with tinyllm (values and gradients compared)."""
    return helper_test_op([a.shape for a in arrays], fn(torch), fn(tl), arrays=arrays, tol=tol)


@FEW
@given(batch=BATCH, m=SIDE, n=SIDE, full=st.booleans(), seed=SEEDS)
def test_svd(batch, m, n, full, seed):
    a = svd_input(np.random.default_rng(seed), batch, m, n)
    k = min(m, n)

    def invariant(lib):  # gauge-invariant: the product, U Vh, |U|, |Vh| (reduced columns) and S
        def f(x):
            U, S, Vh = lib.linalg.svd(x, full_matrices=full)
            U, Vh = U[..., :k], Vh[..., :k, :]
            return (U * S.unsqueeze(-2)) @ Vh, U @ Vh, U.abs(), Vh.abs(), S
        return f
    run([a], invariant)
    U, S, Vh = tl.linalg.svd(tl.tensor(a), full_matrices=full)
    assert U.shape == batch + (m, m if full else k) and Vh.shape == batch + (n if full else k, n)
    eye = np.eye(U.shape[-1], dtype=np.float32)
    np.testing.assert_allclose(np.swapaxes(U.numpy(), -1, -2) @ U.numpy(),
                               np.broadcast_to(eye, U.shape[:-2] + eye.shape),
                               atol=1e-5)


@FEW
@given(batch=BATCH, m=SIDE, n=SIDE, seed=SEEDS)
def test_svdvals(batch, m, n, seed):
    a = svd_input(np.random.default_rng(seed), batch, m, n)
    run([a], lambda lib: lambda x: lib.linalg.svdvals(x))


@FEW
@given(batch=BATCH, n=SIDE, upper=st.booleans(), seed=SEEDS)
def test_eigh(batch, n, upper, seed):
    a = sym(np.random.default_rng(seed), batch, n)
    uplo = "U" if upper else "L"

    def invariant(lib):
        def f(x):
            L, V = lib.linalg.eigh(x, UPLO=uplo)
            return L, V.abs(), (V * L.unsqueeze(-2)) @ V.transpose(-2, -1)
        return f
    run([a], invariant)
    L, V = tl.linalg.eigh(tl.tensor(a), UPLO=uplo)
    np.testing.assert_allclose(a @ V.numpy(), V.numpy() * L.numpy()[..., None, :], atol=1e-4)  # A v = λ v


@FEW
@given(batch=BATCH, n=SIDE, seed=SEEDS)
def test_eigvalsh(batch, n, seed):
    run([sym(np.random.default_rng(seed), batch, n)], lambda lib: lambda x: lib.linalg.eigvalsh(x))


@FEW
@given(batch=BATCH, m=SIDE, n=SIDE, mode=st.sampled_from(["reduced", "complete", "r"]), seed=SEEDS)
def test_qr(batch, m, n, mode, seed):
    a = svd_input(np.random.default_rng(seed), batch, m, n)
    differentiable = mode != "complete" or m <= n  # (a wide A's Q is m x m in either mode)
    if mode == "r":  # torch has no gradient for mode="r"; tinyllm's is reduced mode's R's
        helper_test_op([a.shape], lambda x: torch.linalg.qr(x).R, lambda x: tl.linalg.qr(x, mode="r").R, arrays=[a],
                       tol=TOL)
        assert tuple(tl.linalg.qr(tl.tensor(a), mode="r").Q.shape) == (0,)
    elif differentiable:
        run([a], lambda lib: lambda x: tuple(lib.linalg.qr(x, mode=mode)))
    else:  # forward only: torch has no gradient here either (complete, m > n)
        helper_test_op([a.shape], lambda x: tuple(torch.linalg.qr(x, mode=mode)),
                       lambda x: tuple(tl.linalg.qr(x, mode=mode)), arrays=[a], tol=TOL, grad=False)


@FEW
@given(batch=BATCH, n=SIDE, upper=st.booleans(), seed=SEEDS)
def test_cholesky(batch, n, upper, seed):
    run([spd(np.random.default_rng(seed), batch, n)], lambda lib: lambda x: lib.linalg.cholesky(x, upper=upper))


@FEW
@given(batch=BATCH, n=SIDE, k=st.integers(1, 3), left=st.booleans(), seed=SEEDS)
def test_solve(batch, n, k, left, seed):
    rng = np.random.default_rng(seed)
    a = general(rng, batch, n)
    b = rng.standard_normal(batch + ((n, k) if left else (k, n)))
    run([a, b.astype(np.float32)], lambda lib: lambda x, y: lib.linalg.solve(x, y, left=left))
    run([a, rng.standard_normal(n).astype(np.float32)], lambda lib: lambda x, y: lib.linalg.solve(x, y))


def test_solve_broadcasts_batch_axes():
    rng = np.random.default_rng(0)
    a, b = general(rng, (2, 1), 3), rng.standard_normal((4, 3, 2)).astype(np.float32)
    run([a, b], lambda lib: lambda x, y: lib.linalg.solve(x, y))


@FEW
@given(batch=BATCH, n=SIDE, seed=SEEDS)
def test_inv_det_slogdet(batch, n, seed):
    a = general(np.random.default_rng(seed), batch, n)
    run([a], lambda lib: lambda x: lib.linalg.inv(x))
    run([a], lambda lib: lambda x: lib.linalg.det(x))
    run([a], lambda lib: lambda x: tuple(lib.linalg.slogdet(x)))


@FEW
@given(batch=BATCH, m=SIDE, n=SIDE, k=st.integers(1, 3), seed=SEEDS)
def test_lstsq_pinv_matrix_rank(batch, m, n, k, seed):
    rng = np.random.default_rng(seed)
    a = svd_input(rng, batch, m, n)
    b = rng.standard_normal(batch + (m, k)).astype(np.float32)
    # torch's CPU default (gelsy) gives the minimum-norm solution of a full-rank A too; gelsd for m < n
    run([a, b], lambda lib: lambda x, y: lib.linalg.lstsq(x, y, **({"driver": "gelsd"} if lib is torch and m < n
                                                                       else {})).solution)
    run([a], lambda lib: lambda x: lib.linalg.pinv(x))
    want = torch.linalg.matrix_rank(torch.tensor(a)).numpy()
    np.testing.assert_array_equal(tl.linalg.matrix_rank(tl.tensor(a)).numpy(), want)
    np.testing.assert_array_equal(tl.linalg.lstsq(tl.tensor(a), tl.tensor(b)).rank.numpy(), want)


def test_matrix_rank_of_low_rank_and_tolerances():
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((2, 5, 2)) @ rng.standard_normal((2, 2, 4))).astype(np.float32)
    for kw in ({}, {"atol": 0.5}, {"rtol": 0.3}, {"atol": 0.1, "rtol": 0.1}):
        np.testing.assert_array_equal(tl.linalg.matrix_rank(tl.tensor(a), **kw).numpy(),
                                      torch.linalg.matrix_rank(torch.tensor(a), **kw).numpy())
    run([a], lambda lib: lambda x: lib.linalg.pinv(x, rtol=1e-3))


def test_return_types():
    a = tl.tensor(spd(np.random.default_rng(0), (), 3))
    for fn, fields in ((tl.linalg.svd, ("U", "S", "Vh")), (tl.linalg.eigh, ("eigenvalues", "eigenvectors")),
                       (tl.linalg.qr, ("Q", "R")), (tl.linalg.slogdet, ("sign", "logabsdet"))):
        got = fn(a)
        assert type(got).__name__ == type(getattr(torch.linalg, fn.__name__)(torch.eye(3))).__name__
        assert got._fields == fields
    r = tl.linalg.lstsq(a, a)
    assert r._fields == ("solution", "residuals", "rank", "singular_values") and r.rank.dtype is tl.int64
    assert tuple(r.residuals.shape) == (0,) and tuple(r.singular_values.shape) == (0,)


def test_degenerate_spectrum_gives_nonfinite_vector_gradients_as_torch():
    """A repeated eigenvalue: a loss of the eigenvalues has a finite gradient, one of the vectors inf / nan
    (torch's too)."""
    a = np.diag([1.0, 1.0, 2.0]).astype(np.float32)
    x = tl.tensor(a, requires_grad=True)
    tl.linalg.eigvalsh(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.eye(3), atol=1e-6)
    x = tl.tensor(a, requires_grad=True)
    tl.linalg.eigh(x).eigenvectors.sum().backward()
    t = torch.tensor(a, requires_grad=True)
    torch.linalg.eigh(t).eigenvectors.sum().backward()
    assert not np.isfinite(x.grad.numpy()).all() and not np.isfinite(t.grad.numpy()).all()


def test_errors():
    with pytest.raises(RuntimeError, match="linalg.inv: A must be batches of square matrices, but they are 2 by 3"):
        tl.linalg.inv(tl.zeros(2, 3))
    with pytest.raises(RuntimeError, match="linalg.det: A must be batches of square matrices"):
        tl.linalg.det(tl.zeros(4, 2, 3))
    for name in ("svd", "eigh", "qr", "cholesky", "inv", "det", "slogdet", "pinv", "svdvals", "eigvalsh"):
        with pytest.raises(RuntimeError, match=f"linalg.{name}: Low precision dtypes not supported. Got Half"):
            getattr(tl.linalg, name)(tl.eye(3, dtype=tl.float16))
    with pytest.raises(RuntimeError, match="Got BFloat16"):
        tl.linalg.svd(tl.eye(3, dtype=tl.bfloat16))
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        tl.linalg.svd(tl.ones(3))
    singular = np.stack([np.eye(3), np.zeros((3, 3))]).astype(np.float32)
    with pytest.raises(tl.linalg.LinAlgError, match=r"linalg.inv: \(Batch element 1\): .*singular"):
        tl.linalg.inv(tl.tensor(singular)).numpy()
    with pytest.raises(tl.linalg.LinAlgError, match=r"linalg.solve: .*singular"):
        tl.linalg.solve(tl.zeros(3, 3), tl.ones(3, 1)).numpy()
    with pytest.raises(tl.linalg.LinAlgError, match=r"linalg.cholesky: \(Batch element 1\): .*positive-definite"):
        tl.linalg.cholesky(tl.tensor(np.stack([np.eye(2), -np.eye(2)]).astype(np.float32))).numpy()
    assert issubclass(tl.linalg.LinAlgError, RuntimeError)
    sign, logabsdet = tl.linalg.slogdet(tl.zeros(3, 3))  # singular: sign 0, log|det| -inf, as torch
    assert sign.item() == 0 and logabsdet.item() == -np.inf and tl.linalg.det(tl.zeros(3, 3)).item() == 0


def _sym(x):
    """eigh and cholesky read one triangle: gradcheck perturbs symmetric pairs together, as torch's tests do."""
    return (x + x.transpose(-2, -1)) * 0.5


@pytest.mark.parametrize("name", ["svd", "eigh", "qr", "qr_wide", "cholesky", "solve", "inv", "det", "slogdet",
                                  "lstsq", "pinv"])
def test_gradcheck_float64(each_runtime, name):
    if each_runtime != "numpy":
        pytest.skip("gradcheck runs on the NumPy reference runtime")
    rng = np.random.default_rng(3)
    s, p, g = sym(rng, (2,), 3, np.float64), spd(rng, (2,), 3, np.float64), general(rng, (2,), 3, np.float64)
    r = svd_input(rng, (2,), 4, 3, np.float64)
    w = rng.standard_normal((2, 4, 3))
    cases = {
        "svd": ([r], lambda x: (lambda U, S, Vh: ((U * S.unsqueeze(-2)) @ Vh * tl.tensor(w)).sum()
                                + (U.abs() * tl.tensor(w)).sum()
                                + S.sum())(*tl.linalg.svd(x, full_matrices=False))),
        "eigh": ([s], lambda x: (lambda L, V: (L * L).sum() + (V.abs() * tl.tensor(w[:, :3])).sum())(
            *tl.linalg.eigh(_sym(x)))),
        "qr": ([r], lambda x: (lambda Q, R: (Q * tl.tensor(w)).sum() + (R * R).sum())(*tl.linalg.qr(x))),
        "qr_wide": ([svd_input(rng, (2,), 3, 5, np.float64)],  # m < n: A = [X | Y], X = Q U, Y = Q V
                    lambda x: (lambda Q, R: (Q * tl.tensor(w[:, :3])).sum() + (R * R * R).sum())(*tl.linalg.qr(x))),
        "cholesky": ([p], lambda x: (tl.linalg.cholesky(_sym(x)) * tl.tensor(w[:, :3])).sum()),
        "solve": ([g, w[:, :3, :2].copy()], lambda x, y: (tl.linalg.solve(x, y) ** 2).sum()),
        "inv": ([g], lambda x: (tl.linalg.inv(x) * tl.tensor(w[:, :3])).sum()),
        "det": ([g], lambda x: tl.linalg.det(x).sum()),
        "slogdet": ([g], lambda x: tl.linalg.slogdet(x).logabsdet.sum()),
        "lstsq": ([r, w[:, :, :2].copy()], lambda x, y: (tl.linalg.lstsq(x, y).solution ** 2).sum()),
        "pinv": ([r], lambda x: (tl.linalg.pinv(x) ** 2).sum()),
    }
    arrays, fn = cases[name]
    assert gradcheck(fn, [tl.tensor(a, requires_grad=True) for a in arrays])


@pytest.mark.parametrize("name", ["det", "inv", "eigvalsh", "svdvals", "cholesky", "qr"])
def test_second_order(each_runtime, name):
    """The backward rules are graph math, so a gradient differentiates again: a Hessian-vector product against
    torch's create_graph=True (float64, atol 1e-9)."""
    if each_runtime != "numpy":
        pytest.skip("float64 second order on the NumPy reference runtime")
    from tinyllm.autograd import gradients
    from tinyllm.graph import const
    rng = np.random.default_rng(0)
    g, v = general(rng, (), 3, np.float64), rng.standard_normal((3, 3))
    p = g @ g.T
    fns = {"det": (g, lambda lib, x: lib.linalg.det(x)), "inv": (g, lambda lib, x: (lib.linalg.inv(x) ** 2).sum()),
           "eigvalsh": (p, lambda lib, x: (lib.linalg.eigvalsh(x) ** 3).sum()),
           "svdvals": (g, lambda lib, x: (lib.linalg.svdvals(x) ** 3).sum()),
           "cholesky": (p, lambda lib, x: (lib.linalg.cholesky(x) ** 3).sum()),
           "qr": (g, lambda lib, x: (lib.linalg.qr(x).R ** 3).sum())}
    a, fn = fns[name]
    x = tl.tensor(a, requires_grad=True)
    y = fn(tl, x)
    grad = x._make(gradients(y._node, const(1.0, (), y._node.dtype), [x._node])[x._node])
    (grad * tl.tensor(v)).sum().backward()
    t = torch.tensor(a, requires_grad=True)
    (tg,) = torch.autograd.grad(fn(torch, t), t, create_graph=True)
    (tg * torch.tensor(v)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), atol=1e-9, rtol=1e-7)


def test_host_ops_run_without_the_host_fallback_warning(each_runtime):
    """The decompositions are host ops by design: no runtime warns that it lacks a kernel for them."""
    import warnings
    a = tl.tensor(spd(np.random.default_rng(0), (2,), 3), requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        U, S, Vh = tl.linalg.svd(a)
        L, V = tl.linalg.eig(a)
        (tl.linalg.eigvalsh(a).sum() + S.sum() + tl.linalg.inv(a).sum() + tl.linalg.cholesky(a).sum()
         + L.real.sum() + V.abs().sum()).backward()
        a.grad.numpy()


def test_c_runtime_replays_the_host_ops(each_runtime, monkeypatch):
    """On C a decomposition is a recorded host call: a step run a third time replays, with the normal path's values,
    and a singular input met on a replay raises the normal LinAlgError."""
    if each_runtime != "c":
        pytest.skip("the C runtime's recorded schedules")
    from tinyllm.runtime import get as get_runtime
    from tinyllm.runtime.c import program
    rt = get_runtime("c")
    if rt.lib is None:
        pytest.skip("no prebuilt C module: nothing replays")
    replayed, run = [0], program.Program.run

    def counted(self, *args):
        replayed[0] += 1
        return run(self, *args)
    monkeypatch.setattr(program.Program, "run", counted)
    monkeypatch.setattr(rt, "replays", True)
    rng = np.random.default_rng(0)

    def step(a):
        x = tl.tensor(a, requires_grad=True)
        y = (tl.linalg.inv(x) ** 2).sum() + tl.linalg.svdvals(x).sum() + tl.linalg.slogdet(x).logabsdet.sum()
        y.backward()
        return y.item(), x.grad.numpy()
    for i in range(4):
        a = general(rng, (2,), 3)
        t = torch.tensor(a, requires_grad=True)
        ty = (torch.linalg.inv(t) ** 2).sum() + torch.linalg.svdvals(t).sum() + torch.linalg.slogdet(t).logabsdet.sum()
        ty.backward()
        y, g = step(a)
        np.testing.assert_allclose(y, ty.item(), rtol=1e-5)
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-3, atol=1e-4)
    assert replayed[0] > 0, "no step replayed"
    with pytest.raises(tl.linalg.LinAlgError, match=r"linalg.inv: \(Batch element 0\)"):
        step(np.zeros((2, 3, 3), np.float32))


@pytest.mark.parametrize("mode", ["reduced", "complete"])
@pytest.mark.parametrize("m, n", [(2, 5), (3, 4), (1, 3)])
def test_qr_wide_gradient_is_torchs(each_runtime, m, n, mode):
    """A wide A (m < n): the gradient of Q and R (each alone and together) is torch's linalg_qr_backward's
    (float64; test_qr runs float32 on every runtime)."""
    if each_runtime != "numpy":
        pytest.skip("float64 on the NumPy reference runtime")
    rng = np.random.default_rng(m * 10 + n)
    a = svd_input(rng, (2,), m, n, np.float64)
    wq, wr = rng.standard_normal((2, m, m)), rng.standard_normal((2, m, n))
    for uses in ("Q", "R", "QR"):
        def loss(lib, x):
            q, r = lib.linalg.qr(x, mode=mode)
            out = (q * lib.tensor(wq)).sum() if "Q" in uses else 0.0
            return out + ((r * lib.tensor(wr)) ** 2).sum() if "R" in uses else out
        x, t = tl.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
        loss(tl, x).backward()
        loss(torch, t).backward()
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-7, atol=1e-9)


SINGULAR = [[[1., 2], [2, 4]], [[0., 0], [1, 2]], [[1., 2, 3], [4, 5, 6], [7, 8, 9]], [[0., 0, 0], [1, 2, 3], [4, 5, 7]],
            [[2., 1, 0], [4, 2, 0], [1, 3, 5]]]


@pytest.mark.parametrize("a", SINGULAR)
def test_det_gradient_at_a_singular_matrix_is_the_adjugate(each_runtime, a):
    """A rank n - 1 A: det's gradient is finite, adj(A)ᵀ, torch's SVD formula (the one torch's backward takes with
    create_graph=True; its plain backward of 2.13 answers 0 there); in a batch with a nonsingular A, that one keeps
    LU's det(A) A⁻ᵀ."""
    if each_runtime != "numpy":
        pytest.skip("float64 on the NumPy reference runtime")
    n = len(a)
    a = np.stack([np.array(a), np.eye(n) * 2 + np.triu(np.ones((n, n)), 1)])
    w = np.array([1.5, -0.5])
    x, t = tl.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    y = tl.linalg.det(x)
    (y * tl.tensor(w)).sum().backward()
    ty = torch.linalg.det(t)
    (tg,) = torch.autograd.grad((ty * torch.tensor(w)).sum(), t, create_graph=True)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), atol=1e-12)
    assert np.isfinite(x.grad.numpy()).all()
    np.testing.assert_allclose(x.grad.numpy(), tg.detach().numpy(), rtol=1e-7, atol=1e-9)
    adj = np.array([[(-1) ** (i + j) * np.linalg.det(np.delete(np.delete(a[0], i, 0), j, 1)) for j in range(n)]
                    for i in range(n)])  # cofactors: the adjugate's transpose
    np.testing.assert_allclose(x.grad.numpy()[0], w[0] * adj, atol=1e-9)
