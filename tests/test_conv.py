"""Convolution and pooling (tinyllm/nn/conv.py: views + matmul or reduction) against torch.nn.functional, values
and gradients (input, weight, bias), on hypothesis-generated shapes and arguments, on every runtime.

Tolerance: float32 sums of up to C·K = 48 products of O(1) values, in another order than torch's: rtol 1e-4,
atol 1e-4 on values and gradients.
"""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
import tinyllm.nn.functional as F

pytestmark = pytest.mark.usefixtures("each_runtime")
TOL = dict(rtol=1e-4, atol=1e-4)
SMALL = settings(max_examples=12)  # each example compiles kernels (C) or pipelines (WGSL): keep the count small


def pair(rng, shape):
    a = rng.standard_normal(shape).astype(np.float32)
    return tl.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


def check(out, tout, pairs):
    """Values, then the gradients of Σ out·r (r fixed random) for every (tinyllm, torch) leaf pair."""
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), **TOL)
    r = np.random.default_rng(1).standard_normal(tout.shape).astype(np.float32)
    (out * tl.tensor(r)).sum().backward()
    (tout * torch.tensor(r)).sum().backward()
    for a, ta in pairs:
        np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), **TOL)


conv_cases = st.fixed_dictionaries({
    "d": st.sampled_from([1, 2, 3]), "groups": st.sampled_from([1, 2]), "k": st.integers(1, 3),
    "stride": st.integers(1, 2), "padding": st.integers(0, 2), "dilation": st.integers(1, 2),
    "bias": st.booleans(), "batched": st.booleans(), "seed": st.integers(0, 2**16)})


@SMALL
@given(conv_cases)
def test_conv_nd(case):
    d, g, k = case["d"], case["groups"], case["k"]
    rng = np.random.default_rng(case["seed"])
    size = {1: (9,), 2: (6, 5), 3: (4, 4, 3)}[d]
    if any(s + 2 * case["padding"] < case["dilation"] * (k - 1) + 1 for s in size):
        return
    x, tx = pair(rng, ((2,) if case["batched"] else ()) + (2 * g,) + size)
    w, tw = pair(rng, (2 * g, 2) + (k,) * d)
    b, tb = pair(rng, (2 * g,)) if case["bias"] else (None, None)
    kw = dict(stride=case["stride"], padding=case["padding"], dilation=case["dilation"], groups=g)
    out = getattr(F, f"conv{d}d")(x, w, b, **kw)
    tout = getattr(torch.nn.functional, f"conv{d}d")(tx, tw, tb, **kw)
    check(out, tout, [(x, tx), (w, tw)] + ([(b, tb)] if case["bias"] else []))


@SMALL
@given(st.integers(1, 3), st.integers(1, 2), st.integers(0, 1), st.integers(0, 1), st.integers(1, 2),
       st.sampled_from([1, 2]), st.integers(0, 2**16))
def test_conv_transpose2d(k, stride, padding, output_padding, dilation, groups, seed):
    if output_padding >= max(stride, dilation):
        output_padding = 0
    rng = np.random.default_rng(seed)
    x, tx = pair(rng, (2, 2 * groups, 4, 3))
    w, tw = pair(rng, (2 * groups, 3, k, k))
    b, tb = pair(rng, (3 * groups,))
    kw = dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups, dilation=dilation)
    if any(s <= 0 for s in torch.nn.functional.conv_transpose2d(tx, tw, tb, **kw).shape):
        return
    check(F.conv_transpose2d(x, w, b, **kw), torch.nn.functional.conv_transpose2d(tx, tw, tb, **kw),
          [(x, tx), (w, tw), (b, tb)])


@SMALL
@given(st.integers(1, 3), st.integers(1, 3), st.integers(0, 1), st.integers(1, 2), st.integers(0, 2**16))
def test_max_pool2d_with_indices(k, stride, padding, dilation, seed):
    if 2 * padding > k:
        padding = 0
    rng = np.random.default_rng(seed)
    x, tx = pair(rng, (2, 3, 7, 6))
    out, idx = F.max_pool2d(x, k, stride, padding, dilation, return_indices=True)
    tout, tidx = torch.nn.functional.max_pool2d(tx, k, stride, padding, dilation, return_indices=True)
    np.testing.assert_array_equal(idx.numpy(), tidx.numpy())
    check(out, tout, [(x, tx)])


@SMALL
@given(st.integers(1, 3), st.integers(1, 3), st.integers(0, 1), st.booleans(), st.integers(0, 2**16))
def test_avg_pool2d(k, stride, padding, count_include_pad, seed):
    if 2 * padding > k:
        padding = 0
    rng = np.random.default_rng(seed)
    x, tx = pair(rng, (2, 3, 7, 6))
    kw = dict(padding=padding, count_include_pad=count_include_pad)
    check(F.avg_pool2d(x, k, stride, **kw), torch.nn.functional.avg_pool2d(tx, k, stride, **kw), [(x, tx)])


def test_modules_have_torchs_parameter_shapes_and_names():
    pairs = [(tl.nn.Conv2d(4, 6, 3, groups=2), torch.nn.Conv2d(4, 6, 3, groups=2)),
             (tl.nn.Conv1d(3, 5, 2, bias=False), torch.nn.Conv1d(3, 5, 2, bias=False)),
             (tl.nn.Conv3d(2, 4, (1, 2, 3)), torch.nn.Conv3d(2, 4, (1, 2, 3))),
             (tl.nn.ConvTranspose2d(4, 6, 3, groups=2), torch.nn.ConvTranspose2d(4, 6, 3, groups=2))]
    for m, tm in pairs:
        assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == \
            {k: tuple(v.shape) for k, v in tm.state_dict().items()}
    net = tl.nn.Sequential(tl.nn.Conv2d(1, 4, 3, padding=1), tl.nn.ReLU(), tl.nn.MaxPool2d(2), tl.nn.AvgPool2d(2),
                           tl.nn.Flatten(), tl.nn.Linear(16, 2))
    assert net(tl.randn(5, 1, 8, 8)).shape == (5, 2)


def test_bad_input_names_the_op_and_the_fix():
    with pytest.raises(RuntimeError, match="conv2d: input has 3 channels"):
        F.conv2d(tl.randn(1, 3, 5, 5), tl.randn(4, 2, 3, 3))
    with pytest.raises(RuntimeError, match="conv2d: expected a 3-D .* or 4-D"):
        F.conv2d(tl.randn(5, 5), tl.randn(4, 1, 3, 3))
    with pytest.raises(RuntimeError, match="larger than the padded input"):
        F.conv2d(tl.randn(1, 1, 2, 2), tl.randn(1, 1, 3, 3))
    with pytest.raises(NotImplementedError, match="ceil_mode"):  # max pooling has it (tests/test_edges.py)
        F.avg_pool2d(tl.randn(1, 1, 4, 4), 2, ceil_mode=True)
