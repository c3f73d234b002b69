"""Bad input gives a clear error that names the op and the shapes involved, not just some exception."""
import re

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinyllm as tl
import tinyllm.runtime
from helpers import shapes
from helpers import reference_runtime  # noqa: F401  (autouse: this module runs on the NumPy reference runtime)


def raises(exc, *fragments):
    """pytest.raises that also requires every fragment (literal text) in the message, in order."""
    return pytest.raises(exc, match=".*".join(re.escape(str(f)) for f in fragments))


# ---- shapes that don't fit -----------------------------------------------------------------------------

@given(m=st.integers(1, 4), k=st.integers(1, 4), j=st.integers(1, 4), n=st.integers(1, 4))
def test_matmul_inner_dims_mismatch(m, k, j, n):
    if k == j:
        j += 1
    with raises(RuntimeError, "matmul", (m, k), (j, n), f"{k} != {j}"):
        tl.randn(m, k) @ tl.randn(j, n)


def test_matmul_other_mismatches():
    with raises(RuntimeError, "matmul", (3,), (4,)):
        tl.randn(3) @ tl.randn(4)
    with raises(RuntimeError, "matmul", "batch", (2, 2, 3), (3, 3, 4)):
        tl.randn(2, 2, 3) @ tl.randn(3, 3, 4)
    with raises(RuntimeError, "matmul", (2, 3), "()"):
        tl.randn(2, 3) @ tl.tensor(2.0)


@given(shp=shapes(min_dims=1, min_side=2), extra=st.integers(1, 3))
def test_broadcast_mismatch_names_op_and_shapes(shp, extra):
    bad = shp[:-1] + (shp[-1] + extra,)
    for name, fn in [("add", lambda a, b: a + b), ("mul", lambda a, b: a * b), ("maximum", lambda a, b: a.maximum(b)),
                     ("lt", lambda a, b: a < b)]:
        with raises(ValueError, name, shp, bad, "broadcast"):
            fn(tl.randn(*shp), tl.randn(*bad))


def test_where_and_masked_fill_shape_mismatch():
    x = tl.randn(2, 3)
    with raises(ValueError, "where", (2, 3), (4,)):
        (x > 0).where(x, tl.randn(4))
    with raises(ValueError, "masked_fill", (4,), (2, 3)):
        x.masked_fill(tl.tensor([True, False, True, False]), 0.0)
    with raises(ValueError, "masked_fill", (2, 2, 3), (2, 3)):  # torch keeps self's shape
        x.masked_fill(tl.Tensor(np.ones((2, 2, 3), dtype=bool)), 0.0)


def test_cat_stack_split_expand_mismatches():
    x = tl.randn(2, 3)
    with raises(RuntimeError, "cat", (2, 3), (3, 3), "dimension 1"):
        tl.cat([x, tl.randn(3, 3)], 1)
    with raises(RuntimeError, "stack", (2, 3), (3, 2)):
        tl.stack([x, tl.randn(3, 2)])
    with raises(RuntimeError, "split", "[1, 1]", 3, (2, 3)):
        x.split([1, 1], 1)
    with raises(RuntimeError, "expand", (2, 3), (4, 3)):
        x.expand(4, 3)
    with raises(RuntimeError, "chunk", "positive"):
        x.chunk(0)


# ---- dtypes --------------------------------------------------------------------------------------------

def test_float_index_tensor():
    x = tl.randn(4, 3)
    with raises(TypeError, "int64", "float32", (2,), (4, 3)):
        x[tl.tensor([0.0, 1.0])]
    with raises(TypeError, "int64", "float32"):
        x[:, tl.tensor([1.0])]


def test_other_dtype_errors():
    x = tl.randn(2, 3)
    with raises(TypeError, "masked_fill", "bool", "float32"):
        x.masked_fill(x, 0.0)
    with raises(TypeError, "where", "bool", "float32"):
        x.where(x, x)
    with raises(RuntimeError, "requires_grad", "int64"):
        tl.tensor([1, 2], requires_grad=True)
    with raises(TypeError, "dtype", "complex"):
        tl.tensor([1.0], dtype="complex")
    with raises(TypeError, "build a tensor", "str"):
        tl.Tensor("abc")


# ---- views, reshapes, dims ------------------------------------------------------------------------------

def test_view_of_non_contiguous():
    x = tl.randn(3, 4)
    with raises(RuntimeError, "view", (4, 3), "strides", (1, 4), (12,), "reshape"):
        x.T.view(12)


@given(shp=shapes(min_dims=1), bad=st.integers(2, 7))
def test_bad_reshape(shp, bad):
    n = int(np.prod(shp))
    new = (n + bad,)
    with raises(RuntimeError, "reshape", new, n, shp):
        tl.randn(*shp).reshape(*new)
    with raises(RuntimeError, "view", new, shp):
        tl.randn(*shp).view(new)


def test_bad_reshape_wildcards():
    x = tl.randn(2, 3)
    with raises(RuntimeError, "reshape", (-1, 4), 6, (2, 3)):
        x.reshape(-1, 4)
    with raises(RuntimeError, "view", "only one dimension can be -1", (-1, -1)):
        x.view(-1, -1)


