"""tinyllm.linalg's norms and products, and torch's top-level products (tinyllm/linalg/norms.py, products.py,
tinyllm/mixins/products.py): values and gradients against torch on every runtime, over ord and dim variants,
hypothesis-drawn small shapes, the zero vector's gradient (0, never nan), and the errors (torch's classes).

Inputs of max/min norms are distinct (no ties, where any subgradient is right); tolerances, float32: values rtol 1e-5 /
atol 1e-6, gradients rtol 1e-4 / atol 1e-5 (sums of a few products, and a root)."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

import tinyllm as tl
from helpers import SEEDS, helper_test_op, shapes

pytestmark = pytest.mark.usefixtures("each_runtime")
TOL = {"forward": (1e-5, 1e-6), "grad": (1e-4, 1e-5)}
INF = math.inf


def _both(fn_tl, fn_torch):
    """A function of tensors that runs fn_tl on tinyllm tensors and fn_torch on torch ones."""
    return lambda *xs: (fn_torch if isinstance(xs[0], torch.Tensor) else fn_tl)(*xs)


def linalg(name, *args, **kwargs):
    return _both(lambda *x: getattr(tl.linalg, name)(*x, *args, **kwargs),
                 lambda *x: getattr(torch.linalg, name)(*x, *args, **kwargs))


def top(name, *args, **kwargs):
    return _both(lambda *x: getattr(tl, name)(*x, *args, **kwargs),
                 lambda *x: getattr(torch, name)(*x, *args, **kwargs))


@pytest.mark.parametrize("ord", [2, 1, INF, -INF, 0, 3, 0.5, -1, 1.5])
@pytest.mark.parametrize("dim, keepdim", [(None, False), (-1, False), ((0, 2), True), (1, True)])
def test_vector_norm(ord, dim, keepdim):
    helper_test_op([(2, 3, 4)], linalg("vector_norm", ord, dim, keepdim), tol=TOL,
                   values="distinct" if abs(ord) == INF else "nonzero")


@given(shape=shapes(1, 3, 1, 3), ord=st.sampled_from([2, 1, INF, 3]), seed=SEEDS)
def test_vector_norm_shapes(shape, ord, seed):
    dim = seed % len(shape)
    helper_test_op([shape], linalg("vector_norm", ord, dim), tol=TOL, seed=seed, values="distinct")


@pytest.mark.parametrize("ord", [2, 1, 3, 0.5, INF])
def test_vector_norm_at_zero_has_torchs_gradient(ord):
    a = np.zeros((2, 3), np.float32)
    a[1] = [0.0, 0.5, -1.0]  # a zero row, and a zero entry in a nonzero row
    out = helper_test_op(None, linalg("vector_norm", ord, -1), tol=TOL, arrays=[a])
    x = tl.tensor(a, requires_grad=True)
    tl.linalg.vector_norm(x, ord, -1).sum().backward()
    assert not np.isnan(x.grad.numpy()).any() and out[0].numpy()[0] == 0


def test_vector_norm_dtype(each_runtime):
    if each_runtime == "wgsl":
        pytest.skip("WGSL runtime: no float64 in WebGPU (the runtime refuses it clearly)")
    helper_test_op([(3, 4)], _both(lambda x: tl.linalg.vector_norm(x, dtype=tl.float64),
                                   lambda x: torch.linalg.vector_norm(x, dtype=torch.float64)), tol=TOL)


def test_tensor_norm_forms():
    for args in [(), ("fro",), (1,), (INF, 1), ("fro", (0, 1), True), (2, 0), (None, -1)]:
        helper_test_op([(3, 4)], lambda x: x.norm(*args), tol=TOL, values="distinct")
    helper_test_op([(3, 4), (3, 4)], lambda a, b: a.dist(b, 3), tol=TOL)


@pytest.mark.parametrize("ord", ["fro", 1, -1, INF, -INF])
@pytest.mark.parametrize("dim", [(-2, -1), (0, 2), (2, 1)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_matrix_norm(ord, dim, keepdim):
    helper_test_op([(2, 3, 4)], linalg("matrix_norm", ord, dim, keepdim), tol=TOL, values="distinct")


@pytest.mark.parametrize("shape, kwargs", [((5,), {}), ((5,), {"ord": 1}), ((3, 4), {}), ((3, 4), {"ord": "fro"}),
                                           ((3, 4), {"ord": INF}), ((2, 3, 4), {}), ((2, 3, 4), {"dim": 1}),
                                           ((2, 3, 4), {"ord": 1, "dim": (0, 1)}), ((2, 3, 4), {"dim": (1, 2)}),
                                           ((2, 3, 4), {"ord": 3, "dim": (-1,), "keepdim": True})])
def test_norm_dispatch(shape, kwargs):
    helper_test_op([shape], linalg("norm", **kwargs), tol=TOL, values="distinct")


def test_nuclear_and_spectral_norms_need_svdvals():
    A = tl.randn(3, 3)
    if hasattr(tl.linalg, "svdvals"):
        a = A.numpy()
        for ord in ("nuc", 2, -2):
            np.testing.assert_allclose(tl.linalg.matrix_norm(A, ord).numpy(),
                                       torch.linalg.matrix_norm(torch.tensor(a), ord).numpy(), rtol=1e-5)
    else:
        for ord in ("nuc", 2, -2):
            with pytest.raises(NotImplementedError, match="svdvals"):
                tl.linalg.matrix_norm(A, ord)


def test_norm_errors_match_torch():
    x, t = tl.randn(4), torch.randn(4)
    for fn_tl, fn_torch, match in [
            (lambda: tl.linalg.matrix_norm(x), lambda: torch.linalg.matrix_norm(t), "at least 2 dimensions"),
            (lambda: tl.linalg.matrix_norm(tl.randn(2, 2), 3), lambda: torch.linalg.matrix_norm(torch.randn(2, 2), 3),
             "not supported"),
            (lambda: tl.linalg.vector_norm(tl.tensor([1, 2])), lambda: torch.linalg.vector_norm(torch.tensor([1, 2])),
             "floating point"),
            (lambda: tl.linalg.norm(tl.randn(2, 2, 2), 1), lambda: torch.linalg.norm(torch.randn(2, 2, 2), 1),
             "1-D or 2-D"),
            (lambda: tl.linalg.cross(tl.randn(2, 4), tl.randn(2, 4)),
             lambda: torch.linalg.cross(torch.randn(2, 4), torch.randn(2, 4)), "must have length 3")]:
        with pytest.raises(Exception) as want:
            fn_torch()
        with pytest.raises(want.type, match=match):
            fn_tl()


@pytest.mark.parametrize("shapes_, dim", [(((4, 3), (4, 3)), -1), (((3, 2), (3, 1)), 0), (((2, 3, 5), (1, 3, 5)), 1)])
def test_cross(shapes_, dim):
    helper_test_op(list(shapes_), linalg("cross", dim=dim), tol=TOL)
    helper_test_op(list(shapes_), lambda a, b: a.cross(b, dim), tol=TOL)


def test_products_match_torch():
    helper_test_op([(2, 3, 4)], linalg("diagonal", offset=1), tol=TOL)
    helper_test_op([(2, 3, 4), (3, 4)], linalg("vecdot"), tol=TOL)
    helper_test_op([(2, 3, 4), (4, 2)], linalg("matmul"), tol=TOL)
    helper_test_op([(3, 3)], lambda a: a.trace(), tol=TOL)
    helper_test_op([(3,), (4,)], lambda a, b: a.outer(b), tol=TOL)
    helper_test_op([(3,), (4,)], top("ger"), tol=TOL)
    helper_test_op([(3,), (3,)], lambda a, b: a.dot(b), tol=TOL)
    helper_test_op([(2, 3), (4, 3)], lambda a, b: a.inner(b), tol=TOL)
    helper_test_op([(2, 3), (3,)], lambda a, b: a.mv(b), tol=TOL)
    helper_test_op([(2, 3), (3, 4)], lambda a, b: a.mm(b), tol=TOL)
    helper_test_op([(2, 2, 3), (2, 3, 4)], lambda a, b: a.bmm(b), tol=TOL)
    helper_test_op([(2, 3), (3, 1, 2)], top("kron"), tol=TOL)
    for args in [(), (1,), (-1, 0, 2)]:
        helper_test_op([(2, 3)], lambda a: a.diag_embed(*args), tol=TOL)
    helper_test_op([(4,)], lambda a: a.diag(1), tol=TOL)
    helper_test_op([(3, 4)], lambda a: a.diag(-1), tol=TOL)
    helper_test_op([(3, 4)], lambda a: a.triu(1), tol=TOL)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5])
def test_matrix_power(n):
    out = helper_test_op([(2, 3, 3)], linalg("matrix_power", n=n), tol={"forward": (1e-4, 1e-5), "grad": (1e-4, 1e-4)},
                         grad=n > 0)
    assert out[0].shape == (2, 3, 3)


def test_matrix_power_negative_needs_inv():
    A = tl.tensor([[2.0, 1.0], [1.0, 3.0]])
    if hasattr(tl.linalg, "inv"):
        np.testing.assert_allclose(tl.linalg.matrix_power(A, -2).numpy(),
                                   torch.linalg.matrix_power(torch.tensor(A.numpy()), -2).numpy(), rtol=1e-5)
    else:
        with pytest.raises(NotImplementedError, match="linalg.inv"):
            tl.linalg.matrix_power(A, -1)


def test_multi_dot_and_vander():
    helper_test_op([(3,), (3, 5), (5, 2), (2, 4)], lambda *ts: (tl.linalg if isinstance(ts[0], tl.Tensor)
                                                                  else torch.linalg).multi_dot(list(ts)), tol=TOL)
    helper_test_op([(2, 3), (3, 4), (4,)], lambda *ts: (tl.linalg if isinstance(ts[0], tl.Tensor)
                                                         else torch.linalg).multi_dot(list(ts)), tol=TOL)
    helper_test_op([(2, 3)], linalg("vander"), tol=TOL)
    helper_test_op([(4,)], linalg("vander", N=2), tol=TOL)


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, INF, 0.0])
def test_cdist(p):
    helper_test_op([(2, 3, 4), (2, 5, 4)], top("cdist", p=p), tol=TOL, values="distinct")


def test_cdist_gradient_at_equal_rows_is_zero():
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    helper_test_op(None, top("cdist"), tol=TOL, arrays=[a, a.copy()])


@pytest.mark.parametrize("dims", [2, 1, 0, ([1, 0], [0, 2])])
def test_tensordot(dims):
    b = (3, 4, 5) if dims != ([1, 0], [0, 2]) else (3, 5, 2)
    helper_test_op([(2, 3, 4) if dims != 1 else (2, 3), b if dims != 1 else (3, 4, 5)], top("tensordot", dims=dims),
                   tol=TOL)


def test_block_diag_and_cartesian_prod():
    helper_test_op([(2, 3), (4,), (), (1, 2)], top("block_diag"), tol=TOL)
    a, b, c = tl.tensor([1, 2]), tl.tensor([3, 4, 5]), tl.tensor([6])
    want = torch.cartesian_prod(torch.tensor([1, 2]), torch.tensor([3, 4, 5]), torch.tensor([6]))
    np.testing.assert_array_equal(tl.cartesian_prod(a, b, c).numpy(), want.numpy())
    helper_test_op([(2,), (3,)], top("cartesian_prod"), tol=TOL)


def test_product_errors():
    for fn, exc, match in [(lambda: tl.randn(2, 2).outer(tl.randn(2)), RuntimeError, "outer"),
                           (lambda: tl.randn(2, 3, 2).trace(), RuntimeError, "trace"),
                           (lambda: tl.randn(3).dot(tl.randn(4)), RuntimeError, "inconsistent tensor size"),
                           (lambda: tl.randn(2, 3).matrix_power(2), RuntimeError, "square"),
                           (lambda: tl.linalg.multi_dot([tl.randn(2, 3)]), RuntimeError, "at least 2"),
                           (lambda: tl.cdist(tl.randn(2, 3), tl.randn(2, 4)), RuntimeError, "columns"),
                           (lambda: tl.block_diag(tl.randn(2, 2, 2)), RuntimeError, "2 or fewer"),
                           (lambda: tl.tensordot(tl.randn(2, 3), tl.randn(4, 2), 1), RuntimeError, "same size")]:
        with pytest.raises(exc, match=match):
            fn()
