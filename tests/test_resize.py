"""F.pad (constant, reflect, replicate, circular; negative amounts crop) and F.interpolate (nearest, linear,
bilinear, with and without align_corners; by size or scale_factor), tinyllm/nn/resize.py, against torch: values
and input gradients, on every runtime. Tolerance: rtol 1e-5, atol 1e-5 (interpolation: a weighted sum of two)."""
import numpy as np
import pytest
import torch

import tinyllm as tl
import tinyllm.nn.functional as F

pytestmark = pytest.mark.usefixtures("each_runtime")
TOL = dict(rtol=1e-5, atol=1e-5)


def compare(fn, tfn, shape, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(np.float32)
    x, tx = tl.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    y, ty = fn(x), tfn(tx)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), **TOL)
    r = rng.standard_normal(ty.shape).astype(np.float32)
    (y * tl.tensor(r)).sum().backward()
    (ty * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **TOL)


@pytest.mark.parametrize("amounts, mode, value", [
    ((1, 2), "constant", None), ((1, 2, 2, 1), "constant", 3.5), ((-1, 2, 0, -2), "constant", None),
    ((2, 1, 1, 3), "reflect", None), ((2, 3, 1, 0), "replicate", None), ((2, 3, 5, 1), "circular", None),
    ((1, 1, 1, 1, 1, 1), "constant", -1.0)])
def test_pad(amounts, mode, value):
    kw = {} if value is None else {"value": value}
    compare(lambda x: F.pad(x, amounts, mode, **kw), lambda x: torch.nn.functional.pad(x, amounts, mode, **kw),
            (2, 3, 5, 6))


@pytest.mark.parametrize("shape, kw", [
    ((2, 3, 5, 6), dict(size=(7, 9))), ((2, 3, 5, 6), dict(scale_factor=2)),
    ((2, 3, 5, 6), dict(scale_factor=(1.5, 0.5))), ((2, 3, 5, 6), dict(size=(4, 3), mode="bilinear")),
    ((2, 3, 5, 6), dict(size=(9, 11), mode="bilinear", align_corners=True)),
    ((2, 3, 5, 6), dict(scale_factor=2, mode="bilinear")), ((2, 3, 7), dict(size=5, mode="linear")),
    ((2, 3, 7), dict(scale_factor=3, mode="linear", align_corners=True)), ((2, 3, 7), dict(size=10))],
    ids=lambda v: str(v))
def test_interpolate(shape, kw):
    compare(lambda x: F.interpolate(x, **kw), lambda x: torch.nn.functional.interpolate(x, **kw), shape)


def test_bad_arguments_say_what_to_change():
    x = tl.randn(1, 1, 3, 3)
    with pytest.raises(ValueError, match="mode must be one of"):
        F.pad(x, (1, 1), mode="wrap")
    with pytest.raises(ValueError, match="smaller than the axis"):
        F.pad(x, (3, 0), mode="reflect")
    with pytest.raises(ValueError, match="exactly one of size and scale_factor"):
        F.interpolate(x)
    with pytest.raises(ValueError, match="needs a 1-D spatial input"):
        F.interpolate(x, size=4, mode="linear")
