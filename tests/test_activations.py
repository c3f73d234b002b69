"""torch.nn.functional's activations and losses (tinyllm/nn/activations.py) and their nn modules, against torch:
values and input gradients on every runtime, NaN propagated as torch does, every reduction.

Inputs avoid the kinks (|x| >= 1e-3 from 0 and from each bound), where a one-sided gradient is a convention.
Tolerance: rtol 1e-4, atol 1e-5 (float32 through exp, log and tanh: a few ulp, with the C runtime's vector math
within 5 ulp)."""
import numpy as np
import pytest
import torch

import tinyllm as tl
import tinyllm.nn.functional as F

pytestmark = pytest.mark.usefixtures("each_runtime")
TOL = dict(rtol=1e-4, atol=1e-5)

ACTIVATIONS = [("silu", {}), ("softsign", {}), ("logsigmoid", {}), ("mish", {}), ("relu6", {}), ("hardsigmoid", {}),
               ("elu", {"alpha": 0.7}), ("celu", {"alpha": 1.5}), ("selu", {}), ("softplus", {}),
               ("softplus", {"beta": 2.0, "threshold": 5.0}), ("hardtanh", {"min_val": -2.0, "max_val": 1.5}),
               ("hardswish", {}), ("leaky_relu", {"negative_slope": 0.2}), ("normalize", {}),
               ("normalize", {"p": 1.0, "dim": 0}), ("softmin", {"dim": 1})]


def inputs(seed=0):
    a = (np.random.default_rng(seed).standard_normal((4, 6)) * 4).astype(np.float32)
    a[np.abs(a) < 1e-3] = 0.5
    for bound in (-3.0, -2.0, 1.5, 3.0, 6.0):
        a[np.abs(a - bound) < 1e-3] += 0.01
    a[1, 1], a[2, 2] = 40.0, -40.0  # no overflow in a branch not taken
    return a


@pytest.mark.parametrize("name, kw", ACTIVATIONS, ids=[f"{n}{kw}" for n, kw in ACTIVATIONS])
def test_activation_matches_torch(name, kw):
    a = inputs()
    x, tx = tl.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    y, ty = getattr(F, name)(x, **kw), getattr(torch.nn.functional, name)(tx, **kw)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), **TOL)
    r = np.random.default_rng(1).standard_normal(a.shape).astype(np.float32)
    (y * tl.tensor(r)).sum().backward()
    (ty * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **TOL)


@pytest.mark.parametrize("name, kw", [a for a in ACTIVATIONS if a[0] not in ("normalize", "softmin")],
                         ids=[f"{n}{kw}" for n, kw in ACTIVATIONS if n not in ("normalize", "softmin")])
def test_nan_goes_through_as_in_torch(name, kw):
    a = np.array([np.nan, -1.0, 2.0], np.float32)
    got = getattr(F, name)(tl.tensor(a), **kw).numpy()
    want = getattr(torch.nn.functional, name)(torch.tensor(a), **kw).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[0])


def _loss_case(name, reduction, rng):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    if name == "nll_loss":
        lp = x - np.log(np.exp(x).sum(1, keepdims=True))
        return lp.astype(np.float32), np.array([1, 4, -100, 0]), {"weight": rng.uniform(0.5, 2, 5).astype(np.float32)}
    if name == "binary_cross_entropy":
        return (1 / (1 + np.exp(-x))).astype(np.float32), rng.uniform(0, 1, x.shape).astype(np.float32), {}
    if name == "binary_cross_entropy_with_logits":
        return x, rng.uniform(0, 1, x.shape).astype(np.float32), {"pos_weight": rng.uniform(0.5, 2, 5).astype(np.float32)}
    return x, rng.standard_normal(x.shape).astype(np.float32), {}


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", ["l1_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "nll_loss"])
def test_loss_matches_torch(name, reduction):
    a, t, kw = _loss_case(name, reduction, np.random.default_rng(0))
    x, tx = tl.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    y = getattr(F, name)(x, tl.tensor(t), reduction=reduction, **{k: tl.tensor(v) for k, v in kw.items()})
    ty = getattr(torch.nn.functional, name)(tx, torch.tensor(t), reduction=reduction,
                                            **{k: torch.tensor(v) for k, v in kw.items()})
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), **TOL)
    y.sum().backward()
    ty.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **TOL)


def test_nll_loss_refuses_a_target_out_of_range():
    with pytest.raises(IndexError, match="out of range"):
        F.nll_loss(tl.randn(3, 4), tl.tensor([0, 4, 1])).item()


@pytest.mark.parametrize("module, args", [("LeakyReLU", (0.2,)), ("ELU", ()), ("Softplus", ()), ("Hardtanh", ()),
                                          ("SiLU", ()), ("Softmax", (1,)), ("LogSoftmax", (0,)), ("Softmin", (1,)),
                                          ("Tanh", ()), ("Sigmoid", ()), ("Mish", ()), ("ReLU6", ())])
def test_modules_match_torchs(module, args):
    a = inputs(2)
    np.testing.assert_allclose(getattr(tl.nn, module)(*args)(tl.tensor(a)).numpy(),
                               getattr(torch.nn, module)(*args)(torch.tensor(a)).numpy(), **TOL)


def test_loss_modules_match_torchs():
    rng = np.random.default_rng(3)
    logits, target = rng.standard_normal((5, 4)).astype(np.float32), np.array([0, 3, 1, -100, 2])
    for kw in ({}, {"label_smoothing": 0.1, "reduction": "sum"}, {"ignore_index": 1, "reduction": "none"}):
        t = target if "ignore_index" not in kw else np.where(target < 0, 1, target)  # -100 is a class index there
        np.testing.assert_allclose(tl.nn.CrossEntropyLoss(**kw)(tl.tensor(logits), tl.tensor(t)).numpy(),
                                   torch.nn.CrossEntropyLoss(**kw)(torch.tensor(logits), torch.tensor(t)).numpy(),
                                   **TOL)
    x, y = rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    for name in ("MSELoss", "L1Loss"):
        np.testing.assert_allclose(getattr(tl.nn, name)()(tl.tensor(x), tl.tensor(y)).numpy(),
                                   getattr(torch.nn, name)()(torch.tensor(x), torch.tensor(y)).numpy(), **TOL)
    with pytest.raises(NotImplementedError, match="weight="):
        tl.nn.CrossEntropyLoss(weight=tl.ones(4))
