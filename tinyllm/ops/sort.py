"""Sorting: the one primitive whose composition would be far slower (comparing every pair is n² work and
memory; a sort is n log n)."""
import numpy as np

from .. import dtype as dt
from .base import Op, register


@register
class ARGSORT(Op):
    """y = the positions that sort x along axis arg[0], ascending or (arg[1]) descending; stable (equal values keep
    their order) and NaN largest, as torch. Integer positions carry no gradient: a sort's values are a gather of x
    by them, whose gradient is the scatter-add back to where each value came from."""
    autocast = "float32"
    def infer(src, arg):
        (x,) = src
        axis, _ = arg
        if not 0 <= axis < max(len(x.shape), 1):
            raise ValueError(f"ARGSORT: axis {axis} out of range for shape {x.shape}")
        return x.shape, dt.int64

    def forward(x, arg):
        axis, descending = arg
        if x.ndim == 0:
            return np.zeros((), np.int64)
        if not descending:
            return np.argsort(x, axis=axis, kind="stable")
        # descending and stable: sort the reversed axis ascending and read it backwards (NaN, last, comes first)
        n = x.shape[axis]
        return (n - 1) - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)

    def backward(dy, y): return (None,)
