"""Reductions over the outermost axis on the C runtime (a bias's gradient: dY summed over the rows). A thread must
own the outputs it writes, so such a kernel is split into slices of that axis instead, each reducing into its own
partial result, combined in order (tinyllm/runtime/c/render.py, _sliced): the values must be NumPy's, NaN included,
on shapes big enough to take that path. That 1 and 2 threads give the same bits is in test_c_runtime.py."""
import itertools

import numpy as np
import pytest

from hypothesis import HealthCheck, given, settings, strategies as st

import tinyllm as tl
from tinyllm.runtime.c import render as render_c

_fresh = itertools.count(1)


def fresh_constant():
    """A constant (exact in float32) that no kernel of this process used yet: its kernel is compiled, and so
    printed at TINYLLM_DEBUG=2, even when hypothesis replays an example."""
    return 1.0 + next(_fresh) * 2.0**-20


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # env, capture
@given(rows=st.integers(render_c.SLICES, 700), inner=st.sampled_from([(2,), (37,), (3, 41), (128,)]),
       axes=st.sampled_from(["first", "all but last"]), op=st.sampled_from(["sum", "amax"]),
       nan=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_reductions_over_the_outer_axis_match_numpy(rows, inner, axes, op, nan, seed, monkeypatch, capsys):
    rows = max(rows, -(-render_c.PARALLEL_MIN // int(np.prod(inner))))  # smaller kernels run on one thread, unsliced
    shape = (rows, *inner)
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    if nan:
        x[rows * 3 // 4, ..., 0] = np.nan  # in the last slice: it must still win
    dims = (0,) if axes == "first" else tuple(range(len(shape) - 1))
    c = fresh_constant()
    monkeypatch.setenv("TINYLLM_DEBUG", "2")
    t = tl.tensor(x, device="c") * c
    got = t.sum(dims).numpy() if op == "sum" else t.amax(dims).numpy()
    assert "part[" in capsys.readouterr().out, "the reduction did not take the sliced path"
    y = x * np.float32(c)
    want = y.astype(np.float64).sum(dims) if op == "sum" else y.max(dims)
    if op == "sum":  # float32 sums of up to ~30,000 terms in another order than float64's
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(x.size / want.size))
    else:
        np.testing.assert_array_equal(got, want)  # max picks one of the values: exact, NaN where NumPy has it


@pytest.mark.parametrize("op", ["sum", "amax"])
def test_small_or_inner_reductions_keep_one_thread_each_output(op, monkeypatch, capsys):
    """Reductions of the innermost axis (one accumulator per output, outputs split among threads) and small ones
    take the other paths."""
    c = fresh_constant()
    monkeypatch.setenv("TINYLLM_DEBUG", "2")
    x = np.random.default_rng(0).standard_normal((300, 200)).astype(np.float32)
    rows = getattr(tl.tensor(x, device="c") * c, op)(-1).numpy()
    small = getattr(tl.tensor(x[:20, :20], device="c") * c, op)(0).numpy()
    x = x * np.float32(c)
    assert "part[" not in capsys.readouterr().out
    ref = np.sum if op == "sum" else np.max
    np.testing.assert_allclose(rows, ref(x, -1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(small, ref(x[:20, :20], 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("runtime", ["numpy", "c"])
@pytest.mark.parametrize("shape, axis", [((3, 4, 56), 1), ((2, 3, 4, 8, 7), 2), ((2, 4, 8, 7), 1), ((5, 6, 100), 1),
                                         ((2, 9, 64), 1), ((3, 4, 3), 1)])
def test_max_over_a_middle_axis_into_wide_rows(runtime, shape, axis):
    """A max over a middle axis accumulates straight into the output rows. Written as a conditional store, GCC 12
    (-O3 -march=native, AVX-512) compiled it into masked stores that lost updates and wrote out of bounds (a conv's
    max_pool2d found it: wrong values, then a corrupted heap); the renderer stores unconditionally."""
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    a[..., ::7] = np.where(np.arange(shape[0]).reshape(-1, *(1,) * (len(shape) - 1)) == 1, np.nan, a[..., ::7])
    x = tl.tensor(a, device=runtime, requires_grad=True)
    y = x.amax(axis, keepdim=True)
    np.testing.assert_array_equal(y.numpy(), a.max(axis, keepdims=True))
    y.sum().backward()  # ties share the gradient; NaN rows give NaN as in torch
    assert x.grad.shape == shape
