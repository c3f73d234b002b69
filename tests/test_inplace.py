"""In-place updates and item assignment (tinyllm/tensor.py): the graph is functional, so an update rebinds the
tensor to its new value. Values and gradients against torch on every runtime; torch's error for a leaf that
requires grad; updates of parameters under no_grad keep the leaf. Tolerance: exact (no arithmetic beyond torch's)."""
import numpy as np
import pytest
import torch

import tinyllm as tl

pytestmark = pytest.mark.usefixtures("each_runtime")
A = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)


def both(fn):
    x, t = tl.tensor(A.copy()), torch.tensor(A.copy())
    fn(x, tl)
    fn(t, torch)
    np.testing.assert_array_equal(x.numpy(), t.numpy())


@pytest.mark.parametrize("name", ["add_", "sub_", "mul_", "div_", "clamp_", "zero_", "fill_", "masked_fill_"])
def test_update_methods(name):
    calls = {"add_": lambda x, m: x.add_(m.ones(3, 4), alpha=2), "sub_": lambda x, m: x.sub_(0.5),
             "mul_": lambda x, m: x.mul_(3.0), "div_": lambda x, m: x.div_(4.0),
             "clamp_": lambda x, m: x.clamp_(-0.5, 0.5), "zero_": lambda x, m: x.zero_(),
             "fill_": lambda x, m: x.fill_(2.5), "masked_fill_": lambda x, m: x.masked_fill_(x > 0, -1.0)}
    both(calls[name])


@pytest.mark.parametrize("case", ["int", "column", "steps", "row_tensor", "ellipsis", "index_tensor", "mask",
                                  "broadcast", "two_index_tensors"])
def test_setitem(case):
    def write(x, m):
        t = m.tensor
        {"int": lambda: x.__setitem__(0, 5.0), "column": lambda: x.__setitem__((slice(None), 1), 2.0),
         "steps": lambda: x.__setitem__((slice(0, 3, 2), slice(1, 4, 2)), 7.0),
         "row_tensor": lambda: x.__setitem__(1, t([1.0, 2.0, 3.0, 4.0])),
         "ellipsis": lambda: x.__setitem__((Ellipsis, 0), -1.0), "index_tensor": lambda: x.__setitem__(t([0, 2]), 9.0),
         "mask": lambda: x.__setitem__(x > 0, 0.0),
         "broadcast": lambda: x.__setitem__((slice(None), slice(0, 2)), t([[1.0], [2.0], [3.0]])),
         "two_index_tensors": lambda: x.__setitem__((t([0, 2]), t([3, 1])), t([8.0, 9.0]))}[case]()
    both(write)


def test_index_put_accumulates():
    def put(x, m):
        x.index_put_((m.tensor([0, 2, 0]), m.tensor([1, 3, 1])), m.tensor([1.0, 2.0, 3.0]), accumulate=True)
    both(put)


def test_gradients_flow_through_an_assignment():
    w, tw = tl.tensor(A, requires_grad=True), torch.tensor(A, requires_grad=True)
    v, tv = tl.tensor(np.full(4, 3.0, np.float32), requires_grad=True), torch.full((4,), 3.0, requires_grad=True)
    y, ty = w * 2.0, tw * 2.0
    y[1], ty[1] = v * v, tv * tv
    y.add_(w)
    ty.add_(tw)
    (y * y).sum().backward()
    (ty * ty).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(v.grad.numpy(), tv.grad.numpy(), rtol=1e-6)


def test_a_leaf_that_requires_grad_is_updated_only_under_no_grad():
    p = tl.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        p.add_(1.0)
    with tl.no_grad():
        p.sub_(0.5)
    assert p.is_leaf and p.requires_grad
    np.testing.assert_array_equal(p.numpy(), [0.5, 0.5])
    c = p.clone()
    c.zero_()  # a clone is not a leaf: updated in place, and p keeps its value
    np.testing.assert_array_equal(p.numpy(), [0.5, 0.5])
