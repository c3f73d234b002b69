"""The Kernel IR: what the fusion pass makes and the C and WGSL runtimes render, and the FUSED op that holds one.

A FUSED node's `arg` is a Kernel; `run_kernel` is its NumPy meaning, the reference its renderings are tested
against.
"""
from collections import namedtuple

import numpy as np

from .. import dtype as dt
from ..graph import OPS
from .base import Op, register

# shape: the iteration shape (a reduction's input shape); reduce: (op, axes) or None; ins: per input
# (src index, strides, offset) in elements over the iteration shape; code: SSA instructions
# (op, arg, operand indices, dtype); the last instruction is the value stored (or reduced), unless `outs` names
# several (an elementwise kernel with several outputs, one after another in memory: see fuse_outputs).
Kernel = namedtuple("Kernel", "shape reduce ins code outs", defaults=(None,))
# the instructions of `code` that are not ops: IN (read input entry `arg` at the current position) and COPY (the
# operand's value); every other instruction is an elementwise op, or CONST
INSTRUCTIONS = frozenset({"IN", "COPY"})
# the instructions whose result on values of a 16-bit float dtype is a value of it already, so that no rendering
# rounds it again (every other instruction of a 16-bit dtype rounds to it, as its op does unfused; a CAST rounds
# by itself)
EXACT_LOW = frozenset({"NEG", "MAX", "FLOOR", "WHERE", "COPY", "CAST", "IN", "CONST"})


def run_kernel(kernel, *bases, out_dtype):
    """The NumPy meaning of a Kernel (the reference its C and WGSL renderings are tested against).

    16-bit floats compute in float32, as the renderings do: a read widens them (bfloat16 storage is decoded; an
    input a runtime already widened is taken as it is), a constant is its dtype's value, every instruction runs on
    float32 values and one whose dtype is a 16-bit float (a CAST to one included) rounds its result to it, as the
    op does unfused. out_dtype: the output's DType (its storage is returned), or None for the computed values as they are
    (float32 for a 16-bit float: the NumPy runtime rounds FUSED's result as it does every op's)."""
    vals = []
    for op, arg, operands, dtype in kernel.code:
        d = dt.from_name(dtype)
        if op == "IN":
            i, strides, offset = kernel.ins[arg]
            flat = np.ascontiguousarray(bases[i]).reshape(-1)
            value = np.lib.stride_tricks.as_strided(flat[offset:], kernel.shape, [s * flat.itemsize for s in strides],
                                                    writeable=False)
            vals.append(_widened(value, d) if d.is_low else value)
        elif op == "CONST":
            vals.append(_rounded(arg, d) if d.is_low else np.array(arg, dtype=d.np))
        elif op == "COPY":
            vals.append(vals[operands[0]])
        elif op == "CAST" and d.is_low:
            vals.append(_rounded(OPS[op].evaluate(vals[operands[0]], arg=dt.float32), d))
        elif d.is_low and op not in EXACT_LOW:
            vals.append(_rounded(np.asarray(OPS[op].evaluate(*[vals[o] for o in operands], arg=arg),
                                            dtype=np.float32), d))
        else:
            vals.append(OPS[op].evaluate(*[vals[o] for o in operands], arg=arg))
    if kernel.outs is not None:
        out = np.concatenate([np.broadcast_to(vals[o], kernel.shape) for o in kernel.outs])
    else:
        out = np.broadcast_to(vals[-1], kernel.shape)
        if kernel.reduce is not None:
            op, axes = kernel.reduce
            out = np.sum(out, axis=axes, keepdims=True) if op == "SUM" else np.max(out, axis=axes, keepdims=True)
    if out_dtype is not None and out_dtype.is_low:
        return dt.encode(out, out_dtype).reshape(out.shape)
    # a copy that keeps a 0-d shape (ascontiguousarray would not)
    return np.array(out, dtype=None if out_dtype is None else out_dtype.np, order="C")


def _widened(value, dtype):
    """A 16-bit float input's values as float32: its storage decoded (float32 already: a runtime widened it)."""
    return value if value.dtype == np.float32 else dt.decode(value, dtype).astype(np.float32)


def _rounded(value, dtype):
    """float32 values rounded to the 16-bit float `dtype`, kept as float32."""
    return dt.decode(dt.encode(value, dtype), dtype).astype(np.float32).reshape(np.shape(value))


@register
class FUSED(Op):
    """Many elementwise ops (and a reduction) run as one kernel; made by the fusion pass after autograd, so it
    has no gradient rule of its own."""
    def infer(src, arg): raise TypeError("FUSED nodes are made by the fusion pass, not built")
    def forward(*xs, arg): return run_kernel(arg, *xs, out_dtype=None)
