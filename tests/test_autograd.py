"""Autograd behaviour beyond single ops: deep graphs, accumulation, no_grad, detach, shared subexpressions,
explicit upstream gradients, which tensors require grad, zero-copy views and the memory counters."""
import math
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

import tinyllm as tl
from helpers import SEEDS
from helpers import reference_runtime  # noqa: F401  (autouse: this module runs on the NumPy reference runtime)


def leaf(*shape, seed=0, dtype=tl.float64):
    return tl.Tensor(np.random.default_rng(seed).uniform(-1, 1, shape), dtype=dtype, requires_grad=True)


def test_deep_chain_builds_differentiates_and_runs():
    """20,000 ops in one chain: every graph walk (build, autograd, rewrite, schedule, run) must be iterative."""
    assert sys.getrecursionlimit() < 20_000  # so a recursive walk would fail
    x = leaf(3)
    y, a, b = x, 1.00001, 0.001
    for _ in range(10_000):
        y = y * a + b  # two ops per step
    loss = y.sum()
    loss.backward()
    want = x.numpy() * a ** 10_000 + b * sum(a ** k for k in range(10_000))
    assert loss.item() == pytest.approx(want.sum(), rel=1e-9)
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, a ** 10_000), rtol=1e-9)


def test_gradients_accumulate_across_backward_calls():
    x, w = leaf(2, 3), leaf(3, seed=1)
    (x * w).sum().backward()
    first = x.grad.numpy().copy()
    np.testing.assert_allclose(first, np.broadcast_to(w.numpy(), (2, 3)))
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), first + 2 * x.numpy())
    np.testing.assert_allclose(w.grad.numpy(), x.numpy().sum(0))  # w was not in the second graph


def test_no_grad_context():
    x = leaf(3)
    with tl.no_grad():
        y = x * 2
        assert not tl.is_grad_enabled()
    assert tl.is_grad_enabled()
    assert not y.requires_grad
    z = (y * x).sum()  # the path through y carries no gradient: dz/dx = y = 2x, not 4x
    z.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.numpy())


def test_no_grad_decorator_and_nesting():
    x = leaf(3)

    @tl.no_grad()
    def double(t):
        return t * 2

    y = double(x)
    assert not y.requires_grad and tl.is_grad_enabled()
    with tl.no_grad():
        with tl.no_grad():
            pass
        assert not tl.is_grad_enabled()
    assert tl.is_grad_enabled()
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.sum().backward()


def test_no_grad_restores_state_after_an_exception():
    with pytest.raises(ZeroDivisionError):
        with tl.no_grad():
            1 / 0
    assert tl.is_grad_enabled()


@given(seed=SEEDS)
def test_shared_subexpressions_match_torch(seed):
    a = np.random.default_rng(seed).uniform(-1, 1, (3, 4))

    def f(x, lib):
        y = x * x
        z = y.exp() + y * y - y.tanh() * x  # y used four times, x three
        return (z @ x.T + y.sum()).sum()

    xt, xl = torch.tensor(a, requires_grad=True), tl.Tensor(a, requires_grad=True)
    f(xt, torch).backward()
    f(xl, tl).backward()
    np.testing.assert_allclose(xl.grad.numpy(), xt.grad.numpy(), rtol=1e-10)


def test_same_tensor_as_both_operands():
    x = leaf(4)
    (x * x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 3 * x.numpy() ** 2)
    x.grad = None
    (x + x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(4, 2.0))


@given(seed=SEEDS)
def test_backward_with_explicit_gradient(seed):
    rng = np.random.default_rng(seed)
    x = tl.Tensor(rng.uniform(-1, 1, (2, 3)), requires_grad=True)
    g = rng.standard_normal((2, 3))
    x.tanh().backward(gradient=tl.Tensor(g))
    np.testing.assert_allclose(x.grad.numpy(), g * (1 - np.tanh(x.numpy()) ** 2), rtol=1e-12)


def test_backward_gradient_is_cast_and_can_be_a_list():
    x = leaf(2)  # float64
    (x * 3).backward(gradient=[1.0, 2.0])
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 6.0])


def test_detach_stops_gradients():
    x = leaf(3)
    d = x.detach()
    assert not d.requires_grad and d.is_leaf
    np.testing.assert_array_equal(d.numpy(), x.numpy())
    (x * d).sum().backward()  # d is a constant: the gradient is d, not 2x
    np.testing.assert_allclose(x.grad.numpy(), x.numpy())
    y = leaf(3, seed=1)
    ((y * 2).detach() * y).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), 2 * y.numpy())


def test_grad_is_none_for_unused_leaves_and_non_leaves():
    x, unused = leaf(3), leaf(3, seed=1)
    h = x * 2
    h.sum().backward()
    assert unused.grad is None
    assert h.grad is None  # only leaves keep .grad, as torch
    assert x.grad is not None


def test_retain_graph_allows_a_second_backward():
    x = leaf(3)
    loss = (x * x).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), 4 * x.numpy())


