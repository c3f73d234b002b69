"""Integer indexing along one axis: the embedding lookup and its adjoint, the scatter-add."""
import numpy as np

from .. import dtype as dt
from .base import Op, register


def check_index(idx, n, op, axis, shape):
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx.max() if idx.max() >= n else idx.min()
        raise IndexError(f"{op}: index {bad} is out of range for axis {axis} of size {n} (input shape {shape}, "
                         f"indices of shape {idx.shape})")


@register
class GATHER(Op):
    """y = x.take(idx, axis)  (y[..., i, ...] = x[..., idx[i], ...])
    ⇒  dx = SCATTER_ADD(dy, idx): each row of dy is added back where it was read from"""
    autocast = "float32"
    def infer(src, arg):
        x, idx = src
        if idx.dtype is not dt.int64:
            raise TypeError(f"indices must be int64, got {idx.dtype.name}: use .long()")
        if not 0 <= arg < len(x.shape):
            raise ValueError(f"axis {arg} out of range for shape {x.shape}")
        return x.shape[:arg] + idx.shape + x.shape[arg + 1:], x.dtype
    def forward(x, idx, arg):
        check_index(idx, x.shape[arg], "GATHER", arg, x.shape)
        return np.take(x, idx, axis=arg)
    def backward(dy, y):
        from ..graph import build
        x, idx = y.src
        return (build("SCATTER_ADD", dy, idx, arg=(y.arg, x.shape[y.arg])), None)


@register
class SCATTER_ADD(Op):
    """y = zeros with y[..., idx[i], ...] += x[..., i, ...] (`arg` = (axis, size))  ⇒  dx = GATHER(dy, idx)"""
    autocast = "float32"
    def infer(src, arg):
        x, idx = src
        axis, n = arg
        if idx.dtype is not dt.int64:
            raise TypeError(f"indices must be int64, got {idx.dtype.name}")
        if x.shape[axis:axis + len(idx.shape)] != idx.shape:
            raise ValueError(f"input {x.shape} does not hold index shape {idx.shape} at axis {axis}")
        return x.shape[:axis] + (n,) + x.shape[axis + len(idx.shape):], x.dtype
    def forward(x, idx, arg):
        axis, n = arg
        check_index(idx, n, "SCATTER_ADD", axis, x.shape)
        shape = x.shape[:axis] + (n,) + x.shape[axis + idx.ndim:]
        out = np.zeros(shape, dtype=x.dtype)
        rows = np.moveaxis(x, list(range(axis, axis + idx.ndim)), list(range(idx.ndim)))
        np.add.at(np.moveaxis(out, axis, 0), idx, rows)
        return out
    def backward(dy, y):
        from ..graph import build
        return (build("GATHER", dy, y.src[1], arg=y.arg[0]), None)
