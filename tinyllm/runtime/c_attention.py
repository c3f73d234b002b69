"""FLASH_ATTN and FLASH_ATTN_BWD on the C runtime: runtime_c/attention.c through the prebuilt module.

Handlers take (runtime, node, inputs) and return the output array, or None where the kernel does not apply
(float64, or no prebuilt module): the op's NumPy forward (the tiled reference) runs instead. The kernels read
contiguous [batch·heads, T, D] arrays; views such as the heads split out of one projection are copied first,
which costs O(T) memory, as the inputs themselves do."""
import math

import numpy as np


def _contiguous_float32(runtime, arrays):
    if runtime.lib is None or any(a.dtype != np.float32 for a in arrays):
        return None
    return [np.ascontiguousarray(a) for a in arrays]


def _pointers(runtime, *arrays):
    cast = runtime.ffi.cast
    return [cast("float *", a.__array_interface__["data"][0]) for a in arrays]


def flash_forward(runtime, node, ins):
    ins = _contiguous_float32(runtime, ins)
    if ins is None:
        return None
    q, k, v = ins
    scale, causal = node.arg
    out = runtime.empty(node.shape, np.dtype(np.float32))
    if out.size:
        runtime.lib.attention_forward(*_pointers(runtime, out, q, k, v), math.prod(q.shape[:-2]), q.shape[-2],
                                      k.shape[-2], q.shape[-1], v.shape[-1], scale, int(causal))
    return out


def flash_backward(runtime, node, ins):
    ins = _contiguous_float32(runtime, ins)
    if ins is None:
        return None
    q, k, v, out, dout = ins
    scale, causal = node.arg
    grads = runtime.empty(node.shape, np.dtype(np.float32))
    if grads.size:
        runtime.lib.attention_backward(*_pointers(runtime, grads, q, k, v, out, dout), math.prod(q.shape[:-2]),
                                       q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1], scale, int(causal))
    return grads


HANDLERS = {"FLASH_ATTN": flash_forward, "FLASH_ATTN_BWD": flash_backward}
