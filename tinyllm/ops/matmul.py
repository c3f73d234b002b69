"""Matrix product: a primitive of its own because every runtime has a fast kernel for it."""
import numpy as np

from .base import Op, register, fmt


@register
class MATMUL(Op):
    """Y = A B over the last two axes, batch axes equal (the front end broadcasts them)
    ⇒  dA = dY Bᵀ, dB = Aᵀ dY   (the transposes are views: no data moves)"""
    autocast = "low"
    def infer(src, arg):
        a, b = src
        if (len(a.shape) < 2 or len(a.shape) != len(b.shape) or a.shape[:-2] != b.shape[:-2]
                or a.shape[-1] != b.shape[-2]):
            raise ValueError(f"shapes {fmt(a.shape, b.shape)} don't multiply: need (..., m, k) and (..., k, n)")
        if a.dtype is not b.dtype or not a.dtype.is_float:
            raise TypeError(f"needs two floating-point inputs of one dtype, got {a.dtype.name} and {b.dtype.name}")
        return a.shape[:-1] + b.shape[-1:], a.dtype
    def forward(a, b): return np.matmul(a, b)
    def backward(dy, y):
        a, b = y.src
        return (dy.matmul(b.transpose_last()), a.transpose_last().matmul(dy))
