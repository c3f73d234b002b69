"""ROW_SOFTMAX, ROW_LOG_SOFTMAX and ROW_LAYER_NORM (made by rewrite/rowwise.py) on the WGSL runtime: one workgroup
per row, wgsl/row_reduce.wgsl for the workgroup's reductions (with subgroup operations where the adapter has them)
plus wgsl/softmax.wgsl (both softmaxes) or layer_norm.wgsl."""
import math

import numpy as np

from . import render
from ..base import kernels

KERNELS = kernels("wgsl")

TEMPLATES = {"ROW_SOFTMAX": "softmax", "ROW_LOG_SOFTMAX": "softmax", "ROW_LAYER_NORM": "layer_norm"}
# what softmax.wgsl writes for element i, from the row's max m and Σe s, in the arithmetic of the primitives
SOFTMAX_Y = {"ROW_SOFTMAX": "exp(x[at + i] + (-m)) * (1.0 / s)", "ROW_LOG_SOFTMAX": "(x[at + i] + (-m)) + (-log(s))"}


def workgroup_width(rt, n):
    """Invocations per row: about 4 elements each (a power of two from 32), at most 256 and what the device
    allows in one workgroup and its shared memory."""
    lim = rt.gpu.limits
    cap = min(256, lim["max-compute-invocations-per-workgroup"], lim["max-compute-workgroup-size-x"],
              lim["max-compute-workgroup-storage-size"] // 4)
    return min(1 << (cap.bit_length() - 1), 1 << max(5, (n - 1).bit_length() - 2))


def _row_kernel(rt, node, ins):
    x, *vectors = (rt.contiguous(v) for v in ins)
    out = rt.empty(node.shape, node.dtype)
    n, rows = x.shape[-1], math.prod(x.shape[:-1])
    if not rows or not n:
        return out
    width = workgroup_width(rt, n)
    names = []  # the vectors after x: layer_norm's weight and bias, where the node has them
    extra = {"Y": SOFTMAX_Y[node.op]} if node.op in SOFTMAX_Y else {}
    if node.op == "ROW_LAYER_NORM":
        eps, has_w, has_b = node.arg
        names = ["w"] * has_w + ["b"] * has_b
        extra = dict(K_BITS=render.f32_bits(np.float32(1) / np.float32(n)), EPS_BITS=render.f32_bits(eps),
                     AFFINE="".join({"w": " * w[i]", "b": " + b[i]"}[name] for name in names))
    bindings = "\n".join(f"@group(0) @binding({i + 2}) var<storage, read> {name}: array<f32>;"
                         for i, name in enumerate(names))
    sub = "subgroup" in rt.features
    neg_inf = render.WGSL.literal(-math.inf, "float32")
    reductions = dict(WORKGROUP_MAX=render.workgroup_combine("workgroup_max", "f32", "tl_max", neg_inf, width, sub),
                      WORKGROUP_SUM=render.workgroup_combine("workgroup_sum", "f32", "add", "0.0", width, sub))
    source = render.template("math", F16_HELPERS="") + "\n" + \
        render.template("row_reduce", BINDINGS=bindings, N=n, ROWS=rows, WORKGROUP=width,
                        INVOCATION=render.INVOCATION[sub], **reductions) + "\n" + \
        render.template(TEMPLATES[node.op], WORKGROUP=width, **extra)
    rt.dispatch(source, [out, x, *vectors], render.groups_for(rows))
    return out


for _op in TEMPLATES:
    KERNELS.register(_op)(_row_kernel)
