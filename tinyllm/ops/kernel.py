"""The Kernel IR: what the fusion pass makes and the C and WGSL runtimes render, and the FUSED op that holds one.

A FUSED node's `arg` is a Kernel; `run_kernel` is its NumPy meaning, the reference its renderings are tested
against.
"""
from collections import namedtuple

import numpy as np

from ..graph import OPS
from .base import Op, register

# shape: the iteration shape (a reduction's input shape); reduce: (op, axes) or None; ins: per input
# (src index, strides, offset) in elements over the iteration shape; code: SSA instructions
# (op, arg, operand indices, dtype); the last instruction is the value stored (or reduced), unless `outs` names
# several (an elementwise kernel with several outputs, one after another in memory: see fuse_outputs).
Kernel = namedtuple("Kernel", "shape reduce ins code outs", defaults=(None,))


def run_kernel(kernel, *bases, out_dtype):
    """The NumPy meaning of a Kernel (the reference its C and WGSL renderings are tested against)."""
    vals = []
    for op, arg, operands, dtype in kernel.code:
        np_dtype = np.dtype(dtype if dtype != "bool" else np.bool_)
        if op == "IN":
            i, strides, offset = kernel.ins[arg]
            flat = np.ascontiguousarray(bases[i]).reshape(-1)
            vals.append(np.lib.stride_tricks.as_strided(flat[offset:], kernel.shape,
                                                        [s * flat.itemsize for s in strides], writeable=False))
        elif op == "CONST":
            vals.append(np.array(arg, dtype=np_dtype))
        elif op == "COPY":
            vals.append(vals[operands[0]])
        else:
            vals.append(OPS[op].evaluate(*[vals[o] for o in operands], arg=arg))
    if kernel.outs is not None:
        return np.array(np.concatenate([np.broadcast_to(vals[o], kernel.shape) for o in kernel.outs]), dtype=out_dtype)
    out = np.broadcast_to(vals[-1], kernel.shape)
    if kernel.reduce is not None:
        op, axes = kernel.reduce
        out = np.sum(out, axis=axes, keepdims=True) if op == "SUM" else np.max(out, axis=axes, keepdims=True)
    return np.array(out, dtype=out_dtype, order="C")  # a copy that keeps a 0-d shape (ascontiguousarray would not)


@register
class FUSED(Op):
    """Many elementwise ops (and a reduction) run as one kernel; made by the fusion pass after autograd, so it
    has no gradient rule of its own."""
    def infer(src, arg): raise TypeError("FUSED nodes are made by the fusion pass, not built")
    def forward(*xs, arg): return run_kernel(arg, *xs, out_dtype=None)
