"""Tensor methods composed from the primitives (tinyllm/tensor.py, factory.py): flip, roll, repeat,
repeat_interleave, unflatten, diagonal, log2/log10/exp2, isnan/isinf/isfinite, logaddexp, all/any, <= and >= at
NaN, eye, linspace; values and gradients against torch on every runtime. Tolerance: rtol 1e-5, atol 1e-6."""
import numpy as np
import pytest
import torch

import tinyllm as tl

pytestmark = pytest.mark.usefixtures("each_runtime")
TOL = dict(rtol=1e-5, atol=1e-6)
A = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
B = np.random.default_rng(1).standard_normal((3, 4, 5)).astype(np.float32)
POS = np.abs(A) + 0.1
IDX1 = np.random.default_rng(3).integers(0, 4, (3, 2, 5))
IDX0 = np.random.default_rng(4).integers(0, 3, (2, 4, 5))


def _index(x, index):
    return tl.tensor(index) if isinstance(x, tl.Tensor) else torch.tensor(index)

CASES = {
    "flip": (lambda x: x.flip(0, 2), A), "flip_list": (lambda x: x.flip([1]), A),
    "roll": (lambda x: x.roll((1, -2), (0, 2)), A), "roll_flat": (lambda x: x.roll(3), A),
    "repeat": (lambda x: x.repeat(2, 1, 1, 3), A), "repeat_interleave": (lambda x: x.repeat_interleave(2, 1), A),
    "repeat_interleave_flat": (lambda x: x.repeat_interleave(3), A), "unflatten": (lambda x: x.unflatten(1, (2, 2)), A),
    "diagonal": (lambda x: x.diagonal(0, 1, 2), A), "diagonal_above": (lambda x: x.diagonal(1, 1, 2), A),
    "diagonal_below": (lambda x: x.diagonal(-2, 1, 2), A), "diagonal_out": (lambda x: x.diagonal(0, 2, 0), A),
    "log2": (lambda x: x.log2(), POS), "log10": (lambda x: x.log10(), POS), "exp2": (lambda x: x.exp2(), A),
    "logaddexp": (lambda x: x.logaddexp(x * 0.5 + 1.0), A),
    "cumsum": (lambda x: x.cumsum(1), A), "cumsum_last": (lambda x: x.cumsum(-1), A),
    "logcumsumexp": (lambda x: x.logcumsumexp(2), A), "lerp": (lambda x: x.lerp(x * 2.0 + 1.0, 0.3), A),
    "std_mean": (lambda x: sum(x.std_mean(1)) if isinstance(x, tl.Tensor) else sum(torch.std_mean(x, 1)), A),
    "gather": (lambda x: x.gather(1, _index(x, IDX1)), A), "gather_dim0": (lambda x: x.gather(0, _index(x, IDX0)), A),
    "diag_of_vector": (lambda x: x.reshape(-1)[:4].diag(1), A), "diag_below": (lambda x: x.reshape(-1)[:4].diag(-2), A),
    "diag_of_matrix": (lambda x: x[0].diag(1), A),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_method_matches_torch(name):
    fn, a = CASES[name]
    x, tx = tl.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    y, ty = fn(x), fn(tx)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), **TOL)
    r = np.random.default_rng(2).standard_normal(ty.shape).astype(np.float32)
    (y * tl.tensor(r)).sum().backward()
    (ty * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **TOL)


def test_predicates_and_comparisons_at_ieee_specials():
    a = np.array([np.nan, np.inf, -np.inf, 1.0, 0.0, -2.0], np.float32)
    x, t = tl.tensor(a), torch.tensor(a)
    for name in ("isnan", "isinf", "isfinite"):
        np.testing.assert_array_equal(getattr(x, name)().numpy(), getattr(t, name)().numpy(), err_msg=name)
    np.testing.assert_array_equal((x <= 1.0).numpy(), (t <= 1.0).numpy())  # NaN <= 1 is false
    np.testing.assert_array_equal((x >= 1.0).numpy(), (t >= 1.0).numpy())
    np.testing.assert_array_equal(x.logaddexp(x).numpy(), t.logaddexp(t).numpy())  # -inf stays -inf, no nan


def test_all_any():
    x, t = tl.tensor(A > 0), torch.tensor(A > 0)
    np.testing.assert_array_equal(x.all(1).numpy(), t.all(1).numpy())
    np.testing.assert_array_equal(x.any(-1, keepdim=True).numpy(), t.any(-1, keepdim=True).numpy())
    assert bool(tl.tensor(A).any().item()) and not bool(tl.tensor(A).all().item() and False)


def test_cumsum_of_integers_stays_integer():
    a = np.arange(12).reshape(3, 4)
    got = tl.tensor(a).cumsum(0)
    assert got.dtype == tl.int64
    np.testing.assert_array_equal(got.numpy(), torch.tensor(a).cumsum(0).numpy())


def test_isclose_allclose():
    a = np.array([1.0, np.nan, np.inf, 1e-9], np.float32)
    x, t = tl.tensor(a), torch.tensor(a)
    np.testing.assert_array_equal(x.isclose(x + 1e-7).numpy(), t.isclose(t + 1e-7).numpy())
    np.testing.assert_array_equal(x.isclose(x, equal_nan=True).numpy(), t.isclose(t, equal_nan=True).numpy())
    assert tl.tensor(A).allclose(tl.tensor(A) + 1e-9) and not tl.tensor(A).allclose(tl.tensor(A) + 1.0)


def test_gather_refuses_an_index_out_of_range():
    with pytest.raises(IndexError, match="out of range"):
        tl.tensor(A).gather(1, tl.tensor(np.full((3, 1, 5), 4))).numpy()


def test_eye_and_linspace():
    np.testing.assert_array_equal(tl.eye(3, 4).numpy(), torch.eye(3, 4).numpy())
    for start, end, steps in ((0, 1, 5), (-2.5, 7, 10), (3, 3, 1), (1, 0, 7)):
        np.testing.assert_allclose(tl.linspace(start, end, steps).numpy(), torch.linspace(start, end, steps).numpy(),
                                   rtol=0, atol=2e-7)


def test_numpy_names_axis_and_keepdims():
    """torch takes axis= for dim= and keepdims= for keepdim= (NumPy's names); so does every method with a dim."""
    x, t = tl.tensor(A), torch.tensor(A)
    for name in ("sum", "mean", "amax", "logsumexp", "std", "var", "prod", "argmax"):
        np.testing.assert_allclose(getattr(x, name)(axis=1, keepdims=True).numpy(),
                                   getattr(t, name)(axis=1, keepdims=True).numpy(), **TOL, err_msg=name)
    np.testing.assert_allclose(tl.cumsum(x, axis=2).numpy(), torch.cumsum(t, axis=2).numpy(), **TOL)
    np.testing.assert_allclose(x.softmax(axis=0).numpy(), t.softmax(0).numpy(), **TOL)
    with pytest.raises(TypeError, match="sum: got both dim= and its alias axis="):
        x.sum(dim=0, axis=1)


def test_type_converts_or_names():
    x = tl.tensor([1.7, -2.2])
    assert x.type(tl.int64).dtype is tl.int64
    np.testing.assert_array_equal(x.type(tl.int64).numpy(), torch.tensor([1.7, -2.2]).type(torch.int64).numpy())
    assert x.type() == "tinyllm.float32"
