"""F.pad and F.interpolate: which input element each output element reads is known from the shapes alone, so
it is computed on the host (NumPy) and applied with a gather along each axis; the gradient is the gather's
(a scatter-add back). Constant padding is the PAD primitive instead, with no index at all (pad_constant, which
convolution and pooling use too).
"""
import math

import numpy as np

from .. import factory
from ..graph import build

PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _take(x, axis, index):
    where = (slice(None),) * axis + (factory.tensor(np.asarray(index, np.int64), device=x.device),)
    return x[where]


def pad(input, pad, mode="constant", value=None):
    """torch.nn.functional.pad: `pad` = (left, right) for the last axis, then (top, bottom) for the one before, …
    Negative amounts crop. Modes: constant (with `value`, default 0), reflect, replicate, circular."""
    if mode not in PAD_MODES:
        raise ValueError(f"pad: mode must be one of {', '.join(PAD_MODES)}, got {mode!r}")
    if len(pad) % 2 or len(pad) // 2 > input.ndim:
        raise ValueError(f"pad: {tuple(pad)} must hold a (before, after) pair for each of at most {input.ndim} "
                         "trailing axes")
    if mode != "constant" and value not in (None, 0):
        raise ValueError(f"pad: value= applies to mode 'constant' only, not {mode!r}")
    pairs = [(pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)]  # last axis first
    if mode == "constant":
        return pad_constant(input, pairs[::-1], 0.0 if value is None else value)
    x = input
    for i, (lo, hi) in enumerate(pairs):
        axis = input.ndim - 1 - i
        n = x.shape[axis]
        if mode == "reflect" and (lo >= n or hi >= n):
            raise ValueError(f"pad: reflect padding ({lo}, {hi}) must be smaller than the axis it pads ({n})")
        if mode == "circular" and (lo > n or hi > n):
            raise ValueError(f"pad: circular padding ({lo}, {hi}) must be at most the axis it pads ({n})")
        i = np.arange(-lo, n + hi)
        if mode == "reflect":
            i = np.abs(i)
            i = np.where(i > n - 1, 2 * (n - 1) - i, i)
        elif mode == "replicate":
            i = np.clip(i, 0, n - 1)
        else:
            i = i % n
        x = _take(x, axis, i)
    return x


def pad_constant(x, amounts, value=0.0):
    """x with amounts[i] = (before, after) elements of `value` on the i-th of its last len(amounts) axes; negative
    amounts crop. One SHRINK for the crops, one PAD (and a mask for a nonzero value) for the rest."""
    d = len(amounts)
    lead = tuple((0, s, 1) for s in x.shape[:x.ndim - d])
    if any(lo < 0 or hi < 0 for lo, hi in amounts):
        crop = tuple((max(-lo, 0), s - max(-hi, 0), 1) for (lo, hi), s in zip(amounts, x.shape[x.ndim - d:]))
        x = x._make(build("SHRINK", x._node, arg=lead + crop))
        amounts = [(max(lo, 0), max(hi, 0)) for lo, hi in amounts]
    if not any(lo or hi for lo, hi in amounts):
        return x
    inner = x.shape[x.ndim - d:]
    shape = x.shape[:x.ndim - d] + tuple(s + lo + hi for (lo, hi), s in zip(amounts, inner))
    where = lead + tuple((lo, lo + s, 1) for (lo, _), s in zip(amounts, inner))
    out = x._make(build("PAD", x._node, arg=(shape, where)))
    if value == 0:
        return out
    inside = factory.ones(*inner, dtype=x.dtype, device=x.device)
    inside = inside._make(build("PAD", inside._node, arg=(shape[x.ndim - d:], where[x.ndim - d:]))) > 0.5
    return inside.where(out, value)


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    """torch.nn.functional.interpolate over the axes after (N, C): modes nearest, linear (1 axis), bilinear (2),
    trilinear (3), with torch's align_corners and its source-index rule for a scale_factor."""
    d = input.ndim - 2
    if d < 1:
        raise ValueError(f"interpolate: expected (N, C, ...) input, got shape {input.shape}")
    linear = {"linear": 1, "bilinear": 2, "trilinear": 3}
    if mode != "nearest" and linear.get(mode) != d:
        raise ValueError(f"interpolate: mode {mode!r} needs a {linear.get(mode, '?')}-D spatial input, got {d}-D "
                         "(modes: nearest, linear, bilinear, trilinear)")
    if mode == "nearest" and align_corners is not None:
        raise ValueError("interpolate: align_corners applies to the linear modes only")
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give exactly one of size and scale_factor")
    in_size = input.shape[2:]
    if size is not None:
        size = tuple(size) if isinstance(size, (tuple, list)) else (size,) * d
        scales = [i / o for i, o in zip(in_size, size)]
    else:
        factors = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * d
        size = tuple(int(math.floor(i * f)) for i, f in zip(in_size, factors))
        scales = [1.0 / f for f in factors]
    x = input
    for k, (n_in, n_out, scale) in enumerate(zip(in_size, size, scales)):
        axis = 2 + k
        o = np.arange(n_out)
        if mode == "nearest":
            x = _take(x, axis, np.minimum(np.floor(o * np.float32(scale)).astype(np.int64), n_in - 1))
            continue
        if align_corners:
            src = o * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(n_out)
        else:
            src = np.maximum((o + 0.5) * scale - 0.5, 0.0)
        i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        w1 = (src - i0).astype(np.float32).reshape((n_out,) + (1,) * (x.ndim - axis - 1))
        w1 = factory.tensor(w1, device=x.device)
        x = _take(x, axis, i0) * (1.0 - w1) + _take(x, axis, i1) * w1
    return x
