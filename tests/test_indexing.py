"""Advanced indexing with several integer tensors (x[i0, i1], mixed with ints, slices, None and ...), values and
gradients against torch on every runtime, and its index errors."""
import re

import numpy as np
import pytest
import torch

import tinyllm as tl

pytestmark = pytest.mark.usefixtures("each_runtime")

I = np.array([0, 1, 1])
J = np.array([[0], [1]])
K = np.array([-1, 2, 0])
E = np.zeros((0,), np.int64)
S = slice(None)
# index builders: (i, j, k, e) are the index tensors above in the framework at hand; x has shape (5, 2, 3, 4)
CASES = {
    "adjacent": lambda i, j, k, e: (S, i, k),
    "adjacent_broadcast": lambda i, j, k, e: (S, j, i),
    "first_two": lambda i, j, k, e: (i, j),
    "all_four": lambda i, j, k, e: (i, j, i, k),
    "apart_go_first": lambda i, j, k, e: (i, S, k),
    "apart_broadcast": lambda i, j, k, e: (S, j, S, k),
    "int_is_select": lambda i, j, k, e: (S, i, S, 0),
    "int_then_apart": lambda i, j, k, e: (0, i, S, k),
    "none_between": lambda i, j, k, e: (i, None, i),
    "none_before": lambda i, j, k, e: (None, i, S, k),
    "ellipsis": lambda i, j, k, e: (Ellipsis, j, k),
    "slices": lambda i, j, k, e: (slice(1, 4), j, slice(None, None, 2), k),
    "lists": lambda i, j, k, e: ([0, 4], [1, 0]),
    "repeats": lambda i, j, k, e: (S, S, k, k),  # same element picked twice: the gradient adds up
    "empty": lambda i, j, k, e: (S, e, e),
}


@pytest.mark.parametrize("case", list(CASES))
def test_several_index_tensors_match_torch(case):
    x = np.random.default_rng(0).standard_normal((5, 2, 3, 4)).astype(np.float32)
    make = CASES[case]
    a, ta = tl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y = a[make(*(tl.tensor(v) for v in (I, J, K, E)))]
    ty = ta[make(*(torch.tensor(v) for v in (I, J, K, E)))]
    assert y.shape == tuple(ty.shape)
    np.testing.assert_array_equal(y.numpy(), ty.detach().numpy())
    up = np.random.default_rng(1).standard_normal(ty.shape).astype(np.float32)
    y.backward(tl.tensor(up))
    ty.backward(torch.from_numpy(up))
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_several_index_tensors_index_a_computed_tensor():
    """The indexed tensor is a graph, not a leaf: the GATHER reads a fused kernel's output (and a permuted one)."""
    x = np.random.default_rng(2).standard_normal((3, 4, 5)).astype(np.float32)
    a, ta = tl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    i, j = np.array([[2, 0], [1, 1]]), np.array([4, -5])
    y = (a * 2).exp()[tl.tensor(i), :, tl.tensor(j)] + 1
    ty = (ta * 2).exp()[torch.tensor(i), :, torch.tensor(j)] + 1
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-6)
    y.sum().backward()
    ty.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-5)


def _index_error(runtime, *fragments):
    """IndexError naming the index (NumPy, C: the host checks) or the kernel (WGSL: the GPU flags it), and the axis."""
    want = fragments if runtime != "wgsl" else ("GATHER", fragments[1])
    return pytest.raises(IndexError, match=".*".join(re.escape(str(f)) for f in want))


def test_index_out_of_range_names_the_index_and_axis(each_runtime):
    x = tl.randn(5, 2, 3)
    with _index_error(each_runtime, "index 9", "axis 0", "size 5"):
        x[tl.tensor([0, 9]), tl.tensor([0, 1])].numpy()
    with _index_error(each_runtime, "index -3", "axis 1", "size 2"):
        x[tl.tensor([0, 1]), tl.tensor([0, -3])].numpy()
    with _index_error(each_runtime, "index 2", "axis 1", "size 2"):  # in range as a linear index, not on its axis
        x[tl.tensor([0]), tl.tensor([2])].numpy()
    with _index_error(each_runtime, "index 3", "axis 2", "size 3"):
        x[:, tl.tensor([0, 1]), tl.tensor([3])].numpy()


def test_index_shapes_that_do_not_broadcast():
    with pytest.raises(ValueError, match=r"index.*\(2,\).*\(3,\)"):
        tl.randn(5, 2, 3)[tl.tensor([0, 1]), tl.tensor([0, 1, 1])]


def test_a_mask_before_an_ellipsis_takes_its_axes():
    """x[mask, ...] and x[:, mask2, ...]: a bool mask takes as many axes as it has (counted before ... expands),
    as torch."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 2)).astype(np.float32)
    mask, mask2 = rng.random((3, 4)) > 0.5, rng.random((4, 2)) > 0.5
    for index in (lambda m, m2: (m, ...), lambda m, m2: (..., m2), lambda m, m2: (slice(None), m2, ...)):
        ours = tl.tensor(x)[index(tl.tensor(mask), tl.tensor(mask2))]
        theirs = torch.tensor(x)[index(torch.tensor(mask), torch.tensor(mask2))]
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
