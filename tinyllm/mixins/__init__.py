"""Tensor's methods by topic, as classes that tinyllm.tensor.Tensor inherits (tinygrad's mixins): arithmetic,
math_ops, reduce, movement, indexing, scatter, sorting, cumulative, products, host (NumPy on the host: bincount,
unique, ..., data_ptr), random (in-place random fills). A mixin builds on the core that tensor.py
defines (`_make`, `_as`, `_unary`, `_binary`, `_dim`, ...) and never imports it: the few places that make a tensor
from scratch go through `from_node` and `new_tensor` below, which tensor.py points at the Tensor class."""
from collections import namedtuple

import numpy as np

from .. import dtype as dt
from ..graph import build

MaxResult = namedtuple("MaxResult", "values indices")


class TensorLike:
    """The root of every mixin, so `isinstance(x, TensorLike)` tells a Tensor without importing tinyllm.tensor."""
    __slots__ = ()
    _Tensor = None  # tinyllm.tensor.Tensor, set where it is defined


def new_tensor(data, **kwargs):
    return TensorLike._Tensor(data, **kwargs)


def from_node(node, device):
    """The Tensor of a graph node on `device` (not requiring grad)."""
    return TensorLike._Tensor._from_node(node, device)


def broadcast_shape(shapes, name):
    """np.broadcast_shapes' result, without the arrays it makes to find it."""
    out = [1] * max((len(s) for s in shapes), default=0)
    for s in shapes:
        for i, d in enumerate(s, len(out) - len(s)):
            if d != out[i]:
                if out[i] == 1:
                    out[i] = d
                elif d != 1:
                    raise ValueError(f"{name}: shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot be "
                                     "broadcast together: sizes must match or be 1, aligned from the last axis")
    return tuple(out)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    if end is None:
        start, end = 0, start
    floats = any(isinstance(v, float) for v in (start, end, step))
    dtype = dt.to_dtype(dtype) if dtype is not None else dt.float32 if floats else dt.int64
    return new_tensor(np.arange(start, end, step), dtype=dtype, device=device, requires_grad=requires_grad)


def cat(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat: expected a non-empty list of tensors")
    for t in tensors:
        if isinstance(t, TensorLike) and t.is_complex():  # joined as (re, im) storages (tinyllm/complex.py)
            return t._cat(tensors, dim)
    first = tensors[0]
    d = first._dim(dim, "cat")
    dtype = first.dtype
    for t in tensors[1:]:
        dtype = dt.result_type(dtype, t.dtype)
    ts = [first._as(t).to(dtype) for t in tensors]
    for t in ts:
        if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != d):
            raise RuntimeError(f"cat: shapes {[t.shape for t in ts]} must match except in dimension {d}")
    if len(ts) == 1:
        return ts[0]
    return ts[0]._make(build("CAT", *[t._node for t in ts], arg=d), *ts[1:])
