"""Data movement on the C runtime: CONTIGUOUS, CAT, PAD and reshapes that must copy, through runtime_c/copy.c
(memcpy of each innermost run, the outer axes on all threads) into arrays from the runtime's pool; a reshape that
needs no copy is a NumPy view. Copies move bytes, so they serve every dtype alike (16-bit floats as their uint16
storage)."""
import math

import numpy as np

from ...views import view_strides
from ..base import kernels

KERNELS = kernels("c")


def _axes(shape, dst, src):
    """[(size, dst stride, src stride)] in bytes over `shape`: size-1 axes dropped, neighbours that both arrays
    walk as one run merged."""
    axes = []
    for n, d, s in zip(shape, dst.strides, src.strides):
        if n == 1:
            continue
        if axes and axes[-1][1] == d * n and axes[-1][2] == s * n:
            axes[-1] = (axes[-1][0] * n, d, s)
        else:
            axes.append((n, d, s))
    return axes


def copy_into(runtime, dst, src):
    """dst[...] = src, for arrays of one shape and dtype."""
    if not dst.size:
        return
    axes = _axes(dst.shape, dst, src)
    if len(axes) > 4:  # rare: left to NumPy rather than looped over here
        runtime.unrecorded("a copy over more than four axes")
        dst[...] = src
        return
    axes = [(1, 0, 0)] * (4 - len(axes)) + axes
    runtime.call(runtime.lib.tl_copy, dst.itemsize, *(a[0] for a in axes), dst, *(a[1] for a in axes),
                 src, *(a[2] for a in axes))


def _applies(runtime, *arrays):
    return runtime.lib is not None and all(a.dtype == arrays[0].dtype for a in arrays)


@KERNELS.register("CONTIGUOUS")
def contiguous(runtime, node, ins):
    (x,) = ins
    if x.flags.c_contiguous or not _applies(runtime, x):
        return None  # already row-major: NumPy's forward hands it back as it is
    out = runtime.empty(node.shape, x.dtype)
    copy_into(runtime, out, x)
    return out


@KERNELS.register("RESHAPE")
def reshape(runtime, node, ins):
    (x,) = ins
    if x.flags.c_contiguous or not x.size or view_strides(x.shape, [s // x.itemsize for s in x.strides],
                                                          node.shape) is not None:
        return x.reshape(node.shape)  # a view
    if not _applies(runtime, x):
        return None
    out = runtime.empty(node.shape, x.dtype)
    copy_into(runtime, out.reshape(x.shape), x)
    return out


@KERNELS.register("CAT")
def cat(runtime, node, ins):
    if not _applies(runtime, *ins):
        return None
    out, start = runtime.empty(node.shape, ins[0].dtype), 0
    for x in ins:
        where = [slice(None)] * out.ndim
        where[node.arg] = slice(start, start + x.shape[node.arg])
        copy_into(runtime, out[tuple(where)], x)
        start += x.shape[node.arg]
    return out


@KERNELS.register("PAD")
def pad(runtime, node, ins):
    (x,) = ins
    if not _applies(runtime, x):
        return None
    out = runtime.empty(node.shape, x.dtype)
    where = tuple(slice(*w) for w in node.arg[1])
    border = math.prod(x.shape) < math.prod(node.shape)
    if border and any(w.step not in (None, 1) for w in where):  # a strided placement: zero all of it first
        runtime.call(runtime.lib.tl_zero, out, out.nbytes)
        border = False
    copy_into(runtime, out[where], x)
    if border:  # after the copy, so a border that shares its cache lines (attention's dL column) finds them there
        _zero_outside(runtime, out, where)
    return out


def _zero_outside(runtime, out, where):
    """Zeros what the placement `where` leaves uncovered, the slabs before and after it along each axis (a pad
    of one column, as attention's backward reads, zeros that column rather than the whole array). `where` takes
    every element along each axis it covers (no steps)."""
    zero = None
    for axis, w in enumerate(where):
        start, stop, _ = w.indices(out.shape[axis])
        for lo, hi in ((0, start), (stop, out.shape[axis])):
            slab = out[(slice(None),) * axis + (slice(lo, hi),)]
            if not slab.size:
                continue
            if slab.flags.c_contiguous:
                runtime.call(runtime.lib.tl_zero, slab, slab.nbytes)
                continue
            if zero is None:  # one zeroed element read through zero strides (recorded like any other array)
                zero = runtime.empty((1,), out.dtype)
                runtime.call(runtime.lib.tl_zero, zero, zero.nbytes)
            copy_into(runtime, slab, np.lib.stride_tricks.as_strided(zero, slab.shape, (0,) * slab.ndim))
