"""Reductions over a tuple of axes (`arg`). The output keeps the reduced axes with size 1, so the backward rule
is a plain expand; the front end drops them when `keepdim=False`."""
import numpy as np

from .base import Reduce, register


@register
class SUM(Reduce):
    """y = Σᵢ xᵢ  ⇒  dxᵢ = dy (broadcast back over the reduced axes)"""
    def forward(x, arg): return np.sum(x, axis=arg, keepdims=True)
    def backward(dy, y): return (dy.expand(y.src[0].shape),)


@register
class REDUCE_MAX(Reduce):
    """y = maxᵢ xᵢ  ⇒  dxᵢ = dy · [xᵢ = y] / #{j : xⱼ = y} (ties share the gradient evenly, as torch's amax)"""
    def forward(x, arg): return np.max(x, axis=arg, keepdims=True)
    def backward(dy, y):
        x = y.src[0]
        hit = x.eq(y.expand(x.shape)).cast(dy.dtype)
        return (hit * (dy / hit.sum(y.arg)).expand(x.shape),)
