"""FLASH_ATTN and FLASH_ATTN_BWD on the C runtime: runtime_c/attention.c through the prebuilt module (None back for
float64 or without the module: the tiled NumPy reference runs). The kernels read their inputs in place through
strides, so q, k and v split out of one projection (views) are not copied, nor are the keys and values that
grouped-query attention broadcasts over a group (stride 0); an input whose last axis is strided is, and all are
made row-major where their batch axes need over three strides.

With 16-bit float inputs (float16, bfloat16) the _half kernels read them in place too: each tile is widened to
float32 as it is read, the arithmetic is the float32 kernels', and each result is rounded to the node's dtype once
where it is stored, as the NumPy runtime does for any op with 16-bit floats: the same bits as widening the inputs,
running the float32 kernels and rounding their results, without the widened copies."""
import numpy as np

from ... import dtype as dt
from .record import CStruct
from .views import batch_runs
from ..base import kernels

KERNELS = kernels("c")
STORAGE = (np.dtype(np.float32), dt.float16.np, dt.bfloat16.np)  # float32, and the 16-bit floats' storage
FORMATS = {dt.float16: 1, dt.bfloat16: 2}  # runtime_c/formats.h's TL_F16, TL_BF16


def _views(runtime, arrays):
    """(tl_attn_view per array, (B0, B1, B2)): each [..., T, D] array (all float32, or all of one 16-bit format's
    uint16 storage) read in place, its batch axes as up to three runs. Three cover grouped-query attention's
    (batch, kv heads, group) axes, k and v broadcast over the group with stride 0, even when v is a head split of
    a projection (its batch and head strides don't merge)."""
    size = arrays[0].itemsize
    if runtime.lib is None or arrays[0].dtype not in STORAGE or any(a.dtype != arrays[0].dtype for a in arrays):
        return None
    arrays = [a if a.shape[-1] == 1 or a.strides[-1] == size else runtime.contiguous(a) for a in arrays]
    batch = arrays[0].shape[:-2]
    runs = _runs(batch, arrays)
    if runs is None:  # more than three strides: contiguous arrays' batch axes merge into one run
        arrays = [runtime.contiguous(a) for a in arrays]
        runs = _runs(batch, arrays)
    (b0, s0), (b1, s1), (b2, s2) = ([(1, [0] * len(arrays))] * 3 + runs)[-3:]
    views = [CStruct("tl_attn_view *", [a, s0[i], s1[i], s2[i], a.strides[-2] // size]) for i, a in enumerate(arrays)]
    return views, (b0, b1, b2)


def _runs(batch, arrays):
    """batch_runs' (at most two) runs, or those of all axes but the last and the last on its own, or None."""
    runs = batch_runs(batch, *arrays)
    if runs is None:
        runs = batch_runs(batch[:-1], *arrays)
        runs = None if runs is None else runs + [(batch[-1], [a.strides[len(batch) - 1] // a.itemsize for a in arrays])]
    return runs


def _kernel(name):
    """The kernel function of runtime_c/attention.c's `name`, or of `name`_half for 16-bit floats (both take the
    same arguments, the _half one its format first, and the backward whether dout holds dL: attention.h)."""
    def run(runtime, node, ins):
        if any(s.dtype is not node.dtype for s in node.src):
            return None
        got = _views(runtime, ins)
        if got is None:
            return None
        views, batch = got
        q, k, v = ins[:3]
        scale, causal = node.arg
        out = runtime.empty(node.shape, np.dtype(node.dtype.np))
        fmt = (FORMATS[node.dtype],) if node.dtype in FORMATS else ()
        dl = (int(ins[4].shape[-1] > v.shape[-1]),) if len(ins) == 5 else ()  # the backward: does dout hold dL?
        if out.size:
            runtime.call(getattr(runtime.lib, name + "_half" * bool(fmt)), *fmt, out, *views, *batch, q.shape[-2],
                         k.shape[-2], q.shape[-1], v.shape[-1], scale, int(causal), *dl)
        return out
    return run


flash_forward = KERNELS.register("FLASH_ATTN")(_kernel("attention_forward"))
flash_backward = KERNELS.register("FLASH_ATTN_BWD")(_kernel("attention_backward"))