def test_requires_grad_propagation():
    x, c = leaf(2), tl.Tensor([1.0, 2.0], dtype=tl.float64)
    assert x.requires_grad and x.is_leaf and x.grad_fn is None
    assert not c.requires_grad
    y = x * c
    assert y.requires_grad and not y.is_leaf and y.grad_fn is not None
    assert not (c * c).requires_grad
    assert (c + y).requires_grad
    assert not (x > 0).requires_grad and not x.argmax().requires_grad and not x.long().requires_grad
    assert (x > 0).where(x, 0.0).requires_grad and x.long().double().requires_grad is False
    c.requires_grad_()
    assert c.requires_grad and c.is_leaf
    with pytest.raises(RuntimeError, match="leaf"):
        y.requires_grad_(False)
    with pytest.raises(RuntimeError, match="floating-point"):
        tl.Tensor([1, 2]).requires_grad_()


def test_item_before_backward_keeps_gradients_correct():
    x = leaf(3, 4)
    loss = (x.tanh() @ x.T).sum()
    value = loss.item()
    loss.backward()
    xt = torch.tensor(x.numpy(), requires_grad=True)
    want = (xt.tanh() @ xt.T).sum()
    want.backward()
    assert value == pytest.approx(want.item(), rel=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-12)


def test_realize_intermediate_then_backward():
    x = leaf(3)
    h = x.exp().realize()
    (h * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp(x.numpy()) * (1 + x.numpy()), rtol=1e-12)


def test_backward_frees_the_graph_but_keeps_the_value():
    x = leaf(3)
    loss = (x * x).sum()
    loss.backward()
    assert loss.item() == pytest.approx(float((x.numpy() ** 2).sum()))


# ---- views: zero-copy where torch is, copies where it must ----------------------------------------------

def test_transpose_is_zero_copy():
    x = tl.randn(3, 4).realize()
    t = x.transpose(0, 1)
    assert t.stride() == (1, 4) and not t.is_contiguous()
    before = tl.memory_allocated()
    assert np.shares_memory(t.numpy(), x.numpy())
    assert tl.memory_allocated() == before
    np.testing.assert_array_equal(t.numpy(), x.numpy().T)


def test_slices_and_expand_have_torch_strides():
    x = tl.randn(4, 6).realize()
    xt = torch.tensor(x.numpy())
    assert x[1:, ::2].stride() == xt[1:, ::2].stride()
    assert x[:, None].expand(4, 3, 6).stride() == xt[:, None].expand(4, 3, 6).stride()
    assert x.permute(1, 0)[::2].stride() == xt.permute(1, 0)[::2].stride()


def test_view_of_non_contiguous_raises_and_contiguous_view_works():
    x = tl.randn(3, 4)
    with pytest.raises(RuntimeError, match="view"):
        x.T.view(12)
    v = x.T.contiguous().view(12)
    np.testing.assert_array_equal(v.numpy(), x.numpy().T.reshape(12))
    # a transpose of size-1 axes, or splitting a non-contiguous axis, is still a view, as in torch
    assert tl.randn(1, 4).T.view(4).shape == (4,)
    assert x.T.view(2, 2, 3).shape == (2, 2, 3)


def test_reshape_views_when_it_can_and_copies_when_it_must():
    x = tl.randn(3, 4).realize()
    v = x.reshape(2, 6)
    assert v.stride() == (6, 1) and np.shares_memory(v.numpy(), x.numpy())
    c = x.T.reshape(12)
    assert c.is_contiguous()
    np.testing.assert_array_equal(c.numpy(), x.numpy().T.reshape(12))
    assert not np.shares_memory(c.numpy(), x.numpy())


def test_memory_stats():
    x = tl.randn(512, 512).realize()  # 1 MiB
    tl.reset_peak_memory_stats()
    base = tl.max_memory_allocated()
    assert base == tl.memory_allocated()
    h = (x * 2.0).realize()  # a realized 1 MiB intermediate (a fusing runtime would otherwise never hold it)
    s = (h + 1.0).sum().realize()
    del h
    peak = tl.max_memory_allocated()
    assert peak - base >= x.numel() * 4
    assert tl.memory_allocated() < peak  # the intermediate is gone
    np.testing.assert_allclose(s.item(), (x.numpy() * 2 + 1).sum(), rtol=1e-4)
    tl.reset_peak_memory_stats()
    assert tl.max_memory_allocated() == tl.memory_allocated() < peak


def test_memory_is_released_when_tensors_die():
    base = tl.memory_allocated()
    x = tl.randn(256, 256).realize()
    assert tl.memory_allocated() - base >= 256 * 256 * 4
    del x
    assert tl.memory_allocated() - base < 256 * 256 * 4


@given(n=st.integers(1, 40))
def test_sum_of_n_uses_gives_n(n):
    x = leaf(2)
    sum(x for _ in range(n)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(2, float(n)))
    assert math.isfinite(float(x.grad.sum()))


def test_backward_and_realize_leave_the_cyclic_collector_as_they_found_it():
    """backward and realize pause Python's cyclic collector while they build and free their graph (graph.bulk):
    on again afterwards, also after an error, and left off where the caller had turned it off."""
    import gc
    was = gc.isenabled()
    try:
        gc.enable()
        x = leaf(3)
        (x * x).sum().backward()
        assert gc.isenabled()
        with pytest.raises(RuntimeError, match="implicitly"):
            (x * 2).backward()
        assert gc.isenabled()
        gc.disable()
        (x * x).sum().backward()
        tl.realize(x * 3)
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
