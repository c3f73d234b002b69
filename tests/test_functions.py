"""torch's function forms (tinyllm/functions.py): `tinyllm.NAME(x, ...)` for every Tensor method that torch also
has as a function, with torch's values and gradients, on every runtime.

Tolerance: float32, rtol 1e-5 and atol 1e-6 for values and gradients (the same ops in possibly another order).
"""
import numpy as np
import pytest
import torch

import tinyllm as tl
from tinyllm.functions import NOT_FUNCTIONS, function_forms

pytestmark = pytest.mark.usefixtures("each_runtime")
TOL = dict(rtol=1e-5, atol=1e-6)
FORMS = sorted(function_forms(set()))  # every method that gets a form where no other tinyllm name takes it

# name -> (extra positional args, kwargs); the input is a (3, 4) float32 tensor with values in [0.5, 2]
CALLS = {
    "abs": ((), {}), "exp": ((), {}), "log": ((), {}), "sqrt": ((), {}), "rsqrt": ((), {}), "tanh": ((), {}),
    "sigmoid": ((), {}), "relu": ((), {}), "neg": ((), {}), "reciprocal": ((), {}), "square": ((), {}),
    "erf": ((), {}), "sum": ((), {}), "mean": ((1,), {}), "amax": ((0,), {}), "amin": ((1,), {}),
    "max": ((), {}), "min": ((), {}), "logsumexp": ((1,), {}), "softmax": ((1,), {}), "log_softmax": ((0,), {}),
    "std": ((), {}), "var": ((1,), {}), "t": ((), {}), "tril": ((), {}), "triu": ((), {"diagonal": 1}),
    "flatten": ((), {}), "reshape": (((4, 3),), {}), "permute": (((1, 0),), {}), "transpose": ((0, 1), {}),
    "unsqueeze": ((1,), {}), "squeeze": ((), {}), "narrow": ((1, 1, 2), {}), "pow": ((1.5,), {}),
    "clamp": ((), {"min": 0.8, "max": 1.5}), "clip": ((), {"min": 0.8}), "add": ((2.0,), {"alpha": 3}),
    "sub": ((0.5,), {}), "mul": ((3.0,), {}), "div": ((4.0,), {}), "maximum": ((), {}), "minimum": ((), {}),
    "matmul": ((), {}),
}
SECOND = {"maximum", "minimum", "matmul"}  # these take a second tensor: a (3, 4) one, or (4, 2) for matmul


def inputs():
    rng = np.random.default_rng(0)
    return rng.uniform(0.5, 2.0, (3, 4)).astype(np.float32), rng.uniform(0.5, 2.0, (3, 4)).astype(np.float32)


def test_every_form_is_a_torch_function_and_calls_its_method():
    assert {"exp", "add", "sum", "maximum", "softmax"} <= set(FORMS)
    assert not [n for n in FORMS if not hasattr(torch, n)], "a function form torch does not have"
    assert not set(FORMS) & NOT_FUNCTIONS
    x = tl.tensor(inputs()[0])
    for name in ("exp", "sum", "relu", "t"):
        np.testing.assert_array_equal(getattr(tl, name)(x).numpy(), getattr(x, name)().numpy())


def test_dtype_and_factory_names_keep_their_meaning():
    assert tl.float is tl.float32 and tl.bool is tl.bool_ and tl.long is tl.int64
    assert tl.where.__module__ == "tinyllm.factory"


def test_a_number_as_the_first_argument_takes_the_tensors_dtype_and_device():
    x = tl.tensor([1.0, 2.0])
    np.testing.assert_array_equal(tl.add(2, x).numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(tl.sub(1, x).numpy(), [0.0, -1.0])
    with pytest.raises(TypeError, match="Tensor as the first argument"):
        tl.exp(2.0)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_values_and_gradients_match_torch(name):
    assert name in FORMS, f"{name} has no function form"
    a, b = inputs()
    args, kwargs = CALLS[name]
    if name == "matmul":
        b = b.T.copy()
    x, tx = tl.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    y, ty = tl.tensor(b, requires_grad=True), torch.tensor(b, requires_grad=True)
    extra, textra = ((y,), (ty,)) if name in SECOND else ((), ())
    out = getattr(tl, name)(x, *extra, *args, **kwargs)
    tout = getattr(torch, name)(tx, *textra, *args, **kwargs)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), **TOL)
    (out * out).sum().backward()
    (tout * tout).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **TOL)
    if name in SECOND:
        np.testing.assert_allclose(y.grad.numpy(), ty.grad.numpy(), **TOL)
