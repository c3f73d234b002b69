"""prod, the running ops (cumsum, cumprod, cummax, cummin, logcumsumexp), sorting (sort, argsort, topk, msort),
the scatter family (scatter, scatter_add, scatter_reduce), data-dependent selection (nonzero, masked_select,
x[mask]) and unfold, against torch: values and every input's gradient, on every runtime, shapes from hypothesis.

Tolerances: rtol 1e-5, atol 1e-6 for values and gradients (float32: a product of up to 4 values rounds a few times;
the pairwise tree and the scan multiply in another order than torch's loop). Integer results, indices and bool
masks exactly. Inputs for sort/topk/cummax are "distinct" (no ties: torch's topk orders ties as it likes) unless a
test is about ties, which then uses torch's documented rule (stable sort; cummax takes the later index)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from helpers import SEEDS, helper_test_op, make_inputs, shapes

pytestmark = pytest.mark.usefixtures("each_runtime")
TOL = {"forward": (1e-5, 1e-6), "grad": (1e-5, 1e-6)}
FEW = settings(max_examples=12)  # each example compiles new kernels on the C and WGSL runtimes


def _dim(shape, k):
    return k % len(shape) if shape else 0


@FEW
@given(shape=shapes(0, 3), k=st.integers(0, 5), keepdim=st.booleans(), seed=SEEDS)
def test_prod(shape, k, keepdim, seed):
    d = _dim(shape, k)
    helper_test_op([shape], lambda x: x.prod(d, keepdim=keepdim), tol=TOL, seed=seed)
    helper_test_op([shape], lambda x: x.prod(), tol=TOL, seed=seed)


def test_prod_with_zeros_integers_and_empty():
    a = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.5, 4.0, -2.0]], np.float32)  # one zero, two zeros, none
    helper_test_op([a.shape], lambda x: x.prod(1), arrays=[a], tol=TOL)
    helper_test_op([a.shape], lambda x: x.prod(), arrays=[a], tol=TOL)
    ints = np.array([[1, 2, 3], [4, 5, 6]])
    assert tl.tensor(ints).prod().item() == 720 and tl.tensor(ints).prod().dtype is tl.int64
    np.testing.assert_array_equal(tl.tensor(ints).prod(0).numpy(), [4, 10, 18])
    assert tl.tensor([True, False]).prod().dtype is tl.int64
    np.testing.assert_array_equal(tl.zeros(2, 0).prod(1).numpy(), torch.zeros(2, 0).prod(1).numpy())


@FEW
@given(shape=shapes(1, 3), k=st.integers(0, 5), seed=SEEDS)
def test_cumprod_cumsum_logcumsumexp(shape, k, seed):
    d = _dim(shape, k)
    helper_test_op([shape], lambda x: x.cumprod(d), tol=TOL, seed=seed)
    helper_test_op([shape], lambda x: x.cumsum(d), tol=TOL, seed=seed)
    helper_test_op([shape], lambda x: x.logcumsumexp(d), tol=TOL, seed=seed)


def test_cumprod_through_zeros_and_integers():
    a = np.array([[2.0, 0.0, 3.0, 4.0], [0.5, 2.0, 0.0, 0.0]], np.float32)
    helper_test_op([a.shape], lambda x: x.cumprod(1), arrays=[a], tol=TOL)
    ints = np.array([[1, 2, 3], [4, -5, 6]])
    np.testing.assert_array_equal(tl.tensor(ints).cumprod(1).numpy(), torch.tensor(ints).cumprod(1).numpy())
    np.testing.assert_array_equal(tl.tensor(ints).cumsum(0).numpy(), torch.tensor(ints).cumsum(0).numpy())


@FEW
@given(shape=shapes(1, 3, max_side=6), k=st.integers(0, 5), largest=st.booleans(), seed=SEEDS)
def test_cummax_cummin(shape, k, largest, seed):
    d = _dim(shape, k)
    name = "cummax" if largest else "cummin"
    helper_test_op([shape], lambda x: tuple(getattr(x, name)(d)), tol=TOL, seed=seed, values="distinct")


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cummax_cummin_ties_nan_and_integers(name):
    """Ties take the later index, the first NaN stays, as torch; the gradient goes to the index taken."""
    a = np.array([[1.0, 3.0, 3.0, np.nan, 2.0, 5.0], [3.0, 1.0, 3.0, 1.0, 3.0, 0.0]], np.float32)
    x, tx = tl.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    (v, i), (tv, ti) = getattr(x, name)(1), getattr(tx, name)(1)
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    np.testing.assert_array_equal(v.numpy(), tv.detach().numpy())
    up = np.arange(a.size, dtype=np.float32).reshape(a.shape)
    (v * tl.tensor(up)).sum().backward()
    (tv * torch.tensor(up)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())
    ints = np.array([5, 1, 7, 7, -2])
    got, want = getattr(tl.tensor(ints), name)(0), getattr(torch.tensor(ints), name)(0)
    np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())


@FEW
@given(shape=shapes(1, 3, max_side=6), k=st.integers(0, 5), descending=st.booleans(), seed=SEEDS)
def test_sort_argsort(shape, k, descending, seed):
    d = _dim(shape, k)
    helper_test_op([shape], lambda x: tuple(x.sort(d, descending=descending)), tol=TOL, seed=seed, values="distinct")
    helper_test_op([shape], lambda x: x.argsort(d, descending=descending), tol=TOL, seed=seed, values="distinct",
                   grad=False)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_is_stable_with_nan_largest(descending):
    a = np.array([[2.0, np.nan, 1.0, 2.0, -1.0, np.nan], [3.0, 3.0, 3.0, 0.0, 1.0, 3.0]], np.float32)
    v, i = tl.tensor(a).sort(1, descending=descending)
    tv, ti = torch.tensor(a).sort(dim=1, descending=descending, stable=True)
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    ints = np.array([3, -1, 3, 7, 0])
    np.testing.assert_array_equal(tl.tensor(ints).argsort(descending=descending).numpy(),
                                  torch.tensor(ints).argsort(descending=descending, stable=True).numpy())
    np.testing.assert_array_equal(tl.tensor(a).msort().numpy(), torch.tensor(a).msort().numpy())


@FEW
@given(shape=shapes(1, 3, max_side=6), k=st.integers(0, 5), largest=st.booleans(), data=st.data(), seed=SEEDS)
def test_topk(shape, k, largest, data, seed):
    d = _dim(shape, k)
    kk = data.draw(st.integers(0, shape[d]))
    helper_test_op([shape], lambda x: tuple(x.topk(kk, d, largest=largest)), tol=TOL, seed=seed, values="distinct")
    helper_test_op([shape], lambda x: tuple(torch.topk(x, kk, d, largest)) if isinstance(x, torch.Tensor)
                   else tuple(tl.topk(x, kk, d, largest)), tol=TOL, seed=seed, values="distinct")


def test_topk_refuses_k_out_of_range():
    with pytest.raises(RuntimeError, match=r"topk: k=4 is out of range for dim -1 of size 3"):
        tl.ones(2, 3).topk(4)


# ---- scatter family ---------------------------------------------------------------------------------------
def _scatter_case(data, allow_repeats):
    """(self shape, dim, index array, src shape): index no larger than self but along dim, src no smaller."""
    ndim = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.integers(1, 4)) for _ in range(ndim))
    d = data.draw(st.integers(0, ndim - 1))
    ishape = tuple(data.draw(st.integers(1, s if k != d else 4)) for k, s in enumerate(shape))
    sshape = tuple(i + data.draw(st.integers(0, 1)) for i in ishape)
    rng = np.random.default_rng(data.draw(SEEDS))
    if allow_repeats:
        index = rng.integers(0, shape[d], ishape)
    else:  # torch leaves repeated positions undefined for scatter: each position along dim at most once
        ishape = ishape[:d] + (min(ishape[d], shape[d]),) + ishape[d + 1:]
        sshape = sshape[:d] + (max(sshape[d], ishape[d]),) + sshape[d + 1:]
        index = np.argsort(rng.random(ishape[:d] + (shape[d],) + ishape[d + 1:]), axis=d).take(
            np.arange(ishape[d]), axis=d)
    return shape, d, index, sshape


@FEW
@given(data=st.data(), seed=SEEDS)
def test_scatter(data, seed):
    shape, d, index, sshape = _scatter_case(data, allow_repeats=False)
    helper_test_op([shape, sshape], lambda x, s: x.scatter(d, _like(x, index), s), tol=TOL, seed=seed, grad=False)
    sshape = index.shape  # torch's backward for src needs src of index's shape
    helper_test_op([shape, sshape], lambda x, s: x.scatter(d, _like(x, index), s), tol=TOL, seed=seed)
    helper_test_op([shape], lambda x: x.scatter(d, _like(x, index), 2.5), tol=TOL, seed=seed)


@FEW
@given(data=st.data(), reduce=st.sampled_from(["sum", "prod", "mean", "amax", "amin"]),
       include_self=st.booleans(), seed=SEEDS)
def test_scatter_reduce(data, reduce, include_self, seed):
    shape, d, index, sshape = _scatter_case(data, allow_repeats=True)
    values = "distinct" if reduce in ("amax", "amin") else "any"
    fn = lambda x, s: x.scatter_reduce(d, _like(x, index), s, reduce, include_self=include_self)  # noqa: E731
    helper_test_op([shape, sshape], fn, tol=TOL, seed=seed, values=values, grad=False)  # src larger than index
    sshape = index.shape  # torch's backward for src needs src of index's shape
    helper_test_op([shape, sshape], fn, tol=TOL, seed=seed, values=values)
    if reduce == "sum":
        helper_test_op([shape, sshape], lambda x, s: x.scatter_add(d, _like(x, index), s), tol=TOL, seed=seed)


def test_scatter_reduce_ties_share_the_gradient_and_integers():
    x = np.array([[1.0, 5.0], [2.0, 0.0]], np.float32)
    src = np.array([[5.0, 5.0], [5.0, -1.0]], np.float32)
    index = np.array([[0, 0], [0, 1]])
    helper_test_op([x.shape, src.shape], lambda a, s: a.scatter_reduce(0, _like(a, index), s, "amax"),
                   arrays=[x, src], tol=TOL)
    ints = np.arange(12).reshape(3, 4)
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        got = tl.tensor(ints).scatter_reduce(0, tl.tensor([[0, 0, 1, 2]]), tl.tensor([[5, 6, 7, 8]]), reduce)
        want = torch.tensor(ints).scatter_reduce(0, torch.tensor([[0, 0, 1, 2]]), torch.tensor([[5, 6, 7, 8]]), reduce)
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=reduce)


def test_scatter_errors_name_the_op():
    x = tl.zeros(3, 4)
    with pytest.raises(RuntimeError, match=r"scatter: index \(3, 5\) must have the input's 2 dimensions"):
        x.scatter(0, tl.zeros(3, 5).long(), 1.0)
    with pytest.raises(TypeError, match="scatter_reduce: index must be an int64 tensor, got float32"):
        x.scatter_reduce(0, tl.zeros(1, 4), tl.ones(1, 4), "sum")
    with pytest.raises(ValueError, match="reduce must be one of sum, prod, mean, amax, amin"):
        x.scatter_reduce(0, tl.zeros(1, 4).long(), tl.ones(1, 4), "max")
    with pytest.raises(IndexError, match="GATHER.* out of range"):  # each runtime words the rest its way
        x.scatter(0, tl.tensor([[3, 0, 0, 0]]), 1.0).numpy()


def _like(x, index):
    return torch.tensor(index) if isinstance(x, torch.Tensor) else tl.tensor(index)


# ---- data-dependent selection, unfold ------------------------------------------------------------------------
@FEW
@given(shape=shapes(1, 3), seed=SEEDS, lead=st.integers(0, 2))
def test_masks_select(shape, seed, lead):
    mask = np.random.default_rng(seed).random(shape[lead:] if lead < len(shape) else shape) < 0.5
    helper_test_op([shape], lambda x: x.masked_select(_like(x, mask)), tol=TOL, seed=seed)
    m = mask if mask.shape == shape[-mask.ndim:] else mask
    k = len(shape) - m.ndim  # a mask indexes the axes it covers: x[..., mask] for the trailing ones
    helper_test_op([shape], lambda x: x[(slice(None),) * k + (_like(x, m),)], tol=TOL, seed=seed)


def test_nonzero():
    a = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]], np.float32)
    np.testing.assert_array_equal(tl.tensor(a).nonzero().numpy(), torch.tensor(a).nonzero().numpy())
    for got, want in zip(tl.nonzero(tl.tensor(a), as_tuple=True), torch.tensor(a).nonzero(as_tuple=True)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    for v in (0.0, 3.0):
        assert tl.tensor(v).nonzero().shape == tuple(torch.tensor(v).nonzero().shape)
    with pytest.raises(IndexError, match=r"the mask of shape \(4,\) does not match"):
        tl.ones(3, 4)[tl.tensor([True, False, True, True])]


@FEW
@given(shape=shapes(1, 3, max_side=5), k=st.integers(0, 5), data=st.data(), seed=SEEDS)
def test_unfold(shape, k, data, seed):
    d = _dim(shape, k)
    size, step = data.draw(st.integers(0, shape[d])), data.draw(st.integers(1, 3))
    helper_test_op([shape], lambda x: x.unfold(d, size, step), tol=TOL, seed=seed)


def test_unfold_refuses_a_window_larger_than_the_axis():
    with pytest.raises(RuntimeError, match=r"unfold: size 8 and step 2 do not fit dimension 0 of size 7"):
        tl.arange(7.0).unfold(0, 8, 2)
