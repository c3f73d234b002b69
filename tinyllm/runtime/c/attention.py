"""FLASH_ATTN and FLASH_ATTN_BWD on the C runtime: runtime_c/attention.c through the prebuilt module (None back for
float64 or without the module: the tiled NumPy reference runs). The kernels read their inputs in place through
strides, so q, k and v split out of one projection (views) are not copied, nor are the keys and values that
grouped-query attention broadcasts over a group (stride 0); an input whose last axis is strided is, and all are
made row-major where their batch axes need over three strides.

With 16-bit float inputs (float16, bfloat16) the kernels run in float32 as they are: the inputs are widened by a
generated kernel (copy.convert), and the float32 result is rounded to the node's dtype once, as the NumPy runtime
does for any op with 16-bit floats."""
import numpy as np

from ... import dtype as dt
from .copy import convert
from .record import CStruct
from .views import batch_runs
from ..base import kernels

KERNELS = kernels("c")


def _views(runtime, arrays):
    """(tl_attn_view per array, (B0, B1, B2)): each [..., T, D] array read in place, its batch axes as up to three
    runs. Three cover grouped-query attention's (batch, kv heads, group) axes, k and v broadcast over the group
    with stride 0, even when v is a head split of a projection (its batch and head strides don't merge)."""
    if runtime.lib is None or any(a.dtype != np.float32 for a in arrays):
        return None
    arrays = [a if a.shape[-1] == 1 or a.strides[-1] == 4 else runtime.contiguous(a) for a in arrays]
    batch = arrays[0].shape[:-2]
    runs = _runs(batch, arrays)
    if runs is None:  # more than three strides: contiguous arrays' batch axes merge into one run
        arrays = [runtime.contiguous(a) for a in arrays]
        runs = _runs(batch, arrays)
    (b0, s0), (b1, s1), (b2, s2) = ([(1, [0] * len(arrays))] * 3 + runs)[-3:]
    views = [CStruct("tl_attn_view *", [a, s0[i], s1[i], s2[i], a.strides[-2] // 4]) for i, a in enumerate(arrays)]
    return views, (b0, b1, b2)


def _runs(batch, arrays):
    """batch_runs' (at most two) runs, or those of all axes but the last and the last on its own, or None."""
    runs = batch_runs(batch, *arrays)
    if runs is None:
        runs = batch_runs(batch[:-1], *arrays)
        runs = None if runs is None else runs + [(batch[-1], [a.strides[len(batch) - 1] // 4 for a in arrays])]
    return runs


def _kernel(name):
    """The kernel function of runtime_c/attention.c's `name` (both take the same arguments, and the backward whether
    dout holds dL: attention.h)."""
    def run(runtime, node, ins):
        low = node.dtype.is_low and runtime.lib is not None and all(s.dtype is node.dtype for s in node.src)
        if low:
            ins = [convert(runtime, x, node.dtype, dt.float32) for x in ins]
            if any(x is None for x in ins):
                return None
        got = _views(runtime, ins)
        if got is None:
            return None
        views, batch = got
        q, k, v = ins[:3]
        scale, causal = node.arg
        out = runtime.empty(node.shape, np.dtype(np.float32))
        dl = (int(ins[4].shape[-1] > v.shape[-1]),) if len(ins) == 5 else ()  # the backward: does dout hold dL?
        if out.size:
            runtime.call(getattr(runtime.lib, name), out, *views, *batch, q.shape[-2], k.shape[-2], q.shape[-1],
                         v.shape[-1], scale, int(causal), *dl)
        return convert(runtime, out, dt.float32, node.dtype) if low else out
    return run


flash_forward = KERNELS.register("FLASH_ATTN")(_kernel("attention_forward"))
flash_backward = KERNELS.register("FLASH_ATTN_BWD")(_kernel("attention_backward"))
