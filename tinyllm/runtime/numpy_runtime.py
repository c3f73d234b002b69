"""The reference runtime: every primitive runs as its own NumPy forward from tinyllm/ops, one kernel per node.
Movement ops are NumPy views, so transposes, slices and broadcasts move no data."""
import numpy as np

from ..graph import OPS
from .base import Buffer, Runtime
from .memory import owner, track


class NumpyRuntime(Runtime):
    name = "numpy"

    def from_numpy(self, array, dtype):
        array = np.asarray(array, dtype=dtype.np)
        return Buffer(self, track(array), array.shape, dtype)

    def to_numpy(self, buffer):
        return buffer.data

    def execute(self, schedule):
        with np.errstate(all="ignore"):  # IEEE results (inf, nan) as torch gives them, without warnings
            return self._execute(schedule)

    def _execute(self, schedule):
        vals = {}
        for n in schedule.inputs:
            if n.buffer is not None:
                vals[n] = n.buffer.data
            elif n.op == "LOAD":
                vals[n] = n.arg.data
            else:  # CONST: one element seen through zero strides
                vals[n] = np.broadcast_to(np.array(n.arg, dtype=n.dtype.np), n.shape)
        input_storage = {id(owner(vals[n])) for n in schedule.inputs if n.op == "LOAD" or n.buffer is not None}
        for node, dead in zip(schedule.kernels, schedule.frees):
            op = OPS[node.op]
            ins = [vals[s] for s in node.src]
            vals[node] = track(op.forward(*ins, arg=node.arg) if op.takes_arg else op.forward(*ins))
            for d in dead:
                del vals[d]
        outs = []
        for n, fresh in zip(schedule.outputs, schedule.fresh):
            v = np.asarray(vals[n], dtype=n.dtype.np)
            # a broadcast constant gets real memory; a result the passes reduced to an input gets its own
            if not v.flags.writeable or (fresh and id(owner(v)) in input_storage):
                v = track(v.copy())
            outs.append(Buffer(self, v, n.shape, n.dtype))
        return outs
