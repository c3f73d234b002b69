"""The reference runtime: every primitive runs as its own NumPy forward from tinyllm/ops, one kernel per node.
Movement ops are NumPy views, so transposes, slices and broadcasts move no data."""
import numpy as np

from ..graph import OPS
from .base import Buffer, Runtime
from .memory import track


class NumpyRuntime(Runtime):
    name = "numpy"

    def from_numpy(self, array, dtype):
        array = np.asarray(array, dtype=dtype.np)
        return Buffer(self, track(array), array.shape, dtype)

    def to_numpy(self, buffer):
        return buffer.data

    def execute(self, schedule):
        vals = {}
        for n in schedule.inputs:
            if n.buffer is not None:
                vals[n] = n.buffer.data
            elif n.op == "LOAD":
                vals[n] = n.arg.data
            else:  # CONST: one element seen through zero strides
                vals[n] = np.broadcast_to(np.array(n.arg, dtype=n.dtype.np), n.shape)
        for node, dead in zip(schedule.kernels, schedule.frees):
            op = OPS[node.op]
            ins = [vals[s] for s in node.src]
            vals[node] = track(op.forward(*ins, arg=node.arg) if op.takes_arg else op.forward(*ins))
            for d in dead:
                del vals[d]
        outs = []
        for n in schedule.outputs:
            v = np.asarray(vals[n], dtype=n.dtype.np)
            if not v.flags.writeable:  # a broadcast constant: give the caller real memory
                v = track(v.copy())
            outs.append(Buffer(self, v, n.shape, n.dtype))
        return outs
