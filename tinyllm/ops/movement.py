"""Movement primitives: they only rearrange elements. On a CPU runtime most are zero-copy views (strides)."""
import math

import numpy as np

from .base import Movement, Op, register


@register
class RESHAPE(Movement):
    """y = x with shape `arg` (same elements, row-major order)  ⇒  dx = reshape(dy, x.shape)"""
    def infer(src, arg):
        (x,) = src
        if math.prod(arg) != math.prod(x.shape) or any(s < 0 for s in arg):
            raise ValueError(f"shape {x.shape} ({math.prod(x.shape)} elements) cannot become {arg}")
        return arg, x.dtype
    def forward(x, arg): return np.reshape(x, arg)
    def backward(dy, y): return (dy.reshape(y.src[0].shape),)


@register
class PERMUTE(Movement):
    """y = x with axes reordered, yᵢ = x_{order⁻¹(i)}  ⇒  dx = permute(dy, order⁻¹)"""
    def infer(src, arg):
        (x,) = src
        if sorted(arg) != list(range(len(x.shape))):
            raise ValueError(f"{arg} is not a permutation of the {len(x.shape)} axes of {x.shape}")
        return tuple(x.shape[i] for i in arg), x.dtype
    def forward(x, arg): return np.transpose(x, arg)
    def backward(dy, y): return (dy.permute(tuple(np.argsort(y.arg))),)


@register
class EXPAND(Movement):
    """y = x broadcast to shape `arg` (size-1 axes repeated)  ⇒  dx = Σ dy over the repeated axes.
    This is the one place where broadcasting is undone: the front end broadcasts only through EXPAND."""
    def infer(src, arg):
        (x,) = src
        if len(arg) != len(x.shape) or any(s != a and s != 1 for s, a in zip(x.shape, arg)):
            raise ValueError(f"shape {x.shape} cannot be broadcast to {arg}")
        return arg, x.dtype
    def forward(x, arg): return np.broadcast_to(x, arg)
    def backward(dy, y):
        x = y.src[0]
        return (dy.sum(tuple(i for i, (s, a) in enumerate(zip(x.shape, y.arg)) if s != a)),)


def _slices(arg):
    return tuple(slice(*s) for s in arg)


def _sliced_shape(shape, arg, what):
    if len(arg) != len(shape) or any(not (0 <= a <= b <= s and st >= 1) for (a, b, st), s in zip(arg, shape)):
        raise ValueError(f"{what} {arg} does not fit shape {tuple(shape)}: need 0 <= start <= stop <= size, step >= 1")
    return tuple(-(-(b - a) // st) for a, b, st in arg)


@register
class SHRINK(Movement):
    """y = x[start:stop:step] on each axis (`arg`: one (start, stop, step) per axis)  ⇒  dx = PAD(dy) back into
    zeros of x's shape at the same positions"""
    def infer(src, arg):
        (x,) = src
        return _sliced_shape(x.shape, arg, "slice"), x.dtype
    def forward(x, arg): return x[_slices(arg)]
    def backward(dy, y):
        from ..graph import build
        return (build("PAD", dy, arg=(y.src[0].shape, y.arg)),)


@register
class PAD(Op):
    """y = zeros of shape `arg[0]` with x placed at the slices `arg[1]`  ⇒  dx = dy[slices]"""
    copies = True
    def infer(src, arg):
        (x,) = src
        shape, where = arg
        if _sliced_shape(shape, where, "placement") != x.shape:
            raise ValueError(f"placement {where} in {shape} does not hold an input of shape {x.shape}")
        return shape, x.dtype
    def forward(x, arg):
        out = np.zeros(arg[0], dtype=x.dtype)
        out[_slices(arg[1])] = x
        return out
    def backward(dy, y):
        from ..graph import build
        return (build("SHRINK", dy, arg=y.arg[1]),)


@register
class CAT(Op):
    """y = [x₁; x₂; …] joined along axis `arg`  ⇒  dxₖ = the slice of dy where xₖ sits"""
    copies = True
    def infer(src, arg):
        first = src[0]
        for x in src[1:]:
            if len(x.shape) != len(first.shape) or x.dtype is not first.dtype or any(
                    a != b for i, (a, b) in enumerate(zip(x.shape, first.shape)) if i != arg):
                raise ValueError(f"inputs {[s.shape for s in src]} ({[s.dtype.name for s in src]}) must match "
                                 f"in every axis but {arg}, and in dtype")
        shape = list(first.shape)
        shape[arg] = sum(x.shape[arg] for x in src)
        return tuple(shape), first.dtype
    def forward(*xs, arg):
        shape = list(xs[0].shape)
        shape[arg] = sum(x.shape[arg] for x in xs)
        # row-major whatever the inputs' strides (concatenate alone follows them), so views of it are free
        return np.concatenate(xs, axis=arg, out=np.empty(shape, xs[0].dtype))
    def backward(dy, y):
        from ..graph import build
        grads, start = [], 0
        for x in y.src:
            where = tuple((start, start + x.shape[i], 1) if i == y.arg else (0, s, 1) for i, s in enumerate(dy.shape))
            grads.append(build("SHRINK", dy, arg=where))
            start += x.shape[y.arg]
        return tuple(grads)