@pytest.mark.parametrize("name, fn", [
    ("sum", lambda x, d: x.sum(d)), ("mean", lambda x, d: x.mean(d)), ("amax", lambda x, d: x.amax(d)),
    ("max", lambda x, d: x.max(d)), ("min", lambda x, d: x.min(d)), ("argmax", lambda x, d: x.argmax(d)),
    ("var", lambda x, d: x.var(d)), ("softmax", lambda x, d: x.softmax(d)),
    ("log_softmax", lambda x, d: x.log_softmax(d)), ("logsumexp", lambda x, d: x.logsumexp(d)),
    ("transpose", lambda x, d: x.transpose(0, d)), ("squeeze", lambda x, d: x.squeeze(d)),
    ("unsqueeze", lambda x, d: x.unsqueeze(d)), ("cat", lambda x, d: tl.cat([x, x], d)),
    ("split", lambda x, d: x.split(1, d)), ("flatten", lambda x, d: x.flatten(d)),
])
@given(shp=shapes(min_dims=1, max_dims=3), sign=st.sampled_from([1, -1]))
def test_dim_out_of_range(name, fn, shp, sign):
    slack = name == "unsqueeze"  # unsqueeze accepts one more position
    d = len(shp) + slack if sign > 0 else -len(shp) - 1 - slack
    with raises(IndexError, name, "dimension", d, "out of range", shp):
        fn(tl.randn(*shp), d)


def test_bad_expand_flatten_narrow():
    with raises(RuntimeError, "expand", "-1", (3,)):
        tl.randn(3).expand(-1, 3)
    with raises(RuntimeError, "flatten", "start_dim", (2, 3, 4)):
        tl.randn(2, 3, 4).flatten(2, 1)
    with raises(RuntimeError, "narrow", "size 3", (2, 3)):
        tl.randn(2, 3).narrow(1, 2, 2)


def test_repeated_dims():
    with raises(RuntimeError, "sum", (0, -2), "more than once", (2, 3)):
        tl.randn(2, 3).sum((0, -2))
    with raises(RuntimeError, "permute", (0, 0)):
        tl.randn(2, 3).permute(0, 0)


# ---- indexing -----------------------------------------------------------------------------------------

@given(shp=shapes(min_dims=1), data=st.data())
def test_int_index_out_of_range(shp, data):
    d = data.draw(st.integers(0, len(shp) - 1))
    i = data.draw(st.sampled_from([shp[d], shp[d] + 3, -shp[d] - 1]))
    with raises(IndexError, f"index {i}", f"dimension {d}", f"size {shp[d]}", shp):
        tl.randn(*shp)[(slice(None),) * d + (i,)]


def test_tensor_index_out_of_range_names_gather_and_shapes():
    x = tl.randn(2, 3)
    with raises(IndexError, "GATHER", "index 5", "axis 0", "size 2", (2, 3), (2,)):
        x[tl.tensor([0, 5])].numpy()
    with raises(IndexError, "GATHER", "index -4", "axis 1", "size 3"):
        x[:, tl.tensor([-4])].numpy()


def test_unsupported_indexing():
    x = tl.randn(2, 3)
    with raises(IndexError, "too many indices", (2, 3), "3 given"):
        x[0, 0, 0]
    with raises(ValueError, "step", "-1"):
        x[::-1]
    with raises(IndexError, "mask of shape", (3,), "does not match", (2,)):
        x[tl.tensor([True, False, True])]


# ---- autograd misuse ----------------------------------------------------------------------------------

def test_backward_on_non_scalar_without_gradient():
    y = tl.randn(2, 3, requires_grad=True) * 2
    with raises(RuntimeError, "backward", "scalar", (2, 3), "gradient="):
        y.backward()


def test_backward_with_wrong_gradient_shape_and_without_grad():
    y = tl.randn(2, 3, requires_grad=True) * 2
    with raises(RuntimeError, "backward", (3,), (2, 3)):
        y.backward(gradient=tl.ones(3))
    with raises(RuntimeError, "backward", "does not require grad"):
        tl.randn(3).sum().backward()


def test_second_backward_through_a_freed_graph():
    loss = (tl.randn(3, requires_grad=True) ** 2).sum()
    loss.backward()
    with raises(RuntimeError, "backward", "freed", "retain_graph=True"):
        loss.backward()


def test_item_of_many_elements():
    with raises(ValueError, "item", (2, 3)):
        tl.randn(2, 3).item()


# ---- runtimes -----------------------------------------------------------------------------------------

def test_unknown_device():
    with raises(ValueError, "unknown runtime", "'nope'", "numpy"):
        tl.Tensor([1.0], device="nope")
    with raises(ValueError, "unknown runtime", "'nope'"):
        tl.zeros(2, device="nope")


def test_unknown_runtime_from_environment(monkeypatch):
    monkeypatch.setenv("TINYLLM_RUNTIME", "bogus")
    with raises(ValueError, "unknown runtime", "'bogus'", "TINYLLM_RUNTIME"):
        tinyllm.runtime.get()
    with raises(ValueError, "unknown runtime", "'bogus'"):
        tl.Tensor([1.0])
    monkeypatch.setenv("TINYLLM_RUNTIME", "numpy")
    assert tinyllm.runtime.get().name == "numpy"
